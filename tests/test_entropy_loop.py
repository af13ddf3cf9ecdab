"""The entropy controls inside the loop (minirl.entropy_control, RLConfig's entropy switches), pass@k in the held-out
evaluation, and their names in TRL 1.16 and verl 0.9.1. The math itself is tested in tests/test_entropy.py; here:
with every switch off the objective is exactly losses.policy_loss, and each switch changes the gradient of the
loop's update the way its equation says (hand values, and exact gradients on small categoricals)."""

import math
from dataclasses import replace
from functools import partial
from types import SimpleNamespace

import helpers
import pytest
import torch
from helpers import tiny_model

from minirl import config, decoding, entropy, entropy_control, evaluation, interop, losses, rl, rollout
from minirl.tokenizer import build_tokenizer

close = partial(helpers.close, atol=1e-6)


def _micro(logprobs, advantages, mask):
    return SimpleNamespace(advantages=advantages, loss_mask=mask)


def _inputs(seed=0):
    """(B=4, T=5) log-probs with grad, pi_old off by +-0.3, per-sequence advantages, ragged masks, one empty row."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 5, 6, generator=g, dtype=torch.float64).requires_grad_(True)  # (B, T, V)
    tokens = torch.randint(6, (4, 5), generator=g)
    logp_all = logits.log_softmax(-1)
    logprobs = logp_all.gather(-1, tokens[..., None]).squeeze(-1)  # (B, T)
    token_entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T), with grad
    old = (logprobs + 0.3 * (torch.rand(4, 5, generator=g, dtype=torch.float64) - 0.5)).detach()
    mask = (torch.arange(5)[None] < torch.tensor([5, 3, 0, 4])[:, None]).double()
    adv = torch.tensor([1.2, -0.4, 0.7, -1.5], dtype=torch.float64)
    return logits, logprobs, token_entropy, old, adv, mask


# --- every switch off: the loop's loss, unchanged -------------------------------------------------------------------
def test_defaults_are_off_and_the_objective_is_policy_loss_itself():
    cfg = config.make_config("grpo")
    assert not entropy_control.is_on(cfg) and entropy_control.make_state(cfg) is None
    assert (cfg.entropy_coef, cfg.adaptive_entropy, cfg.top_entropy_quantile, cfg.cov_mode, cfg.eval_pass_at_k) == \
        (0.0, False, 1.0, "none", ())
    _, logprobs, h, old, adv, mask = _inputs()
    loss, stats = entropy_control.policy_objective(logprobs, h, old, _micro(logprobs, adv, mask), cfg, denominator=2.0,
                                                   is_weights=None, state=None)
    ref, ref_stats = losses.policy_loss(logprobs, old, adv, mask, **cfg.policy_loss_kwargs(), denominator=2.0)
    assert float(loss.detach()) == float(ref.detach()) and stats == ref_stats  # bit for bit


def test_log_covariance_alone_logs_the_hand_covariance_and_leaves_the_loss():
    # token_covariance's docstring example: pi = 1/2, 1/2, 1/4, 1/4 with A = 0.5, 0.5, -0.5, -0.5 -> 0.25 ln 2 each
    logprobs = torch.tensor([[-math.log(2)] * 2 + [-2 * math.log(2)] * 2], dtype=torch.float64, requires_grad=True)
    adv, mask = torch.tensor([[0.5, 0.5, -0.5, -0.5]], dtype=torch.float64), torch.ones(1, 4, dtype=torch.float64)
    cfg = config.make_config("grpo", log_covariance=True)
    state = entropy_control.make_state(cfg)
    loss, stats = entropy_control.policy_objective(logprobs, torch.zeros_like(logprobs), logprobs.detach(),
                                                   _micro(logprobs, adv, mask), cfg, denominator=1.0,
                                                   is_weights=None, state=state)
    assert stats["covariance"] == pytest.approx(0.25 * math.log(2), abs=1e-12)  # 0.173287
    ref, _ = losses.policy_loss(logprobs, logprobs.detach(), adv, mask, **cfg.policy_loss_kwargs(), denominator=1.0)
    assert float(loss.detach()) == float(ref.detach()) and "entropy_coef" not in stats


# --- the entropy bonus ----------------------------------------------------------------------------------------------
# paper-index: entropy_control.policy_objective
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_the_bonus_adds_minus_coef_times_the_token_mean_entropy_and_its_exact_gradient(agg):
    logits, logprobs, h, old, adv, mask = _inputs()
    cfg0 = config.make_config("grpo", agg=agg, log_covariance=True)
    cfg = config.make_config("grpo", agg=agg, entropy_coef=0.3)
    base, _ = entropy_control.policy_objective(logprobs, h, old, _micro(logprobs, adv, mask), cfg0, denominator=3.0,
                                               is_weights=None, state=entropy_control.make_state(cfg0))
    with_bonus, stats = entropy_control.policy_objective(logprobs, h, old, _micro(logprobs, adv, mask), cfg,
                                                         denominator=3.0, is_weights=None,
                                                         state=entropy_control.make_state(cfg))
    n = mask.sum()  # 12 tokens; the bonus is TRL's token mean whatever agg
    close(with_bonus - base, -0.3 * (h * mask).sum() / n)
    assert stats["entropy_coef"] == 0.3
    # exact gradient on the logits: d(-coef mean H)/dz_b = coef * pi_b (log pi_b + H) / N on every valid position
    g_bonus, = torch.autograd.grad(with_bonus - base, logits)
    logp = logits.detach().log_softmax(-1)
    H = -(logp.exp() * logp).sum(-1, keepdim=True)
    close(g_bonus, 0.3 * logp.exp() * (logp + H) / n * mask[..., None])


def test_adaptive_bonus_is_off_until_the_entropy_falls_to_the_target_then_follows_trls_rule():
    # target 0.5, delta 0.1, start 0: measured 0.8, 0.4, 0.3, 0.6 -> coefficients 0, 0.1, 0.2, 0.1 (entropy.py's
    # example); the coefficient applied in a step is the last one while the last entropy <= target, else 0
    cfg = config.make_config("grpo", adaptive_entropy=True, entropy_target=0.5, entropy_coef_delta=0.1)
    state = entropy_control.make_state(cfg)
    applied, coefs = [], []
    for measured in (0.8, 0.4, 0.3, 0.6):
        applied.append(entropy_control.coef_in_use(state, cfg))
        state.entropy_sum, state.tokens = measured * 10, 10.0  # what policy_objective accumulates over 10 tokens
        entropy_control.end_step(state, cfg)
        coefs.append(round(state.coef, 12))
    assert coefs == [0.0, 0.1, 0.2, 0.1]
    assert applied == [0.0, 0.0, 0.1, 0.2]  # inf before the first step; 0.8 > target; then 0.4, 0.3 <= target
    with pytest.raises(ValueError, match="resuming with adaptive_entropy"):
        entropy_control.make_state(cfg, resuming=True)


# --- top-entropy tokens ---------------------------------------------------------------------------------------------
def test_top_entropy_tokens_zero_the_others_terms_and_keep_the_denominators():
    logits, logprobs, h, old, adv, mask = _inputs()
    cfg = config.make_config("grpo", agg="seq-mean-token-mean", top_entropy_quantile=0.25)
    loss, _ = entropy_control.policy_objective(logprobs, h, old, _micro(logprobs, adv, mask), cfg, denominator=3.0,
                                               is_weights=None, state=entropy_control.make_state(cfg))
    top = entropy.top_entropy_mask(h, mask, top_fraction=0.25)
    assert int(top.sum()) == 3  # of 12 valid tokens: those at or above the 0.75 quantile
    # TRL: per_token_loss * entropy_mask, then the aggregation with the FULL mask's row counts
    r = (logprobs - old).exp()
    per_token = torch.maximum(-adv[:, None] * r, -adv[:, None] * r.clamp(0.8, 1.2)) * top
    rows = mask.sum(-1)
    expected = ((per_token * mask).sum(-1)[rows > 0] / rows[rows > 0]).sum() / 3.0
    close(loss, expected)
    grad, = torch.autograd.grad(loss, logprobs)
    assert (grad[~top] == 0).all() and (grad[top] != 0).all()


# --- Clip-Cov and KL-Cov in the loop --------------------------------------------------------------------------------
def test_clip_cov_in_the_loop_is_entropys_loss_aggregated_like_the_config():
    _, logprobs, h, old, adv, mask = _inputs(1)
    cfg = config.make_config("grpo", cov_mode="clip_cov", cov_fraction=0.2, clip_cov_low=0.0, clip_cov_high=50.0,
                             agg="token-mean")
    torch.manual_seed(5)
    loss, stats = entropy_control.policy_objective(logprobs, h, old, _micro(logprobs, adv, mask), cfg,
                                                   denominator=12.0, is_weights=None,
                                                   state=entropy_control.make_state(cfg))
    per_token, ref = entropy.clip_cov_token_loss(logprobs, old, adv, mask, fraction=0.2, cov_low=0.0, cov_high=50.0,
                                                 generator=torch.Generator().manual_seed(5))
    close(loss, per_token.sum() / 12)
    assert stats["clip_cov_frac"] == ref["clip_cov_frac"] == pytest.approx(2 / 12)  # floor(0.2 * 12) = 2 stopped


def test_kl_cov_in_the_loop_penalises_the_top_covariance_token_by_hand():
    # one row: log-probs [0, -1, -3, -4], advantages [1, 3, -1, -3]: covariances [2, 3, 1, 6] (entropy.py's
    # example), so fraction 0.25 picks token 3; its gradient is -A r + coef * sign(log r) = 3 e^0.1 + 0.5
    logprobs = torch.tensor([[0.0, -1.0, -3.0, -4.0]], dtype=torch.float64, requires_grad=True)
    old = logprobs.detach() - 0.1  # r = e^0.1 everywhere
    adv, mask = torch.tensor([[1.0, 3.0, -1.0, -3.0]], dtype=torch.float64), torch.ones(1, 4, dtype=torch.float64)
    cfg = config.make_config("grpo", cov_mode="kl_cov", cov_fraction=0.25, kl_cov_coef=0.5, agg="token-mean")
    loss, stats = entropy_control.policy_objective(logprobs, torch.zeros_like(logprobs), old,
                                                   _micro(logprobs, adv, mask), cfg, denominator=4.0,
                                                   is_weights=None, state=entropy_control.make_state(cfg))
    loss.backward()
    r = math.exp(0.1)
    close(logprobs.grad, torch.tensor([[-1 * r, -3 * r, 1 * r, 3 * r + 0.5]], dtype=torch.float64) / 4)
    assert stats["kl_cov_frac"] == 0.25 and stats["approx_kl"] == pytest.approx(r - 1 - 0.1, abs=1e-12)


# --- the loop's update: the gradient moves the way the math says ----------------------------------------------------
@pytest.fixture(scope="module")
def tiny_update():
    tok = build_tokenizer()
    model = tiny_model(tok)
    torch.manual_seed(0)
    r = decoding.generate(model, tok, ["1+2=", "3+4+5=", "6+7=", "8+9+1+2="], group_size=2, max_new_tokens=8)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 0.2, -0.2])
    batch = rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=r.n_prompt_tokens,
                       completion_mask=r.completion_mask, loss_mask=r.completion_mask, old_logprobs=r.logprobs,
                       advantages=adv)
    return model, batch


def _update_grad(model, batch, **switches):
    cfg = config.make_config("grpo", beta=0.0, max_grad_norm=1e9, progress=False, **switches)
    state = entropy_control.make_state(cfg)
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    out = rl.update_minibatch(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, cfg, beta=0.0, ent=state)
    model.load_state_dict(snapshot)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), out


@pytest.mark.parametrize("micro", [None, 4])
def test_the_loops_bonus_adds_exactly_the_gradient_of_minus_coef_mean_entropy(tiny_update, micro):
    model, batch = tiny_update
    g0, out0 = _update_grad(model, batch, micro_batch_size=micro)
    g1, out1 = _update_grad(model, batch, micro_batch_size=micro, entropy_coef=0.5)
    model.zero_grad()
    _, h = rollout.token_logprobs(model, batch.input_ids, batch.attention_mask, batch.n_prompt_tokens,
                                  return_entropy=True, entropy_grad=True, completion_only=False)
    m = batch.completion_mask
    shares = [(m[rows] * h[rows]).sum() / m[rows].sum() * len(rows) / len(m) for rows in
              torch.arange(len(m)).split(micro or len(m))]
    (-0.5 * sum(shares)).backward()
    g_bonus = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert g_bonus.abs().max() > 1e-5
    torch.testing.assert_close(g1 - g0, g_bonus, atol=1e-6, rtol=1e-4)
    assert out1["entropy_coef"] == 0.5 and "entropy_coef" not in out0


def test_the_loops_top_entropy_switch_and_clip_cov_change_the_update(tiny_update):
    model, batch = tiny_update
    g0, _ = _update_grad(model, batch)
    g_top, out = _update_grad(model, batch, top_entropy_quantile=0.2)
    g_all, _ = _update_grad(model, batch, top_entropy_quantile=1.0, log_covariance=True)
    torch.testing.assert_close(g_all, g0, atol=0, rtol=0)  # logging the covariance changes nothing
    assert (g_top - g0).abs().max() > 1e-4 and "covariance" in out


TOP_TWO = [[False, False], [False, True], [False, False], [True, False]]  # (1, 1) and (3, 0): Cov 1.375 each


def _four_by_two(old_shift=0.0):
    """Issue 47's minibatch: 4 rows x 2 tokens, log pi (float64), A = [1, -1, 1, -1]; pi_old = pi - old_shift. The
    row index is the input id, so a stand-in forward ``lp[micro.input_ids[:, 0]]`` returns a micro-batch's rows."""
    lp = torch.tensor([[0.0, -1.0], [-1.0, -2.5], [-1.0, -1.0], [-2.5, 0.0]], dtype=torch.float64)
    batch = rl.RLBatch(input_ids=torch.arange(4)[:, None], attention_mask=torch.ones(4, 1), n_prompt_tokens=1,
                       completion_mask=torch.ones(4, 2), loss_mask=torch.ones(4, 2), old_logprobs=lp - old_shift,
                       advantages=torch.tensor([1.0, -1, 1, -1], dtype=torch.float64))
    return lp, batch


