"""An exact toy for the KL estimators: which gradient does each estimator give, in the reward or in the loss?

The policy is a categorical pi = softmax(theta) over K actions and the reference is ref = softmax(ref_logits).
With K actions we can *enumerate* every sample, so each "expected gradient" below is an exact sum over actions,
not a Monte-Carlo average: what autograd of a sampled loss gives on average, with no sampling noise to hide it.
The per-action estimates come from ``minirl.kl`` itself, so the toy exercises the same code the trainer uses.

Notation (all in nats): l(a) = log pi(a) - log ref(a) is the log-ratio of action a; sg[.] is stop-gradient
(``.detach()``); RKL = KL(pi || ref) is the penalty RLHF means; FKL = KL(ref || pi) is the forward KL.
Gradients are w.r.t. the logits theta and are gradients of the quantity to MINIMISE (the KL penalty).
In logit coordinates, grad_theta log pi(a) = onehot(a) - pi, so grad RKL = pi * (l - RKL) and grad FKL = pi - ref.

What the enumeration shows (on-policy; see ``expected_gradient``):

| estimator | in the reward: E_pi[k grad log pi] | in the loss: E_pi[grad k]       |
|-----------|-------------------------------------|---------------------------------|
| k1        | grad RKL                            | 0                               |
| k2        | grad E_pi[k2] - grad RKL            | grad RKL                        |
| k3        | grad RKL - grad FKL                 | grad FKL                        |
"""

from __future__ import annotations

import torch
from torch import Tensor

from .checks import choice, ndim, same_shape
from .kl import ESTIMATORS, PLACEMENTS, kl_estimate


def _check_logits(theta: Tensor, ref_logits: Tensor) -> None:
    ndim("theta", theta, 1, "(K,)")
    same_shape(theta=theta, ref_logits=ref_logits)


def _per_action(log_pi: Tensor, log_ref: Tensor, estimator: str) -> Tensor:
    """k(a) for every action a: the K actions are passed to ``minirl.kl`` as one batch of K one-token rows."""
    return kl_estimate(log_pi[:, None], log_ref[:, None], estimator=estimator)[:, 0]  # (K,)


def true_kl(theta: Tensor, ref_logits: Tensor) -> Tensor:
    """Reverse KL(pi || ref) = sum_a pi(a) (log pi(a) - log ref(a)), exactly: the penalty RLHF means.

    Args:
        theta: (K,) policy logits; pi = softmax(theta).
        ref_logits: (K,) reference logits; ref = softmax(ref_logits).

    Returns:
        () the KL in nats, differentiable w.r.t. theta.

    Raises:
        ValueError: if theta is not 1-D or the two shapes differ.

    Source: Kullback & Leibler (1951); the reverse direction is the penalty of InstructGPT (Ouyang et al. 2022, eq. 2).
    """
    _check_logits(theta, ref_logits)
    log_pi, log_ref = theta.log_softmax(-1), ref_logits.log_softmax(-1)
    return (log_pi.exp() * (log_pi - log_ref)).sum()


def forward_kl(theta: Tensor, ref_logits: Tensor) -> Tensor:
    """Forward KL(ref || pi) = sum_a ref(a) (log ref(a) - log pi(a)), exactly: what k3 in the loss really minimises.

    Its gradient w.r.t. the logits is pi - ref. It is mass-covering: it punishes pi(a) -> 0 wherever ref(a) > 0.

    Args:
        theta: (K,) policy logits; pi = softmax(theta).
        ref_logits: (K,) reference logits; ref = softmax(ref_logits).

    Returns:
        () the KL in nats, differentiable w.r.t. theta.

    Raises:
        ValueError: if theta is not 1-D or the two shapes differ.

    Source: Kullback & Leibler (1951); k3's gradient in the loss: Tang & Munos (2025).
    """
    _check_logits(theta, ref_logits)
    log_pi, log_ref = theta.log_softmax(-1), ref_logits.log_softmax(-1)
    return (log_ref.exp() * (log_ref - log_pi)).sum()


