"""The bridge to TRL: the same inputs through TRL 1.16's own loss code and through minirl's give the same loss and
gradient (1e-6), preset by preset, over several optimisation steps of one rollout (so ratios move away from 1 and
some are clipped), with padded completions of different lengths; each convention difference has a test showing its
size; each switch TRL lacks raises NotImplementedError naming it.

TRL's side is the real trainer: a GRPOTrainer / DPOTrainer / KTOTrainer built on a tiny local model, whose
``compute_loss`` (``_compute_loss``) is fed the inputs dict its ``_generate_and_score_completions`` would produce.
minirl's side is ``rl.update_minibatch`` (policy_loss + kl_in_loss + aggregate, exactly as train_rl composes them)
or ``preference_loop``'s loss functions. Skipped when TRL is not installed (``pip install -e ".[trl]"``).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]' runs the bridge's tests")

import datasets  # noqa: E402

from minirl import interop, losses, models, rewards, rl, rollout  # noqa: E402
from minirl.advantages import group_advantages  # noqa: E402
from minirl.config import ALGORITHMS, make_config  # noqa: E402
from minirl.preference_loop import PrefConfig, encode_completions, preference_kto_loss, preference_pair_loss  # noqa: E402

TOL = 1e-6  # absolute; for a loss above 1 (IPO's ~25), relative: float32 carries ~1e-7 of it in round-off
G = 4  # completions per prompt
PROMPTS = ["1+2=", "3+4+5="]  # different lengths: the prompt batch is left-padded
# completions of different lengths (EOS appended, then right-padded): "3#3" has 4 tokens, "1+2=3;3+3=6#6" 14, ...
COMPLETIONS = ["3#3", "1+2=3#3", "1+2=3;3+3=6#6", "9", "12#12", "3+4=7;7+5=12#12", "7#7", "3+4=7#7"]
REWARDS = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])  # scripted: two groups with signal




@pytest.fixture(scope="module")
def base_model(tok, tmp_path_factory):
    """The tiny model saved with save_pretrained and loaded back with models.load: TRL builds its reference model
    from the same local directory (no download)."""
    path = tmp_path_factory.mktemp("tiny")
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return models.load(str(path))


@pytest.fixture(scope="module")
def rollout_batch(tok):
    """The tensors of one rollout of 2 prompts x G = 4 completions, laid out as decoding.generate lays them out."""
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    prompt_ids = enc.input_ids.repeat_interleave(G, 0)  # (B, P)
    prompt_mask = enc.attention_mask.repeat_interleave(G, 0)  # (B, P)
    ids = [tok(c, add_special_tokens=False).input_ids + [tok.eos_token_id] for c in COMPLETIONS]
    T = max(map(len, ids))
    completion_ids = torch.tensor([c + [tok.pad_token_id] * (T - len(c)) for c in ids])  # (B, T)
    mask = rollout.completion_mask(completion_ids, tok.eos_token_id)  # (B, T)
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, mask=mask)


def grpo_trainer(model, tok, cfg, tmp_path, **trl_args):
    """TRL's GRPOTrainer on ``model`` with ``to_trl(cfg)`` (nothing is generated: its loss is called directly)."""
    args = interop.to_trl(cfg, output_dir=str(tmp_path), report_to="none", use_cpu=True, logging_steps=1,
                          **trl_args)
    data = datasets.Dataset.from_dict({"prompt": PROMPTS})
    if cfg.loss_mode == "gmpo":
        from trl.experimental.gmpo import GMPOTrainer as Trainer
    else:
        Trainer = trl.GRPOTrainer
    trainer = Trainer(model=model, reward_funcs=lambda prompts, completions, **_: [0.0] * len(prompts),
                              args=args, train_dataset=data, processing_class=tok)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def run_both(cfg, tok, base_model, batch, tmp_path, steps=3, lr=3e-2, loss_mask=None, old_shift=None, rows=None,
             trl_args=None, ref_model=None):
    """``steps`` optimiser steps on ONE rollout: before each, TRL's and minirl's loss and gradient on the same
    weights, with the same old (rollout-time) and reference log-probs; then minirl's AdamW step, copied to TRL's
    model. ``rows`` trains on those rows of the rollout only (one minibatch), TRL's num_items_in_batch still
    counting the whole rollout, as its generation batch does. Returns per step (trl_loss, minirl_loss,
    max |grad difference|, max |grad|, ratio_min, ratio_max, minirl grads, TRL grads)."""
    model_m = copy.deepcopy(base_model)  # minirl's policy, updated by update_minibatch's AdamW
    model_t = copy.deepcopy(base_model)  # TRL's (its forward is patched by the trainer)
    ref = copy.deepcopy(ref_model or base_model).eval().requires_grad_(False)
    trainer = grpo_trainer(model_t, tok, cfg, tmp_path, **(trl_args or {}))
    P = batch["prompt_ids"].shape[1]
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = batch["mask"] if loss_mask is None else loss_mask
    attention_mask = torch.cat([batch["prompt_mask"], mask.long()], 1)
    with torch.no_grad():
        old = rollout.token_logprobs(model_m, input_ids, attention_mask, P) * mask  # pi_old = the rollout's policy
        ref_lp = rollout.token_logprobs(ref, input_ids, attention_mask, P) * mask
    if old_shift is not None:
        old = old + old_shift
    advantages = group_advantages(REWARDS, G, scale=cfg.adv_scale)  # (B,), as both compute them (tested below)
    mb = rl.RLBatch(input_ids=input_ids, attention_mask=attention_mask, n_prompt_tokens=P, completion_mask=mask,
                    loss_mask=mask, old_logprobs=old, advantages=advantages, ref_logprobs=ref_lp if cfg.beta else None)
    inputs = dict(prompt_ids=batch["prompt_ids"], prompt_mask=batch["prompt_mask"],
                  completion_ids=batch["completion_ids"], completion_mask=mask.long(), advantages=advantages,
                  old_per_token_logps=old, num_items_in_batch=mask.sum())
    if rows is not None:
        mb = mb[rows]
        inputs = {k: (v if k == "num_items_in_batch" else v[rows]) for k, v in inputs.items()}
        ref_lp = ref_lp[rows]
    if cfg.beta:
        inputs["ref_per_token_logps"] = ref_lp
    opt = torch.optim.AdamW(model_m.parameters(), lr=lr)
    out = []
    for _ in range(steps):
        model_t.load_state_dict(model_m.state_dict())
        model_t.zero_grad(set_to_none=True)
        loss_t = trainer.compute_loss(model_t, inputs)
        loss_t.backward()
        grads_t = [p.grad.clone() for p in model_t.parameters()]
        stats = rl.update_minibatch(model_m, opt, mb, cfg, beta=cfg.beta)  # the grads stay in .grad after step
        grads_m = [p.grad for p in model_m.parameters()]
        diff = max(float((a - b).abs().max()) for a, b in zip(grads_t, grads_m, strict=True))
        scale = max(float(b.abs().max()) for b in grads_m)
        out.append((float(loss_t.detach()), stats["loss"], diff, scale, stats["ratio_min"], stats["ratio_max"],
                    [g.clone() for g in grads_m], grads_t))
    return out


