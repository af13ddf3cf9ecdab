"""Preference optimisation from pairs or labels: DPO, IPO, KTO, SimPO, and pair construction from task rollouts.

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

``ipo_bandit`` reproduces, exactly, the failure that motivated IPO: with deterministic preferences DPO sends the
probability of an action that never wins to zero whatever beta, while IPO stops at a tau-dependent policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import choice, same_shape

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
             beta: float = 0.1, label_smoothing: float = 0.0) -> tuple[Tensor, dict[str, float]]:
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
             tau: float = 0.1) -> tuple[Tensor, dict[str, float]]:
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
             beta: float = 0.1, lambda_d: float = 1.0, lambda_u: float = 1.0) -> tuple[Tensor, dict[str, float]]:
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


def simpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, beta: float = 2.0, gamma: float = 1.0
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
        gamma: >= 0, target reward margin (paper: about 0.5 to 1.5; gamma / beta is what TRL asks for).

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


# ----------------------------------------------------------------------------------------------------------------
# the IPO bandit: DPO's overfitting on deterministic preferences, computed exactly


def total_order_preferences(k: int = 3) -> Tensor:
    """Preference matrix P (k, k) of a strict ranking 0 > 1 > ... > k-1: P[i, j] = 1 if i < j, 0 if i > j.

    Action k-1 never wins a comparison. The diagonal is 0.5 (unused).
    """
    p = torch.triu(torch.ones(k, k, dtype=torch.float64), diagonal=1)
    return p + torch.eye(k, dtype=torch.float64) * 0.5


def ipo_bandit(method: str, beta: float = 0.1, steps: int = 2000, lr: float = 0.5, preferences: Tensor | None = None,
               ref_probs: Tensor | None = None) -> Tensor:
    """Exact full-batch gradient descent of DPO or IPO on a k-armed bandit; returns the policy after each step.

    The policy is pi = softmax(theta) over k actions, started at the reference. Every unordered pair {i, j} of
    actions is compared equally often, and i is preferred with probability P[i, j]. The *expected* loss is
    enumerated exactly:

        L(theta) = mean over pairs {i, j} of [ P[i, j] * loss(i > j) + P[j, i] * loss(j > i) ]

    where loss(w > l) is ``dpo_loss`` or ``ipo_loss`` of a single pair with chosen = log pi(w), rejected = log pi(l).
    No sampling: the trajectory is deterministic (float64).

    With the default strict ranking 0 > 1 > 2, action 2 never wins. DPO's loss -log sigmoid(beta * h) decreases
    for ever as the margins grow, so pi(2) -> 0 for every beta (a smaller beta even gets there faster in the
    long run, since the loss only sees beta * h). IPO regresses each margin onto 1 / (2 tau): for the strict
    ranking of 3 actions and a uniform reference its optimum is theta_0 - theta_1 = theta_1 - theta_2 = 1 / (3 tau)
    (set the derivative of (u - c)^2 + (v - c)^2 + (u + v - c)^2 to zero, c = 1 / (2 tau)), a finite policy that
    depends on tau.

    Args:
        method: "dpo" or "ipo".
        beta: > 0; DPO's beta, or IPO's tau when method == "ipo".
        steps: number of gradient steps (>= 0).
        lr: > 0, plain gradient-descent step size on the logits. IPO on the 3-action ranking is stable for
            lr < 1 (its Hessian's largest eigenvalue is 2).
        preferences: (k, k) with P[i, j] + P[j, i] = 1 off the diagonal and entries in [0, 1]; default the strict
            ranking of 3 actions (``total_order_preferences(3)``).
        ref_probs: (k,) reference policy, positive, summing to 1; default uniform.

    Returns:
        (steps + 1, k) float64 tensor: row t is pi after t steps (row 0 = the reference).

    Raises:
        ValueError: on an unknown method, beta, lr <= 0, steps < 0, or a malformed preference matrix or reference.

    Source: Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from Human Preferences",
    the analysis of weak regularisation under deterministic preferences (why DPO's beta stops mattering) and the
    illustrative bandit experiments that compare DPO and IPO (section numbers differ between arXiv versions).
    """
    choice("method", method, ("dpo", "ipo"))
    _check_positive("beta", beta)
    _check_positive("lr", lr)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    prefs = total_order_preferences(3) if preferences is None else torch.as_tensor(preferences, dtype=torch.float64)
    if prefs.dim() != 2 or prefs.shape[0] != prefs.shape[1] or prefs.shape[0] < 2:
        raise ValueError(f"preferences must have shape (k, k) with k >= 2, got {tuple(prefs.shape)}")
    k = prefs.shape[0]
    off = ~torch.eye(k, dtype=torch.bool)
    sums = (prefs + prefs.T)[off]
    if ((prefs < 0) | (prefs > 1))[off].any() or not torch.allclose(sums, torch.ones_like(sums)):
        raise ValueError("preferences must hold probabilities with P[i, j] + P[j, i] = 1 for i != j")
    if ref_probs is None:
        ref = torch.full((k,), 1.0 / k, dtype=torch.float64)
    else:
        ref = torch.as_tensor(ref_probs, dtype=torch.float64)
    if ref.shape != (k,) or (ref <= 0).any() or abs(ref.sum().item() - 1.0) > 1e-9:
        raise ValueError(f"ref_probs must have shape ({k},), be positive and sum to 1")
    ref_logp = ref.log()

    # ordered comparisons (w, l) with their probability weight: one unordered pair per i < j, equally likely
    pairs = [(win, lose, prefs[win, lose].item())
             for win in range(k) for lose in range(k) if win != lose and prefs[win, lose] > 0]
    n_unordered = k * (k - 1) // 2
    loss_fn = dpo_loss if method == "dpo" else ipo_loss
    reg = {"beta": beta} if method == "dpo" else {"tau": beta}

    theta = ref_logp.clone().requires_grad_(True)  # logits, pi_0 = ref
    probs = [ref.clone()]
    for _ in range(steps):
        logp = torch.log_softmax(theta, dim=0)  # (k,)
        expected = theta.new_zeros(())
        for win, lose, p in pairs:
            w, lo = slice(win, win + 1), slice(lose, lose + 1)  # batches of one pair, shape (1,)
            loss, _ = loss_fn(logp[w], logp[lo], ref_logp[w], ref_logp[lo], **reg)
            expected = expected + p * loss / n_unordered
        (grad,) = torch.autograd.grad(expected, theta)
        with torch.no_grad():
            theta -= lr * grad
        probs.append(torch.softmax(theta.detach(), dim=0))
    return torch.stack(probs)


# ----------------------------------------------------------------------------------------------------------------
# building preference data from task rollouts


def _group_prompts(prompts: Sequence[str], n: int, group_size: int) -> list[str]:
    """One prompt per group from either one prompt per group or one per completion (identical within a group)."""
    n_groups = n // group_size
    if len(prompts) == n_groups:
        return list(prompts)
    if len(prompts) == n:
        grouped = [prompts[g * group_size] for g in range(n_groups)]
        for g in range(n_groups):
            if any(p != grouped[g] for p in prompts[g * group_size:(g + 1) * group_size]):
                raise ValueError(f"prompts differ inside group {g}; completions must be laid out group by group")
        return grouped
    raise ValueError(f"prompts must have one entry per group ({n_groups}) or per completion ({n}), got {len(prompts)}")


def _check_rollouts(prompts, completions, rewards, group_size: int) -> tuple[list[str], list[float]]:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    rewards = rewards.tolist() if isinstance(rewards, Tensor) else list(rewards)
    if len(rewards) != len(completions):
        raise ValueError(f"rewards has {len(rewards)} entries but completions has {len(completions)}; one reward per "
                         "completion")
    if len(completions) % group_size != 0:
        raise ValueError(f"completions has {len(completions)} entries, not a multiple of group_size={group_size}")
    return _group_prompts(prompts, len(completions), group_size), [float(r) for r in rewards]


def build_preference_pairs(prompts: Sequence[str], completions: Sequence[str], rewards: Sequence[float] | Tensor,
                           group_size: int, threshold: float = 0.5):
    """Turn groups of sampled completions with verifiable rewards into (prompt, chosen, rejected) pairs.

    Completions come group by group (G = ``group_size`` samples of the same prompt, as ``rollout.generate`` lays
    them out). In each group a completion is correct when its reward > ``threshold`` (0/1 rewards: reward 1).
    The k-th correct completion (in sampling order) is paired with the k-th wrong one, so a group gives
    min(#correct, #wrong) pairs and no completion is used twice; a group with no correct or no wrong completion
    gives none. Deterministic: same input, same pairs, same order.

    Why min and not all #correct x #wrong pairs: every completion appears in at most one pair, so no single sample
    dominates the loss and the number of pairs is the number of independent comparisons.

    Args:
        prompts: one prompt per group (length B / G), or one per completion (length B, equal within a group).
        completions: (B,) completion strings, group by group.
        rewards: (B,) rewards (list or tensor), e.g. 0/1 correctness.
        group_size: G >= 2.
        threshold: reward above which a completion counts as correct.

    Returns:
        datasets.Dataset with string columns ``prompt``, ``chosen``, ``rejected`` (possibly 0 rows).

    Raises:
        ValueError: if group_size < 2, the lengths of prompts / completions / rewards do not match, B is not a
            multiple of group_size, or prompts differ within a group.
    """
    from datasets import Dataset, Features, Value

    if isinstance(group_size, int) and not isinstance(group_size, bool) and group_size < 2:
        raise ValueError(f"group_size must be >= 2 to pair completions of the same prompt, got {group_size}")
    group_prompts, rewards = _check_rollouts(prompts, completions, rewards, group_size)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for g, prompt in enumerate(group_prompts):
        idx = range(g * group_size, (g + 1) * group_size)
        correct = [completions[i] for i in idx if rewards[i] > threshold]
        wrong = [completions[i] for i in idx if rewards[i] <= threshold]
        for chosen, rejected in zip(correct, wrong, strict=False):  # zip stops at min(#correct, #wrong)
            rows["prompt"].append(prompt)
            rows["chosen"].append(chosen)
            rows["rejected"].append(rejected)
    features = Features({"prompt": Value("string"), "chosen": Value("string"), "rejected": Value("string")})
    return Dataset.from_dict(rows, features=features)


def build_kto_examples(prompts: Sequence[str], completions: Sequence[str], rewards: Sequence[float] | Tensor,
                       group_size: int, threshold: float = 0.5, only_mixed_groups: bool = False):
    """Turn sampled completions with verifiable rewards into KTO's unpaired (prompt, completion, label) examples.

    Every completion becomes one example, labelled desirable when its reward > ``threshold``. With
    ``only_mixed_groups=True`` only groups that hold both a correct and a wrong completion are kept, i.e. the
    same completions ``build_preference_pairs`` can draw from (for a like-for-like comparison with DPO).
    Order is preserved (group by group, sampling order).

    Args:
        prompts: one prompt per group (length B / G), or one per completion (length B, equal within a group).
        completions: (B,) completion strings, group by group.
        rewards: (B,) rewards (list or tensor), e.g. 0/1 correctness.
        group_size: G >= 1.
        threshold: reward above which a completion is desirable.
        only_mixed_groups: drop groups whose completions are all correct or all wrong.

    Returns:
        datasets.Dataset with columns ``prompt`` (string), ``completion`` (string), ``label`` (bool, desirable).

    Raises:
        ValueError: if the lengths of prompts / completions / rewards do not match, B is not a multiple of
            group_size, group_size < 1, or prompts differ within a group.
    """
    from datasets import Dataset, Features, Value

    group_prompts, rewards = _check_rollouts(prompts, completions, rewards, group_size)
    rows = {"prompt": [], "completion": [], "label": []}
    for g, prompt in enumerate(group_prompts):
        idx = range(g * group_size, (g + 1) * group_size)
        labels = [rewards[i] > threshold for i in idx]
        if only_mixed_groups and (all(labels) or not any(labels)):
            continue
        for i, label in zip(idx, labels, strict=True):
            rows["prompt"].append(prompt)
            rows["completion"].append(completions[i])
            rows["label"].append(label)
    features = Features({"prompt": Value("string"), "completion": Value("string"), "label": Value("bool")})
    return Dataset.from_dict(rows, features=features)


def pairs_to_examples(pairs):
    """Unpair preference pairs into KTO examples: each chosen completion desirable, each rejected one not.

    KTO then sees exactly the completions DPO sees, with the pairing thrown away, which makes the comparison of
    the two like for like. Order: the chosen then the rejected completion of pair 0, then of pair 1, ...

    Args:
        pairs: a Dataset (or dict of lists) with columns ``prompt``, ``chosen``, ``rejected``.

    Returns:
        datasets.Dataset with columns ``prompt``, ``completion``, ``label`` (bool), twice as many rows as pairs.
    """
    from datasets import Dataset, Features, Value

    rows = {"prompt": [], "completion": [], "label": []}
    for prompt, chosen, rejected in zip(pairs["prompt"], pairs["chosen"], pairs["rejected"], strict=True):
        rows["prompt"] += [prompt, prompt]
        rows["completion"] += [chosen, rejected]
        rows["label"] += [True, False]
    features = Features({"prompt": Value("string"), "completion": Value("string"), "label": Value("bool")})
    return Dataset.from_dict(rows, features=features)


def flip_pairs(pairs, fraction: float, seed: int = 0):
    """Label noise: swap chosen and rejected in a random share of the pairs.

    Exactly ``round(fraction * n)`` pairs are flipped, chosen without replacement by a seeded permutation (same
    seed, same flips). A column ``flipped`` (bool) records which, so a notebook can follow the noisy pairs.

    Args:
        pairs: a Dataset with columns ``prompt``, ``chosen``, ``rejected``.
        fraction: share of pairs to flip, in [0, 1].
        seed: seed of the choice of pairs.

    Returns:
        datasets.Dataset with the same columns plus ``flipped``.

    Raises:
        ValueError: if fraction is outside [0, 1].
    """
    from datasets import Dataset, Features, Value

    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    n = len(pairs)
    k = round(fraction * n)
    flipped = torch.zeros(n, dtype=torch.bool)
    flipped[torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k]] = True
    chosen, rejected = list(pairs["chosen"]), list(pairs["rejected"])
    rows = {"prompt": list(pairs["prompt"]), "chosen": [], "rejected": [], "flipped": flipped.tolist()}
    for c, r, f in zip(chosen, rejected, rows["flipped"], strict=True):
        rows["chosen"].append(r if f else c)
        rows["rejected"].append(c if f else r)
    features = Features({"prompt": Value("string"), "chosen": Value("string"), "rejected": Value("string"),
                         "flipped": Value("bool")})
    return Dataset.from_dict(rows, features=features)


__all__ = [
    "dpo_loss", "ipo_loss", "kto_loss", "kto_mismatched_indices", "simpo_loss", "ipo_bandit",
    "total_order_preferences", "build_preference_pairs", "build_kto_examples", "pairs_to_examples", "flip_pairs",
]
