"""MaxRL's advantage (minirl.advantages.maxrl_advantages): hand values, edge cases, and its exact expected gradient on
the policy-gradient bandit (minirl.pg_toy), the gradient of log p truncated at order G - 1."""

import pytest
import torch

from minirl import pg_toy
from minirl.advantages import group_advantages, maxrl_advantages


# paper-index: advantages.maxrl_advantages
def test_maxrl_by_hand():
    # [1, 0, 0, 0]: mean 0.25 -> (r - 0.25) / 0.25 = [3, -1, -1, -1]; [1, 1, 0, 0]: mean 0.5 -> [1, 1, -1, -1]
    got = maxrl_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]), group_size=4)
    assert got.tolist() == [3.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, -1.0]
    # against GRPO's std on the hard prompt: 1.4997 for the success, MaxRL twice that
    assert float(group_advantages(torch.tensor([1.0, 0, 0, 0]), 4)[0]) == pytest.approx(1.4997, abs=1e-4)


def test_groups_without_a_spread_get_zero_never_nan():
    got = maxrl_advantages(torch.tensor([0.0, 0, 0, 1, 1, 1]), group_size=3)
    assert got.tolist() == [0.0] * 6


def test_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match="0/1 rewards"):
        maxrl_advantages(torch.tensor([0.5, 0.0]), group_size=2)
    with pytest.raises(ValueError, match="0/1 rewards"):
        maxrl_advantages(torch.tensor([float("nan"), 0.0]), group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        maxrl_advantages(torch.tensor([1.0, 0.0]), group_size=1)
    with pytest.raises(ValueError, match="multiple"):
        maxrl_advantages(torch.tensor([1.0, 0.0, 1.0]), group_size=2)


def maxrl(rewards, group_size):
    return maxrl_advantages(rewards, group_size=group_size)


@pytest.mark.parametrize("group_size", [2, 3, 4, 6])
def test_the_expected_gradient_is_the_truncated_log_likelihoods(group_size):
    # two prompts, one easy and one hard; E[g_x] = c_x grad p_x / M, and c_x = (1 - (1 - p_x)^(G-1)) / p_x: the
    # derivative of J_{G-1}(p) = -sum_{k=1}^{G-1} (1 - p)^k / k, the first G - 1 terms of log p
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [-2.5, 0.3, 0.8, 0.0]])
    rewarded = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 0]])
    p = pg_toy.success_probability(logits, rewarded)  # about 0.69 and 0.02
    moments = pg_toy.estimator_moments(maxrl, logits, rewarded, group_size=group_size)
    expected = (1 - (1 - p) ** (group_size - 1)) / p
    assert torch.allclose(moments["scale"], expected, rtol=1e-6)
    # and the mean is that scale times the true gradient, entry by entry (no other direction)
    assert torch.allclose(moments["mean"], expected[:, None] * moments["true"], atol=1e-9)
    # by autograd of J_{G-1}: its gradient in the logits is the same
    theta = logits.double().requires_grad_(True)
    q = 1 - pg_toy.success_probability(theta, rewarded)
    J = -sum(q**k / k for k in range(1, group_size)).mean()
    (grad,) = torch.autograd.grad(J, theta)
    assert torch.allclose(moments["mean"], grad, atol=1e-9)