# ------------------------------------------------------------------------------------------------ the presets
PRESETS = {  # the preset, with the sizes of this test: one minibatch per rollout, several epochs (mu) over it
    "grpo": {}, "dr_grpo": {}, "gspo": {}, "gspo_token": {},
    "dapo": {"dynamic_sampling": False, "overlong_shaping": False},  # TRL lacks the first; the second is a reward
    "grpo_dual_clip": {"dual_clip": 1.5},  # TRL's delta: the ratios of this rollout reach 3, so it bites
    "cispo": {}, "sapo": {}, "gmpo": {},
    "cispo_cap": {"eps_high": 0.5},  # TRL's epsilon_high = 1.5: the cap bites on this rollout (tested below)
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_loss_and_gradient_match_trl(name, tok, base_model, rollout_batch, tmp_path):
    algo = name.removesuffix("_dual_clip").removesuffix("_cap")
    cfg = make_config(algo, prompts_per_step=2, group_size=G, num_minibatches=1, num_iterations=3,
                      max_new_tokens=16, max_grad_norm=1e9, progress=False, **PRESETS[name])
    results = run_both(cfg, tok, base_model, rollout_batch, tmp_path)
    for step, (loss_t, loss_m, gdiff, gscale, *_) in enumerate(results):
        assert abs(loss_t - loss_m) < TOL, (step, loss_t, loss_m)
        assert gdiff < TOL, (step, gdiff, gscale)
        assert gscale > 1e-3  # a real gradient, not two zeros
    # after the first update the ratios are no longer 1 (the later steps are off-policy, as the tests intend)
    ratio_min, ratio_max = results[-1][4], results[-1][5]
    assert ratio_max - ratio_min > (1e-4 if algo.startswith("gspo") else 1e-2)


@pytest.fixture(scope="module")
def moe_model(tok, tmp_path_factory):
    """The tiny Qwen3-MoE (2 of 4 experts per token), saved and loaded back as the dense one; its config carries
    output_router_logits and router_aux_loss_coef = 0.001, so TRL's default would add the auxiliary loss."""
    path = tmp_path_factory.mktemp("tiny_moe")
    model = models.tiny_moe(tok, hidden_size=32, num_layers=1, num_heads=2, num_experts=4, experts_per_token=2,
                            expert_size=32, seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return models.load(str(path))


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_moe_loss_and_gradient_match_trl_with_the_aux_loss_pinned_off(algo, tok, moe_model, rollout_batch,
                                                                       tmp_path):
    """On the tiny MoE, to_trl's router_aux_loss_coef=0.0 (minirl's loop adds no load-balancing loss): TRL's and
    minirl's loss and gradient agree to 1e-6 over 3 steps. The positive control: TRL's default (None, the model's
    0.001) adds 0.001 x the auxiliary loss to the loss."""
    cfg = make_config(algo, prompts_per_step=2, group_size=G, num_minibatches=1, num_iterations=3,
                      max_new_tokens=16, max_grad_norm=1e9, progress=False)
    assert interop.trl_kwargs(cfg)["router_aux_loss_coef"] == 0.0
    results = run_both(cfg, tok, moe_model, rollout_batch, tmp_path)
    for step, (loss_t, loss_m, gdiff, gscale, *_) in enumerate(results):
        print(f"{algo} MoE step {step}: |loss gap| {abs(loss_t - loss_m):.2e}, max |grad gap| {gdiff:.2e} "
              f"(max |grad| {gscale:.2e})")
        assert abs(loss_t - loss_m) < TOL, (step, loss_t, loss_m)
        assert gdiff < TOL, (step, gdiff, gscale)
        assert gscale > 1e-3
    default = run_both(cfg, tok, moe_model, rollout_batch, tmp_path, steps=1,
                       trl_args={"router_aux_loss_coef": None})[0]
    gap = default[0] - default[1]
    print(f"{algo} MoE with TRL's default router_aux_loss_coef: loss gap {gap:.2e}")
    assert 0.001 * 0.5 < gap < 0.001 * 20  # 0.001 x an aux loss of order num_experts x balance (1 when balanced)


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_moe_router_aux_loss_maps_to_trl_router_aux_loss_coef(algo, tok, moe_model, rollout_batch, tmp_path):
    """minirl's load-balancing switch is TRL's router_aux_loss_coef (TRL 1.16 asks the model for its router logits
    and adds coef x the model's aux_loss): with 0.05 the two losses and gradients agree to 1e-6 over 3 steps, and
    the loss differs from the run without it by 0.05 x an aux loss near its balanced value k = 2."""
    kw = dict(prompts_per_step=2, group_size=G, num_minibatches=1, num_iterations=3, max_new_tokens=16,
              max_grad_norm=1e9, progress=False)
    cfg = make_config(algo, router_aux_loss_coef=0.05, **kw)
    assert interop.trl_kwargs(cfg)["router_aux_loss_coef"] == 0.05 == interop.to_trl(cfg).router_aux_loss_coef
    with_aux = run_both(cfg, tok, moe_model, rollout_batch, tmp_path)
    for step, (loss_t, loss_m, gdiff, gscale, *_) in enumerate(with_aux):
        print(f"{algo} MoE + aux 0.05, step {step}: |loss gap| {abs(loss_t - loss_m):.2e}, max |grad gap| {gdiff:.2e}")
        assert abs(loss_t - loss_m) < TOL, (step, loss_t, loss_m)
        assert gdiff < TOL, (step, gdiff, gscale)
    without = run_both(make_config(algo, **kw), tok, moe_model, rollout_batch, tmp_path, steps=1)[0]
    assert 0.05 * 1.9 < with_aux[0][1] - without[1] < 0.05 * 4  # 0.05 x aux, aux >= ~k = 2 (balanced) and <= E = 4


def test_dual_clip_is_exercised(tok, base_model, rollout_batch, tmp_path):
    """The dual-clip case above is not vacuous: with c = 1.5 the loss differs from the run without it."""
    kw = dict(prompts_per_step=2, group_size=G, num_minibatches=1, num_iterations=3, max_new_tokens=16,
              max_grad_norm=1e9, progress=False)
    plain = run_both(make_config("grpo", **kw), tok, base_model, rollout_batch, tmp_path)
    dual = run_both(make_config("grpo", dual_clip=1.5, **kw), tok, base_model, rollout_batch, tmp_path)
    assert max(abs(p[1] - d[1]) for p, d in zip(plain, dual, strict=True)) > 1e-3


def test_new_losses_are_exercised_outside_the_band(tok, base_model, rollout_batch, tmp_path):
    """The cispo / sapo / gmpo cases above are not vacuous: over the 3 steps ratios leave PPO's band, the CISPO cap
    1.5 and GMPO's log-space clip bite, and the losses differ from GRPO's clipped loss on the same rollout."""
    kw = dict(prompts_per_step=2, group_size=G, num_minibatches=1, num_iterations=3, max_new_tokens=16,
              max_grad_norm=1e9, progress=False, beta=0.0)
    mb_stats = []
    for algo, extra in (("cispo", {"eps_high": 0.5}), ("gmpo", {})):
        c = make_config(algo, **kw, **extra)
        m = copy.deepcopy(base_model)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-2)
        P = rollout_batch["prompt_ids"].shape[1]
        ids = torch.cat([rollout_batch["prompt_ids"], rollout_batch["completion_ids"]], 1)
        att = torch.cat([rollout_batch["prompt_mask"], rollout_batch["mask"].long()], 1)
        with torch.no_grad():
            old = rollout.token_logprobs(m, ids, att, P) * rollout_batch["mask"]
        mb = rl.RLBatch(input_ids=ids, attention_mask=att, completion_mask=rollout_batch["mask"],
                        loss_mask=rollout_batch["mask"], old_logprobs=old, advantages=group_advantages(REWARDS, G),
                        ref_logprobs=None, n_prompt_tokens=P)
        mb_stats.append([rl.update_minibatch(m, opt, mb, c, beta=0.0) for _ in range(3)])
    last = mb_stats[0][-1]
    assert last["ratio_max"] > 1.5 or last["ratio_min"] < 0.5  # ratios well outside PPO's [0.8, 1.2]
    assert max(s["ppo_clip_frac"] for s in mb_stats[0]) > 0.05  # tokens PPO would have zeroed
    assert max(s["clip_frac"] for s in mb_stats[0]) > 0  # CISPO weights capped at 1.5
    assert max(s["clip_frac"] for s in mb_stats[1]) > 0  # GMPO tokens clipped in log space
    grpo = run_both(make_config("grpo", **kw), tok, base_model, rollout_batch, tmp_path)
    for algo in ("cispo", "sapo", "gmpo"):
        other = run_both(make_config(algo, **kw), tok, base_model, rollout_batch, tmp_path)
        assert max(abs(g[1] - o[1]) for g, o in zip(grpo, other, strict=True)) > 1e-3, algo


def test_cispo_cap_translation_and_what_trl_lacks():
    """minirl's cap 1 + eps_high is TRL's absolute epsilon_high; TRL has no two-sided CISPO."""
    assert interop.trl_kwargs(make_config("cispo"))["epsilon_high"] == 5.0  # 1 + 4.0
    assert interop.trl_kwargs(make_config("cispo", eps_high=0.28))["epsilon_high"] == pytest.approx(1.28)
    with pytest.raises(NotImplementedError, match="cispo_form='two-sided'"):
        interop.trl_kwargs(make_config("cispo", cispo_form="two-sided"))
    with pytest.raises(NotImplementedError, match="loss_mode='sapo' with agg='token-mean'"):
        interop.trl_kwargs(make_config("sapo", agg="token-mean"))
    s = interop.trl_kwargs(make_config("sapo"))
    assert (s["loss_type"], s["sapo_temperature_pos"], s["sapo_temperature_neg"]) == ("sapo", 1.0, 1.05)
    g = interop.to_trl(make_config("gmpo"), output_dir="/tmp/unused", report_to="none", use_cpu=True)
    assert type(g).__name__ == "GMPOConfig" and (g.epsilon, g.epsilon_high) == (0.4, 0.4)


def test_verl_new_losses_by_hand():
    """verl's names (the same in v0.7.0 and main's 0.8.0.dev): cispo (one-sided as clip_ratio_low=1.0), sapo with
    tau_pos / tau_neg, geo_mean for GMPO."""
    cispo = interop.to_verl(make_config("cispo")).split()
    assert {"actor_rollout_ref.actor.policy_loss.loss_mode=cispo", "actor_rollout_ref.actor.clip_ratio_low=1.0",
            "actor_rollout_ref.actor.clip_ratio_high=4.0"} <= set(cispo)
    two = interop.to_verl(make_config("cispo", cispo_form="two-sided", eps_high=0.28)).split()
    assert {"actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28"} <= set(two)
    sapo = interop.to_verl(make_config("sapo")).split()
    assert {"actor_rollout_ref.actor.policy_loss.loss_mode=sapo", "actor_rollout_ref.actor.tau_pos=1.0",
            "actor_rollout_ref.actor.tau_neg=1.05"} <= set(sapo)
    gmpo = interop.to_verl(make_config("gmpo")).split()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean" in gmpo
    with pytest.raises(NotImplementedError, match="sapo"):
        interop.to_verl(make_config("sapo", agg="token-mean"))


def test_advantages_match_trl_formula():
    """TRL 1.16 computes (r - group mean) / (unbiased group std + 1e-4) ("group"), (r - mean) alone ("none");
    by hand for the scripted rewards: group [1, 1, 0, 0] has mean 0.5, std sqrt(1/3) = 0.57735, so
    A = +-0.5 / 0.57745 = +-0.865876; minirl's group_advantages gives the same."""
    a = group_advantages(REWARDS, G, scale="group")
    assert torch.allclose(a, torch.tensor([1, 1, -1, -1, 1, 1, -1, -1]) * 0.5 / (3 ** -0.5 + 1e-4), atol=1e-6)
    assert torch.equal(group_advantages(REWARDS, G, scale="none"), torch.tensor([.5, .5, -.5, -.5, .5, .5, -.5, -.5]))


# ------------------------------------------------------------------------------------------------ conventions
def one_step(cfg_name, tok, base_model, batch, tmp_path, **kw):
    cfg = make_config(cfg_name, prompts_per_step=2, group_size=G, num_minibatches=kw.pop("num_minibatches", 1),
                      max_new_tokens=16, max_grad_norm=1e9, progress=False, **kw.pop("cfg", {}))
    return run_both(cfg, tok, base_model, batch, tmp_path, steps=1, **kw)[0]


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo"])
def test_rows_without_tokens_trl_counts_them(algo, tok, base_model, rollout_batch, tmp_path):
    """A row whose loss mask is all zero (an overlong-filtered completion): TRL's "grpo" / "dr_grpo" divide by
    all B = 8 rows, minirl by the 7 that have a token, so TRL's loss and gradient are 7/8 of minirl's."""
    mask = rollout_batch["mask"].clone()
    mask[2] = 0  # row 2 ("1+2=3;3+3=6#6", advantage -0.87) has no token left
    loss_t, loss_m, _, _, _, _, g_m, g_t = one_step(algo, tok, base_model, rollout_batch, tmp_path, loss_mask=mask)
    assert abs(loss_m) > 1e-3
    assert loss_t == pytest.approx(7 / 8 * loss_m, abs=TOL)
    assert max(float((t - 7 / 8 * m).abs().max()) for t, m in zip(g_t, g_m, strict=True)) < TOL


def test_log_ratio_past_20_nats_is_linear_in_minirl_and_exp_in_trl(tok, base_model, rollout_batch, tmp_path):
    """minirl continues exp linearly above 20 nats (e^20 (1 + x - 20)); TRL 1.16 takes exp as it is. One token of
    row 2 (advantage A = -0.865876, 14 tokens) gets pi_old 25 nats below pi: its loss term is -A * ratio, e^25 in
    TRL and e^20 * (1 + 5) = 6 e^20 in minirl, so TRL's GRPO loss is larger by |A| (e^25 - 6 e^20) / (14 tokens *
    8 rows) = 5.34e8. Both gradients through that token have the same sign; TRL's is e^5 / 1 = 148 times larger
    (minirl's is the slope of the linear continuation, e^20)."""
    shift = torch.zeros_like(rollout_batch["mask"])
    shift[2, 3] = -25.0
    loss_t, loss_m, gdiff, *_ = one_step("grpo", tok, base_model, rollout_batch, tmp_path, old_shift=shift)
    A = 0.5 / (3 ** -0.5 + 1e-4)
    e = torch.tensor([25.0, 20.0], dtype=torch.float64).exp()
    expected = A * (e[0] - 6 * e[1]).item() / (14 * 8)
    assert loss_t - loss_m == pytest.approx(expected, rel=1e-4)
    assert gdiff > 1e3  # TRL's gradient carries the e^25 ratio


def test_dapo_normaliser_with_several_minibatches(tok, base_model, rollout_batch, tmp_path):
    """TRL's "dapo" divides each optimiser step by the generation batch's tokens / steps_per_generation; minirl's
    token-mean by the minibatch's own tokens. Tokens per completion (EOS included): group 0 4 + 8 + 14 + 2 = 28,
    group 1 6 + 16 + 4 + 8 = 34, rollout 62; with 2 minibatches TRL divides group 0's step by 62 / 2 = 31,
    minirl by 28, so TRL's loss is 28/31 of minirl's. With one minibatch per rollout they agree (tested above)."""
    assert int(rollout_batch["mask"][:4].sum()) == 28 and int(rollout_batch["mask"].sum()) == 62
    loss_t, loss_m, *_, g_m, g_t = one_step("dapo", tok, base_model, rollout_batch, tmp_path, num_minibatches=2,
                                            rows=torch.arange(4),
                                            cfg=dict(dynamic_sampling=False, overlong_shaping=False))
    assert abs(loss_m) > 1e-3
    assert loss_t == pytest.approx(28 / 31 * loss_m, abs=TOL)
    assert max(float((t - 28 / 31 * m).abs().max()) for t, m in zip(g_t, g_m, strict=True)) < TOL


def test_trl_default_kl_bias_correction_changes_the_gradient(tok, base_model, rollout_batch, tmp_path):
    """TRL 1.16's default use_bias_correction_kl=True multiplies the k3 term by the ratio r. On-policy r = 1, so
    the loss is the same, but d(r k3) = dk3 + k3 d log pi: the gradient differs even at the first step. to_trl
    sets it False (GRPO's loss, minirl's), which the preset tests check."""
    ref_moved = copy.deepcopy(base_model)
    with torch.no_grad():  # a reference away from the policy, so k3 > 0
        for p in ref_moved.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    loss_t, loss_m, gdiff, gscale, *_ = one_step("grpo", tok, base_model, rollout_batch, tmp_path,
                                                 trl_args={"use_bias_correction_kl": True}, ref_model=ref_moved)
    assert loss_t == pytest.approx(loss_m, abs=TOL)  # same value on-policy
    assert gdiff > 1e-4 * gscale  # not the same gradient


def test_overlong_reward_matches_minirl():
    """TRL's soft overlong punishment (a reward function) is minirl's overlong_penalty: max_len 20, cache 4,
    lengths 15..21 -> 0, 0, -0.25, -0.5, -0.75, -1, -1 (DAPO eq. 13)."""
    cfg = make_config("dapo", max_new_tokens=20, overlong_cache_len=4)
    fns = interop.trl_reward_funcs(cfg, lambda prompts, completions, **_: [0.0] * len(prompts))
    lengths = list(range(15, 22))
    trl_values = fns[1](completion_ids=[[5] * n for n in lengths])
    assert trl_values == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert trl_values == rewards.overlong_penalty(torch.tensor(lengths), max_len=20, cache_len=4).tolist()


# ------------------------------------------------------------------------------------------------ preference
PAIRS = {"prompt": ["1+2=", "3+4+5="], "chosen": ["1+2=3#3", "3+4=7;7+5=12#12"], "rejected": ["3#4", "12#11"]}


def _pref_models(base_model):
    policy = copy.deepcopy(base_model)
    with torch.no_grad():  # policy away from the reference, so the margins are not 0
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return policy, copy.deepcopy(base_model).eval().requires_grad_(False)


def _pref_inputs(tok, prompts, completions):
    """TRL's DPO/KTO batch layout from minirl's encoding: completion_mask over the whole sequence."""
    enc = encode_completions(tok, prompts, completions)
    cm = torch.cat([torch.zeros(len(prompts), enc["n_prompt_tokens"]), enc["completion_mask"]], 1).long()
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "completion_mask": cm}


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _grad_gap(model_a, model_b) -> float:
    """max |grad difference|, relative to the largest gradient entry when that is above 1 (IPO's are ~10)."""
    a, b = _grads(model_a), _grads(model_b)
    scale = max(1.0, max(float(g.abs().max()) for g in b))
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)) / scale


