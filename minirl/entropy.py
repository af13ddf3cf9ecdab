"""Entropy: the covariance that lowers it, the controls the field uses, and pass@k, the measure of what it costs.

Why entropy falls. For a softmax policy a logit change dz moves the entropy by -Cov_{a~pi}(log pi(a), dz_a) to
first order; a policy-gradient step raises the logits of tokens with a positive advantage, so a token that is
already likely AND good (log pi above the mean, A above the mean) lowers the entropy, and a rare good one raises it.
On a batch, the per-token term of that covariance is ``token_covariance``; RL on language models finds it mostly
positive, so entropy collapses (Cui et al. 2025). ``minirl.entropy_toy`` checks the identity exactly on a bandit.

The controls, one function each (a loss function returns per-token terms; ``losses.aggregate`` reduces them):

- Clip-Cov (``clip_cov_mask``, ``clip_cov_token_loss``): a random few of the tokens whose covariance lies in a band
  lose their gradient. KL-Cov (``kl_cov_mask``, ``kl_cov_token_loss``): the top few by covariance get a KL penalty.
  Both follow verl 0.9.1's ``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov`` in every detail
  (which tokens are candidates, how many are picked, strict bounds), and the tests run verl's own functions.
  Both choose over the batch they are given (the covariance is centred on its means, the share is of its tokens),
  so give them the whole optimiser minibatch: under gradient accumulation, select once over it and pass each
  micro-batch its rows as ``selected=`` (``entropy_control.with_cov_selection``; verl PR #7830 fixes the same).
- An entropy bonus (``entropy_bonus``) and Skywork-OR1's adaptive coefficient toward a target entropy
  (``adaptive_entropy_coef``, ``entropy_coef_in_use``), as TRL 1.16's ``entropy_coef`` / ``use_adaptive_entropy``.
- Training only on the high-entropy "forking" tokens (``top_entropy_mask``, TRL's ``top_entropy_quantile``).
- pass@k (``pass_at_k``, ``mean_pass_at_k``): the unbiased estimator, in the stable product form.

Entropies are in nats. Copy a function with torch and the few ``checks`` helpers it imports; ``_per_token`` is the
one private helper (advantages (B,) -> (B, T)).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .checks import LOG_RATIO_LINEAR_ABOVE, choice, exp_linear_above, ndim, same_shape, zero_outside

#: The aggregations ``entropy_bonus`` knows: the same four, with the same meaning, as ``aggregation.AGGREGATIONS``.
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def _per_token(advantages: Tensor, logprobs: Tensor) -> Tensor:
    """Advantages (B,) (one per sequence) repeated over the T tokens, or (B, T) as given; ValueError otherwise."""
    if advantages.dim() == 1 and logprobs.dim() == 2 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)  # (B, T)
    same_shape(logprobs=logprobs, advantages=advantages)
    return advantages


# --- the covariance term -------------------------------------------------------------------------------------------
def token_covariance(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Each token's term of the batch covariance between log-probability and advantage, Cov(log pi, A).

    cov_i = (log pi(y_i) - mean log pi) * (A_i - mean A), both means over the valid tokens of the whole batch. Their
    mean over the valid tokens is the batch covariance (divided by N, not N - 1), the sampled form of the quantity
    whose negative times the step is the entropy change; a large positive term marks a likely token with a high
    advantage, the kind that drives entropy down. Computed from detached values: it selects tokens and is logged,
    it is never a loss term.

    Example: one row, log-probs [-ln 2, -ln 2, -2 ln 2, -2 ln 2] (pi = 1/2, 1/2, 1/4, 1/4), advantages
    [0.5, 0.5, -0.5, -0.5]: mean log-prob -1.5 ln 2, mean advantage 0, so every token's term is
    (+-0.5 ln 2) * (+-0.5) = 0.25 ln 2 = 0.173287, and so is their mean, the batch covariance.

    Args:
        logprobs: (B, T) log-probabilities (nats) of the sampled tokens under the current policy.
        advantages: (B,) one per sequence, or (B, T) per token.
        mask: (B, T) 1 on the tokens that count.

    Returns:
        (B, T) terms (nats x advantage units), 0 outside the mask; all 0 when no token is valid (never NaN).

    Raises:
        ValueError: if the shapes differ (advantages may also be (B,)).

    Copy with: _per_token.

    Source: Cui et al. 2025, arXiv 2505.22617, the token covariance Cov(y_i) of their Clip-Cov and KL-Cov section;
    verl 0.9.1 ``compute_policy_loss_kl_cov`` (``cov_lst_all``).
    """
    advantages = _per_token(advantages, logprobs)
    same_shape(logprobs=logprobs, mask=mask)
    ndim("logprobs", logprobs, 2, "(B, T)")
    valid = mask > 0  # (B, T)
    logp = logprobs.detach()[valid]  # (N,) the valid tokens in row-major order
    adv = advantages.detach()[valid].to(logp.dtype)  # (N,)
    cov = torch.zeros_like(logprobs, dtype=logp.dtype)  # (B, T); stays 0 when N = 0 (no mean of nothing is read)
    cov[valid] = (adv - adv.mean()) * (logp - logp.mean())
    return cov


