"""The IPO bandit: DPO's over-fitting on deterministic preferences, computed exactly (notebook 08).

A k-armed bandit whose preferences are a strict ranking, trained by exact full-batch gradient descent on DPO's or
IPO's expected loss. Like ``kl_toy`` for the KL estimators, nothing is sampled, so the failure IPO was designed to
fix shows without noise: DPO sends the probability of an action that never wins to zero for every beta, IPO stops
at a finite, tau-dependent policy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import choice
from .preference import dpo_loss, ipo_loss


def total_order_preferences(k: int = 3) -> Tensor:
    """Preference matrix P (k, k) of a strict ranking 0 > 1 > ... > k-1: P[i, j] = 1 if i < j, 0 if i > j.

    Action k-1 never wins a comparison. The diagonal is 0.5 (unused).
    """
    p = torch.triu(torch.ones(k, k, dtype=torch.float64), diagonal=1)
    return p + torch.eye(k, dtype=torch.float64) * 0.5


def ipo_bandit(method: str, *, beta: float = 0.1, steps: int = 2000, lr: float = 0.5, preferences: Tensor | None = None,
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
    for name, value in (("beta", beta), ("lr", lr)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
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


