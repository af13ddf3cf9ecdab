"""Exercises of chapter 01: the policy gradient (the REINFORCE estimate of a softmax policy's gradient).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``)."""

from __future__ import annotations

import math

import torch

from . import _reference as ref
from ._core import _case, _exercise, _expect, _t

ex = _exercise("reinforce_estimate", "01", "reinforce_estimate(logits, actions, rewards, *, baseline=0.0) -> (K,)",
               "notebooks/01_policy_gradient.ipynb, section 2 (its mean: minirl.pg_toy.true_gradient)",
               ("minirl.pg_toy.true_gradient",))
NO_PI = ("the score of a softmax policy is d log pi(a) / d logits = onehot(a) - pi: the gradient of the "
         "normaliser, -pi, is missing (without it a constant reward would still push the logits)")
LOG_PI = "the score is onehot(a) - pi with pi the softmax PROBABILITIES, not the log-probabilities"
SUMMED = "the estimate is the MEAN over the N samples, (1/N) sum_i (r_i - b) (onehot(a_i) - pi), not their sum"
SIGN = ("this is the gradient of the loss -E[r]: the estimate asked for is of grad E[r] (the direction that raises "
        "the reward), + (r - b) (onehot(a) - pi)")
NO_BASELINE = "the baseline was ignored: each sample is weighted by r_i - b"
BASELINE_ADDED = "the baseline is SUBTRACTED from the reward: r_i - b, not r_i + b"
OVERFLOW = ("exp of a large logit overflows to inf (and inf / inf = NaN): take the softmax with torch.softmax, or "
            "subtract the largest logit before exp")
_L2 = math.log(2.0)


@_case(ex, "two samples by hand, no baseline", NO_PI)
def _(fn, gen):
    # pi = (0.5, 0.25, 0.25); samples (a=0, r=1), (a=1, r=0): 1/2 [1 (e0 - pi) + 0] = (0.25, -0.125, -0.125)
    # onehot only: (0.5, 0, 0); summed: (0.5, -0.25, -0.25); the loss's gradient: the opposite;
    # onehot - log pi: 1/2 (1 + ln 2, 2 ln 2, 2 ln 2)
    got = fn(_t([_L2, 0.0, 0.0]), torch.tensor([0, 1]), _t([1.0, 0.0]))
    _expect(got, [0.25, -0.125, -0.125],
            [([0.5, 0.0, 0.0], NO_PI), ([0.5, -0.25, -0.25], SUMMED), ([-0.25, 0.125, 0.125], SIGN),
             ([(1 + _L2) / 2, _L2, _L2], LOG_PI)], what="the estimate")


@_case(ex, "the same samples, baseline 0.5", NO_BASELINE)
def _(fn, gen):
    # 1/2 [0.5 (e0 - pi) - 0.5 (e1 - pi)] = 1/2 [(0.25, -0.125, -0.125) + (0.25, -0.375, 0.125)] = (0.25, -0.25, 0)
    # ignored: (0.25, -0.125, -0.125); added, r + b: 1/2 [1.5 (e0 - pi) + 0.5 (e1 - pi)] = (0.25, 0, -0.25)
    got = fn(_t([_L2, 0.0, 0.0]), torch.tensor([0, 1]), _t([1.0, 0.0]), baseline=0.5)
    _expect(got, [0.25, -0.25, 0.0], [([0.25, -0.125, -0.125], NO_BASELINE), ([0.25, 0.0, -0.25], BASELINE_ADDED)],
            what="the estimate")


@_case(ex, "every reward equal to the baseline: exactly no signal", NO_PI)
def _(fn, gen):
    # r - b = 0 for every sample: 0 whatever the samples; onehot only gives it anyway with b ignored
    got = fn(_t([0.3, -1.0, 2.0, 0.0]), torch.tensor([2, 2, 0, 3, 1]), _t([1.0] * 5), baseline=1.0)
    _expect(got, [0.0, 0.0, 0.0, 0.0], [([0.2, 0.2, 0.4, 0.2], NO_BASELINE)], what="the estimate")


@_case(ex, "a logit of 1000: finite", OVERFLOW)
def _(fn, gen):
    # pi = (1, 0, 0) to float precision; the sample a = 0 is certain: e0 - pi = 0; a = 2 (r = 1): e2 - e0
    got = fn(_t([1000.0, 0.0, 0.0]), torch.tensor([0, 2]), _t([1.0, 1.0]))
    _expect(got, [-0.5, 0.0, 0.5], what="the estimate")


@_case(ex, "random logits, samples, rewards and baseline, against the definition", NO_PI)
def _(fn, gen):
    logits = torch.randn(6, generator=gen) * 2
    actions = torch.multinomial(torch.softmax(logits, -1), 40, replacement=True, generator=gen)
    rewards, baseline = torch.rand(40, generator=gen), float(torch.rand(1, generator=gen))
    _expect(fn(logits, actions, rewards, baseline=baseline), ref.reinforce_estimate(logits, actions, rewards,
                                                                                    baseline=baseline),
            what="the estimate")
