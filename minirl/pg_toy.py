"""An exact toy for policy-gradient estimators: the bias and variance of each advantage, by enumeration.

The policy is a batch of M softmax bandits (one per "prompt" x, each with its own logits theta_x over K arms);
reward 1 for the arms in ``rewarded[x]``, 0 for the others, so a sample succeeds with probability
p_x = sum of pi_x over the rewarded arms. The objective is J = mean_x p_x. One step samples G arms per prompt;
the batch is those M * G samples, laid out group by group, and the gradient estimate is

    g = 1/(M G) sum_{x, i} A_{x,i} grad_theta log pi_x(a_{x,i}),

A the advantage an estimator computes from the batch's M * G rewards (minirl.advantages' functions themselves).
"Batch" statistics (REINFORCE++) are taken over all M * G rewards of one step.

Why an exact answer is cheap: an estimator's advantage depends only on the rewards, and given the rewards the arms
are independent draws (a success from pi restricted to the rewarded arms, a failure from the rest). So the
expectation over the (G+1)^M reward patterns, with those conditional moments, is exact: no Monte Carlo. The same
argument shows E[g_x] = c_x grad_x J for every such estimator (a scale per prompt, never another direction within a
prompt): an estimator is unbiased when every c_x = 1, off by a common scale when all c_x are equal, and biased in
direction when the c_x differ between prompts (GRPO's std weights prompts by their difficulty).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from .advantages import group_advantages, reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages
from .checks import ndim, same_shape

#: The advantages compared, each rewards (B,) -> (B,) for groups of ``group_size``, computed by minirl itself.
ESTIMATORS = {
    "no baseline": lambda r, group_size: r.float(),
    "group mean (Dr. GRPO)": lambda r, group_size: group_advantages(r, group_size=group_size, scale="none"),
    "leave-one-out (RLOO)": lambda r, group_size: rloo_advantages(r, group_size=group_size),
    "group mean/std (GRPO)": lambda r, group_size: group_advantages(r, group_size=group_size, scale="group"),
    "batch norm (REINFORCE++)": lambda r, group_size: reinforce_pp_advantages(r),
    "group mean, batch std (REINFORCE++-b)": lambda r, group_size: reinforce_pp_baseline_advantages(
        r, group_size=group_size),
}


def with_offset(advantage_fn, offset: float):
    """``advantage_fn`` applied to rewards + offset: the same task with every completion's reward shifted."""
    return lambda rewards, group_size: advantage_fn(rewards + offset, group_size)


def _check(logits: Tensor, rewarded: Tensor) -> Tensor:
    ndim("logits", logits, 2, "(M, K)")
    same_shape(logits=logits, rewarded=rewarded)
    p = success_probability(logits, rewarded)
    if not ((p > 0) & (p < 1)).all():
        raise ValueError(f"every prompt needs a rewarded and an unrewarded arm (0 < p < 1), got p = {p.tolist()}")
    return p


def success_probability(logits: Tensor, rewarded: Tensor) -> Tensor:
    """p_x = sum over the rewarded arms of softmax(logits_x): (M, K) logits and 0/1 (or bool) rewarded -> (M,)."""
    return (logits.double().softmax(-1) * rewarded.double()).sum(-1)


def true_gradient(logits: Tensor, rewarded: Tensor) -> Tensor:
    """grad_theta J for J = mean_x p_x, by autograd of the exact objective: (M, K).

    In closed form grad_{x,k} J = pi_x(k) (R_x(k) - p_x) / M (the score-function identity in logit coordinates).

    Source: Williams 1992, "Simple statistical gradient-following algorithms" (the score-function gradient).
    """
    theta = logits.detach().double().requires_grad_(True)
    (grad,) = torch.autograd.grad(success_probability(theta, rewarded).mean(), theta)
    return grad


