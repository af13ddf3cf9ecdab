"""Exercises of chapter 05: DAPO, and the losses that keep the gradient PPO's clip removes (CISPO, SAPO, GMPO).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch
from torch import Tensor

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
    _loss,
    _prefix_mask,
    _t,
)
from .ch02 import SEQ_MEAN_NOT_TOKEN
from .ch03 import LAYOUT, TOKEN_MEAN_NOT_SEQ

# ================================================================================================================
# 05 · DAPO


ex = _exercise("aggregate", "05", "aggregate(per_token, mask, mode, *, max_tokens=None) -> scalar  (modes token-mean, "
               "seq-mean-token-mean, seq-mean-token-sum-norm)", "minirl.aggregation.aggregate",
               ("minirl.aggregation.aggregate",))
PER_T = "divides each row by the padded length T instead of its number of valid tokens"
DRGRPO_LENGTH = ("Dr. GRPO's normaliser is the constant max_tokens, not each row's own length (that brings the "
                 "length bias back)")
DRGRPO_T = "use max_tokens (the generation budget) when it is given, not the padded width T of this batch"
EMPTY_ROW = ("a row with no valid token (e.g. an overlong completion filtered out) is left out of the mean over "
             "sequences, and must not produce NaN")
EMPTY_BATCH = "a fully masked batch must give 0 (with a gradient of 0), not 0/0 = NaN"
_AGG_X = [[2.0, 2.0, 2.0, 7.0], [10.0, 7.0, 7.0, 7.0]]  # the 7s sit in padding
_AGG_M = [[1, 1, 1, 0], [1, 0, 0, 0]]


@_case(ex, "token-mean by hand", SEQ_MEAN_NOT_TOKEN)
def _(fn, gen):
    # (2 + 2 + 2 + 10) / 4 tokens = 4.0; seq-mean: (2 + 10) / 2 = 6.0; unmasked over 8: 44 / 8 = 5.5
    _expect(fn(_t(_AGG_X), _t(_AGG_M), "token-mean"), 4.0,
            [(6.0, SEQ_MEAN_NOT_TOKEN), (5.5, "padding was counted: sum and count only the valid tokens")])


@_case(ex, "seq-mean-token-mean by hand", TOKEN_MEAN_NOT_SEQ)
def _(fn, gen):
    # (6/3 + 10/1) / 2 = 6.0; token-mean 4.0; per-row over T = 4: (6/4 + 10/4) / 2 = 2.0
    _expect(fn(_t(_AGG_X), _t(_AGG_M), "seq-mean-token-mean"), 6.0, [(4.0, TOKEN_MEAN_NOT_SEQ), (2.0, PER_T)])


@_case(ex, "seq-mean-token-sum-norm (Dr. GRPO) by hand, max_tokens 8", DRGRPO_LENGTH)
def _(fn, gen):
    # (6/8 + 10/8) / 2 = 1.0; by each row's length: 6.0; by T = 4: 2.0
    _expect(fn(_t(_AGG_X), _t(_AGG_M), "seq-mean-token-sum-norm", max_tokens=8), 1.0,
            [(6.0, DRGRPO_LENGTH), (2.0, DRGRPO_T)])


@_case(ex, "gradient of seq-mean-token-mean", TOKEN_MEAN_NOT_SEQ)
def _(fn, gen):
    x = _leaf(_AGG_X)
    # each valid token of row i gets 1 / n_i / B: 1/6 (row 0) and 1/2 (row 1); token-mean: 1/4 everywhere
    _expect(_grad(fn(x, _t(_AGG_M), "seq-mean-token-mean"), x), [[1 / 6] * 3 + [0], [0.5, 0, 0, 0]],
            [([[0.25] * 3 + [0], [0.25, 0, 0, 0]], TOKEN_MEAN_NOT_SEQ)], what="the gradient")


@_case(ex, "a row with no valid token", EMPTY_ROW)
def _(fn, gen):
    x, m = _t([[2.0, 2.0, 2.0, 0.0], [5.0, 5.0, 5.0, 5.0]]), _t([[1, 1, 1, 0], [0, 0, 0, 0]])
    # only row 0 counts: 6/3 = 2.0 and (6/4) / 1 = 1.5; counting the empty row: 1.0 and 0.75
    _expect(fn(x, m, "seq-mean-token-mean"), 2.0, [(1.0, EMPTY_ROW)], what="seq-mean-token-mean")
    _expect(fn(x, m, "seq-mean-token-sum-norm", max_tokens=4), 1.5, [(0.75, EMPTY_ROW)], what="seq-mean-token-sum-norm")


@_case(ex, "a fully masked batch", EMPTY_BATCH)
def _(fn, gen):
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        x = _leaf([[1.0, 2.0], [3.0, 4.0]])
        out = fn(x, _t([[0, 0], [0, 0]]), mode, max_tokens=2)
        _expect(out, 0.0, what=mode)
        if isinstance(out, Tensor) and out.requires_grad:
            _expect(_grad(out, x), [[0.0, 0.0], [0.0, 0.0]], what=f"the gradient of {mode}")


@_case(ex, "random batches against the definition", "compare with the hand cases: which tokens are summed, and "
       "what each mode divides by")
def _(fn, gen):
    x, m = torch.randn(5, 6, generator=gen), _prefix_mask([6, 1, 0, 4, 2], 6)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        _expect(fn(x, m, mode, max_tokens=10), ref.aggregate(x, m, mode, max_tokens=10), what=mode)
    # max_tokens None (the default) is the padded width T for Dr. GRPO's normaliser
    _expect(fn(x, m, "seq-mean-token-sum-norm"), ref.aggregate(x, m, "seq-mean-token-sum-norm"),
            what="seq-mean-token-sum-norm without max_tokens")


# --------------------------------------------------------------------------------------------- overlong_penalty

ex = _exercise("overlong_penalty", "05", "overlong_penalty(lengths, *, max_len, cache_len) -> (B,) in [-1, 0]",
               "minirl.rewards.overlong_penalty", ("minirl.rewards.overlong_penalty",))
RAMP_OFF = ("the ramp is off by one: the penalty is 0 up to AND INCLUDING max_len - cache_len and reaches -1 "
            "exactly at max_len")
PENALTY_SIGN = "it is a penalty in [-1, 0]: the sign is flipped"
BEYOND = "beyond max_len the penalty stays at -1 (clamp it)"


@_case(ex, "max_len 20, cache_len 4, by hand", RAMP_OFF)
def _(fn, gen):
    got = fn(torch.tensor([15, 16, 17, 18, 19, 20, 21]), max_len=20, cache_len=4)
    # (16 - L) / 4 clamped to [-1, 0]: 0, 0, -0.25, -0.5, -0.75, -1, -1
    _expect(got, [0, 0, -0.25, -0.5, -0.75, -1, -1],
            [([0, 0, 0, -0.25, -0.5, -0.75, -1], RAMP_OFF), ([0, -0.25, -0.5, -0.75, -1, -1, -1], RAMP_OFF),
             ([0, 0, 0.25, 0.5, 0.75, 1, 1], PENALTY_SIGN), ([0, 0, -0.25, -0.5, -0.75, -1, -1.25], BEYOND)])


@_case(ex, "cache_len = max_len", "the ramp may start at length 0: (max_len - cache_len - L) / cache_len")
def _(fn, gen):
    _expect(fn(torch.tensor([0, 5, 10]), max_len=10, cache_len=10), [0, -0.5, -1])


@_case(ex, "float lengths and a wide cache", RAMP_OFF)
def _(fn, gen):
    got = fn(torch.tensor([100.0, 101.0, 150.0, 199.0]), max_len=200, cache_len=100)
    # (100 - L) / 100: 0, -0.01, -0.5, -0.99
    _expect(got, [0, -0.01, -0.5, -0.99], [([0, 0, -0.49, -0.98], RAMP_OFF)])


@_case(ex, "random lengths around the ramp against the definition", RAMP_OFF)
def _(fn, gen):
    lengths = torch.randint(20, 45, (12,), generator=gen)  # max_len 40, cache_len 12: ramp from 28 to 40
    want = ref.overlong_penalty(lengths, max_len=40, cache_len=12)
    _expect(fn(lengths, max_len=40, cache_len=12), want,
            [(ref.overlong_penalty(lengths - 1, max_len=40, cache_len=12), RAMP_OFF), (-want, PENALTY_SIGN)])


# ------------------------------------------------------------------------------------------------- has_signal

ex = _exercise("has_signal", "05", "has_signal(rewards, group_size) -> (num_groups,) bool",
               "minirl.group_filter.has_signal", ("minirl.group_filter.has_signal",))
ANY_CORRECT = ("a group that is ALL correct carries no signal either: keep the groups whose rewards are not all "
               "equal (DAPO eq. 11: 0 < #correct < G)")


@_case(ex, "three groups of two, by hand", ANY_CORRECT)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), 2)
    # any correct: (1, 0, 1); groups read with a stride (columns of a (G, B/G) view): (1, 1, 1)
    _expect(got, [1, 0, 0], [([1, 0, 1], ANY_CORRECT), ([1, 1, 1], LAYOUT)])


@_case(ex, "groups laid out group by group", LAYOUT)
def _(fn, gen):
    got = fn(_t([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), 2)  # groups (1, 1), (0, 0), (1, 0)
    _expect(got, [0, 0, 1], [([1, 0, 1], ANY_CORRECT)])


@_case(ex, "non-binary rewards", "compare the rewards within each group: any two that differ make a signal")
def _(fn, gen):
    _expect(fn(_t([0.5, 0.5, 0.5, 0.2, 0.7, 0.2]), 3), [0, 1], [([1, 1], ANY_CORRECT)])


@_case(ex, "random groups against the definition", LAYOUT)
def _(fn, gen):
    r = torch.randint(0, 2, (40,), generator=gen).float()  # ten groups of four 0/1 rewards
    g = r.view(10, 4)
    _expect(fn(r, 4), ref.has_signal(r, 4), [((g > 0).any(1).double(), ANY_CORRECT),
                                             (ref.has_signal(r.view(4, 10).t().reshape(-1), 4).double(), LAYOUT)])


# ================================================================================================================
# 05 · beyond the clip: CISPO and SAPO (notebook 05, section 1b)

ex = _exercise("cispo_loss", "05", "cispo_loss(logprobs, old_logprobs, advantages, mask, *, eps_low=0.2, eps_high=0.2) "
               "-> loss (token-mean; advantages (B,))",
               "minirl.clip_alternatives.cispo_loss (form='two-sided', agg='token-mean')",
               ("minirl.clip_alternatives.cispo_loss", "minirl.losses.policy_loss"))
CISPO_IS_NOT_PPO = ("this is PPO's clipped surrogate -A * clip(r): CISPO multiplies the DETACHED, clipped weight by "
                    "log pi (REINFORCE's -A log pi), so a token whose ratio left the band keeps its gradient "
                    "(only its weight stops growing)")
RATIO_NOT_LOGP = ("the detached weight multiplies the ratio, not log pi(y_t): on-policy the two have the same "
                  "gradient, but the loss is -sg(w) * A * log pi (MiniMax-M1 eq. 4)")
WEIGHT_NOT_DETACHED = ("the weight is not detached: CISPO's gradient is -w * A * d log pi with w a constant "
                       "(sg(w), eq. 4); without the stop-gradient the ratio inside the band adds its own gradient")
PPO_OR_RATIO = ("the loss is -sg(w) * A * log pi: this is PPO's clipped surrogate -A * clip(r), or the detached "
                "weight multiplies the ratio, not log pi(y_t) (on-policy both have CISPO's gradient, not its loss)")
ONE_SIDED = ("the weight is also raised to 1 - eps_low from below: the two-sided clip of the paper's eq. 5 (verl); "
             "min(r, 1 + eps_high) alone is TRL's one-sided form, another setting")


def _cispo(fn, lp, old, adv, mask, **settings):
    return _loss(fn(lp, old, adv, mask, **settings))


@_case(ex, "on-policy, by hand", RATIO_NOT_LOGP)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    loss = _cispo(fn, lp, _t([[-1.0, -2.0]]), _t([1.0]), _t([[1, 1]]))
    # w = 1, A = +1: (-1 * -1 + -1 * -2) / 2 = 1.5; PPO (or the ratio in place of log pi): (-1 - 1) / 2 = -1.0
    _expect(loss, 1.5, [(-1.0, PPO_OR_RATIO)], what="the loss")
    # -w * A / 2 tokens; with the weight not detached: (-r - lp * r) / 2 = (0, 0.5)
    _expect(_grad(loss, lp), [[-0.5, -0.5]], [([[0.0, 0.5]], WEIGHT_NOT_DETACHED)], what="the gradient")


@_case(ex, "inside the band: the weight carries no gradient", WEIGHT_NOT_DETACHED)
def _(fn, gen):
    lp = _leaf([[-0.9]])
    loss = _cispo(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), eps_low=0.2, eps_high=0.2)
    # r = e^0.1 = 1.105171 inside [0.8, 1.2]: loss -1.105171 * (-0.9) = 0.994654, gradient -w = -1.105171;
    # not detached: d(-r * lp) = -r - lp * r = -1.105171 + 0.994654 = -0.110517
    _expect(loss, 0.994654, what="the loss")
    _expect(_grad(loss, lp), [[-1.105171]], [([[-0.110517]], WEIGHT_NOT_DETACHED)], what="the gradient")


@_case(ex, "ratio above 1 + eps_high with A > 0: capped weight, the gradient stays", CISPO_IS_NOT_PPO)
def _(fn, gen):
    lp = _leaf([[-0.5]])
    loss = _cispo(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), eps_low=0.2, eps_high=0.28)
    # r = e^0.5 = 1.648721 > 1.28: w = 1.28, loss -1.28 * (-0.5) = 0.64, gradient -1.28;
    # PPO: -A * clip(r) = -1.28 with gradient 0; the weight times the ratio: -1.28 * 1.648721 = -2.110363
    _expect(loss, 0.64, [(-1.28, CISPO_IS_NOT_PPO), (-2.110363, RATIO_NOT_LOGP)], what="the loss")
    _expect(_grad(loss, lp), [[-1.28]], [([[0.0]], CISPO_IS_NOT_PPO)], what="the gradient")


@_case(ex, "ratio below 1 - eps_low with A < 0: the weight is raised to 1 - eps_low", ONE_SIDED)
def _(fn, gen):
    lp = _leaf([[-1.5]])
    loss = _cispo(fn, lp, _t([[-1.0]]), _t([-1.0]), _t([[1]]), eps_low=0.2, eps_high=0.28)
    # r = e^-0.5 = 0.606531 < 0.8: w = 0.8, loss -0.8 * (-1) * (-1.5) = -1.2, gradient -w * A = 0.8;
    # one-sided w = r: loss -0.909796, gradient 0.606531; PPO: -A * clip(r) = 0.8
    _expect(loss, -1.2, [(-0.909796, ONE_SIDED), (0.8, CISPO_IS_NOT_PPO)], what="the loss")
    _expect(_grad(loss, lp), [[0.8]], [([[0.606531]], ONE_SIDED)], what="the gradient")


@_case(ex, "the defaults: eps_low 0.2, eps_high 0.2", "the default clip range of the weight is [0.8, 1.2]")
def _(fn, gen):
    lp = _leaf([[-0.75, -1.3]])
    loss = _cispo(fn, lp, _t([[-1.0, -1.0]]), _t([1.0]), _t([[1, 1]]))
    # r = e^0.25 = 1.284025 -> w 1.2; r = e^-0.3 = 0.740818 -> w 0.8: (0.9 + 1.04) / 2 = 0.97;
    # one-sided (w = 0.740818 on the second token): (0.9 + 0.963063) / 2 = 0.931532
    _expect(loss, 0.97, [(0.931532, ONE_SIDED)], what="the loss")
    _expect(_grad(loss, lp), [[-0.6, -0.4]], what="the gradient")


@_case(ex, "token-mean over rows of different lengths, garbage in padding", SEQ_MEAN_NOT_TOKEN)
def _(fn, gen):
    lp = _t([[-1.0, -1.0, -50.0], [-2.0, 0.0, 0.0]])
    old = _t([[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]])
    loss = _cispo(fn, lp, old, _t([1.0, -1.0]), _t([[1, 1, 0], [1, 0, 0]]))
    # w = 1 on the valid tokens: 1, 1 (A = +1) and -2 (A = -1, log pi -2): (1 + 1 - 2) / 3 = 0; seq-mean -0.5
    _expect(loss, 0.0, [(-0.5, SEQ_MEAN_NOT_TOKEN)], what="the loss")


@_case(ex, "random ratios on both sides of both bounds, against the definition", CISPO_IS_NOT_PPO)
def _(fn, gen):
    mask = _prefix_mask([6, 2, 5, 4], 6)
    lp = (-torch.rand(4, 6, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.4 * torch.randn(4, 6, generator=gen)  # ratios from about 0.3 to 3
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0]) * (1 + torch.rand(4, generator=gen))
    want = ref.cispo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    loss = _cispo(fn, lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient")


# --------------------------------------------------------------------------------------------------- sapo_loss

ex = _exercise("sapo_loss", "05", "sapo_loss(logprobs, old_logprobs, advantages, mask, *, tau_pos=1.0, tau_neg=1.05) "
               "-> loss (seq-mean-token-mean; advantages (B,))", "minirl.clip_alternatives.sapo_loss",
               ("minirl.clip_alternatives.sapo_loss", "minirl.losses.policy_loss"))
TAU_SWAPPED = ("the temperatures are swapped: tau_pos is for tokens with a positive advantage, tau_neg for A <= 0 "
               "(SAPO eq. 6: negative tokens decay faster)")
TAU_BY_RATIO = ("the temperature follows the sign of the ADVANTAGE, not the side of 1 the ratio is on (the sign "
                "error of a clip's min / max, made again with a gate)")
NO_SCALE = ("the gate is (4 / tau) * sigmoid(tau (r - 1)): the 4 / tau makes its on-policy gradient exactly the plain "
            "policy gradient -A, whatever tau")
NOT_CENTRED = "the gate is centred at r = 1: sigmoid(tau * (r - 1)), not sigmoid(tau * r)"


def _sapo(fn, lp, old, adv, mask, **settings):
    return _loss(fn(lp, old, adv, mask, **settings))


@_case(ex, "on-policy, A > 0 and A < 0, the defaults (tau 1.0 / 1.05), by hand", NO_SCALE)
def _(fn, gen):
    lp = _leaf([[-1.0], [-2.0]])
    loss = _sapo(fn, lp, _t([[-1.0], [-2.0]]), _t([1.0, -0.5]), _t([[1], [1]]))
    # r = 1, sigmoid(0) = 0.5: f = 2 / tau. Row 0 (A = 1, tau 1): -2; row 1 (A = -0.5, tau 1.05): 0.5 * 1.904762;
    # mean over the 2 rows -0.523810. Swapped: -0.452381; without 4 / tau: -0.125; tau by r > 1: -0.476190
    # not centred, sigmoid(tau * r): -0.756617
    _expect(loss, -0.523810, [(-0.452381, TAU_SWAPPED), (-0.125, NO_SCALE), (-0.476190, TAU_BY_RATIO),
                              (-0.756617, NOT_CENTRED)], what="the loss")
    # on-policy the gradient is the plain policy gradient -A, / 2 rows
    _expect(_grad(loss, lp), [[-0.5], [0.25]], what="the gradient")


@_case(ex, "ratio above 1 with A > 0, by hand", NOT_CENTRED)
def _(fn, gen):
    lp = _leaf([[-0.5]])
    loss = _sapo(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), tau_pos=1.0, tau_neg=2.0)
    # r = e^0.5 = 1.648721, s = sigmoid(0.648721) = 0.656722: f = 4 s = 2.626889, loss -2.626889,
    # gradient -4 r s (1 - s) = -1.486739 (PPO's is 0 there); sigmoid(tau * r): f = 3.354873
    _expect(loss, -2.626889, [(-3.354873, NOT_CENTRED)], what="the loss")
    _expect(_grad(loss, lp), [[-1.486739]], what="the gradient")


@_case(ex, "ratio above 1 with A < 0: tau_neg", TAU_SWAPPED)
def _(fn, gen):
    lp = _leaf([[-0.5]])
    loss = _sapo(fn, lp, _t([[-1.0]]), _t([-1.0]), _t([[1]]), tau_pos=1.0, tau_neg=2.0)
    # tau 2: s = sigmoid(1.297443) = 0.785378, f = 2 s = 1.570809, loss +1.570809, gradient 4 r s (1 - s) = 1.111531;
    # with tau_pos: 2.626889
    _expect(loss, 1.570809, [(2.626889, TAU_SWAPPED)], what="the loss")
    _expect(_grad(loss, lp), [[1.111531]], what="the gradient")


@_case(ex, "ratio below 1 with A > 0: still tau_pos", TAU_BY_RATIO)
def _(fn, gen):
    lp = _leaf([[-1.5]])
    loss = _sapo(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), tau_pos=0.5, tau_neg=2.0)
    # r = e^-0.5 = 0.606531, tau 0.5: s = sigmoid(-0.196735) = 0.450975, f = 8 s = 3.607795, loss -3.607795,
    # gradient -4 r s (1 - s) = -0.600699; with tau_neg (the ratio is below 1): -0.625653
    _expect(loss, -3.607795, [(-0.625653, TAU_BY_RATIO)], what="the loss")
    _expect(_grad(loss, lp), [[-0.600699]], what="the gradient")


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    loss = _sapo(fn, lp, lp, _t([1.0]), _t([[1, 1]]))
    # on-policy: each token's gradient is -A / 2 tokens (one row)
    _expect(_grad(loss, lp, no_grad_hint=OLD_DETACHED), [[-0.5, -0.5]], [([[0.0, 0.0]], OLD_DETACHED)],
            what="the gradient")


@_case(ex, "seq-mean-token-mean over rows of different lengths, garbage in padding", TOKEN_MEAN_NOT_SEQ)
def _(fn, gen):
    lp = _t([[-1.0, -1.0, -50.0], [-1.0, 0.0, 0.0]])
    old = _t([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    loss = _sapo(fn, lp, old, _t([1.0, 3.0]), _t([[1, 1, 0], [1, 0, 0]]), tau_pos=1.0, tau_neg=1.0)
    # r = 1 on every valid token, f = 2: row 0 -2 per token (two tokens), row 1 -6 (one token):
    # seq-mean (-2 - 6) / 2 = -4; token-mean (-2 - 2 - 6) / 3 = -3.333333
    _expect(loss, -4.0, [(-10 / 3, TOKEN_MEAN_NOT_SEQ)], what="the loss")


@_case(ex, "random ratios, advantages and temperatures, against the definition", TAU_BY_RATIO)
def _(fn, gen):
    mask = _prefix_mask([6, 2, 5, 0], 6)
    lp = (-torch.rand(4, 6, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.4 * torch.randn(4, 6, generator=gen)
    adv = torch.tensor([1.0, -1.0, -0.5, 2.0]) * (1 + torch.rand(4, generator=gen))
    tau_pos, tau_neg = (0.5 + torch.rand(2, generator=gen)).tolist()
    want = ref.sapo_loss(lp, old, adv, mask, tau_pos=tau_pos, tau_neg=tau_neg)
    loss = _sapo(fn, lp, old, adv, mask, tau_pos=tau_pos, tau_neg=tau_neg)
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient")


@_case(ex, "an extreme log-ratio (100 nats on a valid token and in padding)", NEEDS_FINITE.format(n=100))
def _(fn, gen):
    lp = _leaf([[99.0, -1.0, 99.0]])
    loss = _sapo(fn, lp, _t([[-1.0, -1.0, -1.0]]), _t([1.0]), _t([[1, 1, 0]]))
    _expect_finite(loss, lp, "the loss")
    # the gate saturates at 4 / tau = 4 on the first token, 2 on the second: (-4 - 2) / 2
    _expect(loss, -3.0, what="the loss")


# --------------------------------------------------------------------------------------------------- gmpo_loss

ex = _exercise("gmpo_loss", "05", "gmpo_loss(logprobs, old_logprobs, advantages, mask, *, eps_low=0.4, eps_high=0.4) "
               "-> loss (mean over sequences; advantages (B,))", "minirl.clip_alternatives.gmpo_loss",
               ("minirl.clip_alternatives.gmpo_loss", "minirl.losses.policy_loss"))
GMPO_SIDE = ("for A < 0 the pessimistic side is the LARGER log-ratio, max(l, clip(l)), not min: the sign error of a "
             "min / max clip for negative advantages (PPO takes the max of -A r and -A clip(r); in log space that is "
             "min for A > 0 and max for A < 0)")
GMPO_CLIP_ONLY = ("this is clip(l) alone: GMPO keeps the unclipped log-ratio on the side the advantage does not push "
                  "(min(l, clip(l)) for A > 0, max for A < 0), so a token that moved the wrong way keeps its gradient")
GMPO_MIRROR = ("for A > 0 the pessimistic side is the SMALLER log-ratio, min(l, clip(l)): max is the optimistic "
               "branch")
GMPO_RATIO_SPACE = ("GMPO clips the LOG-ratio to [-eps_low, eps_high] (the ratio to [e^-eps_low, e^eps_high]), not "
                    "the ratio to [1 - eps_low, 1 + eps_high]")
GMPO_ARITH = ("the sequence's weight is the GEOMETRIC mean of its (clipped) token ratios, exp of the mean log-ratio; "
              "the arithmetic mean is GRPO's token average, which one outlier token dominates")
GMPO_PAD = ("the mean log-ratio is over the row's valid tokens: padding holds garbage, and dividing by the padded "
            "length T shrinks short rows' weights towards 1")
GMPO_MIN_OR_CLIP = ("for A < 0 the pessimistic side is max(l, clip(l)): this took the min (the A > 0 rule: the sign "
                    "error of a min / max clip for negative advantages) or clip(l) alone (which drops the unclipped "
                    "log-ratio on the side the advantage does not push)")
GMPO_EMPTY = "a row with no valid token is left out of the mean over sequences (and gives no NaN)"


def _gmpo(fn, lp, old, adv, mask, **settings):
    return _loss(fn(lp, old, adv, mask, **settings))


@_case(ex, "the paper's bounds (0.4 / 0.4), A = +1 and A = -1, by hand", GMPO_SIDE)
def _(fn, gen):
    for a, want, grad, wrong in (
            # l = (0.6, 0): A > 0 takes min(l, clip(l)) = (0.4, 0): weight e^0.2 = 1.221403, loss -1.221403,
            # gradient (0, -1.221403 / 2); max instead (the optimistic side): e^0.3, -1.349859
            # ratio-space clip of e^0.6 to 1.4: exp(ln(1.4) / 2) = 1.183216; arithmetic mean (e^0.4 + 1) / 2 = 1.245912
            (1.0, -1.221403, [[0.0, -0.610701]], [(-1.349859, GMPO_MIRROR), (-1.183216, GMPO_RATIO_SPACE),
                                                   (-1.245912, GMPO_ARITH)]),
            # A < 0 takes max(l, clip(l)) = (0.6, 0): weight e^0.3 = 1.349859, loss 1.349859, gradient
            # (0.674929, 0.674929); min (the A > 0 rule, or clip alone): e^0.2, 1.221403
            (-1.0, 1.349859, [[0.674929, 0.674929]], [(1.221403, GMPO_MIN_OR_CLIP)])):
        lp = _leaf([[-0.4, -1.0]])
        loss = _gmpo(fn, lp, _t([[-1.0, -1.0]]), _t([a]), _t([[1, 1]]), eps_low=0.4, eps_high=0.4)
        _expect(loss, want, wrong, what=f"the loss with A = {a:+.0f}")
        _expect(_grad(loss, lp), grad, what=f"the gradient with A = {a:+.0f}")


@_case(ex, "A > 0, one token above the band and one below it", GMPO_CLIP_ONLY)
def _(fn, gen):
    lp = _leaf([[-0.4, -1.6]])
    loss = _gmpo(fn, lp, _t([[-1.0, -1.0]]), _t([1.0]), _t([[1, 1]]), eps_low=0.4, eps_high=0.4)
    # l = (0.6, -0.6): min(l, clip(l)) = (0.4, -0.6), mean -0.1: loss -e^-0.1 = -0.904837, gradient (0, -0.452419)
    # clip alone (0.4, -0.4): -1.0; max (0.6, -0.4): -e^0.1 = -1.105171
    _expect(loss, -0.904837, [(-1.0, GMPO_CLIP_ONLY), (-1.105171, GMPO_MIRROR)], what="the loss")
    _expect(_grad(loss, lp), [[0.0, -0.452419]], what="the gradient")


@_case(ex, "A < 0, one token above the band and one below it", GMPO_SIDE)
def _(fn, gen):
    lp = _leaf([[-0.4, -1.6]])
    loss = _gmpo(fn, lp, _t([[-1.0, -1.0]]), _t([-1.0]), _t([[1, 1]]), eps_low=0.4, eps_high=0.4)
    # l = (0.6, -0.6): max(l, clip(l)) = (0.6, -0.4), mean 0.1: loss e^0.1 = 1.105171, gradient (0.552585, 0)
    # min, the A > 0 rule (the sign error): (0.4, -0.6), e^-0.1 = 0.904837; clip alone (0.4, -0.4): 1.0
    _expect(loss, 1.105171, [(0.904837, GMPO_SIDE), (1.0, GMPO_CLIP_ONLY)], what="the loss")
    _expect(_grad(loss, lp), [[0.552585, 0.0]], what="the gradient")


@_case(ex, "the defaults: eps_low 0.4, eps_high 0.4", "GMPO's default log-ratio bounds are 0.4 on both sides")
def _(fn, gen):
    loss = _gmpo(fn, _t([[-0.5, -1.2]]), _t([[-1.0, -1.0]]), _t([1.0]), _t([[1, 1]]))
    # l = (0.5, -0.2): min(l, clip(l, -0.4, 0.4)) = (0.4, -0.2), mean 0.1: -e^0.1 = -1.105171; at 0.2 / 0.2: -1.0
    _expect(loss, -1.105171, [(-1.0, "GMPO's default log-ratio bounds are 0.4 / 0.4 (the paper's), not PPO's 0.2")],
            what="the loss")


@_case(ex, "rows of different lengths, garbage in padding, an empty row", GMPO_PAD)
def _(fn, gen):
    lp = _t([[-0.9, -1.1, 40.0], [-0.8, 7.0, 7.0], [3.0, 3.0, 3.0]])
    old = _t([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    loss = _gmpo(fn, lp, old, _t([1.0, 2.0, 5.0]), _t([[1, 1, 0], [1, 0, 0], [0, 0, 0]]))
    # row 0: l = (0.1, -0.1), mean 0: weight 1, term -1; row 1: l = 0.2: weight e^0.2, term -2.442806;
    # the empty row is left out: (-1 - 2.442806) / 2 = -1.721403. Mean over T = 3: row 1 -2 e^(0.2 / 3), -1.568939;
    # the empty row counted, weight e^0 = 1 (term -5, 3 rows): -2.814269, or term 0: -1.147602
    _expect(loss, -1.721403, [(-(1 + 2 * math.exp(0.2 / 3)) / 2, GMPO_PAD), (-2.814269, GMPO_EMPTY),
                              (-1.147602, GMPO_EMPTY)], what="the loss")


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    loss = _gmpo(fn, lp, lp, _t([1.0]), _t([[1, 1]]))
    # on-policy: d(-A exp(mean l)) / d lp_t = -A / 2 tokens
    _expect(_grad(loss, lp, no_grad_hint=OLD_DETACHED), [[-0.5, -0.5]], [([[0.0, 0.0]], OLD_DETACHED)],
            what="the gradient")


@_case(ex, "random ratios on both sides of both bounds, against the definition", GMPO_SIDE)
def _(fn, gen):
    mask = _prefix_mask([6, 2, 5, 0, 3], 6)
    lp = (-torch.rand(5, 6, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.5 * torch.randn(5, 6, generator=gen)
    adv = torch.tensor([1.0, -1.0, -0.5, 2.0, 0.7]) * (1 + torch.rand(5, generator=gen))
    eps_low, eps_high = (0.1 + 0.4 * torch.rand(2, generator=gen)).tolist()
    want = ref.gmpo_loss(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    loss = _gmpo(fn, lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient")
