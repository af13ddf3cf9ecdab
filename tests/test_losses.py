"""Tests of minirl.losses, by hand: the aggregation modes, the token-level clipped loss (PPO, GRPO, DAPO's
clip-higher), GSPO and GSPO-token, CISPO, SAPO and GMPO, a sampler correction's weights in each loss, and the value
loss."""

import math
from functools import partial

import helpers
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl import config, importance, losses
from minirl.losses import aggregate, policy_loss

D = torch.float64
MODES = losses.AGGREGATIONS
close_5e9 = partial(helpers.close, atol=5e-9, dtype=D)
F64 = dict(dtype=torch.float64)


def t(rows):
    return torch.tensor(rows, dtype=D)


close = partial(helpers.close, atol=5e-7, dtype=D)  # the 6 decimals the expectations are written with


# --- aggregate -----------------------------------------------------------------------------------------------------
PER_TOKEN = [[2.0, 2.0, 2.0, 0.0], [10.0, 0.0, 0.0, 0.0]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_token_mean():
    # (2 + 2 + 2 + 10) / 4 valid tokens = 4.0
    close(aggregate(t(PER_TOKEN), t(MASK), "token-mean"), 4.0)


def test_seq_mean_token_mean():
    # row means: (2+2+2)/3 = 2, 10/1 = 10; mean over sequences (2 + 10) / 2 = 6.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-mean"), 6.0)


def test_seq_mean_token_sum():
    # row sums 6 and 10; mean (6 + 10) / 2 = 8.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum"), 8.0)


def test_seq_mean_token_sum_norm():
    # Dr. GRPO: row sums / max_tokens: 6/4 = 1.5, 10/4 = 2.5; mean (1.5 + 2.5) / 2 = 2.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm", max_tokens=4), 2.0)
    # max_tokens defaults to T = 4
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm"), 2.0)
    # a budget of 8: 6/8 = 0.75, 10/8 = 1.25 -> mean 1.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm", max_tokens=8), 1.0)


def test_masked_values_never_leak():
    # garbage (even inf-free huge numbers) under the mask must not change anything
    dirty = t([[2.0, 2.0, 2.0, 1e6], [10.0, -1e6, 7.0, 3.0]])
    for mode, want in [("token-mean", 4.0), ("seq-mean-token-mean", 6.0), ("seq-mean-token-sum", 8.0)]:
        close(aggregate(dirty, t(MASK), mode), want)


def test_rows_with_no_valid_token_are_left_out_of_sequence_means():
    # a third row [7,7,7,7] with mask all 0: it must not count as a sequence (else 6.0 -> 4.0)
    per_token = t(PER_TOKEN + [[7.0, 7.0, 7.0, 7.0]])
    mask = t(MASK + [[0, 0, 0, 0]])
    close(aggregate(per_token, mask, "token-mean"), 4.0)  # still 16 / 4 tokens
    close(aggregate(per_token, mask, "seq-mean-token-mean"), 6.0)  # (2 + 10) / 2, not / 3
    close(aggregate(per_token, mask, "seq-mean-token-sum"), 8.0)  # (6 + 10) / 2
    close(aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=4), 2.0)  # (1.5 + 2.5) / 2


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_fully_masked_batch_is_zero_with_a_finite_zero_gradient(mode):
    x = t(PER_TOKEN).requires_grad_(True)
    loss = aggregate(x, torch.zeros(2, 4, dtype=D), mode)
    assert loss.item() == 0.0 and not torch.isnan(loss)
    loss.backward()  # the graph is kept, so a trainer can call backward() unconditionally
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_denominator_makes_micro_batches_add_up():
    per_token, mask = t(PER_TOKEN), t(MASK)
    # token-mean: the full batch has 4 tokens; row 0 alone: 6 / 4 = 1.5; row 1 alone: 10 / 4 = 2.5; sum 4.0
    parts = [aggregate(per_token[i:i + 1], mask[i:i + 1], "token-mean", denominator=4) for i in range(2)]
    close(parts, [1.5, 2.5])
    close(sum(parts), 4.0)
    # seq-mean-token-mean: 2 sequences; 2 / 2 = 1.0 and 10 / 2 = 5.0, sum 6.0
    parts = [aggregate(per_token[i:i + 1], mask[i:i + 1], "seq-mean-token-mean", denominator=2) for i in range(2)]
    close(sum(parts), 6.0)
    # without the shared denominator, the mean of the micro-batch means is wrong for token-mean: (6/3 + 10/1)/2 = 6
    naive = [aggregate(per_token[i:i + 1], mask[i:i + 1], "token-mean") for i in range(2)]
    close(sum(naive) / 2, 6.0)


def test_aggregate_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="aggregation mode 'mean'"):
        aggregate(t(PER_TOKEN), t(MASK), "mean")
    with pytest.raises(ValueError, match=r"per_token has shape \(2, 4\) but mask has shape \(2, 3\)"):
        aggregate(t(PER_TOKEN), torch.ones(2, 3, dtype=D), "token-mean")
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm", max_tokens=0)
    with pytest.raises(ValueError, match="denominator"):
        aggregate(t(PER_TOKEN), t(MASK), "token-mean", denominator=0)
    with pytest.raises(ValueError, match="per_token"):
        aggregate(torch.ones(4, dtype=D), torch.ones(4, dtype=D), "token-mean")


# --- policy_loss at token level: one token, by hand ------------------------------------------------------------------
def one_token(logprob, old_logprob, advantage, **kw):
    """Loss and d loss / d logprob for a single token; also returns old_logprobs to check it got no gradient."""
    lp = t([[logprob]]).requires_grad_(True)
    old = t([[old_logprob]]).requires_grad_(True)
    loss, stats = policy_loss(lp, old, t([advantage]), t([[1.0]]), **kw)
    loss.backward()
    return loss.item(), lp.grad.item(), old, stats


def test_on_policy_loss_and_gradient():
    # ratio = exp(-1 - (-1)) = 1; loss = -A * ratio = -1; d(-A * exp(lp - old)) / d lp = -A * ratio = -1
    loss, grad, old, stats = one_token(-1.0, -1.0, 1.0)
    close(loss, -1.0)
    close(grad, -1.0)
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
    close(stats["approx_kl"], 0.0)


def test_old_logprobs_are_detached():
    # the behaviour log-probs are constants of the objective: no gradient may flow into them
    _, _, old, _ = one_token(-1.0, -1.0, 1.0)
    assert old.grad is None
    _, _, old, _ = one_token(-0.8, -1.0, 1.0, eps_high=0.28)
    assert old.grad is None


def test_after_an_update_the_clip_zeroes_the_gradient():
    # ratio = exp(-0.8 + 1) = e^0.2 = 1.221403 > 1 + 0.2: the clipped branch -A * 1.2 = -1.2 is the larger of
    # (-1.221403, -1.2), so the loss is -1.2, a constant: gradient 0
    loss, grad, _, stats = one_token(-0.8, -1.0, 1.0, eps_low=0.2, eps_high=0.2)
    close(loss, -1.2)
    close(grad, 0.0)
    assert stats["clip_frac_high"] == 1.0 and stats["clip_frac_low"] == 0.0
    close(stats["ratio_mean"], math.exp(0.2))


def test_clip_higher_keeps_the_gradient():
    # DAPO's eps_high = 0.28: 1.221403 < 1.28, unclipped: loss -1.221403, gradient -A * ratio = -1.221403
    loss, grad, _, stats = one_token(-0.8, -1.0, 1.0, eps_low=0.2, eps_high=0.28)
    close(loss, -1.221403)
    close(grad, -1.221403)
    assert stats["clip_frac"] == 0.0


def test_positive_advantage_below_the_range_is_not_clipped():
    # ratio e^-0.3 = 0.740818 < 0.8 but A > 0: max(-0.740818, -0.8) = -0.740818 (pessimistic: keep the gradient
    # that pushes the probability back up); gradient -0.740818
    loss, grad, _, stats = one_token(-1.3, -1.0, 1.0)
    close(loss, -0.740818)
    close(grad, -0.740818)
    assert stats["clip_frac"] == 0.0


def test_negative_advantage_clipped_low():
    # A = -1, ratio e^-0.3 = 0.740818 < 1 - 0.2: max(0.740818, 0.8) = 0.8, constant -> gradient 0
    loss, grad, _, stats = one_token(-1.3, -1.0, -1.0)
    close(loss, 0.8)
    close(grad, 0.0)
    assert stats["clip_frac_low"] == 1.0 and stats["clip_frac_high"] == 0.0


def test_negative_advantage_above_the_range_is_not_clipped():
    # A = -1, ratio e^0.2 = 1.221403 > 1.2: max(1.221403, 1.2) = 1.221403, gradient -A * ratio = +1.221403
    loss, grad, _, stats = one_token(-0.8, -1.0, -1.0)
    close(loss, 1.221403)
    close(grad, 1.221403)
    assert stats["clip_frac"] == 0.0


def test_dual_clip():
    # A = -1, ratio e^1.5 = 4.481689: PPO's max(4.481689, 1.2) = 4.481689; dual clip c = 3 caps it at
    # c * |A| = 3, a constant -> gradient 0
    loss, grad, _, _ = one_token(0.5, -1.0, -1.0, dual_clip=3.0)
    close(loss, 3.0)
    close(grad, 0.0)
    loss, grad, _, _ = one_token(0.5, -1.0, -1.0)  # without the dual clip
    close(loss, 4.481689)
    close(grad, 4.481689)
    # below the cap it changes nothing: ratio e^0.5 = 1.648721 < 3 -> loss 1.648721, gradient 1.648721
    loss, grad, _, _ = one_token(-0.5, -1.0, -1.0, dual_clip=3.0)
    close(loss, 1.648721)
    close(grad, 1.648721)
    # A > 0 is untouched: ratio e^1.5 is clipped at 1.2 as usual -> -1.2, gradient 0
    loss, grad, _, _ = one_token(0.5, -1.0, 1.0, dual_clip=3.0)
    close(loss, -1.2)
    close(grad, 0.0)