def expected_estimator_value(theta: Tensor, ref_logits: Tensor, estimator: str) -> Tensor:
    """E_{a~pi}[k(a)] = sum_a pi(a) k(a), exactly. k1 and k3 give KL(pi || ref); k2 gives E_pi[l^2 / 2] (biased).

    Args:
        theta: (K,) policy logits.
        ref_logits: (K,) reference logits.
        estimator: "k1", "k2" or "k3" (``minirl.kl``).

    Returns:
        () the expected estimate in nats.

    Raises:
        ValueError: on a bad shape or an unknown estimator.

    Source: J. Schulman, "Approximating KL Divergence" (2020).
    """
    _check_logits(theta, ref_logits)
    log_pi, log_ref = theta.log_softmax(-1), ref_logits.log_softmax(-1)
    return (log_pi.exp() * _per_action(log_pi, log_ref, estimator)).sum()


def _surrogate(theta: Tensor, ref_logits: Tensor, estimator: str, placement: str, behaviour_logits: Tensor | None,
               importance_weight: bool, actions: Tensor | None = None) -> Tensor:
    """The surrogate whose autograd is the estimator's gradient; exact sum (actions=None) or sample mean."""
    log_pi, log_ref = theta.log_softmax(-1), ref_logits.log_softmax(-1)  # (K,)
    k = _per_action(log_pi, log_ref, estimator)  # (K,), differentiable through log_pi
    if behaviour_logits is None:  # on-policy: samples from the current pi, frozen
        log_mu = log_pi.detach()
        w = torch.ones_like(log_pi)
    else:  # off-policy: samples from mu; the ratio pi/mu is differentiated, as PPO's exp(logp - old_logp)
        log_mu = behaviour_logits.log_softmax(-1).detach()
        w = (log_pi - log_mu).exp() if importance_weight else torch.ones_like(log_pi)
    if placement == "loss":
        per_action = w * k  # autograd differentiates k (and w)
    else:  # reward: REINFORCE, the weighted penalty is a detached return
        per_action = (w * k).detach() * log_pi
    if actions is None:
        return (log_mu.exp() * per_action).sum()  # sum_a mu(a) (...)
    return per_action[actions].mean()  # (1/N) sum_i (...)(a_i), a_i ~ mu


