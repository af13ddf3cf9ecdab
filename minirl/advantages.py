"""Advantages: group-relative (GRPO, Dr. GRPO), leave-one-out (RLOO), divided by the success rate (MaxRL),
batch-normalised (REINFORCE++ and its group-baseline form), GAE with a critic (PPO), and masked whitening."""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import choice, ndim, prefix_mask, same_shape, zero_outside

SCALES = ("group", "batch", "none")
#: The outcome-reward estimators besides ``group_advantages`` (RLConfig.advantage names them).
ESTIMATORS = ("rloo", "maxrl", "reinforce_pp", "reinforce_pp_baseline")


def group_advantages(rewards: Tensor, group_size: int, *, scale: str = "group", eps: float = 1e-4) -> Tensor:
    """Group-relative advantages: each reward minus its group's mean, optionally divided by a std.

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps) for scale="group" (GRPO, unbiased std, ddof=1);
    the std of all rewards of the batch for scale="batch"; no division for scale="none" (Dr. GRPO, which argues
    the std division over-weights groups that are nearly all right or all wrong).

    A group whose rewards are all equal carries no signal and gets exactly 0, never NaN, whatever eps: its
    centred rewards are set to 0 before the division, so float round-off cannot leave a tiny std to divide by.

    NaN marks an unscored row (every reward function returned None, ``rewards.score_completions``). As in TRL
    1.16, it is left out of its group's mean and std (and out of the batch std) and gets advantage 0; a group
    with fewer than two scored rows has no baseline and gets 0 (TRL: its std is NaN, and NaN advantages are 0).

    Example: rewards [1, 0, 0, 0], G = 4: mean 0.25, unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5;
    A = [0.75, -0.25, -0.25, -0.25] / 0.5001 = [1.4997, -0.4999, -0.4999, -0.4999].
    With an unscored row, [1, 0, NaN, 0]: mean 1/3, std sqrt((4/9 + 2/9) / 2) = 0.57735;
    A = [0.6667, -0.3333, 0, -0.3333] / 0.57745 = [1.1545, -0.5773, 0, -0.5773].

    Args:
        rewards: (B,) scalar rewards, laid out group by group (rows i*G .. i*G+G-1 share a prompt); NaN = unscored.
        group_size: G >= 1. With G = 1 every advantage is 0 (a group of one has no baseline).
        scale: "group", "batch" or "none".
        eps: added to the std (>= 0).

    Returns:
        (B,) advantages, float, always finite.

    Raises:
        ValueError: if rewards is not 1-D, holds inf, B is not a multiple of group_size, or scale is unknown.

    Source: Shao et al. 2024 (DeepSeekMath, GRPO), section 4.1.2 (outcome supervision); Liu et al. 2025
    (Dr. GRPO, "Understanding R1-Zero-Like Training"), eq. 3 and section 3.1; unscored rows: TRL 1.16
    ``GRPOTrainer._generate_and_score_completions`` (nanmean, nanstd, advantage 0).
    """
    _no_inf(rewards)
    choice("advantage scale", scale, SCALES)
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")
    r = rewards.float().view(-1, group_size)  # (num_groups, G)
    scored = ~torch.isnan(r)  # (num_groups, G)
    n = scored.sum(dim=1, keepdim=True)  # scored rows per group
    r0 = torch.where(scored, r, 0.0)
    centred = torch.where(scored, r - r0.sum(dim=1, keepdim=True) / n.clamp(min=1), 0.0)  # (num_groups, G)
    lo = torch.where(scored, r, torch.inf).amin(dim=1, keepdim=True)
    hi = torch.where(scored, r, -torch.inf).amax(dim=1, keepdim=True)
    equal = (n < 2) | (lo == hi)  # groups with no signal (all scored rewards equal, or no baseline)
    centred = torch.where(equal, 0.0, centred)
    if scale == "group":
        std = (centred.pow(2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()  # ddof=1 over scored rows
        centred = centred / torch.where(equal, 1.0, std + eps)  # equal groups are already 0: no 0 / 0 at eps = 0
    elif scale == "batch":
        flat = r[scored]  # the scored rewards of the whole batch
        std = flat.std() if flat.numel() > 1 else rewards.new_zeros(())
        centred = centred / torch.where(equal, 1.0, std + eps)
    return centred.view(-1)


def _no_inf(rewards: Tensor) -> Tensor:
    """Check (B,) rewards (NaN marks an unscored row, inf is an error); return the mask of scored rows."""
    ndim("rewards", rewards, 1, "(B,)")
    if torch.isinf(rewards).any():
        raise ValueError(f"rewards must be finite (NaN marks an unscored row), got inf at row "
                         f"{int(torch.isinf(rewards).nonzero()[0])}")
    return ~torch.isnan(rewards)


def _groups(rewards: Tensor, group_size: int, who: str) -> None:
    if group_size < 2:
        raise ValueError(f"{who} needs group_size >= 2 (a group of one has no other sample to compare with), "
                         f"got {group_size}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")


def rloo_advantages(rewards: Tensor, *, group_size: int) -> Tensor:
    """REINFORCE Leave-One-Out: each reward minus the mean of the OTHER G - 1 rewards of its group.

    A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) (r_i - mean(r_group)). The baseline of sample i does not
    depend on sample i, so E[A_i grad log pi(y_i)] is exactly the policy gradient (no bias): GRPO's group mean
    includes r_i itself, which shrinks the expected gradient by (G-1)/G (notebook 01_policy_gradient enumerates
    it). No std division. A group whose rewards are all equal gets exactly 0.

    NaN marks an unscored row (every reward function returned None): as TRL 1.16's RLOOTrainer, it is left out of
    its siblings' baselines and gets advantage 0; with n scored rows in a group, A_i = n/(n-1) (r_i - their mean),
    and a group with fewer than two scored rows gets 0.

    Example: rewards [1, 0, 0, 0], G = 4: A_0 = 1 - (0+0+0)/3 = 1; A_1 = 0 - (1+0+0)/3 = -1/3;
    A = [1, -1/3, -1/3, -1/3] (= 4/3 * [0.75, -0.25, -0.25, -0.25]). With [1, 0, NaN, 0]: A_0 = 1 - (0+0)/2 = 1,
    A_1 = 0 - (1+0)/2 = -1/2; A = [1, -1/2, 0, -1/2].

    Args:
        rewards: (B,) scalar rewards, laid out group by group (rows i*G .. i*G+G-1 share a prompt); NaN = unscored.
        group_size: G >= 2.

    Returns:
        (B,) advantages, float, in reward units; they sum to 0 within each group.

    Raises:
        ValueError: if rewards is not 1-D or holds inf, group_size < 2, or B is not a multiple of group_size.

    Source: Kool, van Hoof & Welling 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (the leave-one-out
    baseline); Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization" (RLOO for LLMs,
    arXiv 2402.14740), section 3.
    """
    scored = _no_inf(rewards)
    _groups(rewards, group_size, "RLOO")
    centred = group_advantages(rewards, group_size=group_size, scale="none")  # (B,) r_i - mean of the scored rows
    n = scored.view(-1, group_size).sum(dim=1, keepdim=True)  # scored rows per group; centred is 0 where n < 2
    return (centred.view(-1, group_size) * (n / (n - 1).clamp(min=1))).view(-1)


def maxrl_advantages(rewards: Tensor, *, group_size: int) -> Tensor:
    """MaxRL: each reward minus its group's mean, divided by that mean: A_i = (r_i - mean) / mean, for 0/1 rewards.

    GRPO divides by the group's std; MaxRL divides by its success rate, so a prompt the model rarely solves weighs
    about 1/p: the gradient of log p (maximum likelihood of success) instead of p. With G samples the estimator is
    unbiased for a truncation of log p: by enumeration on the policy-gradient bandit (``pg_toy.estimator_moments``,
    ``tests/test_maxrl.py``), E[g] = (1 - (1 - p)^(G-1)) / p * grad p = grad J_{G-1}(p) exactly, with
    J_T(p) = -sum_{k=1..T} (1 - p)^k / k, the first T terms of log p = log(1 - (1 - p)). As G grows it tends to
    grad log p. A group with no success has no estimate of 1/p and gets 0 (so does a group of all successes).

    Example: rewards [1, 0, 0, 0], G = 4: mean 0.25; A = [0.75, -0.25, -0.25, -0.25] / 0.25 = [3, -1, -1, -1].
    GRPO's std would give [1.4997, -0.4999, ...]: MaxRL weighs this hard prompt twice as much.

    Args:
        rewards: (B,) 0/1 rewards, laid out group by group.
        group_size: G >= 2.

    Returns:
        (B,) advantages; they sum to 0 within each group.

    Raises:
        ValueError: if rewards is not 1-D, holds a value other than 0 or 1 (NaN included: MaxRL is defined for a
            success/failure reward), group_size < 2, or B is not a multiple of group_size.

    Source: Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning" (arXiv 2602.02710), the MaxRL
    advantage; the truncation order G - 1 is this project's enumeration.
    """
    ndim("rewards", rewards, 1, "(B,)")
    _groups(rewards, group_size, "MaxRL")
    if not ((rewards == 0) | (rewards == 1)).all():
        raise ValueError("MaxRL needs 0/1 rewards (success or failure), got "
                         f"{rewards[~((rewards == 0) | (rewards == 1))][:3].tolist()}")
    r = rewards.view(-1, group_size)  # (N, G)
    mean = r.mean(dim=1, keepdim=True)  # (N, 1) the group's success rate
    return torch.where(mean > 0, (r - mean) / mean.clamp(min=1 / group_size), 0.0).view(-1)


def reinforce_pp_advantages(rewards: Tensor, *, eps: float = 1e-4) -> Tensor:
    """REINFORCE++: the rewards normalised over the whole batch (global advantage normalisation), no group.

    A_i = (r_i - mean_B(r)) / (std_B(r) + eps), mean and unbiased std (ddof=1) over all B sequences of the batch,
    each sequence counted once. No prompt groups are needed (it works with one sample per prompt); with several,
    it ignores them, so a group whose rewards are all equal still gets a non-zero advantage when the batch mean
    differs. A batch whose rewards are all equal gets exactly 0. An unscored row (NaN) is left out of the mean
    and std and gets 0, as in ``group_advantages``.

    Example: rewards [1, 0, 0, 0]: mean 0.25, std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5;
    A = [0.75, -0.25, -0.25, -0.25] / 0.5001 = [1.4997, -0.4999, -0.4999, -0.4999].

    Args:
        rewards: (B,) scalar rewards of the whole batch.
        eps: added to the std (>= 0).

    Returns:
        (B,) advantages, float, zero mean over the batch.

    Raises:
        ValueError: if rewards is not 1-D or holds inf, or eps < 0.

    Source: Hu et al. 2025, "REINFORCE++: Stabilizing Critic-Free Policy Optimization with Global Advantage
    Normalization" (arXiv 2501.03262), section on global advantage normalisation (REINFORCE++, k >= 1).
    """
    scored = _no_inf(rewards)
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = rewards.float()[scored]  # the scored rows
    out = torch.zeros_like(rewards, dtype=torch.float)
    if r.numel() > 1 and not (r == r[:1]).all():  # else no signal (or one row): exactly 0, never 0 / 0
        out[scored] = (r - r.mean()) / (r.std() + eps)
    return out


def reinforce_pp_baseline_advantages(rewards: Tensor, *, group_size: int, eps: float = 1e-4) -> Tensor:
    """REINFORCE++ with a group baseline: subtract each group's mean, then normalise over the whole batch.

    A_i = c_i / (std_B(c) + eps) with c_i = r_i - mean(r_group), std_B the unbiased std (ddof=1) of the centred
    values over all B sequences. The batch mean of c is exactly 0, so it is not subtracted again: a group whose
    rewards are all equal keeps exactly 0. It differs from GRPO's scale="batch" (TRL's scale_rewards="batch"),
    which divides by the std of the raw rewards r, not of the centred c. An unscored row (NaN) is left out of its
    group's mean and of the std, and gets 0.

    Example: rewards [1, 0, 0, 0, 1, 1, 1, 1], G = 4: c = [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0];
    std_B(c) = sqrt((0.5625 + 3 * 0.0625) / 7) = sqrt(0.75 / 7) = 0.32733; A = c / 0.32743 =
    [2.2906, -0.7635, -0.7635, -0.7635, 0, 0, 0, 0].

    Args:
        rewards: (B,) scalar rewards, laid out group by group (rows i*G .. i*G+G-1 share a prompt).
        group_size: G >= 2.
        eps: added to the std (>= 0).

    Returns:
        (B,) advantages, float; they sum to 0 within each group.

    Raises:
        ValueError: if rewards is not 1-D or holds inf, group_size < 2, B is not a multiple of group_size, or
            eps < 0.

    Source: Hu et al. 2025, "REINFORCE++" (arXiv 2501.03262), the REINFORCE++ w/ baseline variant (k > 1); verl's
    adv_estimator=reinforce_plus_plus_baseline.
    """
    scored = _no_inf(rewards)
    _groups(rewards, group_size, "REINFORCE++-baseline")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    centred = group_advantages(rewards, group_size=group_size, scale="none")  # (B,), equal groups exactly 0
    if not centred.any():  # every group equal: no signal anywhere, and no 0 / 0
        return centred
    return centred / (centred[scored].std() + eps)  # unscored rows stay 0


def gae(rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 0.95
        ) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation over the tokens of each completion.

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, computed backwards. The value
    after a row's last valid token is 0 (the episode ends there): it is never read from padding, so a padded row
    gives the same numbers on its valid prefix as the unpadded row.

    Example: rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 1, lam 0.95:
    deltas [0.1, 0.1, 0.3]; A_2 = 0.3, A_1 = 0.1 + 0.95 * 0.3 = 0.385, A_0 = 0.1 + 0.95 * 0.385 = 0.46575;
    returns = A + V = [0.96575, 0.985, 1.0].

    Args:
        rewards: (B, T) per-token rewards (task score on the last valid token, KL penalties on every token).
        values: (B, T) critic values V(s_t) of the state before each completion token.
        mask: (B, T) 1 on valid completion tokens, a prefix of each row (the episode ends at the row's last 1).
            Positions outside it are never read: padding may hold anything, inf and NaN included.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        (advantages, returns), each (B, T), zero outside the mask; returns = advantages + values (the critic's
        regression target).

    Raises:
        ValueError: on shape mismatch, gamma / lam outside [0, 1], or a mask row that is not a prefix of ones
            (e.g. [1, 0, 1]: where would its episode end?).

    Source: Schulman et al. 2016 ("High-Dimensional Continuous Control Using GAE"), eq. 16; applied per token in
    RLHF (Ouyang et al. 2022; Ziegler et al. 2019).
    """
    same_shape(rewards=rewards, values=values, mask=mask)
    ndim("rewards", rewards, 2, "(B, T)")
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    prefix_mask("mask", mask)
    mask = mask.float()
    rewards, values = zero_outside(rewards.float(), mask), zero_outside(values.float().detach(), mask)
    T = rewards.shape[1]
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])  # V after the last token: 0
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        # padding positions carry nothing back: the row's last valid token sees next value 0 and next advantage 0
        advantages[:, t] = adv_t * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        next_adv = advantages[:, t]
    return advantages, (advantages + values) * mask


def whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Normalise ``x`` to unit variance over its valid entries (and zero mean when ``shift_mean``).

    PPO implementations whiten the advantages per batch; shift_mean=False keeps their sign, which some
    implementations prefer for the rewards. Positions outside the mask are returned as 0, and never read (they
    may hold anything, inf and NaN included).

    Args:
        x: (B, T) values.
        mask: (B, T) 1 on valid entries.
        shift_mean: subtract the masked mean.
        eps: added to the variance.

    Returns:
        (B, T) whitened values, 0 outside the mask. With fewer than 2 valid entries, x is only centred (or
        returned as is), since a variance cannot be estimated.

    Raises:
        ValueError: on shape mismatch.

    Source: common PPO practice (Huang et al. 2022, "The 37 implementation details of PPO", detail 7).
    """
    same_shape(x=x, mask=mask)
    mask = mask.float()
    x = zero_outside(x, mask)  # padding is never read
    n = mask.sum()
    if n < 1:
        return torch.zeros_like(x)
    mean = (x * mask).sum() / n
    if n < 2:
        return ((x - mean) if shift_mean else x) * mask
    var = (((x - mean) * mask) ** 2).sum() / (n - 1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask



def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """How much of the returns' variance the critic explains: 1 - Var(returns - values) / Var(returns).

    1 is a perfect critic, 0 one no better than a constant, below 0 worse than a constant. Computed over the
    valid tokens of the batch. When the returns do not vary (e.g. every completion of the batch got the same
    reward and no KL) the ratio is 0 / 0: the result is NaN, honestly undefined, and ``History.series`` and the
    plots leave such steps out.

    Example: returns [1, 0, 1, 0], values [0.5] * 4: Var(r - v) = Var(r) = 1/3, so 1 - 1 = 0.0;
    values = returns: 1.0.

    Args:
        values: (B, T) the critic's predictions at rollout time.
        returns: (B, T) GAE returns.
        mask: (B, T) 1 on valid tokens.

    Returns:
        A float in (-inf, 1], or NaN when fewer than 2 valid tokens or the returns have zero variance.

    Raises:
        ValueError: on shape mismatch.

    Source: the PPO diagnostic of OpenAI baselines / cleanrl (Huang et al. 2022, "The 37 implementation details
    of PPO").
    """
    same_shape(values=values, returns=returns, mask=mask)
    m = mask > 0
    r, v = returns[m].double(), values[m].double()
    if r.numel() < 2:
        return float("nan")
    var = r.var()
    return float(1 - (r - v).var() / var) if var > 0 else float("nan")


def group_advantages_to_go(scores: Tensor, token_penalties: Tensor, mask: Tensor, group_size: int, *,
                           scale: str = "group", eps: float = 1e-4) -> Tensor:
    """Per-token advantages for GRPO with a per-token penalty (a KL estimate) placed in the reward.

    A_t = group_advantages(scores)_i - (C_t - mean_group(C_0)), with C_t = sum_{t' >= t} c_t' the penalty-to-go
    (c = beta * k, already scaled). The task part is normalised exactly as in GRPO; the penalty part stays in reward
    units, centred by its group mean. Two choices, both deliberate:

    - reward-to-go: a token is not blamed for penalties earned before it (causality). Like any baseline, this
      lowers the variance without biasing the gradient, so k1 placed here gives the unbiased gradient of
      KL(pi || ref) (Tang & Munos 2025).
    - no std division of the penalty: a group whose task scores are all equal has a tiny spread made only of KL
      terms; dividing by it would turn a 0.001-nat difference into a unit advantage.

    Example: scores [1, 0], G = 2, penalties [[0.1, 0.2], [0.0, 0.1]] (full mask), scale "none":
    task part [0.5, -0.5]; C = [[0.3, 0.2], [0.1, 0.1]], group mean of C_0 = 0.2;
    A = [[0.5 - 0.1, 0.5 - 0.0], [-0.5 + 0.1, -0.5 + 0.1]] = [[0.4, 0.5], [-0.4, -0.4]].

    Args:
        scores: (B,) task rewards, laid out group by group.
        token_penalties: (B, T) per-token penalties (e.g. beta * k1); never read outside the mask.
        mask: (B, T) completion mask.
        group_size: G; B must be a multiple of G.
        scale, eps: as in ``group_advantages`` (for the task part).

    Returns:
        (B, T) advantages, zero outside the mask.

    Raises:
        ValueError: on shape mismatch, unknown scale, or B not a multiple of G.

    Source: Shao et al. 2024 (GRPO), eq. 4 and section 4.1; Ouyang et al. 2022 (per-token KL reward);
    reward-to-go: Williams 1992. Placement analysis: Tang & Munos 2025.
    """
    same_shape(token_penalties=token_penalties, mask=mask)
    ndim("token_penalties", token_penalties, 2, "(B, T)")
    if scores.shape != token_penalties.shape[:1]:
        raise ValueError(f"scores must have shape ({token_penalties.shape[0]},), got {tuple(scores.shape)}")
    task = group_advantages(scores, group_size, scale=scale, eps=eps)  # (B,)
    mask = mask.float()
    c = zero_outside(token_penalties.float(), mask)  # (B, T); padding may hold anything
    to_go = c.flip(-1).cumsum(-1).flip(-1)  # (B, T) C_t
    baseline = to_go[:, 0].view(-1, group_size).mean(1).repeat_interleave(group_size)  # (B,)
    return (task.unsqueeze(1) - (to_go - baseline.unsqueeze(1))) * mask


#: How several reward functions become one advantage (TRL 1.16's ``multi_objective_aggregation``).
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def _nanstd(x: Tensor, dim: int | None = None) -> Tensor:
    """The unbiased std ignoring NaN, TRL's ``nanstd`` step for step (NaN with fewer than two values)."""
    keep = dim is not None
    mean = torch.nanmean(x, dim=dim, keepdim=True) if keep else torch.nanmean(x)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True) if keep else torch.nanmean((x - mean) ** 2)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=True) if keep else (~torch.isnan(x)).sum()
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(count / 1.0, float("nan")))
    return torch.sqrt(variance * correction)


def gdpo_group_sums(rewards_per_func: Tensor, weights: Tensor, *, group_size: int, eps: float = 1e-4) -> Tensor:
    """GDPO's first stage, s_i = sum_k w_k (r_ik - mean_group(r_k)) / (std_group(r_k) + eps): (B,), NaN on a row
    no function scored. Each group's s sums to 0, so a group has signal (advantages not all 0 after the batch
    normalisation) exactly when its s are not all equal: what DAPO's dynamic sampling keeps under GDPO.

    Example: one group of G = 2, f1 = [1, 0], f2 = [0, 2], weights [2, 1]: f1 normalised [0.7071, -0.7071] (std
    0.7071), f2 [-0.7071, 0.7071] (std 1.4142, eps aside), s = [2 * 0.7071 - 0.7071, -2 * 0.7071 + 0.7071] =
    [0.7071, -0.7071], where the weighted sum of raw rewards, [2, 2], is equal in the group.

    Args: as ``gdpo_advantages`` (whose checks this stage leaves to its callers).

    Source: GDPO, Liu et al. 2026 (arXiv 2601.05242), the per-function group normalisation; reading it as DAPO's
    filter (Yu et al. 2025, eq. 11: keep a group whose advantages are not all zero) is minirl's.
    """
    K = rewards_per_func.shape[1]
    grouped = rewards_per_func.float().view(-1, group_size, K)  # (groups, G, K)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = _nanstd(grouped, dim=1) if group_size > 1 else torch.zeros_like(mean_k)
    normalised = ((grouped - mean_k) / (std_k + eps)).view(-1, K)  # (B, K)
    summed = (normalised * weights.to(normalised).unsqueeze(0)).nansum(dim=1)  # (B,) weights after normalising
    summed[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscored rows: out of the batch statistics
    return summed


def gdpo_advantages(rewards_per_func: Tensor, weights: Tensor, *, group_size: int, eps: float = 1e-4) -> Tensor:
    """GDPO: each reward function normalised within its group first, then the weighted sum, normalised over the batch.

    r~_ik = (r_ik - mean_group(r_k)) / (std_group(r_k) + eps) for each function k (unbiased std);
    s_i = sum_k w_k * r~_ik (a function that returned None for row i, NaN, is left out of the sum);
    A_i = (s_i - mean_B(s)) / (std_B(s) + eps).

    Why: summing first (GRPO's ``sum_then_normalize``) merges distinct reward vectors into one advantage: with a
    format and an answer reward, "right answer, bad format" and "wrong answer, good format" get the same sum and
    the same advantage, and a reward with a larger spread drowns the other. Normalising each function first gives
    each the same weight in every group, and the weights then apply to comparable scales.

    The same operations in the same order as TRL 1.16, so the figures agree exactly: NaN-aware means and stds,
    weights after the group normalisation, a row that every function returned None for (unscored) is left out of
    the batch mean and std and gets advantage 0, and a function with fewer than two scored rows in a group (std
    NaN) contributes nothing to that group. A function constant within a group contributes (r - mean) / eps,
    round-off of the mean only (0 when the mean is exact, as for 0/1 rewards).

    Example: G = 4, one group, functions (answer, format) scoring rows [1, 0], [0, 1], [1, 1], [0, 0], weights
    [1, 1]: each column normalised is [0.8658, -0.8658, 0.8658, -0.8658] and [-0.8658, 0.8658, 0.8658, -0.8658]
    (mean 0.5, std sqrt(1/3) = 0.57735, 0.5 / 0.57745 = 0.8658); their sums [0, 0, 1.7317, -1.7317]; over the batch
    mean 0 and std 1.41393, so A = [0, 0, 1.2247, -1.2247] (summing first, GRPO gives the same here). With the
    format reward scaled to 0/3, GDPO's advantages change only by eps's share (7e-5), while GRPO's become [-0.5477,
    0.5477, 1.0954, -1.0954]: "format right, answer wrong" now beats "answer right, format wrong".

    Args:
        rewards_per_func: (B, K) each reward function's score of each completion, unweighted, laid out group by
            group; NaN where the function returned None (``rewards.reward_matrix``).
        weights: (K,) one weight per function (TRL's ``reward_weights``).
        group_size: G >= 1 (with G = 1 every per-function score is NaN-std and contributes 0, as in TRL).
        eps: added to each std (TRL: 1e-4).

    Returns:
        (B,) advantages, finite (0 on unscored rows).

    Raises:
        ValueError: if rewards_per_func is not 2-D, holds inf, weights is not (K,), or B is not a multiple of G.

    Source: GDPO, Liu et al. 2026 ("Group reward-Decoupled Normalization Policy Optimization", arXiv 2601.05242);
    TRL 1.16 ``GRPOTrainer._generate_and_score_completions``, ``multi_objective_aggregation=
    "normalize_then_sum"``.
    """
    ndim("rewards_per_func", rewards_per_func, 2, "(B, K)")
    ndim("weights", weights, 1, "(K,)")
    B, K = rewards_per_func.shape
    if weights.numel() != K:
        raise ValueError(f"weights has {weights.numel()} entries for {K} reward functions")
    if torch.isinf(rewards_per_func).any():
        raise ValueError("rewards_per_func must be finite (NaN marks a function that did not score a row)")
    if group_size < 1 or B % group_size != 0:
        raise ValueError(f"rewards_per_func has {B} rows, not a multiple of group_size={group_size}")
    summed = gdpo_group_sums(rewards_per_func, weights, group_size=group_size, eps=eps)  # (B,), NaN: unscored
    std = _nanstd(summed).expand_as(summed) if summed.numel() > 1 else torch.zeros_like(summed)
    return torch.nan_to_num((summed - torch.nanmean(summed)) / (std + eps), nan=0.0)
