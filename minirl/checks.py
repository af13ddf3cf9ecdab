"""Argument checks shared by the math modules: clear errors that name the argument, never silent broadcasting; and
the two numerical guards they share (masking that never reads padding, an exp that never overflows).

Public and tiny on purpose: a student who copies one function of minirl copies these few lines with it."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def same_shape(**tensors: Tensor) -> None:
    """Raise ValueError naming the arguments when the given tensors differ in shape.

    Example: ``same_shape(logprobs=a, ref_logprobs=b)`` with shapes (2, 3) and (2, 4) raises
    "logprobs has shape (2, 3) but ref_logprobs has shape (2, 4); they must match".
    """
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if tuple(t.shape) != tuple(first.shape):
            raise ValueError(
                f"{first_name} has shape {tuple(first.shape)} but {name} has shape {tuple(t.shape)}; they must match"
            )


def same_device(**tensors: Tensor) -> None:
    """Raise ValueError naming the arguments when the given tensors are on different devices.

    Example: ``same_device(logprobs=a, advantages=b)`` with ``a`` on cuda:0 and ``b`` on the CPU raises "advantages
    is on cpu but logprobs is on cuda:0; make it on the model's device" (a reward tensor built with
    ``torch.tensor(...)`` is on the CPU: the first GPU run found two lessons that did this).
    """
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}; make it on the model's "
                             "device")


def ndim(name: str, t: Tensor, n: int, shape_doc: str) -> None:
    """Raise ValueError when ``t`` does not have ``n`` dimensions; ``shape_doc`` names the expected shape."""
    if t.dim() != n:
        raise ValueError(f"{name} must have shape {shape_doc}, got {tuple(t.shape)}")


def choice(name: str, value, allowed) -> None:
    """Raise ValueError when ``value`` is not one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; expected one of {sorted(allowed)}")


def prefix_mask(name: str, mask: Tensor) -> None:
    """Raise ValueError when a row of the (B, T) ``mask`` is not a prefix of ones (1 up to its last valid token, 0
    after it), e.g. [1, 0, 1]; a row of zeros is a prefix (of length 0). For the functions that find a completion's
    end from its mask (GAE's bootstrap, the reward on the last token)."""
    valid = mask > 0  # (B, T)
    holes = valid[:, 1:] & ~valid[:, :-1]  # a valid token after a masked one
    if holes.any():
        row = int(holes.any(-1).nonzero()[0])
        raise ValueError(f"{name} must be a prefix of ones in every row (1 up to the completion's last token, 0 "
                         f"after it); row {row} is {mask[row].tolist()}")


def zero_outside(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask`` is on (> 0), 0 elsewhere, whatever ``x`` holds there (inf, -inf, NaN).

    The usual ``x * mask`` turns an inf in padding into NaN (inf * 0), and padding legitimately holds -inf
    log-probs. Masked entries are never read, so their gradient is 0, not NaN. For a 0/1 mask (float or bool) this
    is bit for bit ``x * mask`` wherever x is finite.
    """
    return torch.where(mask > 0, x, 0.0)


#: Log-ratio (nats) above which the ratio's exp is continued by its tangent (``exp_linear_above``), shared by the
#: losses (importance ratios) and k3: a ratio of e^20 ~ 4.9e8 is already meaningless, and a wild off-policy token must
#: not produce inf (and then NaN gradients). This is not a clamp: past it the value keeps growing and the gradient
#: keeps the exact one's sign (a clamp would zero the gradient, and for k3 give it the wrong sign).
LOG_RATIO_LINEAR_ABOVE = 20.0


def exp_linear_above(x: Tensor, cap: float = LOG_RATIO_LINEAR_ABOVE) -> Tensor:
    """exp(x) for x <= cap, continued above by its tangent at cap: e^cap * (1 + x - cap).

    Finite for any finite x (exp(89) is already inf in float32) and increasing, with a continuous derivative, so
    a gradient through it keeps the sign of the exact one past the cap, where a clamp would make it 0. Below the
    cap it is exactly exp (which only underflows towards 0, harmlessly).

    Example: cap 20, x = 25: e^20 * 6 = 2.910991e9 (exp(25) = 7.200490e10); derivative e^20 = 4.851652e8.
    """
    below = torch.exp(x.clamp(max=cap))  # the clamp only keeps the unused branch finite
    return torch.where(x <= cap, below, math.exp(cap) * (1 + (x - cap)))


#: Below this |log r|, k3 in float32 (``k3_of_log_ratio``) is summed from its series: there expm1(x) - x still cancels.
K3_SERIES_BELOW = 0.1


def k3_of_log_ratio(log_r: Tensor, cap: float = LOG_RATIO_LINEAR_ABOVE) -> Tensor:
    """k3 = r - 1 - log r from x = log r, to float32's precision at every x: the one form every k3 term uses.

    Near r = 1, where k3 lives early in training and between a sampler and a trainer, exp(x) - 1 - x cancels
    catastrophically in float32: at x = 1e-4 the true x^2/2 = 5e-9 is below float32's step at 1 (1.2e-7), so the
    result is exp's round-off near 1, a few times the value (1.66e-8 here); at 1e-3 it is 5% off. expm1(x) - x keeps
    x's relative precision but still subtracts two numbers that agree in most digits (9% off at 1e-6, 1e-5 at 1e-2),
    so in float32 (and float16, bfloat16) below |x| = 0.1 the series x^2/2 + x^3/6 + ... + x^6/720 is summed (the
    first term left out is x^5/2520 of the value: 4e-9 at 0.1, below float32's 1.2e-7). float64 keeps expm1(x) - x
    everywhere: its relative error, about 2e-16 / |x|, is 2e-10 at 1e-6, finer than the series' 4e-9.
    Above ``cap`` exp is continued by its tangent as in ``exp_linear_above``: finite, >= 0, gradient of the exact
    sign.

    Example: x = 1e-4 in float32: 5.000167e-9 (float64: 5.0001664e-9); exp(x) - 1 - x gives 1.66e-8.

    Args:
        log_r: any shape, the log-ratio log r (nats).

    Returns:
        k3, the same shape (nats, >= 0).

    Raises:
        nothing: a shape-free elementwise map (its callers check their inputs).

    Source: Schulman 2020 ("Approximating KL Divergence", k3); rlhf-book PR #525 (expm1 in k3); the float32 checks
    against float64 are in tests/test_k3_float32.py.
    """
    far = torch.where(log_r <= cap, torch.expm1(log_r.clamp(max=cap)), math.exp(cap) * (1 + (log_r - cap)) - 1)
    if torch.finfo(log_r.dtype).eps < 1e-10:  # float64
        return far - log_r
    near = log_r.clamp(-K3_SERIES_BELOW, K3_SERIES_BELOW)  # the clamps keep each unused branch's gradient finite
    series = near * near * (1 / 2 + near * (1 / 6 + near * (1 / 24 + near * (1 / 120 + near / 720))))
    return torch.where(log_r.abs() < K3_SERIES_BELOW, series, far - log_r)