def _grad_by_micro_batch(lp, batch, cfg, *, selection: bool):
    """d loss / d log pi (4, 2) of ``cov_loss`` summed over one-row micro-batches, each reading its row of the
    minibatch's selection (selection=True), or choosing its own tokens (False, the old per-micro-batch way)."""
    chosen = entropy_control.with_cov_selection(batch, cfg, lambda micro: lp[micro.input_ids[:, 0]])
    logprobs = lp.clone().requires_grad_(True)  # (4, 2)
    denominator = rl.loss_denominator(batch.loss_mask, cfg)  # the whole minibatch's count
    for i in range(len(batch)):
        micro = chosen[torch.tensor([i])]
        loss, _ = entropy_control.cov_loss(logprobs[i:i + 1], micro.old_logprobs, micro.advantages, micro.loss_mask,
                                           cfg, denominator=denominator,
                                           selected=micro.cov_selected if selection else None)
        loss.backward()
    return logprobs.grad, chosen.cov_selected


# paper-index: entropy_control.with_cov_selection
def test_kl_cov_chooses_its_tokens_over_the_minibatch_not_per_micro_batch():
    """Issue 47 item 1 (verl PR #7830): 4 rows x 2 tokens, cov_fraction 0.25, micro_batch_size 1. Over the minibatch:
    mean log pi = (0 - 1 - 1 - 2.5 - 1 - 1 - 2.5 + 0) / 8 = -1.125, mean A = 0, Cov_t = (log pi_t + 1.125) A_t =
    row 0 [1.125, 0.125], row 1 [-0.125, 1.375], row 2 [0.125, 0.125], row 3 [1.375, -1.125]: the top 2 are (1, 1)
    and (3, 0). Chosen per one-row micro-batch, A is constant inside the row, every covariance is 0, and topk took
    one token per row (4 of 8)."""
    lp, batch = _four_by_two()
    cfg = config.make_config("grpo", cov_mode="kl_cov", cov_fraction=0.25, micro_batch_size=1)
    chosen = entropy_control.with_cov_selection(batch, cfg, lambda micro: lp[micro.input_ids[:, 0]])
    assert chosen.cov_selected.tolist() == TOP_TWO
    assert [entropy.kl_cov_mask(lp[i:i + 1], batch.advantages[i:i + 1], torch.ones(1, 2), fraction=0.25).sum().item()
            for i in range(4)] == [1, 1, 1, 1]  # what one-row micro-batches chose alone: a token in every row
    whole = config.make_config("grpo", cov_mode="kl_cov", cov_fraction=0.25)  # one micro-batch: nothing added
    assert entropy_control.with_cov_selection(batch, whole, None).cov_selected is None


