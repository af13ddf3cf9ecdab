"""Helpers shared by the test modules (imported as ``from helpers import close``; pytest puts tests/ on the path).

Each module keeps its own tolerance, bound once: ``close = partial(helpers.close, atol=5e-7)`` for expectations
written with 6 decimals, a tighter one where the module compares float64 arithmetic."""

import torch


def close(actual, expected, *, atol: float, dtype: torch.dtype | None = None) -> None:
    """Assert ``actual`` equals ``expected`` within ``atol`` (no relative tolerance).

    Both are compared in ``dtype``; by default the dtype of ``actual`` when it is a tensor (so an expectation typed
    with 6 decimals is rounded like the value it checks), else float64.
    """
    if dtype is None:
        dtype = actual.dtype if isinstance(actual, torch.Tensor) else torch.float64
    torch.testing.assert_close(torch.as_tensor(actual, dtype=dtype), torch.as_tensor(expected, dtype=dtype),
                               atol=atol, rtol=0)