@pytest.mark.parametrize("method", ["dpo", "ipo", "dpo_label_smoothing"])
def test_dpo_family_matches_trl(method, tok, base_model, tmp_path):
    """DPO and IPO (per-token mean, as TRL averages) through DPOTrainer._compute_loss and minirl's
    preference_pair_loss: same loss and gradient. With label_smoothing eps = 0.1 (cDPO) TRL 1.16's "sigmoid"
    ignores eps: per pair cDPO - DPO = eps (log sig(bh) - log sig(-bh)) = eps * beta * h, so minirl's loss is
    TRL's + 0.1 * mean(beta * h)."""
    cfg = PrefConfig(method="ipo" if method == "ipo" else "dpo", reduction="mean" if method == "ipo" else None,
                     batch_size=2, progress=False)
    policy_t, ref = _pref_models(base_model)
    policy_m = copy.deepcopy(policy_t)
    trl_cfg = interop.to_trl(cfg, output_dir=str(tmp_path), report_to="none", use_cpu=True)
    if method == "dpo_label_smoothing":
        trl_cfg.label_smoothing = 0.1
        cfg.label_smoothing = 0.1
        with pytest.raises(NotImplementedError, match="label_smoothing"):
            interop.to_trl(cfg, output_dir=str(tmp_path))
    data = datasets.Dataset.from_dict(PAIRS)
    trainer = trl.DPOTrainer(model=policy_t, ref_model=copy.deepcopy(ref), args=trl_cfg, train_dataset=data,
                             processing_class=tok)
    trainer.model.train()
    inputs = _pref_inputs(tok, PAIRS["prompt"] * 2, PAIRS["chosen"] + PAIRS["rejected"])
    loss_t = trainer._compute_loss(policy_t, inputs, return_outputs=False)
    loss_t.backward()
    loss_m, stats = preference_pair_loss(policy_m, ref, tok, PAIRS, cfg)
    loss_m.backward()
    if method == "dpo_label_smoothing":
        assert float(loss_m) - float(loss_t) == pytest.approx(0.1 * stats["margins"], abs=TOL)
        assert abs(stats["margins"]) > 1e-3
        return
    assert float(loss_t) == pytest.approx(float(loss_m), rel=TOL, abs=TOL)  # IPO's loss is ~25: float32 round-off
    assert _grad_gap(policy_t, policy_m) < TOL


