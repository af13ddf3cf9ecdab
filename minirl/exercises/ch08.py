"""Exercises of chapter 08: preference optimisation.

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch

from . import _reference as ref
from ._core import (
    _case,
    _exercise,
    _expect,
    _grad,
    _leaf,
    _loss,
    _t,
)
from .ch00 import MEAN_T, UNMASKED

# ================================================================================================================
# 08 · preference optimisation


ex = _exercise("dpo_loss", "08",
               "dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *, beta=0.1) -> loss",
               "minirl.preference.dpo_loss", ("minirl.preference.dpo_loss",))
BETA_OUTSIDE = ("beta multiplies the margin INSIDE the log-sigmoid (the implicit reward is beta * log(pi / ref)), "
                "not the loss")
NO_REF = "the reference model is missing: DPO's margin is between log-RATIOS log pi - log ref"
REF_ADDED = "the reference log-probs were added: each log-ratio is log pi MINUS log ref"
BATCH_SUM = "the loss is the MEAN over the pairs of the batch, not the sum"
NAIVE_LOGSIG = ("log(sigmoid(x)) underflows to log(0) = -inf for a large negative margin: use a numerically stable "
                "log-sigmoid")
REF_GRAD = "the gradient reached the reference log-probs: the reference model is frozen, detach its log-probs"


def _softplus(x: float) -> float:
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


@_case(ex, "one pair by hand, beta 0.5", BETA_OUTSIDE)
def _(fn, gen):
    loss = _loss(fn(_t([-10.0]), _t([-12.0]), _t([-12.0]), _t([-11.0]), beta=0.5))
    # h = (-10 + 12) - (-12 + 11) = 3; -log sigmoid(1.5) = softplus(-1.5) = 0.201413
    # beta outside: 0.5 * softplus(-3) = 0.024294; no reference: softplus(-0.5 * 2) = 0.313262;
    # reference added: h = (-10 - 12) - (-12 - 11) = 1 -> softplus(-0.5) = 0.474077
    _expect(loss, _softplus(-1.5), [(0.5 * _softplus(-3.0), BETA_OUTSIDE), (_softplus(-1.0), NO_REF),
                                    (_softplus(-0.5), REF_ADDED)], what="the loss")


@_case(ex, "one pair, the default beta (0.1)", BETA_OUTSIDE)
def _(fn, gen):
    loss = _loss(fn(_t([-10.0]), _t([-12.0]), _t([-12.0]), _t([-11.0])))
    # h = 3: -log sigmoid(0.1 * 3) = softplus(-0.3) = 0.554355; beta 0.5: 0.201413; beta outside: 0.1 * 0.048587
    _expect(loss, _softplus(-0.3), [(_softplus(-1.5), "the default beta is 0.1"),
                                    (0.1 * _softplus(-3.0), BETA_OUTSIDE)], what="the loss")


@_case(ex, "policy equals reference", BATCH_SUM)
def _(fn, gen):
    lp = _t([-5.0, -7.0, -9.0])
    # h = 0 for every pair: -log sigmoid(0) = ln 2 = 0.693147 per pair; the sum over 3 pairs: 2.079442
    _expect(_loss(fn(lp, lp - 1, lp.clone(), lp - 1)), math.log(2), [(3 * math.log(2), BATCH_SUM)],
            what="the loss")


@_case(ex, "gradients by hand; the reference gets none", REF_GRAD)
def _(fn, gen):
    c, r, rc, rr = _leaf([-10.0]), _leaf([-12.0]), _leaf([-12.0]), _leaf([-11.0])
    loss = _loss(fn(c, r, rc, rr, beta=0.5))
    gc, gr, grc, grr = _grad(loss, (c, r, rc, rr))
    # d/dc = -beta * (1 - sigmoid(1.5)) = -0.5 * 0.182426 = -0.091213; d/dr = +0.091213
    g = 0.5 / (1 + math.exp(1.5))
    _expect(gc, [-g], what="the gradient in chosen_logps")
    _expect(gr, [g], what="the gradient in rejected_logps")
    _expect(torch.cat([grc, grr]), [0.0, 0.0], what="the gradient in the reference log-probs")


@_case(ex, "an extreme margin (beta * h = -200)", NAIVE_LOGSIG)
def _(fn, gen):
    loss = _loss(fn(_t([-1000.0]), _t([-10.0]), _t([-10.0]), _t([-10.0]), beta=0.2))
    # h = (-1000 + 10) - (-10 + 10) = -990, beta * h = -198: -log sigmoid(-198) = 198.0 (to float precision)
    _expect(loss, 198.0, what="the loss", rtol=1e-5)


def _pairs(gen, n=6):
    """Random sequence log-probs of n pairs (policy and reference), leaves so gradients can be compared."""
    return [(-torch.rand(n, generator=gen) * 20 - 1).requires_grad_(True) for _ in range(4)]


def _same_loss_and_grads(got, want, leaves) -> None:
    _expect(_loss(got), want.detach(), what="the loss")
    for g, w, what in zip(_grad(_loss(got), tuple(leaves[:2])), torch.autograd.grad(want, leaves[:2]),
                          ("chosen", "rejected"), strict=True):
        _expect(g, w, what=f"the gradient in the {what} log-probs")


@_case(ex, "random pairs, beta 0.3, against the definition", BETA_OUTSIDE)
def _(fn, gen):
    leaves = _pairs(gen)
    _same_loss_and_grads(fn(*leaves, beta=0.3), ref.dpo_loss(*leaves, beta=0.3), leaves)


# ------------------------------------------------------------------------------------------------------ ipo_loss

ex = _exercise("ipo_loss", "08",
               "ipo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *, tau=0.1) -> loss",
               "minirl.preference.ipo_loss", ("minirl.preference.ipo_loss",))
IPO_TARGET = "IPO's target margin is 1 / (2 tau), not 1 / tau"
IPO_SCALED = "IPO regresses the raw log-ratio margin h: no beta or tau multiplies h inside the square"


@_case(ex, "policy equals reference, the default tau (0.1)", IPO_TARGET)
def _(fn, gen):
    lp = _t([-5.0, -7.0])
    # h = 0: (0 - 1 / (2 * 0.1))^2 = 25 per pair; target 1 / tau: 100
    _expect(_loss(fn(lp, lp.clone(), lp.clone(), lp.clone())), 25.0, [(100.0, IPO_TARGET)], what="the loss")


@_case(ex, "two pairs by hand, tau = 1/6", IPO_TARGET)
def _(fn, gen):
    loss = _loss(fn(_t([-10.0, -5.0]), _t([-12.0, -6.0]), _t([-12.0, -5.0]), _t([-11.0, -6.0]), tau=1 / 6))
    # h = (-10 + 12) - (-12 + 11) = 3 and (-5 + 5) - (-6 + 6) = 0; target 1 / (2 tau) = 3
    # loss ((3 - 3)^2 + (0 - 3)^2) / 2 = 4.5; target 1/tau = 6: (9 + 36) / 2 = 22.5
    # no reference: h = 2 and 1 -> (1 + 4) / 2 = 2.5; tau * h: ((0.5 - 3)^2 + 9) / 2 = 7.625; sum: 9
    _expect(loss, 4.5, [(22.5, IPO_TARGET), (2.5, NO_REF), (7.625, IPO_SCALED), (9.0, BATCH_SUM)], what="the loss")


@_case(ex, "gradients by hand; the reference gets none", REF_GRAD)
def _(fn, gen):
    c, r, rc, rr = _leaf([-10.0, -5.0]), _leaf([-12.0, -6.0]), _leaf([-12.0, -5.0]), _leaf([-11.0, -6.0])
    gc, gr, grc, grr = _grad(_loss(fn(c, r, rc, rr, tau=1 / 6)), (c, r, rc, rr))
    # d/dc_i = 2 (h_i - 3) / 2 = (0, -3); d/dr_i = (0, 3)
    _expect(gc, [0.0, -3.0], what="the gradient in chosen_logps")
    _expect(gr, [0.0, 3.0], what="the gradient in rejected_logps")
    _expect(torch.cat([grc, grr]), [0.0] * 4, what="the gradient in the reference log-probs")


@_case(ex, "random pairs, tau 0.25, against the definition", IPO_TARGET)
def _(fn, gen):
    leaves = _pairs(gen)
    _same_loss_and_grads(fn(*leaves, tau=0.25), ref.ipo_loss(*leaves, tau=0.25), leaves)


# ------------------------------------------------------------------------------------------ simpo_loss (tokens)

ex = _exercise("simpo_loss_from_tokens", "08",
               "simpo_loss_from_tokens(chosen_logprobs, chosen_mask, rejected_logprobs, rejected_mask, *, beta=2.0, "
               "gamma=1.0) -> loss", "minirl.rollout.sequence_logprobs(..., 'mean') + minirl.preference.simpo_loss",
               ("minirl.preference.simpo_loss", "minirl.rollout.sequence_logprobs"))
SIMPO_SUM = ("SimPO with sum instead of mean: its reward is the AVERAGE token log-prob (length-normalised); a sum "
             "favours short completions")
SIMPO_GAMMA = ("gamma is SimPO's absolute margin (paper eq. 6): beta * (c - r) - gamma; subtracting gamma inside "
               "the beta makes it gamma * beta (TRL's gamma_beta_ratio is gamma / beta)")
SIMPO_GAMMA_SIGN = "the margin gamma is SUBTRACTED: the reward gap has to exceed it"
_SC, _SCM = [[-1.0, -1.0, -1.0, -1.0]], [[1, 1, 1, 1]]
_SR, _SRM = [[-2.0, -2.0, -2.0, -7.0]], [[1, 1, 1, 0]]  # -7 sits in padding


@_case(ex, "one pair by hand, beta 2, gamma 0.5", SIMPO_SUM)
def _(fn, gen):
    loss = _loss(fn(_t(_SC), _t(_SCM), _t(_SR), _t(_SRM), beta=2.0, gamma=0.5))
    # means -1 and -2: 2 * (-1 + 2) - 0.5 = 1.5 -> softplus(-1.5) = 0.201413
    # sums -4 and -6: 2 * 2 - 0.5 = 3.5 -> 0.029750; over T = 4: -1 and -1.5: 2 * 0.5 - 0.5 = 0.5 -> 0.474077
    # 2 * (1 - 0.5) = 1 -> 0.313262; gamma added: 2.5 -> 0.078889; padding counted: -13/4: 2 * 2.25 - 0.5 = 4
    _expect(loss, _softplus(-1.5), [(_softplus(-3.5), SIMPO_SUM), (_softplus(-0.5), MEAN_T),
                                    (_softplus(-1.0), SIMPO_GAMMA), (_softplus(-2.5), SIMPO_GAMMA_SIGN),
                                    (_softplus(-4.0), UNMASKED)], what="the loss")


@_case(ex, "gradients by hand", SIMPO_SUM)
def _(fn, gen):
    c, r = _leaf(_SC), _leaf(_SR)
    gc, gr = _grad(_loss(fn(c, _t(_SCM), r, _t(_SRM), beta=2.0, gamma=0.5)), (c, r))
    # d/d chosen token = -beta * (1 - sigmoid(1.5)) / 4 = -0.091213; rejected: +2 * 0.182426 / 3 = 0.121617
    q = 1 / (1 + math.exp(1.5))
    _expect(gc, [[-2 * q / 4] * 4], what="the gradient in chosen_logprobs")
    _expect(gr, [[2 * q / 3] * 3 + [0.0]], what="the gradient in rejected_logprobs")


@_case(ex, "an extreme margin", NAIVE_LOGSIG)
def _(fn, gen):
    loss = _loss(fn(_t([[-100.0]]), _t([[1]]), _t([[-1.0]]), _t([[1]])))
    # the defaults beta 2, gamma 1: 2 * (-100 + 1) - 1 = -199: -log sigmoid(-199) = 199.0
    _expect(loss, 199.0, what="the loss", rtol=1e-5)


@_case(ex, "random pairs with padding, beta 1.5, gamma 0.3, against the definition", SIMPO_SUM)
def _(fn, gen):
    c, r = (-torch.rand(4, 6, generator=gen) * 3).requires_grad_(True), (-torch.rand(4, 6, generator=gen) * 3)
    r.requires_grad_(True)
    cm = (torch.arange(6) < torch.tensor([6, 2, 4, 1]).unsqueeze(1)).float()
    rm = (torch.arange(6) < torch.tensor([3, 6, 1, 5]).unsqueeze(1)).float()
    want = ref.simpo_loss_from_tokens(c, cm, r, rm, beta=1.5, gamma=0.3)
    got = _loss(fn(c, cm, r, rm, beta=1.5, gamma=0.3))
    _expect(got, want.detach(), what="the loss")
    for g, w, what in zip(_grad(got, (c, r)), torch.autograd.grad(want, (c, r)), ("chosen", "rejected"), strict=True):
        _expect(g, w, what=f"the gradient in the {what} log-probs")