def test_kl_cov_one_row_micro_batches_penalise_the_minibatchs_top_tokens_by_hand():
    """The gradient, by hand: log r = 0.1 on every token, token-mean over N = 8, kl_coef 1: d loss / d log pi =
    (-A e^0.1 + sign(log r) * [selected]) / 8, so a penalised token's gradient is 1/8 = 0.125 above the unpenalised
    one. One-row micro-batches reading the minibatch's selection give exactly that on (1, 1) and (3, 0); choosing per
    row penalised one token in every row, 0.125 off on at least 2 tokens (the rows without a top token)."""
    lp, batch = _four_by_two(old_shift=0.1)
    cfg = config.make_config("grpo", cov_mode="kl_cov", cov_fraction=0.25, micro_batch_size=1)
    grad, selected = _grad_by_micro_batch(lp, batch, cfg, selection=True)
    assert selected.tolist() == TOP_TWO
    expected = (-batch.advantages[:, None] * math.exp(0.1) + selected.double()) / 8  # (4, 2)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    per_row, _ = _grad_by_micro_batch(lp, batch, cfg, selection=False)
    gap = (per_row - grad).abs()  # (4, 2): 0.125 where the per-row choice differs from the minibatch's
    assert ((gap - 0.125).abs() < 1e-12).sum() >= 2 and bool(((gap < 1e-12) | ((gap - 0.125).abs() < 1e-12)).all())