def expected_gradient(theta: Tensor, ref_logits: Tensor, estimator: str, placement: str,
                      behaviour_logits: Tensor | None = None, importance_weight: bool = True) -> Tensor:
    """Exact expected gradient of a KL estimator placed in the loss or in the reward, by enumerating the actions.

    With mu the sampling distribution, w(a) the importance ratio and k(a; theta) from ``minirl.kl``, the gradient
    returned is grad_theta of the surrogate S below (so that descent on it *lowers* the KL penalty):

    - on-policy (``behaviour_logits=None``): mu = sg[pi], w = 1 (``importance_weight`` is ignored)
        - "loss":   S = sum_a sg[pi(a)] k(a; theta)          (autograd of a sampled loss, as GRPO's KL term)
        - "reward": S = sum_a sg[pi(a) k(a)] log pi(a)        (REINFORCE with the penalty as a detached return)
    - off-policy (samples from an older mu = softmax(behaviour_logits)), ``importance_weight=True``:
      w(a) = pi(a)/mu(a), differentiated as PPO's ratio exp(logp - old_logp)
        - "loss":   S = sum_a mu(a) w(a) k(a; theta) = sum_a pi(a) k(a; theta), so grad S = grad E_pi[k]: the
          gradient of the estimator's *mean*. For k1 and k3 that is grad RKL (exact); for k2 it is not.
        - "reward": S = sum_a mu(a) sg[w(a) k(a)] log pi(a), so grad S = E_pi[k grad log pi]: the on-policy
          reward result again (equal to PPO's ratio * sg[advantage]).
    - off-policy, ``importance_weight=False``: w = 1, the off-policy samples are used as if on-policy
        - "loss":   S = sum_a mu(a) k(a; theta), grad = E_mu[grad k] (biased; even k1 gives mu - pi, not 0)
        - "reward": S = sum_a mu(a) sg[k(a)] log pi(a), grad = E_mu[k grad log pi] (biased)

    On-policy results (the table in the module docstring): k1 in the reward and k2 in the loss give grad RKL,
    k1 in the loss gives 0, k3 in the loss gives grad FKL = pi - ref. To see that the ratio matters even when it
    equals 1, pass ``behaviour_logits=theta``: then k1 and k3 in the loss give grad RKL. No baseline is used; in
    expectation a constant baseline changes nothing on-policy or with the importance weight.

    Args:
        theta: (K,) policy logits (a leaf with or without requires_grad; it is not modified).
        ref_logits: (K,) reference logits.
        estimator: "k1", "k2" or "k3".
        placement: "loss" (differentiated) or "reward" (detached, REINFORCE).
        behaviour_logits: (K,) logits of the sampling policy mu, or None for on-policy samples.
        importance_weight: off-policy only: weight each sample by pi/mu (see above).

    Returns:
        (K,) the exact expected gradient w.r.t. theta, in nats per unit logit.

    Raises:
        ValueError: on a bad shape, an unknown estimator or an unknown placement.

    Source: estimators: J. Schulman, "Approximating KL Divergence" (2020); gradients by placement: Tang & Munos,
    "On a few pitfalls in KL divergence gradient estimation for RL" (2025), derived again here by enumeration.
    """
    _check_logits(theta, ref_logits)
    choice("placement", placement, PLACEMENTS)
    choice("kl estimator", estimator, ESTIMATORS)
    if behaviour_logits is not None:
        same_shape(theta=theta, behaviour_logits=behaviour_logits)
    theta = theta.detach().requires_grad_(True)
    surrogate = _surrogate(theta, ref_logits.detach(), estimator, placement, behaviour_logits, importance_weight)
    return torch.autograd.grad(surrogate, theta)[0]


def sampled_gradient(theta: Tensor, ref_logits: Tensor, estimator: str, placement: str, n_samples: int,
                     generator: torch.Generator, behaviour_logits: Tensor | None = None,
                     importance_weight: bool = True) -> Tensor:
    """Monte-Carlo twin of ``expected_gradient``: autograd of the same surrogate averaged over sampled actions.

    Draws n_samples actions from mu (pi on-policy, softmax(behaviour_logits) off-policy) and differentiates
    (1/N) sum_i s(a_i), where s is the per-action term of ``expected_gradient``'s surrogate. Its mean over seeds is
    ``expected_gradient``; its standard error shrinks as 1/sqrt(n_samples).

    Args:
        theta: (K,) policy logits.
        ref_logits: (K,) reference logits.
        estimator: "k1", "k2" or "k3".
        placement: "loss" or "reward".
        n_samples: number of sampled actions (>= 1).
        generator: a seeded ``torch.Generator`` (same seed -> same gradient).
        behaviour_logits: (K,) sampling-policy logits, or None for on-policy.
        importance_weight: as in ``expected_gradient``.

    Returns:
        (K,) the sampled gradient w.r.t. theta.

    Raises:
        ValueError: on a bad shape, an unknown estimator or placement, or n_samples < 1.

    Source: the REINFORCE / pathwise estimators of Williams (1992); see ``expected_gradient``.
    """
    _check_logits(theta, ref_logits)
    choice("placement", placement, PLACEMENTS)
    choice("kl estimator", estimator, ESTIMATORS)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    mu_logits = theta if behaviour_logits is None else behaviour_logits
    actions = torch.multinomial(mu_logits.detach().softmax(-1), n_samples, replacement=True, generator=generator)
    theta = theta.detach().requires_grad_(True)
    surrogate = _surrogate(theta, ref_logits.detach(), estimator, placement, behaviour_logits, importance_weight,
                           actions)
    return torch.autograd.grad(surrogate, theta)[0]


