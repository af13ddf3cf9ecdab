"""Exercises of chapter 02: PPO.

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _reference as ref
from ._core import (
    CLAMPED,
    NEEDS_FINITE,
    OLD_DETACHED,
    _as_tensor,
    _case,
    _exercise,
    _expect,
    _expect_finite,
    _grad,
    _leaf,
    _loss,
    _Mismatch,
    _prefix_mask,
    _t,
)

# ================================================================================================================
# 02 · PPO


ex = _exercise("gae", "02", "gae(rewards, values, mask, *, gamma=1.0, lam=0.95) -> (advantages, returns)",
               "minirl.advantages.gae", ("minirl.advantages.gae",))
PAD_VALUE = ("the value after a row's last valid token is 0 (the episode ended there): GAE must not bootstrap "
             "from the critic's value of a padding position")
LAM_ONLY = "the recursion carries A_{t+1} back with gamma * lam, not lam alone (visible once gamma < 1)"
RETURNS_MC = ("returns are advantages + values (the critic's target), not the discounted reward-to-go; the two "
              "differ when lam < 1")


@_case(ex, "one row by hand, the defaults (gamma 1, lam 0.95)", "A_t = delta_t + gamma * lam * A_{t+1}, computed "
       "backwards from the last token, with delta_t = r_t + gamma * V_{t+1} - V_t; the defaults are gamma = 1, "
       "lam = 0.95")
def _(fn, gen):
    adv, ret = fn(_t([[0.0, 0.0, 1.0]]), _t([[0.5, 0.6, 0.7]]), _t([[1, 1, 1]]))
    # deltas (0.1, 0.1, 0.3); A_2 = 0.3, A_1 = 0.1 + 0.95 * 0.3 = 0.385, A_0 = 0.1 + 0.95 * 0.385 = 0.46575
    _expect(adv, [[0.46575, 0.385, 0.3]], what="advantages")
    _expect(ret, [[0.96575, 0.985, 1.0]], [([[1.0, 1.0, 1.0]], RETURNS_MC)], what="returns")  # A + V


@_case(ex, "one row by hand, gamma 0.9, lam 0.8", LAM_ONLY)
def _(fn, gen):
    adv, ret = fn(_t([[0.0, 0.0, 1.0]]), _t([[0.5, 0.6, 0.7]]), _t([[1, 1, 1]]), gamma=0.9, lam=0.8)
    # deltas: 0 + 0.9*0.6 - 0.5 = 0.04, 0 + 0.9*0.7 - 0.6 = 0.03, 1 - 0.7 = 0.3
    # A_2 = 0.3, A_1 = 0.03 + 0.72 * 0.3 = 0.246, A_0 = 0.04 + 0.72 * 0.246 = 0.21712
    # lam alone: A_1 = 0.03 + 0.8 * 0.3 = 0.27, A_0 = 0.04 + 0.8 * 0.27 = 0.256
    _expect(adv, [[0.21712, 0.246, 0.3]], [([[0.256, 0.27, 0.3]], LAM_ONLY)], what="advantages")
    # returns A + V = (0.71712, 0.846, 1.0); reward-to-go: (0.81, 0.9, 1.0)
    _expect(ret, [[0.71712, 0.846, 1.0]], [([[0.81, 0.9, 1.0]], RETURNS_MC)], what="returns")


@_case(ex, "padded row: the critic's values of padding are garbage", PAD_VALUE)
def _(fn, gen):
    adv, ret = fn(_t([[0.0, 1.0, 0.0, 0.0]]), _t([[0.5, 0.6, 9.0, 9.0]]), _t([[1, 1, 0, 0]]), gamma=1.0, lam=0.95)
    # A_1 = 1 - 0.6 = 0.4; A_0 = (0 + 0.6 - 0.5) + 0.95 * 0.4 = 0.48; returns 0.98, 1.0
    m = _t([[1, 1, 0, 0]])
    _expect(_as_tensor(adv, "advantages") * m, [[0.48, 0.4, 0, 0]], what="advantages on the valid tokens")
    _expect(_as_tensor(ret, "returns") * m, [[0.98, 1.0, 0, 0]], what="returns on the valid tokens")
    _expect(_as_tensor(adv, "advantages") * (1 - m), [[0, 0, 0, 0]], what="advantages at padding")


@_case(ex, "random batch with varied lengths and an empty row", "compare your loop with the hand cases above: "
       "each row must give the same numbers as alone, unpadded")
def _(fn, gen):
    r, v = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    m = _prefix_mask([6, 3, 0, 1], 6)
    want_a, want_r = ref.gae(r, v, m, gamma=0.99, lam=0.9)
    adv, ret = fn(r, v, m, gamma=0.99, lam=0.9)
    _expect(_as_tensor(adv, "advantages") * m, want_a, what="advantages")
    _expect(_as_tensor(ret, "returns") * m, want_r, what="returns")


@_case(ex, "the critic's values are detached", "the critic's values must enter GAE as constants: advantages and "
       "returns are targets, and a gradient through them trains the critic towards itself")
def _(fn, gen):
    v = _leaf([[0.5, 0.6, 0.7]])
    adv, ret = fn(_t([[0.0, 0.0, 1.0]]), v, _t([[1, 1, 1]]), gamma=1.0, lam=0.95)
    if any(isinstance(x, Tensor) and x.requires_grad for x in (adv, ret)):
        raise _Mismatch()


# ------------------------------------------------------------------------------------------ clipped surrogate

ex = _exercise("clipped_surrogate", "02",
               "clipped_surrogate(logprobs, old_logprobs, advantages, mask, *, eps_low=0.2, eps_high=None) -> loss",
               "minirl.losses.token_clip_loss (agg='token-mean'; policy_loss level='token')",
               ("minirl.losses.policy_loss", "minirl.losses.token_clip_loss", "minirl.losses._clipped_surrogate"))
UPSIDE_DOWN_RATIO = "the ratio is upside down: it is pi / pi_old, i.e. exp(logprobs - old_logprobs)"
OPTIMISTIC = ("takes the optimistic branch: the loss is the MAX of -A * r and -A * clip(r) (the min of the two "
              "objectives); the clipped branch then wins, and the gradient is 0, only once the ratio has moved past "
              "the clip range in the direction the advantage pushes it (above 1 + eps_high for A > 0, below "
              "1 - eps_low for A < 0)")
CLIP_ONLY = ("this is the clipped term alone: PPO takes the max of the unclipped and clipped terms, so on the side "
             "the advantage does not push (A > 0 with the ratio below 1 - eps_low, A < 0 above 1 + eps_high) the "
             "unclipped term -A * r wins and its gradient still pulls the ratio back")
NO_EPS_HIGH = ("clip without eps_high: the upper bound is 1 + eps_high (DAPO's clip-higher), the lower bound "
               "1 - eps_low")
EPS_HIGH_NONE = ("eps_high=None means 'the same as eps_low' (a symmetric clip), not 'no upper bound': with the "
                 "defaults a ratio above 1.2 is clipped when A > 0")
SEQ_MEAN_NOT_TOKEN = ("this averages per sequence first (GRPO's seq-mean-token-mean); this loss is the token-mean: "
                      "every valid token of the batch weighs the same")


def _surrogate(fn, lp, old, adv, mask, **settings):
    return _loss(fn(lp, old, adv, mask, **settings))


@_case(ex, "on-policy, by hand", UPSIDE_DOWN_RATIO)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    loss = _surrogate(fn, lp, _t([[-1.0, -2.0]]), _t([1.0]), _t([[1, 1]]))
    # ratio 1 on both tokens, A = +1: loss (-1 - 1) / 2 = -1; d loss / d logprobs = -A * ratio / 2 = -0.5
    _expect(loss, -1.0, what="the loss")
    _expect(_grad(loss, lp), [[-0.5, -0.5]], [([[0.5, 0.5]], UPSIDE_DOWN_RATIO)], what="the gradient")


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    loss = _surrogate(fn, lp, lp, _t([1.0]), _t([[1, 1]]))
    _expect(_grad(loss, lp, no_grad_hint=OLD_DETACHED), [[-0.5, -0.5]], [([[0.0, 0.0]], OLD_DETACHED)],
            what="the gradient")


@_case(ex, "ratio above 1 + eps with A > 0 (clipped)", OPTIMISTIC)
def _(fn, gen):
    lp = _leaf([[-0.8]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), eps_low=0.2, eps_high=0.2)
    # ratio e^0.2 = 1.221403 > 1.2: loss -1.2, gradient 0; the optimistic min: -1.221403, gradient -1.221403
    _expect(loss, -1.2, [(-1.221403, OPTIMISTIC)], what="the loss")
    _expect(_grad(loss, lp), [[0.0]], what="the gradient")


@_case(ex, "ratio below 1 - eps_low with A > 0 (not clipped)", CLIP_ONLY)
def _(fn, gen):
    lp = _leaf([[-1.5]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), eps_low=0.2, eps_high=0.2)
    # ratio e^-0.5 = 0.606531 < 0.8, A = +1: max(-0.606531, -0.8) = -0.606531, gradient -r = -0.606531;
    # the clipped term alone: -0.8, gradient 0
    _expect(loss, -0.606531, [(-0.8, CLIP_ONLY)], what="the loss")
    _expect(_grad(loss, lp), [[-0.606531]], [([[0.0]], CLIP_ONLY)], what="the gradient")


@_case(ex, "ratio above 1 + eps_high with A < 0 (not clipped)", CLIP_ONLY)
def _(fn, gen):
    lp = _leaf([[-0.7]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([-1.0]), _t([[1]]), eps_low=0.2, eps_high=0.2)
    # ratio e^0.3 = 1.349859 > 1.2, A = -1: max(1.349859, 1.2) = 1.349859, gradient +r; clipped term alone: 1.2, 0
    _expect(loss, 1.349859, [(1.2, CLIP_ONLY)], what="the loss")
    _expect(_grad(loss, lp), [[1.349859]], [([[0.0]], CLIP_ONLY)], what="the gradient")


@_case(ex, "the defaults: eps_low 0.2 and eps_high None (= eps_low)", EPS_HIGH_NONE)
def _(fn, gen):
    lp = _leaf([[-0.75, -1.3]])
    loss = _surrogate(fn, lp, _t([[-1.0, -1.0]]), _t([1.0]), _t([[1, 1]]))
    # ratios e^0.25 = 1.284025 (clipped to 1.2) and e^-0.3 = 0.740818 (A > 0: unclipped):
    # loss (-1.2 - 0.740818) / 2 = -0.970409; no upper bound: (-1.284025 - 0.740818) / 2 = -1.012422
    # eps_low = 0.1 would clip at 1.1: (-1.1 - 0.740818) / 2 = -0.920409
    _expect(loss, -0.970409, [(-1.012422, EPS_HIGH_NONE), (-0.920409, "the default eps_low is 0.2")],
            what="the loss")
    _expect(_grad(loss, lp), [[0.0, -0.370409]], [([[-0.642013, -0.370409]], EPS_HIGH_NONE)], what="the gradient")


@_case(ex, "clip-higher: eps_high 0.28", NO_EPS_HIGH)
def _(fn, gen):
    lp = _leaf([[-0.8]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), eps_low=0.2, eps_high=0.28)
    # ratio 1.221403 < 1.28: unclipped, loss -1.221403, gradient -1.221403; with eps_high ignored: -1.2, gradient 0
    _expect(loss, -1.221403, [(-1.2, NO_EPS_HIGH)], what="the loss")
    _expect(_grad(loss, lp), [[-1.221403]], what="the gradient")


@_case(ex, "ratio below 1 - eps_low with A < 0", NO_EPS_HIGH)
def _(fn, gen):
    lp = _leaf([[-1.5]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([-1.0]), _t([[1]]), eps_low=0.2, eps_high=0.28)
    # ratio e^-0.5 = 0.606531 < 0.8: max(0.606531, 0.8) = 0.8, gradient 0; lower bound 1 - 0.28 = 0.72 gives 0.72
    _expect(loss, 0.8, [(0.72, NO_EPS_HIGH), (0.606531, OPTIMISTIC)], what="the loss")
    _expect(_grad(loss, lp), [[0.0]], what="the gradient")


@_case(ex, "token-mean over rows of different lengths, garbage in padding", "average over the valid tokens of the "
       "whole batch (token-mean), padding excluded")
def _(fn, gen):
    lp = _t([[-1.0, -1.0, -50.0], [-1.0, 0.0, 0.0]])
    old = _t([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    loss = _surrogate(fn, lp, old, _t([1.0, -1.0]), _t([[1, 1, 0], [1, 0, 0]]))
    # valid terms -1, -1 (A = +1) and +1 (A = -1): (-1 - 1 + 1) / 3 = -1/3; seq-mean: (-1 + 1) / 2 = 0
    _expect(loss, -1 / 3, [(0.0, SEQ_MEAN_NOT_TOKEN)], what="the loss")


@_case(ex, "random ratios on both sides of both clip bounds, against the definition", CLIP_ONLY)
def _(fn, gen):
    mask = _prefix_mask([6, 2, 5, 4], 6)
    lp = (-torch.rand(4, 6, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.4 * torch.randn(4, 6, generator=gen)  # ratios from about 0.3 to 3
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0]) * (1 + torch.rand(4, generator=gen))
    want = ref.clipped_surrogate(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    loss = _surrogate(fn, lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient")


@_case(ex, "extreme log-ratios (100 nats on a valid token and in padding)", NEEDS_FINITE.format(n=100))
def _(fn, gen):
    lp = _leaf([[99.0, -1.0, 99.0]])  # token 0: log-ratio +100 with A < 0; token 2: padding, log-ratio +100
    loss = _surrogate(fn, lp, _t([[-1.0, -1.0, -1.0]]), _t([-1.0]), _t([[1, 1, 0]]))
    g = _expect_finite(loss, lp, "the loss")
    # A < 0 with the ratio far above 1 + eps: the unclipped term wins, its gradient pushes the log-prob down (> 0)
    if not g[0, 0] > 0:
        raise _Mismatch(CLAMPED, "the gradient on the 100-nat token is not positive")


# -------------------------------------------------------------------------------------------------- value_loss

ex = _exercise("value_loss", "02", "value_loss(values, old_values, returns, mask, *, clip=0.2) -> loss",
               "minirl.losses.value_loss (token-mean)", ("minirl.losses.value_loss",))
VALUE_MIN = ("takes the optimistic branch: the clipped value loss is the MAX of the two squared errors "
             "(pessimistic), like the policy's clip")
VALUE_AROUND_RETURNS = ("the clip is around the rollout-time prediction old_values; a clip of (values - returns) "
                        "never binds, so this is the unclipped loss")


@_case(ex, "inside the clip range, by hand", "0.5 * (V - R)^2 per token, averaged over the valid tokens")
def _(fn, gen):
    loss = _loss(fn(_t([[1.0, 2.0]]), _t([[1.1, 2.1]]), _t([[1.5, 1.0]]), _t([[1, 1]]), clip=0.2))
    # 0.5 * (0.25, 1.0) -> mean 0.3125; without the 0.5: 0.625
    _expect(loss, 0.3125, [(0.625, "PPO's value loss is HALF the squared error: 0.5 * max(...)")], what="the loss")


@_case(ex, "beyond the clip, unclipped error larger", VALUE_MIN)
def _(fn, gen):
    loss = _loss(fn(_t([[2.0]]), _t([[1.0]]), _t([[1.5]]), _t([[1]]), clip=0.2))
    # unclipped (2 - 1.5)^2 = 0.25; clipped V = 1.2: (1.2 - 1.5)^2 = 0.09; max -> 0.5 * 0.25 = 0.125; min -> 0.045
    _expect(loss, 0.125, [(0.045, VALUE_MIN)], what="the loss")


@_case(ex, "beyond the clip, clipped error larger", VALUE_AROUND_RETURNS)
def _(fn, gen):
    v = _leaf([[2.0]])
    loss = _loss(fn(v, _t([[1.0]]), _t([[3.0]]), _t([[1]]), clip=0.2))
    # unclipped (2 - 3)^2 = 1; clipped V = 1.2: (1.2 - 3)^2 = 3.24; max -> 0.5 * 3.24 = 1.62, gradient 0 (clipped)
    _expect(loss, 1.62, [(0.5, VALUE_AROUND_RETURNS)], what="the loss")
    _expect(_grad(loss, v), [[0.0]], what="the gradient")


@_case(ex, "padding holds garbage", "average over the valid tokens only (padding excluded from sum and count)")
def _(fn, gen):
    loss = _loss(fn(_t([[1.0, 7.0], [2.0, 7.0]]), _t([[1.0, 0.0], [2.0, 0.0]]), _t([[2.0, 0.0], [2.0, 0.0]]),
                    _t([[1, 0], [1, 0]]), clip=0.2))
    # valid tokens: 0.5 * max(1, (1.2 - 2)^2 = 0.64) = 0.5 and 0; mean 0.25
    _expect(loss, 0.25, what="the loss")


@_case(ex, "below the clip, the default clip (0.2)", VALUE_MIN)
def _(fn, gen):
    v = _leaf([[0.5]])
    loss = _loss(fn(v, _t([[1.0]]), _t([[0.0]]), _t([[1]])))
    # V moved 0.5 below V_old: clipped V = 0.8; unclipped 0.25, clipped 0.64: max -> 0.5 * 0.64 = 0.32, gradient 0;
    # min -> 0.125; a clip of 0.5 would not bind: 0.125 as well
    _expect(loss, 0.32, [(0.125, VALUE_MIN)], what="the loss")
    _expect(_grad(loss, v), [[0.0]], what="the gradient")


@_case(ex, "random values on both sides of the clip, against the definition", VALUE_MIN)
def _(fn, gen):
    mask = _prefix_mask([5, 3, 1], 5)
    v = torch.randn(3, 5, generator=gen).requires_grad_(True)
    old = v.detach() + 0.4 * torch.randn(3, 5, generator=gen)  # |V - V_old| on both sides of 0.3
    ret = torch.randn(3, 5, generator=gen)
    want = ref.value_loss(v, old, ret, mask, clip=0.3)
    loss = _loss(fn(v, old, ret, mask, clip=0.3))
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, v), torch.autograd.grad(want, v)[0], what="the gradient")
