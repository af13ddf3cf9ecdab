"""Exercises of chapter 04: KL estimators.

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _reference as ref
from ._core import (
    CLAMPED,
    NEEDS_FINITE,
    _as_tensor,
    _case,
    _exercise,
    _expect,
    _expect_finite,
    _grad,
    _leaf,
    _Mismatch,
    _prefix_mask,
    _t,
)
from .ch03 import K3_UPSIDE_DOWN

# ================================================================================================================
# 04 · KL estimators


ex = _exercise("k3", "04", "k3(logprobs, ref_logprobs) -> (B, T)", "minirl.kl.k3",
               ("minirl.kl.k3", "minirl.kl.kl_in_loss", "minirl.kl.kl_estimate"))
K3_SIGN = "k3 = r - 1 - log r, with MINUS log r: that is what makes it never negative"


@_case(ex, "three tokens by hand", K3_UPSIDE_DOWN)
def _(fn, gen):
    got = fn(_t([[-1.0, -2.0, -0.5]]), _t([[-2.0, -1.0, -0.5]]))
    # log r = ref - lp = (-1, 1, 0): k3 = (e^-1 - 1 + 1, e - 1 - 1, 0) = (0.367879, 0.718282, 0)
    # upside down: (0.718282, 0.367879, 0); with + log r: (e^-1 - 2, e, 0)
    e = math.e
    _expect(got, [[1 / e, e - 2, 0.0]], [([[e - 2, 1 / e, 0.0]], K3_UPSIDE_DOWN), ([[1 / e - 2, e, 0.0]], K3_SIGN)])


@_case(ex, "gradient by hand", K3_UPSIDE_DOWN)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0, -0.5]])
    g = _grad(fn(lp, _t([[-2.0, -1.0, -0.5]])), lp)
    # d k3 / d lp = 1 - r: (1 - e^-1, 1 - e, 0); upside down: (e - 1, e^-1 - 1, 0)
    e = math.e
    _expect(g, [[1 - 1 / e, 1 - e, 0.0]], [([[e - 1, 1 / e - 1, 0.0]], K3_UPSIDE_DOWN)], what="the gradient")


@_case(ex, "random log-probs: never negative, same as the definition", K3_SIGN)
def _(fn, gen):
    lp, ref_lp = -torch.rand(4, 7, generator=gen) * 5, -torch.rand(4, 7, generator=gen) * 5
    _expect(fn(lp, ref_lp), ref.k3(lp, ref_lp), atol=1e-5)


@_case(ex, "an extreme log-ratio (100 nats)", NEEDS_FINITE.format(n=100))
def _(fn, gen):
    lp = _leaf([[-100.0, -1.0]])
    out = fn(lp, _t([[-0.01, -1.0]]))
    g = _expect_finite(out, lp, "k3")
    # d k3 / d lp = 1 - r with r = e^99.99: hugely negative (the tangent above 20 nats: 1 - e^20); a clamped
    # log-ratio leaves only the -log r term, whose gradient is +1
    if not g[0, 0] < 0:
        raise _Mismatch(CLAMPED, f"the gradient on the 100-nat token is {float(g[0, 0]):.4g}, expected < 0")


# ---------------------------------------------------------------------------------------------- kl_in_reward

ex = _exercise("kl_reward", "04", "kl_reward(scores, logprobs, ref_logprobs, mask, *, beta) -> (B, T) token rewards",
               "minirl.rewards.token_level_rewards + minirl.kl.kl_in_reward(..., 'k1'), masked",
               ("minirl.kl.kl_in_reward", "minirl.rewards.token_level_rewards"))
LAST_COLUMN = ("the score belongs on each row's LAST VALID token, not on the last column (padding for every row "
               "shorter than T)")
K3_IN_REWARD = ("KL from a k3 placed in the reward: in the reward the penalty is k1 = log pi - log ref, whose "
                "REINFORCE gradient is the unbiased gradient of KL(pi || ref); k3 there is biased (Tang & Munos 2025)")
REWARD_KL_SIGN = "the KL is a penalty: each token's reward is -beta * KL (plus the score on the last token)"
REWARD_GRAD = ("the shaped reward carries a gradient: a reward is a constant for the policy gradient, detach the "
               "KL before putting it in the reward")
_KLR_LP = [[-1.0, -1.0, -1.0], [-2.0, -3.0, -3.0]]
_KLR_REF = [[-1.5, -1.0, -0.5], [-2.0, -2.0, -2.0]]
_KLR_MASK = [[1, 1, 1], [1, 1, 0]]


@_case(ex, "two rows by hand, the second padded", LAST_COLUMN)
def _(fn, gen):
    got = fn(_t([1.0, 1.0]), _t(_KLR_LP), _t(_KLR_REF), _t(_KLR_MASK), beta=0.1)
    got = _as_tensor(got, "the rewards") * _t(_KLR_MASK)
    # k1 = lp - ref: (0.5, 0, -0.5) and (0, -1); -0.1 * k1, then + score 1 on the last valid token:
    # row 0 (-0.05, 0, 0.05 + 1) ; row 1 (0, 0.1 + 1, pad)
    # k3 = e^(ref-lp) - 1 - (ref-lp): (0.106531, 0, 0.148721) and (0, 0.718282)
    k3a, k3b, k3c = math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, math.e - 2
    _expect(got, [[-0.05, 0.0, 1.05], [0.0, 1.1, 0.0]],
            [([[-0.05, 0.0, 1.05], [0.0, 0.1, 0.0]], LAST_COLUMN),
             ([[-0.1 * k3a, 0.0, 1 - 0.1 * k3b], [0.0, 1 - 0.1 * k3c, 0.0]], K3_IN_REWARD),
             ([[0.05, 0.0, 0.95], [0.0, 0.9, 0.0]], REWARD_KL_SIGN)], what="the rewards on the valid tokens")


@_case(ex, "padding gets no reward", "positions outside the mask must hold 0 (no KL, no score)")
def _(fn, gen):
    got = _as_tensor(fn(_t([1.0, 1.0]), _t(_KLR_LP), _t(_KLR_REF), _t(_KLR_MASK), beta=0.1), "the rewards")
    _expect(got * (1 - _t(_KLR_MASK)), [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [([[0, 0, 0], [0, 0, 1.0]], LAST_COLUMN)],
            what="the rewards at padding")


@_case(ex, "the reward is detached", REWARD_GRAD)
def _(fn, gen):
    out = fn(_t([1.0, 1.0]), _leaf(_KLR_LP), _t(_KLR_REF), _t(_KLR_MASK), beta=0.1)
    if isinstance(out, Tensor) and out.requires_grad:
        raise _Mismatch()


@_case(ex, "random batch with an empty row", "compare with the hand case: -beta * k1 on valid tokens, the score on "
       "the last valid token, nothing for a row with no valid token")
def _(fn, gen):
    mask = _prefix_mask([4, 0, 2], 4)
    scores = torch.rand(3, generator=gen)
    lp, ref_lp = -torch.rand(3, 4, generator=gen) * 3, -torch.rand(3, 4, generator=gen) * 3
    want = ref.kl_reward(scores, lp, ref_lp, mask, beta=0.05)
    _expect(_as_tensor(fn(scores, lp, ref_lp, mask, beta=0.05), "the rewards") * mask, want)


# ------------------------------------------------------------------------------------------------- exact_kl

ex = _exercise("exact_kl", "04", "exact_kl(logits, ref_logits) -> (B, T) KL(pi || ref) summed over the vocabulary",
               "minirl.kl.exact_token_kl", ("minirl.kl.exact_token_kl",))
REVERSED_KL = ("this is KL(ref || pi), the forward KL; the penalty is KL(pi || ref): weight the log-ratio by the "
               "POLICY's probabilities")
ZERO_PROB = ("a token with zero probability under the policy (logit -inf, e.g. a masked vocabulary) gave "
             "0 * log 0 = NaN: such a token contributes 0")
NOT_NORMALISED = "logits are unnormalised: turn them into log-probabilities (log_softmax) first"


@_case(ex, "two tokens by hand", REVERSED_KL)
def _(fn, gen):
    got = fn(torch.log(_t([[[0.5, 0.5]]])), torch.log(_t([[[0.25, 0.75]]])))
    # KL(pi || ref) = 0.5 ln 2 + 0.5 ln(2/3) = 0.143841; KL(ref || pi) = 0.25 ln 0.5 + 0.75 ln 1.5 = 0.130812
    _expect(got, [[0.5 * math.log(2) + 0.5 * math.log(2 / 3)]],
            [([[0.25 * math.log(0.5) + 0.75 * math.log(1.5)]], REVERSED_KL)])


@_case(ex, "unnormalised logits", NOT_NORMALISED)
def _(fn, gen):
    got = fn(torch.log(_t([[[0.5, 0.5]]])) + 3.0, torch.log(_t([[[0.25, 0.75]]])) - 1.0)
    _expect(got, [[0.5 * math.log(2) + 0.5 * math.log(2 / 3)]])


@_case(ex, "a token the policy never samples (logit -inf)", ZERO_PROB)
def _(fn, gen):
    got = fn(_t([[[0.0, -math.inf, 0.0]]]), _t([[[0.0, 0.0, 0.0]]]))
    # pi = (0.5, 0, 0.5), ref = (1/3, 1/3, 1/3): KL = ln(0.5 / (1/3)) = ln 1.5 = 0.405465
    _expect(got, [[math.log(1.5)]])


@_case(ex, "random (B, T, V) logits against the definition", REVERSED_KL)
def _(fn, gen):
    logits, ref_logits = torch.randn(2, 3, 5, generator=gen) * 2, torch.randn(2, 3, 5, generator=gen) * 2
    _expect(fn(logits, ref_logits), ref.exact_kl(logits, ref_logits),
            [(ref.exact_kl(ref_logits, logits), REVERSED_KL)])