def sequence_kl_gradients(theta1: Tensor, theta2: Tensor, ref1: Tensor, ref2: Tensor
                          ) -> dict[str, tuple[Tensor, Tensor]]:
    """Two-token sequences: the exact gradient of the sequence KL, and what per-token estimators give instead.

    pi(y1, y2) = softmax(theta1)[y1] * softmax(theta2[y1])[y2], and the same for ref. All K*K sequences are
    enumerated as a batch of B = K*K rows of T = 2 tokens, the layout ``minirl.kl`` expects. With l_t the token
    log-ratio, P = sg[pi(y1, y2)] and E = sum_{y1,y2} P (...), the entries (gradients to minimise) are:

    - "true":                 grad KL(pi || ref) over sequences = E[(l_1 + l_2) (grad log pi_1 + grad log pi_2)].
    - "k1_reward_to_go":      E[(l_1 + l_2) grad log pi_1 + l_2 grad log pi_2]. EQUALS "true": the dropped term
                              E[l_1 grad log pi_2] is zero because l_1 is fixed once y1 is drawn (causality).
    - "k1_reward_own_token":  E[l_1 grad log pi_1 + l_2 grad log pi_2], each token only its own penalty. WRONG for
                              theta1 (misses E[l_2 grad log pi_1]: the first token steers the second's KL); right
                              for theta2.
    - "k1_loss_per_token":    E[grad l_1 + grad l_2] = 0.
    - "k2_loss_per_token":    E[l_1 grad l_1 + l_2 grad l_2], the same as "k1_reward_own_token": WRONG for theta1.
    - "k2_loss_sequence":     k2 of the summed log-ratio, E[(l_1 + l_2) grad (l_1 + l_2)]. EQUALS "true".
    - "k3_loss_per_token":    sum over tokens of the forward-KL gradient at each position, weighted by pi's prefixes.
                              WRONG for both (neither reverse nor forward sequence KL).
    - "k3_loss_sequence":     k3 of the summed log-ratio: E[(1 - ref(y)/pi(y)) grad log pi(y)] = grad KL(ref || pi)
                              over sequences, the forward KL: WRONG (equals "forward").
    - "forward":              grad KL(ref || pi) over sequences, for comparison.

    Args:
        theta1: (K,) logits of the first token.
        theta2: (K, K) logits of the second token; row y1 is the distribution after y1.
        ref1: (K,) reference logits of the first token.
        ref2: (K, K) reference logits of the second token.

    Returns:
        dict name -> (grad w.r.t. theta1 (K,), grad w.r.t. theta2 (K, K)), exact expectations.

    Raises:
        ValueError: on bad shapes.

    Source: reward-to-go: Williams (1992) / Sutton et al. (2000); per-token vs sequence KL gradients:
    Tang & Munos (2025). Derived again here by enumeration.
    """
    _check_logits(theta1, ref1)
    ndim("theta2", theta2, 2, "(K, K)")
    same_shape(theta2=theta2, ref2=ref2)
    if theta2.shape != (theta1.shape[0],) * 2:
        raise ValueError(f"theta2 must have shape (K, K) = {(theta1.shape[0],) * 2}, got {tuple(theta2.shape)}")
    K = theta1.shape[0]

    def token_logprobs(logits1: Tensor, logits2: Tensor) -> Tensor:  # (K*K, 2): row (y1, y2) -> [log p1, log p2]
        lp1 = logits1.log_softmax(-1)[:, None].expand(K, K)  # (K, K), depends on y1 only
        lp2 = logits2.log_softmax(-1)  # (K, K)
        return torch.stack([lp1, lp2], dim=-1).reshape(K * K, 2)

    def grads(surrogate_fn) -> tuple[Tensor, Tensor]:
        t1, t2 = theta1.detach().requires_grad_(True), theta2.detach().requires_grad_(True)
        logp = token_logprobs(t1, t2)  # (B, 2)
        logr = token_logprobs(ref1.detach(), ref2.detach())  # (B, 2)
        g1, g2 = torch.autograd.grad(surrogate_fn(logp, logr), (t1, t2))
        return g1, g2

    P = lambda logp: logp.sum(-1).exp().detach()  # (B,) sg[pi(y1, y2)]
    k = lambda lp, lr, name: kl_estimate(lp, lr, estimator=name)  # noqa: E731
    seq = lambda x: x.sum(-1, keepdim=True)  # (B, 1): one "token" holding the whole sequence's log-prob
    rtg = lambda x: x.flip(-1).cumsum(-1).flip(-1)  # reward-to-go along the two positions
    return {
        "true": grads(lambda lp, lr: (lp.sum(-1).exp() * (lp - lr).sum(-1)).sum()),
        "k1_reward_to_go": grads(lambda lp, lr: (P(lp)[:, None] * rtg(k(lp, lr, "k1")).detach() * lp).sum()),
        "k1_reward_own_token": grads(lambda lp, lr: (P(lp)[:, None] * k(lp, lr, "k1").detach() * lp).sum()),
        "k1_loss_per_token": grads(lambda lp, lr: (P(lp)[:, None] * k(lp, lr, "k1")).sum()),
        "k2_loss_per_token": grads(lambda lp, lr: (P(lp)[:, None] * k(lp, lr, "k2")).sum()),
        "k2_loss_sequence": grads(lambda lp, lr: (P(lp)[:, None] * k(seq(lp), seq(lr), "k2")).sum()),
        "k3_loss_per_token": grads(lambda lp, lr: (P(lp)[:, None] * k(lp, lr, "k3")).sum()),
        "k3_loss_sequence": grads(lambda lp, lr: (P(lp)[:, None] * k(seq(lp), seq(lr), "k3")).sum()),
        "forward": grads(lambda lp, lr: (lr.sum(-1).exp() * (lr - lp).sum(-1)).sum()),
    }


