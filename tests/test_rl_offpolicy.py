"""Stale and truncated samplers in the loop (issue 37): the top-k / top-p sampler (decoding.sample_tokens, generate),
the trainer's log-probs renormalised over its kept sets (token_logprobs(kept=...), keep_sampling_mask), the off-policy
sequence mask and the ratio-weighted k3 as RLConfig options, the stale sampler (sampler_sync_every) and decoupled PPO
from the existing switches, their settings, and equality with TRL 1.16's loss through ``to_trl``.

The math these call is tested in test_stale_corrections.py (hand values, enumerations, TRL's staticmethod); here: that
the loop
calls it as it says, with every option off giving today's tokens and numbers.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_stale_corrections import _random_batch, _trl, _trl_compute_loss

from minirl import (
    config,
    decoding,
    importance,
    kl_toy,
    losses,
    models,
    rl,
    rl_offpolicy,
    rollout,
    stale_corrections,
    tasks,
    truncation,
)
from minirl.inference_engine import make_sampler
from minirl.interop import to_trl, trl_kwargs, verl_overrides
from minirl.tokenizer import build_tokenizer

PROMPTS = ["1+2=", "3+4+5+6+7=", "8+9+1="]
F64 = dict(dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer("0123456789+=;#")
    model = models.tiny_dense(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)
    return model.eval(), tok


def _prompts(tok, G=4):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    return enc.input_ids.repeat_interleave(G, 0), enc.attention_mask.repeat_interleave(G, 0)


# ================================================================================ 1. the truncated sampler
@pytest.mark.parametrize("off", [dict(), dict(top_k=0, top_p=1.0), dict(top_k=None, top_p=None)])
def test_truncation_off_draws_todays_tokens(tiny, off):
    """Off (None, 0, 1.0): the same tokens and log-probs as the plain sampler, bit for bit; no kept sets."""
    model, tok = tiny
    ids, am = _prompts(tok)
    for seed in range(3):
        torch.manual_seed(seed)
        plain = decoding.sample_tokens(model, ids, am, 12, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(seed)
        same = decoding.sample_tokens(model, ids, am, 12, eos_token_id=tok.eos_token_id,
                                     pad_token_id=tok.pad_token_id, **off)
        assert torch.equal(plain[0], same[0]) and torch.equal(plain[1], same[1])
    torch.manual_seed(0)
    a = decoding.generate(model, tok, PROMPTS, 4, 12)
    torch.manual_seed(0)
    b = decoding.generate(model, tok, PROMPTS, 4, 12, **off)
    assert torch.equal(a.completion_ids, b.completion_ids) and b.kept is None


@pytest.mark.parametrize("top_k,top_p", [(3, None), (None, 0.6), (5, 0.8)])
def test_truncated_sampler_draws_what_transformers_generate_draws(tiny, top_k, top_p):
    """The same torch seed gives transformers' generate(do_sample, top_k, top_p) tokens; the kept sets are the
    tokens its warped scores leave finite, and the sampler's log-probs are the truncated distribution's."""
    model, tok = tiny
    ids, am = _prompts(tok)
    for seed in range(3):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=am, max_new_tokens=12, do_sample=True, top_k=top_k or 0,
                             top_p=top_p or 1.0, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        torch.manual_seed(seed)
        tokens, logp, kept = decoding.sample_tokens(model, ids, am, 12, eos_token_id=tok.eos_token_id,
                                                   pad_token_id=tok.pad_token_id, top_k=top_k, top_p=top_p,
                                                   return_kept=True)
        assert torch.equal(out.sequences[:, ids.shape[1]:], tokens)
        mask = rollout.completion_mask(tokens, tok.eos_token_id)
        scores = torch.stack(out.scores, 1).float()  # (B, T, V), -inf outside the kept set
        valid = mask > 0
        assert torch.equal(kept[valid], (scores > -math.inf)[valid])
        assert (~kept[valid]).any()  # the truncation removed something
        expected = torch.where(valid, scores.log_softmax(-1).gather(-1, tokens[..., None])[..., 0], 0.0)
        torch.testing.assert_close(logp, expected, atol=1e-5, rtol=0)


def test_naive_ratio_is_the_kept_mass_and_the_renormalised_ratio_is_one_on_a_model(tiny):
    """Sampler = trainer, top-p 0.6: the full-vocabulary ratio pi / mu of every sampled token is S, the kept mass
    (< 1), and pi_K / mu = 1 (float32 round-off of two forwards, the decode loop's and the full one: 2e-6 here; the
    float64 categorical of test_stale_corrections.py gives 1 to 1e-15)."""
    model, tok = tiny
    torch.manual_seed(0)
    r = decoding.generate(model, tok, PROMPTS, 4, 12, top_p=0.6, recompute_logprobs=False)
    P, valid = r.n_prompt_tokens, r.completion_mask > 0
    with torch.no_grad():
        full = rollout.token_logprobs(model, r.input_ids, r.attention_mask, P)
        renorm = rollout.token_logprobs(model, r.input_ids, r.attention_mask, P, kept=r.kept, batch_size=5)
        logits = rollout.completion_logits(model, r.input_ids, r.attention_mask, P)
    S = truncation.kept_mass(logits, r.kept, r.completion_mask)
    naive, corrected = (full - r.sampler_logprobs).exp(), (renorm - r.sampler_logprobs).exp()
    assert float(S[valid].max()) < 1 and float(S[valid].min()) > 0.3
    assert float((naive - S)[valid].abs().max()) < 2e-6
    assert float((corrected - 1)[valid].abs().max()) < 2e-6
    assert (renorm[~valid] == 0).all()


def test_the_loop_reads_the_kept_sets_only_with_keep_sampling_mask(tiny):
    """behaviour_logprobs (pi_old) and policy_logprobs (pi) renormalise over the kept sets with keep_sampling_mask
    and score the full vocabulary without it; the kept sets travel with the minibatch (RLBatch[rows])."""
    model, tok = tiny
    torch.manual_seed(0)
    r = decoding.generate(model, tok, PROMPTS, 4, 10, top_k=4, recompute_logprobs=False)
    valid = r.completion_mask > 0
    on = config.make_config("grpo", beta=0.0, top_k=4, keep_sampling_mask=True)
    off = config.make_config("grpo", beta=0.0, top_k=4)
    old_on, _, _ = rl.behaviour_logprobs(model, None, r, on, source="recomputed")
    old_off, _, _ = rl.behaviour_logprobs(model, None, r, off, source="recomputed")
    assert float((old_on - r.sampler_logprobs)[valid].abs().max()) < 2e-6  # pi_K = mu: ratio 1
    assert (old_off <= old_on + 1e-6).all() and float((old_on - old_off)[valid].max()) > 1e-3  # log S < 0
    batch = rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=r.n_prompt_tokens,
                       completion_mask=r.completion_mask, loss_mask=r.completion_mask, old_logprobs=old_on,
                       advantages=torch.zeros(len(r.input_ids)), kept=r.kept)
    rows = torch.tensor([5, 0, 7])
    with torch.no_grad():
        lp_on, _ = rl.policy_logprobs(model, batch[rows], on)
        lp_off, _ = rl.policy_logprobs(model, batch[rows], off)
    torch.testing.assert_close(lp_on * r.completion_mask[rows], old_on[rows], atol=1e-6, rtol=0)
    torch.testing.assert_close(lp_off * r.completion_mask[rows], old_off[rows], atol=1e-6, rtol=0)


def test_kept_sets_survive_select_groups_and_concat(tiny):
    model, tok = tiny
    torch.manual_seed(0)
    a = decoding.generate(model, tok, PROMPTS[:2], 2, 4, top_p=0.7)
    b = decoding.generate(model, tok, PROMPTS[2:], 2, 9, top_p=0.7)
    both = rollout.concat([rollout.select_groups(a, [1]), b], tok.pad_token_id)
    T = both.completion_ids.shape[1]
    assert both.kept.shape == (4, T, a.kept.shape[-1])
    assert torch.equal(both.kept[:2, :a.kept.shape[1]], a.kept[2:]) and both.kept[:2, a.kept.shape[1]:].all()


def test_a_float16_sampler_is_closer_to_the_trainer_than_a_bfloat16_one(tiny):
    """float16 keeps 10 mantissa bits, bfloat16 7: on the same tokens the float16 copy's log-probs are nearer the
    float32 trainer's (Qi et al. 2025's argument), both far below a nat."""
    model, tok = tiny
    torch.manual_seed(0)
    r = decoding.generate(model, tok, PROMPTS, 4, 12)
    gaps = {}
    for dtype in ("bfloat16", "float16"):
        sampler = make_sampler(model, dtype=dtype)
        assert next(sampler.parameters()).dtype == getattr(torch, dtype)
        with torch.no_grad():
            lp = rollout.token_logprobs(sampler, r.input_ids, r.attention_mask, r.n_prompt_tokens)
        gaps[dtype] = float((lp - r.logprobs).abs()[r.completion_mask > 0].mean())
    assert 0 < gaps["float16"] < gaps["bfloat16"] / 2 and gaps["bfloat16"] < 0.05, gaps


# ================================================================================ settings
@pytest.mark.parametrize("bad,name", [
    (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(keep_sampling_mask=True), "keep_sampling_mask"), (dict(sampler_sync_every=0), "sampler_sync_every"),
    (dict(off_policy_mask_threshold=-0.1), "off_policy_mask_threshold"),
    (dict(off_policy_mask_threshold=math.inf), "off_policy_mask_threshold"),
    (dict(kl_ratio_weighted=True, beta=0.0), "kl_ratio_weighted"),
    (dict(kl_ratio_weighted=True, kl_estimator="k1"), "kl_ratio_weighted"),
    (dict(sampler_dtype="float8"), "sampler_dtype"),
])
def test_settings_are_validated(bad, name):
    with pytest.raises(ValueError, match=name):
        config.make_config("grpo", **bad)


def test_off_policy_sequence_masking_with_per_token_advantages_is_refused_at_the_config():
    """Issue 47 item 2: PPO (GAE) and GRPO with the KL in the reward passed validate, then crashed after the first
    rollout ("advantages must have shape (4,), got (4, 4)"). DeepSeek-V3.2's rule reads one advantage per sequence;
    with per-token advantages the setting is refused before anything runs, naming both settings."""
    for algo, extra in (("ppo", {}), ("grpo", dict(beta=0.04, kl_placement="reward"))):
        with pytest.raises(ValueError, match=r"off_policy_mask_threshold .*one advantage per sequence.*kl_placement"):
            config.make_config(algo, off_policy_mask_threshold=0.5, **extra)
    assert config.make_config("grpo", off_policy_mask_threshold=0.5).off_policy_mask_threshold == 0.5  # KL in loss
    assert config.make_config("grpo", off_policy_mask_threshold=0.5, beta=0.0, kl_placement="reward").beta == 0.0


def test_defaults_are_off():
    cfg = config.make_config("grpo")
    assert (cfg.top_k, cfg.top_p, cfg.keep_sampling_mask, cfg.sampler_sync_every, cfg.off_policy_mask_threshold,
            cfg.kl_ratio_weighted) == (0, 1.0, False, 1, None, False)
    assert not rl_offpolicy.truncating(cfg) and rl_offpolicy.staleness_metrics(3, cfg, None, None) == {}


# ================================================================================ 2. the loop's loss options
# paper-index: rl_offpolicy.sequence_weights
def test_sequence_weights_by_hand():
    """log mu [[-1, -2], [-1, -1]], log pi [[-2, -3], [-1.2, -1]], A [-1, -1], delta 0.5: row 0's mean log(mu / pi)
    is 1.0 > 0.5 -> dropped; row 1's 0.1 -> kept. Multiplied into (B,) or (B, T) weights; None threshold: unchanged."""
    mu, pi, mask = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]]), torch.tensor([[-2.0, -3.0], [-1.2, -1.0]]), \
        torch.ones(2, 2)
    A = torch.tensor([-1.0, -1.0])
    cfg = config.make_config("grpo", off_policy_mask_threshold=0.5)
    assert rl_offpolicy.sequence_weights(None, pi, mu, A, mask, cfg).tolist() == [0.0, 1.0]
    assert rl_offpolicy.sequence_weights(torch.tensor([2.0, 3.0]), pi, mu, A, mask, cfg).tolist() == [0.0, 3.0]
    w = torch.tensor([[0.5, 2.0], [1.5, 1.0]])
    assert rl_offpolicy.sequence_weights(w, pi, mu, A, mask, cfg).tolist() == [[0.0, 0.0], [1.5, 1.0]]
    assert rl_offpolicy.sequence_weights(None, pi, mu, -A, mask, cfg).tolist() == [1.0, 1.0]  # A > 0: always kept
    assert rl_offpolicy.sequence_weights(w, pi, mu, A, mask, config.make_config("grpo")) is w
    with pytest.raises(ValueError, match="sampler"):
        rl_offpolicy.sequence_weights(None, pi, None, A, mask, cfg)


