"""The exact policy-gradient toy: its enumeration against brute force, and the bias facts it shows, derived."""

import itertools
import math

import pytest
import torch

from minirl import pg_toy

# an easy prompt (p = e^1.5 / (e^1.5 + 2) = 0.691) and a hard one (p = e^-1 / (e^-1 + 2 e^0.5) = 0.100)
LOGITS = torch.tensor([[1.5, 0.0, 0.0], [-1.0, 0.5, 0.5]], dtype=torch.float64)
REWARDED = torch.tensor([[1, 0, 0], [1, 0, 0]])
GROUP_SIZES = (2, 4, 8, 16)
# The sums are exact; minirl computes advantages in float32, so "exactly" means to float32's round-off (~1e-7).
F32 = dict(rtol=1e-6, atol=1e-12)


def brute_force(fn, logits, rewarded, group_size):
    """Every one of the K^(M G) arm sequences, its probability, and g by autograd of sum A log pi / (M G)."""
    M, K = logits.shape
    log_pi = logits.log_softmax(-1)
    mean, second = torch.zeros(M, K, dtype=torch.float64), 0.0
    for arms in itertools.product(range(K), repeat=M * group_size):
        a = torch.tensor(arms).view(M, group_size)
        rewards = rewarded.double().gather(1, a).flatten()  # (M G,) group by group
        adv = fn(rewards, group_size).double().view(M, group_size)
        theta = logits.clone().requires_grad_(True)
        logp = theta.log_softmax(-1).gather(1, a)  # (M, G)
        (g,) = torch.autograd.grad((adv * logp).sum() / (M * group_size), theta)
        prob = float(log_pi.gather(1, a).sum().exp())
        mean += prob * g
        second += prob * float((g**2).sum())
    return mean, second - float((mean**2).sum())


# paper-index: pg_toy.estimator_moments
@pytest.mark.parametrize("name", list(pg_toy.ESTIMATORS))
@pytest.mark.parametrize("group_size", [2, 3])
def test_pattern_enumeration_equals_brute_force_over_every_arm_sequence(name, group_size):
    fn = pg_toy.ESTIMATORS[name]
    m = pg_toy.estimator_moments(fn, LOGITS, REWARDED, group_size=group_size)
    mean, cov_trace = brute_force(fn, LOGITS, REWARDED, group_size)  # 3^4 = 81 and 3^6 = 729 sequences
    torch.testing.assert_close(m["mean"], mean, atol=1e-12, rtol=0)
    assert m["cov_trace"] == pytest.approx(cov_trace, abs=1e-12)


# paper-index: pg_toy.true_gradient
def test_true_gradient_is_the_score_function_closed_form():
    pi = LOGITS.softmax(-1)
    p = pg_toy.success_probability(LOGITS, REWARDED)
    expected = pi * (REWARDED - p[:, None]) / 2  # pi (R - p) / M
    torch.testing.assert_close(pg_toy.true_gradient(LOGITS, REWARDED), expected, atol=1e-15, rtol=0)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_no_baseline_and_rloo_are_exactly_unbiased(group_size):
    for name in ("no baseline", "leave-one-out (RLOO)"):
        m = pg_toy.estimator_moments(pg_toy.ESTIMATORS[name], LOGITS, REWARDED, group_size=group_size)
        torch.testing.assert_close(m["mean"], m["true"], **F32)


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_group_mean_is_biased_by_exactly_g_minus_1_over_g(group_size):
    # E[(r_i - mean) score_i] = E[r_i score_i] - (1/G) E[r_i score_i] - (1/G) sum_{j != i} E[r_j] E[score_i]
    # and E[score_i] = 0: the expected gradient is (1 - 1/G) grad J, a pure scale
    m = pg_toy.estimator_moments(pg_toy.ESTIMATORS["group mean (Dr. GRPO)"], LOGITS, REWARDED,
                                 group_size=group_size)
    torch.testing.assert_close(m["mean"], (group_size - 1) / group_size * m["true"], **F32)
    # RLOO = G/(G-1) x group mean: the same estimator up to scale, so the same signal-to-noise ratio
    rloo = pg_toy.estimator_moments(pg_toy.ESTIMATORS["leave-one-out (RLOO)"], LOGITS, REWARDED,
                                    group_size=group_size)
    assert rloo["cov_trace"] == pytest.approx(m["cov_trace"] * (group_size / (group_size - 1)) ** 2, rel=1e-6)