def test_kto_matches_trl(tok, base_model, tmp_path):
    """KTO through KTOTrainer._compute_loss and minirl's preference_kto_loss: z0 from the mismatched pairs
    (prompt i with completion i+1 mod B, minirl's pairing without a generator), same loss and gradient."""
    data = {"prompt": ["1+2=", "3+4+5=", "2+2=", "5+5="], "completion": ["1+2=3#3", "12#11", "2+2=4#4", "9#9"],
            "label": [True, False, True, False]}
    cfg = PrefConfig(method="kto", batch_size=4, progress=False)
    policy_t, ref = _pref_models(base_model)
    policy_m = copy.deepcopy(policy_t)
    trainer = trl.KTOTrainer(model=policy_t, ref_model=copy.deepcopy(ref),
                             args=interop.to_trl(cfg, output_dir=str(tmp_path), report_to="none", use_cpu=True),
                             train_dataset=datasets.Dataset.from_dict(data), processing_class=tok)
    trainer.model.train()
    inputs = _pref_inputs(tok, data["prompt"], data["completion"])
    kl_in = _pref_inputs(tok, data["prompt"], data["completion"][1:] + data["completion"][:1])
    inputs.update({f"KL_{k}": v for k, v in kl_in.items()}, label=torch.tensor(data["label"]))
    loss_t = trainer._compute_loss(policy_t, inputs, return_outputs=False)
    loss_t.backward()
    loss_m, _ = preference_kto_loss(policy_m, ref, tok, data, cfg)
    loss_m.backward()
    assert float(loss_t) == pytest.approx(float(loss_m), abs=TOL)
    assert _grad_gap(policy_t, policy_m) < TOL


