"""Tests of PPO's parts: GAE, whitening, the clipped value loss, the critic, the RLHF per-token reward (score on the
last token, k1 KL penalty on every token), the adaptive KL controller, and a short PPO run through train_rl."""

import copy
import math
from functools import partial

import helpers
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl import advantages, config, kl, losses, models, rewards, rl, tasks
from minirl.tokenizer import build_tokenizer

D = torch.float64


def t(*rows):
    return torch.tensor(rows, dtype=D)


close = partial(helpers.close, atol=5e-7)


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
    close(a, [ADV])
    close(r, [RET])


def test_gae_padded_row_matches_on_prefix_and_never_reads_padding():
    # garbage rewards and values in the padded positions must not leak into the valid prefix
    rewards_ = t([0, 0, 1, 5.0, -7.0], [0, 0, 1, 0, 0])
    values = t([0.5, 0.6, 0.7, 123.0, -99.0], [0.5, 0.6, 0.7, 0.8, 0.9])
    mask = t([1, 1, 1, 0, 0], [1, 1, 1, 1, 1])
    a, r = advantages.gae(rewards_, values, mask, gamma=1.0, lam=0.95)
    close(a[0], ADV + [0.0, 0.0])
    close(r[0], RET + [0.0, 0.0])
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
    close(a, [[0.95, 1.0, 0.0], [0.0, 0.0, 0.0]])  # A_1 = 1 - 0; A_0 = 0 + 0 - 0 + 0.95 * 1 = 0.95


def test_token_level_rewards_refuses_a_mask_that_is_not_a_prefix():
    # [1, 0, 1] sums to 2, so the score would land on position 1, a masked token
    with pytest.raises(ValueError, match=r"mask must be a prefix of ones.*row 0"):
        rewards.token_level_rewards(torch.tensor([1.0]), torch.tensor([[1, 0, 1]]))


def test_gae_padding_as_bool_mask_and_fully_masked_row():
    a, r = advantages.gae(t([1, 1, 1]), t([3, 3, 3]), torch.tensor([[False, False, False]]))
    close(a, [[0.0, 0.0, 0.0]])
    close(r, [[0.0, 0.0, 0.0]])


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    # lam = 1: the deltas telescope, A_t = G_t - V_t with G_t = sum_k gamma^k r_{t+k}.
    # gamma 1: G = [1, 1, 1] -> A = [0.5, 0.4, 0.3], returns = G = [1, 1, 1]
    a, r = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=1.0)
    close(a, [[0.5, 0.4, 0.3]])
    close(r, [[1.0, 1.0, 1.0]])
    # gamma 0.9: G = [0.81, 0.9, 1] -> A = [0.31, 0.3, 0.3]
    a, r = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=0.9, lam=1.0)
    close(a, [[0.31, 0.3, 0.3]])
    close(r, [[0.81, 0.9, 1.0]])


def test_gae_lambda_zero_is_one_step_td():
    # lam = 0: A_t = delta_t = r_t + gamma V_{t+1} - V_t = [0.1, 0.1, 0.3]; returns = r_t + gamma V_{t+1}
    a, r = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=1.0, lam=0.0)
    close(a, [[0.1, 0.1, 0.3]])
    close(r, [[0.6, 0.7, 1.0]])


def test_gae_with_discount():
    # gamma 0.9, lam 0.95 (gamma * lam = 0.855):
    # d2 = 1 - 0.7 = 0.3; d1 = 0.9 * 0.7 - 0.6 = 0.03; d0 = 0.9 * 0.6 - 0.5 = 0.04
    # A2 = 0.3; A1 = 0.03 + 0.855 * 0.3 = 0.2865; A0 = 0.04 + 0.855 * 0.2865 = 0.2849575
    a, _ = advantages.gae(t([0, 0, 1]), t([0.5, 0.6, 0.7]), t([1, 1, 1]), gamma=0.9, lam=0.95)
    close(a, [[0.2849575, 0.2865, 0.3]])


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
    close(a_long[:, :n_valid], a_short, atol=1e-10)
    close(ret_long[:, :n_valid], ret_short, atol=1e-10)
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
    close(advantages.whiten(x, mask), [[-1, 0, 0], [1, 0, 0]], atol=1e-6)
    # shift_mean=False keeps the mean: [-1, 0, 1] + 3 = [2, 3, 4]
    close(advantages.whiten(x, mask, shift_mean=False), [[2, 3, 0], [4, 0, 0]], atol=1e-6)


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
    close(advantages.whiten(x, t([0, 0])), [[0.0, 0.0]])  # nothing valid
    close(advantages.whiten(x, t([1, 0])), [[0.0, 0.0]])  # one entry: centred, no variance to divide by
    close(advantages.whiten(x, t([1, 0]), shift_mean=False), [[4.0, 0.0]])
    with pytest.raises(ValueError, match="mask"):
        advantages.whiten(x, t([1, 1, 1]))


