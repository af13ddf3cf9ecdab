"""Tests of minirl.kl: k1, k2, k3, their placement (reward or loss), and the exact per-position KL. (The exact toy
minirl.kl_toy is tested in test_kl_toy.py.)"""

import math
from functools import partial

import helpers
import pytest
import torch
from helpers import FORWARD_GRAD, REF, THETA, TRUE_GRAD

from minirl import advantages, checks, kl, kl_toy

D = torch.float64


def t(*xs):
    return torch.tensor(xs, dtype=D)


close = partial(helpers.close, atol=5e-7)  # the 6 decimals the expectations are written with


# --- single tokens ----------------------------------------------------------------------------------------------
# paper-index: kl.k1 kl.k2 kl.k3
def test_single_token_values_and_gradients():
    # l = -1.0 - (-1.2) = 0.2.  k1 = 0.2;  k2 = 0.5 * 0.2^2 = 0.02;  k3 = e^-0.2 - 1 + 0.2 = 0.818731 - 0.8 = 0.0187308
    # d/dlogprob: k1 -> 1;  k2 -> l = 0.2;  k3 -> 1 - e^-0.2 = 0.181269
    expected = {"k1": (0.2, 1.0), "k2": (0.02, 0.2), "k3": (0.0187308, 0.181269)}
    for name, (value, grad) in expected.items():
        logprobs = t(-1.0).reshape(1, 1).requires_grad_(True)
        out = getattr(kl, name)(logprobs, t(-1.2).reshape(1, 1))
        close(out, [[value]])
        close(torch.autograd.grad(out.sum(), logprobs)[0], [[grad]])


def test_k3_is_never_negative_and_zero_at_equality():
    logprobs = torch.linspace(-10, 0, 11, dtype=D).reshape(1, 11)
    ref = torch.flip(logprobs, [-1])
    assert (kl.k3(logprobs, ref) >= 0).all() and (kl.k2(logprobs, ref) >= 0).all()
    close(kl.k3(logprobs, logprobs), torch.zeros(1, 11, dtype=D), atol=0)


# --- extreme log-ratios -----------------------------------------------------------------------------------------
def test_extreme_log_ratios_stay_finite():
    # float32, as the trainer computes log-probs; |logprobs - ref_logprobs| = 50 and 100 both ways, and 0
    # (without the clamp, e^100 overflows float32, whose largest value is ~3.4e38 = e^88.7)
    logprobs = torch.tensor([[-0.1, -50.1, -0.1, -100.1, -3.0]], requires_grad=True)
    ref = torch.tensor([[-50.1, -0.1, -100.1, -0.1, -3.0]])
    for name in kl.ESTIMATORS:
        value = kl.kl_estimate(logprobs, ref, estimator=name)
        grad = torch.autograd.grad(value.sum(), logprobs)[0]
        assert torch.isfinite(value).all() and torch.isfinite(grad).all(), name
        value = kl.kl_in_loss(logprobs, ref, estimator=name)
        assert torch.isfinite(torch.autograd.grad(value.sum(), logprobs)[0]).all(), name
        assert torch.isfinite(kl.kl_in_reward(torch.zeros(1, 5), logprobs, ref, beta=0.1, estimator=name)).all(), name


def test_k3_past_the_cap_is_linear_and_exact_below():
    C = checks.LOG_RATIO_LINEAR_ABOVE
    assert C == 20.0
    # log r = ref - logprobs = (+50, -50, 19). Above 20, exp is continued by its tangent at 20: e^20 (1 + log r - 20).
    # +50: 31 e^20 - 1 - 50 = 15040121057.70 - 51;  -50: e^-50 - 1 + 50 (exact, exp only underflows below);
    # 19: e^19 - 1 - 19 (exact)
    logprobs = t(-50.0, 0.0, -19.0).reshape(1, 3).requires_grad_(True)
    ref = t(0.0, -50.0, 0.0).reshape(1, 3)
    value = kl.k3(logprobs, ref)
    close(value, [[31 * math.exp(20) - 51, math.exp(-50) + 49, math.exp(19) - 20]], atol=1e-6)
    # d/dlogprobs (exp~(ref - lp) - 1 - ref + lp) = 1 - exp~'(log r): 1 - e^20 past the cap (this used to be +1,
    # the wrong sign, when exp was clamped), 1 - e^-50 and 1 - e^19 below it
    grad = torch.autograd.grad(value.sum(), logprobs)[0]
    close(grad, [[1 - math.exp(20), 1 - math.exp(-50), 1 - math.exp(19)]], atol=1e-6)