def test_dual_clip_must_exceed_one():
    # log r 0.5, A -1: PPO's loss max(-A r, -A clip(r, 0.8, 1.2)) = max(e^0.5, 1.2) = 1.648721. Dual clip caps it
    # at c |A|: with c = 0.5 the "cap" 0.5 is BELOW the plain PPO loss (and c = 1 caps at |A| = 1 < 1.648721), so
    # c <= 1 is refused at every level; c = 1.5 caps at 1.5, c = 3 leaves 1.648721.
    for c in (0.5, 1.0, 0.0, -2.0):
        for level in ("token", "sequence", "sequence-token"):
            with pytest.raises(ValueError, match=rf"dual_clip must be > 1.*got {c}"):
                one_token(0.5 - 1.0, -1.0, -1.0, dual_clip=c, level=level, agg="seq-mean-token-mean")
    close(one_token(-0.5, -1.0, -1.0)[0], math.exp(0.5))  # 1.648721
    close(one_token(-0.5, -1.0, -1.0, dual_clip=1.5)[0], 1.5)
    close(one_token(-0.5, -1.0, -1.0, dual_clip=3.0)[0], 1.648721)
    with pytest.raises(ValueError, match="dual_clip"):
        config.RLConfig(dual_clip=1.0).validate()
    config.RLConfig(dual_clip=3.0).validate()
    config.RLConfig(dual_clip=None).validate()


def test_extreme_log_ratio_stays_finite():
    # a log-ratio of 80 nats would overflow exp in float32; the clamp keeps loss and gradient finite
    lp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-80.0, -1.0]])
    loss, stats = policy_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert math.isfinite(stats["ratio_max"]) and math.isfinite(stats["approx_kl"])


def exact_and_ours(d, advantage, dual_clip, eps=0.2):
    """By hand, float64: the exact PPO loss gradient d/dlogprob at log-ratio d, and minirl's (value, gradient).

    One token, per-token loss max(-A r, -A clip(r, 1 - eps, 1 + eps)), capped at c |A| for A < 0 with a dual clip.
    minirl's r is e^d up to 20 nats and e^20 (1 + d - 20) above (the tangent), so r' = e^20 there.
    """
    r_exact, r, r_slope = math.exp(d), math.exp(d), math.exp(d)
    if d > 20:
        r, r_slope = math.exp(20) * (1 + d - 20), math.exp(20)

    def branch(ratio):  # which branch is active, and the loss value
        unclipped, clipped = -advantage * ratio, -advantage * min(max(ratio, 1 - eps), 1 + eps)
        loss, active = (unclipped, "unclipped") if unclipped >= clipped else (clipped, "clipped")
        if dual_clip is not None and advantage < 0 and -advantage * dual_clip < loss:
            loss, active = -advantage * dual_clip, "dual"
        return loss, active

    _, active_exact = branch(r_exact)
    loss, active = branch(r)
    assert active == active_exact  # the continuation never changes which branch is active
    exact_grad = -advantage * r_exact if active == "unclipped" else 0.0
    grad = -advantage * r_slope if active == "unclipped" else 0.0
    return loss, grad, exact_grad


@pytest.mark.parametrize("level", ["token", "sequence", "sequence-token"])
@pytest.mark.parametrize("d", [25.0, 50.0, 100.0, -25.0, -50.0, -100.0])
@pytest.mark.parametrize("advantage", [1.0, -1.0])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_policy_gradient_past_the_ratio_cap_keeps_the_exact_sign(level, d, advantage, dual_clip):
    # log-ratio d = logprob - old_logprob. Where each branch is active (eps 0.2):
    #   d > 0, A = +1: r > 1.2, clipped: loss -1.2, gradient 0 (exact 0).
    #   d > 0, A = -1: unclipped, loss -A r = r: d = 25 -> e^20 * 6 = 2.910991e9, gradient e^20 = 4.851652e8 > 0
    #     (exact e^25 = 7.200490e10 > 0; a clamp at 20 nats used to give 0). With dual clip 3: loss 3, gradient 0.
    #   d < 0, A = +1: r < 0.8, unclipped: loss -r = -e^d, gradient -e^d < 0, exact (no clamp below: e^-100 =
    #     3.720076e-44 in float64; a clamp at -20 used to give -e^-20 and gradient 0).
    #   d < 0, A = -1: r < 0.8, clipped at 0.8: loss 0.8, gradient 0 (exact 0).
    # With one token per sequence the sequence levels have the same ratio, hence the same numbers.
    expected_loss, expected_grad, exact_grad = exact_and_ours(d, advantage, dual_clip)
    agg = "token-mean" if level == "token" else "seq-mean-token-mean"
    loss, grad, _, stats = one_token(d - 1.0, -1.0, advantage, dual_clip=dual_clip, level=level, agg=agg)
    assert math.isfinite(loss) and math.isfinite(grad)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    assert grad == pytest.approx(expected_grad, rel=1e-12, abs=0)
    assert (grad > 0) == (exact_grad > 0) and (grad < 0) == (exact_grad < 0) and (grad == 0) == (exact_grad == 0)
    assert all(math.isfinite(v) for v in stats.values())
    if (d, advantage, dual_clip) == (25.0, -1.0, None):
        assert (loss, grad, exact_grad) == pytest.approx((2.910991172e9, 4.851651954e8, 7.200489934e10), rel=1e-9)


def test_approx_kl_past_the_cap_is_finite_and_still_increasing():
    # k3 of KL(pi_old || pi) per token: r - 1 - log r with log r = d; past 20 nats r = e^20 (1 + d - 20):
    # d = 25: 6 e^20 - 26 = 2.910991146e9; d = 50: 31 e^20 - 51 = 1.504012101e10 (a clamped r would give
    # e^20 - 1 - d, DEcreasing in d); d = -25: e^-25 - 1 + 25 = 24 (exact)
    kls = [one_token(d - 1.0, -1.0, 1.0)[3]["approx_kl"] for d in (25.0, 50.0, -25.0)]
    assert kls == pytest.approx([6 * math.exp(20) - 26, 31 * math.exp(20) - 51, 24 + math.exp(-25)], rel=1e-12)


def test_token_mean_vs_seq_mean_on_two_rows():
    # on-policy, A = +1: per-token loss -1 on every valid token.
    # grads: token-mean: -1 / 4 tokens = -0.25 on each valid token.
    # seq-mean-token-mean: row 0 has 3 tokens: -1 / 3 / 2 = -0.166667; row 1 has 1 token: -1 / 1 / 2 = -0.5
    mask = t(MASK)
    for agg, g0, g1 in [("token-mean", -0.25, -0.25), ("seq-mean-token-mean", -1 / 6, -0.5)]:
        lp = torch.full((2, 4), -1.0, dtype=D, requires_grad=True)
        loss, _ = policy_loss(lp, lp.detach().clone(), t([1.0, 1.0]), mask, agg=agg)
        loss.backward()
        close(loss, -1.0)
        close(lp.grad, [[g0, g0, g0, 0.0], [g1, 0.0, 0.0, 0.0]])