def _loop_loss(cfg, logprobs, old, sampler, ref, advantages, mask):
    """update_minibatch's objective for one micro-batch that is the whole minibatch, from its own functions: the
    sampler correction's weights, the off-policy mask, policy_loss, beta * kl_loss_term. Returns (loss, grad)."""
    leaf = logprobs.detach().clone().requires_grad_(True)
    micro = SimpleNamespace(ref_logprobs=ref, loss_mask=mask)
    denominator = rl.loss_denominator(mask, cfg)
    weights = None
    if cfg.is_correction != "none":
        weights = importance.is_weights(old, sampler, mask, correction=cfg.is_correction, cap=cfg.is_cap,
                                        cap_low=cfg.is_cap_low, form=cfg.is_seq_form)
    weights = rl_offpolicy.sequence_weights(weights, leaf, sampler, advantages, mask, cfg)
    loss, _ = losses.policy_loss(leaf, old, advantages, mask, **cfg.policy_loss_kwargs(), denominator=denominator,
                                 is_weights=weights)
    if cfg.beta > 0:
        loss = loss + cfg.beta * rl.kl_loss_term(leaf, old, micro, cfg, denominator)
    loss.backward()
    return loss.detach(), leaf.grad


def test_kl_ratio_weighted_in_the_loop_by_hand():
    """log pi = -1, log pi_old = -1.2, log ref = -0.5: (pi / pi_old) k3 = e^0.2 (e^0.5 - 1.5) = 0.181649;
    d/dlog pi = e^0.2 (k3 + 1 - e^0.5) = -0.610701 (plain k3: 0.148721, d = 1 - e^0.5 = -0.648721)."""
    lp, old, ref, mask = torch.tensor([[-1.0]], **F64), torch.tensor([[-1.2]], **F64), torch.tensor([[-0.5]], **F64), \
        torch.ones(1, 1, **F64)
    for weighted, value, grad in ((True, 0.181649, -0.610701), (False, 0.148721, -0.648721)):
        cfg = config.make_config("grpo", beta=1.0, kl_ratio_weighted=weighted)
        x = lp.clone().requires_grad_(True)
        term = rl.kl_loss_term(x, old, SimpleNamespace(ref_logprobs=ref, loss_mask=mask), cfg, 1.0)
        term.backward()
        assert abs(float(term) - value) < 5e-7 and abs(float(x.grad) - grad) < 5e-7