def test_simpo_matches_trl_cpo(tok, base_model, tmp_path):
    """SimPO: TRL 1.16's form is CPOTrainer(loss_type="simpo", cpo_alpha=0); its cpo_loss on mean log-probs is
    -log sig(beta (c - r) - simpo_gamma), minirl's simpo_loss with the absolute margin gamma = simpo_gamma."""
    from trl.experimental.cpo import CPOTrainer

    cfg = PrefConfig(method="simpo", batch_size=2, gamma=0.5, progress=False)
    trl_cfg = interop.to_trl(cfg, output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert (trl_cfg.loss_type, trl_cfg.simpo_gamma, trl_cfg.cpo_alpha, trl_cfg.beta) == ("simpo", 0.5, 0.0, 2.0)
    policy_t, _ = _pref_models(base_model)
    policy_m = copy.deepcopy(policy_t)
    trainer = CPOTrainer(model=policy_t, args=trl_cfg, train_dataset=datasets.Dataset.from_dict(PAIRS),
                         processing_class=tok)
    enc = encode_completions(tok, PAIRS["prompt"] * 2, PAIRS["chosen"] + PAIRS["rejected"])
    tok_lp = rollout.token_logprobs(policy_t, enc["input_ids"], enc["attention_mask"], enc["n_prompt_tokens"])
    logps = rollout.sequence_logprobs(tok_lp, enc["completion_mask"], reduction="mean")  # (2B,) the same for both
    losses_t, _, _ = trainer.cpo_loss(logps[:2], logps[2:])
    losses_t.mean().backward()
    loss_m, _ = preference_pair_loss(policy_m, None, tok, PAIRS, cfg)
    loss_m.backward()
    assert float(losses_t.mean()) == pytest.approx(float(loss_m), abs=TOL)
    assert _grad_gap(policy_t, policy_m) < TOL


# ------------------------------------------------------------------------------------------------ what TRL lacks
@pytest.mark.parametrize("algo, overrides, switch", [
    ("ppo", {}, "advantage='gae'"),
    ("grpo", {"kl_placement": "reward"}, "kl_placement='reward'"),
    ("grpo", {"kl_estimator": "k2"}, "kl_estimator='k2'"),
    ("grpo", {"kl_estimator": "k1"}, "kl_estimator='k1'"),
    ("grpo", {"adaptive_kl": True}, "adaptive_kl"),
    ("gspo", {"routing_replay": True}, "routing_replay"),
    ("dapo", {}, "dynamic_sampling"),
    ("dapo", {"dynamic_sampling": False}, "overlong_shaping"),
    ("grpo", {"adv_eps": 1e-6}, "adv_eps"),
    ("gspo_token", {"agg": "token-mean"}, "level='sequence-token' with agg='token-mean'"),
    ("grpo", {"dual_clip": 1.1}, "dual_clip=1.1"),
])
def test_switch_trl_lacks_raises_naming_it(algo, overrides, switch):
    with pytest.raises(NotImplementedError, match=switch.replace("(", r"\(").replace(")", r"\)")):
        interop.to_trl(make_config(algo, **overrides), output_dir="unused")


def test_dapo_preset_with_its_missing_switches_named():
    """The DAPO preset maps once the caller names what TRL runs differently: no dynamic sampling, and the
    overlong penalty as a reward function (``trl_reward_funcs``)."""
    args = interop.to_trl(make_config("dapo"), without=("dynamic_sampling", "overlong_shaping"), output_dir="unused")
    assert (args.loss_type, args.epsilon, args.epsilon_high, args.beta) == ("dapo", 0.2, 0.28, 0.0)
    with pytest.raises(ValueError, match="without="):
        interop.to_trl(make_config("grpo"), without=("routing_replay",), output_dir="unused")


@pytest.mark.parametrize("cfg, switch", [
    (PrefConfig(method="ipo"), "reduction='sum'"),  # the paper's sum; TRL averages per token
    (PrefConfig(method="simpo", reduction="sum"), "reduction='sum'"),
    (PrefConfig(method="dpo", label_smoothing=0.1), "label_smoothing"),
    (PrefConfig(method="dpo", temperature=0.7), "temperature"),
])
def test_preference_setting_trl_lacks_raises(cfg, switch):
    with pytest.raises(NotImplementedError, match=switch):
        interop.to_trl(cfg, output_dir="unused")


# paper-index: interop.trl_kwargs
def test_presets_map_to_the_documented_trl_settings():
    """The five presets TRL runs, with the values of ALGORITHMS (hand-copied from config.py)."""
    g = interop.trl_kwargs(make_config("grpo"))
    assert (g["loss_type"], g["beta"], g["epsilon"], g["scale_rewards"], g["use_bias_correction_kl"]) == \
        ("grpo", 0.04, 0.2, "group", False)
    d = interop.trl_kwargs(make_config("dr_grpo"))
    assert (d["loss_type"], d["scale_rewards"], d["beta"], d["max_completion_length"]) == ("dr_grpo", "none", 0, 40)
    for algo in ("gspo", "gspo_token"):  # TRL has no GSPO-token level: same value and gradient as GSPO (tested)
        s = interop.trl_kwargs(make_config(algo))
        assert (s["importance_sampling_level"], s["loss_type"], s["epsilon"], s["epsilon_high"]) == \
            ("sequence", "grpo", 3e-4, 4e-4)
    # one rollout: 8 prompts x 8 = 64 rows in 2 minibatches of 32 -> 2 optimiser steps per rollout, 60 rollouts
    assert (g["per_device_train_batch_size"], g["steps_per_generation"], g["max_steps"]) == (32, 2, 120)


def test_batch_layout_splits_each_forward_over_the_launchs_processes():
    """TRL's batch is per device: per_device_train_batch_size x num_processes x steps_per_generation must be one
    rollout (GRPOConfig's generation_batch_size), and x gradient_accumulation_steps one minibatch, on any GPU count."""
    def layout(cfg, n):
        kw = interop.trl_kwargs(cfg, num_processes=n)
        return kw["per_device_train_batch_size"], kw["steps_per_generation"], kw["gradient_accumulation_steps"]

    grpo = make_config("grpo")  # 8 prompts x 8 = 64 rows, 2 minibatches of 32
    assert layout(grpo, 1) == (32, 2, 1)  # 32 x 1 x 2 = 64
    assert layout(grpo, 2) == (16, 2, 1)  # 16 x 2 x 2 = 64
    # micro-batches of 8 rows: 4 forwards per optimiser step, each shared by 2 devices: 4 x 2 x (2 x 4) = 64 rows
    assert layout(make_config("grpo", micro_batch_size=8), 2) == (4, 8, 4)  # per step 4 x 2 x 4 = 32 rows
    # notebook 10's real run: 64 prompts x 16 = 1024 rows, 2 minibatches, 8 GPUs: 64 x 8 x 2 = 1024
    real = make_config("grpo", prompts_per_step=64, group_size=16)
    assert layout(real, 8) == (64, 2, 1)
    assert interop.to_trl(real, output_dir="unused", num_processes=8).per_device_train_batch_size == 64
    assert interop.rloo_trl_kwargs(make_config("rloo"), num_processes=4)["per_device_train_batch_size"] == 16  # 64/4
    for n in (3, 0, 2.0):  # 3 does not divide 32 rows; 0 and a float are not a process count
        with pytest.raises(ValueError, match="num_processes"):
            interop.trl_kwargs(grpo, num_processes=n)
    with pytest.raises(ValueError, match="num_processes"):
        interop.to_trl(PrefConfig(method="dpo"), output_dir="unused", num_processes=2)
    # verl's micro-batch is per GPU too: the same 512-row minibatch on 8 GPUs is 64 rows each (verl asserts that
    # the per-GPU micro-batch divides the per-GPU minibatch, 32 prompts x 16 / 8 GPUs = 64 rows)
    verl = interop.verl_overrides(real, num_processes=8)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64" in verl and "trainer.n_gpus_per_node=8" in verl
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32" in interop.verl_overrides(grpo)  # 1 GPU
    with pytest.raises(ValueError, match="num_processes"):
        interop.verl_overrides(grpo, num_processes=3)


def test_engine_equivalents_name_every_preset_in_both_engines():
    """One entry per preset; each is the mapped setting or the engine's refusal (a reason, never a silent gap)."""
    table = interop.engine_equivalents()
    assert list(table) == list(ALGORITHMS)
    for name, row in table.items():
        assert row["trl"].startswith(("GRPOConfig(", "RLOOConfig(", "trl.experimental.gmpo.GMPOConfig(",
                                      "not in TRL")), \
            (name, row["trl"])
        assert row["verl"].startswith(("algorithm.adv_estimator=", "not mapped to verl")), (name, row["verl"])
    assert table["grpo"]["trl"].startswith("GRPOConfig(loss_type='grpo'") and "not in TRL" in table["ppo"]["trl"]
    # the short map keeps every algorithm-defining override to_verl writes, DAPO's overlong shaping included
    dapo = set(interop.verl_overrides(make_config("dapo")))
    assert {o for o in dapo if "reward" in o} <= set(table["dapo"]["verl"].split()), table["dapo"]["verl"]
    assert "+reward.reward_kwargs.overlong_buffer_cfg.enable=True" in table["dapo"]["verl"].split()
#: Every GRPOConfig field of TRL 1.16 that ``trl_kwargs`` does not set, reviewed: it does not change what
#: ``to_trl(cfg)`` computes (why, in a few words). The test below fails when the installed TRL has a field in neither
#: this nor ``trl_kwargs`` (minirl/interop/trl.py pins the fields that matter in ``_TRL_FIXED``).
_UNPINNED_BY_REASON = {  # reason: the fields, space-separated
    "inert: only for loss_type sapo / vespo": "sapo_temperature_neg sapo_temperature_pos vespo_k_pos "
        "vespo_lambda_pos vespo_k_neg vespo_lambda_neg",
    "inert: use_adaptive_entropy=False": "entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target",
    "inert: sync_ref_model=False": "ref_model_mixup_alpha ref_model_sync_steps",
    "inert with vllm_importance_sampling_correction=False; set by trl_kwargs for is_correction": "vllm_importance_"
        "sampling_mode vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min",
    "deprecated alias of vllm_importance_sampling_clip_max (which trl_kwargs sets)": "vllm_importance_sampling_cap",
    "generation engine: where vLLM runs, not what it samples": "vllm_mode vllm_model_impl vllm_enable_sleep_mode "
        "vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port "
        "vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size",
    "generation speed / memory": "use_transformers_continuous_batching transformers_continuous_batching_config "
        "use_transformers_paged cache_implementation ds3_gather_for_generation use_cache",
    "evaluation only": "num_generations_eval per_device_eval_batch_size eval_strategy eval_steps eval_delay "
        "prediction_loss_only eval_on_start eval_do_concat_batches eval_use_gather_object eval_accumulation_steps "
        "include_for_metrics batch_eval_metrics bf16_full_eval fp16_full_eval do_eval do_predict",
    "conversational prompts / tools, out of scope": "chat_template_kwargs max_tool_calling_iterations",
    "model loading: the caller passes the model": "trust_remote_code",
    "deprecated aliases of activation_checkpointing(_kwargs), which trl_kwargs sets": "gradient_checkpointing "
        "gradient_checkpointing_kwargs",
    "logging": "log_completions log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo "
        "logging_strategy logging_steps logging_first_step log_on_each_node logging_nan_inf_filter "
        "include_num_input_tokens_seen log_level log_level_replica disable_tqdm report_to run_name project "
        "trackio_space_id trackio_bucket_id trackio_static_space_id skip_memory_metrics debug",
    "saving / resuming": "output_dir save_only_model save_strategy save_steps save_on_each_node save_total_limit "
        "enable_jit_checkpoint load_best_model_at_end metric_for_best_model greater_is_better ignore_data_skip "
        "restore_callback_states_from_checkpoint resume_from_checkpoint do_train",
    "hub": "push_to_hub hub_token hub_private_repo hub_model_id hub_strategy hub_always_push hub_revision",
    "devices and sharding: the caller's hardware, not the objective": "use_cpu accelerator_config "
        "parallelism_config fsdp fsdp_config deepspeed ddp_find_unused_parameters ddp_bucket_cap_mb "
        "ddp_broadcast_buffers ddp_static_graph ddp_backend ddp_timeout local_rank tf32",
    "memory / speed (same objective)": "torch_compile torch_compile_backend torch_compile_mode "
        "torch_empty_cache_steps optim_target_modules liger_kernel_config full_determinism",
    "data loading mechanics": "dataloader_num_workers dataloader_pin_memory dataloader_persistent_workers "
        "dataloader_prefetch_factor dataloader_multiprocessing_context dataloader_in_order label_names "
        "length_column_name",
    "overridden: max_steps is pinned": "num_train_epochs",
    "unused: GRPOTrainer's compute_loss makes its own normaliser": "average_tokens_across_devices",
}
TRL_UNPINNED = {name: why for why, names in _UNPINNED_BY_REASON.items() for name in names.split()}


def test_every_grpoconfig_field_is_pinned_or_reviewed():
    """The installed TRL's GRPOConfig (TrainingArguments included) has no field that to_trl leaves to TRL's
    default without a reviewed reason: each is either set by trl_kwargs (what minirl computes) or listed in
    TRL_UNPINNED (logging, saving, hub, devices, inert settings...). A new TRL field fails this test
    until someone decides which list it belongs to."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    for algo, without in [("grpo", ()), ("dr_grpo", ()), ("gspo", ()), ("dapo", interop.DROPPABLE)]:
        pinned = set(interop.trl_kwargs(make_config(algo), without=without))
        assert not pinned & set(TRL_UNPINNED), sorted(pinned & set(TRL_UNPINNED))
        unreviewed = names - pinned - set(TRL_UNPINNED)
        assert not unreviewed, f"GRPOConfig fields neither pinned by to_trl nor reviewed: {sorted(unreviewed)}"
    assert not set(TRL_UNPINNED) - names  # no stale entry


def test_pinned_fields_reach_grpoconfig(tmp_path):
    """The settings that the issue found left to TRL's defaults are stated, and survive into the config."""
    args = interop.to_trl(make_config("gspo"), output_dir=str(tmp_path), use_cpu=True)
    assert (args.router_aux_loss_coef, args.vllm_importance_sampling_correction, args.top_entropy_quantile,
            args.entropy_coef, args.off_policy_mask_threshold, args.multi_objective_aggregation,
            args.cast_lm_head_to_fp32, args.disable_dropout, args.use_vllm) == \
        (0.0, False, 1.0, 0.0, None, "sum_then_normalize", False, True, False)
    # TRL 1.16's own defaults differ for two of them: what a config built without to_trl would compute
    plain = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert (plain.router_aux_loss_coef, plain.vllm_importance_sampling_correction) == (None, True)


#: The option names of verl 0.9.1 that to_verl writes, copied from verl/trainer/config/_generated_ppo_trainer.yaml of
#: that release (PyPI wheel), where algorithm.filter_groups is the main trainer's; the "+reward.reward_kwargs.*" keys
#: are read by verl/experimental/reward_loop/reward_manager/dapo.py (config.reward.reward_kwargs) and absent from
#: the default config (Hydra's "+" adds them).
VERL_091_KEYS = {
    "trainer.n_gpus_per_node",
    "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.gamma", "algorithm.lam",
    "algorithm.use_kl_in_reward", "algorithm.kl_penalty", "algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.type",
    "algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon", "critic.optim.lr", "critic.cliprange_value",
    "data.train_batch_size", "data.max_response_length", "data.gen_batch_size", "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_k", "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.optim.weight_decay", "actor_rollout_ref.actor.optim.clip_grad",
    "actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.clip_ratio_c",
    "actor_rollout_ref.actor.loss_agg_mode", "actor_rollout_ref.actor.loss_scale_factor",
    "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type", "algorithm.filter_groups.enable", "algorithm.filter_groups.metric",
    "algorithm.filter_groups.max_num_gen_batches", "reward.reward_manager.name",
    "+reward.reward_kwargs.overlong_buffer_cfg.enable", "+reward.reward_kwargs.overlong_buffer_cfg.len",
    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", "+reward.reward_kwargs.max_resp_len",
    "actor_rollout_ref.actor.tau_pos", "actor_rollout_ref.actor.tau_neg",
    # precision and checkpointing (interop.real_model, stated for every preset): verl/workers/config/engine.py's
    # FSDPEngineConfig.model_dtype and mixed_precision (a dict the yaml leaves out, hence "+")
    "actor_rollout_ref.actor.fsdp_config.model_dtype", "actor_rollout_ref.ref.fsdp_config.model_dtype",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
}


# paper-index: interop.verl_overrides
@pytest.mark.parametrize("algo", ["ppo", "grpo", "dr_grpo", "dapo", "gspo", "gspo_token", "cispo", "sapo",
                                  "gmpo"])
def test_verl_overrides_use_verl_091_names(algo):
    assert interop.VERL_VERSION == "0.9.1"
    overrides = interop.verl_overrides(make_config(algo))
    assert {o.split("=", 1)[0] for o in overrides} <= VERL_091_KEYS
    assert interop.to_verl(make_config(algo)) == " ".join(overrides)


def test_verl_grpo_overrides_by_hand():
    text = interop.to_verl(make_config("grpo"))
    for part in ("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.kl_loss_coef=0.04", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
                 "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", "actor_rollout_ref.rollout.n=8",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=4"):  # 8 prompts / 2 minibatches
        assert part in text.split()
    with pytest.raises(NotImplementedError, match="routing_replay"):
        interop.to_verl(make_config("gspo", routing_replay=True))


@pytest.mark.slow
def test_minirl_does_not_import_interop_or_trl():
    import subprocess
    import sys

    code = "import sys, minirl; assert 'minirl.interop' not in sys.modules and 'trl' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# paper-index: interop.pref_trl_kwargs
def test_pref_trl_kwargs_names_the_trainer_and_the_loss_settings():
    """Each preference method maps to TRL's trainer and the settings that define its loss (TRL itself not imported)."""
    trainer, kw = interop.pref_trl_kwargs(PrefConfig(method="dpo", beta=0.2))
    assert (trainer, kw["loss_type"], kw["beta"]) == ("DPOTrainer", ["sigmoid"], 0.2)
    trainer, kw = interop.pref_trl_kwargs(PrefConfig(method="ipo", tau=0.3, reduction="mean"))
    assert (trainer, kw["loss_type"], kw["beta"]) == ("DPOTrainer", ["ipo"], 0.3)  # TRL's beta is IPO's tau
    trainer, kw = interop.pref_trl_kwargs(PrefConfig(method="kto", lambda_d=1.0, lambda_u=1.5))
    assert (trainer, kw["desirable_weight"], kw["undesirable_weight"]) == ("KTOTrainer", 1.0, 1.5)
    trainer, kw = interop.pref_trl_kwargs(PrefConfig(method="simpo", gamma=0.5))
    assert (trainer, kw["loss_type"], kw["simpo_gamma"], kw["cpo_alpha"]) == ("CPOTrainer", "simpo", 0.5, 0.0)
# paper-index: interop.rloo_trl_kwargs
def test_rloo_maps_to_trls_rlootrainer_on_policy_only():
    kw = interop.rloo_trl_kwargs(make_config("rloo"))
    assert (kw["normalize_advantages"], kw["beta"], kw["epsilon"], kw["num_generations"]) == (False, 0.0, 0.2, 8)
    # 8 prompts x 8 = 64 rows in ONE minibatch: one optimiser step per rollout, 60 rollouts
    assert (kw["per_device_train_batch_size"], kw["steps_per_generation"], kw["max_steps"]) == (64, 1, 60)
    cfg = interop.to_trl(make_config("rloo"), output_dir="unused", report_to=[])
    assert type(cfg).__name__ == "RLOOConfig" and cfg.normalize_advantages is False
    for overrides, switch in [(dict(num_minibatches=2), "num_minibatches=2"), (dict(num_iterations=2), "num_iter"),
                              (dict(agg="token-mean"), "agg='token-mean'"), (dict(beta=0.05), "beta=0.05"),
                              (dict(dual_clip=3.0), "dual_clip")]:
        with pytest.raises(NotImplementedError, match=switch):
            interop.to_trl(make_config("rloo", **overrides), output_dir="unused")


@pytest.mark.parametrize("algo, reason", [("rloo", "RLOOTrainer has the leave-one-out baseline"),
                                          ("reinforce_pp", "no batch-mean baseline"),
                                          ("reinforce_pp_baseline", "std of the raw rewards")])
def test_grpo_config_refuses_the_estimators_grpotrainer_lacks(algo, reason):
    with pytest.raises(NotImplementedError, match=reason):
        interop.trl_kwargs(make_config(algo))


@pytest.mark.parametrize("algo, estimator", [("rloo", "rloo"), ("reinforce_pp", "reinforce_plus_plus"),
                                             ("reinforce_pp_baseline", "reinforce_plus_plus_baseline")])
def test_verl_names_the_same_estimators(algo, estimator):
    overrides = interop.verl_overrides(make_config(algo))
    assert {o.split("=", 1)[0] for o in overrides} <= VERL_091_KEYS
    assert f"algorithm.adv_estimator={estimator}" in overrides
    assert not any(o.startswith("algorithm.norm_adv_by_std_in_grpo") for o in overrides)  # a GRPO-only switch


def test_rloo_config_gets_every_pinned_field_it_has():
    """RLOOConfig shares GRPOConfig's pinned settings except the ones it does not have (_GRPO_ONLY)."""
    import dataclasses

    from minirl.interop.trl import _GRPO_ONLY, _TRL_FIXED  # the TRL bridge's own tables, not re-exported

    rloo_fields = {f.name for f in dataclasses.fields(trl.RLOOConfig)}
    assert set(_GRPO_ONLY) == set(_TRL_FIXED) - rloo_fields
    kw = interop.rloo_trl_kwargs(make_config("rloo"))
    shared = set(_TRL_FIXED) & rloo_fields
    assert {k: kw[k] for k in shared} == {k: _TRL_FIXED[k] for k in shared}
def test_rloo_loss_and_gradient_match_trls_rlootrainer_on_policy(tok, base_model, rollout_batch, tmp_path):
    """One on-policy step: TRL's sequence-ratio loss -mean_i min(rho_i A_i, clip(rho_i) A_i) with rho_i = 1 has the
    gradient -1/B sum_i A_i grad sum_t log pi_t, minirl's rloo preset (token ratios, seq-mean-token-sum)."""
    from minirl.advantages import rloo_advantages

    cfg = make_config("rloo", prompts_per_step=2, group_size=G, steps=1, max_grad_norm=1e9)  # compare raw grads
    args = interop.to_trl(cfg, output_dir=str(tmp_path), report_to="none", use_cpu=True, logging_steps=1)
    model_m, model_t = copy.deepcopy(base_model), copy.deepcopy(base_model)
    trainer = trl.RLOOTrainer(model=model_t, reward_funcs=lambda prompts, completions, **_: [0.0] * len(prompts),
                              args=args, train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                              processing_class=tok)
    trainer.model.train()
    b = rollout_batch
    P, mask = b["prompt_ids"].shape[1], b["mask"]
    input_ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    attention_mask = torch.cat([b["prompt_mask"], mask.long()], 1)
    with torch.no_grad():
        old = rollout.token_logprobs(model_m, input_ids, attention_mask, P) * mask
    advantages = rloo_advantages(REWARDS, group_size=G)
    # group [1, 1, 0, 0]: A = 1 - (1 + 0 + 0) / 3 = 2/3 for a right one, 0 - (1 + 1 + 0) / 3 = -2/3 for a wrong one
    torch.testing.assert_close(advantages, torch.tensor([2, 2, -2, -2, 2, 2, -2, -2]) / 3)
    inputs = dict(prompt_ids=b["prompt_ids"], prompt_mask=b["prompt_mask"], completion_ids=b["completion_ids"],
                  completion_mask=mask.long(), advantages=advantages, old_logps=old.sum(1))
    loss_t = trainer.compute_loss(model_t, inputs)
    loss_t.backward()
    mb = rl.RLBatch(input_ids=input_ids, attention_mask=attention_mask, n_prompt_tokens=P, completion_mask=mask,
                    loss_mask=mask, old_logprobs=old, advantages=advantages)
    stats = rl.update_minibatch(model_m, torch.optim.SGD(model_m.parameters(), lr=0.0), mb, cfg, beta=0.0)
    # the VALUES differ: TRL's is -mean_i A_i = 0 (one ratio of 1 per sequence); minirl's sums the token ratios,
    # -1/B sum_i A_i T_i with T = [4, 8, 14, 2 | 6, 16, 4, 8] tokens: -(2/3) (4 + 8 - 14 - 2 + 6 + 16 - 4 - 8) / 8
    assert float(loss_t.detach()) == pytest.approx(0.0, abs=TOL)
    assert stats["loss"] == pytest.approx(-(2 / 3) * 6 / 8, abs=TOL)
    diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model_t.parameters(), model_m.parameters(),
                                                                     strict=True))
    scale = max(float(q.grad.abs().max()) for q in model_m.parameters())
    print(f"max |grad difference| {diff:.2e}, max |grad| {scale:.2f}")
    assert scale > 1e-3 and diff < 1e-5 * scale, (diff, scale)  # float32 sums over up to 16 tokens: relative


