"""Exercises of chapter 10: from minirl to TRL (the KL term of TRL's default ``use_bias_correction_kl=True``).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch

from . import _reference as ref
from ._core import (
    NEEDS_FINITE,
    OLD_DETACHED,
    _case,
    _exercise,
    _expect,
    _expect_finite,
    _grad,
    _leaf,
    _prefix_mask,
    _t,
)
from .ch03 import K3_UPSIDE_DOWN

# ================================================================================================================
# 10 · the ratio-weighted k3 (TRL's use_bias_correction_kl, DeepSeek-V3.2's unbiased KL estimate)

ex = _exercise("ratio_weighted_k3", "10", "ratio_weighted_k3(logprobs, old_logprobs, ref_logprobs, mask) -> (B, T)",
               "minirl.kl.ratio_weighted_k3", ("minirl.kl.ratio_weighted_k3", "minirl.kl.kl_estimate"))
RATIO_DETACHED = ("the ratio pi / pi_old was detached: its value is right but then the term's expected gradient is "
                  "E_pi[grad k3], the FORWARD KL's (notebook 04), which is what TRL's option exists to correct; the "
                  "ratio must be differentiated, only pi_old is a constant")
RATIO_UPSIDE_DOWN = ("the importance ratio is pi / pi_old (the current policy over the one that drew the tokens), "
                     "not pi_old / pi")
NO_RATIO = ("this is plain k3: TRL's use_bias_correction_kl multiplies it by the importance ratio pi / pi_old (the "
            "tokens were drawn by pi_old)")
RWK3_PAD = "0 outside the mask, whatever the padding holds (and no NaN there)"
_LP, _OLD, _REF = [[-1.0]], [[-1.2]], [[-0.5]]


@_case(ex, "one token off-policy, by hand", RATIO_DETACHED)
def _(fn, gen):
    lp = _leaf(_LP)
    out = fn(lp, _t(_OLD), _t(_REF), _t([[1]]))
    # ratio e^0.2 = 1.221403, k3 = e^0.5 - 1 - 0.5 = 0.148721: 0.181649. Ratio upside down: e^-0.2 * k3 = 0.121763;
    # k3 upside down (e^-0.5 - 1 + 0.5 = 0.106531): 0.130118; no ratio: 0.148721
    _expect(out, [[0.181649]], [([[0.121763]], RATIO_UPSIDE_DOWN), ([[0.130118]], K3_UPSIDE_DOWN),
                                ([[0.148721]], NO_RATIO)], what="the term")
    # d/d lp = ratio * k3 + ratio * (1 - e^(ref - lp)) = 1.221403 * (0.148721 + 1 - 1.648721) = -0.610701;
    # ratio detached: 1.221403 * (1 - 1.648721) = -0.792357
    _expect(_grad(out, lp), [[-0.610701]], [([[-0.792357]], RATIO_DETACHED)], what="the gradient")


@_case(ex, "on-policy: the value is k3's, the gradient is not", RATIO_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    out = fn(lp, _t([[-1.0, -2.0]]), _t([[-0.5, -2.5]]), _t([[1, 1]]))
    # ratio 1: k3 = (0.148721, e^-0.5 - 1 + 0.5 = 0.106531); gradient k3 + 1 - e^(ref - lp) =
    # (0.148721 - 0.648721, 0.106531 + 0.393469) = (-0.5, 0.5); detached ratio: (-0.648721, 0.393469)
    _expect(out, [[0.148721, 0.106531]], what="the term")
    _expect(_grad(out, lp), [[-0.5, 0.5]], [([[-0.648721, 0.393469]], RATIO_DETACHED)], what="the gradient")


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    out = fn(lp, lp, _t([[-0.5, -2.5]]), _t([[1, 1]]))
    # the first update on-policy: as above, (-0.5, 0.5); pi_old not detached kills the ratio's gradient
    _expect(_grad(out, lp, no_grad_hint=OLD_DETACHED), [[-0.5, 0.5]], [([[-0.648721, 0.393469]], OLD_DETACHED)],
            what="the gradient")


@_case(ex, "garbage in padding", RWK3_PAD)
def _(fn, gen):
    lp = _leaf([[-1.0, 5.0, -30.0]])
    out = fn(lp, _t([[-1.2, -40.0, 0.0]]), _t([[-0.5, 60.0, -9.0]]), _t([[1, 0, 0]]))
    g = _expect_finite(out, lp, "the term")
    _expect(out, [[0.181649, 0.0, 0.0]], what="the term")
    _expect(g, [[-0.610701, 0.0, 0.0]], what="the gradient")


@_case(ex, "random batch with padding against the definition", RATIO_DETACHED)
def _(fn, gen):
    mask = _prefix_mask([5, 2, 0, 4], 5)
    lp = (-torch.rand(4, 5, generator=gen) * 3).requires_grad_(True)
    old = lp.detach() + 0.3 * torch.randn(4, 5, generator=gen)
    ref_lp = -torch.rand(4, 5, generator=gen) * 3
    want = ref.ratio_weighted_k3(lp, old, ref_lp, mask)
    out = fn(lp, old, ref_lp, mask)
    _expect(out, want.detach(), what="the terms")
    w = torch.rand(4, 5, generator=gen)
    _expect(_grad(out, lp, w), torch.autograd.grad((want * w).sum(), lp)[0], what="the gradient")


@_case(ex, "an extreme log-ratio to the reference (100 nats)", NEEDS_FINITE.format(n=100))
def _(fn, gen):
    lp = _leaf([[-100.0, -1.0]])
    out = fn(lp, _t([[-100.0, -1.0]]), _t([[-0.01, -1.0]]), _t([[1, 1]]))
    _expect_finite(out, lp, "the term")
    # ratio 1; k3 with exp continued along its tangent above 20 nats: e^20 (1 + 99.99 - 20) - 1 - 99.99
    _expect(out, [[math.exp(20) * 80.99 - 100.99, 0.0]], what="the term", rtol=1e-4)