def test_per_token_advantages():
    # advantages may be (B, T): on-policy the per-token loss is -A_t, token-mean over the 4 valid tokens:
    # -(1 + 2 + 3 + 4) / 4 = -2.5
    lp = torch.full((2, 4), -1.0, dtype=D)
    a = t([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    loss, _ = policy_loss(lp, lp, a, t(MASK))
    close(loss, -2.5)


def test_fully_masked_policy_loss_is_zero():
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    loss, stats = policy_loss(lp, lp.detach() - 5, torch.ones(2), torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(2, 3))
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


# --- bad input -----------------------------------------------------------------------------------------------------
def test_policy_loss_shape_mismatch_names_the_arguments():
    a, b = torch.zeros(2, 3), torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"old_logprobs has shape \(2, 4\)"):
        policy_loss(a, b, torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        policy_loss(a, a, torch.zeros(2), torch.ones(3, 2))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(a, a, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(a, a, torch.zeros(2, 3), torch.ones(2, 3), level="sequence")
    with pytest.raises(ValueError, match="aggregation mode"):
        policy_loss(a, a, torch.zeros(2), torch.ones(2, 3), agg="sum")
    with pytest.raises(ValueError, match="level"):
        policy_loss(a, a, torch.zeros(2), torch.ones(2, 3), level="tokens")
    with pytest.raises(ValueError, match="eps_low"):
        policy_loss(a, a, torch.zeros(2), torch.ones(2, 3), eps_low=1.5)


# --- DAPO's and Dr. GRPO's aggregations, overlong filtering and clip-higher -------------------------------------------
def t_rows(*rows):
    return torch.tensor(rows, dtype=D)


close_1e7 = partial(helpers.close, atol=1e-7, dtype=D)


# --- the acceptance example of the issue: ratio 1, beta 0, A = [+1, -1], lengths [3, 1] --------------------------
# On-policy the ratio is 1, so the per-token loss is -A * 1: row 0 -> [-1, -1, -1], row 1 -> [+1, 0, 0] (2 padded).
AGG_LOGP = t_rows([-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0])
AGG_MASK = t_rows([1, 1, 1], [1, 0, 0])
AGG_ADV = torch.tensor([1.0, -1.0], dtype=D)


@pytest.mark.parametrize("mode, expected", [
    ("seq-mean-token-mean", 0.0),  # per sequence: -3/3 = -1 and +1/1 = +1; mean (-1 + 1) / 2 = 0
    ("token-mean", -0.5),  # all tokens: (-1 - 1 - 1 + 1) / 4 tokens = -2/4 = -0.5
    ("seq-mean-token-sum-norm", -1 / 3),  # (-3/3 + 1/3) / 2 sequences = (-2/3) / 2 = -1/3 (max_tokens 3)
    ("seq-mean-token-sum", -1.0),  # (-3 + 1) / 2 sequences = -1
])
def test_acceptance_loss_under_each_aggregation(mode, expected):
    loss, stats = losses.policy_loss(AGG_LOGP, AGG_LOGP.clone(), AGG_ADV, AGG_MASK, agg=mode, max_tokens=3)
    close_1e7(loss, expected)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


@pytest.mark.parametrize("mode, weights", [
    # d loss / d logprob_t = -A_i * w_t at ratio 1; the weight w_t of each token is
    ("token-mean", [[1 / 4] * 3, [1 / 4]]),  # 1 / (all 4 tokens): every token the same
    ("seq-mean-token-mean", [[1 / 6] * 3, [1 / 2]]),  # 1 / (2 seqs * |o_i|): 1/(2*3) long, 1/(2*1) short
    ("seq-mean-token-sum-norm", [[1 / 6] * 3, [1 / 6]]),  # 1 / (2 seqs * max_tokens 3): every token the same
    ("seq-mean-token-sum", [[1 / 2] * 3, [1 / 2]]),  # 1 / (2 seqs): every token the same, scale grows with T
])
def test_gradient_weight_of_each_token_under_each_aggregation(mode, weights):
    logp = AGG_LOGP.clone().requires_grad_(True)
    loss, _ = losses.policy_loss(logp, AGG_LOGP.clone(), AGG_ADV, AGG_MASK, agg=mode, max_tokens=3)
    (grad,) = torch.autograd.grad(loss, logp)
    # GRPO's per-sequence mean gives the short completion's token 3x the weight of a long one's (1/2 vs 1/6):
    # a wrong answer (A < 0) is pushed down less per token the longer it is -- Dr. GRPO's length bias.
    expected = t_rows([-w * 1.0 for w in weights[0]], [+weights[1][0], 0.0, 0.0])  # -A * w; padding gets 0
    close_1e7(grad, expected)


# paper-index: aggregation.aggregate
def test_aggregate_docstring_example():
    per_token, mask = t_rows([2, 2, 2, 0], [10, 0, 0, 0]), t_rows([1, 1, 1, 0], [1, 0, 0, 0])
    close_1e7(losses.aggregate(per_token, mask, "token-mean"), 4.0)  # (2+2+2+10) / 4 tokens
    close_1e7(losses.aggregate(per_token, mask, "seq-mean-token-mean"), 6.0)  # (6/3 + 10/1) / 2 = (2 + 10) / 2
    close_1e7(losses.aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=4), 2.0)  # (6/4 + 10/4) / 2


def test_sum_norm_defaults_to_T_and_rejects_bad_max_tokens():
    per_token, mask = t_rows([2, 2, 2, 0], [10, 0, 0, 0]), t_rows([1, 1, 1, 0], [1, 0, 0, 0])
    close_1e7(losses.aggregate(per_token, mask, "seq-mean-token-sum-norm"), 2.0)  # T = 4
    with pytest.raises(ValueError, match="max_tokens"):
        losses.aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=0)
    with pytest.raises(ValueError, match="aggregation mode"):
        losses.aggregate(per_token, mask, "mean")
    with pytest.raises(ValueError, match="denominator"):
        losses.aggregate(per_token, mask, "token-mean", denominator=0)


def test_overlong_filtering_removes_truncated_tokens_from_numerator_and_denominator():
    # a finished completion of 2 tokens (loss 1 each) and a truncated one of 4 tokens (loss 3 each)
    per_token = t_rows([1, 1, 0, 0], [3, 3, 3, 3])
    mask = t_rows([1, 1, 0, 0], [1, 1, 1, 1])
    truncated = torch.tensor([False, True])
    filtered = mask * (~truncated).to(D).unsqueeze(1)  # what the trainer does with overlong_filter=True
    close_1e7(losses.aggregate(per_token, filtered, "token-mean"), 1.0)  # (1 + 1) / 2 tokens
    close_1e7(losses.aggregate(per_token, mask, "token-mean"), 14 / 6)  # without filtering: (2 + 12) / 6 tokens


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("denominator", [None, 1.0])  # 1.0 is what the trainer passes for an all-masked minibatch
def test_fully_masked_batch_gives_zero_loss_and_zero_finite_gradient(mode, denominator):
    logp = t_rows([-1.0, -2.0], [-0.5, -0.1]).requires_grad_(True)
    old = t_rows([-3.0, -0.1], [-0.5, -9.0])  # wild ratios on masked tokens must not leak
    loss, stats = losses.policy_loss(logp, old, torch.tensor([1.0, -1.0], dtype=D), torch.zeros(2, 2, dtype=D),
                                     agg=mode, denominator=denominator)
    assert loss.item() == 0.0 and not math.isnan(stats["ratio_mean"])
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(grad).all() and (grad == 0).all()


# --- clip-higher ---------------------------------------------------------------------------------------------------
def test_clip_fractions_low_and_high_on_hand_made_ratios():
    # row 0, A = +1, ratios 1.25, 1.3, 0.7; row 1, A = -1, ratios 0.7, 1.3, 0.9. eps_low 0.2, eps_high 0.28:
    #   high clip (A > 0 and r > 1.28): only 1.3 in row 0            -> 1/6
    #   low clip (A < 0 and r < 0.8): only 0.7 in row 1              -> 1/6
    #   0.7 with A > 0 and 1.3 with A < 0 are NOT clipped (the min picks the unclipped term, gradient flows)
    ratios = t_rows([1.25, 1.3, 0.7], [0.7, 1.3, 0.9])
    old = torch.full((2, 3), -1.0, dtype=D)
    logp = (old + ratios.log()).requires_grad_(True)
    A, mask = torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 3, dtype=D)
    loss, stats = losses.policy_loss(logp, old, A, mask, eps_low=0.2, eps_high=0.28, agg="token-mean")
    close_1e7(stats["clip_frac_high"], 1 / 6)
    close_1e7(stats["clip_frac_low"], 1 / 6)
    close_1e7(stats["clip_frac"], 2 / 6)
    close_1e7(stats["ratio_max"], 1.3)
    close_1e7(stats["ratio_min"], 0.7)
    (grad,) = torch.autograd.grad(loss, logp)
    # gradient of -A r / 6 w.r.t. log r is -A r / 6; zero where clipped
    close_1e7(grad, t_rows([-1.25 / 6, 0.0, -0.7 / 6], [0.0, 1.3 / 6, 0.9 / 6]))
    # with the symmetric 0.2 / 0.2 clip, 1.25 is clipped too: high 2/6
    _, sym = losses.policy_loss(logp, old, A, mask, eps_low=0.2, eps_high=0.2, agg="token-mean")
    close_1e7(sym["clip_frac_high"], 2 / 6)
    close_1e7(sym["clip_frac_low"], 1 / 6)


# paper-index: losses.policy_loss
@pytest.mark.parametrize("pi_old, eps_high, ceiling", [
    (0.01, 0.20, 0.012),  # a rare token: 0.01 * 1.2 = 0.012 is as far as one clipped step can push it
    (0.01, 0.28, 0.0128),  # clip-higher: 0.01 * 1.28 = 0.0128
    (0.90, 0.20, 1.08),  # a likely token: 0.9 * 1.2 = 1.08 > 1, so the clip never binds below probability 1
])
def test_clip_ceiling_of_a_token(pi_old, eps_high, ceiling):
    # with A > 0 the gradient vanishes exactly when pi / pi_old > 1 + eps_high, i.e. pi > pi_old (1 + eps_high)
    close_1e7(pi_old * (1 + eps_high), ceiling, atol=1e-12)
    old = torch.tensor([[math.log(pi_old)]], dtype=D)
    A, mask = torch.ones(1, dtype=D), torch.ones(1, 1, dtype=D)
    for pi, clipped in ((min(ceiling * 0.999, 0.999), False), (ceiling * 1.001, True)):
        if pi >= 1:
            continue  # not a probability: the ceiling is out of reach for this token
        logp = torch.tensor([[math.log(pi)]], dtype=D, requires_grad=True)
        loss, _ = losses.policy_loss(logp, old, A, mask, eps_low=0.2, eps_high=eps_high)
        (grad,) = torch.autograd.grad(loss, logp)
        assert (grad.abs().item() == 0.0) == clipped, (pi, grad)


def test_eps_high_defaults_to_eps_low_and_bad_eps_raise():
    old = torch.zeros(1, 1, dtype=D)
    logp = torch.full((1, 1), math.log(1.25), dtype=D)
    _, st = losses.policy_loss(logp, old, torch.ones(1, dtype=D), torch.ones(1, 1, dtype=D), eps_low=0.2)
    assert st["clip_frac_high"] == 1.0  # 1.25 > 1 + 0.2
    with pytest.raises(ValueError, match="eps_low"):
        losses.policy_loss(logp, old, torch.ones(1, dtype=D), torch.ones(1, 1, dtype=D), eps_low=1.0)


# ------------------------------------------------------------------------------------------------------ value loss
# paper-index: losses.value_loss
def test_value_loss_clipped_branch_is_larger_and_has_zero_gradient():
    # V_old 0.5, V 1.0 (moved +0.5), R 0.9, clip 0.2: unclipped (1.0 - 0.9)^2 = 0.01;
    # V_clip = 0.5 + 0.2 = 0.7, clipped (0.7 - 0.9)^2 = 0.04 > 0.01 -> loss 0.5 * 0.04 = 0.02.
    # V_clip does not depend on V once the clip is active: the gradient is 0.
    v = t_rows([1.0]).requires_grad_(True)
    loss, stats = losses.value_loss(v, t_rows([0.5]), t_rows([0.9]), t_rows([1.0]), clip=0.2)
    close(loss, 0.02)
    close(torch.autograd.grad(loss, v)[0], [[0.0]])
    assert stats["value_clip_frac"] == 1.0


