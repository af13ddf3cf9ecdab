"""KL estimators k1, k2, k3 and where they go: in the reward (detached) or in the loss (differentiated).

All three estimate KL(policy || ref) from tokens sampled from the policy. Their *values* are well understood
(Schulman 2020); what is less well known is that the *gradient* you get depends on where the estimate is placed
(Tang & Munos 2025; notebook 03 shows it exactly):

| estimator | in the reward (detached, REINFORCE)       | in the loss (differentiated)          |
|-----------|-------------------------------------------|---------------------------------------|
| k1        | unbiased gradient of KL(pi || ref)        | zero expected gradient                |
| k2        | grad E_pi[k2] - grad KL(pi || ref)        | unbiased gradient of KL(pi || ref)    |
| k3        | grad KL(pi || ref) - grad KL(ref || pi)   | gradient of the forward KL(ref || pi) |

(On-policy expectations; ``minirl.kl_toy`` computes every cell exactly by enumeration.)

To *measure* a language model's KL to its reference (rather than estimate it for a gradient), use
``exact_token_kl`` / ``sequence_kl`` / ``fresh_sample_kl``: the full-vocabulary KL at every position of fresh samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import choice, same_shape
from .rollout import completion_logits, generate
from .tasks import score

#: Log-ratios are clamped to this magnitude before exp() in k3, so |logprobs - ref_logprobs| up to 50 (and beyond)
#: stays finite. exp(20) ~ 4.9e8 is far outside anything a sane run reaches; the clamp only guards against inf/NaN.
LOG_RATIO_CLAMP = 20.0

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
    of the forward KL(ref || pi), not of the reverse KL the penalty is meant to be (notebook 03 shows this exactly).

    The log-ratio is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] (20 nats) before exp, so extreme inputs give
    finite values and gradients; inside the clamp the function is exact. Outside it the gradient of the exp term is
    zero and only the linear term (-log r) still pulls.

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
    return torch.clamp(log_r, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp() - 1 - log_r


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Dispatch to ``k1``, ``k2`` or ``k3`` by name. (B, T) -> (B, T).

    Raises:
        ValueError: for an unknown estimator name, or if the shapes differ.
    """
    choice("kl estimator", estimator, ESTIMATORS)
    return {"k1": k1, "k2": k2, "k3": k3}[estimator](logprobs, ref_logprobs)


def kl_in_reward(token_rewards: Tensor, logprobs: Tensor, ref_logprobs: Tensor, beta: float, estimator: str = "k1"
                 ) -> Tensor:
    """Place the KL penalty in the reward: r_t <- r_t - beta * sg[k(t)], a per-token reward, detached.

    The penalty then reaches the policy only through the advantages (reward-to-go), as any other reward would:
    a REINFORCE estimate. With k1 this is the unbiased gradient of KL(pi || ref) (the RLHF/PPO placement).

    Args:
        token_rewards: (B, T) per-token rewards (task score usually at the last completion token).
        logprobs: (B, T) the policy's log-probs of the sampled tokens (the behaviour policy's, at rollout time).
        ref_logprobs: (B, T) the reference model's log-probs of the same tokens.
        beta: KL coefficient (>= 0).
        estimator: "k1", "k2" or "k3".

    Returns:
        (B, T) shaped rewards. Mask them with the completion mask before use.

    Raises:
        ValueError: on shape mismatch, unknown estimator, or beta < 0.

    Source: Ouyang et al. 2022 (InstructGPT), eq. 2; placement analysis: Tang & Munos 2025.
    """
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    same_shape(token_rewards=token_rewards, logprobs=logprobs)
    return token_rewards - beta * kl_estimate(logprobs, ref_logprobs, estimator).detach()