# ------------------------------------------------------------------------------------------------------ value loss
# paper-index: losses.value_loss
def test_value_loss_clipped_branch_is_larger_and_has_zero_gradient():
    # V_old 0.5, V 1.0 (moved +0.5), R 0.9, clip 0.2: unclipped (1.0 - 0.9)^2 = 0.01;
    # V_clip = 0.5 + 0.2 = 0.7, clipped (0.7 - 0.9)^2 = 0.04 > 0.01 -> loss 0.5 * 0.04 = 0.02.
    # V_clip does not depend on V once the clip is active: the gradient is 0.
    v = t([1.0]).requires_grad_(True)
    loss, stats = losses.value_loss(v, t([0.5]), t([0.9]), t([1.0]), clip=0.2)
    close(loss, 0.02)
    close(torch.autograd.grad(loss, v)[0], [[0.0]])
    assert stats["value_clip_frac"] == 1.0


def test_value_loss_unclipped_branch_is_larger_and_keeps_its_gradient():
    # V_old 0.5, V 0.0 (moved -0.5), R 1.0: unclipped (0 - 1)^2 = 1; V_clip = 0.3, clipped 0.49 < 1
    # -> loss 0.5 * 1 = 0.5, gradient d/dV 0.5 (V - R)^2 = V - R = -1.
    v = t([0.0]).requires_grad_(True)
    loss, stats = losses.value_loss(v, t([0.5]), t([1.0]), t([1.0]), clip=0.2)
    close(loss, 0.5)
    close(torch.autograd.grad(loss, v)[0], [[-1.0]])
    assert stats["value_clip_frac"] == 0.0


def test_value_loss_token_mean_over_valid_tokens_and_no_clip():
    # tokens: the two cases above, plus a padded token with garbage: (0.02 + 0.5) / 2 = 0.26;
    # gradient [0, -1, 0] / 2 = [0, -0.5, 0]
    v = t([1.0, 0.0, 42.0]).requires_grad_(True)
    old, ret, mask = t([0.5, 0.5, 0.0]), t([0.9, 1.0, -42.0]), t([1, 1, 0])
    loss, stats = losses.value_loss(v, old, ret, mask, clip=0.2)
    close(loss, 0.26)
    close(torch.autograd.grad(loss, v)[0], [[0.0, -0.5, 0.0]])
    assert stats["value_clip_frac"] == 0.5
    # clip=None: plain 0.5 (V - R)^2 averaged: (0.5 * 0.01 + 0.5 * 1) / 2 = 0.2525; gradient (V - R) / 2
    loss, _ = losses.value_loss(v, old, ret, mask, clip=None)
    close(loss, 0.2525)
    close(torch.autograd.grad(loss, v)[0], [[0.05, -0.5, 0.0]])


def test_value_loss_gradient_matches_finite_differences_of_the_objective():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(3, 4, generator=g, dtype=D).requires_grad_(True)
    old, ret = torch.randn(3, 4, generator=g, dtype=D), torch.randn(3, 4, generator=g, dtype=D)
    mask = t([1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0])
    torch.autograd.gradcheck(lambda x: losses.value_loss(x, old, ret, mask, clip=0.3)[0], (v,))


def test_value_loss_bad_inputs():
    with pytest.raises(ValueError, match="old_values"):
        losses.value_loss(t([1.0, 2.0]), t([1.0]), t([1.0, 2.0]), t([1, 1]))
    with pytest.raises(ValueError, match="returns"):
        losses.value_loss(t([1.0]), t([1.0]), t([1.0, 2.0]), t([1]))
    with pytest.raises(ValueError, match="clip"):
        losses.value_loss(t([1.0]), t([1.0]), t([1.0]), t([1]), clip=0.0)


