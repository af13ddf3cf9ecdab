"""Stale rollouts: a sampler that is some updates behind the trainer (asynchronous RL), and what corrects for it.

Three policies meet in an asynchronous loop, each giving (B, T) log-probs of the same sampled tokens, in nats:

- ``behaviour_logprobs`` / ``sampler_logprobs``: log mu(y_t), the sampler that drew the tokens (k updates old);
- ``prox_logprobs``: log pi_prox(y_t), a recent trainer policy (the one before this update's epochs: pi_old);
- ``logprobs``: log pi_theta(y_t), the policy being trained (with grad).

Naive PPO uses mu as pi_old, so its clip acts on the staleness itself (pi / mu leaves the band before any update and
those tokens lose their gradient); decoupled PPO (AReaL) clips pi / pi_prox, a trust region around a recent policy,
and corrects for the sampler with the detached weight pi_prox / mu. DeepSeek-V3.2 adds a guard: a sequence with a
negative advantage that the current policy finds far less likely than the sampler did is left out.

- ``off_policy_sequence_mask``: DeepSeek-V3.2's off-policy sequence masking (TRL 1.16's ``get_off_policy_mask``).
- ``decoupled_ppo_terms``: the decoupled PPO loss per token, to be aggregated with ``losses.aggregate``.
- ``staleness_kl``: k3 of KL(mu || pi) per token, the sampler's distance from the trainer (a metric).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .checks import exp_linear_above, k3_of_log_ratio, ndim, same_shape, zero_outside


def _valid_log_ratio(num: Tensor, den: Tensor, mask: Tensor, num_name: str, den_name: str) -> Tensor:
    """(B, T) num - den on valid tokens (detached), 0 elsewhere, after checking shapes and finiteness."""
    same_shape(**{num_name: num, den_name: den, "completion_mask": mask})
    ndim(num_name, num, 2, "(B, T)")
    valid = mask > 0
    for name, t in ((num_name, num), (den_name, den)):
        if not torch.isfinite(t.detach()[valid]).all():  # padding may hold -inf; a valid token may not
            raise ValueError(f"{name} holds a non-finite value (NaN or inf) on a valid token of completion_mask")
    return zero_outside(num.detach() - den.detach(), mask)


def off_policy_sequence_mask(logprobs: Tensor, sampler_logprobs: Tensor, advantages: Tensor, completion_mask: Tensor,
                             *, threshold: float) -> Tensor:
    """1 for each sequence kept, 0 for each dropped: dropped when A_i < 0 and mean_t log(mu(y_t) / pi(y_t)) > delta.

    The mean log-ratio over the sequence's valid tokens is a k1 estimate of KL(mu || pi) on that sequence: how much
    less likely the current policy finds it than the sampler did. A negative-advantage sequence far off-policy
    pushes probability down on tokens pi already neglects, the updates DeepSeek-V3.2 found destabilising; positive
    advantages are always kept. A sequence with A_i = 0 is kept; one exactly at the threshold is kept.

    Example: log mu [[-1, -2], [-1, -1]], log pi [[-2, -3], [-1.2, -1]], A [-1, -1], delta 0.5: row 0 mean
    ((-1 + 2) + (-2 + 3)) / 2 = 1.0 > 0.5 -> 0; row 1 (0.2 + 0) / 2 = 0.1 -> 1. With A [+1, -1]: [1, 1].

    Args:
        logprobs: (B, T) the current policy's log-probs (detached here: the mask carries no gradient).
        sampler_logprobs: (B, T) the sampler's log-probs of the same tokens (TRL: the engine's if any, else pi_old).
        advantages: (B,) one advantage per sequence.
        completion_mask: (B, T) 1 on valid tokens; a row without any counts as on-policy (mean 0: kept).
        threshold: delta >= 0, in nats per token (TRL suggests e.g. 0.5).

    Returns:
        (B,) float mask (1 keep, 0 drop), dtype of logprobs: multiply each sequence's per-token policy loss by it, e.g.
        through ``losses.policy_loss(..., is_weights=mask * w)`` (TRL leaves the KL term unmasked).

    Raises:
        ValueError: on a shape mismatch, advantages not (B,), a non-finite log-prob on a valid token (naming the
            argument), or threshold < 0 or not finite.

    Source: DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv 2512.02556), section 3.1, eq. 9 (off-policy sequence masking);
    TRL 1.16 ``GRPOTrainer.get_off_policy_mask`` (``off_policy_mask_threshold``).
    """
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be finite and >= 0 (nats per token), got {threshold}")
    log_r = _valid_log_ratio(sampler_logprobs, logprobs, completion_mask, "sampler_logprobs", "logprobs")  # (B, T)
    if advantages.shape != log_r.shape[:1]:
        raise ValueError(f"advantages must have shape ({log_r.shape[0]},), got {tuple(advantages.shape)}")
    mean_log_r = log_r.sum(-1) / (completion_mask > 0).sum(-1).clamp(min=1)  # (B,) k1 of KL(mu || pi) per token
    keep = (advantages.detach() >= 0) | (mean_log_r <= threshold)
    return keep.to(logprobs.dtype)


def decoupled_ppo_terms(logprobs: Tensor, prox_logprobs: Tensor, behaviour_logprobs: Tensor, advantages: Tensor,
                        completion_mask: Tensor, *, eps_low: float = 0.2, eps_high: float | None = None,
                        weight_cap: float | None = None) -> Tensor:
    """Decoupled PPO per token: sg[pi_prox / mu] * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), r = pi / pi_prox.

    The clip is a trust region around the proximal policy, not around the stale sampler; the detached weight
    pi_prox / mu turns the average over the sampler's tokens into one over the proximal policy's. So the expected
    gradient is that of on-policy PPO around pi_prox, and where r is inside its band it is the exact policy
    gradient of E_pi[A] (tests/test_stale_corrections.py enumerates it on a bandit). With pi_prox = mu it is PPO's token
    loss.

    Example: log pi = log pi_prox = -1, log mu = -1.5, A = 2: r = 1, weight e^0.5 = 1.648721, term -2 * 1.648721 =
    -3.297443; log pi = -0.5 (r = e^0.5 = 1.6487 > 1.2, clipped): -2 * 1.2 * 1.648721 = -3.956931, gradient 0.

    Args:
        logprobs: (B, T) log pi_theta of the sampled tokens (with grad).
        prox_logprobs: (B, T) log pi_prox, the trainer's policy before this update (detached here).
        behaviour_logprobs: (B, T) log mu, the (stale) sampler's log-probs (detached here).
        advantages: (B,) or (B, T).
        completion_mask: (B, T) 1 on valid tokens; terms outside it are 0 and their inputs never read.
        eps_low: lower clip, 0 <= eps_low < 1.
        eps_high: upper clip >= 0 (default eps_low).
        weight_cap: optional cap > 0 on pi_prox / mu: a token whose weight exceeds it is masked (weight 0), as AReaL's
            ``behav_imp_weight_cap``.

    Returns:
        (B, T) per-token loss terms (to minimise), 0 outside the mask; aggregate with ``losses.aggregate``.

    Raises:
        ValueError: on a shape mismatch, a non-finite log-prob on a valid token, eps out of range, weight_cap <= 0.

    Source: Fu et al. 2025 (AReaL, arXiv 2505.24298), the decoupled PPO objective (after Hilton et al. 2021,
    batch size-invariance); AReaL's ``ppo_actor_loss_fn`` (``behav_imp_weight_cap``).
    """
    eps_high = eps_low if eps_high is None else eps_high
    if not (0 <= eps_low < 1 and eps_high >= 0):
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if weight_cap is not None and not weight_cap > 0:
        raise ValueError(f"weight_cap must be None or > 0, got {weight_cap}")
    log_w = _valid_log_ratio(prox_logprobs, behaviour_logprobs, completion_mask, "prox_logprobs",
                             "behaviour_logprobs")  # (B, T) log(pi_prox / mu), detached
    same_shape(logprobs=logprobs, completion_mask=completion_mask)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)  # (B, T)
    same_shape(advantages=advantages, completion_mask=completion_mask)
    weight = exp_linear_above(log_w)  # (B, T), finite whatever the staleness
    if weight_cap is not None:
        weight = torch.where(log_w <= math.log(weight_cap), weight, 0.0)
    log_ratio = zero_outside(logprobs - prox_logprobs.detach(), completion_mask)  # (B, T), padding never read
    ratio = exp_linear_above(log_ratio)
    adv = zero_outside(advantages.detach(), completion_mask)
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))
    return zero_outside(weight * surrogate, completion_mask)


def staleness_kl(sampler_logprobs: Tensor, logprobs: Tensor, completion_mask: Tensor) -> Tensor:
    """How far the sampler is from the trainer: k3 of KL(mu || pi) per token, averaged over the valid tokens.

    The tokens come from mu, so with r = pi / mu, k3 = r - 1 - log r is an unbiased, never negative estimate of
    KL(mu || pi) at each token (Schulman 2020). It grows with the number of updates the sampler is behind; 0 exactly
    when the two log-probs are equal. The same figure as ``importance.mismatch_metrics(...)["k3"]`` with pi as pi_old.

    Example: log mu [[-1, -1]], log pi [[-1, -1.5]]: log r = [0, -0.5]; (0 + e^-0.5 - 1 + 0.5) / 2 = 0.053265.

    Args:
        sampler_logprobs: (B, T) log mu of the sampled tokens.
        logprobs: (B, T) the trainer's log-probs of the same tokens (detached here).
        completion_mask: (B, T) 1 on valid tokens.

    Returns:
        () nats per token; 0 for a batch without valid tokens.

    Raises:
        ValueError: on a shape mismatch or a non-finite log-prob on a valid token.

    Source: Schulman 2020 ("Approximating KL Divergence", k3), as the staleness measure of an asynchronous sampler.
    """
    log_r = _valid_log_ratio(logprobs, sampler_logprobs, completion_mask, "logprobs", "sampler_logprobs")  # (B, T)
    k3 = zero_outside(k3_of_log_ratio(log_r), completion_mask)  # exact near r = 1
    return k3.sum() / (completion_mask > 0).sum().clamp(min=1)
