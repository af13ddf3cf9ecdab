"""Masked positions can hold anything: every public math function that takes a mask gives the value of its valid
entries alone, and finite gradients, when the padding holds inf, -inf or NaN in every masked position.

(x * mask) would turn an inf there into NaN (inf * 0); a pad token's log-prob of -inf is legitimate. Each test
fills EVERY masked position of EVERY float argument with the garbage value and checks the value computed by hand

from the valid entries, and that the gradient is finite and 0 on the padding.
"""

import math
from functools import partial

import helpers
import pytest
import torch

from minirl import advantages, kl, losses, rewards, rollout

D = torch.float64
GARBAGE = [math.inf, -math.inf, math.nan]

# two rows of valid tokens and one row with none: row 0 has 2 tokens, row 1 has 1, row 2 has 0
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)


def fill(valid_rows, garbage, mask=MASK, grad=False):
    """A (B, T) tensor with the given valid values (None where masked) and ``garbage`` in every masked position."""
    x = torch.tensor([[garbage if v is None else v for v in row] for row in valid_rows], dtype=D)
    assert torch.equal(torch.isfinite(x) | (mask == 0), torch.ones_like(mask, dtype=torch.bool))
    return x.requires_grad_(grad)


close = partial(helpers.close, atol=5e-7, dtype=D)  # the 6 decimals the expectations are written with


def finite_and_zero_on_padding(grad, mask=MASK):
    assert torch.isfinite(grad).all(), grad
    assert torch.equal(grad[mask == 0], torch.zeros_like(grad[mask == 0])), grad


def test_the_issue_example_x_times_mask_is_nan():
    # log-probs [[-1, +inf]], mask [[1, 0]]: the product -1 * 1 + inf * 0 = NaN; the masked loss must be finite
    assert math.isnan((torch.tensor([[-1.0, math.inf]]) * torch.tensor([[1.0, 0.0]])).sum())
    lp = torch.tensor([[-1.0, math.inf]], requires_grad=True)
    loss, _ = losses.policy_loss(lp, torch.tensor([[-1.0, math.inf]]), torch.tensor([2.0]), torch.tensor([[1, 0]]))
    loss.backward()
    # on-policy, A = 2: ratio 1, per-token loss -2 * 1 = -2, token-mean over 1 token = -2; gradient -A r = -2
    close(loss, -2.0)
    close(lp.grad, [[-2.0, 0.0]])


# --- losses ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("garbage", GARBAGE)
@pytest.mark.parametrize("mode, expected, weights", [
    # per-token valid values: row 0 [2, 4], row 1 [6], row 2 none
    ("token-mean", (2 + 4 + 6) / 3, [[1 / 3, 1 / 3], [1 / 3]]),  # = 4.0
    ("seq-mean-token-mean", (3 + 6) / 2, [[1 / 4, 1 / 4], [1 / 2]]),  # row means 3 and 6 -> 4.5; row 2 left out
    ("seq-mean-token-sum", (6 + 6) / 2, [[1 / 2, 1 / 2], [1 / 2]]),  # row sums 6 and 6 -> 6.0
    ("seq-mean-token-sum-norm", (6 / 3 + 6 / 3) / 2, [[1 / 6, 1 / 6], [1 / 6]]),  # max_tokens = T = 3 -> 2.0
])
def test_aggregate(garbage, mode, expected, weights):
    x = fill([[2.0, 4.0, None], [6.0, None, None], [None, None, None]], garbage, grad=True)
    value = losses.aggregate(x, MASK, mode)
    value.backward()
    close(value, expected)
    close(x.grad, [[*weights[0], 0.0], [weights[1][0], 0.0, 0.0], [0.0, 0.0, 0.0]])
    # a fully masked batch of garbage gives 0, with a zero gradient
    y = torch.full((2, 3), garbage, dtype=D, requires_grad=True)
    value = losses.aggregate(y, torch.zeros(2, 3), mode)
    value.backward()
    assert value.item() == 0.0 and torch.equal(y.grad, torch.zeros(2, 3, dtype=D))


