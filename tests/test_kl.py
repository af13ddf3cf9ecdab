"""Tests of minirl.kl (k1, k2, k3 and their placement) and of the exact toy minirl.kl_toy."""

import math
from functools import partial

import helpers
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl import advantages, checks, kl, kl_toy

D = torch.float64


def t(*xs):
    return torch.tensor(xs, dtype=D)


close = partial(helpers.close, atol=5e-7)  # the 6 decimals the expectations are written with


# --- the categorical of the issue: pi = softmax([1, 0, -1]) against a uniform reference -------------------------
# pi = (e, 1, 1/e) / (e + 1 + 1/e) = (2.718282, 1, 0.367879) / 4.086161 = (0.665241, 0.244728, 0.090031); ref = 1/3.
# l = log pi - log ref = log pi + log 3 = (0.691006, -0.308994, -1.308994).
# KL(pi||ref) = sum pi l = 0.459686 - 0.075619 - 0.117850 = 0.266217.
# grad KL w.r.t. the logits = pi * (l - KL) = (0.665241 * 0.424789, 0.244728 * -0.575211, 0.090031 * -1.575211)
#             = (0.282587, -0.140770, -0.141817).
# grad KL(ref||pi) = pi - ref = (0.331908, -0.088605, -0.243303).
# E[k2] = 0.5 * sum pi l^2 = 0.5 * (0.317646 + 0.023366 + 0.154265) = 0.247638.
THETA, REF = t(1.0, 0.0, -1.0), t(0.0, 0.0, 0.0)
TRUE_GRAD = [0.282587, -0.140770, -0.141817]
FORWARD_GRAD = [0.331908, -0.088605, -0.243303]


# paper-index: kl_toy.true_kl
def test_true_kl_gradient_of_the_issue_example():
    theta = THETA.clone().requires_grad_(True)
    value = kl_toy.true_kl(theta, REF)
    close(value, 0.266217)
    close(torch.autograd.grad(value, theta)[0], TRUE_GRAD)


# paper-index: kl_toy.forward_kl
def test_forward_kl_gradient_is_pi_minus_ref():
    theta = THETA.clone().requires_grad_(True)
    close(torch.autograd.grad(kl_toy.forward_kl(theta, REF), theta)[0], FORWARD_GRAD)


# paper-index: kl_toy.expected_estimator_value
def test_expected_values_of_the_estimators():
    close(kl_toy.expected_estimator_value(THETA, REF, "k1"), 0.266217)  # unbiased
    close(kl_toy.expected_estimator_value(THETA, REF, "k3"), 0.266217)  # unbiased
    close(kl_toy.expected_estimator_value(THETA, REF, "k2"), 0.247638)  # biased (below the KL here)


def test_k1_in_loss_has_zero_expected_gradient():
    # sum_a pi(a) grad log pi(a) = sum_a pi(a) (onehot(a) - pi) = pi - pi = 0
    close(kl_toy.expected_gradient(THETA, REF, "k1", "loss"), [0.0, 0.0, 0.0])


def test_k2_in_loss_gives_the_true_reverse_kl_gradient():
    close(kl_toy.expected_gradient(THETA, REF, "k2", "loss"), TRUE_GRAD)


def test_k3_in_loss_gives_the_forward_kl_gradient():
    # E_pi[(1 - ref/pi) grad log pi] = 0 - sum_a ref(a) (onehot(a) - pi) = pi - ref
    close(kl_toy.expected_gradient(THETA, REF, "k3", "loss"), FORWARD_GRAD)


def test_k1_in_reward_gives_the_true_reverse_kl_gradient():
    close(kl_toy.expected_gradient(THETA, REF, "k1", "reward"), TRUE_GRAD)


def test_k3_in_reward_is_reverse_minus_forward():
    # E_pi[k3 grad log pi] = grad E_pi[k3] - E_pi[grad k3] = grad KL(pi||ref) - grad KL(ref||pi)
    #   = (0.282587 - 0.331908, -0.140770 + 0.088605, -0.141817 + 0.243303) = (-0.049320, -0.052165, 0.101486)
    close(kl_toy.expected_gradient(THETA, REF, "k3", "reward"), [-0.049320, -0.052165, 0.101486])


