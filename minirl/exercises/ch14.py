"""Exercises of chapter 14: multi-turn episodes (GAE over the model's tokens, the environment's tokens left out).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _reference as ref
from ._core import _as_tensor, _case, _exercise, _expect, _leaf, _Mismatch, _t

# ================================================================================================================
# 14 · GAE over an episode: the model's tokens in order, the environment's skipped

ex = _exercise("episode_gae", "14", "episode_gae(rewards, values, model_mask, *, gamma=1.0, lam=0.95) -> "
               "(advantages, returns), each (B, T)", "minirl.multiturn.episode_gae",
               ("minirl.multiturn.episode_gae", "minirl.advantages.gae"))
OBS_AS_STEPS = ("the environment's tokens were run through the recursion as if they were the policy's steps (their "
                "values read, their rewards 0): GAE runs over the MODEL's tokens alone, in order; an observation is "
                "the environment's dynamics between two of them")
OBS_ENDS_EPISODE = ("the recursion stopped at the environment's tokens (value and advantage 0 there, as at the end of "
                    "an episode): the model's token before an observation must bootstrap from the model's NEXT token, "
                    "across the observation")
OBS_NOT_ZEROED = "advantages and returns are 0 at the environment's tokens and at padding (they carry no loss)"
_R, _V, _M = [[0.0, 0.5, 0.0, 1.0]], [[0.5, 0.6, 9.9, 0.7]], [[1, 1, 0, 1]]


@_case(ex, "one episode by hand: an observation between turn 1 and turn 2", OBS_AS_STEPS)
def _(fn, gen):
    adv, ret = fn(_t(_R), _t(_V), _t(_M), gamma=1.0, lam=0.95)
    # the model's tokens (columns 0, 1, 3): rewards (0, 0.5, 1), values (0.5, 0.6, 0.7): deltas (0.1, 0.6, 0.3);
    # A = (0.1 + 0.95 * 0.885, 0.6 + 0.95 * 0.3, 0.3) = (0.94075, 0.885, 0.3), put back at columns 0, 1, 3.
    # Through the observation as a step (value 9.9, reward 0): deltas (0.1, 9.8, -9.2, 0.3): A_3 = 0.3,
    # A_2 = -8.915, A_1 = 1.33075, A_0 = 1.3642125. Stopped at the observation: A_1 = 0.5 - 0.6 = -0.1,
    # A_0 = 0.1 + 0.95 * -0.1 = 0.005
    m = _t(_M)
    _expect(_as_tensor(adv, "advantages") * m, [[0.94075, 0.885, 0.0, 0.3]],
            [([[1.364213, 1.33075, 0.0, 0.3]], OBS_AS_STEPS), ([[0.005, -0.1, 0.0, 0.3]], OBS_ENDS_EPISODE)],
            what="advantages on the model's tokens")
    _expect(_as_tensor(ret, "returns") * m, [[1.44075, 1.485, 0.0, 1.0]], what="returns (advantages + values)")


@_case(ex, "one turn, no observation: GAE itself", OBS_AS_STEPS)
def _(fn, gen):
    adv, ret = fn(_t([[0.0, 0.0, 1.0]]), _t([[0.5, 0.6, 0.7]]), _t([[1, 1, 1]]))  # the defaults: gamma 1, lam 0.95
    # deltas (0.1, 0.1, 0.3): A_2 = 0.3, A_1 = 0.385, A_0 = 0.46575; returns A + V
    _expect(adv, [[0.46575, 0.385, 0.3]], what="advantages")
    _expect(ret, [[0.96575, 0.985, 1.0]], what="returns")


@_case(ex, "two observations, padding and an empty row; garbage in the values there", OBS_NOT_ZEROED)
def _(fn, gen):
    rewards = _t([[0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    values = _t([[0.5, 9e9, 9e9, 0.7, -9e9], [1e9, 1e9, 1e9, 1e9, 1e9]])
    mask = _t([[1, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
    adv, ret = fn(rewards, values, mask, gamma=0.9, lam=0.8)
    # model tokens: rewards (0, 1), values (0.5, 0.7): deltas (0.9 * 0.7 - 0.5 = 0.13, 0.3): A = (0.13 + 0.72 * 0.3,
    # 0.3) = (0.346, 0.3); returns (0.846, 1.0); everything else 0
    _expect(adv, [[0.346, 0.0, 0.0, 0.3, 0.0], [0.0] * 5], what="advantages")
    _expect(ret, [[0.846, 0.0, 0.0, 1.0, 0.0], [0.0] * 5], what="returns")


@_case(ex, "random episodes with observations and padding against the definition", OBS_AS_STEPS)
def _(fn, gen):
    r, v = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    mask = (torch.rand(4, 8, generator=gen) > 0.35).float()
    mask[2] = 0.0  # an empty row
    want_a, want_r = ref.episode_gae(r, v, mask, gamma=0.99, lam=0.9)
    adv, ret = fn(r, v, mask, gamma=0.99, lam=0.9)
    _expect(adv, want_a, what="advantages")
    _expect(ret, want_r, what="returns")


@_case(ex, "the critic's values are detached", "the critic's values must enter GAE as constants: advantages and "
       "returns are targets, and a gradient through them trains the critic towards itself")
def _(fn, gen):
    v = _leaf([[0.5, 0.6, 9.9, 0.7]])
    adv, ret = fn(_t(_R), v, _t(_M), gamma=1.0, lam=0.95)
    if any(isinstance(x, Tensor) and x.requires_grad for x in (adv, ret)):
        raise _Mismatch()