# --- Clip-Cov -------------------------------------------------------------------------------------------------------
def clip_cov_mask(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                  fraction: float = 2e-4, cov_low: float = 1.0, cov_high: float = 5.0, eps_low: float = 0.2,
                  eps_high: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Clip-Cov's selection: the tokens whose gradient is stopped.

    Candidates are the valid tokens with cov_low < cov_i < cov_high (``token_covariance``; strict, as verl), except
    those PPO's clip already holds (the clipped term is the larger, -A clip(r) > -A r: their gradient is 0 anyway,
    so they must not use up the budget). From the candidates, max(1, floor(fraction * N)) are drawn uniformly
    without replacement (N = valid tokens): verl numbers the candidates row by row and keeps the first of
    ``torch.randperm``; so does this function, with ``generator`` (None: torch's global generator, as verl).

    Example (numbers in the tests): N = 8, fraction 0.25 -> 2 of the candidates; fraction 1e-4 -> 1 (at least one,
    whenever there is a candidate); no candidate -> no token.

    Args:
        logprobs, old_logprobs, mask: (B, T), as for ``losses.token_clip_loss``.
        advantages: (B,) or (B, T).
        fraction: the share r of the valid tokens to stop (the paper's and verl's default 2e-4).
        cov_low, cov_high: the band of covariance (the paper's omega_low, omega_high; verl's 1 and 5).
        eps_low, eps_high: PPO's clip range (eps_high None: eps_low), to leave out the tokens it already clips.
        generator: the random draw's generator (None: torch's global one).

    Returns:
        (B, T) bool, True on the selected tokens (never outside the mask).

    Raises:
        ValueError: on shape mismatch, fraction outside (0, 1], cov_low >= cov_high, negative eps.

    Copy with: token_covariance, _per_token.

    Source: Cui et al. 2025, arXiv 2505.22617, Clip-Cov (its set I_clip); verl 0.9.1 ``compute_policy_loss_clip_cov``.
    """
    cov = token_covariance(logprobs, advantages, mask)  # (B, T), checks the shapes
    same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not cov_low < cov_high:
        raise ValueError(f"cov_low must be below cov_high, got cov_low={cov_low}, cov_high={cov_high}")
    eps_high = eps_low if eps_high is None else eps_high
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    valid = mask > 0  # (B, T)
    adv = zero_outside(_per_token(advantages, logprobs), mask)  # (B, T)
    ratio = exp_linear_above(zero_outside(logprobs.detach() - old_logprobs, mask), LOG_RATIO_LINEAR_ABOVE)  # (B, T)
    ppo_clipped = -adv * ratio.clamp(1 - eps_low, 1 + eps_high) > -adv * ratio  # (B, T) gradient already 0
    candidates = valid & ~ppo_clipped & (cov > cov_low) & (cov < cov_high)  # (B, T)
    n_stop = max(int(fraction * int(valid.sum())), 1)
    flat = candidates.flatten().nonzero().squeeze(-1)  # (C,) candidate positions, row by row
    picked = flat[torch.randperm(len(flat), generator=generator)[:n_stop]]  # (<= n_stop,)
    selected = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    selected[picked] = True
    return selected.view_as(candidates)


def clip_cov_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                        fraction: float = 2e-4, cov_low: float = 1.0, cov_high: float = 5.0, eps_low: float = 0.2,
                        eps_high: float | None = None, generator: torch.Generator | None = None,
                        selected: Tensor | None = None) -> tuple[Tensor, dict]:
    """Clip-Cov's per-token loss: PPO's clipped surrogate, 0 (value and gradient) on the ``clip_cov_mask`` tokens.

    loss_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high)) off the selection, 0 on it (no dual clip).
    The selected tokens still count in the aggregation's denominator, as in verl (its ``corr`` multiplies them by
    0), so reduce with ``losses.aggregate(per_token, mask, agg)``.

    Example: on-policy (r = 1), A = +2 on a selected token: its term is 0 instead of -2, and its gradient 0
    instead of -2.

    Args:
        as ``clip_cov_mask``; selected: (B, T) bool, the tokens already chosen over a larger batch (the optimiser
            minibatch these rows are a micro-batch of: ``entropy_control.with_cov_selection``); None: chosen here,
            over these rows.

    Returns:
        (per_token, stats): per_token (B, T), 0 outside the mask. stats (floats): clip_cov_frac (selected / valid
        tokens), covariance (the batch Cov(log pi, A), the mean of ``token_covariance``), approx_kl (mean of
        log pi_old - log pi over valid tokens, verl's ``ppo_kl``).

    Raises:
        ValueError: as ``clip_cov_mask``.

    Copy with: clip_cov_mask, token_covariance, _per_token.

    Source: Cui et al. 2025, arXiv 2505.22617, the Clip-Cov loss; verl 0.9.1 ``compute_policy_loss_clip_cov``.
    """
    eps_high = eps_low if eps_high is None else eps_high
    if selected is None:
        selected = clip_cov_mask(logprobs, old_logprobs, advantages, mask, fraction=fraction, cov_low=cov_low,
                                 cov_high=cov_high, eps_low=eps_low, eps_high=eps_high, generator=generator)  # (B, T)
    same_shape(logprobs=logprobs, selected=selected)
    adv = zero_outside(_per_token(advantages, logprobs), mask)  # (B, T)
    log_ratio = zero_outside(logprobs - old_logprobs, mask)  # (B, T)
    ratio = exp_linear_above(log_ratio, LOG_RATIO_LINEAR_ABOVE)  # (B, T)
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high))  # (B, T)
    per_token = torch.where(selected | (mask <= 0), 0.0, clipped)  # (B, T)
    n = mask.gt(0).sum().clamp(min=1)
    stats = {"clip_cov_frac": float(selected.sum() / n),
             "covariance": float(token_covariance(logprobs, advantages, mask).sum() / n),
             "approx_kl": float(-log_ratio.detach().sum() / n)}
    return per_token, stats


# --- KL-Cov ---------------------------------------------------------------------------------------------------------
def kl_cov_mask(logprobs: Tensor, advantages: Tensor, mask: Tensor, *, fraction: float = 2e-4) -> Tensor:
    """KL-Cov's selection: the top max(1, floor(fraction * N)) valid tokens by covariance (N = valid tokens).

    Always that many tokens when any is valid, even when every covariance is 0 or negative (verl does the same);
    ties at the cut are broken by ``torch.topk`` over the valid tokens in row-major order, the call verl makes.

    Example: one row, log-probs [0, -1, -3, -4] (mean -2), advantages [1, 3, -1, -3] (mean 0): covariances
    [2*1, 1*3, -1*-1, -2*-3] = [2, 3, 1, 6]; fraction 0.5 -> the top 2, tokens 3 and 1; fraction 1e-4 -> token 3.

    Args:
        logprobs, mask: (B, T).
        advantages: (B,) or (B, T).
        fraction: the share k of the valid tokens penalised (the paper's and verl's default 2e-4).

    Returns:
        (B, T) bool, True on the selected tokens; all False when no token is valid.

    Raises:
        ValueError: on shape mismatch or fraction outside (0, 1].

    Copy with: token_covariance, _per_token.

    Source: Cui et al. 2025, arXiv 2505.22617, KL-Cov (its set I_KL); verl 0.9.1 ``compute_policy_loss_kl_cov``.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    valid = mask > 0  # (B, T)
    cov = token_covariance(logprobs, advantages, mask)[valid]  # (N,) row-major
    selected = torch.zeros_like(valid)  # (B, T) bool
    if cov.numel() == 0:
        return selected
    top = torch.topk(cov, max(1, int(cov.numel() * fraction)), largest=True).indices  # (k,) into the valid tokens
    positions = valid.flatten().nonzero().squeeze(-1)[top]  # (k,) into the flattened (B, T)
    selected.view(-1)[positions] = True
    return selected


def kl_cov_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                      fraction: float = 2e-4, kl_coef: float = 1.0, selected: Tensor | None = None
                      ) -> tuple[Tensor, dict]:
    """KL-Cov's per-token loss: the unclipped surrogate -A r, plus kl_coef * |log r| on the ``kl_cov_mask`` tokens.

    No PPO clip at all: the KL penalty on the few high-covariance tokens is what holds the update back. |log r|
    (r = pi / pi_old) is verl's estimate of the KL between pi_old and pi on a token. Reduce with
    ``losses.aggregate(per_token, mask, agg)``.

    Example: A = +1, log r = 0.1 on a selected token, kl_coef 1: -e^0.1 + 0.1 = -1.005171; off the selection
    -1.105171.

    Args:
        logprobs, old_logprobs, mask: (B, T); advantages (B,) or (B, T).
        fraction: as ``kl_cov_mask``.
        kl_coef: the penalty's weight beta (the paper's and verl's default 1).
        selected: as ``clip_cov_token_loss``'s: the tokens chosen over the whole minibatch, or None (here).

    Returns:
        (per_token, stats): per_token (B, T), 0 outside the mask. stats (floats): kl_cov_frac (selected / valid
        tokens), covariance (the batch Cov(log pi, A)), abs_kl (mean |log r| over valid tokens, verl's ``ppo_kl``).

    Raises:
        ValueError: on shape mismatch, fraction outside (0, 1], negative kl_coef.

    Copy with: kl_cov_mask, token_covariance, _per_token.

    Source: Cui et al. 2025, arXiv 2505.22617, the KL-Cov loss; verl 0.9.1 ``compute_policy_loss_kl_cov``.
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    if selected is None:
        selected = kl_cov_mask(logprobs, advantages, mask, fraction=fraction)  # (B, T)
    same_shape(logprobs=logprobs, selected=selected)
    adv = zero_outside(_per_token(advantages, logprobs), mask)  # (B, T)
    log_ratio = zero_outside(logprobs - old_logprobs, mask)  # (B, T)
    ratio = exp_linear_above(log_ratio, LOG_RATIO_LINEAR_ABOVE)  # (B, T)
    per_token = -adv * ratio + kl_coef * log_ratio.abs() * selected  # (B, T)
    per_token = zero_outside(per_token, mask)
    n = mask.gt(0).sum().clamp(min=1)
    stats = {"kl_cov_frac": float(selected.sum() / n),
             "covariance": float(token_covariance(logprobs, advantages, mask).sum() / n),
             "abs_kl": float(log_ratio.detach().abs().sum() / n)}
    return per_token, stats


# --- high-entropy "forking" tokens ----------------------------------------------------------------------------------
def top_entropy_mask(entropy: Tensor, mask: Tensor, *, top_fraction: float) -> Tensor:
    """The valid tokens whose entropy is at or above the batch's (1 - top_fraction) quantile.

    Wang et al. train only on these "forking" tokens (top_fraction rho = 0.2). The threshold is ``torch.quantile``
    (linear interpolation) of the valid tokens' entropies, and the test is >= (ties at the threshold are all kept),
    as TRL 1.16's ``GRPOTrainer.get_high_entropy_mask``; threshold and comparison are in one dtype (float32, or
    float64 for float64 entropies): so all-equal entropies keep every token,
    top_fraction 1 keeps every valid token, and top_fraction 0 keeps the maximum (every token tied with it).

    Example: valid entropies [0.1, 0.5, 0.9, 1.3, 1.7], top_fraction 0.5: the 0.5 quantile is 0.9, so 0.9, 1.3 and
    1.7 are kept (3 of 5: a tie with the threshold is kept); top_fraction 0.2: the 0.8 quantile is
    1.3 + 0.2 * (1.7 - 1.3) = 1.38, so only 1.7.

    Args:
        entropy: (B, T) the policy's next-token entropy (nats) at each position.
        mask: (B, T) 1 on the tokens that count.
        top_fraction: rho in [0, 1], the share of tokens kept (TRL's ``top_entropy_quantile``).

    Returns:
        (B, T) bool; all False when no token is valid.

    Raises:
        ValueError: on shape mismatch or top_fraction outside [0, 1].

    Source: Wang et al. 2025, arXiv 2506.01939 (Beyond the 80/20 Rule), the policy loss restricted to the top-rho
    entropy tokens of the batch; TRL 1.16 ``GRPOTrainer.get_high_entropy_mask``.
    """
    same_shape(entropy=entropy, mask=mask)
    if not 0 <= top_fraction <= 1:
        raise ValueError(f"top_fraction must be in [0, 1], got {top_fraction}")
    valid = mask > 0  # (B, T)
    # one dtype for the quantile and the test: a float32 threshold against float64 entropies lies above the
    # smallest one after rounding, and top_fraction 1 would drop it
    compared = entropy.detach().to(torch.promote_types(entropy.dtype, torch.float32))  # (B, T); float32 as TRL
    values = compared[valid]  # (N,)
    if values.numel() == 0:
        return torch.zeros_like(valid)
    threshold = torch.quantile(values, 1 - top_fraction)
    return (compared >= threshold) & valid


# --- the entropy bonus and its adaptive coefficient -----------------------------------------------------------------
def entropy_bonus(entropy: Tensor, mask: Tensor, *, coef: float, agg: str = "token-mean",
                  max_tokens: int | None = None) -> Tensor:
    """The entropy term of the loss, -coef * H, with H the entropy aggregated over the valid tokens.

    Add it to the policy loss: minimising -coef * H raises the entropy. "token-mean" (the default) is TRL 1.16's
    bonus, the mean per-token entropy whatever the loss's aggregation; verl aggregates it like the policy loss
    (``agg_loss`` with the loss's mode), which the other three modes give, with ``losses.aggregate``'s meaning
    (rows with no valid token left out; a fully masked batch gives 0, not NaN).

    Example: entropies [[1.0, 2.0, 3.0], [4.0, pad, pad]], coef 0.01: token-mean (1+2+3+4)/4 = 2.5 -> -0.025;
    seq-mean-token-mean (2 + 4)/2 = 3 -> -0.03.

    Args:
        entropy: (B, T) next-token entropy (nats), with its gradient.
        mask: (B, T) 1 on the tokens that count (TRL: times the ``top_entropy_mask`` when one is used).
        coef: the bonus's weight (TRL's ``entropy_coef``, verl's ``entropy_coeff``); 0 gives 0.
        agg: one of ``AGGREGATIONS``.
        max_tokens: the constant of "seq-mean-token-sum-norm" (default T).

    Returns:
        A scalar tensor (nats times coef).

    Raises:
        ValueError: on shape mismatch, unknown agg, non-positive max_tokens.

    Source: PPO, Schulman et al. 2017, eq. 9 (the entropy bonus c2 S[pi]); Skywork-OR1, He et al. 2025, arXiv
    2505.22312 (the entropy loss of their objective); TRL 1.16 ``GRPOTrainer._compute_loss`` (``entropy_coef``);
    verl 0.9.1 ``verl/workers/utils/losses.py`` (``actor.entropy_coeff``, ``agg_loss`` with the loss's mode).
    """
    same_shape(entropy=entropy, mask=mask)
    ndim("entropy", entropy, 2, "(B, T)")
    choice("aggregation mode", agg, AGGREGATIONS)
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    h = zero_outside(entropy, mask)  # (B, T)
    tokens = mask.gt(0).sum(-1)  # (B,)
    if agg == "token-mean":
        return -coef * h.sum() / tokens.sum().clamp(min=1)
    divisor = {"seq-mean-token-mean": tokens.clamp(min=1), "seq-mean-token-sum": 1,
               "seq-mean-token-sum-norm": max_tokens or entropy.shape[1]}[agg]
    per_seq = h.sum(-1) / divisor  # (B,)
    return -coef * per_seq[tokens > 0].sum() / (tokens > 0).sum().clamp(min=1)


def adaptive_entropy_coef(coef: float, entropy: float, *, target: float, delta: float, coef_min: float = 0.0,
                          coef_max: float = 1.0) -> float:
    """Skywork-OR1's adaptive entropy coefficient: one step of the controller, after an optimiser step.

    coef + delta (at most coef_max) when the measured entropy is at or below the target, coef - delta (at least
    coef_min) above it; TRL 1.16's rule, tie included (at the target it increases). The coefficient then in use is
    ``entropy_coef_in_use``: 0 while the entropy stays above the target, so the bonus only acts to stop a collapse.

    Example: target 0.5, delta 0.1, coef 0: measured entropies 0.8, 0.4, 0.3, 0.6 -> coefficients 0 (not below 0),
    0.1, 0.2, 0.1.

    Args:
        coef: the coefficient before the update.
        entropy: the mean per-token entropy (nats) measured over the step's tokens (TRL: the tokens of the loss).
        target: the target entropy (TRL's ``entropy_target``).
        delta: the step of the coefficient (TRL's ``entropy_coef_delta``).
        coef_min, coef_max: its bounds.

    Returns:
        The next coefficient.

    Raises:
        ValueError: if delta < 0, coef_min > coef_max, or entropy is NaN.

    Source: Skywork-OR1, He et al. 2025, arXiv 2505.22312, adaptive entropy control; TRL 1.16
    ``GRPOConfig.use_adaptive_entropy`` (``GRPOTrainer._compute_loss``).
    """
    if delta < 0:
        raise ValueError(f"delta must be >= 0, got {delta}")
    if coef_min > coef_max:
        raise ValueError(f"coef_min must be <= coef_max, got coef_min={coef_min}, coef_max={coef_max}")
    if math.isnan(entropy):
        raise ValueError("entropy is NaN")
    return min(coef + delta, coef_max) if entropy <= target else max(coef - delta, coef_min)


def entropy_coef_in_use(coef: float, last_entropy: float, *, target: float) -> float:
    """The coefficient the adaptive controller applies in a step: ``coef`` when the entropy measured at the end of
    the previous step was at or below ``target``, else 0 (TRL 1.16 starts from last_entropy = inf: no bonus in the
    first step).

    Example: coef 0.2, target 0.5: last entropy 0.4 -> 0.2; 0.6 -> 0.0; inf -> 0.0.

    Source: Skywork-OR1, He et al. 2025, arXiv 2505.22312, adaptive entropy control (the loss only when the entropy
    is at or below the target); TRL 1.16 ``GRPOTrainer._compute_loss`` (``_last_world_entropy``).
    """
    return coef if last_entropy <= target else 0.0


# --- pass@k ---------------------------------------------------------------------------------------------------------
def pass_at_k(num_samples, num_correct, k: int) -> Tensor:
    """Unbiased pass@k of each problem: the chance that k of its n samples, drawn without replacement, hold a
    correct one, 1 - C(n - c, k) / C(n, k).

    Computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i): the binomials overflow float64 near n = 1030, the product
    never does (and it is exactly 1 when n - c < k: every draw of k holds a correct sample).

    Example: n = 5, c = 2, k = 2: C(3, 2) / C(5, 2) = 3/10, so 0.7; the product form (1 - 2/4)(1 - 2/5) = 0.3
    gives the same. c = 0 -> 0; c = n -> 1; k = 1 -> c / n.

    Args:
        num_samples: n per problem: an int, or (P,) ints (a list or an integer tensor).
        num_correct: c per problem, the same shape, 0 <= c <= n.
        k: the number of samples drawn, 1 <= k <= n for every problem.

    Returns:
        float64 tensor of num_samples' shape (0-dim for ints), each in [0, 1].

    Raises:
        ValueError: if k < 1, k > n for some problem, c outside [0, n], non-integer counts, or the shapes differ.

    Source: Chen et al. 2021 (Codex, "Evaluating Large Language Models Trained on Code"), eq. 1 and the
    numerically stable product of their Figure 3.
    """
    n, c = torch.as_tensor(num_samples), torch.as_tensor(num_correct)
    same_shape(num_samples=n, num_correct=c)
    if n.is_floating_point() or c.is_floating_point():
        raise ValueError(f"num_samples and num_correct must be integer counts, got {n.dtype} and {c.dtype}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    if (n < k).any():
        raise ValueError(f"k = {k} exceeds num_samples = {int(n.min())}: pass@k needs at least k samples per problem")
    if ((c < 0) | (c > n)).any():
        raise ValueError("num_correct must lie in [0, num_samples] for every problem")
    out = [1.0 if ni - ci < k else 1.0 - math.prod(1.0 - k / i for i in range(ni - ci + 1, ni + 1))
           for ni, ci in zip(n.flatten().tolist(), c.flatten().tolist(), strict=True)]
    return torch.tensor(out, dtype=torch.float64).view(n.shape)


def mean_pass_at_k(num_samples, num_correct, k: int) -> float:
    """pass@k of a benchmark: the mean over its problems of ``pass_at_k``.

    Example: problems with (n, c) = (5, 2) and (5, 0), k = 2: (0.7 + 0.0) / 2 = 0.35.

    Raises:
        ValueError: as ``pass_at_k``, and when there is no problem.

    Source: Chen et al. 2021 (Codex), eq. 1 (the expectation over problems).
    """
    if torch.as_tensor(num_samples).numel() == 0:
        raise ValueError("no problem: mean pass@k of an empty benchmark")
    return float(pass_at_k(num_samples, num_correct, k).mean())