def test_ratio_that_equals_one_still_changes_the_loss_gradient():
    # behaviour = current policy: the ratio pi/mu is 1 in value, but differentiated it turns the surrogate into
    # sum_a pi(a) k(a; theta), whose gradient is grad E_pi[k] = grad KL(pi||ref) for k1 and k3.
    for estimator in ("k1", "k3"):
        close(kl_toy.expected_gradient(THETA, REF, estimator, "loss", behaviour_logits=THETA), TRUE_GRAD)
    # k2, weighted, is no longer the KL's gradient: grad E_pi[k2] = (0.276671, -0.189691, -0.086980)
    close(kl_toy.expected_gradient(THETA, REF, "k2", "loss", behaviour_logits=THETA), [0.276671, -0.189691, -0.086980])


def test_off_policy_importance_weight_recovers_on_policy_reward_gradient():
    mu = t(0.0, 0.5, 1.0)  # an older policy, quite different from pi
    weighted = kl_toy.expected_gradient(THETA, REF, "k1", "reward", behaviour_logits=mu)
    close(weighted, TRUE_GRAD)
    unweighted = kl_toy.expected_gradient(THETA, REF, "k1", "loss", behaviour_logits=mu, importance_weight=False)
    close(unweighted, mu.softmax(-1) - THETA.softmax(-1))  # k1 in the loss off-policy: E_mu[grad log pi] = mu - pi


# paper-index: kl_toy.expected_gradient
@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=8, max_size=8))
def test_placement_table_on_random_categoricals(xs):
    theta, ref = t(*xs[:4]), t(*xs[4:])
    leaf = theta.clone().requires_grad_(True)
    true = torch.autograd.grad(kl_toy.true_kl(leaf, ref), leaf)[0]
    close(kl_toy.expected_gradient(theta, ref, "k1", "reward"), true, atol=1e-10)
    close(kl_toy.expected_gradient(theta, ref, "k2", "loss"), true, atol=1e-10)
    close(kl_toy.expected_gradient(theta, ref, "k3", "loss"), theta.softmax(-1) - ref.softmax(-1), atol=1e-10)


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


# --- the toy against sampling -----------------------------------------------------------------------------------
def _per_action_grads(theta, ref, estimator, placement, behaviour=None, weight=True):
    """(K, K): row a = gradient of the surrogate's term for one sample a (used for the exact standard error)."""
    rows = []
    for a in range(len(theta)):
        leaf = theta.clone().requires_grad_(True)
        s = kl_toy._surrogate(leaf, ref, estimator, placement, behaviour, weight, torch.tensor([a]))
        rows.append(torch.autograd.grad(s, leaf)[0])
    return torch.stack(rows)


# paper-index: kl_toy.sampled_gradient
@pytest.mark.parametrize("estimator", kl.ESTIMATORS)
@pytest.mark.parametrize("placement", kl.PLACEMENTS)
@pytest.mark.parametrize("off_policy", [False, True])
def test_sampled_gradient_agrees_with_enumeration(estimator, placement, off_policy):
    behaviour = t(0.0, 0.5, 1.0) if off_policy else None
    n = 20_000
    exact = kl_toy.expected_gradient(THETA, REF, estimator, placement, behaviour)
    sampled = kl_toy.sampled_gradient(THETA, REF, estimator, placement, n, torch.Generator().manual_seed(0), behaviour)
    # standard error from the exact per-sample variance: sum_a mu(a) (g(a) - mean)^2 / n
    g = _per_action_grads(THETA, REF, estimator, placement, behaviour)
    mu = (THETA if behaviour is None else behaviour).softmax(-1)
    stderr = ((mu[:, None] * (g - exact) ** 2).sum(0) / n).sqrt()
    assert ((sampled - exact).abs() <= 5 * stderr + 1e-12).all(), (sampled, exact, stderr)


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


