"""Tests of minirl.advantages: group-relative advantages (GRPO, Dr. GRPO, RLOO, REINFORCE++) with hand-worked values,
equal-reward groups, unscored rows and bad input; GAE and whitening; the KL penalty to go; explained variance."""

import itertools
import math
from functools import partial

import helpers
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl import advantages, kl, kl_toy, losses
from minirl.advantages import group_advantages

close = partial(helpers.close, atol=5e-5)  # the 4 decimals the expectations are written with
close_5e7 = partial(helpers.close, atol=5e-7)  # GAE's and whitening's: 6 decimals
D = torch.float64


def t(*rows):
    return torch.tensor(rows, dtype=D)


# --- the issue's example -------------------------------------------------------------------------------------------
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


# ------------------------------------------------------------------------------------------------------ GAE
# The issue's example: rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 1, lam 0.95, value after the end 0.
# deltas: d2 = 1 + 0 - 0.7 = 0.3; d1 = 0 + 0.7 - 0.6 = 0.1; d0 = 0 + 0.6 - 0.5 = 0.1
# A2 = 0.3; A1 = 0.1 + 0.95 * 0.3 = 0.385; A0 = 0.1 + 0.95 * 0.385 = 0.46575
# returns = A + V = [0.96575, 0.985, 1.0]
ADV = [0.46575, 0.385, 0.3]
RET = [0.96575, 0.985, 1.0]


# paper-index: advantages.gae
def test_gae_issue_example_full_mask():
    a, r = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=0.95)
    close_5e7(a, [ADV])
    close_5e7(r, [RET])


def test_gae_padded_row_matches_on_prefix_and_never_reads_padding():
    # garbage rewards and values in the padded positions must not leak into the valid prefix
    rewards_ = t([0, 0, 1, 5.0, -7.0], [0, 0, 1, 0, 0])
    values = t([0.5, 0.6, 0.7, 123.0, -99.0], [0.5, 0.6, 0.7, 0.8, 0.9])
    mask = t([1, 1, 1, 0, 0], [1, 1, 1, 1, 1])
    a, r = advantages.gae(rewards_, values, mask, gamma=1.0, lam=0.95)
    close_5e7(a[0], ADV + [0.0, 0.0])
    close_5e7(r[0], RET + [0.0, 0.0])
    # the full row is a different episode: it ends two tokens later, so its numbers differ
    assert not torch.allclose(a[1, :3], a[0, :3])


def test_gae_refuses_a_mask_that_is_not_a_prefix():
    # mask [1, 0, 1] has no single end: the loop used to give A = [0, 0, 1] silently (the first token saw next
    # value 0 and next advantage 0 from the hole, the last one r - V = 1 - 0). Now an error naming the mask.
    with pytest.raises(ValueError, match=r"mask must be a prefix of ones.*row 1 is \[1\.0, 0\.0, 1\.0\]"):
        advantages.gae(t([0, 0, 1], [0, 0, 1]), t([0, 0, 0], [0, 0, 0]), t([1, 1, 1], [1, 0, 1]))
    with pytest.raises(ValueError, match="mask must be a prefix"):
        advantages.gae(t([0, 0, 1]), t([0, 0, 0]), torch.tensor([[False, True, True]]))
    # prefixes of any length pass, the empty one included: [1, 1, 0] and [0, 0, 0]
    a, _ = advantages.gae(t([0, 1, 9], [9, 9, 9]), t([0, 0, 9], [9, 9, 9]), t([1, 1, 0], [0, 0, 0]))
    close_5e7(a, [[0.95, 1.0, 0.0], [0.0, 0.0, 0.0]])  # A_1 = 1 - 0; A_0 = 0 + 0 - 0 + 0.95 * 1 = 0.95