def test_the_simulated_sampler_has_no_engine_equivalent():
    # the dials simulate an engine's mismatch: in TRL and verl the sampler is the engine, so they raise, naming them
    for settings in (dict(sampler_dtype="bfloat16"), dict(sampler_logit_noise=0.5)):
        cfg = make_config("grpo", **settings)
        with pytest.raises(NotImplementedError, match="sampler_dtype"):
            interop.to_trl(cfg, output_dir="unused")
        with pytest.raises(NotImplementedError, match="sampler_dtype"):
            interop.to_verl(cfg)


# ------------------------------------------------------------------------------------------------ sampler corrections
def _two_rows_on_policy(batch):
    """Rows 0 and 1 of the scripted rollout ("3#3", "1+2=3#3") as TRL's inputs, advantages [+1, -1], no
    old_per_token_logps (TRL then takes the current log-probs, detached: every ratio is 1)."""
    rows = torch.tensor([0, 1])
    return dict(prompt_ids=batch["prompt_ids"][rows], prompt_mask=batch["prompt_mask"][rows],
                completion_ids=batch["completion_ids"][rows], completion_mask=batch["mask"][rows].long(),
                advantages=torch.tensor([1.0, -1.0]), num_items_in_batch=batch["mask"][rows].sum())


def test_trls_gmpo_trainer_ignores_the_sampler_weights(tok, base_model, rollout_batch, tmp_path):
    """Why ``to_trl`` refuses GMPO with a sampler correction: TRL 1.16's ``GMPOTrainer._compute_loss`` replaces
    ``GRPOTrainer._compute_loss``, the only place that multiplies the loss by ``inputs["importance_sampling_ratio"]``,
    and never reads it. Two rows on-policy, A = [+1, -1], sequence weights [0.5, 2.0]: minirl's GMPO loss is
    mean(-w_i A_i) = (-0.5 + 2.0) / 2 = 0.75; TRL's is -mean(A_i) = 0 with the weights or without them. If a later
    TRL applies them, this test fails and the refusal can go."""
    cfg = make_config("gmpo", prompts_per_step=1, group_size=2, num_minibatches=1, max_new_tokens=16)
    trainer = grpo_trainer(copy.deepcopy(base_model), tok, cfg, tmp_path)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # what GRPOTrainer's own check reads
    inputs = _two_rows_on_policy(rollout_batch)
    weights = torch.tensor([0.5, 2.0])
    with torch.no_grad():
        trl_plain = float(trainer.compute_loss(trainer.model, inputs))
        trl_weighted = float(trainer.compute_loss(trainer.model, {**inputs, "importance_sampling_ratio":
                                                                  weights.unsqueeze(1)}))
    mask = inputs["completion_mask"].double()
    logprobs = torch.full(mask.shape, -1.0, dtype=torch.float64) * mask  # on-policy: the values do not matter
    ours, _ = losses.policy_loss(logprobs, logprobs, inputs["advantages"].double(), mask, loss_mode="gmpo",
                                 eps_low=cfg.eps_low, eps_high=cfg.eps_high, agg=cfg.agg, is_weights=weights.double())
    print(f"GMPO with sequence weights [0.5, 2.0]: minirl {float(ours):.4f}, TRL {trl_weighted:.4f} "
          f"(TRL without them {trl_plain:.4f})")
    assert float(ours) == pytest.approx(0.75, abs=1e-12)
    assert trl_weighted == pytest.approx(0.0, abs=TOL) and trl_plain == pytest.approx(0.0, abs=TOL)


