"""The 2026 trust-region switches in the RL loop (issue 50): DPPO as ``loss_mode``, Kimi's ``sampler_kl_tau``, MaxRL
as ``advantage``, ``ref_reset_every`` and the ``grpo_no_ref`` preset; what each bridge writes or refuses for them, and
verl's own DPPO loss run on the overrides ``to_verl`` writes. The functions themselves: tests/test_trust_region.py
and tests/test_maxrl.py."""

import copy
import math
from types import SimpleNamespace

import extract_verl
import pytest
import torch
from helpers import tiny_model

from minirl import config, losses, rl, rl_update, tasks, trust_region
from minirl.interop import trl as trl_bridge
from minirl.interop import verl as verl_bridge

D = torch.float64


def random_batch(seed, B=6, T=5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3  # log mu in (-3, 0]
    new = (old + torch.randn(B, T, generator=g, dtype=D) * 0.6).clamp(max=-1e-3)  # pi moved both ways
    adv = torch.randn(B, generator=g, dtype=D)
    mask = (torch.rand(B, T, generator=g) > 0.25).to(D)
    return new, old, adv, mask


# --- DPPO as a loss mode --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_policy_loss_dppo_mode_is_dppo_loss_with_eps_as_deltas(mode, agg):
    new, old, adv, mask = random_batch(1)
    lp = new.clone().requires_grad_(True)
    loss, st = losses.policy_loss(lp, old, adv, mask, eps_low=0.1, eps_high=0.15, agg=agg, loss_mode=mode,
                                  dppo_cap=3.0)
    ref, rst = trust_region.dppo_loss(new, old, adv, mask, divergence=mode[-2:], delta_low=0.1, delta_high=0.15,
                                      is_cap=3.0, agg=agg)
    assert float(loss) == float(ref)
    assert st["clip_frac"] == st["dppo_masked_frac"] == rst["dppo_masked_frac"] > 0  # some tokens were stopped
    assert "approx_kl" in st


def test_dppo_settings_are_checked_naming_the_setting():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="dppo_cap"):
        losses.policy_loss(lp, lp, torch.ones(2), torch.ones(2, 3), loss_mode="dppo_tv", dppo_cap=0.0)
    with pytest.raises(ValueError, match="level='token'"):
        losses.policy_loss(lp, lp, torch.ones(2), torch.ones(2, 3), loss_mode="dppo_tv", level="sequence",
                           agg="seq-mean-token-mean")
    with pytest.raises(ValueError, match="eps_low >= 0"):
        config.make_config("grpo", loss_mode="dppo_kl", eps_low=-0.1)
    config.make_config("grpo", loss_mode="dppo_kl", eps_low=1.5, eps_high=2.0)  # a KL delta may pass 1