def test_value_loss_unclipped_branch_is_larger_and_keeps_its_gradient():
    # V_old 0.5, V 0.0 (moved -0.5), R 1.0: unclipped (0 - 1)^2 = 1; V_clip = 0.3, clipped 0.49 < 1
    # -> loss 0.5 * 1 = 0.5, gradient d/dV 0.5 (V - R)^2 = V - R = -1.
    v = t_rows([0.0]).requires_grad_(True)
    loss, stats = losses.value_loss(v, t_rows([0.5]), t_rows([1.0]), t_rows([1.0]), clip=0.2)
    close(loss, 0.5)
    close(torch.autograd.grad(loss, v)[0], [[-1.0]])
    assert stats["value_clip_frac"] == 0.0


def test_value_loss_token_mean_over_valid_tokens_and_no_clip():
    # tokens: the two cases above, plus a padded token with garbage: (0.02 + 0.5) / 2 = 0.26;
    # gradient [0, -1, 0] / 2 = [0, -0.5, 0]
    v = t_rows([1.0, 0.0, 42.0]).requires_grad_(True)
    old, ret, mask = t_rows([0.5, 0.5, 0.0]), t_rows([0.9, 1.0, -42.0]), t_rows([1, 1, 0])
    loss, stats = losses.value_loss(v, old, ret, mask, clip=0.2)
    close(loss, 0.26)
    close(torch.autograd.grad(loss, v)[0], [[0.0, -0.5, 0.0]])
    assert stats["value_clip_frac"] == 0.5
    # clip=None: plain 0.5 (V - R)^2 averaged: (0.5 * 0.01 + 0.5 * 1) / 2 = 0.2525; gradient (V - R) / 2
    loss, _ = losses.value_loss(v, old, ret, mask, clip=None)
    close(loss, 0.2525)
    close(torch.autograd.grad(loss, v)[0], [[0.05, -0.5, 0.0]])


def test_value_loss_gradient_matches_finite_differences_of_the_objective():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(3, 4, generator=g, dtype=D).requires_grad_(True)
    old, ret = torch.randn(3, 4, generator=g, dtype=D), torch.randn(3, 4, generator=g, dtype=D)
    mask = t_rows([1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0])
    torch.autograd.gradcheck(lambda x: losses.value_loss(x, old, ret, mask, clip=0.3)[0], (v,))


def test_value_loss_bad_inputs():
    with pytest.raises(ValueError, match="old_values"):
        losses.value_loss(t_rows([1.0, 2.0]), t_rows([1.0]), t_rows([1.0, 2.0]), t_rows([1, 1]))
    with pytest.raises(ValueError, match="returns"):
        losses.value_loss(t_rows([1.0]), t_rows([1.0]), t_rows([1.0, 2.0]), t_rows([1]))
    with pytest.raises(ValueError, match="clip"):
        losses.value_loss(t_rows([1.0]), t_rows([1.0]), t_rows([1.0]), t_rows([1]), clip=0.0)


# --- CISPO, SAPO and GMPO through policy_loss(..., loss_mode=...), the way the loop calls them ------------------------
def run(lp, old, adv, mask=None, **kw):
    """(loss, d loss / d logprobs, stats) through policy_loss."""
    lp = t(lp).requires_grad_(True)
    old = t(old)
    mask = torch.ones_like(old) if mask is None else t(mask)
    loss, stats = losses.policy_loss(lp, old, t(adv), mask, **kw)
    loss.backward()
    return float(loss.detach()), lp.grad, stats


GMPO = dict(loss_mode="gmpo", eps_low=0.4, eps_high=0.4, agg="seq-mean-token-mean")


# ------------------------------------------------------------------------------------------------ hand values
def test_cispo_hand_values_both_forms():
    # on-policy: w = 1, loss = -1 * (+1) * (-1.0) = 1.0, d/d logprob = -w A = -1
    loss, grad, _ = run([[-1.0]], [[-1.0]], [1.0], loss_mode="cispo")
    assert loss == pytest.approx(1.0) and float(grad) == pytest.approx(-1.0)
    # r = e^0.5 = 1.648721 > 1.28: two-sided w = 1.28, loss = -1.28 * (-0.5) = 0.64, gradient -1.28 (PPO's: 0)
    loss, grad, st = run([[-0.5]], [[-1.0]], [1.0], loss_mode="cispo", eps_low=0.2, eps_high=0.28)
    assert loss == pytest.approx(0.64) and float(grad) == pytest.approx(-1.28)
    assert st["clip_frac_high"] == 1.0 and st["ppo_clip_frac"] == 1.0
    # one-sided, cap 1 + 4 = 5: w = r = 1.648721, loss = -1.648721 * (-0.5) = 0.824361
    loss, grad, st = run([[-0.5]], [[-1.0]], [1.0], loss_mode="cispo", eps_high=4.0, cispo_form="one-sided")
    assert loss == pytest.approx(0.5 * math.exp(0.5)) and float(grad) == pytest.approx(-math.exp(0.5))
    assert st["clip_frac"] == 0.0
    # below the band, A < 0: two-sided raises w to 0.8 (gradient +0.8); one-sided keeps w = r = e^-0.5 = 0.606531
    _, grad, _ = run([[-1.5]], [[-1.0]], [-1.0], loss_mode="cispo")
    assert float(grad) == pytest.approx(0.8)
    _, grad, _ = run([[-1.5]], [[-1.0]], [-1.0], loss_mode="cispo", cispo_form="one-sided")
    assert float(grad) == pytest.approx(math.exp(-0.5))


def test_cispo_token_mean_by_hand():
    # two rows, 3 + 1 valid tokens, on-policy (w = 1): per-token -A * logprob
    # row 0 (A = +1): 0.5 + 1.0 + 2.0 = 3.5; row 1 (A = -2): -2 * 1.0 = -2.0 (loss -(-2)(-1.0)); token-mean 1.5 / 4
    lp = [[-0.5, -1.0, -2.0], [-1.0, 0.0, 0.0]]
    loss, grad, _ = run(lp, lp, [1.0, -2.0], [[1, 1, 1], [1, 0, 0]], loss_mode="cispo")
    assert loss == pytest.approx(1.5 / 4)
    assert torch.allclose(grad, t([[-0.25, -0.25, -0.25], [0.5, 0.0, 0.0]]))  # -w A / 4 tokens


def test_sapo_hand_values():
    # r = 1, A = +1, tau 1: f = 4 * sigmoid(0) = 2, loss -2, gradient -4 * 1 * 0.5 * 0.5 = -1
    loss, grad, st = run([[-1.0]], [[-1.0]], [1.0], loss_mode="sapo")
    assert loss == pytest.approx(-2.0) and float(grad) == pytest.approx(-1.0) and st["gate_mean"] == 1.0
    # r = e^0.5: s = sigmoid(0.648721) = 0.656722, f = 2.626889, gradient -4 * 1.648721 * 0.656722 * 0.343278
    loss, grad, _ = run([[-0.5]], [[-1.0]], [1.0], loss_mode="sapo")
    r = math.exp(0.5)
    s = 1 / (1 + math.exp(-(r - 1)))
    assert loss == pytest.approx(-4 * s) and loss == pytest.approx(-2.626889, abs=1e-6)
    assert float(grad) == pytest.approx(-4 * r * s * (1 - s)) and float(grad) == pytest.approx(-1.486739, abs=1e-6)
    # A = -1 uses tau_neg = 1.05: at r = 1, f = 4 / 1.05 * 0.5 = 1.904762, loss +1.904762, gradient still +1
    loss, grad, _ = run([[-1.0]], [[-1.0]], [-1.0], loss_mode="sapo")
    assert loss == pytest.approx(2 / 1.05) and abs(float(grad) - 1.0) < 1e-15  # tau kept in float64, not float32


def test_gmpo_hand_values():
    # log-ratios [0.6, 0.0], A = +1: m = [min(0.6, 0.4), 0] = [0.4, 0], weight e^(0.4 / 2) = e^0.2 = 1.221403
    loss, grad, st = run([[-0.4, -1.0]], [[-1.0, -1.0]], [1.0], **GMPO)
    assert loss == pytest.approx(-math.exp(0.2))
    assert torch.allclose(grad, t([[0.0, -math.exp(0.2) / 2]]))  # the clipped token loses its gradient only
    assert st["clip_frac_high"] == 0.5
    # A = -1: max(0.6, 0.4) = 0.6 is kept, weight e^0.3 = 1.349859, loss +1.349859, gradient e^0.3 / 2 each
    loss, grad, st = run([[-0.4, -1.0]], [[-1.0, -1.0]], [-1.0], **GMPO)
    assert loss == pytest.approx(math.exp(0.3))
    assert torch.allclose(grad, t([[math.exp(0.3) / 2] * 2])) and st["clip_frac"] == 0.0
    # two sequences: mean over sequences (-e^0.2 + e^0.3) / 2
    loss, _, _ = run([[-0.4, -1.0], [-0.4, -1.0]], [[-1.0, -1.0]] * 2, [1.0, -1.0], **GMPO)
    assert loss == pytest.approx((-math.exp(0.2) + math.exp(0.3)) / 2)