def test_gae_padding_as_bool_mask_and_fully_masked_row():
    a, r = advantages.gae(t([1, 1, 1]), t([3, 3, 3]), torch.tensor([[False, False, False]]))
    close_5e7(a, [[0.0, 0.0, 0.0]])
    close_5e7(r, [[0.0, 0.0, 0.0]])


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    # lam = 1: the deltas telescope, A_t = G_t - V_t with G_t = sum_k gamma^k r_{t+k}.
    # gamma 1: G = [1, 1, 1] -> A = [0.5, 0.4, 0.3], returns = G = [1, 1, 1]
    a, r = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=1.0)
    close_5e7(a, [[0.5, 0.4, 0.3]])
    close_5e7(r, [[1.0, 1.0, 1.0]])
    # gamma 0.9: G = [0.81, 0.9, 1] -> A = [0.31, 0.3, 0.3]
    a, r = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=0.9, lam=1.0)
    close_5e7(a, [[0.31, 0.3, 0.3]])
    close_5e7(r, [[0.81, 0.9, 1.0]])


def test_gae_lambda_zero_is_one_step_td():
    # lam = 0: A_t = delta_t = r_t + gamma V_{t+1} - V_t = [0.1, 0.1, 0.3]; returns = r_t + gamma V_{t+1}
    a, r = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=0.0)
    close_5e7(a, [[0.1, 0.1, 0.3]])
    close_5e7(r, [[0.6, 0.7, 1.0]])


def test_gae_with_discount():
    # gamma 0.9, lam 0.95 (gamma * lam = 0.855):
    # d2 = 1 - 0.7 = 0.3; d1 = 0.9 * 0.7 - 0.6 = 0.03; d0 = 0.9 * 0.6 - 0.5 = 0.04
    # A2 = 0.3; A1 = 0.03 + 0.855 * 0.3 = 0.2865; A0 = 0.04 + 0.855 * 0.2865 = 0.2849575
    a, _ = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=0.9, lam=0.95)
    close_5e7(a, [[0.2849575, 0.2865, 0.3]])


def test_gae_does_not_backpropagate_into_the_critic():
    values = t([0.5, 0.6, 0.7]).requires_grad_(True)
    a, r = advantages.gae(t([0, 0, 1]), values, t([1, 1, 1]))
    assert not a.requires_grad and not r.requires_grad  # the critic learns from value_loss only


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(0, 4), st.floats(0, 1), st.floats(0, 1), st.integers(0, 10_000))
def test_gae_padding_never_changes_the_valid_prefix(n_valid, n_pad, gamma, lam, seed):
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(1, n_valid, generator=g, dtype=D), torch.randn(1, n_valid, generator=g, dtype=D)
    a_short, ret_short = advantages.gae(r, v, torch.ones_like(r), gamma=gamma, lam=lam)
    junk = 100 * torch.randn(1, n_pad, generator=g, dtype=D)
    mask = torch.cat([torch.ones_like(r), torch.zeros_like(junk)], 1)
    a_long, ret_long = advantages.gae(torch.cat([r, junk], 1), torch.cat([v, -junk], 1), mask, gamma=gamma, lam=lam)
    close_5e7(a_long[:, :n_valid], a_short, atol=1e-10)
    close_5e7(ret_long[:, :n_valid], ret_short, atol=1e-10)
    assert (a_long[:, n_valid:] == 0).all() and (ret_long[:, n_valid:] == 0).all()


def test_gae_bad_inputs_raise_naming_the_argument():
    with pytest.raises(ValueError, match="values"):
        advantages.gae(t([0, 0, 1]), t([0.5, 0.6]), t([1, 1, 1]))
    with pytest.raises(ValueError, match="mask"):
        advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1]))
    with pytest.raises(ValueError, match="rewards"):
        advantages.gae(torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="gamma"):
        advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.5)
    with pytest.raises(ValueError, match="lam"):
        advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), lam=-0.1)


# ------------------------------------------------------------------------------------------------------ whiten
# paper-index: advantages.whiten
def test_whiten_hand_example_ignores_padding():
    # valid x = [1, 3, 5]: mean 3, unbiased var (4 + 0 + 4) / 2 = 4, std 2 -> [-1, 0, 1]; padding -> 0
    x, mask = t([1, 3, 50.0], [5, -80.0, 9.0]), t([1, 1, 0], [1, 0, 0])
    close_5e7(advantages.whiten(x, mask), [[-1, 0, 0], [1, 0, 0]], atol=1e-6)
    # shift_mean=False keeps the mean: [-1, 0, 1] + 3 = [2, 3, 4]
    close_5e7(advantages.whiten(x, mask, shift_mean=False), [[2, 3, 0], [4, 0, 0]], atol=1e-6)