def test_kl_ratio_weighted_in_the_loop_gives_the_reverse_kl_gradient_by_enumeration():
    """K = 6 actions as one-token rows drawn from pi_old != pi: sum_a pi_old(a) grad kl_terms(a) is exactly
    grad KL(pi || ref) with kl_ratio_weighted, and not without it (plain k3 off-policy)."""
    gen = torch.Generator().manual_seed(4)
    theta, theta_old, ref_logits = (torch.randn(6, generator=gen, **F64) for _ in range(3))
    mask = torch.ones(6, 1, **F64)
    t = theta.clone().requires_grad_(True)
    g_rkl, = torch.autograd.grad(kl_toy.true_kl(t, ref_logits), t)
    for weighted in (True, False):
        cfg = config.make_config("grpo", beta=1.0, kl_ratio_weighted=weighted)
        t = theta.clone().requires_grad_(True)
        terms = rl_offpolicy.kl_terms(t.log_softmax(-1)[:, None], theta_old.log_softmax(-1)[:, None],
                                   ref_logits.log_softmax(-1)[:, None], mask, cfg)  # (K, 1)
        g, = torch.autograd.grad((theta_old.softmax(-1) * terms[:, 0]).sum(), t)
        gap = float((g - g_rkl).abs().max())
        assert gap < 1e-14 if weighted else gap > 1e-2


