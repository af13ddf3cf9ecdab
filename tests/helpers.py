"""Helpers shared by the test modules (imported as ``from helpers import close``; pytest puts tests/ on the path):
the tolerance check, the loop tests' tiny model, a History with undefined steps, and the KL tests' categorical.
(Shared fixtures live in conftest.py.)

Each module keeps its own tolerance, bound once: ``close = partial(helpers.close, atol=5e-7)`` for expectations
written with 6 decimals, a tighter one where the module compares float64 arithmetic."""

import torch

from minirl import history, models


def close(actual, expected, *, atol: float, dtype: torch.dtype | None = None) -> None:
    """Assert ``actual`` equals ``expected`` within ``atol`` (no relative tolerance).

    Both are compared in ``dtype``; by default the dtype of ``actual`` when it is a tensor (so an expectation typed
    with 6 decimals is rounded like the value it checks), else float64.
    """
    if dtype is None:
        dtype = actual.dtype if isinstance(actual, torch.Tensor) else torch.float64
    torch.testing.assert_close(torch.as_tensor(actual, dtype=dtype), torch.as_tensor(expected, dtype=dtype),
                               atol=atol, rtol=0)


def tiny_model(tok, seed=0):
    """The tiny dense model of the loop's tests: one layer, hidden size 32, two heads."""
    return models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=seed)


def nan_history():
    """A History whose explained_variance and grad_norm are NaN or inf at some steps (all rewards equal)."""
    h = history.History()
    h.log(step=0, eval_accuracy=0.25)
    h.log(step=1, reward=0.5, explained_variance=0.3, grad_norm=1.5)
    h.log(step=2, reward=0.5, explained_variance=float("nan"), grad_norm=float("nan"))  # all rewards equal
    h.log(step=3, reward=0.75, explained_variance=-0.2, grad_norm=2.0)
    h.log(step=4, reward=1.0, explained_variance=float("nan"), grad_norm=float("inf"))
    return h


# --- the KL tests' categorical (test_kl.py, test_kl_toy.py): pi = softmax([1, 0, -1]) against a uniform reference
# pi = (e, 1, 1/e) / (e + 1 + 1/e) = (2.718282, 1, 0.367879) / 4.086161 = (0.665241, 0.244728, 0.090031); ref = 1/3.
# l = log pi - log ref = log pi + log 3 = (0.691006, -0.308994, -1.308994).
# KL(pi||ref) = sum pi l = 0.459686 - 0.075619 - 0.117850 = 0.266217.
# grad KL w.r.t. the logits = pi * (l - KL) = (0.665241 * 0.424789, 0.244728 * -0.575211, 0.090031 * -1.575211)
#             = (0.282587, -0.140770, -0.141817).
# grad KL(ref||pi) = pi - ref = (0.331908, -0.088605, -0.243303).
# E[k2] = 0.5 * sum pi l^2 = 0.5 * (0.317646 + 0.023366 + 0.154265) = 0.247638.
THETA = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
REF = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)
TRUE_GRAD = [0.282587, -0.140770, -0.141817]
FORWARD_GRAD = [0.331908, -0.088605, -0.243303]