def test_k1_in_reward_and_k2_in_loss_are_the_same_estimator_sample_by_sample():
    # per sample a: k1 in the reward gives l(a) grad log pi(a); k2 in the loss gives grad l(a)^2/2 = l(a) grad log pi(a)
    g_reward = _per_action_grads(THETA, REF, "k1", "reward")
    g_loss = _per_action_grads(THETA, REF, "k2", "loss")
    close(g_reward, g_loss, atol=1e-12)


def test_autograd_of_sampled_k1_in_reward_matches_the_true_gradient():
    gen = torch.Generator().manual_seed(1)
    theta = THETA.clone().requires_grad_(True)
    actions = torch.multinomial(THETA.softmax(-1), 200_000, replacement=True, generator=gen)
    logprobs = theta.log_softmax(-1)[actions][None]  # (1, N)
    ref = REF.log_softmax(-1)[actions][None]
    shaped = kl.kl_in_reward(torch.zeros_like(ref), logprobs, ref, beta=1.0, estimator="k1")  # -k1, detached
    (-(shaped * logprobs).mean()).backward()  # REINFORCE on the penalty; gradient to minimise the KL
    assert (theta.grad - torch.tensor(TRUE_GRAD, dtype=D)).abs().max() < 0.01


# --- two tokens -------------------------------------------------------------------------------------------------
def _two_token_example():
    gen = torch.Generator().manual_seed(0)
    K = 3
    return [torch.randn(shape, generator=gen, dtype=D) for shape in [(K,), (K, K), (K,), (K, K)]]


def test_two_token_true_gradient_matches_the_chain_rule():
    theta1, theta2, ref1, ref2 = _two_token_example()
    g = kl_toy.sequence_kl_gradients(theta1, theta2, ref1, ref2)["true"]
    # KL over sequences = KL(pi1||ref1) + sum_y1 pi1(y1) KL(pi2(.|y1) || ref2(.|y1))
    t1, t2 = theta1.clone().requires_grad_(True), theta2.clone().requires_grad_(True)
    per_prefix = torch.stack([kl_toy.true_kl(t2[y], ref2[y]) for y in range(3)])
    total = kl_toy.true_kl(t1, ref1) + (t1.softmax(-1) * per_prefix).sum()
    e1, e2 = torch.autograd.grad(total, (t1, t2))
    close(g[0], e1, atol=1e-12)
    close(g[1], e2, atol=1e-12)


# paper-index: kl_toy.sequence_kl_gradients
def test_two_token_which_estimators_give_the_sequence_kl_gradient():
    grads = kl_toy.sequence_kl_gradients(*_two_token_example())
    flat = {name: torch.cat([g1, g2.flatten()]) for name, (g1, g2) in grads.items()}
    true = flat["true"]
    # exact: k1 in the reward with reward-to-go, and k2 of the whole sequence's log-ratio
    close(flat["k1_reward_to_go"], true, atol=1e-12)
    close(flat["k2_loss_sequence"], true, atol=1e-12)
    close(flat["k3_loss_sequence"], flat["forward"], atol=1e-12)
    close(flat["k1_loss_per_token"], torch.zeros_like(true), atol=1e-12)
    # per-token penalties without reward-to-go: right for token 2, wrong for token 1 (theta1)
    close(flat["k2_loss_per_token"], flat["k1_reward_own_token"], atol=1e-12)
    close(grads["k1_reward_own_token"][1], grads["true"][1], atol=1e-12)
    gap = (grads["k1_reward_own_token"][0] - grads["true"][0]).abs().max()
    assert gap > 0.05, gap  # measured 0.0587 on this example
    assert (flat["k3_loss_per_token"] - true).abs().max() > 0.05
    assert (flat["k3_loss_per_token"] - flat["forward"]).abs().max() > 0.05


