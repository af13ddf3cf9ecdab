"""Tests of minirl.advantages.group_advantages: hand-worked values, equal-reward groups, bad input."""


import math
from functools import partial

import helpers
import pytest
import torch

from minirl.advantages import group_advantages

close = partial(helpers.close, atol=5e-5)  # the 4 decimals the expectations are written with


# --- the example -------------------------------------------------------------------------------------------
# paper-index: advantages.group_advantages
def test_one_right_of_four_unbiased_std():
    # mean 0.25; centred [0.75, -0.25, -0.25, -0.25]
    # unbiased var = (0.75^2 + 3 * 0.25^2) / (4 - 1) = (0.5625 + 0.1875) / 3 = 0.25 -> std 0.5; + eps 1e-4 = 0.5001
    # A = [0.75 / 0.5001, -0.25 / 0.5001, ...] = [1.49970, -0.49990, -0.49990, -0.49990]
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, eps=1e-4)
    close(a, [1.4997, -0.4999, -0.4999, -0.4999])
    assert a.shape == (4,)


def test_identical_rewards_give_exact_zeros():
    a = group_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0]), 4)
    assert torch.equal(a, torch.zeros(4))  # exactly 0, not 1e-9
    # eps = 0 would make a naive (r - mean) / (std + eps) = 0 / 0 = NaN
    a0 = group_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0]), 4, eps=0.0)
    assert torch.equal(a0, torch.zeros(4))


@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3, 1e-8, 123.456])
@pytest.mark.parametrize("group_size", [3, 5, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_rewards_with_round_off_std_are_zero_not_huge(value, group_size, dtype):
    # e.g. float32 [0.1] * 7: the mean is not exactly 0.1, and torch's std is 8e-9 rather than 0, so a naive
    # (r - mean) / (std + 0) would give ~ +-1 or NaN from pure round-off. The group carries no signal: A = 0.
    r = torch.full((2 * group_size,), value, dtype=dtype)
    for scale in ("group", "batch", "none"):
        a = group_advantages(r, group_size, scale=scale, eps=0.0)
        assert torch.equal(a, torch.zeros_like(a)), (scale, a)


def test_equal_group_next_to_a_mixed_group():
    # group 0 = [1, 1] (no signal) -> [0, 0]; group 1 = [1, 0]: mean 0.5, centred [0.5, -0.5],
    # unbiased std sqrt((0.25 + 0.25) / 1) = 0.707107; eps 0 -> [0.707107, -0.707107]
    a = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0]), 2, eps=0.0)
    close(a, [0.0, 0.0, 0.707107, -0.707107], atol=5e-7)
    assert a[0] == 0 and a[1] == 0


def test_advantages_sum_to_zero_per_group():
    torch.manual_seed(0)
    r = torch.rand(24)
    a = group_advantages(r, 6).view(4, 6)
    close(a.sum(1), [0.0] * 4, atol=1e-5)


def test_scale_none_batch_group_by_hand():
    # rewards [1, 0 | 5, 5], G = 2.
    # centred: group 0 mean 0.5 -> [0.5, -0.5]; group 1 equal -> [0, 0]
    r = torch.tensor([1.0, 0.0, 5.0, 5.0])
    # "none" (Dr. GRPO): just the centred rewards
    close(group_advantages(r, 2, scale="none"), [0.5, -0.5, 0.0, 0.0], atol=1e-7)
    # "group": std of [1, 0] = sqrt(0.5^2 + 0.5^2) / sqrt(1) = 0.707107 -> 0.5 / 0.707107 = 0.707107
    close(group_advantages(r, 2, scale="group", eps=0.0), [0.707107, -0.707107, 0.0, 0.0], atol=5e-7)
    # "batch": std of all four rewards. mean 11/4 = 2.75; deviations -1.75, -2.75, 2.25, 2.25;
    # squares 3.0625 + 7.5625 + 5.0625 + 5.0625 = 20.75; / 3 = 6.916667; sqrt = 2.629956
    # -> 0.5 / 2.629956 = 0.190117
    close(group_advantages(r, 2, scale="batch", eps=0.0), [0.190117, -0.190117, 0.0, 0.0], atol=5e-7)
    # with eps 1e-4 the batch std is 2.630056: 0.5 / 2.630056 = 0.190110
    close(group_advantages(r, 2, scale="batch", eps=1e-4), [0.190110, -0.190110, 0.0, 0.0], atol=5e-7)


