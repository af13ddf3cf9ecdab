"""Preference optimisation from pairs or labels: the DPO, IPO, KTO and SimPO losses.

All four losses take *per-sequence* log-probabilities, shape (B,): the caller decides how token log-probs become
one number per completion with ``rollout.sequence_logprobs(token_logprobs, mask, reduction="sum" | "mean")``.
That choice is part of each method's definition:

| loss  | per-sequence log-prob              | reference model | what is pushed                                    |
|-------|------------------------------------|-----------------|---------------------------------------------------|
| DPO   | sum over tokens (paper)            | yes             | -log sigmoid(beta * h), h grows without bound      |
| IPO   | sum (paper) or mean (TRL)          | yes             | (h - 1/(2 tau))^2, h regressed to a finite target  |
| KTO   | sum                                | yes             | each example alone, against a batch KL baseline z0 |
| SimPO | mean over tokens (paper, eq. 6)    | no              | -log sigmoid(beta * (c - r) - gamma)               |

with h = (log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected)), in nats.

Every loss returns ``(loss, stats)``: ``loss`` is a scalar tensor (the mean over the batch, differentiable with
respect to the policy's log-probs; the reference log-probs are detached), ``stats`` a dict of python floats (batch
means, ready for logging), described in each docstring.

``preference_toy.ipo_bandit`` reproduces, exactly, the failure that motivated IPO; ``preference_loop`` builds
pairs from task rollouts and trains with these losses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import same_shape

# ----------------------------------------------------------------------------------------------------------------
# argument checks


def _check_batch(**tensors: Tensor) -> None:
    """Each tensor must be a non-empty 1-D floating tensor (B,), all of the same shape; names go into the error."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (B,), got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name} must have shape (B,) (one log-prob per sequence), got {tuple(t.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name} is empty; the batch needs at least one sequence")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    same_shape(**tensors)


def _check_positive(name: str, value: float) -> None:
    if not value > 0:  # also rejects NaN
        raise ValueError(f"{name} must be > 0, got {value}")


def _pair_stats(chosen_rewards: Tensor, rejected_rewards: Tensor) -> dict[str, float]:
    """Batch means of the implicit rewards of chosen and rejected sequences, their margin, and accuracy."""
    margins = chosen_rewards - rejected_rewards
    return {
        "chosen_rewards": chosen_rewards.mean().item(),
        "rejected_rewards": rejected_rewards.mean().item(),
        "margins": margins.mean().item(),
        "accuracy": (margins > 0).float().mean().item(),
    }


# ----------------------------------------------------------------------------------------------------------------
# losses


def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor, ref_rejected_logps: Tensor,
             *, beta: float = 0.1, label_smoothing: float = 0.0) -> tuple[Tensor, dict[str, float]]:
    """Direct Preference Optimisation: logistic regression of the implicit reward margin.

    With h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)) the loss per pair is

        -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)

    and the batch mean is returned. eps = ``label_smoothing`` = 0 is DPO; eps > 0 is conservative DPO (cDPO), which
    assumes each label is flipped with probability eps: its minimum is then at a finite margin
    beta * h = log((1 - eps) / eps) instead of at h = +infinity. Why it matters: with eps = 0 nothing stops the
    margin from growing forever on a pair the data always ranks the same way (see ``ipo_bandit``).

    When policy == reference, h = 0 and the loss is ln 2 = 0.693147 for any batch and any eps.

    Args:
        chosen_logps: (B,) log pi(y_w | x) under the policy, summed over the completion's tokens (nats).
        rejected_logps: (B,) log pi(y_l | x) under the policy.
        ref_chosen_logps: (B,) log ref(y_w | x) under the frozen reference (detached here).
        ref_rejected_logps: (B,) log ref(y_l | x) under the reference.
        beta: > 0, inverse temperature of the implicit reward beta * log(pi / ref); larger = stay closer to ref.
        label_smoothing: eps in [0, 0.5), the assumed probability that a preference label is flipped.

    Returns:
        (loss, stats): loss a scalar tensor (mean over pairs). stats (python floats, batch means):
        ``chosen_rewards`` = beta * (chosen - ref_chosen), ``rejected_rewards`` = beta * (rejected - ref_rejected),
        ``margins`` = their difference (= beta * h), ``accuracy`` = fraction of pairs with margin > 0.

    Raises:
        ValueError: if an input is not a non-empty 1-D float tensor, the four shapes differ, beta <= 0, or
            label_smoothing is outside [0, 0.5).

    Source: Rafailov et al. 2023, "Direct Preference Optimization", eq. 7; label smoothing: E. Mitchell,
    "A note on DPO with noisy preferences and relationship to IPO" (2023), the cDPO loss.
    """
    _check_batch(chosen_logps=chosen_logps, rejected_logps=rejected_logps, ref_chosen_logps=ref_chosen_logps,
                 ref_rejected_logps=ref_rejected_logps)
    _check_positive("beta", beta)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_logratio = chosen_logps - ref_chosen_logps.detach()  # (B,)
    rejected_logratio = rejected_logps - ref_rejected_logps.detach()  # (B,)
    h = chosen_logratio - rejected_logratio  # (B,) nats
    losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    stats = _pair_stats(beta * chosen_logratio.detach(), beta * rejected_logratio.detach())
    return losses.mean(), stats


