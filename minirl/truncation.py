"""Truncated samplers: the kept set of top-k / top-p sampling, and the trainer's log-probs renormalised over it.

A sampler with top-k or top-p draws only from a kept set K_t of the vocabulary at each position, with probability
mu(y) = pi(y) / S_t, where S_t = sum_{v in K_t} pi(v) is the kept mass (<= 1). A trainer that scores the same tokens
with its full-vocabulary pi sees the ratio pi(y) / mu(y) = S_t for every token, before any update: not 1, and the
smaller the kept mass, the further off (mu / pi = 1 / S_t >= 1). The PPO ratio then clips on the truncation, and the
gradient of log pi pushes down the tokens the sampler could never draw.

DeepSeek-V3.2's "keep sampling mask" records K_t while sampling and renormalises the trainer's distribution over it:
log pi_K(y) = log pi(y) - log S_t, so pi_K / mu = 1 exactly when the sampler is the trainer, and the gradient of
log pi_K moves only the logits of the kept tokens.

- ``kept_mask``: K_t from logits, by the rule of transformers' TopKLogitsWarper then TopPLogitsWarper.
- ``kept_logprobs``: the trainer's log pi_K of the sampled tokens, differentiable.
- ``kept_mass``: S_t, what the naive ratio pi / mu equals (a metric: how much the truncation removes).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import ndim, same_shape, zero_outside


def kept_mask(logits: Tensor, *, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """The tokens a top-k and/or top-p sampler can draw: True where kept, over the last dimension (the vocabulary).

    The rule of transformers' ``generate``: top-k first, then top-p on what top-k left (renormalised).

    - top-k keeps every token whose logit is >= the k-th largest: ties at the k-th value are all kept, so more
      than k tokens can remain.
    - top-p sorts the probabilities in ascending order and drops every token whose cumulative probability (itself
      included) is <= 1 - top_p; the most probable token is always kept (min_tokens_to_keep = 1, sampling without
      beams). So the kept set is the smallest top set whose mass reaches top_p, the token that crosses it included.
      Ties at that boundary are broken by ``torch.sort``'s order, as transformers does: equal logits can be split.

    Temperature comes first: pass logits / temperature (top-k does not depend on it, top-p does).

    Example: probabilities [0.5, 0.3, 0.15, 0.05]: ascending cumulative [0.05, 0.2, 0.5, 1.0]; top_p 0.75 drops
    <= 0.25 -> kept [T, T, F, F] (mass 0.8); top_p 0.85 drops <= 0.15 -> [T, T, T, F]; top_p 0.4 drops <= 0.6 ->
    [T, F, F, F]. On logits [1, 3, 3, 2]: top_k 3 -> [F, T, T, T]; top_k 2 -> [F, T, T, F]; top_k 1 -> [F, T, T, F]
    too (the tie at the k-th value).

    Args:
        logits: (..., V) next-token logits (already divided by the temperature), e.g. (B, V) or (B, T, V).
        top_k: keep the k most likely tokens (ties included); None or 0 means off (transformers' 0).
        top_p: nucleus mass in (0, 1]; None or 1.0 means off (transformers skips its warper at 1.0).

    Returns:
        (..., V) bool, True on kept tokens; at least one token per row (all True when both are off).

    Raises:
        ValueError: if logits is 0-dimensional, top_k is not None or an int >= 0, or top_p is not None or in (0, 1].

    Source: DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv 2512.02556), section 3.1 ("keep sampling mask"); the rule of
    transformers 5 ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (Holtzman et al. 2020, nucleus sampling).
    """
    if logits.dim() < 1:
        raise ValueError(f"logits must have shape (..., V), got {tuple(logits.shape)}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k must be None or an int >= 0 (0 = off), got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be None or in (0, 1] (1 = off), got {top_p!r}")
    keep = torch.ones_like(logits, dtype=torch.bool)  # (..., V)
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1) the k-th largest
        keep = logits >= kth
    if top_p is not None and top_p < 1.0:
        ascending, order = torch.sort(logits.masked_fill(~keep, -torch.inf), dim=-1, descending=False)
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - top_p  # (..., V) in ascending order
        drop[..., -1:] = False  # the most probable token always stays
        keep = keep & ~drop.scatter(-1, order, drop)  # back to vocabulary order
    return keep


def _check(logits: Tensor, kept: Tensor, mask: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """Shapes and temperature; returns (logits / temperature in float32 or wider (B, T, V), the kept set with every
    token kept off the mask (B, T, V), valid (B, T) bool). Off the mask the logits are 0 and the whole vocabulary is
    kept, so padding (NaN logits, an empty kept set) never gives -inf, nor a NaN gradient."""
    ndim("logits", logits, 3, "(B, T, V)")
    same_shape(logits=logits, kept=kept)
    same_shape(logits_bt=logits[..., 0], mask=mask)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    valid = mask > 0  # (B, T)
    logits = zero_outside(logits, valid[..., None])  # padding is never read
    dtype = torch.promote_types(logits.dtype, torch.float32)
    return logits.to(dtype) / temperature, kept | ~valid[..., None], valid


def kept_logprobs(logits: Tensor, tokens: Tensor, kept: Tensor, mask: Tensor, *, temperature: float = 1.0) -> Tensor:
    """The trainer's log-probs of the sampled tokens, renormalised over the sampler's kept set.

    log pi_K(y_t) = log pi(y_t) - log S_t, S_t = sum_{v in K_t} pi(v), pi = softmax(logits / temperature). When the
    sampler is the trainer, pi_K(y) / mu(y) = 1 exactly, where the full-vocabulary ratio pi(y) / mu(y) is S_t.
    Differentiable through both terms: the gradient w.r.t. the logits is onehot(y) - pi_K on the kept tokens and 0 on
    the others (the tokens the sampler could not draw are neither pushed down nor up).

    Example: pi = [0.5, 0.3, 0.15, 0.05], K = {0, 1} (top_p 0.8), y = 1: log 0.3 - log 0.8 = log 0.375 = -0.980829
    (full vocabulary: log 0.3 = -1.203973; the naive ratio pi / mu = 0.3 / 0.375 = 0.8 = S).

    Args:
        logits: (B, T, V) the trainer's next-token logits at the completion positions (not divided by temperature).
        tokens: (B, T) the sampled token ids (long).
        kept: (B, T, V) bool, the sampler's kept set at each position (``kept_mask`` of ITS logits / temperature).
        mask: (B, T) completion mask; positions outside it are never read (logits, tokens, kept there: anything).
        temperature: the sampling temperature (> 0), as in ``rollout.token_logprobs``.

    Returns:
        (B, T) log-probabilities in nats, float32 (or float64 for float64 logits), 0 outside the mask.

    Raises:
        ValueError: if logits is not 3-D, the shapes differ, temperature <= 0, or a valid token lies outside its kept
            set (the sampler cannot have drawn it: the mask belongs to other tokens or other logits).

    Source: DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv 2512.02556), section 3.1 ("keep sampling mask": the same
    truncation applied to pi_theta during training).
    """
    scaled, kept, valid = _check(logits, kept, mask, temperature)
    same_shape(tokens=tokens, mask=mask)
    index = torch.where(valid, tokens, 0).long()[..., None]  # (B, T, 1): padding may hold any id
    if not kept.gather(-1, index)[..., 0][valid].all():
        raise ValueError("a sampled token on a valid position is outside its kept set (kept must be the sampler's "
                         "mask of the tokens' own positions)")
    # log pi(y) - log S = log_softmax over the kept set alone: the dropped logits get exactly no gradient
    log_pi_kept = torch.log_softmax(scaled.masked_fill(~kept, -torch.inf), dim=-1)  # (B, T, V)
    return zero_outside(log_pi_kept.gather(-1, index)[..., 0], mask)


def kept_mass(logits: Tensor, kept: Tensor, mask: Tensor, *, temperature: float = 1.0) -> Tensor:
    """S_t = sum over the kept set of pi(v): the naive ratio pi(y) / mu(y) of every kept token when the sampler is
    the trainer (a metric: how much probability the truncation removes; 1 without truncation).

    Example: pi = [0.5, 0.3, 0.15, 0.05], K = {0, 1}: S = 0.8, for y = 0 and y = 1 alike.

    Args:
        logits, kept, mask, temperature: as in ``kept_logprobs``.

    Returns:
        (B, T) masses in (0, 1], detached, 1 outside the mask.

    Raises:
        ValueError: if logits is not 3-D, the shapes differ or temperature <= 0.

    Source: DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv 2512.02556), section 3.1 (the truncated sampler's mismatch).
    """
    scaled, kept, _ = _check(logits.detach(), kept, mask, temperature)
    logp = torch.log_softmax(scaled, dim=-1)  # (B, T, V)
    return torch.logsumexp(logp.masked_fill(~kept, -torch.inf), dim=-1).exp()  # (B, T)