@pytest.mark.parametrize("mode", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_verl_dppo_on_to_verls_overrides_equals_the_loop_loss(mode, agg):
    """The overrides to_verl writes, read back into verl 0.9.1's own DPPO loss, give minirl's loss and gradient."""
    ns = extract_verl.functions()
    cfg = config.make_config("grpo", loss_mode=mode, eps_low=0.1, eps_high=0.15, dppo_cap=3.0, agg=agg, beta=0.0)
    over = dict(o.split("=", 1) for o in verl_bridge.verl_overrides(cfg))
    a = "actor_rollout_ref.actor"
    assert over[f"{a}.policy_loss.loss_mode"] == mode and over[f"{a}.loss_agg_mode"] == agg

    class ActorConfig(dict):  # what verl's loss reads from its config
        clip_ratio = 0.2
        clip_ratio_low = float(over[f"{a}.clip_ratio_low"])
        clip_ratio_high = float(over[f"{a}.clip_ratio_high"])
        global_batch_info = {}

    actor = ActorConfig(clip_ratio_c=float(over[f"{a}.clip_ratio_c"]))
    for seed in range(4):
        new, old, adv, mask = random_batch(seed)
        lp_v, lp_m = new.clone().requires_grad_(True), new.clone().requires_grad_(True)
        loss_v, _ = ns[f"compute_policy_loss_{mode}"](old, lp_v, adv[:, None].expand_as(new), mask,
                                                      loss_agg_mode=agg, config=actor)
        loss_m, _ = losses.policy_loss(lp_m, old, adv, mask, **cfg.policy_loss_kwargs())
        loss_v.backward()
        loss_m.backward()
        # verl's seq-mean-token-mean divides each row by (count + 1e-8): a relative 1e-8 at most
        assert float(loss_v) == pytest.approx(float(loss_m), rel=2e-8, abs=1e-15)
        assert float((lp_v.grad - lp_m.grad).abs().max()) <= 2e-8 * float(lp_m.grad.abs().max())


# --- Kimi's squared log-ratio to the sampler ------------------------------------------------------------------------
def test_sampler_term_by_hand():
    # log pi [-1, -2], log mu [-1.5, -2], tau 1e-3, one row, seq-mean-token-mean, one sequence:
    # terms [1e-3 * 0.25, 0] -> mean over the row's 2 tokens = 1.25e-4; d / d log pi = [2e-3 * 0.5 / 2, 0] = [5e-4, 0]
    lp = torch.tensor([[-1.0, -2.0]], dtype=D, requires_grad=True)
    micro = SimpleNamespace(sampler_logprobs=torch.tensor([[-1.5, -2.0]], dtype=D), loss_mask=torch.ones(1, 2, dtype=D))
    cfg = config.make_config("grpo", sampler_kl_tau=1e-3)
    term = rl_update.sampler_term(lp, micro, cfg, denominator=1.0)
    term.backward()
    assert float(term) == pytest.approx(1.25e-4, rel=1e-12)
    torch.testing.assert_close(lp.grad, torch.tensor([[5e-4, 0.0]], dtype=D), rtol=1e-12, atol=0)
    micro.sampler_logprobs = None
    with pytest.raises(ValueError, match="sampler_kl_tau"):
        rl_update.sampler_term(lp, micro, cfg, denominator=1.0)
    with pytest.raises(ValueError, match="sampler_kl_tau"):
        config.make_config("grpo", sampler_kl_tau=-1.0)


@pytest.mark.slow
def test_update_adds_exactly_the_sampler_term(tok, monkeypatch):
    """The loop's loss with tau > 0 is the loss without it plus the recorded term, step 1 of two runs from one seed."""
    terms = []
    real = rl_update.sampler_term
    monkeypatch.setattr(rl_update, "sampler_term", lambda *a: terms.append(real(*a)) or terms[-1])
    train = tasks.load_split("train")
    losses_by_tau = {}
    for tau in (0.0, 0.5):
        model = tiny_model(tok)
        cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, beta=0.0,
                                 num_minibatches=1, pi_old="naive", sampler_sync_every=2, sampler_kl_tau=tau,
                                 progress=False)
        losses_by_tau[tau] = rl.train_rl(model, tok, cfg, train).rows[-1]["loss"]
    assert len(terms) == 1 and float(terms[0]) > 0  # the naive pi_old differs from the trainer's by round-off
    assert losses_by_tau[0.5] == pytest.approx(losses_by_tau[0.0] + float(terms[0]), abs=1e-7)


# --- MaxRL as the advantage -----------------------------------------------------------------------------------------
def test_compute_advantages_takes_the_maxrl_path():
    batch = SimpleNamespace(completion_mask=torch.ones(8, 2))
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    cfg = config.make_config("grpo", advantage="maxrl", adv_scale="none", group_size=4, beta=0.0)
    adv, returns, values = rl.compute_advantages(scores, None, batch, cfg, beta=0.0)
    # group 0: mean 0.25 -> (r - 0.25) / 0.25 = [3, -1, -1, -1]; group 1 all right: 0
    torch.testing.assert_close(adv, torch.tensor([3.0, -1, -1, -1, 0, 0, 0, 0]))
    assert returns is None and values is None
    with pytest.raises(ValueError, match="adv_scale"):
        config.make_config("grpo", advantage="maxrl")  # MaxRL carries its own scaling


# --- the reference reset and training without a reference -----------------------------------------------------------
@pytest.mark.slow
def test_reference_reset_makes_kl_ref_zero_at_each_reset_step(tok):
    train = tasks.load_split("train")
    rows = {}
    for every in (0, 2):  # overlong shaping turns the random model's lengths into rewards: the policy moves
        cfg = config.make_config("grpo", steps=5, prompts_per_step=2, group_size=4, max_new_tokens=16, beta=0.04,
                                 lr=1e-3, ref_reset_every=every, overlong_shaping=True, overlong_cache_len=12,
                                 progress=False)
        rows[every] = {r["step"]: r["kl_ref"] for r in rl.train_rl(tiny_model(tok), tok, cfg, train).rows}
    # the reference is copied after steps 2 and 4: the rollouts of steps 3 and 5 start at the reference exactly;
    # step 4 has moved since (step 1's rollout is all truncated, equal rewards: nothing moves before step 2)
    assert rows[2][3] == rows[2][5] == 0.0 and rows[2][4] > 0
    assert rows[0][3] > 0 and rows[0][5] > 0  # without resets the KL to the start stays


def test_reset_reference_is_trls_sync_with_alpha_one(tok):
    from trl.trainer.callbacks import SyncRefModelCallback

    model, ref_ours = tiny_model(tok, seed=1), tiny_model(tok, seed=2)
    ref_trl = copy.deepcopy(ref_ours)
    rl.reset_reference(ref_ours, model)
    SyncRefModelCallback._sync_target_model(model, ref_trl, 1.0)
    for p, q in zip(ref_ours.parameters(), ref_trl.parameters(), strict=True):
        assert torch.equal(p, q)
    assert all(torch.equal(p, q) for p, q in zip(ref_ours.parameters(), model.parameters(), strict=True))