def test_off_policy_mask_gradient_by_enumeration():
    """A K = 6 bandit of one-token rows, sampler mu far from pi on some actions: the masked loop loss's gradient is
    the sum over the kept actions of their PPO terms' gradients (computed one action at a time), and 0 from the
    dropped ones (A < 0 and log(mu / pi) > delta)."""
    gen = torch.Generator().manual_seed(5)
    K = 6
    theta = torch.randn(K, generator=gen, **F64)
    log_pi = theta.log_softmax(-1)
    log_mu = log_pi + torch.tensor([0.0, 0.3, -0.4, 1.2, 0.9, 0.05], **F64)  # unnormalised on purpose: per token
    A = torch.tensor([1.0, -1.0, -0.5, -2.0, 0.7, -1.0], **F64)
    mask = torch.ones(K, 1, **F64)
    cfg = config.make_config("grpo", off_policy_mask_threshold=0.5, agg="seq-mean-token-sum", beta=0.0)
    keep = (A >= 0) | (log_mu - log_pi <= 0.5)
    assert keep.tolist() == [True, True, True, False, True, True]
    t = theta.clone().requires_grad_(True)
    lp = t.log_softmax(-1)[:, None]
    _, g_loop = _loop_loss(cfg, lp.detach(), log_pi[:, None].clone(), log_mu[:, None], log_pi[:, None], A, mask)
    # by hand: d/dlog pi_a of the seq-sum loss (1/K) sum_a -A_a r_a at r = 1 is -A_a / K on kept actions
    torch.testing.assert_close(g_loop[:, 0], torch.where(keep, -A / K, 0.0), rtol=0, atol=1e-15)