# log-ratios: row 0 [0.1, -0.1], row 1 [0.05]; advantages +1 (row 0), -1 (row 1), garbage (row 2, no token)
# ratios e^0.1 = 1.105171, e^-0.1 = 0.904837, e^0.05 = 1.051271, all inside [0.8, 1.2]: unclipped, per token -A r
# token level, token-mean: (-1.105171 - 0.904837 + 1.051271) / 3 = -0.958737 / 3 = -0.319579
#   d/dlogprobs = -A r / 3: [-0.368390, -0.301612], [+0.350424]
R0, R1, R2 = math.exp(0.1), math.exp(-0.1), math.exp(0.05)
TOKEN_LOSS = (-R0 - R1 + R2) / 3
TOKEN_GRAD = [[-R0 / 3, -R1 / 3, 0.0], [R2 / 3, 0.0, 0.0], [0.0, 0.0, 0.0]]
# sequence level (GSPO): row 0 mean log-ratio 0 -> s = 1, term -1; row 1 s = e^0.05, A = -1, term +1.051271;
#   loss = (-1 + 1.051271) / 2 = 0.025636 (row 2 left out). d s / d lp_t = s / |y|: row 0 -A s / 2 / 2 = -0.25
#   per token; row 1 -A s / 1 / 2 = 0.525636. GSPO-token (advantages constant per sequence) has the same.
SEQ_LOSS = (-1 + R2) / 2
SEQ_GRAD = [[-0.25, -0.25, 0.0], [R2 / 2, 0.0, 0.0], [0.0, 0.0, 0.0]]


def policy_inputs(garbage, per_token_advantages=False):
    old = fill([[-1.0, -2.0, None], [-0.5, None, None], [None, None, None]], garbage)
    lp = fill([[-0.9, -2.1, None], [-0.45, None, None], [None, None, None]], garbage, grad=True)
    adv = (fill([[1.0, 1.0, None], [-1.0, None, None], [None, None, None]], garbage) if per_token_advantages
           else torch.tensor([1.0, -1.0, garbage], dtype=D))
    return lp, old, adv


@pytest.mark.parametrize("garbage", GARBAGE)
@pytest.mark.parametrize("level, agg, per_token_advantages, expected, grad", [
    ("token", "token-mean", False, TOKEN_LOSS, TOKEN_GRAD),
    ("token", "token-mean", True, TOKEN_LOSS, TOKEN_GRAD),
    ("sequence", "seq-mean-token-mean", False, SEQ_LOSS, SEQ_GRAD),  # GSPO takes one advantage per sequence
    ("sequence-token", "seq-mean-token-mean", False, SEQ_LOSS, SEQ_GRAD),
    ("sequence-token", "seq-mean-token-mean", True, SEQ_LOSS, SEQ_GRAD),
])
def test_policy_loss_at_each_level(garbage, level, agg, per_token_advantages, expected, grad):
    lp, old, adv = policy_inputs(garbage, per_token_advantages)
    loss, stats = losses.policy_loss(lp, old, adv, MASK, level=level, agg=agg, dual_clip=3.0)
    loss.backward()
    close(loss, expected)
    close(lp.grad, grad)
    finite_and_zero_on_padding(lp.grad)
    assert all(math.isfinite(v) for v in stats.values()), stats
    if level == "token":
        # approx_kl: mean over the 3 valid tokens of e^x - 1 - x at x = 0.1, -0.1, 0.05
        k = [math.exp(x) - 1 - x for x in (0.1, -0.1, 0.05)]  # 0.005171, 0.004837, 0.001271
        close(stats["approx_kl"], sum(k) / 3)
        close(stats["ratio_max"], R0)


@pytest.mark.parametrize("garbage", GARBAGE)
def test_the_three_level_functions_and_sequence_ratio(garbage):
    lp, old, adv = policy_inputs(garbage, per_token_advantages=True)
    mask = MASK
    loss, _ = losses.token_clip_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2, agg="token-mean", dual_clip=3.0)
    (g,) = torch.autograd.grad(loss, lp)
    close(loss, TOKEN_LOSS)
    close(g, TOKEN_GRAD)
    loss, _ = losses.gspo_token_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2, agg="seq-mean-token-mean",
                                     dual_clip=3.0)
    (g,) = torch.autograd.grad(loss, lp)
    close(loss, SEQ_LOSS)
    close(g, SEQ_GRAD)
    loss, _ = losses.gspo_loss(lp, old, torch.tensor([1.0, -1.0, garbage], dtype=D), mask, eps_low=0.2, eps_high=0.2,
                               dual_clip=3.0)
    (g,) = torch.autograd.grad(loss, lp)
    close(loss, SEQ_LOSS)
    close(g, SEQ_GRAD)
    # s = [e^0, e^0.05, 1 for the row with no token]
    s = losses.sequence_ratio(lp, old, mask)
    close(s, [1.0, R2, 1.0])
    (g,) = torch.autograd.grad(s.sum(), lp)
    close(g, [[0.5, 0.5, 0.0], [R2, 0.0, 0.0], [0.0, 0.0, 0.0]])  # d s / d lp_t = s / |y|


