"""Reward shaping: DAPO's soft overlong punishment, and composing the per-token reward of a completion."""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import ndim, same_shape


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
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
        (B, T) zeros except ``scores`` at each row's last valid token (a row with no valid token gets nothing).

    Raises:
        ValueError: if scores is not (B,) for mask (B, T).
    """
    ndim("mask", mask, 2, "(B, T)")
    same_shape(scores=scores, mask_rows=mask[:, 0])
    last = (mask.sum(-1).long() - 1).clamp(min=0)  # (B,)
    out = torch.zeros_like(mask, dtype=torch.float)
    out[torch.arange(mask.shape[0]), last] = scores.float() * (mask.sum(-1) > 0)
    return out