def test_whiten_random_moments_over_valid_entries():
    g = torch.Generator().manual_seed(0)
    x = 3 + 2 * torch.randn(6, 10, generator=g, dtype=D)
    mask = (torch.arange(10) < torch.tensor([10, 7, 3, 1, 9, 5]).unsqueeze(1)).to(D)
    valid = mask > 0
    w = advantages.whiten(x, mask)
    assert abs(float(w[valid].mean())) < 1e-9 and abs(float(w[valid].var()) - 1) < 1e-6
    assert (w[~valid] == 0).all()
    w = advantages.whiten(x, mask, shift_mean=False)
    assert abs(float(w[valid].mean() - x[valid].mean())) < 1e-9 and abs(float(w[valid].var()) - 1) < 1e-6


def test_whiten_degenerate_masks():
    x = t([4.0, 2.0])
    close_5e7(advantages.whiten(x, t([0, 0])), [[0.0, 0.0]])  # nothing valid
    close_5e7(advantages.whiten(x, t([1, 0])), [[0.0, 0.0]])  # one entry: centred, no variance to divide by
    close_5e7(advantages.whiten(x, t([1, 0]), shift_mean=False), [[4.0, 0.0]])
    with pytest.raises(ValueError, match="mask"):
        advantages.whiten(x, t([1, 1, 1]))


# --- the trainer's KL-in-reward construction gives the reverse-KL gradient ---------------------------------------
def _two_token_groups(theta1, theta2, ref1, ref2, G):
    """Every group of G two-token sequences (K = 3 tokens): (probability of the group, logp (G, 2), ref (G, 2))."""
    K = theta1.shape[0]
    seqs = list(itertools.product(range(K), repeat=2))
    lp1, lp2 = theta1.log_softmax(-1), theta2.log_softmax(-1)
    rp1, rp2 = ref1.log_softmax(-1), ref2.log_softmax(-1)
    for group in itertools.product(seqs, repeat=G):
        logp = torch.stack([torch.stack([lp1[a], lp2[a, b]]) for a, b in group])  # (G, 2)
        ref = torch.stack([torch.stack([rp1[a], rp2[a, b]]) for a, b in group])  # (G, 2)
        yield logp.sum().exp().detach(), logp, ref


@pytest.mark.parametrize("G", [2, 3])
def test_k1_in_the_reward_through_group_advantages_to_go_is_the_reverse_kl_gradient(G):
    # The trainer's construction: penalties beta*k1 (detached) -> group_advantages_to_go -> policy_loss at ratio 1.
    # With equal task scores the task part is 0, and in expectation over whole groups the gradient is
    # beta * (G - 1) / G * grad KL(pi || ref) over sequences: the group-mean baseline includes the sample itself,
    # which shrinks it by (G - 1) / G (exactly as GRPO's task advantages), but does not change its direction.
    g = torch.Generator().manual_seed(0)
    theta1, theta2 = torch.randn(3, generator=g, dtype=D), torch.randn(3, 3, generator=g, dtype=D)
    ref1, ref2 = torch.randn(3, generator=g, dtype=D), torch.randn(3, 3, generator=g, dtype=D)
    beta = 0.5
    t1, t2 = theta1.clone().requires_grad_(True), theta2.clone().requires_grad_(True)
    total = 0.0
    for p_group, logp, ref in _two_token_groups(t1, t2, ref1, ref2, G):
        mask = torch.ones(G, 2, dtype=D)
        penalties = beta * kl.k1(logp.detach(), ref)  # (G, 2)
        A = advantages.group_advantages_to_go(torch.zeros(G, dtype=D), penalties, mask, G)
        loss, _ = losses.policy_loss(logp, logp.detach(), A, mask, agg="seq-mean-token-sum")
        total = total + p_group * loss
    g1, g2 = torch.autograd.grad(total, (t1, t2))
    true1, true2 = kl_toy.sequence_kl_gradients(theta1, theta2, ref1, ref2)["true"]
    torch.testing.assert_close(g1, beta * (G - 1) / G * true1, atol=1e-6, rtol=0)  # advantages are float32
    torch.testing.assert_close(g2, beta * (G - 1) / G * true2, atol=1e-6, rtol=0)