def test_group_of_one_has_no_baseline():
    # with G = 1 every group is "all equal": 0, never NaN (std of one sample is undefined)
    a = group_advantages(torch.tensor([1.0, 0.0, 3.0]), 1)
    assert torch.equal(a, torch.zeros(3))


def test_result_is_float_for_integer_rewards():
    a = group_advantages(torch.tensor([1, 0, 0, 0]), 4)
    assert a.dtype.is_floating_point
    close(a, [1.4997, -0.4999, -0.4999, -0.4999])


# --- bad input -----------------------------------------------------------------------------------------------------
def test_batch_not_divisible_by_group_size():
    with pytest.raises(ValueError, match="group_size"):
        group_advantages(torch.zeros(6), 4)


def test_unknown_scale_is_named():
    with pytest.raises(ValueError, match="scale.*'std'"):
        group_advantages(torch.zeros(4), 2, scale="std")


def test_rewards_must_be_1d():
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(torch.zeros(2, 4), 4)


# --- RLOO, REINFORCE++ and REINFORCE++ with a group baseline ------------------------------------------------------
# paper-index: advantages.rloo_advantages
def test_rloo_by_hand():
    from minirl.advantages import rloo_advantages

    # A_i = r_i - mean of the other three: 1 - (0+0+0)/3 = 1; 0 - (1+0+0)/3 = -1/3
    a = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4)
    close(a, [1.0, -1 / 3, -1 / 3, -1 / 3])
    # graded rewards [2, 0, 1]: 2 - (0+1)/2 = 1.5; 0 - (2+1)/2 = -1.5; 1 - (2+0)/2 = 0
    close(rloo_advantages(torch.tensor([2.0, 0.0, 1.0]), group_size=3), [1.5, -1.5, 0.0])
    # = G/(G-1) times the group-centred rewards (Dr. GRPO's advantages)
    r = torch.tensor([0.3, 1.0, 0.0, 0.7, 0.2, 0.2])
    close(rloo_advantages(r, group_size=3), 1.5 * group_advantages(r, group_size=3, scale="none"))


# paper-index: advantages.reinforce_pp_advantages
def test_reinforce_pp_by_hand():
    from minirl.advantages import reinforce_pp_advantages

    # batch mean 0.25, unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5; / (0.5 + 1e-4) = 0.5001
    close(reinforce_pp_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), eps=1e-4), [1.4997, -0.4999, -0.4999, -0.4999])
    # no groups: [1, 1 | 0, 0] (two equal "groups") still gets +-: mean 0.5, std sqrt(4 * 0.25 / 3) = 0.57735
    close(reinforce_pp_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), eps=0.0), [0.8660, 0.8660, -0.8660, -0.8660])


# paper-index: advantages.reinforce_pp_baseline_advantages
def test_reinforce_pp_baseline_by_hand():
    from minirl.advantages import reinforce_pp_baseline_advantages

    # c = [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0]; std_B(c) = sqrt((0.5625 + 3 * 0.0625) / 7) = 0.32733 (+ 1e-4)
    a = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1]), group_size=4, eps=1e-4)
    close(a, [0.75 / 0.32743, -0.25 / 0.32743, -0.25 / 0.32743, -0.25 / 0.32743, 0, 0, 0, 0])
    assert torch.equal(a[4:], torch.zeros(4))  # the equal group keeps exactly 0
    # not GRPO's scale="batch" (TRL's scale_rewards="batch"): that divides by the std of the RAW rewards,
    # sqrt((3 * 0.390625 + 5 * 0.140625) / 7) = 0.51755 here
    grpo_batch = group_advantages(torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1]), 4, scale="batch", eps=1e-4)
    close(grpo_batch[:1], [0.75 / 0.51765])


@pytest.mark.parametrize("eps", [1e-4, 0.0])
def test_new_estimators_give_exact_zeros_where_there_is_no_signal(eps):
    from minirl.advantages import reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages

    equal = torch.full((8,), 0.1)  # 0.1 is not exact in binary: a naive mean leaves round-off
    assert torch.equal(rloo_advantages(equal, group_size=4), torch.zeros(8))
    assert torch.equal(reinforce_pp_advantages(equal, eps=eps), torch.zeros(8))
    assert torch.equal(reinforce_pp_baseline_advantages(equal, group_size=4, eps=eps), torch.zeros(8))
    assert torch.equal(reinforce_pp_advantages(torch.tensor([3.0]), eps=eps), torch.zeros(1))  # a batch of one
    # an equal group beside a mixed one: 0 under RLOO and the group-baseline form, not under plain REINFORCE++
    mixed = torch.tensor([1.0, 0.0, 0.1, 0.1])
    assert torch.equal(rloo_advantages(mixed, group_size=2)[2:], torch.zeros(2))
    assert torch.equal(reinforce_pp_baseline_advantages(mixed, group_size=2, eps=eps)[2:], torch.zeros(2))
    assert (reinforce_pp_advantages(mixed, eps=eps)[2:] != 0).all()