@pytest.mark.parametrize("correction", ["seq_tis", "seq_mis"])
def test_gmpo_with_a_sampler_correction_is_refused_for_trl(correction):
    """The run would train uncorrected in TRL (test above): to_trl refuses, naming is_correction and the loss."""
    cfg = make_config("gmpo", is_correction=correction, is_cap=3.0, is_cap_low=0.5)
    for bridge in (interop.trl_kwargs, lambda c: interop.to_trl(c, output_dir="unused")):
        with pytest.raises(NotImplementedError, match=f"is_correction='{correction}' with loss_mode='gmpo'"):
            bridge(cfg)


def test_trls_sequence_level_cannot_take_token_weights_as_gspo_token(tok, base_model, rollout_batch, tmp_path):
    """Why ``to_trl`` refuses GSPO-token with a token-level correction: TRL's "sequence" level (which ``to_trl``
    writes for GSPO-token) computes one term per sequence and multiplies it by the token weights afterwards, so
    each token's gradient is the row's mean weight times the sequence ratio's gradient; minirl's GSPO-token weights
    each token's own term. On-policy the values agree, mean_i -A_i mean_t w_t; the gradients do not."""
    cfg = make_config("gspo_token", prompts_per_step=1, group_size=2, num_minibatches=1, max_new_tokens=16)
    model_t, model_m = copy.deepcopy(base_model), copy.deepcopy(base_model)
    trainer = grpo_trainer(model_t, tok, cfg, tmp_path)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # GRPOTrainer then applies the weights
    inputs = _two_rows_on_policy(rollout_batch)
    mask = inputs["completion_mask"].float()
    weights = (0.5 + 1.5 * (torch.arange(mask.shape[1]) % 3 == 0)).expand(mask.shape) * mask  # 2, .5, .5, 2, ...
    # row means 1.25 (4 tokens) and 1.0625 (8): loss (-1.25 + 1.0625) / 2 = -0.09375 in both engines
    loss_t = trainer.compute_loss(model_t, {**inputs, "importance_sampling_ratio": weights})
    loss_t.backward()
    P = inputs["prompt_ids"].shape[1]
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    logprobs = rollout.token_logprobs(model_m, ids, torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), P)
    loss_m, _ = losses.policy_loss(logprobs, logprobs.detach(), inputs["advantages"], mask, level="sequence-token",
                                   eps_low=cfg.eps_low, eps_high=cfg.eps_high, agg=cfg.agg, is_weights=weights)
    loss_m.backward()
    gdiff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model_t.parameters(), model_m.parameters(),
                                                                     strict=True))
    gscale = max(float(q.grad.abs().max()) for q in model_m.parameters())
    print(f"GSPO-token, token weights: loss TRL {float(loss_t):.6f} minirl {float(loss_m):.6f}; max |grad gap| "
          f"{gdiff:.2e} (max |grad| {gscale:.2e})")
    assert float(loss_t) == pytest.approx(-0.09375, abs=TOL) and float(loss_m) == pytest.approx(-0.09375, abs=TOL)
    assert gdiff > 0.05 * gscale
    for correction in ("token_tis", "token_mis"):
        with pytest.raises(NotImplementedError, match=f"is_correction='{correction}' with level='sequence-token'"):
            interop.trl_kwargs(make_config("gspo_token", is_correction=correction, is_cap_low=0.5))
    interop.trl_kwargs(make_config("gspo_token", is_correction="seq_tis"))  # one weight per row: GSPO's, maps


