"""KL estimators k1, k2, k3 and where they go: in the reward (detached) or in the loss (differentiated).

All three estimate KL(policy || ref) from tokens sampled from the policy. Their *values* are well understood
(Schulman 2020); what is less well known is that the *gradient* you get depends on where the estimate is placed
(Tang & Munos 2025; notebook 04 shows it exactly):

| estimator | in the reward (detached, REINFORCE)       | in the loss (differentiated)          |
|-----------|-------------------------------------------|---------------------------------------|
| k1        | unbiased gradient of KL(pi || ref)        | zero expected gradient                |
| k2        | grad E_pi[k2] - grad KL(pi || ref)        | unbiased gradient of KL(pi || ref)    |
| k3        | grad KL(pi || ref) - grad KL(ref || pi)   | gradient of the forward KL(ref || pi) |

(On-policy expectations; ``minirl.kl_toy`` computes every cell exactly by enumeration.)

To *measure* a language model's KL to its reference (rather than estimate it for a gradient), use
``exact_token_kl`` here, and ``evaluation.sequence_kl`` / ``evaluation.fresh_sample_kl``: the full-vocabulary KL
at every position of fresh samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import LOG_RATIO_LINEAR_ABOVE, choice, exp_linear_above, k3_of_log_ratio, same_shape, zero_outside

ESTIMATORS = ("k1", "k2", "k3")
PLACEMENTS = ("reward", "loss")


def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Naive estimate of KL(policy || ref) per sampled token: log pi - log ref.

    Unbiased for the KL's value but high variance, and negative for some samples. Placed in the reward (detached)
    it gives the unbiased policy gradient of the KL; differentiated inside a loss its expected gradient is zero,
    because E_pi[grad log pi] = 0.

    Args:
        logprobs: (B, T) log-probabilities of the sampled tokens under the policy (nats).
        ref_logprobs: (B, T) the same tokens under the reference model.

    Returns:
        (B, T) estimates in nats; positions outside the completion mask are meaningless, mask them.

    Raises:
        ValueError: if the two shapes differ.

    Source: J. Schulman, "Approximating KL Divergence" (2020), k1; in the reward as in InstructGPT
    (Ouyang et al. 2022, eq. 2).
    """
    same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return logprobs - ref_logprobs


def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Squared-log-ratio estimate of KL(policy || ref) per token: 0.5 * (log pi - log ref)^2.

    Biased for the value (it is an f-divergence that matches the KL to second order) but never negative and low
    variance. Differentiated in the loss, its expected gradient equals the true gradient of KL(pi || ref).

    Args:
        logprobs: (B, T) log-probabilities of the sampled tokens under the policy (nats).
        ref_logprobs: (B, T) the same tokens under the reference model.

    Returns:
        (B, T) estimates in nats (>= 0); mask positions outside the completion.

    Raises:
        ValueError: if the two shapes differ.

    Source: J. Schulman, "Approximating KL Divergence" (2020), k2; gradient equivalence: Tang & Munos (2025).
    """
    same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return 0.5 * (logprobs - ref_logprobs) ** 2


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Low-variance unbiased estimate of KL(policy || ref) per token: r - 1 - log r with r = ref / pi.

    Its mean is the KL and it is never negative; differentiated inside a loss, though, its expected gradient is that
    of the forward KL(ref || pi), not of the reverse KL the penalty is meant to be (notebook 04 shows this exactly).

    Above log r = LOG_RATIO_LINEAR_ABOVE (20 nats) exp is continued by its tangent, e^20 * (1 + log r - 20): value and
    gradient stay finite, the value stays >= 0, and the gradient keeps the exact one's sign. Example: logprobs -
    ref = -25 gives 6 e^20 - 26 = 2.910991e9 and d/dlogprobs = 1 - e^20 = -4.851652e8 (exact: 1 - e^25 =
    -7.200490e10, the same sign; a clamp would give +1 and push the policy away from the reference). Below 20
    nats the function is exact (exp only underflows towards 0).

    Args:
        logprobs: (B, T) log-probabilities of the sampled tokens under the policy (nats).
        ref_logprobs: (B, T) the same tokens under the reference model.

    Returns:
        (B, T) estimates in nats (>= 0); mask positions outside the completion.

    Raises:
        ValueError: if the two shapes differ.

    Source: J. Schulman, "Approximating KL Divergence" (2020), k3; used in the loss by GRPO
    (Shao et al. 2024, DeepSeekMath, eq. 4).
    """
    same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    log_r = ref_logprobs - logprobs  # (B, T)
    return k3_of_log_ratio(log_r, LOG_RATIO_LINEAR_ABOVE)  # exact near r = 1, where exp(x) - 1 - x cancels


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, *, estimator: str, mask: Tensor | None = None) -> Tensor:
    """Dispatch to ``k1``, ``k2`` or ``k3`` by name. (B, T) -> (B, T).

    With ``mask`` (B, T), the estimate is 0 outside it and the inputs there are never read: padding may hold
    anything (a pad token's log-prob can be -inf), and ``k(...) * mask`` would turn it into NaN values or gradients.

    Raises:
        ValueError: for an unknown estimator name, or if the shapes (mask included) differ.
    """
    choice("kl estimator", estimator, ESTIMATORS)
    if mask is not None:
        same_shape(logprobs=logprobs, mask=mask)
        logprobs, ref_logprobs = zero_outside(logprobs, mask), zero_outside(ref_logprobs, mask)  # k(0, 0) = 0
    return {"k1": k1, "k2": k2, "k3": k3}[estimator](logprobs, ref_logprobs)


