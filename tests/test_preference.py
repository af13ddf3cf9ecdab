"""Tests for minirl.preference: DPO, IPO, KTO, SimPO. (The IPO bandit: test_preference_toy.py; pair construction:
test_preference_data.py.)

Every expected number is worked by hand in the comment next to it. sigma(x) = 1 / (1 + e^-x), and
-log sigma(x) = ln(1 + e^-x).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl import preference
from minirl.preference import dpo_loss, ipo_loss, kto_loss, kto_mismatched_indices, simpo_loss

LN2 = math.log(2.0)  # 0.693147


def t(*xs, grad=False):
    return torch.tensor(xs, dtype=torch.float64, requires_grad=grad)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


# ---------------------------------------------------------------------------------------------------------- DPO


@settings(max_examples=50, deadline=None)
@given(
    logps=st.lists(st.floats(-50.0, 0.0), min_size=1, max_size=8),
    rej=st.floats(-50.0, 0.0),
    beta=st.floats(0.01, 5.0),
    eps=st.floats(0.0, 0.49),
)
def test_dpo_is_ln2_when_policy_equals_reference(logps, rej, beta, eps):
    # h = (c - c) - (r - r) = 0 for every pair -> -(1-eps) log sigma(0) - eps log sigma(0) = ln 2, any beta, eps
    chosen = torch.tensor(logps, dtype=torch.float64)
    rejected = torch.full_like(chosen, rej)
    loss, stats = dpo_loss(chosen, rejected, chosen.clone(), rejected.clone(), beta=beta, label_smoothing=eps)
    assert loss.item() == pytest.approx(LN2, abs=1e-12)
    assert stats["chosen_rewards"] == 0.0 and stats["rejected_rewards"] == 0.0 and stats["margins"] == 0.0
    assert stats["accuracy"] == 0.0  # margin 0 is not > 0


# paper-index: preference.dpo_loss
def test_dpo_hand_value_and_cdpo():
    # chosen log-ratio -1 - (-2) = +1, rejected log-ratio -3 - (-2) = -1 -> h = 2, beta * h = 0.2
    # DPO: ln(1 + e^-0.2) = ln(1.818731) = 0.598139
    # cDPO eps = 0.1: 0.9 * 0.598139 + 0.1 * ln(1 + e^0.2) = 0.9 * 0.598139 + 0.1 * 0.798139 = 0.618139
    args = (t(-1.0), t(-3.0), t(-2.0), t(-2.0))
    loss, stats = dpo_loss(*args, beta=0.1)
    assert loss.item() == pytest.approx(0.598139, abs=1e-6)
    loss_c, _ = dpo_loss(*args, beta=0.1, label_smoothing=0.1)
    assert loss_c.item() == pytest.approx(0.618139, abs=1e-6)
    # implicit rewards: 0.1 * 1 = 0.1 and 0.1 * -1 = -0.1, margin 0.2, the pair is ranked right
    assert stats == pytest.approx({"chosen_rewards": 0.1, "rejected_rewards": -0.1, "margins": 0.2, "accuracy": 1.0})


def test_dpo_gradient_matches_hand_formula():
    # dL/d chosen_i = -(1/B) * beta * sigma(-beta * h_i)   (d/dx of -log sigma(x) is -sigma(-x))
    # with label smoothing: -(1/B) * beta * [(1 - eps) sigma(-beta h_i) - eps sigma(beta h_i)]; rejected: the negative
    beta, eps = 0.5, 0.2
    chosen, rejected = t(-1.0, -4.0, -2.0, grad=True), t(-3.0, -1.0, -2.5, grad=True)
    ref_c, ref_r = t(-2.0, -2.0, -2.0), t(-2.0, -2.0, -2.0)
    loss, _ = dpo_loss(chosen, rejected, ref_c, ref_r, beta=beta, label_smoothing=eps)
    gc, gr = torch.autograd.grad(loss, (chosen, rejected))
    h = (chosen - ref_c) - (rejected - ref_r)
    expected = -beta * ((1 - eps) * torch.sigmoid(-beta * h) - eps * torch.sigmoid(beta * h)) / 3
    torch.testing.assert_close(gc, expected.detach())
    torch.testing.assert_close(gr, -expected.detach())
    # eps = 0: exactly -beta * sigma(-beta h) / B
    loss0, _ = dpo_loss(chosen, rejected, ref_c, ref_r, beta=beta)
    (gc0,) = torch.autograd.grad(loss0, chosen)
    torch.testing.assert_close(gc0, (-beta * torch.sigmoid(-beta * h) / 3).detach())


def test_dpo_reference_gets_no_gradient():
    ref_c = t(-2.0, grad=True)
    loss, _ = dpo_loss(t(-1.0, grad=True), t(-3.0), ref_c, t(-2.0))
    (g,) = torch.autograd.grad(loss, ref_c, allow_unused=True)
    assert g is None


def test_dpo_cdpo_minimum_is_at_finite_margin():
    # cDPO loss in x = beta*h is -(1-eps) log sigma(x) - eps log sigma(-x); derivative -(1-eps) sigma(-x) + eps sigma(x)
    # vanishes at sigma(x) = 1 - eps, i.e. x* = log((1 - eps) / eps) = log(9) = 2.197225 for eps = 0.1
    x = torch.tensor([math.log(9.0)], dtype=torch.float64, requires_grad=True)
    loss, _ = dpo_loss(x, torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                       torch.zeros(1, dtype=torch.float64), beta=1.0, label_smoothing=0.1)
    (g,) = torch.autograd.grad(loss, x)
    assert abs(g.item()) < 1e-12


def test_extreme_log_ratios_stay_finite():
    big = t(1e4, -1e4, grad=True)
    zeros = torch.zeros(2, dtype=torch.float64)
    for loss_fn, kw in [(dpo_loss, {"beta": 0.1}), (dpo_loss, {"label_smoothing": 0.1}), (ipo_loss, {})]:
        loss, _ = loss_fn(big, zeros, zeros, zeros, **kw)
        (g,) = torch.autograd.grad(loss, big)
        assert torch.isfinite(loss) and torch.isfinite(g).all()
    # DPO at beta*h = -1000 is ~1000 nats for that pair, ~0 for the +1000 one: mean ~500
    loss, _ = dpo_loss(big, zeros, zeros, zeros, beta=0.1)
    assert loss.item() == pytest.approx(500.0, rel=1e-9)
    loss, _ = simpo_loss(big, zeros)
    (g,) = torch.autograd.grad(loss, big)
    assert torch.isfinite(loss) and torch.isfinite(g).all()
    loss, _ = kto_loss(big, zeros, zeros, zeros, torch.tensor([True, False]))
    (g,) = torch.autograd.grad(loss, big)
    assert torch.isfinite(loss) and torch.isfinite(g).all()


# ---------------------------------------------------------------------------------------------------------- IPO


def _ipo_acceptance_batch():
    # policy chosen tokens [-1, -2, -3], rejected [-2, -2]; reference chosen [-1.5, -2, -3], rejected [-1.5, -2]
    pol = torch.tensor([[-1.0, -2.0, -3.0], [-2.0, -2.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -2.0, -3.0], [-1.5, -2.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    return pol, ref, mask


# paper-index: preference.ipo_loss
@pytest.mark.parametrize("reduction, expected", [
    # sums: chosen -6 vs ref -6.5 -> +0.5; rejected -4 vs ref -3.5 -> -0.5; h = 1; (1 - 1/(2*0.1))^2 = (1-5)^2 = 16
    ("sum", 16.0),
    # means: chosen -2 vs ref -6.5/3 = -2.1667 -> +1/6; rejected -2 vs ref -1.75 -> -1/4; h = 5/12
    # (5/12 - 5)^2 = (55/12)^2 = 3025/144 = 21.006944
    ("mean", 21.006944),
])
def test_ipo_acceptance_values_through_sequence_logprobs(reduction, expected):
    from minirl.rollout import sequence_logprobs

    pol, ref, mask = _ipo_acceptance_batch()
    p = sequence_logprobs(pol, mask, reduction=reduction)  # (2,) = [chosen, rejected]
    r = sequence_logprobs(ref, mask, reduction=reduction)
    loss, stats = ipo_loss(p[:1], p[1:], r[:1], r[1:], tau=0.1)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["target_margin"] == pytest.approx(5.0)
    assert stats["margins"] == pytest.approx(1.0 if reduction == "sum" else 5 / 12)


def test_ipo_gradient_matches_hand_formula():
    # dL/d chosen_i = 2 (h_i - 1/(2 tau)) / B; d/d rejected_i is the negative
    tau = 0.25
    chosen, rejected = t(-1.0, -4.0, -2.0, grad=True), t(-3.0, -1.0, -2.5, grad=True)
    ref_c, ref_r = t(-2.0, -1.0, -2.0), t(-2.0, -2.0, -3.0)
    loss, _ = ipo_loss(chosen, rejected, ref_c, ref_r, tau=tau)
    gc, gr = torch.autograd.grad(loss, (chosen, rejected))
    h = ((chosen - ref_c) - (rejected - ref_r)).detach()
    torch.testing.assert_close(gc, 2 * (h - 1 / (2 * tau)) / 3)
    torch.testing.assert_close(gr, -2 * (h - 1 / (2 * tau)) / 3)


def test_ipo_is_zero_at_its_target_margin():
    # h = 0.5 - (-4.5) = 5 = 1/(2*0.1) -> loss 0, gradient 0: IPO does not push the margin further
    chosen = t(0.5, grad=True)
    loss, _ = ipo_loss(chosen, t(-4.5), t(0.0), t(0.0), tau=0.1)
    (g,) = torch.autograd.grad(loss, chosen)
    assert loss.item() == 0.0 and g.item() == 0.0


# ---------------------------------------------------------------------------------------------------------- KTO


# paper-index: preference.kto_mismatched_indices
def test_kto_mismatched_indices_never_pair_an_example_with_itself():
    idx = kto_mismatched_indices(3)
    assert idx.tolist() == [1, 2, 0]  # shift by one: 0 -> 1, 1 -> 2, 2 -> 0
    assert (idx != torch.arange(3)).all()
    assert kto_mismatched_indices(2).tolist() == [1, 0]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(2, 40), seed=st.integers(0, 2**31 - 1))
def test_kto_random_mismatched_indices_are_derangements(n, seed):
    idx = kto_mismatched_indices(n, generator=seed)
    assert sorted(idx.tolist()) == list(range(n))  # a permutation: every completion used once
    assert (idx != torch.arange(n)).all()  # no fixed point
    assert torch.equal(idx, kto_mismatched_indices(n, generator=torch.Generator().manual_seed(seed)))  # seeded


@pytest.mark.parametrize("n", [0, 1, -3, 2.0, True])
def test_kto_mismatched_indices_rejects_small_n(n):
    with pytest.raises(ValueError, match="n must be"):
        kto_mismatched_indices(n)


# paper-index: preference.kto_loss
def test_kto_hand_value_two_examples():
    # r = logps - ref = [-1 - (-2), -3 - (-2)] = [1, -1]
    # z0 = max(0, mean([-2 - (-2.5), -2.5 - (-2.5)])) = max(0, (0.5 + 0) / 2) = 0.25
    # desirable:   1 - sigma(0.1 * (1 - 0.25))    = 1 - sigma(0.075) = 1 - 0.518741 = 0.481259
    # undesirable: 1 - sigma(0.1 * (0.25 - (-1))) = 1 - sigma(0.125) = 1 - 0.531209 = 0.468791
    # mean = (0.481259 + 0.468791) / 2 = 0.475025
    loss, stats = kto_loss(t(-1.0, -3.0), t(-2.0, -2.0), t(-2.0, -2.5), t(-2.5, -2.5), torch.tensor([True, False]),
                           beta=0.1)
    assert loss.item() == pytest.approx(0.475025, abs=1e-6)
    assert loss.item() == pytest.approx(((1 - sigmoid(0.075)) + (1 - sigmoid(0.125))) / 2, abs=1e-12)
    assert stats["z0"] == pytest.approx(0.25)
    assert stats["desirable_rewards"] == pytest.approx(0.1) and stats["undesirable_rewards"] == pytest.approx(-0.1)
    assert stats["accuracy"] == 1.0  # r = 1 > z0 for the desirable one, r = -1 < z0 for the other
    # lambdas weight each class: 2 * 0.4812588 and 3 * 0.4687906 -> (0.9625176 + 1.4063719) / 2 = 1.184445
    loss_w, _ = kto_loss(t(-1.0, -3.0), t(-2.0, -2.0), t(-2.0, -2.5), t(-2.5, -2.5), torch.tensor([True, False]),
                         beta=0.1, lambda_d=2.0, lambda_u=3.0)
    assert loss_w.item() == pytest.approx(1.184445, abs=1e-6)


def test_kto_z0_is_clamped_at_zero():
    # mismatched log-ratios mean = (-1 + -3) / 2 = -2 < 0 -> z0 = 0
    # desirable r = 1: 1 - sigma(0.1) = 0.475021; undesirable r = -1: 1 - sigma(0.1) = 0.475021
    loss, stats = kto_loss(t(-1.0, -3.0), t(-2.0, -2.0), t(-3.0, -4.0), t(-2.0, -1.0), torch.tensor([True, False]),
                           beta=0.1)
    assert stats["z0"] == 0.0 and stats["kl_raw"] == pytest.approx(-2.0)
    assert loss.item() == pytest.approx(1 - sigmoid(0.1), abs=1e-12)


def test_kto_z0_is_detached():
    kl_logps = t(-2.0, -2.5, grad=True)
    logps = t(-1.0, -3.0, grad=True)
    loss, _ = kto_loss(logps, t(-2.0, -2.0), kl_logps, t(-2.5, -2.5), torch.tensor([True, False]), beta=0.1)
    g_kl, g_lp = torch.autograd.grad(loss, (kl_logps, logps), allow_unused=True)
    assert g_kl is None  # no gradient flows through z0
    # the gradient on logps is then the plain one with z0 = 0.25 a constant:
    # desirable: d/dr [1 - sigma(beta (r - z0))] / B = -beta s (1 - s) / 2 with s = sigma(0.075)
    # undesirable: d/dr [1 - sigma(beta (z0 - r))] / B = +beta s (1 - s) / 2 with s = sigma(0.125)
    s1, s2 = sigmoid(0.075), sigmoid(0.125)
    torch.testing.assert_close(g_lp, t(-0.1 * s1 * (1 - s1) / 2, 0.1 * s2 * (1 - s2) / 2))


def test_kto_one_class_batch_has_finite_stats():
    loss, stats = kto_loss(t(-1.0, -2.0), t(-1.0, -2.0), t(-1.0, -2.0), t(-1.0, -2.0), torch.tensor([True, True]))
    # policy == reference: r = 0, z0 = 0 -> 1 - sigma(0) = 0.5 each
    assert loss.item() == pytest.approx(0.5)
    assert stats["undesirable_rewards"] == 0.0 and stats["n_undesirable"] == 0.0
    assert all(math.isfinite(v) for v in stats.values())


# ---------------------------------------------------------------------------------------------------------- SimPO


# paper-index: preference.simpo_loss
def test_simpo_hand_values():
    # beta = 2, gamma = 1 (absolute margin, not divided by beta)
    # pair 1: 2 * (-0.2 - (-1.2)) - 1 = 1 -> ln(1 + e^-1) = 0.313262
    # pair 2: 2 * (-0.5 - (-1.0)) - 1 = 0 -> ln 2 = 0.693147
    # mean = 0.503204
    chosen, rejected = t(-0.2, -0.5, grad=True), t(-1.2, -1.0)
    loss, stats = simpo_loss(chosen, rejected, beta=2.0, gamma=1.0)
    assert loss.item() == pytest.approx((0.313262 + 0.693147) / 2, abs=1e-6)
    # rewards beta * mean log-prob: chosen (2*-0.2 + 2*-0.5)/2 = -0.7; rejected (2*-1.2 + 2*-1.0)/2 = -2.2
    assert stats == pytest.approx({"chosen_rewards": -0.7, "rejected_rewards": -2.2, "margins": 1.5,
                                   "accuracy": 1.0})
    # gradient: d/d chosen_i = -beta * sigma(-(beta * delta_i - gamma)) / B = -2 * sigma(-1) / 2, -2 * sigma(0) / 2
    (g,) = torch.autograd.grad(loss, chosen)
    torch.testing.assert_close(g, t(-sigmoid(-1.0), -0.5))


def test_simpo_needs_no_reference_and_gamma_shifts_the_margin():
    # gamma = 0: equal mean log-probs give ln 2; gamma = 1 then asks for more: ln(1 + e^1) = 1.313262
    c = t(-1.0)
    assert simpo_loss(c, c.clone(), gamma=0.0)[0].item() == pytest.approx(LN2)
    assert simpo_loss(c, c.clone(), gamma=1.0)[0].item() == pytest.approx(math.log(1 + math.e))


# ---------------------------------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("call, match", [
    (lambda: dpo_loss(t(1.0, 2.0), t(1.0), t(1.0, 2.0), t(1.0, 2.0)), "rejected_logps"),
    (lambda: dpo_loss(torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1)), "chosen_logps"),
    (lambda: dpo_loss(t(1.0), t(1.0), t(1.0), torch.zeros(1, 1)), "ref_rejected_logps"),
    (lambda: dpo_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0)), "chosen_logps is empty"),
    (lambda: dpo_loss(torch.zeros(2, dtype=torch.long), t(1.0, 1.0), t(1.0, 1.0), t(1.0, 1.0)), "chosen_logps"),
    (lambda: dpo_loss(t(1.0), t(1.0), t(1.0), t(1.0), beta=0.0), "beta"),
    (lambda: dpo_loss(t(1.0), t(1.0), t(1.0), t(1.0), label_smoothing=0.5), "label_smoothing"),
    (lambda: dpo_loss(t(1.0), t(1.0), t(1.0), t(1.0), label_smoothing=-0.1), "label_smoothing"),
    (lambda: ipo_loss(t(1.0), t(1.0), t(1.0, 2.0), t(1.0)), "ref_chosen_logps"),
    (lambda: ipo_loss(t(1.0), t(1.0), t(1.0), t(1.0), tau=-1.0), "tau"),
    (lambda: ipo_loss(t(1.0), t(1.0), t(1.0), t(1.0), tau=float("nan")), "tau"),
    (lambda: kto_loss(t(1.0, 2.0), t(1.0, 2.0), t(1.0), t(1.0, 2.0), torch.tensor([True, False])), "kl_logps"),
    (lambda: kto_loss(t(1.0, 2.0), t(1.0, 2.0), t(1.0, 2.0), t(1.0, 2.0), t(1.0, 0.0)), "desirable"),
    (lambda: kto_loss(t(1.0, 2.0), t(1.0, 2.0), t(1.0, 2.0), t(1.0, 2.0), torch.tensor([True])), "desirable"),
    (lambda: kto_loss(t(1.0), t(1.0), t(1.0), t(1.0), torch.tensor([True]), lambda_u=0.0), "lambda_u"),
    (lambda: kto_loss(t(1.0), t(1.0), t(1.0), t(1.0), torch.tensor([True]), beta=-1.0), "beta"),
    (lambda: simpo_loss(t(1.0, 2.0), t(1.0, 2.0, 3.0)), "rejected_logps"),
    (lambda: simpo_loss(t(1.0), t(1.0), gamma=-0.5), "gamma"),
    (lambda: simpo_loss([1.0], t(1.0)), "chosen_logps"),
])
def test_bad_inputs_raise_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- DPO at an extreme margin: the course checker's hand value (minirl/exercises) -------------------------------------
def test_dpo_extreme_margin_hand_value():
    # the checker's hand value: beta * h = 0.2 * ((-1000 + 10) - (-10 + 10)) = -198 -> -log sigmoid(-198) = 198
    loss, _ = preference.dpo_loss(torch.tensor([-1000.0]), torch.tensor([-10.0]), torch.tensor([-10.0]),
                                  torch.tensor([-10.0]), beta=0.2)
    assert math.isclose(loss.item(), 198.0, rel_tol=1e-6)