# paper-index: advantages.group_advantages_to_go
def test_group_advantages_to_go_hand_example():
    # scores [1, 0], G = 2, scale "none": task part [0.5, -0.5]
    # penalty-to-go C = [[0.3, 0.2], [0.1, 0.1]], group mean of C_0 = (0.3 + 0.1) / 2 = 0.2
    # A = [[0.5 - (0.3 - 0.2), 0.5 - (0.2 - 0.2)], [-0.5 - (0.1 - 0.2), -0.5 - (0.1 - 0.2)]]
    #   = [[0.4, 0.5], [-0.4, -0.4]]
    A = advantages.group_advantages_to_go(torch.tensor([1.0, 0.0]), torch.tensor([[0.1, 0.2], [0.0, 0.1]]),
                                          torch.ones(2, 2), 2, scale="none")
    torch.testing.assert_close(A, torch.tensor([[0.4, 0.5], [-0.4, -0.4]]))


def test_group_advantages_to_go_masks_padding_and_keeps_the_penalty_of_equal_groups():
    # equal scores: the task part is exactly 0, the KL part still acts; padding is ignored and returned as 0
    # C = [[0.3, 0.1, 0], [0.2, 0, 0]] (row 0's padded 5.0 is masked), mean C_0 = 0.25
    penalties = torch.tensor([[0.2, 0.1, 5.0], [0.2, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    A = advantages.group_advantages_to_go(torch.tensor([1.0, 1.0]), penalties, mask, 2)
    torch.testing.assert_close(A, torch.tensor([[-0.05, 0.15, 0.0], [0.05, 0.0, 0.0]]))


def test_group_advantages_to_go_rejects_bad_scores_shape():
    with pytest.raises(ValueError, match="scores"):
        advantages.group_advantages_to_go(torch.zeros(3), torch.zeros(2, 4), torch.ones(2, 4), 2)


def ev(values, returns, mask=None):
    values, returns = torch.tensor([values], dtype=D), torch.tensor([returns], dtype=D)
    return advantages.explained_variance(values, returns, torch.ones_like(values) if mask is None
                                         else torch.tensor([mask], dtype=D))


# --- explained_variance by hand -------------------------------------------------------------------------------------
def test_explained_variance_by_hand():
    # 1 - Var(R - V) / Var(R), unbiased variances over the valid tokens
    # returns [1, 0, 1, 0], values 0.5: R - V = [0.5, -0.5, 0.5, -0.5], same variance as R (1/3) -> 1 - 1 = 0.0
    assert ev([0.5] * 4, [1.0, 0.0, 1.0, 0.0]) == pytest.approx(0.0, abs=1e-12)
    # values = returns: Var(0) = 0 -> 1 - 0 = 1.0
    assert ev([1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]) == 1.0
    # returns [1, 2, 3, 4], values [1, 2, 3, 3]: R - V = [0, 0, 0, 1], mean 0.25,
    # Var = (3 * 0.0625 + 0.5625) / 3 = 0.25; Var(R) = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3 -> 1 - 0.15 = 0.85
    assert ev([1.0, 2.0, 3.0, 3.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(0.85, abs=1e-12)
    # the padding is not read: the 4th token is masked, so R = [1, 2, 3], V = [1, 2, 3] -> 1.0
    assert ev([1.0, 2.0, 3.0, 99.0], [1.0, 2.0, 3.0, -7.0], mask=[1, 1, 1, 0]) == 1.0


def test_explained_variance_is_nan_when_undefined():
    # returns constant [2, 2, 2, 2]: Var(R) = 0, the ratio is 0 / 0 -> NaN (honest), whatever the values
    assert math.isnan(ev([2.0] * 4, [2.0] * 4))
    assert math.isnan(ev([0.0, 1.0, 2.0, 3.0], [2.0] * 4))
    # fewer than 2 valid tokens: no variance can be estimated -> NaN
    assert math.isnan(ev([1.0, 2.0], [3.0, 4.0], mask=[1, 0]))


# --- unscored rows (every reward function returned None): NaN rewards, advantage 0, TRL's numbers ---------------------
def test_unscored_rows_in_group_advantages_by_hand():
    """[1, 0, NaN, 0]: mean 1/3 over the 3 scored rows, centred [2/3, -1/3, -, -1/3], unbiased std
    sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3) = 0.57735; the unscored row gets 0."""
    r = torch.tensor([1.0, 0.0, math.nan, 0.0])
    a = group_advantages(r, 4, scale="group")
    s = 3 ** -0.5 + 1e-4
    torch.testing.assert_close(a, torch.tensor([2 / 3 / s, -1 / 3 / s, 0.0, -1 / 3 / s]))
    # scale "none": centred only; a group with one scored row (no baseline) and one with none: all 0
    torch.testing.assert_close(group_advantages(r, 4, scale="none"), torch.tensor([2 / 3, -1 / 3, 0.0, -1 / 3]))
    assert group_advantages(torch.tensor([1.0, math.nan, math.nan, math.nan, math.nan] * 1 + [math.nan] * 3),
                            4, scale="group").tolist() == [0.0] * 8


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_unscored_rows_match_trls_advantage_formula(scale):
    """TRL 1.16 (multi_objective_aggregation="sum_then_normalize"): nanmean per group, trl's nanstd (per group or
    of the batch), (r - mean) / (std + 1e-4), then nan_to_num(0). Same numbers on random rewards with NaN rows,
    groups with one or no scored row included (TRL: std NaN -> advantage 0; minirl: no baseline -> 0)."""
    pytest.importorskip("trl")
    from trl.trainer.utils import nanstd

    g = torch.Generator().manual_seed(0)
    G = 4
    r = torch.randn(40, generator=g)
    r[torch.rand(40, generator=g) < 0.3] = math.nan
    r[8:11] = math.nan  # a group with one scored row
    r[12:16] = math.nan  # a group with none
    grouped = r.view(-1, G)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(G)
    std = (nanstd(grouped, dim=1).repeat_interleave(G) if scale != "batch" else nanstd(r).expand_as(r))
    trl_adv = r - mean if scale == "none" else (r - mean) / (std + 1e-4)
    trl_adv = torch.nan_to_num(trl_adv, nan=0.0)
    torch.testing.assert_close(group_advantages(r, G, scale=scale), trl_adv, atol=1e-6, rtol=1e-6)


def test_inf_reward_tensor_is_rejected_by_group_advantages():
    with pytest.raises(ValueError, match="rewards must be finite"):
        group_advantages(torch.tensor([1.0, math.inf]), 2)


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


def test_unscored_rows_match_trls_rloo_formula():
    """TRL 1.16's RLOOTrainer: the leave-one-out baseline over scorable siblings only, (nansum - r) / (count - 1),
    A = r - baseline, then nan_to_num(0) (a lone scored row's 0 / 0 and every unscored row give 0). Same numbers as
    advantages.rloo_advantages on random rewards with NaN rows."""
    from minirl.advantages import rloo_advantages

    g = torch.Generator().manual_seed(1)
    G = 4
    r = torch.randn(40, generator=g)
    r[torch.rand(40, generator=g) < 0.3] = math.nan
    r[8:11] = math.nan  # a group with one scored row
    r[12:16] = math.nan  # a group with none
    grouped = r.view(-1, G)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    baseline = (torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (count - 1)
    trl_adv = torch.nan_to_num((grouped - baseline).view(-1), nan=0.0)
    torch.testing.assert_close(rloo_advantages(r, group_size=G), trl_adv, atol=1e-6, rtol=1e-6)