# paper-index: clip_alternatives.cispo_loss clip_alternatives.sapo_loss clip_alternatives.gmpo_loss
def test_each_function_directly_equals_policy_loss():
    lp, old, mask = t([[-0.4, -1.0]]), t([[-1.0, -1.0]]), t([[1.0, 1.0]])
    direct, _ = losses.gmpo_loss(lp, old, t([1.0]), mask, eps_low=0.4, eps_high=0.4)
    assert float(direct) == pytest.approx(-math.exp(0.2))  # as in test_gmpo_hand_values
    adv = t([[1.0, 1.0]])
    assert float(losses.cispo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)[0]) == pytest.approx(
        run([[-0.4, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="cispo", eps_high=0.28)[0])
    assert float(losses.sapo_loss(lp, old, adv, mask)[0]) == pytest.approx(
        run([[-0.4, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="sapo")[0])


def test_gmpo_is_the_geometric_mean_of_the_clipped_ratios():
    # inside the band the weight is (prod r_t)^(1/|o|): ratios 1.1, 0.9, 1.2 -> (1.188)^(1/3)
    ratios = [1.1, 0.9, 1.2]
    old = [[-1.0] * 3]
    lp = [[-1.0 + math.log(r) for r in ratios]]
    loss, _, _ = run(lp, old, [1.0], **GMPO)
    assert loss == pytest.approx(-(1.1 * 0.9 * 1.2) ** (1 / 3))


# ------------------------------------------------------------------------------------------------ vs PPO
def test_cispo_equals_ppo_gradient_inside_the_band_and_keeps_it_outside():
    """Inside [1 - eps, 1 + eps] the CISPO weight is r, so its gradient -r A equals PPO's; outside, PPO's is 0 on
    the clipped side and CISPO's is -w A with the capped w."""
    for lr_, a in ((0.1, 1.0), (-0.1, -1.0), (0.1, -1.0), (-0.1, 1.0)):
        _, g_ppo, _ = run([[-1.0 + lr_]], [[-1.0]], [a])
        _, g_cispo, _ = run([[-1.0 + lr_]], [[-1.0]], [a], loss_mode="cispo")
        assert float(g_cispo) == pytest.approx(float(g_ppo))
    _, g_ppo, _ = run([[-0.5]], [[-1.0]], [1.0])
    _, g_cispo, _ = run([[-0.5]], [[-1.0]], [1.0], loss_mode="cispo")
    assert float(g_ppo) == 0.0 and float(g_cispo) == pytest.approx(-1.2)


def test_sapo_gradient_is_smooth_and_never_zero_at_the_band_edge():
    grads = [float(run([[-1.0 + math.log(r)]], [[-1.0]], [1.0], loss_mode="sapo")[1]) for r in (1.19, 1.2, 1.21)]
    # -4 r s (1 - s) = -1.179, -1.188, -1.197: about -A r, moving by < 0.02 (PPO's jumps from -1.19 to 0 here)
    assert all(g < -1.1 for g in grads)
    assert max(grads) - min(grads) < 0.02


# ------------------------------------------------------------------------------------------------ exact gradients
def _categorical(V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=D).requires_grad_(True)
    old_logits = theta.detach() + 0.6 * torch.randn(V, generator=g, dtype=D)  # pi_old != pi: ratios spread
    adv = torch.randn(V, generator=g, dtype=D)  # A(y) for each token y
    return theta, old_logits, adv


def _expected_grad(theta, old_logits, adv, **kw):
    """Exact E_{y ~ pi_old}[d loss(y) / d theta] by enumerating the V tokens, each a one-token sequence."""
    V = theta.numel()
    p_old = old_logits.softmax(-1)
    total = torch.zeros_like(theta)
    for y in range(V):
        theta.grad = None
        lp = theta.log_softmax(-1)[y].reshape(1, 1)
        old = old_logits.log_softmax(-1)[y].reshape(1, 1)
        loss, _ = losses.policy_loss(lp, old, adv[y].reshape(1), torch.ones(1, 1, dtype=D), **kw)
        loss.backward()
        total = total + p_old[y] * theta.grad
    return total


def test_on_policy_all_three_give_the_exact_policy_gradient():
    """On-policy (pi_old = pi) every loss's expected gradient is -grad E_pi[A]: the true objective's, by autograd."""
    theta, _, adv = _categorical()
    true = torch.autograd.grad(-(theta.softmax(-1) * adv).sum(), theta)[0]
    for kw in (dict(loss_mode="cispo"), dict(loss_mode="cispo", cispo_form="one-sided"), dict(loss_mode="sapo"),
               GMPO):
        got = _expected_grad(theta, theta.detach().clone(), adv, **kw)
        assert torch.allclose(got, true, atol=1e-12), kw


def test_cispo_off_policy_expected_gradient_is_the_weighted_reinforce_gradient():
    """Off-policy: E_{pi_old}[-w A grad log pi] with w = clip(pi / pi_old), autograd of that surrogate."""
    theta, old_logits, adv = _categorical(seed=1)
    ratio = (theta.log_softmax(-1) - old_logits.log_softmax(-1)).exp().detach()
    for form, w in (("two-sided", ratio.clamp(0.8, 1.2)), ("one-sided", ratio.clamp(max=1.2))):
        surrogate = -(old_logits.softmax(-1) * w * adv * theta.log_softmax(-1)).sum()
        true = torch.autograd.grad(surrogate, theta)[0]
        got = _expected_grad(theta, old_logits, adv, loss_mode="cispo", cispo_form=form)
        assert torch.allclose(got, true, atol=1e-12), form
    assert ((ratio > 1.2) | (ratio < 0.8)).any()  # some weights are clipped, so the test is not vacuous


def test_sapo_off_policy_expected_gradient_is_that_of_the_gated_objective():
    """E_{pi_old}[-f(pi / pi_old) A] is SAPO's objective (eq. 5 with one token per sequence); autograd of it."""
    theta, old_logits, adv = _categorical(seed=2)
    ratio = (theta.log_softmax(-1) - old_logits.log_softmax(-1)).exp()
    tau = torch.where(adv > 0, 1.0, 1.05).to(D)
    objective = -(old_logits.softmax(-1) * torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv).sum()
    true = torch.autograd.grad(objective, theta)[0]
    assert torch.allclose(_expected_grad(theta, old_logits, adv, loss_mode="sapo"), true, atol=1e-12)


def test_gmpo_two_token_sequences_enumerated():
    """Sequences of two tokens from the same categorical: the expected GMPO loss over all V^2 sequences (under
    pi_old) against the paper's objective written as a product, E[sgn(A) |A| (prod_t clipped r_t)^(1/2)]."""
    theta, old_logits, _ = _categorical(seed=3)
    V = theta.numel()
    p_old, lp_all, old_all = old_logits.softmax(-1), theta.log_softmax(-1), old_logits.log_softmax(-1)
    seqs = [(a, b) for a in range(V) for b in range(V)]
    adv = torch.linspace(-1.5, 1.5, len(seqs), dtype=D)  # one advantage per sequence
    lp = torch.stack([lp_all[list(s)] for s in seqs])  # (V^2, 2)
    old = torch.stack([old_all[list(s)] for s in seqs])
    weight = torch.stack([p_old[a] * p_old[b] for a, b in seqs])  # probability of each sequence under pi_old
    lo, hi = math.exp(-0.4), math.exp(0.4)
    expected = 0
    for i in range(len(seqs)):
        loss_i, _ = losses.policy_loss(lp[i:i + 1], old[i:i + 1], adv[i:i + 1], torch.ones(1, 2, dtype=D), **GMPO)
        expected = expected + weight[i] * loss_i
        r = (lp[i] - old[i]).exp()
        clipped = torch.minimum(r, r.clamp(lo, hi)) if adv[i] > 0 else torch.maximum(r, r.clamp(lo, hi))
        paper = -adv[i] * clipped.prod() ** 0.5
        assert torch.allclose(loss_i, paper, atol=1e-12)
    g_loss = torch.autograd.grad(expected, theta, retain_graph=True)[0]
    paper_obj = sum(weight[i] * -adv[i] * ((torch.minimum if adv[i] > 0 else torch.maximum)(
        (lp[i] - old[i]).exp(), (lp[i] - old[i]).exp().clamp(lo, hi))).prod() ** 0.5 for i in range(len(seqs)))
    assert torch.allclose(g_loss, torch.autograd.grad(paper_obj, theta)[0], atol=1e-12)
    r_all = (lp - old).exp()
    assert ((r_all > hi) | (r_all < lo)).any()  # some token ratios are clipped


# ------------------------------------------------------------------------------------------------ masking
LOSS_MODES = [dict(loss_mode="cispo"), dict(loss_mode="cispo", cispo_form="one-sided"), dict(loss_mode="sapo"), GMPO]


@pytest.mark.parametrize("kw", LOSS_MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
def test_padding_is_never_read_inf_and_nan_included(kw):
    lp = [[-0.5, -1.0, 0.0], [-2.0, -0.3, -0.7]]
    old = [[-0.9, -1.1, 0.0], [-1.5, -0.3, -1.0]]
    mask = [[1, 1, 0], [1, 1, 1]]
    clean = run(lp, old, [1.0, -0.5], mask, **kw)
    lp_bad = [[-0.5, -1.0, float("-inf")], [-2.0, -0.3, -0.7]]
    old_bad = [[-0.9, -1.1, float("nan")], [-1.5, -0.3, -1.0]]
    dirty = run(lp_bad, old_bad, [1.0, -0.5], mask, **kw)
    assert clean[0] == pytest.approx(dirty[0])
    assert torch.equal(torch.isfinite(dirty[1]), torch.ones(2, 3, dtype=torch.bool))
    assert torch.allclose(clean[1], dirty[1]) and float(dirty[1][0, 2]) == 0.0


@pytest.mark.parametrize("kw", LOSS_MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
def test_fully_masked_rows_are_left_out_and_an_empty_batch_is_zero(kw):
    lp, old = [[-0.5, -1.0], [-0.2, -0.4]], [[-0.9, -1.1], [-1.0, -1.0]]
    alone = run([lp[0]], [old[0]], [1.0], [[1, 1]], **kw)
    with_empty = run(lp, old, [1.0, 3.0], [[1, 1], [0, 0]], **kw)
    assert with_empty[0] == pytest.approx(alone[0])  # the empty row neither adds a term nor counts
    assert float(with_empty[1][1].abs().sum()) == 0.0
    empty = run(lp, old, [1.0, 3.0], [[0, 0], [0, 0]], **kw)
    assert empty[0] == 0.0 and float(empty[1].abs().sum()) == 0.0


@pytest.mark.parametrize("kw", LOSS_MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
def test_micro_batches_add_up_with_the_full_denominator(kw):
    g = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(4, 5, generator=g, dtype=D), -torch.rand(4, 5, generator=g, dtype=D)
    adv = torch.randn(4, generator=g, dtype=D)
    mask = (torch.rand(4, 5, generator=g) > 0.3).to(D)
    mask[:, 0] = 1
    full, _ = losses.policy_loss(lp, old, adv, mask, **kw)
    agg = kw.get("agg", "token-mean" if kw["loss_mode"] == "cispo" else "seq-mean-token-mean")
    kw = {**kw, "agg": agg}
    denom = float(mask.sum()) if agg == "token-mean" else 4.0
    parts = sum(losses.policy_loss(lp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], denominator=denom, **kw)[0]
                for i in (0, 2))
    full, _ = losses.policy_loss(lp, old, adv, mask, **kw)
    assert float(parts) == pytest.approx(float(full), abs=1e-12)


# ------------------------------------------------------------------------------------------------ extremes
@pytest.mark.parametrize("kw", LOSS_MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
@pytest.mark.parametrize("log_ratio", [1000.0, -1000.0])
def test_extreme_log_ratios_stay_finite(kw, log_ratio):
    for a in (1.0, -1.0):
        loss, grad, st = run([[-1.0 + log_ratio, -1.0]], [[-1.0, -1.0]], [a], **kw)
        assert math.isfinite(loss) and bool(torch.isfinite(grad).all()) and math.isfinite(st["ratio_max"])
        assert st["approx_kl"] >= 0


def test_extreme_ratio_gradients_have_the_right_sign():
    # CISPO: the weight is capped, the gradient stays -w A (one-sided cap 5 at A = +1 -> -5 / 2 tokens)
    _, g, _ = run([[999.0, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="cispo", eps_high=4.0, cispo_form="one-sided")
    assert float(g[0, 0]) == pytest.approx(-2.5)
    # SAPO: far past the band the gate closes (gradient -> 0), never flips sign
    _, g, _ = run([[999.0, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="sapo")
    assert -1e-12 <= -float(g[0, 0]) < 1e-6
    # GMPO with A < 0: the unclipped huge ratio keeps a positive gradient (pushes the token down), finite
    _, g, _ = run([[999.0, -1.0]], [[-1.0, -1.0]], [-1.0], **GMPO)
    assert float(g[0, 0]) > 0 and math.isfinite(float(g[0, 0]))


# ------------------------------------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize("kw, match", [
    (dict(loss_mode="ppo2"), "loss_mode"),
    (dict(loss_mode="cispo", cispo_form="both"), "cispo_form"),
    (dict(loss_mode="sapo", tau_pos=0.0), "tau_pos"),
    (dict(loss_mode="sapo", tau_neg=-1.0), "tau_neg"),
    (dict(loss_mode="cispo", level="sequence", agg="seq-mean-token-mean"), "level='token'"),
    (dict(loss_mode="sapo", dual_clip=3.0), "dual_clip"),
    (dict(loss_mode="gmpo", agg="token-mean"), "seq-mean-token-mean"),
    (dict(loss_mode="gmpo", eps_low=-0.1, agg="seq-mean-token-mean"), "eps_low"),
    (dict(loss_mode="cispo", eps_low=1.5), "eps_low"),
])
def test_bad_arguments_raise_naming_them(kw, match):
    x = torch.zeros(2, 3, dtype=D)
    with pytest.raises(ValueError, match=match):
        losses.policy_loss(x, x, torch.ones(2, dtype=D), torch.ones(2, 3, dtype=D), **kw)


def test_gmpo_needs_one_advantage_per_sequence():
    x = torch.zeros(2, 3, dtype=D)
    with pytest.raises(ValueError, match="advantages"):
        losses.policy_loss(x, x, torch.ones(2, 3, dtype=D), torch.ones(2, 3, dtype=D), **GMPO)
    with pytest.raises(ValueError, match="cispo form"):
        losses.cispo_loss(x, x, x, torch.ones(2, 3, dtype=D), form="three-sided")
    with pytest.raises(ValueError, match="tau_pos"):
        losses.sapo_loss(x, x, x, torch.ones(2, 3, dtype=D), tau_pos=0.0)


# --- GSPO and GSPO-token: the sequence levels of policy_loss ----------------------------------------------------------
EPS_LOW, EPS_HIGH = 3e-4, 4e-4  # GSPO's clip ranges (Zheng et al. 2025, section 5.1)


def gspo(lp, old, adv, mask, level, **kw):
    """Loss, gradient with respect to the log-probs, and stats of one GSPO(-token) evaluation."""
    lp = lp.detach().clone().requires_grad_(True)
    loss, stats = policy_loss(lp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, level=level,
                              agg="seq-mean-token-mean", **kw)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, stats


# --- the acceptance example, by hand ----------------------------------------------------------------------------
# seq 0: log-ratios [3e-4, -1e-4, 1e-4], mean 3e-4 / 3 = 1e-4, s_0 = e^1e-4 = 1.000100005
# seq 1: log-ratio [6e-4] (+ 2 padded positions), s_1 = e^6e-4 = 1.000600180
# clip range [1 - 3e-4, 1 + 4e-4] = [0.9997, 1.0004].
# seq 0, A = +1: s_0 inside the range -> term -A s_0 = -1.000100005.
# seq 1, A = -1: s_1 > 1.0004, but for A < 0 the pessimistic max(-A s, -A clip(s)) = max(1.000600180, 1.0004)
#   keeps the UNclipped branch -> term +1.000600180 (the clip never protects a ratio that makes things worse).
# GSPO loss = mean over the 2 sequences = (-1.000100005 + 1.000600180) / 2 = 0.000500175 / 2 = 0.00025009.
# gradient: d s_i / d logp_t = s_i / |y_i|, so
#   seq 0, each of its 3 tokens: -A s_0 / 3 / 2 = -1.000100005 / 6 = -0.166683334
#   seq 1, its 1 token:          -A s_1 / 1 / 2 = +1.000600180 / 2 = +0.500300090;  padded positions: 0.
GSPO_OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -3.0, -3.0]], dtype=D)
GSPO_LOG_RATIO = torch.tensor([[3e-4, -1e-4, 1e-4], [6e-4, 0.7, -0.9]], dtype=D)  # padding garbage must not count
GSPO_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=D)
GSPO_ADV = torch.tensor([1.0, -1.0], dtype=D)
S0, S1 = math.exp(1e-4), math.exp(6e-4)


def test_acceptance_sequence_ratios_are_the_hand_values():
    assert round(S0, 8) == 1.00010001 and round(S1, 8) == 1.00060018
    _, _, stats = gspo(GSPO_OLD + GSPO_LOG_RATIO, GSPO_OLD, GSPO_ADV, GSPO_MASK, "sequence")
    close_5e9(stats["ratio_min"], S0, atol=1e-12)
    close_5e9(stats["ratio_max"], S1, atol=1e-12)


@pytest.mark.parametrize("level", ["sequence", "sequence-token"])
def test_acceptance_loss_and_gradient(level):
    loss, grad, stats = gspo(GSPO_OLD + GSPO_LOG_RATIO, GSPO_OLD, GSPO_ADV, GSPO_MASK, level)
    close_5e9(loss, 0.00025009, atol=5e-9)
    close_5e9(loss, (-S0 + S1) / 2, atol=1e-12)
    close_5e9(grad, [[-0.166683, -0.166683, -0.166683], [0.500300, 0.0, 0.0]], atol=5e-7)
    close_5e9(grad, [[-S0 / 6] * 3, [S1 / 2, 0.0, 0.0]], atol=1e-12)
    # nothing clipped: seq 0 is inside the range; seq 1 is above it with A < 0, which keeps its gradient
    assert stats["clip_frac"] == 0.0


def test_gspo_clips_a_whole_sequence_and_counts_its_tokens():
    # flip the advantages to [-1, +1]: seq 0 (s_0 = 1.0001, inside the range) keeps its gradient;
    # seq 1 (s_1 = 1.0006 > 1.0004, A = +1) is clipped: term -1.0004, a constant -> gradient 0.
    # loss = (+1.000100005 - 1.0004) / 2 = -0.000149998; gradient seq 0: +1.000100005 / 6 = 0.166683334
    for level in ("sequence", "sequence-token"):
        loss, grad, stats = gspo(GSPO_OLD + GSPO_LOG_RATIO, GSPO_OLD, -GSPO_ADV, GSPO_MASK, level)
        close_5e9(loss, (S0 - 1.0004) / 2, atol=1e-12)
        close_5e9(grad, [[S0 / 6] * 3, [0.0, 0.0, 0.0]], atol=1e-12)
        # clip fraction per TOKEN, as the GSPO paper counts it: 1 of the 4 valid tokens lost its gradient
        assert stats["clip_frac_high"] == 0.25 and stats["clip_frac_low"] == 0.0


def test_gspo_token_with_per_token_advantages():
    # GSPO-token's reason to exist: A may vary along the sequence. Seq 0 with A_t = [2, 0, -1], seq 1 A = [-1]:
    # every token of seq i carries the value s_i and the gradient s_i * d logp_t (clipping decided by s_i):
    # seq 0 terms: -2 s_0, 0, +s_0 -> mean (-s_0) / 3; seq 1: +s_1; loss = (-s_0 / 3 + s_1) / 2
    # gradient seq 0: -A_t s_0 / 3 / 2 = [-2 s_0 / 6, 0, +s_0 / 6]; seq 1: +s_1 / 2
    adv = torch.tensor([[2.0, 0.0, -1.0], [-1.0, 5.0, 5.0]], dtype=D)
    loss, grad, _ = gspo(GSPO_OLD + GSPO_LOG_RATIO, GSPO_OLD, adv, GSPO_MASK, "sequence-token")
    close_5e9(loss, (-S0 / 3 + S1) / 2, atol=1e-12)
    close_5e9(grad, [[-2 * S0 / 6, 0.0, S0 / 6], [S1 / 2, 0.0, 0.0]], atol=1e-12)


def test_sequence_level_refuses_a_token_aggregation_and_token_advantages():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="agg must be 'seq-mean-token-mean'"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), level="sequence", agg="token-mean")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, lp, torch.zeros(2, 3), torch.ones(2, 3), level="sequence")
    with pytest.raises(ValueError, match="level='sequence'"):
        config.make_config("gspo", agg="token-mean")


# --- properties ----------------------------------------------------------------------------------------------------
@st.composite
def batches(draw, max_b=6, max_t=7):
    """Random (logprobs, old_logprobs, mask) with at least one valid token per row, and log-ratios in +-0.05."""
    B, T = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    scale = draw(st.sampled_from([1e-4, 1e-3, 5e-2]))
    lp = old + (torch.rand(B, T, generator=g, dtype=D) * 2 - 1) * scale
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(D)
    adv = torch.randn(B, generator=g, dtype=D)
    return lp, old, mask, adv


@settings(max_examples=60, deadline=None)
@given(batches())
def test_gspo_token_equals_gspo_for_per_sequence_advantages(batch):
    lp, old, mask, adv = batch
    loss_s, grad_s, stats_s = gspo(lp, old, adv, mask, "sequence")
    loss_t, grad_t, stats_t = gspo(lp, old, adv, mask, "sequence-token")
    close_5e9(loss_t, loss_s, atol=1e-12)
    close_5e9(grad_t, grad_s, atol=1e-12)
    assert stats_s["clip_frac"] == stats_t["clip_frac"]


@settings(max_examples=40, deadline=None)
@given(batches(max_b=6), st.integers(1, 5), st.sampled_from(["sequence", "sequence-token"]))
def test_micro_batches_with_the_full_denominator_add_up_to_the_batch_loss(batch, micro, level):
    lp, old, mask, adv = batch
    full, grad_full, _ = gspo(lp, old, adv, mask, level)
    n_seq = float((mask.sum(-1) > 0).sum())  # the trainer passes the whole minibatch's sequence count
    total, grads = torch.zeros((), dtype=D), []
    for rows in torch.arange(lp.shape[0]).split(micro):
        part, g, _ = gspo(lp[rows], old[rows], adv[rows], mask[rows], level, denominator=n_seq)
        total, grads = total + part, grads + [g]
    close_5e9(total, full, atol=1e-12)
    close_5e9(torch.cat(grads), grad_full, atol=1e-12)


@pytest.mark.parametrize("level", ["sequence", "sequence-token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_stay_finite_with_gradients_of_the_right_sign(level, dtype):
    # mean log-ratios of +1e4 and -1e4 nats (exp would overflow). Above 20 nats the ratio is exp's tangent at 20:
    # s = e^20 * (1 + 1e4 - 20) = 4.846800e12, finite. Below, exp itself: s = e^-1e4 = 0 (underflow).
    # Loss = mean over 3 sequences of max(-A s, -A clip(s)); d s / d lp_t = (tangent slope e^20) / 2 tokens.
    #   row 0, A = +1: s > 1 + eps, clipped branch -> gradient 0 (exactly 0 too).
    #   row 0, A = -1: unclipped branch -A s -> gradient e^20 / 2 / 3 = 80860865.9 > 0 per token; the exact one,
    #     e^1e4 / 6, is not representable but positive too (a clamp used to give 0 here).
    #   row 1: A = +1 unclipped, gradient -e^-1e4 / 6 = -0 (underflow); A = -1 clipped at 1 - eps, 0.
    # GSPO-token has the same gradient: it scales each token's exponent by the tangent slope over s.
    old = torch.zeros(3, 2, dtype=dtype)
    lp = torch.tensor([[1e4, 1e4], [-1e4, -1e4], [1e-3, 0.0]], dtype=dtype)
    for adv, g0 in (([1.0, -1.0, 1.0], 0.0), ([-1.0, 1.0, -1.0], math.exp(20) / 6)):
        lp_ = lp.clone().requires_grad_(True)
        loss, stats = policy_loss(lp_, old, torch.tensor(adv, dtype=dtype), torch.ones(3, 2, dtype=dtype),
                                  eps_low=EPS_LOW,
                                  eps_high=EPS_HIGH, level=level, agg="seq-mean-token-mean")
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(lp_.grad).all()
        torch.testing.assert_close(lp_.grad[0].double(), torch.tensor([g0, g0], dtype=D), rtol=1e-6, atol=0)
        assert torch.all(lp_.grad[1] == 0)
        assert all(math.isfinite(v) for v in stats.values())
        close_5e9(stats["ratio_max"] / (math.exp(20) * (1 + 1e4 - 20)), 1.0, atol=1e-6)


def test_approx_kl_is_the_k3_estimate_of_kl_old_to_new():
    # one token, log-ratio log(pi/pi_old) = 0.5: k3 = (r - 1) - log r with r = e^0.5 = 1.648721 -> 0.148721
    # (the reversed r = e^-0.5 would give 0.106531)
    _, stats = policy_loss(torch.tensor([[-0.5]]), torch.tensor([[-1.0]]), torch.ones(1), torch.ones(1, 1))
    assert abs(stats["approx_kl"] - 0.148721) < 1e-6


# --- policy_loss(is_weights=...): a sampler correction's weights in each loss (the weights: test_importance.py) -------
def test_policy_loss_is_weights_checks_its_input():
    logprobs, mask = torch.zeros(2, 3, **F64), torch.ones(2, 3, **F64)
    adv = torch.tensor([1.0, -1.0], **F64)
    with pytest.raises(ValueError, match="is_weights must have shape"):
        losses.policy_loss(logprobs, logprobs, adv, mask, is_weights=torch.ones(3, **F64))
    with pytest.raises(ValueError, match="only \\(B,\\) at level='sequence'"):
        losses.policy_loss(logprobs, logprobs, adv, mask, level="sequence", agg="seq-mean-token-mean",
                           is_weights=torch.ones(2, 3, **F64))
    with pytest.raises(ValueError, match="finite and >= 0"):
        losses.policy_loss(logprobs, logprobs, adv, mask, is_weights=torch.tensor([1.0, -0.5], **F64))
    with pytest.raises(ValueError, match="finite and >= 0"):
        losses.policy_loss(logprobs, logprobs, adv, mask, is_weights=torch.tensor([1.0, math.nan], **F64))


# ------------------------------------------------------------------------------------------------ into the loss
def _random_batch(seed=0, B=6, T=5):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, generator=g, **F64) - 1.5
    logprobs = (old + 0.4 * torch.randn(B, T, generator=g, **F64)).requires_grad_(True)  # ratios leave the band
    mask = torch.ones(B, T, **F64)
    mask[0, 3:], mask[2, 1:] = 0, 0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], **F64)
    w_tok = torch.rand(B, T, generator=g, **F64) * 2.5
    w_tok[1, 2] = 0.0  # a masked token (MIS)
    w_seq = torch.tensor([0.3, 2.0, 0.0, 1.0, 1.7, 0.9], **F64)
    return logprobs, old, adv, mask, w_tok, w_seq


def _per_token_terms(logprobs, old, adv, mode, eps_low=0.2, eps_high=0.2):
    """Each loss's per-token term, written out from its equation (losses.py), for (B,) advantages."""
    a = adv.unsqueeze(1)
    r = torch.exp(logprobs - old)
    if mode == "clip":
        return torch.maximum(-a * r, -a * r.clamp(1 - eps_low, 1 + eps_high))
    if mode == "cispo":
        return -r.clamp(1 - eps_low, 1 + eps_high).detach() * a * logprobs
    tau = torch.full_like(r, 1.05).masked_fill(a > 0, 1.0)  # sapo, in float64 (a where() of two floats is float32)
    return -torch.sigmoid(tau * (r - 1)) * 4 / tau * a


@pytest.mark.parametrize("mode, agg", [("clip", "token-mean"), ("clip", "seq-mean-token-mean"),
                                       ("clip", "seq-mean-token-sum-norm"), ("cispo", "token-mean"),
                                       ("sapo", "seq-mean-token-mean")])
@pytest.mark.parametrize("weights", ["token", "sequence"])
def test_policy_loss_is_weights_multiplies_each_term_before_aggregation(mode, agg, weights):
    """policy_loss(is_weights=w) == aggregate(w * per-token term): value and gradient (float64, 1e-12), for token
    and sequence weights, with ratios outside the band (clipped terms) and a weight-0 token."""
    logprobs, old, adv, mask, w_tok, w_seq = _random_batch()
    w = w_tok if weights == "token" else w_seq
    loss, _ = losses.policy_loss(logprobs, old, adv, mask, loss_mode=mode, agg=agg, is_weights=w)
    (grad,) = torch.autograd.grad(loss, logprobs)
    expected = losses.aggregate(importance.apply_weights(_per_token_terms(logprobs, old, adv, mode), w, mask), mask,
                                agg)
    (expected_grad,) = torch.autograd.grad(expected, logprobs)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)
    unweighted, _ = losses.policy_loss(logprobs, old, adv, mask, loss_mode=mode, agg=agg)
    assert abs(float(loss.detach() - unweighted.detach())) > 1e-3  # the weights did something