# --- the bandit -------------------------------------------------------------------------------------------------
# rewards (1, 0, 0.5), beta 0.5, uniform ref: pi* = softmax(r / beta) = (e^2, 1, e^1) / 11.107 = (0.665241, 0.090031,
# 0.244728). The forward-KL optimum solves r(a) + beta ref(a) / pi(a) = lam: (0.647414, 0.132545, 0.220041).
R, BETA = t(1.0, 0.0, 0.5), 0.5
REVERSE_OPT, FORWARD_OPT = [0.665241, 0.090031, 0.244728], [0.647414, 0.132545, 0.220041]


# paper-index: kl_toy.bandit_optimum kl_toy.bandit_forward_optimum
def test_bandit_optima():
    close(kl_toy.bandit_optimum(R, REF, BETA), REVERSE_OPT)
    pi = kl_toy.bandit_forward_optimum(R, REF, BETA)
    close(pi, FORWARD_OPT)
    lam = R + BETA * REF.softmax(-1) / pi
    close(lam - lam[0], [0.0, 0.0, 0.0], atol=1e-12)  # the stationarity condition


def test_bandit_forward_optimum_stays_finite_when_the_best_arm_is_rare_under_ref():
    # the best arm has ref ~ 1e-14 and the reward range is wide: lam sits 1e-15 above max r, which a bisection on
    # lam itself rounds onto max r (0/0 -> NaN); the log-scale search keeps it apart
    rewards = torch.linspace(-1.5, 1.5, 121, dtype=D)
    ref_logits = -0.5 * ((torch.linspace(-6, 6, 121, dtype=D) - 2) / 0.5) ** 2  # the best arm at x = 6: e^-32
    pi = kl_toy.bandit_forward_optimum(rewards, ref_logits, 0.1)
    assert torch.isfinite(pi).all() and abs(pi.sum().item() - 1) < 1e-12
    lam = rewards + 0.1 * ref_logits.softmax(-1) / pi
    assert (lam - lam[0]).abs().max() < 1e-9  # stationarity holds on every arm


# paper-index: kl_toy.bandit_train
@pytest.mark.parametrize(("estimator", "placement", "optimum"), [
    ("k1", "reward", REVERSE_OPT),  # the unbiased RLHF placement
    ("k2", "loss", REVERSE_OPT),  # also exact
    ("k3", "loss", FORWARD_OPT),  # GRPO's choice: the forward-KL-regularised optimum
])
def test_bandit_converges_to_the_optimum_of_its_true_objective(estimator, placement, optimum):
    final = kl_toy.bandit_train(R, REF, beta=BETA, estimator=estimator, placement=placement, steps=600, lr=2.0)[-1]
    assert (final - torch.tensor(optimum, dtype=D)).abs().max() < 1e-3, final


def test_k3_in_loss_misses_the_reverse_kl_optimum():
    final = kl_toy.bandit_train(R, REF, beta=BETA, estimator="k3", placement="loss", steps=600, lr=2.0)[-1]
    assert (final - torch.tensor(REVERSE_OPT, dtype=D)).abs().max() > 0.04  # measured 0.0425 on the worst action


def test_k1_in_loss_is_no_regulariser_at_all():
    traj = kl_toy.bandit_train(R, REF, beta=BETA, estimator="k1", placement="loss", steps=600, lr=2.0)
    assert traj[-1][0] > 0.99  # collapses onto the best action, as with beta = 0
    close(traj, kl_toy.bandit_train(R, REF, beta=0.0, estimator="k1", placement="loss", steps=600, lr=2.0), atol=1e-12)


def test_sampled_bandit_is_seeded_and_lands_near_the_optimum():
    a = kl_toy.bandit_train(R, REF, beta=BETA, estimator="k1", placement="reward", steps=400, lr=0.5, n_samples=256,
                            seed=3)
    b = kl_toy.bandit_train(R, REF, beta=BETA, estimator="k1", placement="reward", steps=400, lr=0.5, n_samples=256,
                            seed=3)
    assert torch.equal(a, b)
    mean_tail = a[-100:].mean(0)  # average out the step-to-step noise
    assert (mean_tail - torch.tensor(REVERSE_OPT, dtype=D)).abs().max() < 0.03, mean_tail


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
