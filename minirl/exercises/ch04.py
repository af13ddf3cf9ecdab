"""Exercises of chapter 04: DAPO.

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _reference as ref
from ._core import (
    _case,
    _exercise,
    _expect,
    _grad,
    _leaf,
    _prefix_mask,
    _t,
)
from .ch01 import SEQ_MEAN_NOT_TOKEN
from .ch02 import LAYOUT, TOKEN_MEAN_NOT_SEQ

# ================================================================================================================
# 04 · DAPO


ex = _exercise("aggregate", "04", "aggregate(per_token, mask, mode, *, max_tokens=None) -> scalar  (modes token-mean, "
               "seq-mean-token-mean, seq-mean-token-sum-norm)", "minirl.losses.aggregate", ("minirl.losses.aggregate",))
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

ex = _exercise("overlong_penalty", "04", "overlong_penalty(lengths, *, max_len, cache_len) -> (B,) in [-1, 0]",
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

ex = _exercise("has_signal", "04", "has_signal(rewards, group_size) -> (num_groups,) bool",
               "minirl.sampling.has_signal", ("minirl.sampling.has_signal",))
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