def test_new_estimators_reject_bad_input_by_name():
    from minirl.advantages import reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages

    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.ones(4), group_size=1)
    with pytest.raises(ValueError, match="group_size >= 2"):
        reinforce_pp_baseline_advantages(torch.ones(4), group_size=1)
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        rloo_advantages(torch.ones(6), group_size=4)
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        reinforce_pp_baseline_advantages(torch.ones(6), group_size=4)
    for bad in (float("inf"), -float("inf")):  # NaN is an unscored row: see test_unscored_rows_get_zero_...
        r = torch.tensor([1.0, 0.0, bad, 0.0])
        with pytest.raises(ValueError, match="rewards must be finite .* row 2"):
            rloo_advantages(r, group_size=2)
        with pytest.raises(ValueError, match="rewards must be finite"):
            reinforce_pp_advantages(r)
        with pytest.raises(ValueError, match="rewards must be finite"):
            reinforce_pp_baseline_advantages(r, group_size=2)
    with pytest.raises(ValueError, match=r"rewards must have shape \(B,\)"):
        rloo_advantages(torch.ones(2, 2), group_size=2)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        reinforce_pp_advantages(torch.ones(2), eps=-1.0)
    with pytest.raises(TypeError):  # settings are keyword-only
        rloo_advantages(torch.ones(4), 2)


# paper-index: advantages.rloo_advantages advantages.reinforce_pp_advantages advantages.reinforce_pp_baseline_advantages
def test_unscored_rows_get_zero_and_leave_the_baselines_of_their_siblings():
    """An unscored row (NaN: every reward function returned None) is left out of every mean and std and gets 0, as
    TRL's RLOOTrainer does, instead of raising in the middle of train_rl (issue 35, defect 4)."""
    from minirl.advantages import reinforce_pp_advantages, reinforce_pp_baseline_advantages, rloo_advantages

    nan = float("nan")
    # RLOO, group [1, 0, NaN, 0]: A_0 = 1 - (0 + 0) / 2 = 1, A_1 = A_3 = 0 - (1 + 0) / 2 = -0.5, A_2 = 0;
    # group [1, NaN, NaN, NaN]: one scored row, no baseline: 0
    a = rloo_advantages(torch.tensor([1.0, 0.0, nan, 0.0, 1.0, nan, nan, nan]), group_size=4)
    close(a, [1.0, -0.5, 0.0, -0.5, 0.0, 0.0, 0.0, 0.0])
    assert a[2] == 0.0 and (a[4:] == 0.0).all()  # exactly 0, not a round-off of 0
    # REINFORCE++, [1, 0, NaN, 0]: scored [1, 0, 0], mean 1/3, std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3) = 0.57735
    a = reinforce_pp_advantages(torch.tensor([1.0, 0.0, nan, 0.0]), eps=0.0)
    close(a, [(2 / 3) / math.sqrt(1 / 3), (-1 / 3) / math.sqrt(1 / 3), 0.0, (-1 / 3) / math.sqrt(1 / 3)])
    assert a[2] == 0.0
    # REINFORCE++ w/ baseline, [1, 0, NaN, 0 | 1, 1, 0, NaN]: c = [2/3, -1/3, 0, -1/3 | 1/3, 1/3, -2/3, 0];
    # std over the 6 scored c (mean 0): sqrt((4/9 + 1/9 + 1/9 + 1/9 + 1/9 + 4/9) / 5) = sqrt(4/15)
    a = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0, nan, 0, 1, 1, 0, nan]), group_size=4, eps=0.0)
    s = math.sqrt(4 / 15)
    close(a, [2 / 3 / s, -1 / 3 / s, 0.0, -1 / 3 / s, 1 / 3 / s, 1 / 3 / s, -2 / 3 / s, 0.0])
    assert a[2] == 0.0 and a[7] == 0.0
    # every row unscored: all zero, never NaN
    for fn in (partial(rloo_advantages, group_size=2), reinforce_pp_advantages,
               partial(reinforce_pp_baseline_advantages, group_size=2)):
        assert torch.equal(fn(torch.full((4,), nan)), torch.zeros(4))