@pytest.mark.parametrize("diff", [25.0, 50.0, 100.0, -25.0, -50.0, -100.0])
def test_k3_gradient_keeps_the_exact_sign_past_the_cap(diff):
    # diff = logprobs - ref, so log r = -diff. Exact k3 = e^-diff - 1 + diff, exact d/dlogprobs = 1 - e^-diff
    # (float64 holds e^100 = 2.69e43). The issue: diff = -25 gave value 4.85e8 and gradient +1 with a clamp,
    # while the exact gradient is 1 - e^25 = -7.2e10: the KL term pushed the policy AWAY from the reference.
    #   diff -25, -50, -100: log r = 25, 50, 100 > 20 -> value e^20 (1 + log r - 20) - 1 - log r, gradient 1 - e^20
    #     (e.g. -25: 6 e^20 - 26 = 2.910991e9; gradient -4.851652e8, negative like the exact -7.200490e10)
    #   diff 25, 50, 100: exact: 24 + e^-25, 49 + e^-50, 99 + e^-100; gradient 1 - e^-diff > 0
    log_r = -diff
    exact_grad = 1 - math.exp(log_r)
    if log_r > 20:
        expected_value, expected_grad = math.exp(20) * (1 + log_r - 20) - 1 - log_r, 1 - math.exp(20)
    else:
        expected_value, expected_grad = math.exp(log_r) - 1 - log_r, exact_grad
    for dtype in (torch.float64, torch.float32):
        lp = torch.tensor([[diff - 1.0]], dtype=dtype, requires_grad=True)
        value = kl.kl_in_loss(lp, torch.tensor([[-1.0]], dtype=dtype), estimator="k3")
        (grad,) = torch.autograd.grad(value.sum(), lp)
        assert torch.isfinite(value).all() and torch.isfinite(grad).all()
        assert math.copysign(1, grad.item()) == math.copysign(1, exact_grad), (grad, exact_grad)
        assert value.item() >= 0
        if dtype == torch.float64:
            assert value.item() == pytest.approx(expected_value, rel=1e-12)
            assert grad.item() == pytest.approx(expected_grad, rel=1e-12)
    if diff == -25.0:
        assert expected_value == pytest.approx(2.910991146e9, rel=1e-9)
        assert expected_grad == pytest.approx(-4.851651944e8, rel=1e-9)
        assert exact_grad == pytest.approx(-7.200489934e10, rel=1e-9)


# --- bad input --------------------------------------------------------------------------------------------------
def test_shape_mismatch_names_both_arguments():
    for fn in (kl.k1, kl.k2, kl.k3, kl.kl_in_loss):
        with pytest.raises(ValueError, match="logprobs.*ref_logprobs"):
            fn(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="token_rewards.*logprobs"):
        kl.kl_in_reward(torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2, 3), beta=0.1)
    with pytest.raises(ValueError, match="logprobs.*ref_logprobs"):
        kl.kl_in_reward(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 2), beta=0.1)
    with pytest.raises(ValueError, match="theta.*ref_logits"):
        kl_toy.expected_gradient(torch.zeros(3), torch.zeros(4), "k1", "loss")


def test_unknown_estimator_or_placement_raises():
    with pytest.raises(ValueError, match="k4"):
        kl.kl_estimate(torch.zeros(1, 2), torch.zeros(1, 2), estimator="k4")
    with pytest.raises(ValueError, match="k4"):
        kl.kl_in_loss(torch.zeros(1, 2), torch.zeros(1, 2), estimator="k4")
    with pytest.raises(ValueError, match="advantage"):
        kl_toy.expected_gradient(torch.zeros(3), torch.zeros(3), "k1", "advantage")