def ipo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor, ref_rejected_logps: Tensor,
             *, tau: float = 0.1) -> tuple[Tensor, dict[str, float]]:
    """Identity Preference Optimisation: regress the log-ratio margin h onto the finite target 1 / (2 tau).

    Loss per pair (h - 1/(2 tau))^2 with h as in ``dpo_loss`` (no beta or tau multiplies h), batch mean returned.
    Why it matters: DPO's loss keeps decreasing as h -> infinity, so deterministic preferences push the rejected
    action's probability to 0 whatever beta; IPO's square has its minimum at a finite margin, so the solution
    stays regularised towards the reference (``ipo_bandit`` shows both exactly).

    The paper uses sequence log-likelihoods (sum over tokens); TRL averages per token. Both are supported: pass
    ``rollout.sequence_logprobs(..., reduction="sum")`` or ``reduction="mean"``. With mean log-probs h is
    length-normalised, so the same tau asks for a much larger per-token change.

    Args:
        chosen_logps: (B,) per-sequence log pi(y_w | x) under the policy (sum or mean over tokens, nats).
        rejected_logps: (B,) per-sequence log pi(y_l | x) under the policy.
        ref_chosen_logps: (B,) the same for the reference (detached here).
        ref_rejected_logps: (B,) the same for the reference.
        tau: > 0, regularisation strength; the target margin is 1 / (2 tau) nats (tau = 0.1 -> 5 nats).

    Returns:
        (loss, stats): loss a scalar tensor. stats (python floats, batch means): ``chosen_rewards`` =
        chosen - ref_chosen and ``rejected_rewards`` = rejected - ref_rejected (log-ratios in nats, unscaled, since
        IPO has no beta), ``margins`` = h, ``target_margin`` = 1/(2 tau), ``accuracy`` = fraction with h > 0.

    Raises:
        ValueError: if an input is not a non-empty 1-D float tensor, the four shapes differ, or tau <= 0.

    Source: Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human Preferences",
    eq. 17 (the sampled IPO loss).
    """
    _check_batch(chosen_logps=chosen_logps, rejected_logps=rejected_logps, ref_chosen_logps=ref_chosen_logps,
                 ref_rejected_logps=ref_rejected_logps)
    _check_positive("tau", tau)
    chosen_logratio = chosen_logps - ref_chosen_logps.detach()  # (B,)
    rejected_logratio = rejected_logps - ref_rejected_logps.detach()  # (B,)
    h = chosen_logratio - rejected_logratio  # (B,) nats
    losses = (h - 1.0 / (2.0 * tau)) ** 2
    stats = _pair_stats(chosen_logratio.detach(), rejected_logratio.detach())
    stats["target_margin"] = 1.0 / (2.0 * tau)
    return losses.mean(), stats


