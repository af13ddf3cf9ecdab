"""DAPO's dynamic sampling: keep only groups whose rewards differ, over-sampling until the batch is full.

A group of G completions that are all right (or all wrong) has zero group-relative advantage: it costs a forward
and backward pass and teaches nothing, and it shrinks the effective batch as accuracy rises (the chance is
p^G + (1-p)^G for a prompt solved with probability p).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .checks import ndim


def has_signal(rewards: Tensor, group_size: int) -> Tensor:
    """For each group, whether its rewards are not all equal (so its advantages are not all zero).

    NaN marks an unscored row (every reward function returned None): it is left out, as in
    ``advantages.group_advantages``, so a group has signal when at least two of its scored rows differ. A group
    with fewer than two scored rows has none (its advantages are all 0).

    Example: G = 3, rewards [1, 0, 1,  1, 1, 1,  1, NaN, 0,  1, NaN, NaN] -> [True, False, True, False].

    Args:
        rewards: (B,) rewards laid out group by group; NaN = unscored.
        group_size: G.

    Returns:
        (B / G,) bool.

    Raises:
        ValueError: if rewards is not 1-D or B is not a multiple of G.

    Source: Yu et al. 2025 (DAPO), eq. 11 (the constraint 0 < |{correct}| < G).
    """
    ndim("rewards", rewards, 1, "(B,)")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")
    r = rewards.view(-1, group_size)
    scored = ~r.isnan()
    lo = r.where(scored, torch.inf).amin(dim=1)  # smallest scored reward of each group
    hi = r.where(scored, -torch.inf).amax(dim=1)
    return (scored.sum(dim=1) >= 2) & (lo < hi)


@dataclass
class DynamicSample:
    """What dynamic sampling kept: ``picks`` is a list of (round_payload, group_indices) in order.

    rounds / samples: generation rounds drawn and completions sampled; groups_seen: groups generated;
    groups_with_signal: those with non-identical rewards (kept or not: the share groups_with_signal / groups_seen
    is the yield of generation); groups_kept: those in the batch (at most num_groups, surplus dropped).
    """

    picks: list[tuple[Any, list[int]]] = field(default_factory=list)
    rounds: int = 0
    samples: int = 0
    groups_seen: int = 0
    groups_with_signal: int = 0
    groups_kept: int = 0


def dynamic_sampling(sample_round: Callable[[int], tuple[Tensor, Any]], num_groups: int, group_size: int,
                     max_gen_batches: int, allow_partial: bool = False) -> DynamicSample:
    """Call ``sample_round`` until ``num_groups`` groups with signal are collected, in the order they were seen.

    Args:
        sample_round: ``sample_round(round_index) -> (rewards, payload)``: draws one generation round (rewards
            (n * G,) grouped by prompt, and whatever object the caller needs later, e.g. the rollout).
        num_groups: groups needed for a full batch (> 0).
        group_size: G.
        max_gen_batches: the most rounds to draw (>= 1).
        allow_partial: when the rounds run out, return the groups found so far instead of raising.

    Returns:
        A ``DynamicSample``; its picks hold at most ``num_groups`` groups in total (surplus groups of the last
        round are dropped), and rounds / samples count what generation cost.

    Raises:
        RuntimeError: when ``max_gen_batches`` rounds did not yield ``num_groups`` groups with signal (and
            allow_partial is False); the message gives the counts and what to change.
        ValueError: for num_groups < 1 or max_gen_batches < 1.

    Source: Yu et al. 2025 (DAPO), Algorithm 1, lines 4-7.
    """
    if num_groups < 1 or max_gen_batches < 1:
        raise ValueError(f"need num_groups >= 1 and max_gen_batches >= 1, got {num_groups}, {max_gen_batches}")
    out = DynamicSample()
    need = num_groups
    while need > 0:
        if out.rounds == max_gen_batches:
            if allow_partial:
                break
            raise RuntimeError(
                f"dynamic sampling found {out.groups_kept} of {num_groups} groups with non-identical rewards in "
                f"max_gen_batches={max_gen_batches} rounds ({out.samples} samples); raise max_gen_batches, "
                f"lower the batch size, or set allow_partial=True")
        rewards, payload = sample_round(out.rounds)
        out.rounds += 1
        out.samples += rewards.numel()
        signal = has_signal(rewards, group_size)
        out.groups_seen += signal.numel()
        out.groups_with_signal += int(signal.sum())
        keep = signal.nonzero().flatten().tolist()[:need]
        if keep:
            out.picks.append((payload, keep))
            out.groups_kept += len(keep)
            need -= len(keep)
    return out