def bandit_optimum(rewards: Tensor, ref_logits: Tensor, beta: float) -> Tensor:
    """Closed-form maximiser of E_pi[r] - beta * KL(pi || ref): pi*(a) proportional to ref(a) exp(r(a) / beta).

    Args:
        rewards: (K,) reward of each action.
        ref_logits: (K,) reference logits.
        beta: KL coefficient (> 0).

    Returns:
        (K,) the optimal policy's probabilities.

    Raises:
        ValueError: on a shape mismatch or beta <= 0.

    Source: the Gibbs variational principle; the same closed form underlies DPO (Rafailov et al. 2023, eq. 4).
    """
    same_shape(rewards=rewards, ref_logits=ref_logits)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    return (ref_logits.log_softmax(-1) + rewards / beta).softmax(-1)


def bandit_forward_optimum(rewards: Tensor, ref_logits: Tensor, beta: float, iters: int = 200) -> Tensor:
    """Maximiser of E_pi[r] - beta * KL(ref || pi): where k3 in the loss really takes the bandit.

    Stationarity with a multiplier lam for sum_a pi(a) = 1 gives r(a) + beta ref(a) / pi(a) = lam, so
    pi(a) = beta ref(a) / (lam - r(a)) with lam > max r; lam is found by bisection (on log(lam - max r)) so that
    the pi(a) sum to 1.
    Unlike ``bandit_optimum`` it has polynomial, not exponential, tails: the forward KL never lets pi(a) -> 0.

    Args:
        rewards: (K,) reward of each action.
        ref_logits: (K,) reference logits (all ref(a) > 0).
        beta: KL coefficient (> 0).
        iters: bisection steps (200 reach float64 precision).

    Returns:
        (K,) the optimal policy's probabilities.

    Raises:
        ValueError: on a shape mismatch or beta <= 0.

    Source: derived here (Lagrange conditions of the forward-KL-regularised bandit); cf. Tang & Munos (2025).
    """
    same_shape(rewards=rewards, ref_logits=ref_logits)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    r, ref = rewards.double(), ref_logits.double().softmax(-1)
    # search d = lam - max r > 0 on a log scale, so lam never rounds onto max r (a 0/0) when ref is tiny there
    gap = r.max() - r  # (K,) >= 0
    mass = lambda d: (beta * ref / (d + gap)).sum()
    lo = beta * ref[gap == 0].max()  # mass(lo) >= 1 from a best arm alone
    hi = torch.as_tensor(beta, dtype=torch.float64)  # mass(beta) <= sum ref = 1
    for _ in range(iters):
        mid = (lo * hi).sqrt()
        if mass(mid) > 1:
            lo = mid
        else:
            hi = mid
    pi = beta * ref / ((lo * hi).sqrt() + gap)
    return (pi / pi.sum()).to(rewards.dtype)


