"""Exercises of chapter 15: learned rewards (the Bradley-Terry loss of a reward model; best-of-n measured by the gold
reward).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch

from . import _reference as ref
from ._core import _case, _exercise, _expect, _expect_raises, _grad, _leaf, _loss, _t
from .ch08 import BATCH_SUM, NAIVE_LOGSIG

# ================================================================================================================
# 15 · the Bradley-Terry loss of a reward model

ex = _exercise("bradley_terry_loss", "15",
               "bradley_terry_loss(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None) -> loss",
               "minirl.reward_models.bradley_terry_loss", ("minirl.reward_models.bradley_terry_loss",))
BT_SIGN = ("the preferred answer must score HIGHER: the loss is -log sigmoid(r_chosen - r_rejected); with the "
           "difference the other way round the model learns to prefer the rejected answers")
BT_NO_LOG = ("the loss is the negative LOG-likelihood, -log sigmoid(r_c - r_r): -sigmoid(r_c - r_r) alone has a "
             "vanishing gradient for pairs the model gets badly wrong, the ones it should learn most from")
BT_MARGIN_ADDED = ("TRL's margin is SUBTRACTED: -log sigmoid(r_c - r_r - margin), so a pair labelled 'much better' "
                   "must be won by more than its margin; adding it makes such pairs easier, not harder")
BT_CENTER_DIFF = ("the centring term squares the SUM of the two rewards, center_coef * mean((r_c + r_r)^2): it pins "
                  "the rewards' level near 0 (the loss alone sees only differences); squaring the difference would "
                  "fight the loss itself")
BT_CENTER_SUM = "the centring term is a MEAN over the pairs too, center_coef * mean((r_c + r_r)^2), not a sum"


@_case(ex, "two pairs by hand", BT_SIGN)
def _(fn, gen):
    loss = _loss(fn(_t([1.0, 0.0]), _t([0.0, 0.0])))
    # -(log sigmoid(1) + log sigmoid(0)) / 2 = (0.313262 + 0.693147) / 2 = 0.503204
    # the sign flipped: (1.313262 + 0.693147) / 2 = 1.003204; summed: 1.006409; no log: -(0.731059 + 0.5) / 2
    _expect(loss, 0.503204434, [(1.003204434, BT_SIGN), (1.006408868, BATCH_SUM), (-0.615529289, BT_NO_LOG)],
            what="the loss")


@_case(ex, "the gradient by hand", BT_SIGN)
def _(fn, gen):
    chosen, rejected = _leaf([1.0, 0.0]), _leaf([0.0, 0.0])
    g_chosen, g_rejected = _grad(_loss(fn(chosen, rejected)), (chosen, rejected))
    # d/d r_c = -sigmoid(-(r_c - r_r)) / B = (-0.268941 / 2, -0.5 / 2); d/d r_r is its opposite
    _expect(g_chosen, [-0.134470711, -0.25], [([0.134470711, 0.25], BT_SIGN)], what="the gradient in chosen_rewards")
    _expect(g_rejected, [0.134470711, 0.25], what="the gradient in rejected_rewards")


@_case(ex, "a margin (Llama 2's), subtracted from the difference", BT_MARGIN_ADDED)
def _(fn, gen):
    loss = _loss(fn(_t([1.0, 0.0]), _t([0.0, 0.0]), margin=_t([1.0, 0.0])))
    # differences minus margins: (0, 0): ln 2 = 0.693147; the margin added: (2, 0): (0.126928 + 0.693147) / 2
    _expect(loss, math.log(2), [(0.410037596, BT_MARGIN_ADDED)], what="the loss")


@_case(ex, "the centring term, center_coef 0.01", BT_CENTER_DIFF)
def _(fn, gen):
    loss = _loss(fn(_t([1.0, 0.0]), _t([0.5, -1.0]), center_coef=0.01))
    # differences (0.5, 1): (0.474077 + 0.313262) / 2 = 0.393669; sums (1.5, -1): 0.01 * (2.25 + 1) / 2 = 0.01625
    # squared differences: 0.01 * (0.25 + 1) / 2 = 0.00625; the sum of squares over the pairs: 0.0325
    _expect(loss, 0.409919336, [(0.399919336, BT_CENTER_DIFF), (0.426169336, BT_CENTER_SUM),
                                (0.393669336, "center_coef was ignored: add center_coef * mean((r_c + r_r)^2)")],
            what="the loss")


@_case(ex, "an extreme difference (-200): finite, gradient -1 per pair", NAIVE_LOGSIG)
def _(fn, gen):
    chosen = _leaf([-100.0])
    loss = _loss(fn(chosen, _t([100.0])))
    # -log sigmoid(-200) = softplus(200) = 200 (to float precision); its gradient in r_c: -sigmoid(200) = -1
    _expect(loss, 200.0, what="the loss", rtol=1e-5)
    _expect(_grad(loss, chosen), [-1.0], what="the gradient in chosen_rewards")


@_case(ex, "random pairs with margins and centring, against the definition", BT_SIGN)
def _(fn, gen):
    chosen, rejected = (torch.randn(7, generator=gen) * 3).requires_grad_(), torch.randn(7, generator=gen) * 3
    margin = torch.rand(7, generator=gen)
    want = ref.bradley_terry_loss(chosen, rejected, margin=margin, center_coef=0.05)
    got = _loss(fn(chosen, rejected, margin=margin, center_coef=0.05))
    _expect(got, want.detach(), what="the loss")
    _expect(_grad(got, chosen), torch.autograd.grad(want, chosen)[0], what="the gradient in chosen_rewards")


# ================================================================================================================
# 15 · best-of-n measured by the gold reward

ex = _exercise("best_of_n_gold", "15", "best_of_n_gold(proxy, gold, ns) -> (len(ns),) mean gold of the picks",
               "minirl.reward_models.best_of_n_gold", ("minirl.reward_models.best_of_n_gold",))
BON_ALL = ("each n picks among the FIRST n samples of a prompt (the best of n draws); picking among all N gives every "
           "n the same answer")
BON_BY_GOLD = ("the pick is the PROXY's favourite (the reward the policy is optimised against), measured by the gold "
               "score; picking by gold draws the oracle's curve, which cannot show over-optimisation")
BON_PROXY = "report the picks' GOLD score: their proxy score is what the proxy believes, and it always rises with n"
BON_NO_PICK = "no pick was made: the mean gold of the first n samples is the policy's own accuracy at every n"
BON_LAST = ("of equal proxy scores the FIRST sample is picked (as if the n were drawn one by one and a tie kept the "
            "first)")
_P, _G = [[0.1, 0.9, 0.5, 0.95]], [[1.0, 0.0, 1.0, 0.0]]


@_case(ex, "one prompt by hand: the proxy prefers the wrong answers", BON_BY_GOLD)
def _(fn, gen):
    # n = 1: sample 0 (gold 1); n = 2, 3: sample 1 (proxy 0.9, gold 0); n = 4: sample 3 (0.95, gold 0)
    # by gold: 1 at every n; among all 4: sample 3 every time; the proxy reported: (0.1, 0.9, 0.9, 0.95);
    # no pick: the first n's mean gold (1, 0.5, 0.6667, 0.5)
    _expect(fn(_t(_P), _t(_G), [1, 2, 3, 4]), [1.0, 0.0, 0.0, 0.0],
            [([1.0, 1.0, 1.0, 1.0], BON_BY_GOLD), ([0.0, 0.0, 0.0, 0.0], BON_ALL), ([0.1, 0.9, 0.9, 0.95], BON_PROXY),
             ([1.0, 0.5, 2 / 3, 0.5], BON_NO_PICK)], what="the picks' mean gold")


@_case(ex, "two prompts, the mean over prompts", BON_ALL)
def _(fn, gen):
    proxy, gold = _t([[0.0, 2.0, 1.0], [3.0, 1.0, 5.0]]), _t([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # n = 1: samples 0 and 0 -> (0 + 1) / 2 = 0.5; n = 2: 1 and 0 -> (1 + 1) / 2 = 1; n = 3: 1 and 2 -> 0.5
    # among all three every time: 0.5 at each n
    _expect(fn(proxy, gold, [1, 2, 3]), [0.5, 1.0, 0.5], [([0.5, 0.5, 0.5], BON_ALL)], what="the picks' mean gold")


@_case(ex, "ties: the first of equals", BON_LAST)
def _(fn, gen):
    proxy, gold = _t([[1.0, 1.0, 1.0, 0.0]]), _t([[0.0, 1.0, 1.0, 1.0]])
    # every n picks sample 0 (gold 0); the last of equals: samples 0, 1, 2, 2 -> (0, 1, 1, 1)
    _expect(fn(proxy, gold, [1, 2, 3, 4]), [0.0, 0.0, 0.0, 0.0], [([0.0, 1.0, 1.0, 1.0], BON_LAST)],
            what="the picks' mean gold")


@_case(ex, "random scores against the definition", BON_ALL)
def _(fn, gen):
    proxy, gold = torch.randn(9, 16, generator=gen), (torch.rand(9, 16, generator=gen) < 0.4).float()
    ns = [1, 2, 4, 8, 16]
    _expect(fn(proxy, gold, ns), ref.best_of_n_gold(proxy, gold, ns), what="the picks' mean gold")


@_case(ex, "an n larger than the samples is refused", "raise ValueError for an n outside [1, N]: there are only N "
       "samples of each prompt to pick from")
def _(fn, gen):
    _expect_raises(lambda: fn(_t(_P), _t(_G), [2, 5]), ValueError, "raise ValueError for an n outside [1, N]: there "
                   "are only N samples of each prompt to pick from")
