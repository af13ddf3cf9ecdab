"""Exercises of chapter 06: entropy (the covariance term that lowers it, and pass@k, the measure of what it costs).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _reference as ref
from ._core import _case, _exercise, _expect, _expect_raises, _leaf, _Mismatch, _prefix_mask, _t

# ================================================================================================================
# 06 · the covariance term: Cov(log pi, A), one term per token

ex = _exercise("token_covariance", "06", "token_covariance(logprobs, advantages, mask) -> (B, T) (advantages (B,))",
               "minirl.entropy.token_covariance",
               ("minirl.entropy.token_covariance", "minirl.entropy.clip_cov_mask", "minirl.entropy.kl_cov_mask"))
COV_ROW = ("both means are over the valid tokens of the whole BATCH, not of each row: within a row every token has "
           "the same advantage, so row means make every term 0")
COV_CENTRE = ("centre BOTH factors: (log pi - mean log pi) * (A - mean A); a covariance of uncentred values is the "
              "mean of a product, not a covariance")
COV_PAD = ("the means are over the valid tokens only: padding holds garbage (count it and every term moves), and "
           "the terms outside the mask are 0")
COV_SEQ_MEAN = ("the advantage's mean is over the valid TOKENS (a sequence's advantage counts once per token, as in "
                "the loss), not over the sequences")
COV_SCALAR = ("return one term per token, (B, T): their mean over the valid tokens is the batch covariance, but "
              "Clip-Cov and KL-Cov select single tokens by their own term")
COV_GRAD = ("the terms are computed from detached values: they select tokens and are logged, never "
            "differentiated (a gradient through them would be a new, unintended loss)")
COV_EMPTY = "a batch with no valid token gives all zeros, not the NaN of a mean over nothing"
_COV_LP = [[-1.0, -2.0], [-3.0, 9.0]]  # 9.0 sits in padding
_COV_M = [[1, 1], [1, 0]]


@_case(ex, "two rows by hand, garbage in padding", COV_ROW)
def _(fn, gen):
    got = fn(_t(_COV_LP), _t([2.0, -1.0]), _t(_COV_M))
    # valid log-probs (-1, -2, -3), mean -2; advantages per token (2, 2, -1), mean 1:
    # (1)(1) = 1, (0)(1) = 0, (-1)(-2) = 2. Row means: all 0. A not centred: 2, 0, 1; log pi not centred: -1, -2, 6.
    # Padding in the means (9 and -1 counted): means 0.75 and 0.5: -2.625, -4.125, 5.625.
    # A's mean over the 2 sequences (0.5): 1.5, 0, 1.5. The batch covariance, (1 + 0 + 2) / 3 = 1.0, as a scalar
    _expect(got, [[1.0, 0.0], [2.0, 0.0]],
            [([[0.0, 0.0], [0.0, 0.0]], COV_ROW), ([[2.0, 0.0], [1.0, 0.0]], COV_CENTRE),
             ([[-1.0, -2.0], [6.0, 0.0]], COV_CENTRE), ([[-2.625, -4.125], [5.625, 0.0]], COV_PAD),
             ([[1.5, 0.0], [1.5, 0.0]], COV_SEQ_MEAN), (1.0, COV_SCALAR)], what="the terms")


@_case(ex, "the terms carry no gradient", COV_GRAD)
def _(fn, gen):
    lp = _leaf(_COV_LP)
    out = fn(lp, _t([2.0, -1.0]), _t(_COV_M))
    if isinstance(out, Tensor) and out.requires_grad:
        raise _Mismatch(COV_GRAD, "the terms require grad")
    _expect(out, [[1.0, 0.0], [2.0, 0.0]], what="the terms")


@_case(ex, "a fully masked batch", COV_EMPTY)
def _(fn, gen):
    _expect(fn(_t([[-1.0, -2.0], [-3.0, -4.0]]), _t([1.0, -1.0]), _t([[0, 0], [0, 0]])), [[0.0, 0.0], [0.0, 0.0]])


@_case(ex, "random batch with padding against the definition", COV_PAD)
def _(fn, gen):
    mask = _prefix_mask([6, 3, 0, 5, 1], 6)
    lp = -torch.rand(5, 6, generator=gen) * 4
    adv = torch.randn(5, generator=gen)
    _expect(fn(lp, adv, mask), ref.token_covariance(lp, adv, mask), what="the terms")


# ================================================================================================================
# 06 · pass@k, the unbiased estimator

ex = _exercise("pass_at_k", "06", "pass_at_k(num_samples, num_correct, k) -> (P,) in [0, 1]",
               "minirl.entropy.pass_at_k", ("minirl.entropy.pass_at_k", "minirl.entropy.mean_pass_at_k"))
BIASED = ("1 - (1 - c/n)^k draws k samples WITH replacement (or takes p = c/n as known): a biased estimate of "
          "pass@k, below the truth (Chen et al. 2021); the k samples are drawn from the n WITHOUT replacement: "
          "1 - C(n - c, k) / C(n, k)")
SHARE = "c / n is pass@1 whatever k: pass@k is the chance that at least one of k draws is correct"
UNION = "k c / n (capped at 1) is the union bound, not the chance that one of k draws is correct"
COMPLEMENT = "C(n - c, k) / C(n, k) is the chance that all k draws FAIL: pass@k is one minus it"
ALL_CORRECT = ("when n - c < k every draw of k holds a correct sample: pass@k is exactly 1 (C(n - c, k) = 0), "
               "not NaN or an error")
PER_PROBLEM = ("return one value per problem, (P,): the benchmark's pass@k is their mean (mean_pass_at_k), "
               "another function")
OVERFLOW = ("C(3000, 400) is about 10^510, beyond float64 (about 10^308): compute the ratio C(n - c, k) / C(n, k) as "
            "the product prod_{i = n-c+1}^{n} (1 - k / i) (Chen et al.'s stable form), or with exact integers")
K_TOO_LARGE = ("k > n leaves no draw of k samples: raise ValueError naming k and n (returning 1 there, as the "
               "'n - c < k' shortcut does when nothing checks k <= n, scores a problem with no correct sample as "
               "solved)")


def _counts(n, c):
    return torch.tensor(n), torch.tensor(c)


@_case(ex, "n = 5, k = 2, by hand", BIASED)
def _(fn, gen):
    got = fn(*_counts([5, 5, 5, 5], [0, 1, 2, 5]), 2)
    # 1 - C(5 - c, 2) / C(5, 2) with C(5, 2) = 10: c = 0: 0; c = 1: 1 - 6/10 = 0.4; c = 2: 1 - 3/10 = 0.7; c = 5: 1.
    # Biased 1 - (1 - c/5)^2: 0, 0.36, 0.64, 1; c / n: 0, 0.2, 0.4, 1; union bound: 0, 0.4, 0.8, 1; no "1 -": 1, 0.6,
    # 0.3, 0; their mean (the benchmark's pass@2): 0.525
    _expect(got, [0.0, 0.4, 0.7, 1.0], [([0.0, 0.36, 0.64, 1.0], BIASED), ([0.0, 0.2, 0.4, 1.0], SHARE),
                                        ([0.0, 0.4, 0.8, 1.0], UNION), ([1.0, 0.6, 0.3, 0.0], COMPLEMENT),
                                        (0.525, PER_PROBLEM)],
            what="pass@2")


@_case(ex, "n - c < k: every draw holds a correct sample", ALL_CORRECT)
def _(fn, gen):
    # n - c = 1 < k = 3: exactly 1; biased: 1 - (1/4)^3 = 0.984375 and 1 - (1/6)^3 = 0.995370
    _expect(fn(*_counts([4, 6], [3, 5]), 3), [1.0, 1.0], [([0.984375, 0.995370], BIASED)], what="pass@3")


@_case(ex, "k = 1 is the share of correct samples", SHARE)
def _(fn, gen):
    _expect(fn(*_counts([10, 7, 3], [3, 0, 3]), 1), [0.3, 0.0, 1.0], what="pass@1")  # c / n


@_case(ex, "n = 3000, k = 400: binomials beyond float64", OVERFLOW)
def _(fn, gen):
    # c = 1: k / n = 0.133333 exactly; c = 2: 0.248927; c = 5: 0.511305 (biased: 0.124846, 0.234140, 0.486868)
    _expect(fn(*_counts([3000, 3000, 3000], [1, 2, 5]), 400), [400 / 3000, 0.248927, 0.511305],
            [([0.124846, 0.234140, 0.486868], BIASED)], what="pass@400")


@_case(ex, "k larger than n", K_TOO_LARGE)
def _(fn, gen):
    _expect_raises(lambda: fn(*_counts([5, 3], [2, 0]), 4), ValueError, None)  # k = 4 > n = 3, nothing correct


@_case(ex, "random problems against the definition", BIASED)
def _(fn, gen):
    n = torch.randint(8, 41, (12,), generator=gen)
    c = (torch.rand(12, generator=gen) * (n + 1)).long().clamp(max=n)
    k = int(torch.randint(2, 9, (1,), generator=gen))
    want = ref.pass_at_k(n, c, k)
    _expect(fn(n, c, k), want, [(1 - (1 - c / n) ** k, BIASED)], what=f"pass@{k}")