def kl_in_loss(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Place the KL in the loss: the per-token estimate, *differentiated* through ``logprobs``.

    The caller adds ``beta * aggregate(kl_in_loss(...), mask, mode)`` to the policy loss. ``ref_logprobs`` is
    detached (the reference is frozen). With k3 this is GRPO's choice; its expected gradient is that of the forward
    KL. k2 in the loss gives the unbiased reverse-KL gradient; k1 in the loss gives zero in expectation.

    Args:
        logprobs: (B, T) current policy log-probs (with grad).
        ref_logprobs: (B, T) reference log-probs.
        estimator: "k1", "k2" or "k3".

    Returns:
        (B, T) per-token KL terms, to be aggregated like the policy loss.

    Raises:
        ValueError: on shape mismatch or unknown estimator.

    Source: Shao et al. 2024 (DeepSeekMath, GRPO), eq. 3-4; Tang & Munos 2025.
    """
    return kl_estimate(logprobs, ref_logprobs.detach(), estimator)


# ------------------------------------------------------------------------------------------------ the true KL
# The estimators above see one sampled token per position. To *measure* how far a language model has moved from
# its reference (the x-axis a reader cares about), we can do better: at every position of a sampled completion we
# have the full next-token distributions of both models, so the per-position KL can be summed over the vocabulary
# exactly. Only the prefixes are sampled. This is the Rao-Blackwellised k1: same mean, far less variance.


def exact_token_kl(logits: Tensor, ref_logits: Tensor, temperature: float = 1.0) -> Tensor:
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


@torch.no_grad()
def sequence_kl(model: torch.nn.Module, ref_model: torch.nn.Module, rollout, temperature: float = 1.0
                ) -> tuple[Tensor, Tensor]:
    """The TRUE KL(pi || ref) of each sampled completion: exact per-position KL summed over its valid tokens.

    For completions y sampled from pi, KL_seq(x) = E_y[sum_t KL(pi(. | x, y_<t) || ref(. | x, y_<t))] by the chain
    rule, so the per-row sum returned here is an unbiased estimate of the sequence KL of its prompt, with the same
    mean as the sum of ``k1`` over the row but a much smaller variance (no token is sampled at the position
    itself). Average it over rows (and prompts) for the policy's KL to the reference. This is a *measurement*,
    computed without gradient; it is not what any placement differentiates.

    Args:
        model: the policy pi (a causal LM).
        ref_model: the reference (same tokenizer).
        rollout: a ``rollout.Rollout`` sampled from ``model`` at ``temperature`` (fresh samples, not the training
            batch, to measure the policy as it is now).
        temperature: the sampling temperature (> 0); both models' distributions are taken at it.

    Returns:
        (kl, entropy): kl (B,) nats per completion; entropy (B,) the policy's exact next-token entropy summed over
        the same positions (nats per completion). Divide by ``rollout.lengths`` for per-token figures.

    Raises:
        ValueError: if temperature <= 0 (via ``exact_token_kl``).

    Source: chain rule of the KL divergence (Cover & Thomas, Elements of Information Theory, thm. 2.5.3).
    """
    P, mask = rollout.n_prompt_tokens, rollout.completion_mask  # mask (B, T)
    logits = completion_logits(model, rollout.input_ids, rollout.attention_mask, P)  # (B, T, V)
    ref_logits = completion_logits(ref_model, rollout.input_ids, rollout.attention_mask, P)  # (B, T, V)
    kl_t = exact_token_kl(logits, ref_logits, temperature)  # (B, T)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    entropy_t = -(logp.exp() * logp).sum(-1)  # (B, T)
    return (kl_t * mask).sum(-1), (entropy_t * mask).sum(-1)


def fresh_sample_kl(model: torch.nn.Module, ref_model: torch.nn.Module, tokenizer, prompts, samples_per_prompt: int,
                    max_new_tokens: int, temperature: float = 1.0, seed: int = 0, answers=None) -> dict:
    """Sample fresh completions from ``model`` and measure its true KL to ``ref_model`` on them (``sequence_kl``).

    The global torch RNG is saved and restored around the sampling, so measuring during training (e.g. from a
    ``train_rl`` callback) does not change the course of training; with the same seed the same prompts are
    answered with the same random numbers at every measurement.

    Args:
        model: the policy.
        ref_model: the reference.
        tokenizer: their tokenizer.
        prompts: N prompt strings (e.g. held-out prompts).
        samples_per_prompt: completions per prompt (>= 1).
        max_new_tokens: completion budget.
        temperature: sampling temperature (> 0).
        seed: seed of the sampling.
        answers: optional N answers (``tasks`` records); when given, the same fresh completions are also scored
            and the dict holds their accuracy.

    Returns:
        dict with kl (mean nats per completion), kl_stderr (its standard error over completions), kl_per_token
        (total KL / total valid tokens), entropy (the policy's mean next-token entropy, nats per token),
        length (mean tokens per completion, EOS included), n (completions) and, with answers, accuracy.

    Raises:
        ValueError: on an empty prompt list, samples_per_prompt < 1 or temperature <= 0 (from ``rollout.generate``).
    """
    prompts = list(prompts)
    was_training = model.training
    model.eval()
    with torch.random.fork_rng():  # CPU and CUDA generators are restored on exit
        torch.manual_seed(seed)
        batch = generate(model, tokenizer, prompts, samples_per_prompt, max_new_tokens, temperature)
    kl, entropy = sequence_kl(model, ref_model, batch, temperature)  # (B,), (B,)
    model.train(was_training)
    n_tok = batch.lengths.sum().clamp(min=1)
    out = {"kl": float(kl.mean()), "kl_stderr": float(kl.std() / len(kl) ** 0.5) if len(kl) > 1 else float("nan"),
           "kl_per_token": float(kl.sum() / n_tok), "entropy": float(entropy.sum() / n_tok),
           "length": float(batch.lengths.float().mean()), "n": len(kl)}
    if answers is not None:
        answers = list(answers)
        if len(answers) != len(prompts):
            raise ValueError(f"answers must have one entry per prompt ({len(prompts)}), got {len(answers)}")
        hits = [score(c, answers[i // samples_per_prompt]).correct for i, c in enumerate(batch.completions)]
        out["accuracy"] = sum(hits) / len(hits)
    return out