def estimator_moments(advantage_fn, logits: Tensor, rewarded: Tensor, *, group_size: int) -> dict:
    """The exact mean and total variance of the policy-gradient estimate g under ``advantage_fn``.

    Sums over every reward pattern (s_1, ..., s_M), s_x ~ Binomial(G, p_x) successes in prompt x. Given the pattern,
    a success's arm is drawn from q1 = pi restricted to the rewarded arms (normalised), a failure's from q0, so with
    u = onehot(a) - pi: E[u] = q - pi and Cov[u] = diag(q) - q q^T; the G samples of a group are independent.

    Args:
        advantage_fn: rewards (B,) and group_size -> (B,) advantages, symmetric within a group (any estimator of
            ``ESTIMATORS``).
        logits: (M, K) the M bandits' logits.
        rewarded: (M, K) 1 on the arms that earn reward 1.
        group_size: G >= 1 samples per prompt.

    Returns:
        dict with ``mean`` (M, K) = E[g], ``true`` (M, K) = grad J, ``scale`` (M,) the c_x of E[g_x] = c_x grad_x J,
        ``cov_trace`` = E||g - E g||^2 (the trace of the covariance of g), all float64. The sums are exact; the
        advantages are minirl's, computed in float32 (relative round-off about 1e-7).

    Raises:
        ValueError: on shape mismatch, a prompt with p = 0 or 1, or group_size < 1.

    Source: derived here (the conditional moments of the score given the rewards); estimators from
    ``minirl.advantages``.
    """
    p = _check(logits, rewarded)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    M, G = logits.shape[0], group_size
    pi = logits.double().softmax(-1)  # (M, K)
    R = rewarded.double()
    q1, q0 = pi * R / p[:, None], pi * (1 - R) / (1 - p[:, None])  # arm given success / failure
    mu1, mu0 = q1 - pi, q0 - pi  # E[u | success], E[u | failure]
    v1, v0 = 1 - (q1**2).sum(-1), 1 - (q0**2).sum(-1)  # tr Cov[u | success], tr Cov[u | failure]
    mean, second, inner = torch.zeros_like(pi), 0.0, 0.0
    for pattern in itertools.product(range(G + 1), repeat=M):
        s = torch.tensor(pattern, dtype=torch.float64)  # (M,) successes per prompt
        prob = float(torch.prod(torch.tensor([math.comb(G, k) for k in pattern], dtype=torch.float64)
                                * p**s * (1 - p) ** (G - s)))
        rewards = torch.cat([torch.tensor([1.0] * k + [0.0] * (G - k)) for k in pattern])  # (M G,) group by group
        adv = advantage_fn(rewards, G).double().view(M, G)
        a1, a0 = adv[:, 0], adv[:, -1]  # a success's advantage (if s > 0), a failure's (if s < G)
        cond_mean = (s[:, None] * a1[:, None] * mu1 + (G - s)[:, None] * a0[:, None] * mu0) / (M * G)  # (M, K)
        cond_var = float((s * a1**2 * v1 + (G - s) * a0**2 * v0).sum()) / (M * G) ** 2
        mean += prob * cond_mean
        second += prob * float((cond_mean**2).sum())
        inner += prob * cond_var
    true = true_gradient(logits, rewarded)
    scale = (mean * true).sum(-1) / (true**2).sum(-1)
    return {"mean": mean, "true": true, "scale": scale, "cov_trace": inner + second - float((mean**2).sum())}


def bias_variance_table(logits: Tensor, rewarded: Tensor, *, group_sizes=(2, 4, 8, 16), estimators=None
                        ) -> list[dict]:
    """One row per estimator and group size, from ``estimator_moments``.

    Columns: ``scale`` the c_x per prompt (1 is unbiased); ``angle`` the angle in degrees between E[g] and grad J
    (0 when every c_x is equal: the bias is then only a step size, which Adam and the learning rate absorb);
    ``rel_bias`` = ||E g - grad J|| / ||grad J||; ``cov_trace`` = tr Cov(g); ``snr`` = ||E g||^2 / tr Cov(g),
    the signal-to-noise ratio, unchanged when an estimator only rescales g, so it compares estimators whose
    advantages have different units (GRPO's are divided by a std, RLOO's are in reward units).

    Raises:
        ValueError: as ``estimator_moments``.

    Source: derived here; see ``estimator_moments``.
    """
    rows = []
    for name, fn in (estimators or ESTIMATORS).items():
        for G in group_sizes:
            m = estimator_moments(fn, logits, rewarded, group_size=G)
            mean, true = m["mean"].flatten(), m["true"].flatten()
            cos = float(mean @ true / (mean.norm() * true.norm()))
            rows.append({"estimator": name, "G": G, "scale": m["scale"].tolist(),
                         "angle": math.degrees(math.acos(min(1.0, cos))),
                         "rel_bias": float((mean - true).norm() / true.norm()), "cov_trace": m["cov_trace"],
                         "snr": float(mean @ mean) / m["cov_trace"]})
    return rows