def kto_mismatched_indices(n: int, generator: torch.Generator | int | None = None) -> Tensor:
    """Indices j(i) that pair each example i of a batch with a *different* example (a derangement).

    KTO estimates its reference point z0 = KL(pi || ref) from completions that do not belong to the prompt:
    prompt i is scored with the completion of example j(i) != i. Pairing an example with itself would measure
    the log-ratio of the very completion being trained, which is not a KL baseline.

    Without ``generator`` the pairing is the deterministic shift j = (i + 1) mod n. With a ``torch.Generator`` (or
    an int seed) the examples are put in a random cyclic order and each is paired with the next one in that
    cycle: still never i itself, but a different pairing for each draw.

    Args:
        n: batch size, >= 2.
        generator: None (shift by one), a torch.Generator, or an int seed.

    Returns:
        (n,) int64 tensor; ``completions[idx]`` are the mismatched completions for ``prompts``.

    Raises:
        ValueError: if n < 2 (one example cannot be paired with another).

    Source: Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization": the
    reference point z0 of eq. 8, estimated from mismatched pairs of the microbatch.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2 to pair each example with a different one, got {n!r}")
    if generator is None:
        return (torch.arange(n) + 1) % n
    if isinstance(generator, int):
        generator = torch.Generator().manual_seed(generator)
    order = torch.randperm(n, generator=generator)  # a random cycle order[0] -> order[1] -> ... -> order[0]
    idx = torch.empty(n, dtype=torch.long)
    idx[order] = order.roll(-1)
    return idx


def kto_loss(logps: Tensor, ref_logps: Tensor, kl_logps: Tensor, kl_ref_logps: Tensor, desirable: Tensor,
             *, beta: float = 0.1, lambda_d: float = 1.0, lambda_u: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """Kahneman-Tversky Optimisation: each example alone, judged desirable or not, against a KL baseline z0.

    With r = log pi(y|x) - log ref(y|x) and z0 = max(0, mean_i[log pi(y_j|x_i) - log ref(y_j|x_i)]) over
    mismatched pairs (detached: it is a baseline, no gradient flows through it), the loss per example is

        lambda_d * (1 - sigmoid(beta * (r - z0)))   if desirable,
        lambda_u * (1 - sigmoid(beta * (z0 - r)))   if undesirable,

    and the batch mean is returned. Why it matters: it needs only a thumbs-up / thumbs-down per completion, not
    pairs; and because of z0, raising r on a desirable example only pays when it beats the policy's overall drift
    from the reference.

    Args:
        logps: (B,) log pi(y_i | x_i) of each example's own completion, summed over tokens (nats).
        ref_logps: (B,) log ref(y_i | x_i) (detached here).
        kl_logps: (B,) log pi(y_j | x_i) of a mismatched completion, j = ``kto_mismatched_indices(B)[i]``.
        kl_ref_logps: (B,) log ref(y_j | x_i) of the same mismatched pairs.
        desirable: (B,) bool, True where the completion is desirable (e.g. correct).
        beta: > 0, scale of the implicit reward.
        lambda_d: > 0, weight of desirable examples.
        lambda_u: > 0, weight of undesirable examples. The paper suggests lambda_d * n_d / (lambda_u * n_u) in
            [1, 4/3] when the classes are imbalanced.

    Returns:
        (loss, stats): loss a scalar tensor. stats (python floats): ``z0`` (nats, the clamped KL estimate),
        ``kl_raw`` (before the clamp), ``desirable_rewards`` / ``undesirable_rewards`` = mean of beta * r over the
        examples of that class (0.0 when the batch has none; see ``n_desirable`` / ``n_undesirable``),
        ``accuracy`` = fraction of examples on their class's side of z0 (r > z0 if desirable, r < z0 if not).

    Raises:
        ValueError: if a log-prob input is not a non-empty 1-D float tensor, shapes differ, ``desirable`` is not a
            bool tensor of shape (B,), or beta, lambda_d, lambda_u <= 0.

    Source: Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization", eq. 7-8.
    """
    _check_batch(logps=logps, ref_logps=ref_logps, kl_logps=kl_logps, kl_ref_logps=kl_ref_logps)
    if not isinstance(desirable, Tensor) or desirable.dtype != torch.bool:
        got = desirable.dtype if isinstance(desirable, Tensor) else type(desirable).__name__
        raise ValueError(f"desirable must be a bool tensor of shape (B,), got {got}")
    if tuple(desirable.shape) != tuple(logps.shape):
        raise ValueError(f"desirable must have shape (B,) = {tuple(logps.shape)}, got {tuple(desirable.shape)}")
    _check_positive("beta", beta)
    _check_positive("lambda_d", lambda_d)
    _check_positive("lambda_u", lambda_u)

    kl_raw = (kl_logps - kl_ref_logps).mean().detach()  # scalar, nats
    z0 = kl_raw.clamp(min=0)  # scalar, detached: a baseline, not a target
    r = logps - ref_logps.detach()  # (B,)
    loss_d = lambda_d * (1 - torch.sigmoid(beta * (r - z0)))  # (B,)
    loss_u = lambda_u * (1 - torch.sigmoid(beta * (z0 - r)))  # (B,)
    losses = torch.where(desirable, loss_d, loss_u)

    rewards = (beta * r).detach()
    n_d = int(desirable.sum())
    n_u = desirable.numel() - n_d
    right_side = torch.where(desirable, r > z0, r < z0)
    stats = {
        "z0": z0.item(),
        "kl_raw": kl_raw.item(),
        "desirable_rewards": rewards[desirable].mean().item() if n_d else 0.0,
        "undesirable_rewards": rewards[~desirable].mean().item() if n_u else 0.0,
        "n_desirable": float(n_d),
        "n_undesirable": float(n_u),
        "accuracy": right_side.float().mean().item(),
    }
    return losses.mean(), stats


def simpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, *, beta: float = 2.0, gamma: float = 1.0
               ) -> tuple[Tensor, dict[str, float]]:
    """Simple Preference Optimisation: a reference-free margin loss on length-normalised log-probs.

    Loss per pair -log sigmoid(beta * (chosen - rejected) - gamma), batch mean returned. ``chosen``/``rejected``
    are *averaged* per-token log-probs, so the implicit reward beta * mean log pi(y|x) does not favour long or
    short answers by construction, and ``gamma`` is an absolute margin (nats, not divided by beta) that the
    reward gap must exceed. Why it matters: no reference model (half the memory of DPO), and the reward used in
    training is the same length-normalised likelihood that ranks completions at generation time.

    Args:
        chosen_logps: (B,) mean over the completion's tokens of log pi(y_w token | ...) (nats per token).
        rejected_logps: (B,) the same for the rejected completion.
        beta: > 0, reward scale (paper: 2.0 to 2.5).
        gamma: >= 0, target reward margin (paper: about 0.5 to 1.5); TRL's CPO ``simpo_gamma`` is the same absolute
            margin.

    Returns:
        (loss, stats): loss a scalar tensor. stats (python floats, batch means): ``chosen_rewards`` =
        beta * chosen, ``rejected_rewards`` = beta * rejected, ``margins`` = their difference (before subtracting
        gamma), ``accuracy`` = fraction with margin > 0.

    Raises:
        ValueError: if an input is not a non-empty 1-D float tensor, the shapes differ, beta <= 0 or gamma < 0.

    Source: Meng, Xia & Chen 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward", eq. 6.
    """
    _check_batch(chosen_logps=chosen_logps, rejected_logps=rejected_logps)
    _check_positive("beta", beta)
    if not gamma >= 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    losses = -F.logsigmoid(beta * (chosen_logps - rejected_logps) - gamma)  # (B,)
    stats = _pair_stats(beta * chosen_logps.detach(), beta * rejected_logps.detach())
    return losses.mean(), stats