def test_clip_cov_one_row_micro_batches_stop_the_tokens_the_minibatchs_covariance_picks():
    """Clip-Cov on the same minibatch, on-policy (r = 1, PPO's clip holds nothing), band (1.2, 5): the candidates are
    exactly (1, 1) and (3, 0) (Cov 1.375; (0, 0)'s 1.125 is below the band), and floor(0.25 * 8) = 2 draws take both,
    whatever the draw. Their gradient is 0; every other token's is -A / 8. Chosen per one-row micro-batch, A is
    constant in the row, every covariance 0, no candidate: nothing was stopped and the update was plain PPO's."""
    lp, batch = _four_by_two()
    cfg = config.make_config("grpo", cov_mode="clip_cov", cov_fraction=0.25, clip_cov_low=1.2, clip_cov_high=5.0,
                             micro_batch_size=1)
    assert [int(entropy.clip_cov_mask(lp[i:i + 1], lp[i:i + 1], batch.advantages[i:i + 1], torch.ones(1, 2),
                                      fraction=0.25, cov_low=1.2).sum()) for i in range(4)] == [0, 0, 0, 0]
    grad, selected = _grad_by_micro_batch(lp, batch, cfg, selection=True)
    assert selected.tolist() == TOP_TWO
    torch.testing.assert_close(grad, -batch.advantages[:, None] / 8 * (~selected), rtol=0, atol=1e-12)
    per_row, _ = _grad_by_micro_batch(lp, batch, cfg, selection=False)
    torch.testing.assert_close(per_row, -batch.advantages[:, None].expand(4, 2) / 8, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cov_mode", ["kl_cov", "clip_cov"])
def test_the_micro_batch_size_changes_nothing_under_clip_cov_and_kl_cov(tiny_update, cov_mode):
    """The update's promise (``rl.update_minibatch``): micro-batches of 1 row give the gradient of the whole
    minibatch at once. Before the fix, KL-Cov penalised one token per row instead of the minibatch's top share, and
    Clip-Cov with one-row micro-batches stopped nothing (every covariance 0 inside a row)."""
    model, batch = tiny_update
    shift = 0.2 * (torch.arange(batch.old_logprobs.numel()).view_as(batch.old_logprobs) % 3 - 1)  # pi_old != pi
    batch = replace(batch, old_logprobs=batch.old_logprobs + shift)
    switches = dict(cov_mode=cov_mode, cov_fraction=0.25, clip_cov_low=0.0, clip_cov_high=5.0)
    grads, outs = {}, {}
    for micro in (None, 1):
        torch.manual_seed(0)  # Clip-Cov draws its tokens at random among the candidates
        grads[micro], outs[micro] = _update_grad(model, batch, micro_batch_size=micro, **switches)
    torch.manual_seed(0)
    g_none, _ = _update_grad(model, batch, micro_batch_size=1, cov_fraction=0.25)  # cov_mode none
    frac = "kl_cov_frac" if cov_mode == "kl_cov" else "clip_cov_frac"
    assert outs[None][frac] > 0 and (grads[None] - g_none).abs().max() > 1e-4  # the selection acts
    torch.testing.assert_close(grads[1], grads[None], atol=1e-6, rtol=1e-5)


# --- config, pass@k, engines ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    (dict(entropy_coef=-0.1), "entropy_coef"), (dict(top_entropy_quantile=1.5), "top_entropy_quantile"),
    (dict(cov_mode="clipcov"), "cov_mode"), (dict(cov_fraction=0.0), "cov_fraction"),
    (dict(clip_cov_low=5.0, clip_cov_high=1.0), "clip_cov_low"), (dict(entropy_coef=float("nan")), "entropy_coef"),
    (dict(cov_mode="kl_cov", loss_mode="cispo"), "cov_mode"), (dict(cov_mode="clip_cov", level="sequence"), "cov_mode"),
    (dict(cov_mode="kl_cov", off_policy_mask_threshold=0.5), "off_policy_mask_threshold"),  # was dropped silently
    (dict(top_entropy_quantile=0.5, level="sequence"), "top_entropy_quantile"),
    (dict(entropy_coef_min=0.5, entropy_coef_max=0.1), "entropy_coef_min"),
    (dict(eval_pass_at_k=(1, 4)), "eval_pass_at_k"), (dict(eval_pass_at_k=(0,), eval_samples_per_prompt=4), "eval_"),
])
def test_invalid_entropy_settings_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        config.make_config("grpo", **bad)


