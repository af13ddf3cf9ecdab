"""Exercises of chapter 07: GSPO on a tiny MoE.

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _reference as ref
from ._core import (
    OLD_DETACHED,
    _as_tensor,
    _case,
    _exercise,
    _expect,
    _grad,
    _leaf,
    _loss,
    _Mismatch,
    _prefix_mask,
    _t,
)
from .ch00 import MEAN_T
from .ch02 import OPTIMISTIC

# ================================================================================================================
# 07 · GSPO on a tiny MoE


ex = _exercise("sequence_ratio", "07", "sequence_ratio(logprobs, old_logprobs, mask) -> (B,) GSPO's s_i",
               "minirl.losses.sequence_ratio", ("minirl.losses.sequence_ratio", "minirl.losses.policy_loss"))
PRODUCT = ("this is the product of the token ratios (sum of log-ratios): GSPO's ratio is their geometric mean, "
           "normalised by the length |y_i|")
ARITH = "arithmetic mean of the token ratios; GSPO's s_i is the geometric mean: exp of the mean log-ratio"
_SR_LP = [[-0.7, -1.1, -0.9], [-0.4, -5.0, -5.0]]  # minus old: (0.3, -0.1, 0.1) and (0.6, pad, pad)
_SR_OLD = [[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]]
_SR_M = [[1, 1, 1], [1, 0, 0]]


@_case(ex, "two sequences by hand, garbage in padding", PRODUCT)
def _(fn, gen):
    got = fn(_t(_SR_LP), _t(_SR_OLD), _t(_SR_M))
    # mean log-ratios 0.1 and 0.6: s = (e^0.1, e^0.6) = (1.105171, 1.822119)
    # product: (e^0.3, e^0.6); over T = 3: (e^0.1, e^0.2); arithmetic: ((e^0.3 + e^-0.1 + e^0.1) / 3, e^0.6)
    e = math.exp
    _expect(got, [e(0.1), e(0.6)], [([e(0.3), e(0.6)], PRODUCT), ([e(0.1), e(0.2)], MEAN_T),
                                     ([(e(0.3) + e(-0.1) + e(0.1)) / 3, e(0.6)], ARITH)])


@_case(ex, "gradient by hand", PRODUCT)
def _(fn, gen):
    lp = _leaf(_SR_LP)
    g = _grad(fn(lp, _t(_SR_OLD), _t(_SR_M)), lp)
    # d s_i / d lp_t = s_i / |y_i| on valid tokens: e^0.1 / 3 = 0.368390 and e^0.6 = 1.822119
    s0, s1 = math.exp(0.1), math.exp(0.6)
    _expect(g, [[s0 / 3] * 3, [s1, 0, 0]], [([[math.exp(0.3)] * 3, [s1, 0, 0]], PRODUCT)], what="the gradient")


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf(_SR_LP)
    g = _grad(fn(lp, lp, _t(_SR_M)), lp, no_grad_hint=OLD_DETACHED)
    _expect(g, [[1 / 3] * 3, [1, 0, 0]], [([[0.0] * 3, [0, 0, 0]], OLD_DETACHED)], what="the gradient")


@_case(ex, "an empty row", "a row with no valid token has no log-ratio: its ratio is exp(0) = 1, not NaN")
def _(fn, gen):
    _expect(fn(_t([[-1.0, -2.0]]), _t([[-1.5, -1.0]]), _t([[0, 0]])), [1.0])


@_case(ex, "random rows against the definition", PRODUCT)
def _(fn, gen):
    mask = _prefix_mask([6, 2, 4, 1], 6)
    lp = (-torch.rand(4, 6, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.2 * torch.randn(4, 6, generator=gen)
    want = ref.sequence_ratio(lp, old, mask)
    got = fn(lp, old, mask)
    _expect(got, want.detach(), [(torch.exp(((lp - old) * mask).sum(-1)).detach(), PRODUCT)], what="the ratio")
    w = torch.randn(4, generator=gen)
    _expect(_grad(got, lp, weights=w), torch.autograd.grad((want * w).sum(), lp)[0], what="the gradient")


# ---------------------------------------------------------------------------------------------------- gspo_loss

ex = _exercise("gspo_loss", "07",
               "gspo_loss(logprobs, old_logprobs, advantages, mask, *, eps_low=3e-4, eps_high=4e-4) -> loss",
               "minirl.losses.gspo_loss", ("minirl.losses.gspo_loss", "minirl.losses.policy_loss",
                                           "minirl.losses.sequence_ratio"))
BROADCAST = ("GSPO's sequence term was broadcast over the tokens and token-averaged: longer sequences then weigh "
             "more; GSPO has ONE clipped term per sequence, averaged over sequences")
TOKEN_RATIOS = ("these are token-level ratios (PPO / GRPO); GSPO clips one ratio per sequence, the geometric mean "
                "of its token ratios")


def _gspo(fn, lp, old, adv, mask, **settings):
    return _loss(fn(lp, old, adv, mask, **settings))


@_case(ex, "token ratios clipped, the sequence ratio inside", TOKEN_RATIOS)
def _(fn, gen):
    d = torch.float64
    lp = _leaf([[-0.99, -1.01]], d)
    loss = _gspo(fn, lp, _t([[-1.0, -1.0]], d), _t([1.0], d), _t([[1, 1]], d), eps_low=3e-4, eps_high=4e-4)
    # log-ratios (+0.01, -0.01): s = e^0 = 1, inside: loss -1, gradient -s / 2 = -0.5 per token
    # token level: e^0.01 clipped to 1.0004 (gradient 0), e^-0.01 = 0.990050 unclipped -> mean -0.995225
    _expect(loss, -1.0, [(-(1.0004 + math.exp(-0.01)) / 2, TOKEN_RATIOS)], what="the loss", atol=1e-9, rtol=1e-9)
    _expect(_grad(loss, lp), [[-0.5, -0.5]], what="the gradient", atol=1e-9, rtol=1e-9)


@_case(ex, "the paper's scale, by hand (float64)", BROADCAST)
def _(fn, gen):
    d = torch.float64
    lp = _t([[3e-4, -1e-4, 1e-4], [6e-4, 0.0, 0.0]], d) - 1.0
    loss = _gspo(fn, lp, _t([[-1.0] * 3, [-1.0, 0.0, 0.0]], d), _t([1.0, -1.0], d), _t(_SR_M, d), eps_low=3e-4,
                 eps_high=4e-4)
    # s = (e^1e-4, e^6e-4) = (1.00010001, 1.00060018); seq 0 inside [0.9997, 1.0004]: -1.00010001;
    # seq 1 above it but A < 0 keeps the unclipped branch: +1.00060018; mean (-1.00010001 + 1.00060018) / 2
    s0, s1 = math.exp(1e-4), math.exp(6e-4)
    # broadcast over tokens, token-mean: (-3 * 1.00010001 + 1.00060018) / 4
    _expect(loss, (s1 - s0) / 2, [((-3 * s0 + s1) / 4, BROADCAST)], what="the loss", atol=1e-9, rtol=1e-9)


@_case(ex, "the sequence ratio clipped, the default clip range (3e-4 / 4e-4)", "beyond 1 + eps_high with A > 0 the "
       "sequence's term is clipped: value -(1 + eps_high) * A and gradient 0; the defaults are GSPO's 3e-4 / 4e-4")
def _(fn, gen):
    d = torch.float64
    lp = _leaf([[-0.99, -0.99]], d)
    loss = _gspo(fn, lp, _t([[-1.0, -1.0]], d), _t([1.0], d), _t([[1, 1]], d))
    # s = e^0.01 = 1.010050 > 1.0004: loss -1.0004, gradient 0
    _expect(loss, -1.0004, [(-math.exp(0.01), OPTIMISTIC)], what="the loss", atol=1e-9, rtol=1e-9)
    _expect(_grad(loss, lp), [[0.0, 0.0]], what="the gradient", atol=1e-9)


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0, -0.5], [-1.0, -3.0, -3.0]])
    loss = _gspo(fn, lp, lp, _t([1.0, 1.0]), _t(_SR_M), eps_low=3e-4, eps_high=4e-4)
    # s = 1, loss -1; d loss / d lp_t = -A * s / |y_i| / B: -1/6 (row 0), -1/2 (row 1)
    _expect(_grad(loss, lp, no_grad_hint=OLD_DETACHED), [[-1 / 6] * 3, [-0.5, 0, 0]],
            [([[0.0] * 3, [0, 0, 0]], OLD_DETACHED)], what="the gradient")


@_case(ex, "random batch with padding against the definition", BROADCAST)
def _(fn, gen):
    mask = _prefix_mask([5, 1, 3, 4], 5)
    lp = (-torch.rand(4, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    old = lp.detach() + 4e-4 * torch.randn(4, 5, generator=gen, dtype=torch.float64)  # s on both sides of the clip
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64) * torch.rand(4, generator=gen, dtype=torch.float64)
    want = ref.gspo_loss(lp, old, adv, mask.double(), eps_low=2e-4, eps_high=5e-4)
    loss = _gspo(fn, lp, old, adv, mask.double(), eps_low=2e-4, eps_high=5e-4)
    _expect(loss, want.detach(), what="the loss", atol=1e-9, rtol=1e-7)
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient", atol=1e-9, rtol=1e-7)


# ---------------------------------------------------------------------------------------------- gspo_token_ratio

ex = _exercise("gspo_token_ratio", "07", "gspo_token_ratio(logprobs, old_logprobs, mask) -> (B, T) GSPO-token's s_it",
               "minirl.losses.gspo_token_loss (its ratio)",
               ("minirl.losses.gspo_token_loss", "minirl.losses.policy_loss", "minirl.losses.sequence_ratio"))
NO_SG = ("without the stop-gradient each token's gradient is spread over its whole sequence (that is GSPO's "
         "gradient): GSPO-token routes each token's gradient through its OWN log-prob, sg[s_i] * pi / sg[pi]")
FULLY_DETACHED = ("the ratio carries no gradient: the factor pi(y_t) / sg[pi(y_t)] has the value 1 but passes each "
                  "token's gradient")


@_case(ex, "values by hand: s_i on every valid token", PRODUCT)
def _(fn, gen):
    got = _as_tensor(fn(_t(_SR_LP), _t(_SR_OLD), _t(_SR_M)), "the ratio") * _t(_SR_M)
    e = math.exp
    _expect(got, [[e(0.1)] * 3, [e(0.6), 0, 0]], [([[e(0.3)] * 3, [e(0.6), 0, 0]], PRODUCT)],
            what="the ratio on the valid tokens")


@_case(ex, "gradient: each token through its own log-prob", NO_SG)
def _(fn, gen):
    lp = _leaf(_SR_LP)
    w = _t([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # weight only the first token of each row
    g = _grad(fn(lp, _t(_SR_OLD), _t(_SR_M)), lp, weights=w, no_grad_hint=FULLY_DETACHED)
    # d s_i0 / d lp_t = s_i if t = 0 else 0; without the stop-gradient: s_i / |y_i| on every valid token
    s0, s1 = math.exp(0.1), math.exp(0.6)
    _expect(g, [[s0, 0, 0], [s1, 0, 0]],
            [([[s0 / 3] * 3, [s1, 0, 0]], NO_SG), ([[0.0] * 3, [0, 0, 0]], FULLY_DETACHED)], what="the gradient")


@_case(ex, "random batch against the definition", NO_SG)
def _(fn, gen):
    mask = _prefix_mask([4, 2, 3], 4)
    lp = (-torch.rand(3, 4, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(3, 4, generator=gen)
    adv = torch.randn(3, 4, generator=gen)
    ratio = fn(lp, old, mask)
    if not isinstance(ratio, Tensor):
        raise _Mismatch(f"the ratio should be a torch.Tensor, got {type(ratio).__name__}")
    # GSPO-token's unclipped loss, -mean_seq(mean_t A_it * s_it), from the reference ratio and from yours
    want = -((adv * ref.gspo_token_ratio(lp, old, mask) * mask) / mask.sum(-1, keepdim=True)).sum() / 3
    loss = -((adv * ratio * mask) / mask.sum(-1, keepdim=True)).sum() / 3
    _expect(loss, want.detach(), what="the loss it gives")
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient")
