"""An exact toy for the entropy mechanism: one softmax bandit, one policy-gradient step, and the entropy change.

The policy is pi = softmax(z) over K arms with reward r(a); the advantage of an arm is A(a) = r(a) - E_pi[r].
The entropy H(z) = -sum_a pi(a) log pi(a) has gradient dH/dz_b = -pi(b) (log pi(b) + H) = -pi(b) (log pi(b) -
E_pi[log pi]), so a logit change dz moves it by

    H(z + dz) - H(z) = -sum_b pi(b) (log pi(b) - E_pi[log pi]) dz_b + O(|dz|^2)
                     = -Cov_{a~pi}(log pi(a), dz_a) + O(|dz|^2)

(centring dz as well changes nothing, since sum_b pi(b) (log pi(b) - E_pi[log pi]) = 0): Cui et al.'s lemma for a
softmax policy. Which step gives which covariance:

- natural policy gradient on a tabular softmax: dz_a = eta A(a), so dH = -eta Cov(log pi, A) (their statement for
  natural policy gradient; the covariance that Clip-Cov and KL-Cov estimate per token, ``entropy.token_covariance``);
- vanilla policy gradient on the logits: dz_a = eta dJ/dz_a = eta pi(a) A(a) (J = E_pi[r]), so
  dH = -eta Cov(log pi, pi A): each arm's advantage weighted by its own probability, so likely arms count more.

So a likely arm with a positive advantage (log pi and A both above their means) lowers the entropy, a rare arm with a
positive advantage raises it. The error of the first-order prediction is O(eta^2): halving the step quarters it.
"""

from __future__ import annotations

from torch import Tensor

from .checks import choice, ndim, same_shape

#: The logit updates of ``logit_step``: natural policy gradient (dz = eta A) or vanilla policy gradient (eta pi A).
UPDATES = ("natural", "vanilla")


def softmax_entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of softmax(logits) over the last dimension, in float64: (..., K) -> (...).

    Example: logits [ln 2, 0, 0] -> pi = [1/2, 1/4, 1/4], H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2 = 1.039721.
    """
    log_pi = logits.double().log_softmax(-1)
    return -(log_pi.exp() * log_pi).sum(-1)


def bandit_advantages(logits: Tensor, rewards: Tensor) -> Tensor:
    """A(a) = r(a) - E_pi[r] for each arm: (K,) logits and (K,) rewards -> (K,) float64.

    Example: logits [ln 2, 0, 0], rewards [1, 0, 0]: E_pi[r] = 1/2, A = [0.5, -0.5, -0.5].
    """
    ndim("logits", logits, 1, "(K,)")
    same_shape(logits=logits, rewards=rewards)
    pi = logits.double().softmax(-1)
    return rewards.double() - (pi * rewards.double()).sum()


def logit_step(logits: Tensor, rewards: Tensor, *, step: float, update: str = "natural") -> Tensor:
    """The logit change dz of one exact policy-gradient step on the bandit: (K,) -> (K,) float64.

    "natural": dz_a = step * A(a), natural policy gradient for a tabular softmax (Kakade 2001; the update of Cui et
    al.'s natural-policy-gradient statement). "vanilla": dz_a = step * pi(a) A(a) = step * dJ/dz_a, gradient ascent
    on J = E_pi[r] (the tests check it against autograd).

    Example: logits [ln 2, 0, 0], rewards [1, 0, 0], step 0.1: natural dz = [0.05, -0.05, -0.05]; vanilla
    dz = [0.025, -0.0125, -0.0125].

    Raises:
        ValueError: on shape mismatch or an unknown update.
    """
    choice("update", update, UPDATES)
    advantages = bandit_advantages(logits, rewards)  # (K,)
    if update == "natural":
        return step * advantages
    return step * logits.double().softmax(-1) * advantages


def predicted_entropy_change(logits: Tensor, logit_change: Tensor) -> Tensor:
    """The first-order entropy change -Cov_{a~pi}(log pi(a), dz_a) for a logit change dz: (K,), (K,) -> scalar.

    Example: logits [ln 2, 0, 0] (pi = [1/2, 1/4, 1/4], E log pi = -1.5 ln 2), dz = 0.1 * A with A = [0.5, -0.5,
    -0.5]: Cov = 1/2 (0.5 ln 2)(0.05) + 2 * 1/4 (-0.5 ln 2)(-0.05) = 0.025 ln 2, so -0.017329.

    Raises:
        ValueError: if the shapes differ or logits is not (K,).

    Source: Cui et al. 2025, arXiv 2505.22617, the entropy dynamics of a softmax policy (the lemma, and its natural
    and vanilla policy-gradient forms).
    """
    ndim("logits", logits, 1, "(K,)")
    same_shape(logits=logits, logit_change=logit_change)
    log_pi = logits.double().log_softmax(-1)  # (K,)
    pi = log_pi.exp()
    dz = logit_change.double()
    cov = (pi * (log_pi - (pi * log_pi).sum()) * (dz - (pi * dz).sum())).sum()
    return -cov


def measured_entropy_change(logits: Tensor, logit_change: Tensor) -> Tensor:
    """The exact entropy change H(z + dz) - H(z) (nats, float64): (K,), (K,) -> scalar.

    Raises:
        ValueError: if the shapes differ.
    """
    same_shape(logits=logits, logit_change=logit_change)
    return softmax_entropy(logits.double() + logit_change.double()) - softmax_entropy(logits)


def entropy_change_table(logits: Tensor, rewards: Tensor, *, steps=(0.2, 0.1, 0.05), update: str = "natural"
                         ) -> list[dict]:
    """Predicted vs measured entropy change at each step size: one row per step with step, predicted, measured,
    error (measured - predicted) and, from the second row on, error_ratio (the previous row's error / this one's:
    about 4 when the step halves, the signature of an O(step^2) error).
    """
    rows = []
    for step in steps:
        dz = logit_step(logits, rewards, step=step, update=update)
        predicted = float(predicted_entropy_change(logits, dz))
        measured = float(measured_entropy_change(logits, dz))
        row = {"step": step, "predicted": predicted, "measured": measured, "error": measured - predicted}
        if rows:
            row["error_ratio"] = rows[-1]["error"] / row["error"]
        rows.append(row)
    return rows