def test_negative_beta_raises():
    with pytest.raises(ValueError, match="beta"):
        kl.kl_in_reward(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), beta=-0.1)
    with pytest.raises(ValueError, match="beta"):
        kl_toy.bandit_train(t(1.0, 0.0), t(0.0, 0.0), beta=-1.0, estimator="k1", placement="reward", steps=1, lr=1.0)


# --- placement semantics of the real API ------------------------------------------------------------------------
def test_kl_in_reward_is_detached_from_logprobs():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    shaped = kl.kl_in_reward(torch.tensor([[0.0, 1.0]]), logprobs, torch.tensor([[-1.5, -1.5]]), beta=0.1)
    assert not shaped.requires_grad  # no path back to logprobs
    # r - 0.1 * k1 = (0 - 0.1 * 0.5, 1 - 0.1 * -0.5) = (-0.05, 1.05)
    close(shaped, [[-0.05, 1.05]])


def test_kl_in_loss_detaches_the_reference():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.5]], requires_grad=True)
    kl.kl_in_loss(logprobs, ref, estimator="k3").sum().backward()
    assert ref.grad is None
    # d k3 / d logprobs = 1 - e^{ref - lp} = (1 - e^-0.5, 1 - e^0.5) = (0.393469, -0.648721)
    close(logprobs.grad, [[0.393469, -0.648721]])


# paper-index: kl.kl_in_loss
def test_autograd_of_a_sampled_k3_loss_matches_the_forward_kl_gradient():
    # the real API, no toy in between: 200k actions from pi, mean of kl_in_loss(..., "k3"), backward
    gen = torch.Generator().manual_seed(0)
    theta = THETA.clone().requires_grad_(True)
    actions = torch.multinomial(THETA.softmax(-1), 200_000, replacement=True, generator=gen)  # (N,)
    logprobs = theta.log_softmax(-1)[actions][None]  # (1, N)
    ref = REF.log_softmax(-1)[actions][None]  # (1, N)
    kl.kl_in_loss(logprobs, ref, estimator="k3").mean().backward()
    expected = kl_toy.expected_gradient(THETA, REF, "k3", "loss")
    close(expected, FORWARD_GRAD)
    # per-sample std of (1 - ref/pi)(onehot - pi) is < 4 here, so 5 sigma < 5 * 4 / sqrt(200000) = 0.045; seen: ~3e-3
    assert (theta.grad - expected).abs().max() < 0.01
    assert (theta.grad - torch.tensor(TRUE_GRAD, dtype=D)).abs().max() > 0.04  # and it is not the reverse KL's


def test_autograd_of_sampled_k1_in_reward_matches_the_true_gradient():
    gen = torch.Generator().manual_seed(1)
    theta = THETA.clone().requires_grad_(True)
    actions = torch.multinomial(THETA.softmax(-1), 200_000, replacement=True, generator=gen)
    logprobs = theta.log_softmax(-1)[actions][None]  # (1, N)
    ref = REF.log_softmax(-1)[actions][None]
    shaped = kl.kl_in_reward(torch.zeros_like(ref), logprobs, ref, beta=1.0, estimator="k1")  # -k1, detached
    (-(shaped * logprobs).mean()).backward()  # REINFORCE on the penalty; gradient to minimise the KL
    assert (theta.grad - torch.tensor(TRUE_GRAD, dtype=D)).abs().max() < 0.01