@pytest.mark.parametrize("algo, loss", [("gspo", ("sequence", "gspo")), ("gmpo", ("gmpo",))])
@pytest.mark.parametrize("correction", ["token_tis", "token_mis"])
def test_token_corrections_with_a_one_term_per_sequence_loss_are_never_mapped(algo, loss, correction):
    """A loss with one term per sequence has no token to weigh (minirl's policy_loss raises on (B, T) weights): no
    bridge maps the combination. ValueError, as for any invalid config (from validate once it holds the rule)."""
    bridges = {"trl_kwargs": interop.trl_kwargs, "to_trl": lambda c: interop.to_trl(c, output_dir="unused"),
               "verl_overrides": interop.verl_overrides, "to_verl": interop.to_verl}
    for name, bridge in bridges.items():
        with pytest.raises(ValueError, match="is_correction") as err:
            bridge(make_config(algo, is_correction=correction, is_cap_low=0.5))
        message = str(err.value).lower()
        assert correction in message and any(word in message for word in loss), (name, message)


def test_the_critic_refusal_points_to_what_the_installed_trl_has():
    """TRL 1.16 ships no PPO trainer (neither ``trl.PPOTrainer`` nor ``trl.experimental.ppo``): the refusal of
    advantage='gae' must not send a reader there, but to verl, which ``to_verl`` maps with its critic."""
    import importlib.util

    assert not hasattr(trl, "PPOTrainer") and importlib.util.find_spec("trl.experimental.ppo") is None
    with pytest.raises(NotImplementedError, match="advantage='gae'") as err:
        interop.trl_kwargs(make_config("ppo"))
    assert "PPOTrainer" not in str(err.value) and "to_verl" in str(err.value), str(err.value)
    assert "algorithm.adv_estimator=gae" in interop.verl_overrides(make_config("ppo"))


# --- the sampler corrections (minirl.importance) in TRL's and verl's settings -----------------------------------------
@pytest.mark.parametrize("setting, mode", [("token_tis", "token_truncate"), ("token_mis", "token_mask"),
                                           ("seq_tis", "sequence_truncate"), ("seq_mis", "sequence_mask")])
def test_to_trl_maps_each_correction(setting, mode, tmp_path):
    pytest.importorskip("trl")
    args = interop.to_trl(make_config("grpo", is_correction=setting, is_cap=3.0, is_cap_low=0.5),
                          output_dir=str(tmp_path), use_cpu=True)
    assert (args.vllm_importance_sampling_correction, args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_max, args.vllm_importance_sampling_clip_min) == (True, mode, 3.0, 0.5)


@pytest.mark.parametrize("overrides, switch", [
    (dict(is_correction="seq_mis", is_seq_form="geomean"), "is_seq_form='geomean'"),
    (dict(pi_old="naive"), "pi_old='naive'"),
])
def test_to_trl_raises_for_what_trl_cannot_express(overrides, switch):
    with pytest.raises(NotImplementedError, match=switch):
        interop.trl_kwargs(make_config("grpo", **overrides))


#: verl 0.9.1's algorithm.rollout_correction keys, copied from verl/trainer/config/_generated_ppo_trainer.yaml of the
#: 0.9.1 wheel (and verl/trainer/config/algorithm/rollout_correction.yaml).
VERL_091_ROLLOUT_CORRECTION = {"rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold",
                               "bypass_mode", "loss_type", "rollout_is_batch_normalize"}


@pytest.mark.parametrize("overrides, expected", [
    (dict(is_correction="token_tis", is_cap=2.0), ["rollout_is=token", "rollout_is_threshold=2.0",
                                                   "bypass_mode=False"]),
    (dict(is_correction="seq_tis", is_cap=5.0), ["rollout_is=sequence", "rollout_is_threshold=5.0",
                                                 "bypass_mode=False"]),
    (dict(is_correction="token_mis", is_cap=2.0, is_cap_low=0.5), ["rollout_is=token",
                                                                   "rollout_is_threshold=0.5_2.0",
                                                                   "bypass_mode=False"]),
    (dict(is_correction="seq_mis", is_cap=3.0, is_cap_low=0.25), ["rollout_is=sequence",
                                                                  "rollout_is_threshold=0.25_3.0",
                                                                  "bypass_mode=False"]),
    (dict(pi_old="naive"), ["bypass_mode=True", "loss_type=ppo_clip"]),
])
def test_to_verl_writes_verl_091_rollout_correction(overrides, expected):
    out = [o for o in interop.verl_overrides(make_config("grpo", **overrides)) if "rollout_correction" in o]
    assert out == [f"algorithm.rollout_correction.{e}" for e in expected]
    assert {o.split("=")[0].removeprefix("algorithm.rollout_correction.") for o in out} <= VERL_091_ROLLOUT_CORRECTION


@pytest.mark.parametrize("overrides, switch", [
    (dict(is_correction="seq_tis", is_seq_form="geomean"), "is_seq_form='geomean'"),
    (dict(is_correction="token_tis", is_cap_low=0.5), "is_cap_low=0.5 with token_tis"),
    (dict(is_correction="seq_mis"), "seq_mis without is_cap_low"),
])
def test_to_verl_raises_for_what_verl_cannot_express(overrides, switch):
    with pytest.raises(NotImplementedError, match=switch):
        interop.verl_overrides(make_config("grpo", **overrides))
    with pytest.raises(NotImplementedError, match="pi_old='naive' with loss_mode='cispo'"):
        interop.verl_overrides(make_config("cispo", pi_old="naive"))
