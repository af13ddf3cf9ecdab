"""Helpers shared by the test modules (imported as ``from helpers import close``; pytest puts tests/ on the path).

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