def test_policy_loss_is_weights_at_the_sequence_level_gspo_and_gmpo():
    """One term per sequence: GSPO's mean_i w_i max(-A_i s_i, -A_i clip(s_i)) and GMPO's mean_i w_i (-A_i g_i);
    rows without a token are left out (row 2 has one token here)."""
    logprobs, old, adv, mask, _, w_seq = _random_batch()
    n = mask.sum(-1)
    mean_lr = ((logprobs - old) * mask).sum(-1) / n  # (B,)
    s = torch.exp(mean_lr)
    gspo = torch.maximum(-adv * s, -adv * s.clamp(1 - 3e-4, 1 + 4e-4))
    loss, _ = losses.policy_loss(logprobs, old, adv, mask, level="sequence", eps_low=3e-4, eps_high=4e-4,
                                 agg="seq-mean-token-mean", is_weights=w_seq)
    torch.testing.assert_close(loss, (w_seq * gspo).mean(), rtol=0, atol=1e-12)
    lr = logprobs - old  # GMPO, log-space clip 0.4 / 0.4 on the pessimistic side
    c = lr.clamp(-0.4, 0.4)
    m = torch.where(adv.unsqueeze(1) > 0, torch.minimum(lr, c), torch.maximum(lr, c))
    gmpo = -adv * torch.exp((m * mask).sum(-1) / n)
    loss, _ = losses.policy_loss(logprobs, old, adv, mask, loss_mode="gmpo", eps_low=0.4, eps_high=0.4,
                                 agg="seq-mean-token-mean", is_weights=w_seq)
    (grad,) = torch.autograd.grad(loss, logprobs)
    (expected_grad,) = torch.autograd.grad((w_seq * gmpo).mean(), logprobs)
    torch.testing.assert_close(loss, (w_seq * gmpo).mean(), rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(), dict(level="sequence", agg="seq-mean-token-mean"),
                                dict(level="sequence-token"), dict(loss_mode="cispo"), dict(loss_mode="sapo"),
                                dict(loss_mode="gmpo", agg="seq-mean-token-mean"), dict(dual_clip=3.0)])