# paper-index: kl.kl_in_reward
def test_kl_in_reward_shapes_every_token_with_detached_k1():
    # k1 = logprobs - ref = [-1 + 1.5, -2 + 1, -0.5 + 0.5] = [0.5, -1, 0]; beta 0.1
    # shaped = [0, 0, 1] - 0.1 * [0.5, -1, 0] = [-0.05, 0.1, 1.0]
    logprobs = t([-1.0, -2.0, -0.5]).requires_grad_(True)
    shaped = kl.kl_in_reward(t([0, 0, 1.0]), logprobs, t([-1.5, -1.0, -0.5]), beta=0.1, estimator="k1")
    close(shaped, [[-0.05, 0.1, 1.0]])
    assert not shaped.requires_grad  # a reward: reaches the policy only through the advantages
    # through GAE (gamma 1, lam 1, critic 0) each token's advantage is its reward-to-go: later penalties only
    a, _ = advantages.gae(shaped, torch.zeros_like(shaped), torch.ones_like(shaped), gamma=1.0, lam=1.0)
    close(a, [[1.05, 1.1, 1.0]])
    with pytest.raises(ValueError, match="beta"):
        kl.kl_in_reward(t([0, 0, 1.0]), logprobs, t([-1.5, -1.0, -0.5]), beta=-0.1)
    with pytest.raises(ValueError, match="logprobs"):
        kl.kl_in_reward(t([0, 0, 1.0]), t([-1.0, -2.0]), t([-1.5, -1.0]), beta=0.1)


# --- exact_token_kl: the full-vocabulary KL at one position --------------------------------------------------------
# paper-index: kl.exact_token_kl
def test_exact_token_kl_hand_example():
    # pi = [1/2, 1/2], ref = [1/4, 3/4]: 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.346574 - 0.202733 = 0.143841
    logits = torch.tensor([0.5, 0.5]).log().view(1, 1, 2)
    ref = torch.tensor([0.25, 0.75]).log().view(1, 1, 2)
    torch.testing.assert_close(kl.exact_token_kl(logits, ref), torch.tensor([[0.143841]]), atol=1e-6, rtol=0)


def test_exact_token_kl_temperature_scales_both_models():
    # at temperature 2 the logits [ln 1, ln 3] become [0, ln 3 / 2]: ref = [1, sqrt 3] / (1 + sqrt 3)
    logits = torch.zeros(1, 1, 2)
    ref = torch.tensor([1.0, 3.0]).log().view(1, 1, 2)
    q = torch.tensor([1.0, math.sqrt(3.0)]) / (1 + math.sqrt(3.0))
    expected = (0.5 * (0.5 / q).log()).sum()
    torch.testing.assert_close(kl.exact_token_kl(logits, ref, temperature=2.0), expected.view(1, 1), atol=1e-6,
                               rtol=0)


def test_exact_token_kl_is_zero_for_equal_and_finite_for_a_vanishing_token():
    logits = torch.randn(2, 3, 5)
    assert kl.exact_token_kl(logits, logits.clone()).abs().max() < 1e-6
    # pi puts (numerically) no mass on token 0: that term is 0, not NaN
    extreme = torch.tensor([[[-1e4, 0.0, 0.0]]])
    out = kl.exact_token_kl(extreme, torch.zeros(1, 1, 3))
    torch.testing.assert_close(out, torch.tensor([[math.log(1.5)]]), atol=1e-6, rtol=0)  # pi = [0, .5, .5]


@pytest.mark.parametrize("bad", [dict(ref_logits=torch.zeros(2, 3, 4)), dict(temperature=0.0)])
def test_exact_token_kl_rejects_bad_input(bad):
    args = dict(logits=torch.zeros(2, 3, 5), ref_logits=torch.zeros(2, 3, 5), temperature=1.0) | bad
    with pytest.raises(ValueError, match="ref_logits|temperature"):
        kl.exact_token_kl(**args)
    with pytest.raises(ValueError, match=r"\(B, T, V\)"):
        kl.exact_token_kl(torch.zeros(2, 5), torch.zeros(2, 5))


@pytest.mark.parametrize("estimator", [kl.k1, kl.k2, kl.k3])
def test_kl_estimators_refuse_mismatched_shapes(estimator):
    with pytest.raises(ValueError, match="ref_logprobs"):
        estimator(torch.zeros(2, 3), torch.zeros(3, 2))