@pytest.mark.parametrize("case", ["trl_defaults", "trl_defaults_beta", "mask", "grpo_beta_mask", "plain_k3",
                                  "mask_zero"])
def test_loss_and_gradient_equal_trls_through_to_trl(case):
    """An RLConfig -> to_trl's GRPOConfig kwargs -> TRL 1.16's own _compute_loss (test_stale_corrections.py's model-free
    stub),
    against the loop's objective from update_minibatch's functions: loss and gradient to 1e-6, 3 seeds. The
    "trl_defaults" cases: GRPOConfig's defaults themselves (loss_type dapo, beta 0, use_bias_correction_kl True;
    with beta 0.04 the bias correction acts) are minirl's token-mean config (with kl_ratio_weighted)."""
    settings = {
        "trl_defaults": dict(agg="token-mean", beta=0.0),
        "trl_defaults_beta": dict(agg="token-mean", beta=0.04, kl_ratio_weighted=True),
        "mask": dict(agg="token-mean", beta=0.0, off_policy_mask_threshold=0.05),
        "grpo_beta_mask": dict(beta=0.1, kl_ratio_weighted=True, off_policy_mask_threshold=0.1),
        "plain_k3": dict(beta=0.04),
        "mask_zero": dict(agg="token-mean", beta=0.04, kl_ratio_weighted=True, off_policy_mask_threshold=0.0),
    }[case]
    cfg = config.make_config("grpo", num_minibatches=1, **settings)
    kw = trl_kwargs(cfg)
    assert kw["use_bias_correction_kl"] == cfg.kl_ratio_weighted
    assert kw["off_policy_mask_threshold"] == cfg.off_policy_mask_threshold
    trl_settings = {k: kw[k] for k in ("loss_type", "beta", "epsilon", "epsilon_high", "use_bias_correction_kl",
                                       "off_policy_mask_threshold", "importance_sampling_level", "delta")}
    if case == "trl_defaults":
        trl_settings = {}  # GRPOConfig exactly as TRL ships it
    elif case == "trl_defaults_beta":
        trl_settings = dict(beta=0.04)
    dropped = 0
    for seed in range(3):
        batch = _random_batch(seed)
        loss_t, grad_t, args = _trl_compute_loss(*batch, **trl_settings)
        if case.startswith("trl_defaults"):
            assert (args.loss_type, args.use_bias_correction_kl, args.off_policy_mask_threshold) == \
                ("dapo", True, None)
        loss_m, grad_m = _loop_loss(cfg, *batch)
        assert abs(float(loss_t - loss_m)) <= 1e-6, (seed, loss_t, loss_m)
        assert float((grad_t - grad_m).abs().max()) <= 1e-6
        assert float(grad_m.abs().max()) > 1e-3
        if cfg.off_policy_mask_threshold is not None:
            logprobs, _, sampler, _, advantages, mask = batch
            dropped += int((stale_corrections.off_policy_sequence_mask(logprobs, sampler, advantages, mask,
                                                           threshold=cfg.off_policy_mask_threshold) == 0).sum())
    assert dropped > 0 or cfg.off_policy_mask_threshold is None  # the mask acted on these batches