def test_pass_at_k_metrics_by_hand_and_unscored_counts_as_wrong():
    # two prompts x 5 samples: (n, c) = (5, 2) and (5, 0, one unscored): pass@2 = (0.7 + 0) / 2 = 0.35
    scores = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0], [0.0, float("nan"), 0.0, 0.0, 0.0]])
    out = evaluation.pass_at_k_metrics(scores, (1, 2, 5))
    assert out == pytest.approx({"pass_at_1": 0.2, "pass_at_2": 0.35, "pass_at_5": 0.5})
    with pytest.raises(ValueError, match="0/1"):
        evaluation.pass_at_k_metrics(torch.tensor([[0.5, 1.0]]), (1,))
    with pytest.raises(ValueError, match="exceeds"):
        evaluation.pass_at_k_metrics(scores, (6,))


def test_trl_gets_its_own_entropy_names_and_refuses_clip_cov():
    kw = interop.trl_kwargs(config.make_config("grpo", top_entropy_quantile=0.2, entropy_coef=0.01))
    assert (kw["top_entropy_quantile"], kw["entropy_coef"], kw["use_adaptive_entropy"]) == (0.2, 0.01, False)
    kw = interop.trl_kwargs(config.make_config("grpo", adaptive_entropy=True, entropy_target=0.1,
                                               entropy_coef_delta=0.002))
    assert (kw["use_adaptive_entropy"], kw["entropy_target"], kw["entropy_coef_delta"]) == (True, 0.1, 0.002)
    default = interop.trl_kwargs(config.make_config("grpo"))
    assert (default["top_entropy_quantile"], default["entropy_coef"], default["use_adaptive_entropy"]) == \
        (1.0, 0.0, False) and "entropy_target" not in default
    with pytest.raises(NotImplementedError, match="cov_mode"):
        interop.trl_kwargs(config.make_config("grpo", cov_mode="kl_cov"))


