"""Rewards: calling reward functions in TRL's form, DAPO's soft overlong punishment, and the per-token reward.

A reward function is ``reward_fn(prompts, completions, **columns) -> list[float]``: one prompt and one completion
per sampled completion (B of each) and, by name, the dataset's other columns repeated per completion. This is TRL's
``reward_funcs`` convention, so a reward function written for TRL works here unchanged, and back.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .checks import ndim, prefix_mask, same_shape


def score_completions(reward_fn: Callable | Sequence[Callable], prompts: Sequence[str], completions: Sequence[str],
                      columns: dict[str, list] | None = None, weights: Sequence[float] | None = None) -> Tensor:
    """The weighted sum of one or several reward functions over B completions.

    r_i = sum_k w_k * f_k(prompts, completions, **columns)[i], as TRL combines its ``reward_funcs``.

    Example: f1 -> [1, 0], f2 -> [0.5, 0.5], weights [1, 2]: [1 + 2 * 0.5, 0 + 2 * 0.5] = [2.0, 1.0].

    Args:
        reward_fn: a function ``(prompts, completions, **columns) -> list[float]``, or a list of them.
        prompts: B prompt strings (one per completion, repeated within a group).
        completions: B completion texts.
        columns: the dataset's other columns, each a list of B values, passed to every function by name.
        weights: one weight per function (default 1 each).

    Returns:
        (B,) float32 rewards.

    Raises:
        ValueError: naming the function, if it returns a value that is None or not a number, or not exactly B
            values; if the weights do not match the functions.

    Source: TRL's GRPOTrainer ``reward_funcs`` / ``reward_weights`` convention.
    """
    fns = [reward_fn] if callable(reward_fn) else list(reward_fn)
    weights = [1.0] * len(fns) if weights is None else list(weights)
    if not fns or len(weights) != len(fns):
        raise ValueError(f"need at least one reward function and one weight per function, got {len(fns)} "
                         f"function(s) and {len(weights)} weight(s)")
    total = torch.zeros(len(completions))
    for fn, w in zip(fns, weights, strict=True):
        name = getattr(fn, "__name__", repr(fn))
        values = list(fn(prompts=list(prompts), completions=list(completions), **(columns or {})))
        if len(values) != len(completions):
            raise ValueError(f"reward function {name} returned {len(values)} values for {len(completions)} "
                             f"completions")
        bad = [i for i, v in enumerate(values) if not isinstance(v, numbers.Real)]  # None, str, ...
        if bad:
            raise ValueError(f"reward function {name} returned {values[bad[0]]!r} at completion {bad[0]}; every "
                             f"reward must be a number (None is not allowed)")
        total += w * torch.tensor(values, dtype=torch.float32)
    return total


def overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int) -> Tensor:
    """DAPO's soft overlong punishment: 0 up to max_len - cache_len, then a linear ramp down to -1 at max_len.

    R(|y|) = 0                                   if |y| <= max_len - cache_len
           = (max_len - cache_len - |y|) / cache_len   if max_len - cache_len < |y| <= max_len
           = -1                                  if |y| > max_len
    It is added to the task reward, so a correct answer that rambles into the cache zone earns less, and a
    truncated one (|y| = max_len, no answer) gets -1 on top of its 0.

    Example: max_len 20, cache_len 4: lengths 15, 16, 17, 18, 19, 20, 21 -> 0, 0, -0.25, -0.5, -0.75, -1, -1.

    Args:
        lengths: (B,) completion lengths in tokens (EOS included).
        max_len: the generation budget L_max (> 0).
        cache_len: the width L_cache of the ramp, 0 < cache_len <= max_len.

    Returns:
        (B,) penalties in [-1, 0], float.

    Raises:
        ValueError: if lengths is not 1-D or the lengths / cache are out of range.

    Source: Yu et al. 2025 (DAPO), eq. 13.
    """
    ndim("lengths", lengths, 1, "(B,)")
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = lengths.float()
    ramp = (max_len - cache_len - lengths) / cache_len  # > 0 before the zone, -1 at max_len
    return ramp.clamp(min=-1.0, max=0.0)


def token_level_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Place each completion's scalar score on its last valid token, as an RLHF per-token reward.

    PPO's GAE and KL-in-reward work with per-token rewards: the outcome score arrives at the end, the KL penalty
    (``kl.kl_in_reward``) on every token.

    Args:
        scores: (B,) scalar rewards.
        mask: (B, T) completion mask (a prefix of ones per row).

    Returns:
        (B, T) zeros except ``scores`` at each row's last valid token (a row with no valid token gets nothing, and
        its score is not read: it may be anything, inf or NaN included).

    Example: scores [2, 5, 7], mask [[1, 1, 0], [1, 1, 1], [0, 0, 0]] -> [[0, 2, 0], [0, 0, 5], [0, 0, 0]].

    Raises:
        ValueError: if scores is not (B,) for mask (B, T), or a mask row is not a prefix of ones (e.g. [1, 0, 1],
            whose last valid token is not at its count of ones).
    """
    ndim("mask", mask, 2, "(B, T)")
    same_shape(scores=scores, mask_rows=mask[:, 0])
    prefix_mask("mask", mask)
    n_valid = (mask > 0).sum(-1)  # (B,)
    last = (n_valid - 1).clamp(min=0)  # (B,)
    out = torch.zeros_like(mask, dtype=torch.float)
    out[torch.arange(mask.shape[0]), last] = torch.where(n_valid > 0, scores.float(), 0.0)
    return out