def test_policy_loss_unit_weights_change_nothing(kw):
    logprobs, old, adv, mask, _, _ = _random_batch(seed=1)
    plain, _ = losses.policy_loss(logprobs, old, adv, mask, **kw)
    ones, _ = losses.policy_loss(logprobs, old, adv, mask, is_weights=torch.ones(6, **F64), **kw)
    assert torch.equal(plain, ones)
    half, _ = losses.policy_loss(logprobs, old, adv, mask, is_weights=torch.full((6,), 0.5, **F64), **kw)
    torch.testing.assert_close(half, 0.5 * plain, rtol=1e-12, atol=0)


# --- the three policy-loss functions behind policy_loss ---------------------------------------------------------
def _inputs():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -3.0, -3.0]], dtype=torch.float64)
    log_ratio = torch.tensor([[3e-4, -1e-4, 1e-4], [6e-4, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    return old, old + log_ratio, mask, torch.tensor([1.0, -1.0], dtype=torch.float64)


# paper-index: losses.sequence_ratio
def test_sequence_ratio_is_the_geometric_mean_by_hand():
    old, new, mask, _ = _inputs()
    # row 0: mean log-ratio (3e-4 - 1e-4 + 1e-4) / 3 = 1e-4; row 1: 6e-4 (one valid token)
    torch.testing.assert_close(losses.sequence_ratio(new, old, mask),
                               torch.tensor([math.exp(1e-4), math.exp(6e-4)], dtype=torch.float64))


# paper-index: losses.gspo_loss
def test_gspo_loss_by_hand_and_through_the_dispatcher():
    old, new, mask, adv = _inputs()
    # s = [1.00010001, 1.00060018]; seq 0 inside [1 - 3e-4, 1 + 4e-4]: -1 * s0; seq 1 above, but A < 0 keeps the
    # unclipped branch: +s1. Mean over 2 sequences: (-1.00010001 + 1.00060018) / 2 = 0.00025009
    loss, _ = losses.gspo_loss(new, old, adv, mask, eps_low=3e-4, eps_high=4e-4)
    assert loss.item() == pytest.approx((-math.exp(1e-4) + math.exp(6e-4)) / 2, abs=1e-12)
    via, _ = losses.policy_loss(new, old, adv, mask, eps_low=3e-4, eps_high=4e-4, level="sequence",
                                agg="seq-mean-token-mean")
    assert via.item() == loss.item()


# paper-index: losses.gspo_token_loss
def test_gspo_token_loss_equals_gspo_for_per_sequence_advantages():
    old, new, mask, adv = _inputs()
    grads = []
    for fn in (lambda x: losses.gspo_loss(x, old, adv, mask, eps_low=3e-4, eps_high=4e-4)[0],
               lambda x: losses.gspo_token_loss(x, old, adv.unsqueeze(1).expand(2, 3), mask, eps_low=3e-4,
                                                eps_high=4e-4)[0]):
        x = new.clone().requires_grad_(True)
        fn(x).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)


# paper-index: losses.token_clip_loss
def test_token_clip_loss_by_hand():
    # one token, A = +1: on-policy ratio 1 -> loss -1; log-ratio 0.2 -> ratio 1.2214 clipped at 1.2 -> loss -1.2
    old = torch.tensor([[-1.0]])
    for new, expected in ((-1.0, -1.0), (-0.8, -1.2)):
        loss, _ = losses.token_clip_loss(torch.tensor([[new]]), old, torch.ones(1, 1), torch.ones(1, 1), eps_low=0.2,
                                         eps_high=0.2,
                                         agg="token-mean")
        assert loss.item() == pytest.approx(expected, abs=1e-6)


# --- defects of issue 35 and the copy a reader takes -----------------------------------------------------------------
def test_sapo_temperatures_keep_the_inputs_float64():
    """r = e^-0.5, A = -1, tau_neg 1.05: loss = (4 / 1.05) sigmoid(1.05 (e^-0.5 - 1)) in float64. A torch.where of
    two Python floats built float32 temperatures and gave 1.5167954188682087 (issue 35, defect 3)."""
    from minirl.losses import sapo_loss

    expected = (4 / 1.05) / (1 + math.exp(-1.05 * (math.exp(-0.5) - 1)))  # = 1.5167953328585435
    lp = torch.tensor([[-0.5]], dtype=torch.float64, requires_grad=True)
    loss, _ = sapo_loss(lp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[-1.0]], dtype=torch.float64),
                        torch.ones(1, 1, dtype=torch.float64))
    assert loss.dtype == torch.float64 and loss.item() == expected