def test_to_trl_and_to_verl_map_and_refuse(tmp_path):
    """top_k / top_p reach both engines; the bias-corrected KL and the mask TRL; keep_sampling_mask and a simulated
    lag neither (NotImplementedError naming the switch); verl has neither the mask nor the ratio-weighted KL."""
    _trl()
    cfg = config.make_config("grpo", top_k=20, top_p=0.9, beta=0.04, kl_ratio_weighted=True,
                             off_policy_mask_threshold=0.5)
    args = to_trl(cfg, output_dir=str(tmp_path), use_cpu=True)
    assert (args.top_k, args.top_p, args.use_bias_correction_kl, args.off_policy_mask_threshold) == \
        (20, 0.9, True, 0.5)
    assert trl_kwargs(config.make_config("grpo"))["use_bias_correction_kl"] is False  # GRPO's plain k3
    verl = verl_overrides(config.make_config("grpo", top_k=20, top_p=0.9))
    assert "actor_rollout_ref.rollout.top_k=20" in verl and "actor_rollout_ref.rollout.top_p=0.9" in verl
    assert "actor_rollout_ref.rollout.top_k=-1" in verl_overrides(config.make_config("grpo"))
    for bad, name in ((dict(top_p=0.9, keep_sampling_mask=True), "keep_sampling_mask"),
                      (dict(sampler_sync_every=2), "sampler_sync_every")):
        for bridge in (trl_kwargs, verl_overrides):
            with pytest.raises(NotImplementedError, match=name):
                bridge(config.make_config("grpo", **bad))
    for bad, name in ((dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold"),
                      (dict(kl_ratio_weighted=True), "kl_ratio_weighted")):
        with pytest.raises(NotImplementedError, match=name):
            verl_overrides(config.make_config("grpo", **bad))


# ================================================================================ 3. stale rollouts
def test_updates_behind_and_sync_by_hand():
    """k = 3, 2 minibatches, 1 epoch: the sampler of steps 1..6 is 0, 2, 4, 0, 2, 4 updates behind; it reloads
    after steps 3 and 6."""
    cfg = config.make_config("grpo", sampler_sync_every=3, num_minibatches=2)
    assert [rl_offpolicy.updates_behind(s, cfg) for s in range(1, 7)] == [0, 2, 4, 0, 2, 4]
    assert [rl_offpolicy.sync_due(s, cfg) for s in range(1, 7)] == [False, False, True, False, False, True]
    cfg = config.make_config("grpo", sampler_sync_every=2, num_minibatches=1, num_iterations=2)
    assert [rl_offpolicy.updates_behind(s, cfg) for s in range(1, 5)] == [0, 2, 0, 2]
    model = torch.nn.Linear(2, 2)
    sampler = make_sampler(model, separate=True)
    with torch.no_grad():
        model.weight.add_(1.0)
    rl_offpolicy.sync_if_due(sampler, model, 3, cfg)  # not due: the sampler keeps its old weights
    assert not torch.equal(sampler.weight, model.weight)
    with pytest.raises(ValueError, match="sampler_sync_every"):
        rl_offpolicy.resume_sampler(sampler, model, 3, cfg)
    rl_offpolicy.resume_sampler(sampler, model, 4, cfg)  # the sampler reloaded after step 4: a resumed run is exact
    assert torch.equal(sampler.weight, model.weight)


@pytest.mark.parametrize("cap", [None, 1.5])
def test_decoupled_config_is_decoupled_ppo(cap):
    """decoupled_config's switches through policy_loss (the loop's path) give stale_corrections.decoupled_ppo_terms,
    aggregated:
    value and gradient, uncapped and with AReaL's cap (weights above it masked)."""
    logprobs, old, sampler, _, advantages, mask = (x.double() for x in _random_batch(1))
    cfg = config.make_config("grpo", beta=0.0, agg="token-mean", eps_high=0.28,
                             **rl_offpolicy.decoupled_config(cap=cap))
    loss_loop, grad_loop = _loop_loss(cfg, logprobs, old, sampler, None, advantages, mask)
    x = logprobs.clone().requires_grad_(True)
    terms = stale_corrections.decoupled_ppo_terms(x, old, sampler, advantages, mask, eps_low=0.2, eps_high=0.28,
                                                  weight_cap=cap)
    ref = losses.aggregate(terms, mask, "token-mean")
    ref.backward()
    torch.testing.assert_close(loss_loop, ref.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_loop, x.grad, rtol=0, atol=1e-12)


def test_a_stale_sampler_lags_and_its_staleness_is_logged(tiny):
    """sampler_sync_every=2: a separate copy that reloads after even steps; the rollout of an odd step comes from
    weights the trainer had (updates_behind 0, k3 at round-off), an even step's from 2 updates back (k3 > 0)."""
    _, tok = tiny
    model = models.tiny_dense(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)
    assert make_sampler(model, separate=True) is not model
    cfg = config.make_config("grpo", steps=4, prompts_per_step=2, group_size=4, max_new_tokens=8, beta=0.0, lr=3e-3,
                             progress=False, sampler_sync_every=2)
    def parity(prompts, completions, **_):  # a reward with signal in every group of this untrained model
        return [float(len(c) % 2) for c in completions]

    rows = rl.train_rl(model, tok, cfg, tasks.load_split("train").select(range(16)), reward_fn=parity).rows
    assert [r["sampler_updates_behind"] for r in rows] == [0, 2, 0, 2]
    assert rows[0]["staleness_k3"] < 1e-9 and rows[2]["staleness_k3"] < 1e-9
    assert rows[1]["staleness_k3"] > 1e-6 and rows[3]["staleness_k3"] > 1e-6
    assert all(abs(r["staleness_k3"] - r["mismatch_k3"]) < 1e-9 for r in rows)  # the same figure


@pytest.mark.parametrize("settings", [
    dict(top_p=0.8, keep_sampling_mask=True),
    dict(top_k=5, pi_old="naive"),
    dict(top_p=0.8, keep_sampling_mask=True, num_minibatches=1),  # pi_old "current": the training forward's
    dict(off_policy_mask_threshold=0.1, beta=0.04, kl_ratio_weighted=True),
    dict(sampler_sync_every=2, **rl_offpolicy.decoupled_config(cap=3.0)),
    dict(sampler_sync_every=3, pi_old="naive", sampler_dtype="float16"),
], ids=lambda d: "+".join(f"{k}={v}" for k, v in d.items()))
def test_the_loop_trains_with_each_option(tiny, settings):
    _, tok = tiny
    model = models.tiny_dense(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=2)
    cfg = config.make_config("grpo", **{"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6,
                                        "beta": 0.0, "progress": False, **settings})
    history = rl.train_rl(model, tok, cfg, tasks.load_split("train").select(range(8)))
    assert len(history.rows) == 2 and all(math.isfinite(r["loss"]) for r in history.rows)