def test_reference_reset_is_refused_without_a_reference_to_reset():
    with pytest.raises(ValueError, match="ref_reset_every"):
        config.make_config("grpo", beta=0.0, ref_reset_every=5)
    with pytest.raises(ValueError, match="ref_reset_every"):
        config.make_config("grpo", beta=0.04, ref_reset_every=5, lora_rank=4)
    with pytest.raises(ValueError, match="ref_reset_every"):
        config.make_config("grpo", beta=0.04, ref_reset_every=-1)


def test_grpo_no_ref_holds_no_reference(tok, monkeypatch):
    cfg = config.make_config("grpo_no_ref", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8,
                             progress=False)
    assert cfg.beta == 0.0 and {k: v for k, v in config.ALGORITHMS["grpo_no_ref"].items() if k != "beta"} == {
        k: v for k, v in config.ALGORITHMS["grpo"].items() if k not in ("beta", "kl_estimator", "kl_placement")}
    model = tiny_model(tok)
    assert rl.reference_model(model, None, cfg) is None

    def no_copy(*a, **k):
        raise AssertionError("train_rl copied the policy: a reference was made")

    monkeypatch.setattr(rl, "copy", SimpleNamespace(deepcopy=no_copy))  # rl's own name only
    row = rl.train_rl(model, tok, cfg, tasks.load_split("train")).rows[-1]
    assert "kl_ref" not in row


# --- the bridges: what each writes or refuses -----------------------------------------------------------------------
@pytest.mark.parametrize("switches, trl_refuses, verl_refuses", [
    (dict(loss_mode="dppo_tv"), "loss_mode='dppo_tv'", None),
    (dict(loss_mode="dppo_kl"), "loss_mode='dppo_kl'", None),
    (dict(sampler_kl_tau=1e-3), "sampler_kl_tau", "sampler_kl_tau"),
    (dict(advantage="maxrl", adv_scale="none"), "advantage='maxrl'", "advantage='maxrl'"),
    (dict(beta=0.04, ref_reset_every=5), None, "ref_reset_every"),
])
def test_bridges_map_or_refuse_each_new_switch(switches, trl_refuses, verl_refuses):
    cfg = config.make_config("grpo", **{"beta": 0.0, **switches})
    for bridge, refuses in ((trl_bridge.trl_kwargs, trl_refuses), (verl_bridge.verl_overrides, verl_refuses)):
        if refuses:
            with pytest.raises(NotImplementedError, match=refuses.replace("(", r"\(")):
                bridge(cfg)
        else:
            bridge(cfg)


def test_to_trl_maps_the_reset_to_sync_ref_model_in_trls_steps():
    cfg = config.make_config("grpo", beta=0.04, ref_reset_every=5, num_minibatches=2, num_iterations=2)
    kw = trl_bridge.trl_kwargs(cfg)
    # TRL counts optimiser steps: 5 rollouts x 2 epochs x 2 minibatches
    assert (kw["sync_ref_model"], kw["ref_model_mixup_alpha"], kw["ref_model_sync_steps"]) == (True, 1.0, 20)
    assert trl_bridge.trl_kwargs(config.make_config("grpo"))["sync_ref_model"] is False


def test_to_verl_writes_dppos_cap_not_verls_default():
    cfg = config.make_config("grpo", loss_mode="dppo_tv", eps_low=0.15, eps_high=0.15, beta=0.0)
    over = verl_bridge.verl_overrides(cfg)
    a = "actor_rollout_ref.actor"
    for line in (f"{a}.policy_loss.loss_mode=dppo_tv", f"{a}.clip_ratio_low=0.15", f"{a}.clip_ratio_high=0.15",
                 f"{a}.clip_ratio_c=20.0"):
        assert line in over
    with pytest.raises(NotImplementedError, match="bypass_mode"):  # verl's bypass replaces the loss by its clip
        verl_bridge.verl_overrides(config.make_config("grpo", loss_mode="dppo_tv", pi_old="naive", beta=0.0))
    assert math.isclose(config.RLConfig().dppo_cap, 20.0)


@pytest.mark.parametrize("teacher", ["external", "self_demonstration", "self_best_sibling"])
def test_bridges_refuse_a_distillation_config_instead_of_training_grpo(teacher):
    cfg = config.make_config("grpo", distill="reverse_kl", distill_teacher=teacher, beta=0.0, num_minibatches=1)
    for bridge in (trl_bridge.trl_kwargs, verl_bridge.verl_overrides):
        with pytest.raises(NotImplementedError, match="drop the teacher"):
            bridge(cfg)