def kl_in_reward(token_rewards: Tensor, logprobs: Tensor, ref_logprobs: Tensor, *, beta: float, estimator: str = "k1",
                 mask: Tensor | None = None) -> Tensor:
    """Place the KL penalty in the reward: r_t <- r_t - beta * sg[k(t)], a per-token reward, detached.

    The penalty then reaches the policy only through the advantages (reward-to-go), as any other reward would:
    a REINFORCE estimate. With k1 this is the unbiased gradient of KL(pi || ref) (the RLHF/PPO placement).

    Args:
        token_rewards: (B, T) per-token rewards (task score usually at the last completion token).
        logprobs: (B, T) the policy's log-probs of the sampled tokens (the behaviour policy's, at rollout time).
        ref_logprobs: (B, T) the reference model's log-probs of the same tokens.
        beta: KL coefficient (>= 0).
        estimator: "k1", "k2" or "k3".
        mask: optional (B, T) completion mask: the penalty is 0 outside it, whatever the padding holds.

    Returns:
        (B, T) shaped rewards. Mask them with the completion mask before use.

    Raises:
        ValueError: on shape mismatch, unknown estimator, or beta < 0.

    Source: Ouyang et al. 2022 (InstructGPT), eq. 2; placement analysis: Tang & Munos 2025.
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    same_shape(token_rewards=token_rewards, logprobs=logprobs)
    return token_rewards - beta * kl_estimate(logprobs, ref_logprobs, estimator=estimator, mask=mask).detach()


def kl_in_loss(logprobs: Tensor, ref_logprobs: Tensor, *, estimator: str = "k3", mask: Tensor | None = None) -> Tensor:
    """Place the KL in the loss: the per-token estimate, *differentiated* through ``logprobs``.

    The caller adds ``beta * aggregate(kl_in_loss(...), mask, mode)`` to the policy loss. ``ref_logprobs`` is
    detached (the reference is frozen). With k3 this is GRPO's choice; its expected gradient is that of the forward
    KL. k2 in the loss gives the unbiased reverse-KL gradient; k1 in the loss gives zero in expectation.

    Args:
        logprobs: (B, T) current policy log-probs (with grad).
        ref_logprobs: (B, T) reference log-probs.
        estimator: "k1", "k2" or "k3".
        mask: optional (B, T) completion mask: the terms are 0 outside it and the padding is never read, so its
            gradient there is 0 even where the padding holds inf or NaN (``losses.aggregate`` masks the value
            alone, but cannot stop k2's or k3's backward from multiplying 0 by a NaN they computed there).

    Returns:
        (B, T) per-token KL terms, to be aggregated like the policy loss.

    Raises:
        ValueError: on shape mismatch or unknown estimator.

    Source: Shao et al. 2024 (DeepSeekMath, GRPO), eq. 3-4; Tang & Munos 2025.
    """
    return kl_estimate(logprobs, ref_logprobs.detach(), estimator=estimator, mask=mask)


def ratio_weighted_k3(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, *, mask: Tensor | None = None
                      ) -> Tensor:
    """k3 times the importance ratio pi / pi_old, both differentiated: DeepSeek-V3.2's "unbiased KL estimate".

    The tokens come from pi_old, not pi. E_{pi_old}[(pi / pi_old) k3] = E_pi[k3] = KL(pi || ref) as a function of
    the policy, so the expected gradient of this term in the loss is the reverse-KL gradient, off-policy too, where
    plain k3 in the loss gives the forward KL's (``kl_toy``; tests/test_stale_corrections.py enumerates both). The
    ratio must NOT be detached: with sg[ratio] the expectation is E_pi[grad k3], the forward-KL gradient again.
    On-policy (ratio 1) the value is k3's, but the gradient is grad k3 + k3 grad log pi.

    Example: log pi = -1, log pi_old = -1.2, log ref = -0.5: ratio e^0.2 = 1.221403, k3 = e^0.5 - 1 - 0.5 =
    0.148721; term 0.181649. d/dlog pi = ratio * (k3 + 1 - e^0.5) = 1.221403 * (-0.5) = -0.610701.

    Args:
        logprobs: (B, T) current policy log-probs (with grad).
        old_logprobs: (B, T) log-probs of the policy that drew the tokens (detached here; TRL: old_per_token_logps).
        ref_logprobs: (B, T) reference log-probs (detached here).
        mask: optional (B, T) completion mask: 0 outside it, whatever the padding holds, as ``kl_estimate``.

    Returns:
        (B, T) per-token terms in nats, to be aggregated like the policy loss and scaled by beta.

    Raises:
        ValueError: if the shapes (mask included) differ.

    Source: DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv 2512.02556), section 3.1, eq. 7 (unbiased KL estimate); TRL 1.16
    ``GRPOTrainer._compute_loss`` (``use_bias_correction_kl``, on by default); Schulman 2020 (k3).
    """
    same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    if mask is not None:
        same_shape(logprobs=logprobs, mask=mask)
        logprobs, old_logprobs = zero_outside(logprobs, mask), zero_outside(old_logprobs, mask)  # ratio 1 there
    ratio = exp_linear_above(logprobs - old_logprobs.detach())  # (B, T), differentiated
    return ratio * kl_estimate(logprobs, ref_logprobs.detach(), estimator="k3", mask=mask)


# ------------------------------------------------------------------------------------------------ the true KL
# The estimators above see one sampled token per position. To *measure* how far a language model has moved from
# its reference (the x-axis a reader cares about), we can do better: at every position of a sampled completion we
# have the full next-token distributions of both models, so the per-position KL can be summed over the vocabulary
# exactly. Only the prefixes are sampled. This is the Rao-Blackwellised k1: same mean, far less variance.


def exact_token_kl(logits: Tensor, ref_logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Exact KL(pi(. | prefix) || ref(. | prefix)) at every position, summed over the whole vocabulary.

    kl_t = sum_v pi(v) (log pi(v) - log ref(v)), with pi = softmax(logits / temperature) and ref likewise.
    Unlike ``k1``/``k2``/``k3``, nothing is sampled at position t: the only randomness left is in the prefix.

    Example: pi = [0.5, 0.5], ref = [0.25, 0.75] (logits log of those) -> 0.5 ln 2 + 0.5 ln(2/3) = 0.143841 nats.

    Args:
        logits: (B, T, V) the policy's next-token logits at the completion positions.
        ref_logits: (B, T, V) the reference's logits at the same positions.
        temperature: the sampling temperature (> 0); both distributions are taken at it, as in training.

    Returns:
        (B, T) KL in nats (>= 0), float32; mask positions outside the completion.

    Raises:
        ValueError: if the shapes differ, the inputs are not 3-D, or temperature <= 0.

    Source: the definition (Kullback & Leibler 1951); summing the exact per-position KL along sampled prefixes is
    the chain rule of the KL for autoregressive models.
    """
    same_shape(logits=logits, ref_logits=ref_logits)
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape (B, T, V), got {tuple(logits.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    ref_logp = torch.log_softmax(ref_logits.float() / temperature, dim=-1)  # (B, T, V)
    # xlogy-style guard: where pi(v) underflows to 0 the term is 0, even if ref(v) is 0 too
    terms = torch.where(logp > -torch.inf, logp.exp() * (logp - ref_logp), torch.zeros_like(logp))
    return terms.sum(-1).clamp(min=0.0)  # (B, T); clamp only removes float round-off below 0


def adaptive_kl_beta(beta: float, observed_kl: float, *, target_kl: float, horizon: int, n_samples: int) -> float:
    """One update of PPO's adaptive KL controller: beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon.

    Example: beta 0.1, observed KL 0.075 nats against a target of 0.05, 64 samples, horizon 1000: the error
    0.5 clips to 0.2, so beta becomes 0.1 * (1 + 0.2 * 64 / 1000) = 0.10128.

    Args:
        beta: the current coefficient; observed_kl: the batch's KL to the reference (nats per sequence);
        target_kl: the KL aimed at (> 0); horizon: samples over which beta may move by e^0.2; n_samples: this batch's.

    Returns:
        The next beta (a float).

    Source: Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences"), section 2.2, eq. 2.
    """
    error = max(-0.2, min(0.2, observed_kl / target_kl - 1))
    return beta * (1 + error * n_samples / horizon)