def test_verl_gets_its_loss_modes_and_entropy_coeff():
    a = "actor_rollout_ref.actor"
    out = interop.verl_overrides(config.make_config("grpo", cov_mode="clip_cov", cov_fraction=0.01))
    assert {f"{a}.policy_loss.loss_mode=clip_cov", f"{a}.policy_loss.clip_cov_ratio=0.01",
            f"{a}.policy_loss.clip_cov_lb=1.0", f"{a}.policy_loss.clip_cov_ub=5.0"} <= set(out)
    assert not any("clip_ratio_c" in o for o in out)  # only verl's vanilla loss reads it
    out = interop.verl_overrides(config.make_config("grpo", cov_mode="kl_cov", kl_cov_coef=1.0))
    assert {f"{a}.policy_loss.loss_mode=kl_cov", f"{a}.policy_loss.kl_cov_ratio=0.0002",
            f"{a}.policy_loss.ppo_kl_coef=1.0"} <= set(out)
    assert f"{a}.entropy_coeff=0.01" in interop.verl_overrides(config.make_config("dapo", entropy_coef=0.01))
    with pytest.raises(NotImplementedError, match="entropy_coef"):
        interop.verl_overrides(config.make_config("grpo", entropy_coef=0.01))  # seq-mean-token-mean: verl differs
    with pytest.raises(NotImplementedError, match="adaptive_entropy"):
        interop.verl_overrides(config.make_config("grpo", adaptive_entropy=True))
    assert not any("entropy" in o or "cov" in o for o in interop.verl_overrides(config.make_config("grpo")))


