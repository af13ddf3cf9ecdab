"""Rewards: calling reward functions in TRL's form, DAPO's soft overlong punishment, and the per-token reward.

A reward function is ``reward_fn(prompts, completions, completion_ids, **columns) -> list[float | None]``: one
prompt, one completion text and one list of completion token ids per sampled completion (B of each) and, by name,
the dataset's other columns repeated per completion. This is the call TRL 1.16's GRPOTrainer makes to its
``reward_funcs``, for plain-text prompts and for conversational ones (message lists; each completion then arrives
as ``[{"role": "assistant", "content": text}]``), so a reward function written for TRL works here unchanged, and
back. ``None`` for a row means "this function does not apply to it".
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .checks import ndim, prefix_mask, same_shape


def is_conversational(prompt) -> bool:
    """True for a conversation, TRL's conversational format: a list of messages, dicts with a "role" (and a
    "content"); False for a plain-text prompt. Source: TRL 1.16, ``trl.data_utils.is_conversational``."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(m, dict) and "role" in m
                                                                          for m in prompt)


def score_completions(reward_fn: Callable | Sequence[Callable], prompts: Sequence[str], completions: Sequence[str],
                      *, completion_ids: Sequence[Sequence[int]] | None = None, columns: dict[str, list] | None = None,
                      weights: Sequence[float] | None = None, reward_kwargs: dict | None = None,
                      per_function: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """The weighted sum of one or several reward functions over B completions, with TRL's rule for ``None``.

    r_i = sum_k w_k * f_k(...)[i] over the functions that scored row i (a ``None`` is left out of the sum, TRL's
    nansum); a row that every function returned ``None`` for is unscored: its reward is NaN, a warning names it,
    and ``advantages.group_advantages`` leaves it out of its group's mean and std and gives it advantage 0.

    Example: f1 -> [1, 0, None], f2 -> [0.5, None, None], weights [1, 2]:
    [1 + 2 * 0.5, 0, NaN] = [2.0, 0.0, NaN] (row 2 unscored, with a warning).

    Every function is called as ``f(prompts=..., completions=..., completion_ids=..., **columns, **reward_kwargs)``
    (all by name, so ``**kwargs`` absorbs what it does not read). When the prompts are conversations (message
    lists, ``is_conversational``), each completion is passed as ``[{"role": "assistant", "content": text}]``, the
    shape TRL 1.16 gives them (so ``completion[0]["content"]`` is its text). The RL loop passes as reward_kwargs
    ``trainer_state`` (an object with ``global_step``, the optimiser steps done so far, and ``max_steps``) and
    ``log_metric(name, value)`` (the step's mean of each name goes into its History row); evaluation passes
    ``trainer_state``. Not passed: ``log_extra`` (minirl keeps no completions table) and ``environments``.

    Args:
        reward_fn: a function as above, or a list of them.
        prompts: B prompts (one per completion, repeated within a group): strings, or message lists.
        completions: B completion texts (wrapped as assistant messages for conversational prompts, see above).
        completion_ids: B lists of the completion's token ids, EOS included, padding excluded (as TRL); None
            passes ``completion_ids=None``.
        columns: the dataset's other columns, each a list of B values, passed to every function by name.
        weights: one weight per function (default 1 each).
        reward_kwargs: further keyword arguments passed to every function (see above).
        per_function: also return each function's own scores, for GDPO (``advantages.gdpo_advantages``).

    Returns:
        (B,) float32 rewards; NaN exactly on the unscored rows (None from every function). With per_function, the
        pair (rewards, (B, K) unweighted scores of the K functions with NaN where a function returned None).

    Raises:
        ValueError: naming the function, if it does not return exactly B values, or returns something that is not a
            number or None (a string, a list...); naming the function and the row, if it returns NaN or inf (a
            reward that cannot be trained on: one step of it makes every parameter NaN); if the weights do not match
            the functions.

    Source: TRL 1.16, ``GRPOTrainer._calculate_rewards`` and the nansum of ``_generate_and_score_completions``
    (the ``reward_funcs`` / ``reward_weights`` convention, "multi-task reward functions"; the assistant-message
    completions of conversational prompts).
    """
    fns = [reward_fn] if callable(reward_fn) else list(reward_fn)
    weights = [1.0] * len(fns) if weights is None else list(weights)
    if not fns or len(weights) != len(fns):
        raise ValueError(f"need at least one reward function and one weight per function, got {len(fns)} "
                         f"function(s) and {len(weights)} weight(s)")
    B = len(completions)
    kwargs = {**(columns or {}), **(reward_kwargs or {})}
    ids = None if completion_ids is None else [list(map(int, row)) for row in completion_ids]
    if prompts and is_conversational(prompts[0]):  # TRL's shape for a chat model's completions
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    total, scored, per_func = torch.zeros(B), torch.zeros(B, dtype=torch.bool), []
    for fn, w in zip(fns, weights, strict=True):
        name = getattr(fn, "__name__", repr(fn))
        values = list(fn(prompts=list(prompts), completions=list(completions), completion_ids=ids, **kwargs))
        if len(values) != B:
            raise ValueError(f"reward function {name} returned {len(values)} values for {B} completions")
        for i, v in enumerate(values):
            if v is not None and not isinstance(v, numbers.Real):  # a str, a list, a tensor...
                raise ValueError(f"reward function {name} returned {v!r} at completion {i}; every reward must be a "
                                 f"number, or None where the function does not apply")
            if v is not None and not math.isfinite(v):
                raise ValueError(f"reward function {name} returned {v} at completion {i}; rewards must be finite "
                                 f"(return None where the function does not apply)")
        applies = torch.tensor([v is not None for v in values], dtype=torch.bool)
        total += w * torch.tensor([0.0 if v is None else float(v) for v in values])  # None adds 0 (nansum)
        scored |= applies
        per_func.append(torch.tensor([math.nan if v is None else float(v) for v in values]))
    if not scored.all():
        row = int((~scored).nonzero()[0])
        warnings.warn(f"every reward function returned None for {int((~scored).sum())} of {B} completions (first: "
                      f"row {row}, prompt {prompts[row]!r}, completion {completions[row]!r}); they are unscored and "
                      f"get advantage 0", stacklevel=2)
    total = torch.where(scored, total, torch.nan)
    return (total, torch.stack(per_func, dim=1)) if per_function else total


def function_names(reward_fn: Callable | Sequence[Callable]) -> list[str]:
    """One name per reward function, as TRL names them in its metrics: the function's ``__name__`` (a callable
    object's class name); a name that repeats gets "_2", "_3"... from its second use, so no metric hides another.

    Example: [answer_reward, format_reward, lambda ..., lambda ...] -> ["answer_reward", "format_reward",
    "<lambda>", "<lambda>_2"]."""
    names, seen = [], {}
    for fn in [reward_fn] if callable(reward_fn) else list(reward_fn):
        name = getattr(fn, "__name__", type(fn).__name__)
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return names


def reward_metrics(reward_fn: Callable | Sequence[Callable], per_function: Tensor | None,
                   logged: dict[str, list[float]] | None = None) -> dict[str, float]:
    """The reward side of a History row: each reward function's mean score over the batch,
    ``{"rewards/<name>/mean": value}``, so a run with several rewards shows whether each one ever fires (the logged
    ``reward`` is only their weighted sum), and the mean of each value the functions reported through
    ``log_metric(name, value)``.

    Example: answer_reward scores [1, 0, 0, 0], format_reward [1, 1, None, 0] ->
    {"rewards/answer_reward/mean": 0.25, "rewards/format_reward/mean": 2 / 3}.

    Args:
        reward_fn: the function, or the K functions, that scored the batch (``function_names`` names them).
        per_function: (B, K) their unweighted scores, NaN where a function returned None (``score_completions``
            with ``per_function``); None: no per-function entries.
        logged: name -> the values reported through ``log_metric`` during the step.

    Returns:
        K entries, each the mean over the rows its function scored (NaN when it scored none), unweighted, then one
        per logged name.

    Raises:
        ValueError: if per_function is not (B, K) for the K functions.

    Source: TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` (``rewards/{reward_func_name}/mean``, the
    nanmean of each function's column; the logged values averaged per step).
    """
    out = {}
    if per_function is not None:
        names = function_names(reward_fn)
        ndim("per_function", per_function, 2, "(B, K)")
        if per_function.shape[1] != len(names):
            raise ValueError(f"per_function has {per_function.shape[1]} columns for {len(names)} reward functions")
        out = {f"rewards/{name}/mean": float(per_function[:, k].float().nanmean()) for k, name in enumerate(names)}
    return {**out, **{name: math.fsum(values) / len(values) for name, values in (logged or {}).items()}}


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