def bandit_train(rewards: Tensor, ref_logits: Tensor, *, beta: float, estimator: str, placement: str, steps: int,
                 lr: float, n_samples: int | None = None, seed: int = 0) -> Tensor:
    """Gradient ascent on E_pi[r] - beta * KL, with the KL's gradient from one estimator x placement.

    Starts at pi = ref. Each step: theta += lr * (grad E_pi[r] - beta * g_KL). Exact mode (n_samples=None): both
    gradients by enumeration (pi * (r - E_pi[r]) and ``expected_gradient``). Sampled mode: n_samples actions from
    pi per step; the reward's REINFORCE gradient uses a leave-one-out baseline (unbiased), and g_KL is
    ``sampled_gradient`` on a second draw from the same seeded generator. Where it ends: k1 in the reward and k2
    in the loss -> ``bandit_optimum``; k3 in the loss -> ``bandit_forward_optimum``; k1 in the loss -> no KL at all.

    Args:
        rewards: (K,) reward of each action.
        ref_logits: (K,) reference logits (also the starting logits).
        beta: KL coefficient (>= 0).
        estimator: "k1", "k2" or "k3".
        placement: "loss" or "reward".
        steps: number of gradient steps.
        lr: step size on the logits.
        n_samples: None for exact expected gradients, else actions sampled per step.
        seed: seed of the sampled mode.

    Returns:
        (steps + 1, K) the policy's probabilities after each step, the first row being ref.

    Raises:
        ValueError: on a shape mismatch, beta < 0, an unknown estimator or placement.

    Source: the KL-regularised objective of RLHF (Ouyang et al. 2022, eq. 2); estimators: Schulman (2020).
    """
    same_shape(rewards=rewards, ref_logits=ref_logits)
    choice("placement", placement, PLACEMENTS)
    choice("kl estimator", estimator, ESTIMATORS)
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    r, ref_logits = rewards.double(), ref_logits.double()
    gen = torch.Generator().manual_seed(seed)
    theta = ref_logits.clone()
    trajectory = [theta.softmax(-1)]
    for _ in range(steps):
        pi = theta.softmax(-1)
        if n_samples is None:
            g_reward = pi * (r - (pi * r).sum())
            g_kl = expected_gradient(theta, ref_logits, estimator, placement)
        else:
            a = torch.multinomial(pi, n_samples, replacement=True, generator=gen)  # (N,)
            baseline = (r[a].sum() - r[a]) / max(n_samples - 1, 1)  # leave-one-out
            onehot_minus_pi = torch.nn.functional.one_hot(a, len(pi)).double() - pi  # (N, K) grad log pi(a_i)
            g_reward = ((r[a] - baseline)[:, None] * onehot_minus_pi).mean(0)
            g_kl = sampled_gradient(theta, ref_logits, estimator, placement, n_samples, gen)
        theta = theta + lr * (g_reward - beta * g_kl)
        trajectory.append(theta.softmax(-1))
    return torch.stack(trajectory)