def test_train_rl_logs_pass_at_k_the_covariance_and_the_adaptive_coefficient():
    from minirl import tasks
    tok = build_tokenizer()
    cfg = config.make_config("grpo", steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4, num_minibatches=1,
                             beta=0.0, adaptive_entropy=True, entropy_target=10.0, entropy_coef_delta=0.01,
                             eval_samples_per_prompt=4, eval_pass_at_k=(1, 4), progress=False)
    h = rl.train_rl(tiny_model(tok), tok, cfg, tasks.load_split("train"), tasks.load_split("test").select(range(3)))
    rows = h.rows
    first, last = rows[0], rows[-1]
    assert 0 <= first["eval_pass_at_1"] <= first["eval_pass_at_4"] <= 1
    assert first["eval_pass_at_1"] == pytest.approx(first["eval_accuracy"])  # pass@1 is the sampled accuracy
    # the entropy (about ln V nats for a random model) is below the target 10: the coefficient, 0 in the first step
    # (no measurement yet), is 0.01 in the second
    assert [r["entropy_coef"] for r in rows if "entropy_coef" in r] == pytest.approx([0.0, 0.01])
    assert math.isfinite(last["covariance"])


def test_to_trl_builds_a_grpo_config_with_the_entropy_settings():
    pytest.importorskip("trl")
    args = interop.to_trl(config.make_config("grpo", top_entropy_quantile=0.2, adaptive_entropy=True,
                                             entropy_coef=0.01, entropy_target=0.17, entropy_coef_delta=0.005),
                          output_dir="unused", report_to="none", use_cpu=True)
    assert (args.top_entropy_quantile, args.entropy_coef, args.use_adaptive_entropy, args.entropy_target,
            args.entropy_coef_delta, args.entropy_coef_min, args.entropy_coef_max) == (0.2, 0.01, True, 0.17, 0.005,
                                                                                        0.0, 1.0)