@pytest.mark.parametrize("garbage", GARBAGE)
@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss(garbage, clip):
    # valid: values [1, 2], [3]; returns [0, 0], [1]; old values = values (so the clipped branch equals the other)
    # 0.5 (V - R)^2 = 0.5, 2, 2 -> token-mean 4.5 / 3 = 1.5; d/dV = (V - R) / 3 = [1/3, 2/3], [2/3]
    values = fill([[1.0, 2.0, None], [3.0, None, None], [None, None, None]], garbage, grad=True)
    old = fill([[1.0, 2.0, None], [3.0, None, None], [None, None, None]], garbage)
    returns = fill([[0.0, 0.0, None], [1.0, None, None], [None, None, None]], garbage)
    loss, stats = losses.value_loss(values, old, returns, MASK, clip=clip)
    loss.backward()
    close(loss, 1.5)
    close(values.grad, [[1 / 3, 2 / 3, 0.0], [2 / 3, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(stats["value_mean"], (1 + 2 + 3) / 3)
    assert stats["value_clip_frac"] == 0.0


# --- kl -------------------------------------------------------------------------------------------------------------
# valid: logprobs [-1, -2], [-0.5]; ref [-1.5, -2], [-1]. log r = ref - logprobs = [-0.5, 0], [-0.5]
# k1 = logprobs - ref = [0.5, 0], [0.5]; k2 = 0.5 * [0.25, 0], [0.25] = [0.125, 0], [0.125];
# k3 = e^-0.5 - 1 + 0.5 = 0.106531 for the two tokens at -0.5, 0 for the other.
# d k / d logprobs: k1 1; k2 (logprobs - ref) = 0.5, 0, 0.5; k3 1 - e^(log r) = 1 - 0.606531 = 0.393469, 0, 0.393469
K3 = math.exp(-0.5) - 0.5
KL_CASES = {"k1": ([[0.5, 0.0], [0.5]], [[1.0, 1.0], [1.0]]),
            "k2": ([[0.125, 0.0], [0.125]], [[0.5, 0.0], [0.5]]),
            "k3": ([[K3, 0.0], [K3]], [[1 - math.exp(-0.5), 0.0], [1 - math.exp(-0.5)]])}


def pad(rows):
    """[[a, b], [c]] -> (3, 3) with zeros on the padding of MASK."""
    return [[rows[0][0], rows[0][1], 0.0], [rows[1][0], 0.0, 0.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("garbage", GARBAGE)
@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
def test_kl_with_a_mask(garbage, estimator):
    value, grad = KL_CASES[estimator]
    lp = fill([[-1.0, -2.0, None], [-0.5, None, None], [None, None, None]], garbage, grad=True)
    ref = fill([[-1.5, -2.0, None], [-1.0, None, None], [None, None, None]], -garbage)  # the other sign
    est = kl.kl_estimate(lp, ref, estimator=estimator, mask=MASK)
    close(est, pad(value))
    in_loss = kl.kl_in_loss(lp, ref, estimator=estimator, mask=MASK)
    close(in_loss, pad(value))
    total = losses.aggregate(in_loss, MASK, "token-mean")  # what the loop adds to the loss
    (g,) = torch.autograd.grad(total, lp)
    close(g, [[x / 3 for x in row] for row in pad(grad)])
    finite_and_zero_on_padding(g)
    # in the reward: r_t - beta * k, beta 0.1, on zero rewards that hold garbage on the padding too
    token_rewards = fill([[0.0, 0.0, None], [0.0, None, None], [None, None, None]], garbage)
    shaped = kl.kl_in_reward(token_rewards, lp, ref, beta=0.1, estimator=estimator, mask=MASK)
    close(torch.where(MASK > 0, shaped, 0.0), [[-0.1 * x for x in row] for row in pad(value)])


# --- advantages -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("garbage", GARBAGE)
def test_gae(garbage):
    # gamma 1, lam 0.95. row 0: rewards [0, 1], values [0.5, 0.6]: delta_1 = 1 + 0 - 0.6 = 0.4 -> A_1 = 0.4;
    #   delta_0 = 0 + 0.6 - 0.5 = 0.1 -> A_0 = 0.1 + 0.95 * 0.4 = 0.48; returns A + V = [0.98, 1.0].
    # row 1: reward [2], value [0.4]: A = 2 - 0.4 = 1.6, return 2.0. row 2: nothing.
    r = fill([[0.0, 1.0, None], [2.0, None, None], [None, None, None]], garbage, grad=True)
    v = fill([[0.5, 0.6, None], [0.4, None, None], [None, None, None]], garbage)
    a, ret = advantages.gae(r, v, MASK, gamma=1.0, lam=0.95)
    close(a, [[0.48, 0.4, 0.0], [1.6, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(ret, [[0.98, 1.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    (g,) = torch.autograd.grad(a.sum(), r)
    # d(A_0 + A_1) / d r_0 = 1; / d r_1 = 0.95 + 1 = 1.95; row 1: 1
    close(g, [[1.0, 1.95, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("garbage", GARBAGE)
def test_whiten(garbage):
    # valid [1, 3], [5]: mean 3, unbiased var (4 + 0 + 4) / 2 = 4, std 2 -> [-1, 0], [1] (eps 1e-8 is negligible)
    x = fill([[1.0, 3.0, None], [5.0, None, None], [None, None, None]], garbage, grad=True)
    w = advantages.whiten(x, MASK)
    close(w, [[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-6)
    # without the mean shift: (x - 3) / 2 + 3 = [2, 3], [4]
    close(advantages.whiten(x, MASK, shift_mean=False), [[2.0, 3.0, 0.0], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
          atol=1e-6)
    (g,) = torch.autograd.grad((w * torch.tensor([[1.0, 0.0, 0.0]] * 3, dtype=D)).sum(), x)
    finite_and_zero_on_padding(g)


@pytest.mark.parametrize("garbage", GARBAGE)
def test_group_advantages_to_go(garbage):
    # two rows, one group (G = 2), scale "none": scores [1, 0] -> task part [0.5, -0.5].
    # penalties row 0 [0.1, 0.2], row 1 [0.3]; to-go C: row 0 [0.3, 0.2], row 1 [0.3]; group mean of C_0 = 0.3.
    # A = task - (C_t - 0.3): row 0 [0.5 - 0, 0.5 + 0.1] = [0.5, 0.6]; row 1 [-0.5 - 0] = [-0.5]
    mask = MASK[:2]
    pen = fill([[0.1, 0.2, None], [0.3, None, None]], garbage, mask=mask, grad=True)
    a = advantages.group_advantages_to_go(torch.tensor([1.0, 0.0]), pen, mask, 2, scale="none")
    close(a, [[0.5, 0.6, 0.0], [-0.5, 0.0, 0.0]])
    (g,) = torch.autograd.grad(a.sum(), pen)
    finite_and_zero_on_padding(g, mask)


# paper-index: advantages.explained_variance
@pytest.mark.parametrize("garbage", GARBAGE)
def test_explained_variance(garbage):
    # valid returns [1, 0, 1, 0], values 0.5: Var(r - v) = Var(r) -> 1 - 1 = 0.0; values = returns -> 1.0
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=D)
    ret = fill([[1.0, 0.0, None], [1.0, 0.0, None]], garbage, mask=mask)
    val = fill([[0.5, 0.5, None], [0.5, 0.5, None]], -garbage, mask=mask)
    assert advantages.explained_variance(val, ret, mask) == pytest.approx(0.0, abs=1e-12)
    assert advantages.explained_variance(ret, ret, mask) == 1.0


# --- rewards, rollout -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("garbage", GARBAGE)
def test_token_level_rewards(garbage):
    # the row with no valid token gets nothing, whatever its score
    out = rewards.token_level_rewards(torch.tensor([2.0, 5.0, garbage]), MASK)
    close(out, [[0.0, 2.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("garbage", GARBAGE)
def test_sequence_logprobs(garbage):
    # sums [-1 - 2, -0.5] = [-3, -0.5], means [-1.5, -0.5]; gradient 1 (sum) or 1 / |y| (mean) on valid tokens
    mask = MASK[:2]
    lp = fill([[-1.0, -2.0, None], [-0.5, None, None]], garbage, mask=mask, grad=True)
    s = rollout.sequence_logprobs(lp, mask, reduction="sum")
    close(s, [-3.0, -0.5])
    (g,) = torch.autograd.grad(s.sum(), lp)
    close(g, [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    m = rollout.sequence_logprobs(lp, mask, reduction="mean")
    close(m, [-1.5, -0.5])
    (g,) = torch.autograd.grad(m.sum(), lp)
    close(g, [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