def grpo_scale_by_hand(p, G, eps=1e-4):
    """c = E[s (1-p) a1(s) - (G-s) p a0(s)] / (G p (1-p)), s ~ Binomial(G, p), with GRPO's a1, a0."""
    total = 0.0
    for s in range(1, G):  # s = 0 or G: an equal group, advantage 0
        std = math.sqrt(s * (G - s) / (G * (G - 1)))  # unbiased std of s ones and G - s zeros
        a1, a0 = (1 - s / G) / (std + eps), -(s / G) / (std + eps)
        total += math.comb(G, s) * p**s * (1 - p) ** (G - s) * (s * (1 - p) * a1 - (G - s) * p * a0)
    return total / (G * p * (1 - p))


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_grpo_scales_each_prompt_by_its_own_factor(group_size):
    m = pg_toy.estimator_moments(pg_toy.ESTIMATORS["group mean/std (GRPO)"], LOGITS, REWARDED,
                                 group_size=group_size)
    p = pg_toy.success_probability(LOGITS, REWARDED).tolist()
    expected = [grpo_scale_by_hand(px, group_size) for px in p]
    torch.testing.assert_close(m["scale"], torch.tensor(expected, dtype=torch.float64), **F32)
    # E[g_x] is c_x grad_x J in every prompt (the scale is the whole story within a prompt)
    torch.testing.assert_close(m["mean"], m["scale"][:, None] * m["true"], atol=1e-13, rtol=0)
    if group_size >= 4:  # G = 2: A = +-1/sqrt(2) whenever the pair differs, the same factor for every p
        assert m["scale"][1] > 1.02 * m["scale"][0]  # the hard prompt (p = 0.10) weighs more than the easy one


def test_a_batch_mean_baseline_is_biased_by_one_over_the_batch():
    # REINFORCE++ without the std: r_i - mean over all M G rewards; only r_i's own share (1 / (M G)) biases it
    centred = lambda r, group_size: r - r.mean()
    for G in GROUP_SIZES:
        m = pg_toy.estimator_moments(centred, LOGITS, REWARDED, group_size=G)
        torch.testing.assert_close(m["mean"], (1 - 1 / (2 * G)) * m["true"], **F32)


# paper-index: pg_toy.bias_variance_table
def test_the_table_orders_direction_bias_grpo_above_reinforce_pp():
    rows = {(r["estimator"], r["G"]): r for r in pg_toy.bias_variance_table(LOGITS, REWARDED)}
    for G in (4, 8, 16):
        grpo, rpp = rows["group mean/std (GRPO)", G], rows["batch norm (REINFORCE++)", G]
        assert rpp["angle"] < grpo["angle"]  # batch statistics weigh the two prompts nearly alike
        for unbiased in ("no baseline", "leave-one-out (RLOO)", "group mean (Dr. GRPO)"):
            assert rows[unbiased, G]["angle"] < 1e-4  # no direction bias (group mean: scale only)
    # variance falls as 1/G for the no-baseline estimator: tr Cov(G) = tr Cov(1) / G
    assert rows["no baseline", 16]["cov_trace"] == pytest.approx(rows["no baseline", 2]["cov_trace"] / 8, rel=1e-12)


def test_a_baseline_makes_the_estimate_independent_of_a_reward_offset():
    for name, fn in pg_toy.ESTIMATORS.items():
        base = pg_toy.estimator_moments(fn, LOGITS, REWARDED, group_size=4)
        # every completion gets +1 (e.g. a format bonus)
        moved = pg_toy.estimator_moments(pg_toy.with_offset(fn, 1.0), LOGITS, REWARDED, group_size=4)
        torch.testing.assert_close(moved["mean"], base["mean"], **F32)  # the same expectation, offset or not
        if name == "no baseline":
            assert moved["cov_trace"] > 2 * base["cov_trace"]  # the offset is pure noise without a baseline
        else:
            assert moved["cov_trace"] == pytest.approx(base["cov_trace"], rel=1e-6)


def test_bad_bandits_are_named():
    with pytest.raises(ValueError, match="0 < p < 1"):
        pg_toy.estimator_moments(pg_toy.ESTIMATORS["no baseline"], LOGITS, torch.ones(2, 3), group_size=2)
    with pytest.raises(ValueError, match=r"logits must have shape \(M, K\)"):
        pg_toy.estimator_moments(pg_toy.ESTIMATORS["no baseline"], LOGITS[0], REWARDED[0], group_size=2)
