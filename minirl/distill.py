"""On-policy distillation: the student samples, a teacher grades every token, the student moves towards the teacher.

The objectives, one function each (B = sequences, T = completion positions, V = vocabulary; all in nats). p is the
student, q the teacher; "expected gradient" is the exact expectation over the student's (or, for (c), the teacher's)
samples, and every one of them is checked by enumerating all sequences of a two-token toy in tests/test_distill.py:

(a) ``reverse_kl_reward``: r_t = -(log p(y_t) - log q(y_t)) on the student's own samples, fed to REINFORCE.
    With ``rewards_to_go(gamma=1)`` its expected gradient is grad KL(p || q) over whole sequences. With gamma = 0
    (Tinker's choice) it is the sum of the per-position KL gradients along sampled prefixes: the same as (b).
(b) ``full_reverse_kl``: KL(p(.|prefix) || q(.|prefix)) summed over V at every visited position (GKD; TRL's
    ``beta=1``). Expected gradient: the per-position KL gradients; how a token steers the KL of the tokens after it
    is not differentiated. ``generalized_jsd``: GKD's JSD(beta), forward KL at beta = 0, reverse at beta = 1.
(c) ``sft_nll``: -log p(y_t) on sequences the TEACHER sampled (off-policy distillation). Expected gradient:
    grad KL(q || p) over sequences, the forward KL, learnt on the teacher's states and never on the student's own.
(d) ``mixed_reward``: kl_coef * r_t plus the task score on the last token. With ``rewards_to_go(gamma=1)`` its
    expected gradient is grad (kl_coef * KL(p || q) - E[score]).

The teacher is always detached: it is graded against, never trained. The sampled reward (a) needs only the teacher's
log-prob of each sampled token (one number per token, what a teacher server returns); (b) needs the teacher's whole
next-token distribution at every position (V numbers per token), and in return has no sampling noise at the position
itself (the Rao-Blackwellised (a) with gamma = 0).

Conventions, and where they meet TRL 1.16 (``tests/test_distill.py`` checks the equalities on shared inputs, value and
gradient: ``generalized_jsd`` vs ``GKDTrainer.generalized_jsd_loss`` to 1e-12 in float64, vs ``DistillationTrainer``'s
float32 chunked loss to 1e-6; ``reverse_kl_reward`` at gamma = 0 vs ``IWOPDTrainer``'s sampled-token loss to 1e-12):

- beta as in TRL (``GKDTrainer.generalized_jsd_loss``, ``DistillationTrainer``): beta=0 is the forward KL(q || p),
  beta=1 the reverse KL(p || q), and in between JSD(beta) = beta KL(q || m) + (1 - beta) KL(p || m) with the mixture
  m = beta q + (1 - beta) p: the paper's eq. 1 (Agarwal et al. 2024) with P the teacher and Q the student. The two
  ends are not JSD(0) and JSD(1) (both are 0): they are the limits of JSD(beta) / beta and of JSD(beta) / (1 - beta),
  so the loss's scale jumps there (JSD(0.001) is about 0.001 * KL(q || p)).
- Reduction: these functions return (B, T) per position; ``losses.aggregate(x, mask, "token-mean")`` is TRL's
  reduction (the sum over valid positions / their number, 0 for a fully masked batch: TRL's ``batchmean`` with
  labels, and its ``sum / num_items_in_batch`` under gradient accumulation with ``denominator=``).
- Temperature: both distributions are taken at the same temperature, as TRL's ``DistillationTrainer`` does (it samples
  at it too). TRL's ``GKDTrainer`` samples at ``GKDConfig.temperature`` (0.9 by default) but computes its loss at 1.0.
- The discount: Tinker's on-policy distillation uses a discount factor of ZERO (each token is graded by its own
  reward only; Thinking Machines, "On-Policy Distillation", 2025), which is not "no discounting" (gamma = 1, the exact
  sequence-KL gradient). ``rewards_to_go`` takes either; the enumeration shows what each one's gradient is.

``interop.distill_trl_kwargs`` maps each objective to TRL 1.16's settings, or refuses it with the reason.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .checks import ndim, prefix_mask, same_shape, zero_outside


def _check_tokens(logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor) -> None:
    ndim("logprobs", logprobs, 2, "(B, T)")
    same_shape(logprobs=logprobs, teacher_logprobs=teacher_logprobs, mask=mask)


def _log_probs(logits: Tensor, teacher_logits: Tensor, mask: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Student and (detached) teacher log-probs at ``temperature``, (B, T, V) each; masked positions read as logits 0,
    so padding may hold anything (inf, NaN) and still gives a finite value and a zero gradient there."""
    ndim("logits", logits, 3, "(B, T, V)")
    same_shape(logits=logits, teacher_logits=teacher_logits)
    if tuple(mask.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"mask must have shape (B, T) = {tuple(logits.shape[:2])} of logits, got {tuple(mask.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    keep = mask[..., None] > 0  # (B, T, 1)
    log_p = (torch.where(keep, logits, 0.0) / temperature).log_softmax(-1)  # (B, T, V), with grad
    log_q = (torch.where(keep, teacher_logits.detach(), 0.0) / temperature).log_softmax(-1)  # (B, T, V), no grad
    return log_p, log_q


# ------------------------------------------------------------------------------------- (a) the sampled token's reward
def reverse_kl_reward(logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor) -> Tensor:
    """The teacher's grade of each sampled token as a reward: r_t = -(log p(y_t) - log q(y_t)), detached.

    On the student's own samples, E[sum_t r_t] = -KL(p || q) over whole sequences, so maximising the reward with
    REINFORCE minimises the reverse KL; the reward is k1 of ``minirl.kl`` with the reference swapped for a teacher.
    A token the teacher finds likelier than the student gets a positive reward. Feed it, through ``rewards_to_go``,
    to the policy gradient as any other per-token reward.

    Example: logprobs [[-1, -2, -0.5]], teacher [[-1.5, -1, -0.5]], mask [[1, 1, 0]] -> [[-0.5, 1.0, 0.0]].

    Args:
        logprobs: (B, T) the student's log-probs of its sampled tokens (nats).
        teacher_logprobs: (B, T) the teacher's log-probs of the same tokens.
        mask: (B, T) completion mask; the reward is 0 outside it and the inputs there are never read.

    Returns:
        (B, T) rewards in nats, detached (a reward carries no gradient; the student's log-prob is differentiated
        only in the policy-gradient loss).

    Raises:
        ValueError: if logprobs is not 2-D or the three shapes differ.

    Source: Agarwal et al. 2024 (GKD, arXiv 2306.13649), the reverse KL on the student's own samples; Thinking
    Machines, "On-Policy Distillation" (2025), the per-token reverse KL as the advantage.
    """
    _check_tokens(logprobs, teacher_logprobs, mask)
    return zero_outside(teacher_logprobs - logprobs, mask).detach()  # -(log p - log q), 0 (not -0) outside


def rewards_to_go(rewards: Tensor, mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """Discounted reward-to-go G_t = sum_{s >= t} gamma^(s - t) r_s along each row, over the valid tokens.

    With gamma = 1 (no discounting) the REINFORCE estimate with G_t is the exact gradient of the expected sum of
    rewards; for the reverse-KL reward, of the sequence KL(p || q). With gamma = 0 each token keeps its own reward
    (Tinker's choice): the gradient then misses how a token steers the KL of the tokens after it.

    Example: rewards [[1, 2, 3]], gamma 0.5 -> [[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3]] = [[2.75, 3.5, 3.0]];
    gamma 1 -> [[6, 5, 3]]; gamma 0 -> [[1, 2, 3]].

    Args:
        rewards: (B, T) per-token rewards.
        mask: (B, T) completion mask; rewards outside it are never read and G is 0 there.
        gamma: discount in [0, 1].

    Returns:
        (B, T) rewards-to-go, in the rewards' unit.

    Raises:
        ValueError: if rewards is not 2-D, the shapes differ, or gamma is outside [0, 1].

    Source: Williams 1992 (REINFORCE); reward-to-go: Sutton et al. 2000 (policy gradient theorem).
    """
    ndim("rewards", rewards, 2, "(B, T)")
    same_shape(rewards=rewards, mask=mask)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    r = zero_outside(rewards, mask)  # (B, T)
    running, out = torch.zeros_like(r[:, 0]), []
    for t in reversed(range(r.shape[1])):
        running = r[:, t] + gamma * running  # (B,)
        out.append(running)
    return zero_outside(torch.stack(out[::-1], dim=1), mask)


# ------------------------------------------------------------------------------ (b) the whole next-token distribution
def full_reverse_kl(logits: Tensor, teacher_logits: Tensor, mask: Tensor, *, temperature: float = 1.0) -> Tensor:
    """KL(p(.|prefix) || q(.|prefix)) at every visited position, summed over the whole vocabulary.

    kl_t = sum_v p(v) (log p(v) - log q(v)). Only the prefix is sampled (by the student); the KL at the position is
    exact. Its gradient w.r.t. the student's logits is p (l - kl_t) with l = log p - log q: the expectation of the
    sampled reward's REINFORCE gradient at that position. It is computed so: the log-ratio is held fixed, because
    its own gradient term, sum_v p(v) grad log p(v) = grad sum_v p(v), is zero. Dropping it changes nothing in exact
    arithmetic and gives a student equal to its teacher exactly 0, not round-off.

    Example: p = [0.5, 0.5], q = [0.25, 0.75] -> 0.5 ln 2 + 0.5 ln(2/3) = 0.143841 nats; gradient w.r.t. the student
    logits 0.5 * ([0.693147, -0.405465] - 0.143841) = [0.274653, -0.274653].

    Args:
        logits: (B, T, V) the student's next-token logits at the completion positions (with grad).
        teacher_logits: (B, T, V) the teacher's logits at the same positions (detached here).
        mask: (B, T) completion mask; 0 outside it, and the logits there are never read.
        temperature: both distributions are softmax(logits / temperature) (> 0).

    Returns:
        (B, T) KL in nats, in the logits' dtype.

    Raises:
        ValueError: if logits is not 3-D, the logits' shapes differ, mask is not (B, T), or temperature <= 0.

    Source: Agarwal et al. 2024 (GKD, arXiv 2306.13649), eq. 1 at beta -> 1 (its reverse-KL end); TRL 1.16
    ``DistillationTrainer`` with ``beta=1.0``.
    """
    log_p, log_q = _log_probs(logits, teacher_logits, mask, temperature)
    kl = (log_p.exp() * (log_p - log_q).detach()).sum(-1)  # (B, T); the gradient flows through p only
    return zero_outside(kl, mask)


def generalized_jsd(logits: Tensor, teacher_logits: Tensor, mask: Tensor, *, beta: float,
                    temperature: float = 1.0) -> Tensor:
    """GKD's generalised Jensen-Shannon divergence JSD(beta) between teacher q and student p at every position.

    JSD(beta) = beta KL(q || m) + (1 - beta) KL(p || m), m = beta q + (1 - beta) p, summed over the vocabulary.
    beta = 0 is the forward KL(q || p) (mass-covering) and beta = 1 the reverse KL(p || q) (mode-seeking), as in TRL
    (see the module docstring: these ends are limits of the rescaled JSD). The gradient w.r.t. the student's
    probabilities is (1 - beta) (log p - log m): every term through m cancels (the m(v) sum to 1), so m is held fixed,
    which gives a student equal to its teacher exactly 0 (there m = p; logaddexp's round-off is replaced by p itself).

    Example: p = [0.5, 0.5], q = [0.25, 0.75], beta = 0.5: m = [0.375, 0.625], KL(q || m) = 0.035375,
    KL(p || m) = 0.032269, JSD = 0.033822 nats; beta = 0 -> KL(q || p) = 0.25 ln 0.5 + 0.75 ln 1.5 = 0.130812.

    Args:
        logits: (B, T, V) the student's next-token logits (with grad).
        teacher_logits: (B, T, V) the teacher's logits (detached here).
        mask: (B, T) completion mask; 0 outside it, and the logits there are never read.
        beta: in [0, 1]; TRL's ``beta`` of ``GKDConfig`` / ``DistillationConfig`` (not a KL coefficient).
        temperature: both distributions are softmax(logits / temperature) (> 0).

    Returns:
        (B, T) divergence in nats, in the logits' dtype.

    Raises:
        ValueError: if beta is outside [0, 1], or as ``full_reverse_kl``.

    Source: Agarwal et al. 2024 (GKD, arXiv 2306.13649), eq. 1 (the generalised JSD, as TRL's docstring cites it);
    TRL 1.16 ``GKDTrainer.generalized_jsd_loss``.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 1.0:
        return full_reverse_kl(logits, teacher_logits, mask, temperature=temperature)
    log_p, log_q = _log_probs(logits, teacher_logits, mask, temperature)
    p, q = log_p.exp(), log_q.exp()  # (B, T, V)
    if beta == 0.0:  # forward KL(q || p); + p - q adds 0 (both sum to 1) and makes the gradient p - q exactly
        return zero_outside((q * (log_q - log_p) + p - q).sum(-1), mask)
    log_m = torch.logaddexp(log_p + math.log1p(-beta), log_q + math.log(beta))  # (B, T, V)
    log_m = torch.where(log_p == log_q, log_p, log_m).detach()  # where p = q, m is p
    kl_teacher = (q * (log_q - log_m)).sum(-1)  # KL(q || m), (B, T); no gradient: its terms through m cancel
    kl_student = (p * (log_p - log_m).detach()).sum(-1)  # KL(p || m), the gradient through p only
    return zero_outside(beta * kl_teacher + (1 - beta) * kl_student, mask)


# --------------------------------------------------------------------------------- (c) the off-policy baseline
def sft_nll(logprobs: Tensor, mask: Tensor) -> Tensor:
    """Supervised fine-tuning on the teacher's samples: the per-token negative log-likelihood -log p(y_t).

    The sequences come from the TEACHER, so E[sum_t -log p(y_t)] = KL(q || p) + H(q) over sequences: the forward KL,
    learnt on the states the teacher visits, not on those the student will reach by itself (where its own early
    mistakes take it). Its expected gradient is zero when the student equals the teacher, but the gradient of each
    sample is not: SFT keeps moving a perfect student, on-policy distillation does not.

    Example: logprobs [[-0.5, -2.0]], mask [[1, 0]] -> [[0.5, 0.0]].

    Args:
        logprobs: (B, T) the student's log-probs of the teacher's sampled tokens (with grad).
        mask: (B, T) completion mask; 0 outside it, and the log-probs there are never read.

    Returns:
        (B, T) negative log-likelihoods in nats; aggregate them with ``losses.aggregate`` ("token-mean" is SFT's).

    Raises:
        ValueError: if logprobs is not 2-D or the shapes differ.

    Source: Kim & Rush 2016 (sequence-level knowledge distillation); a baseline of Agarwal et al. 2024 (GKD).
    """
    ndim("logprobs", logprobs, 2, "(B, T)")
    same_shape(logprobs=logprobs, mask=mask)
    return zero_outside(-logprobs, mask)


# ------------------------------------------------------------------------------------------ (d) with the task reward
def mixed_reward(logprobs: Tensor, teacher_logprobs: Tensor, scores: Tensor, mask: Tensor, *,
                 kl_coef: float = 1.0) -> Tensor:
    """The reverse-KL reward of every token, weighted, plus the task's scalar score on the last valid token.

    r_t = kl_coef * (-(log p(y_t) - log q(y_t))) + score * [t is the last valid token]. With ``rewards_to_go(gamma=1)``
    its REINFORCE gradient is that of E[score] - kl_coef * KL(p || q): RLHF's KL-regularised objective with the
    reference replaced by a teacher. Keep gamma = 1 here: with gamma = 0 the score would reach the last token alone.

    Example: logprobs [[-1, -2, -0.5]], teacher [[-1.5, -1, -0.5]], scores [2], mask [[1, 1, 0]], kl_coef 0.5 ->
    0.5 * [[-0.5, 1.0, 0]] + [[0, 2, 0]] = [[-0.25, 2.5, 0.0]].

    Args:
        logprobs: (B, T) the student's log-probs of its sampled tokens.
        teacher_logprobs: (B, T) the teacher's log-probs of the same tokens.
        scores: (B,) the task's scalar reward of each completion.
        mask: (B, T) completion mask, a prefix of ones in every row; a row with no valid token gets nothing.
        kl_coef: the weight of the reverse-KL reward (>= 0).

    Returns:
        (B, T) rewards, detached.

    Raises:
        ValueError: on shape mismatch, scores not (B,), a mask row that is not a prefix of ones, or kl_coef < 0.

    Source: the KL-regularised reward of Ouyang et al. 2022 (InstructGPT), eq. 2, with a teacher as the reference.
    """
    _check_tokens(logprobs, teacher_logprobs, mask)
    same_shape(scores=scores, mask_rows=mask[:, 0])
    prefix_mask("mask", mask)
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    n_valid = (mask > 0).sum(-1)  # (B,)
    last = torch.nn.functional.one_hot((n_valid - 1).clamp(min=0), mask.shape[1]) * (n_valid > 0)[:, None]  # (B, T)
    task = torch.where(last > 0, scores.detach()[:, None].to(logprobs.dtype), 0.0)  # (B, T); others never read
    return kl_coef * reverse_kl_reward(logprobs, teacher_logprobs, mask) + task