_COPY_SETTINGS = {"token_clip_loss": dict(level="token", agg="seq-mean-token-mean", dual_clip=3.0),
                  "gspo_loss": dict(level="sequence", agg="seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4),
                  "gspo_token_loss": dict(level="sequence-token", agg="token-mean", eps_low=3e-4, eps_high=4e-4),
                  "cispo_loss": dict(loss_mode="cispo", agg="token-mean", cispo_form="one-sided", eps_high=4.0),
                  "sapo_loss": dict(loss_mode="sapo", agg="seq-mean-token-mean"),
                  "gmpo_loss": dict(loss_mode="gmpo", agg="seq-mean-token-mean", eps_low=0.4, eps_high=0.4)}


@pytest.mark.parametrize("family", list(_COPY_SETTINGS))
def test_each_loss_family_runs_alone_with_the_helpers_its_docstring_names(family):
    """What the module docstring promises a reader who copies one loss into a torch-only file: the function, the
    helpers its "Copy with" line names, and checks.py's guards are all it needs, and the copy gives policy_loss's
    value and gradient bit for bit."""
    import inspect
    import re

    from minirl import aggregation, checks, clip_alternatives, losses

    def find(name):  # the loss modules and the aggregation they share
        return next(getattr(m, name) for m in (losses, clip_alternatives, aggregation) if hasattr(m, name))

    fn = find(family)
    helpers_line = re.search(r"Copy with: (.+?)\.\n", fn.__doc__).group(1)
    names = [family, *(n.strip() for n in helpers_line.split(","))]
    namespace = {"torch": torch, "Tensor": torch.Tensor, **{n: getattr(checks, n) for n in (
        "zero_outside", "exp_linear_above", "LOG_RATIO_LINEAR_ABOVE", "same_shape", "ndim", "choice")}}
    source = "\n\n".join(inspect.getsource(find(n)) if callable(find(n)) else f"{n} = {find(n)!r}"
                         for n in reversed(names))
    exec(compile("from __future__ import annotations\n" + source, f"copy of {family}", "exec"), namespace)
    g = torch.Generator().manual_seed(0)
    B, T = 4, 5
    logprobs = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2).requires_grad_()
    old = logprobs.detach() + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    settings = _COPY_SETTINGS[family]
    want, _ = policy_loss(logprobs, old, adv, mask, **settings)
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in {"eps_low": 0.2, "eps_high": 0.2, **settings}.items() if k in params}
    if "form" in params:
        kwargs["form"] = settings["cispo_form"]
    per_seq = family in ("gspo_loss", "gmpo_loss")
    a = adv if per_seq else adv.unsqueeze(1).expand(B, T)
    lp, old0 = torch.where(mask > 0, logprobs, 0.0), torch.where(mask > 0, old, 0.0)  # what policy_loss hands on
    got, _ = namespace[family](lp, old0, a, mask, **kwargs)
    assert got.item() == want.item()
    (g_want,), (g_got,) = torch.autograd.grad(want, logprobs), torch.autograd.grad(got, logprobs)
    assert torch.equal(g_want, g_got)


def test_policy_loss_names_a_tensor_on_another_device():
    # the first GPU run: a reward tensor made with torch.tensor(...) stayed on the CPU beside CUDA log-probs, and
    # torch's own error named no argument. A "meta" tensor stands in for another device on a CPU-only machine
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"advantages is on meta but logprobs is on cpu"):
        losses.policy_loss(lp, lp, torch.zeros(2, device="meta"), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask is on meta but logprobs is on cpu"):
        losses.policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3, device="meta"))
