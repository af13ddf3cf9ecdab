"""From per-token terms to the loss, the way each algorithm does it, and the ratio statistics every loss reports.

How a (B, T) loss becomes one number is one of the things the algorithms disagree about: DAPO averages over every
token of the batch, GRPO over each sequence's tokens and then over sequences, Dr. GRPO divides by a constant. The
choice changes how much a long completion's tokens weigh (notebook 05).

Copy with: torch and checks.py's ``same_shape``, ``ndim``, ``choice``, ``zero_outside``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import choice, ndim, same_shape, zero_outside

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate(per_token: Tensor, mask: Tensor, mode: str, *, max_tokens: int | None = None,
              denominator: float | None = None) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar, the way each algorithm does.

    - "token-mean" (DAPO eq. 12): sum over every valid token of the batch / number of valid tokens; every token
      weighs the same, so long completions weigh more in total.
    - "seq-mean-token-mean" (GRPO eq. 3): mean over each sequence's tokens, then mean over sequences; a token of a
      short completion weighs more than one of a long completion.
    - "seq-mean-token-sum": sum over each sequence's tokens, then mean over sequences.
    - "seq-mean-token-sum-norm" (Dr. GRPO, Liu et al. 2025, eq. 2 / their loss "sum / (B * max_tokens)"):
      sum over each sequence / max_tokens (a constant), then mean over sequences; no length bias.

    Rows with no valid token are left out of the sequence means, and a fully masked batch gives 0 (not NaN).
    Masked positions are never read: padding may hold anything, inf and NaN included.

    Example: per-token [[2,2,2,0],[10,0,0,0]], mask [[1,1,1,0],[1,0,0,0]]: token-mean (2+2+2+10)/4 = 4.0;
    seq-mean-token-mean (2 + 10)/2 = 6.0; seq-mean-token-sum-norm, max_tokens 4: (6/4 + 10/4)/2 = 2.0.

    Args:
        per_token: (B, T) per-token loss terms.
        mask: (B, T) 1 on tokens that count (completion mask, possibly with overlong-filtered rows zeroed).
        mode: one of ``AGGREGATIONS``.
        max_tokens: the constant normaliser of "seq-mean-token-sum-norm" (usually the generation budget);
            defaults to T.
        denominator: when given, replaces this batch's own count (valid tokens for "token-mean", valid sequences
            for the others). Under gradient accumulation, pass the FULL batch's count to every micro-batch; the
            micro-batch losses then add up to exactly the full batch's loss.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: on shape mismatch, unknown mode, non-positive max_tokens or denominator.

    Source: token-mean: DAPO, Yu et al. 2025, eq. 12; seq-mean-token-mean: GRPO, Shao et al. 2024, eq. 3;
    seq-mean-token-sum-norm: Dr. GRPO, Liu et al. 2025, eq. 2 (the constant normaliser of their loss).
    """
    same_shape(per_token=per_token, mask=mask)
    ndim("per_token", per_token, 2, "(B, T)")
    choice("aggregation mode", mode, AGGREGATIONS)
    if denominator is not None and denominator <= 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
    mask = mask.to(per_token.dtype)
    masked = zero_outside(per_token, mask)  # (B, T); not per_token * mask, which is NaN where padding holds inf
    tokens_per_seq = mask.sum(-1)  # (B,)
    if mode == "token-mean":
        count = denominator if denominator is not None else tokens_per_seq.sum()
        return masked.sum() / count if denominator is not None or count > 0 else masked.sum() * 0
    valid_seq = tokens_per_seq > 0  # (B,)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / tokens_per_seq.clamp(min=1)  # (B,)
    elif mode == "seq-mean-token-sum":
        per_seq = masked.sum(-1)
    else:
        max_tokens = per_token.shape[1] if max_tokens is None else max_tokens
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
        per_seq = masked.sum(-1) / max_tokens
    count = denominator if denominator is not None else valid_seq.sum()
    if denominator is None and count == 0:
        return masked.sum() * 0  # keeps the graph, gives 0 rather than 0/0
    return (per_seq * valid_seq).sum() / count


def sequence_mean(per_seq: Tensor, has_tokens: Tensor, denominator: float | None) -> Tensor:
    """The mean of (B,) per-sequence terms over the rows with a valid token (or their sum / ``denominator``); a
    batch with no valid row gives 0, not 0 / 0."""
    valid = has_tokens.to(per_seq.dtype)
    count = denominator if denominator is not None else valid.sum()
    return (per_seq * valid).sum() / count if denominator is not None or count > 0 else per_seq.sum() * 0


def ratio_stats(ratio: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float) -> dict:
    """Clip fractions (where the clip zeroed the gradient) and ratio summaries over valid entries."""
    with torch.no_grad():
        valid = mask > 0
        n = valid.sum().clamp(min=1)
        low = ((ratio < 1 - eps_low) & (advantages < 0) & valid).sum() / n
        high = ((ratio > 1 + eps_high) & (advantages > 0) & valid).sum() / n
        r = ratio[valid]
        empty = r.numel() == 0
        return {
            "clip_frac_low": float(low), "clip_frac_high": float(high), "clip_frac": float(low + high),
            "ratio_mean": 1.0 if empty else float(r.mean()),
            "ratio_min": 1.0 if empty else float(r.min()),
            "ratio_max": 1.0 if empty else float(r.max()),
            "ratio_std": 0.0 if empty else float(r.std(unbiased=False)),
        }