# ------------------------------------------------------------------------------------------------------ rewards
def test_token_level_rewards_put_the_score_on_the_last_valid_token():
    scores = torch.tensor([1.0, 0.5, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    close(rewards.token_level_rewards(scores, mask).double(), [[0, 0, 1.0], [0.5, 0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="scores"):
        rewards.token_level_rewards(torch.tensor([1.0, 0.5]), mask)
    with pytest.raises(ValueError, match="mask"):
        rewards.token_level_rewards(scores, torch.ones(3))


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


# ------------------------------------------------------------------------------------------------------ adaptive KL
# paper-index: rl.adaptive_kl_beta
@pytest.mark.parametrize("observed, expected", [
    (0.10, 0.1 * (1 + 0.2 * 64 / 1000)),   # KL twice the target: error 1 clipped to +0.2 -> 0.10128
    (0.055, 0.1 * (1 + 0.1 * 64 / 1000)),  # 10% over: error 0.1 -> 0.10064
    (0.05, 0.1),                           # on target: unchanged
    (0.0, 0.1 * (1 - 0.2 * 64 / 1000)),    # no KL at all: error -1 clipped to -0.2 -> 0.09872
])
def test_adaptive_kl_controller_arithmetic(observed, expected):
    beta = rl.adaptive_kl_beta(0.1, observed, target_kl=0.05, horizon=1000, n_samples=64)
    assert math.isclose(beta, expected, rel_tol=1e-12)


# ------------------------------------------------------------------------------------------------------ critic
def test_value_model_is_a_separate_copy_that_starts_at_zero():
    tok = build_tokenizer()
    policy = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    critic = models.ValueModel(policy)
    assert all(p.data_ptr() != q.data_ptr() for p in critic.parameters() for q in policy.parameters())
    ids = torch.tensor([[0, 2, 5, 6, 7, 8], [2, 5, 5, 6, 9, 1]])
    am = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    v = models.token_values(critic, ids, am, n_prompt_tokens=3)  # completion = the last 3 positions
    assert v.shape == (2, 3) and v.dtype == torch.float32
    close(v.double(), torch.zeros(2, 3))  # zero head: no confident wrong values before training
    with torch.no_grad():
        critic.head.bias.fill_(1.0)
        critic.head.weight.normal_()
    full = critic(ids, am)  # (B, L): the value after each position
    close(models.token_values(critic, ids, am, 3), full[:, 2:5])  # V(s_t) is read where token t is predicted


# ------------------------------------------------------------------------------------------------------ PPO run
# The runs below use a tiny random model and a scripted reward that varies with what is written (the share of
# '1' characters), so every batch has reward variance and the policy must move: nothing depends on whether a
# particular sampled trajectory happened to earn the task's reward (which a random model rarely does).
@pytest.fixture(scope="module")
def warm():
    tok = build_tokenizer()
    return models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0), tok


def ones_share(prompts, completions, **_):
    """A scripted reward in TRL's form: the share of '1' characters of the completion (0 for an empty one)."""
    return [c.count("1") / max(len(c), 1) for c in completions]


def _ppo(warm, **kw):
    model, tok = warm
    settings_ = dict(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=16, lr=1e-3, num_iterations=2,
                     num_minibatches=2, progress=False)
    cfg = config.make_config("ppo", **{**settings_, **kw})
    return rl.train_rl(copy.deepcopy(model), tok, cfg, tasks.load_split("train").select(range(64)),
                       reward_fn=ones_share)


def test_ppo_smoke_run_logs_critic_and_kl_metrics(warm):
    h = _ppo(warm)
    assert len(h.rows) == 2
    for key in ("value_loss", "explained_variance", "kl_ref", "approx_kl", "clip_frac", "entropy", "reward"):
        assert all(math.isfinite(v) for v in h.series(key)[1]), key
    assert h.last("value_loss") > 0
    assert h.series("beta")[1] == [0.05, 0.05]  # fixed beta


def test_ppo_adaptive_kl_moves_beta(warm):
    h = _ppo(warm, steps=3, adaptive_kl=True, target_kl=1e-6, kl_horizon=100)
    # step 1 samples from the reference itself: KL exactly 0, error -1 clipped to -0.2, 8 samples / horizon 100
    # -> beta *= 1 - 0.016. Step 2's policy has moved (4 optimiser steps at lr 1e-3 on a reward with variance):
    # any KL above the 1e-6 target -> beta *= 1 + 0.016.
    assert h.rows[0]["kl_ref"] == 0.0 and h.rows[1]["kl_ref"] > 1e-6
    betas = h.series("beta")[1]
    assert betas[0] == 0.05
    assert math.isclose(betas[1], 0.05 * 0.984, rel_tol=1e-9)
    assert math.isclose(betas[2], 0.05 * 0.984 * 1.016, rel_tol=1e-9)


def test_ppo_value_loss_is_the_same_under_gradient_accumulation(warm):
    # micro-batches share the minibatch's token count as denominator, so their losses add up to the full one
    whole = _ppo(warm, steps=1)
    split = _ppo(warm, steps=1, micro_batch_size=1)
    assert math.isclose(whole.last("value_loss"), split.last("value_loss"), rel_tol=1e-3)
