"""k3 = r - 1 - log r in float32, near r = 1 (issue 47 item 7).

The trainer computes log-probs in float32, and k3 lives near log r = 0: the KL to the reference early in training, PPO's
approx_kl, the sampler-trainer mismatch, the staleness KL. There exp(x) - 1 - x cancels: at x = 1e-4 the true value
x^2/2 = 5e-9 is below float32's step at 1 (2^-23 = 1.2e-7), so the old form returned exp's round-off near 1 (up to 6e-8;
1.7e-8 at 1e-4, 3x the truth), and at 1e-3 it was 5% off. Every k3 term is now ``checks.k3_of_log_ratio``. Each test
feeds float32 log-probs whose difference is exact (two close float32 numbers subtract exactly, Sterbenz's lemma), so
float64 arithmetic on the same inputs is the truth, and asks for float32's own precision: relative error below 1e-6.
"""

import math

import pytest
import torch

from minirl import checks, config, entropy_control, importance, kl, losses, stale_corrections

F32, F64 = torch.float32, torch.float64
GAPS = [1e-6, -1e-6, 3e-6, 1e-5, -1e-5, 1e-4, -1e-4, 3e-4, 1e-3, -1e-3]  # log r, nats
RTOL = 1e-6  # float32's precision (the old form was 0.05 off at 1e-3, and round-off several times the value below 1e-4)


def truth(log_r: torch.Tensor) -> torch.Tensor:
    """k3 in float64 of the same float32 log-ratios: expm1 in float64 is exact to 1e-16 relative."""
    x = log_r.to(F64)
    return torch.expm1(x) - x


def pair(gaps=GAPS, base=-1.5):
    """(logprobs, shifted) in float32, one row: shifted - logprobs is each gap rounded at logprobs' scale (to 1e-7),
    and that float32 subtraction is exact, so float64 sees the very log-ratio float32 does."""
    logprobs = torch.full((1, len(gaps)), base, dtype=F32)
    shifted = logprobs + torch.tensor([gaps], dtype=F32)
    return logprobs, shifted


def test_the_old_form_really_cancels_here():
    """The positive control: on these inputs exp(x) - 1 - x in float32 is far off, so the tests below can fail."""
    x = torch.tensor(GAPS, dtype=F32)
    old = torch.exp(x) - 1 - x
    rel = ((old.to(F64) - truth(x)).abs() / truth(x)).max()
    assert rel > 0.04  # at 1e-3 alone it is 4.7e-2; below 1e-4 it is round-off, several times the truth


# paper-index: checks.k3_of_log_ratio
def test_k3_of_log_ratio_value_and_gradient_at_float32_precision():
    x = torch.tensor(GAPS + [0.05, -0.099, 0.1, -0.3, 1.0, 3.0], dtype=F32, requires_grad=True)
    value = checks.k3_of_log_ratio(x)
    assert value.dtype == F32 and (value >= 0).all()
    assert ((value.detach().to(F64) - truth(x.detach())).abs() / truth(x.detach())).max() < RTOL
    # d/dx (e^x - 1 - x) = e^x - 1: the series' derivative keeps the relative precision of x too
    (grad,) = torch.autograd.grad(value.sum(), x)
    exact = torch.expm1(x.detach().to(F64))
    assert ((grad.to(F64) - exact).abs() / exact.abs()).max() < RTOL
    # x = 0 exactly: value and gradient 0, not NaN
    zero = torch.zeros(1, requires_grad=True)
    assert checks.k3_of_log_ratio(zero).item() == 0.0
    assert torch.autograd.grad(checks.k3_of_log_ratio(zero).sum(), zero)[0].item() == 0.0


def test_the_series_hands_over_to_expm1_without_a_step():
    """In float32 the form changes at |x| = 0.1: on both sides of it k3 is within float32's precision of the truth,
    so k3 has no step there."""
    edge = torch.tensor([0.1, -0.1], dtype=F32)
    for x in (torch.nextafter(edge, torch.zeros_like(edge)), edge, torch.nextafter(edge, 2 * edge)):
        assert ((checks.k3_of_log_ratio(x).to(F64) - truth(x)).abs() / truth(x)).max() < RTOL


def test_float64_keeps_expm1_and_its_precision():
    """float64 needs no series: expm1(x) - x is exact to float64's 2.2e-16 / |x| (2e-10 at 1e-6, 2.1e-10 measured);
    the truth here is the series summed in exact rational arithmetic."""
    from fractions import Fraction

    for gap in (1e-6, -3e-5, 1e-3, 0.0999, -0.2):
        x = Fraction(gap)
        exact = sum(x**n / math.factorial(n) for n in range(2, 30))
        value = checks.k3_of_log_ratio(torch.tensor(gap, dtype=F64)).item()
        assert abs(value - float(exact)) <= 4e-16 / abs(gap) * float(exact)


def test_past_the_cap_k3_is_still_the_tangent_continuation():
    x = torch.tensor([25.0], dtype=F64)
    assert checks.k3_of_log_ratio(x).item() == pytest.approx(torch.exp(torch.tensor(20.0, dtype=F64)).item() * 6 - 26,
                                                              rel=1e-12)


def test_kl_k3_and_the_ratio_weighted_k3_in_float32():
    logprobs, ref = pair()
    log_r = ref - logprobs
    assert torch.equal(log_r.to(F64), ref.to(F64) - logprobs.to(F64))  # the subtraction is exact
    assert torch.allclose(log_r, torch.tensor([GAPS], dtype=F32), rtol=0.05, atol=0)  # the gaps, to 1e-7 nats
    k3 = kl.k3(logprobs, ref)
    assert ((k3.to(F64) - truth(log_r)).abs() / truth(log_r)).max() < RTOL
    weighted = kl.ratio_weighted_k3(logprobs, logprobs.clone(), ref)  # on-policy: ratio 1, the value is k3's
    assert ((weighted.to(F64) - truth(log_r)).abs() / truth(log_r)).max() < RTOL


def mean_truth(log_r):
    return truth(log_r).mean().item()


def test_ppo_approx_kl_in_float32():
    old, logprobs = pair()  # log r = log pi - log pi_old = the gaps
    mask = torch.ones_like(old)
    _, stats = losses.policy_loss(logprobs, old, torch.ones(1, len(GAPS)), mask)
    assert stats["approx_kl"] == pytest.approx(mean_truth(logprobs - old), rel=RTOL)


def test_the_kl_cov_loss_approx_kl_in_float32():
    old, logprobs = pair()
    cfg = config.make_config("grpo", cov_mode="kl_cov")
    mask = torch.ones_like(old)
    _, stats = entropy_control.cov_loss(logprobs, old, torch.ones(1, len(GAPS)), mask, cfg, denominator=1.0)
    assert stats["approx_kl"] == pytest.approx(mean_truth(logprobs - old), rel=RTOL)


def test_the_staleness_kl_in_float32():
    sampler, logprobs = pair()  # staleness_kl: r = pi / mu on mu's tokens
    value = stale_corrections.staleness_kl(sampler, logprobs, torch.ones_like(sampler))
    assert value.item() == pytest.approx(mean_truth(logprobs - sampler), rel=RTOL)


def test_the_sampler_trainer_mismatch_k3_in_float32():
    sampler, old = pair()  # mismatch_metrics: log r = old_logprobs - sampler_logprobs
    stats = importance.mismatch_metrics(old, sampler, torch.ones_like(old))
    assert stats["k3"] == pytest.approx(mean_truth(old - sampler), rel=RTOL)
