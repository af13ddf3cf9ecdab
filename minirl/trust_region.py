"""The trust region anchored on the sampler: DPPO's divergence masks (Qi et al. 2026) and Kimi K2.5's squared
log-ratio to the sampler.

PPO's clip bounds the ratio r = pi / mu of each sampled token. DPPO ("Rethinking the Trust Region in LLM RL", arXiv
2602.04879) bounds a divergence between pi and mu instead, read on the sampled token as a two-outcome (binary)
distribution, {y_t, anything else}, with p = pi(y_t) and q = mu(y_t):

    binary TV:  p - q                                   (signed; its size is the total variation)
    binary KL:  q log(q / p) + (1 - q) log((1 - q) / (1 - p))

A ratio bound treats a token at q = 0.001 and one at q = 0.9 alike; these bounds do not: the rare token may double
(p - q = 0.001) while the likely one may not move by 0.2. A token whose divergence has passed delta on the side its
advantage pushes (p up for A > 0, p down for A < 0) gets no gradient; every other token gets REINFORCE's, weighted
by the detached ratio, capped at ``is_cap``. In the training loop: ``RLConfig.loss_mode`` "dppo_tv" / "dppo_kl"
(``losses.policy_loss`` calls ``dppo_loss`` with eps_low / eps_high as the deltas and ``dppo_cap`` as the cap; the
anchor is pi_old, the sampler's log-probs with ``pi_old="naive"``, as the paper anchors it) and ``sampler_kl_tau``
(``rl_update.sampler_term`` adds ``sampler_log_ratio_penalty``, aggregated like the policy loss).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .aggregation import aggregate
from .checks import choice, zero_outside

#: The two divergences of DPPO's mask.
DPPO_DIVERGENCES = ("tv", "kl")
#: verl's guard inside the binary KL's second log, kept so the two compute the same mask: it keeps the log finite
#: when p or q rounds to 1.
BINARY_KL_EPS = 1e-8


def binary_kl(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """KL(mu || pi) of the two-outcome distributions {y_t, not y_t}, per token.

    q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8)) with p = exp(logprobs), q = exp(old_logprobs).

    Example: q = 0.5, p = 0.8: 0.5 ln(0.625) + 0.5 ln(2.5) = -0.235002 + 0.458145 = 0.223144 (the guard changes the
    sixth digit at most).

    Args:
        logprobs, old_logprobs: (B, T) log pi(y_t) and log mu(y_t).

    Returns:
        (B, T), >= 0 up to round-off.

    Source: Qi et al. 2026 (arXiv 2602.04879), DPPO-Binary-KL; verl 0.9.1 ``compute_policy_loss_dppo_kl``.
    """
    p, q = logprobs.exp(), old_logprobs.exp()
    return q * (old_logprobs - logprobs) + (1 - q) * torch.log((1 - q + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS))


def dppo_mask(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, *, divergence: str = "tv",
              delta_low: float = 0.2, delta_high: float = 0.2) -> Tensor:
    """DPPO's trust region: 1 where a token keeps its gradient, 0 where its divergence from the sampler has passed
    delta on the side its advantage pushes.

    With p = pi(y_t), q = mu(y_t):
      "tv": A > 0 keeps p - q <= delta_high; A <= 0 keeps p - q >= -delta_low.
      "kl": A > 0 keeps binary_kl <= delta_high or p <= q; A <= 0 keeps binary_kl <= delta_low or p >= q.
    A token that moved against its advantage's push is always kept (its gradient pulls it back).

    Example ("tv", delta 0.2): q = 0.5, p = 0.8: A = +1 -> 0 (p rose 0.3 > 0.2, and A would push it further);
    A = -1 -> 1 (A pushes p back down). q = 0.5, p = 0.6: 1 for either sign.

    Args:
        logprobs, old_logprobs: (B, T) log pi and log mu of the sampled tokens (detached here).
        advantages: (B, T).
        divergence: one of ``DPPO_DIVERGENCES``.
        delta_low, delta_high: the bounds for A <= 0 and A > 0 (>= 0).

    Returns:
        (B, T) float mask, no gradient.

    Raises:
        ValueError: for an unknown divergence or a negative delta.

    Source: Qi et al. 2026 (arXiv 2602.04879), DPPO-Binary-TV and DPPO-Binary-KL; verl 0.9.1
    ``compute_policy_loss_dppo_tv`` / ``_kl``.
    """
    choice("divergence", divergence, DPPO_DIVERGENCES)
    if not (delta_low >= 0 and delta_high >= 0):
        raise ValueError(f"DPPO's deltas must be >= 0, got delta_low={delta_low}, delta_high={delta_high}")
    logprobs, old_logprobs = logprobs.detach(), old_logprobs.detach()
    p, q = logprobs.exp(), old_logprobs.exp()
    if divergence == "tv":
        up_ok, down_ok = p - q <= delta_high, p - q >= -delta_low
    else:
        kl = binary_kl(logprobs, old_logprobs)
        up_ok, down_ok = (kl <= delta_high) | (p <= q), (kl <= delta_low) | (p >= q)
    return torch.where(advantages > 0, up_ok, down_ok).to(logprobs.dtype)


def dppo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, divergence: str = "tv",
              delta_low: float = 0.2, delta_high: float = 0.2, is_cap: float = 20.0, agg: str = "token-mean",
              max_tokens: int | None = None, denominator: float | None = None) -> tuple[Tensor, dict]:
    """DPPO's policy loss: REINFORCE weighted by the detached, capped ratio, inside the divergence trust region.

    Per token: L_t = -A_t sg(min(r_t, C)) log pi(y_t) m_t, with r_t = pi / mu, C = ``is_cap`` and m_t =
    ``dppo_mask``. Its gradient, -A_t min(r_t, C) d log pi = -A_t d r_t while r_t < C, is the unclipped PPO
    surrogate's on every kept token; the cap is truncated importance sampling, not a trust region (the paper's
    section 5.4 recommends a large one).

    Example ("tv", delta 0.2): q = 0.5, p = 0.8 (r = 1.6), A = -1: kept, L = 1.6 * log 0.8 = -0.357030 and
    dL / d log pi = +1.6; with A = +1 the token is dropped: L = 0, gradient 0.

    Args:
        logprobs: (B, T) with grad; old_logprobs: (B, T) the sampler's (mu), detached; advantages: (B,) or (B, T);
        mask: (B, T) the valid tokens.
        divergence, delta_low, delta_high: see ``dppo_mask``.
        is_cap: C > 0, the ratio's cap (verl's ``clip_ratio_c``, default 20).
        agg, max_tokens, denominator: see ``aggregation.aggregate``.

    Returns:
        (loss, stats): dppo_masked_frac (share of valid tokens without gradient), capped_frac (kept tokens whose
        ratio passed the cap).

    Raises:
        ValueError: from ``dppo_mask``, for is_cap <= 0 or for advantages of another shape.

    Source: Qi et al. 2026 (arXiv 2602.04879), the DPPO objective; verl 0.9.1 ``policy_loss.loss_mode``
    "dppo_tv" / "dppo_kl".
    """
    if not is_cap > 0:
        raise ValueError(f"is_cap must be > 0, got {is_cap}")
    B, T = logprobs.shape
    if advantages.shape == (B,):
        advantages = advantages.unsqueeze(1).expand(B, T)
    elif advantages.shape != (B, T):
        raise ValueError(f"advantages must have shape ({B},) or ({B}, {T}), got {tuple(advantages.shape)}")
    mask = mask.to(logprobs.dtype)
    advantages = zero_outside(advantages.detach().to(logprobs.dtype), mask)
    logprobs, old_logprobs = zero_outside(logprobs, mask), zero_outside(old_logprobs.detach(), mask)
    log_ratio = (logprobs - old_logprobs).detach()
    weight = log_ratio.clamp(max=math.log(is_cap)).exp()  # min(r, C) without overflowing exp
    keep = dppo_mask(logprobs, old_logprobs, advantages, divergence=divergence, delta_low=delta_low,
                     delta_high=delta_high)
    per_token = -advantages * weight * logprobs * keep  # (B, T)
    loss = aggregate(per_token, mask, agg, max_tokens=max_tokens, denominator=denominator)
    n = mask.sum().clamp(min=1)
    stats = {"dppo_masked_frac": float(((1 - keep) * mask).sum() / n),
             "capped_frac": float(((log_ratio > math.log(is_cap)).to(mask.dtype) * keep * mask).sum() / n)}
    return loss, stats


def sampler_log_ratio_penalty(logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *, tau: float = 1e-3) -> Tensor:
    """Kimi K2.5's per-token penalty: tau (log pi(y_t) - log mu(y_t))^2, a k2 against the sampler mu, not the
    reference. Added to the policy loss, it pulls each token's probability back towards the one the sampler drew it
    with; its gradient is 2 tau log(pi / mu) d log pi (0 where pi = mu, so it does nothing on-policy).

    Example: log pi = -1.0, log mu = -1.5, tau = 1e-3: 1e-3 * 0.25 = 2.5e-4; d / d log pi = 2e-3 * 0.5 = 1e-3.

    Args:
        logprobs: (B, T) with grad; sampler_logprobs: (B, T), detached here; mask: (B, T) the valid tokens.
        tau: the coefficient (>= 0; prime-rl's default 1e-3).

    Returns:
        (B, T) per-token terms, 0 outside the mask (aggregate them as the policy loss is: ``aggregation.aggregate``).

    Raises:
        ValueError: for tau < 0.

    Source: Kimi Team 2026 (Kimi K2.5, arXiv 2602.02276), the policy loss's squared log-ratio term; prime-rl's
    ``kl_tau``.
    """
    if not tau >= 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    log_ratio = zero_outside(logprobs, mask) - zero_outside(sampler_logprobs.detach(), mask)
    return tau * log_ratio**2
