"""Tests of DAPO's four changes and Dr. GRPO's two: clip-higher, dynamic sampling, the loss aggregations, overlong
shaping and filtering, the presets, and the trainer paths that use them (dynamic sampling, gradient accumulation).

Hand arithmetic is written beside every expected value.
"""

import math
from functools import partial

import helpers
import pytest
import torch

from minirl import advantages, config, losses, models, rewards, rl, rollout, sampling
from minirl.tokenizer import build_tokenizer

D = torch.float64
MODES = losses.AGGREGATIONS


def t(*rows):
    return torch.tensor(rows, dtype=D)


close = partial(helpers.close, atol=1e-7, dtype=D)


# --- the acceptance example of the issue: ratio 1, beta 0, A = [+1, -1], lengths [3, 1] --------------------------
# On-policy the ratio is 1, so the per-token loss is -A * 1: row 0 -> [-1, -1, -1], row 1 -> [+1, 0, 0] (2 padded).
LOGP = t([-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0])
MASK = t([1, 1, 1], [1, 0, 0])
ADV = torch.tensor([1.0, -1.0], dtype=D)


@pytest.mark.parametrize("mode, expected", [
    ("seq-mean-token-mean", 0.0),  # per sequence: -3/3 = -1 and +1/1 = +1; mean (-1 + 1) / 2 = 0
    ("token-mean", -0.5),  # all tokens: (-1 - 1 - 1 + 1) / 4 tokens = -2/4 = -0.5
    ("seq-mean-token-sum-norm", -1 / 3),  # (-3/3 + 1/3) / 2 sequences = (-2/3) / 2 = -1/3 (max_tokens 3)
    ("seq-mean-token-sum", -1.0),  # (-3 + 1) / 2 sequences = -1
])
def test_acceptance_loss_under_each_aggregation(mode, expected):
    loss, stats = losses.policy_loss(LOGP, LOGP.clone(), ADV, MASK, agg=mode, max_tokens=3)
    close(loss, expected)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


@pytest.mark.parametrize("mode, weights", [
    # d loss / d logprob_t = -A_i * w_t at ratio 1; the weight w_t of each token is
    ("token-mean", [[1 / 4] * 3, [1 / 4]]),  # 1 / (all 4 tokens): every token the same
    ("seq-mean-token-mean", [[1 / 6] * 3, [1 / 2]]),  # 1 / (2 seqs * |o_i|): 1/(2*3) long, 1/(2*1) short
    ("seq-mean-token-sum-norm", [[1 / 6] * 3, [1 / 6]]),  # 1 / (2 seqs * max_tokens 3): every token the same
    ("seq-mean-token-sum", [[1 / 2] * 3, [1 / 2]]),  # 1 / (2 seqs): every token the same, scale grows with T
])
def test_gradient_weight_of_each_token_under_each_aggregation(mode, weights):
    logp = LOGP.clone().requires_grad_(True)
    loss, _ = losses.policy_loss(logp, LOGP.clone(), ADV, MASK, agg=mode, max_tokens=3)
    (grad,) = torch.autograd.grad(loss, logp)
    # GRPO's per-sequence mean gives the short completion's token 3x the weight of a long one's (1/2 vs 1/6):
    # a wrong answer (A < 0) is pushed down less per token the longer it is -- Dr. GRPO's length bias.
    expected = t([-w * 1.0 for w in weights[0]], [+weights[1][0], 0.0, 0.0])  # -A * w; padding gets 0
    close(grad, expected)


# paper-index: losses.aggregate
def test_aggregate_docstring_example():
    per_token, mask = t([2, 2, 2, 0], [10, 0, 0, 0]), t([1, 1, 1, 0], [1, 0, 0, 0])
    close(losses.aggregate(per_token, mask, "token-mean"), 4.0)  # (2+2+2+10) / 4 tokens
    close(losses.aggregate(per_token, mask, "seq-mean-token-mean"), 6.0)  # (6/3 + 10/1) / 2 = (2 + 10) / 2
    close(losses.aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=4), 2.0)  # (6/4 + 10/4) / 2


def test_sum_norm_defaults_to_T_and_rejects_bad_max_tokens():
    per_token, mask = t([2, 2, 2, 0], [10, 0, 0, 0]), t([1, 1, 1, 0], [1, 0, 0, 0])
    close(losses.aggregate(per_token, mask, "seq-mean-token-sum-norm"), 2.0)  # T = 4
    with pytest.raises(ValueError, match="max_tokens"):
        losses.aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=0)
    with pytest.raises(ValueError, match="aggregation mode"):
        losses.aggregate(per_token, mask, "mean")
    with pytest.raises(ValueError, match="denominator"):
        losses.aggregate(per_token, mask, "token-mean", denominator=0)


# --- overlong reward shaping (DAPO eq. 13) and overlong filtering --------------------------------------------------
# paper-index: rewards.overlong_penalty
def test_overlong_penalty_acceptance_values():
    # max_len 20, cache 4: the ramp starts after 20 - 4 = 16 tokens: (16 - |y|) / 4 for 16 < |y| <= 20, -1 beyond
    lengths = torch.tensor([15, 16, 17, 18, 19, 20, 21])
    close(rewards.overlong_penalty(lengths, max_len=20, cache_len=4), [0, 0, -0.25, -0.5, -0.75, -1.0, -1.0])


def test_overlong_penalty_bounds_and_errors():
    p = rewards.overlong_penalty(torch.arange(0, 50), max_len=32, cache_len=8)
    assert p.max() == 0.0 and p.min() == -1.0 and bool((p[1:] <= p[:-1]).all())  # in [-1, 0], non-increasing
    with pytest.raises(ValueError, match="cache_len"):
        rewards.overlong_penalty(torch.tensor([3]), max_len=4, cache_len=5)
    with pytest.raises(ValueError, match="cache_len"):
        rewards.overlong_penalty(torch.tensor([3]), max_len=4, cache_len=0)
    with pytest.raises(ValueError, match="lengths"):
        rewards.overlong_penalty(torch.tensor([[3]]), max_len=4, cache_len=2)


def test_overlong_filtering_removes_truncated_tokens_from_numerator_and_denominator():
    # a finished completion of 2 tokens (loss 1 each) and a truncated one of 4 tokens (loss 3 each)
    per_token = t([1, 1, 0, 0], [3, 3, 3, 3])
    mask = t([1, 1, 0, 0], [1, 1, 1, 1])
    truncated = torch.tensor([False, True])
    filtered = mask * (~truncated).to(D).unsqueeze(1)  # what the trainer does with overlong_filter=True
    close(losses.aggregate(per_token, filtered, "token-mean"), 1.0)  # (1 + 1) / 2 tokens
    close(losses.aggregate(per_token, mask, "token-mean"), 14 / 6)  # without filtering: (2 + 12) / 6 tokens


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("denominator", [None, 1.0])  # 1.0 is what the trainer passes for an all-masked minibatch
def test_fully_masked_batch_gives_zero_loss_and_zero_finite_gradient(mode, denominator):
    logp = t([-1.0, -2.0], [-0.5, -0.1]).requires_grad_(True)
    old = t([-3.0, -0.1], [-0.5, -9.0])  # wild ratios on masked tokens must not leak
    loss, stats = losses.policy_loss(logp, old, torch.tensor([1.0, -1.0], dtype=D), torch.zeros(2, 2, dtype=D),
                                     agg=mode, denominator=denominator)
    assert loss.item() == 0.0 and not math.isnan(stats["ratio_mean"])
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(grad).all() and (grad == 0).all()


# --- clip-higher ---------------------------------------------------------------------------------------------------
def test_clip_fractions_low_and_high_on_hand_made_ratios():
    # row 0, A = +1, ratios 1.25, 1.3, 0.7; row 1, A = -1, ratios 0.7, 1.3, 0.9. eps_low 0.2, eps_high 0.28:
    #   high clip (A > 0 and r > 1.28): only 1.3 in row 0            -> 1/6
    #   low clip (A < 0 and r < 0.8): only 0.7 in row 1              -> 1/6
    #   0.7 with A > 0 and 1.3 with A < 0 are NOT clipped (the min picks the unclipped term, gradient flows)
    ratios = t([1.25, 1.3, 0.7], [0.7, 1.3, 0.9])
    old = torch.full((2, 3), -1.0, dtype=D)
    logp = (old + ratios.log()).requires_grad_(True)
    A, mask = torch.tensor([1.0, -1.0], dtype=D), torch.ones(2, 3, dtype=D)
    loss, stats = losses.policy_loss(logp, old, A, mask, eps_low=0.2, eps_high=0.28, agg="token-mean")
    close(stats["clip_frac_high"], 1 / 6)
    close(stats["clip_frac_low"], 1 / 6)
    close(stats["clip_frac"], 2 / 6)
    close(stats["ratio_max"], 1.3)
    close(stats["ratio_min"], 0.7)
    (grad,) = torch.autograd.grad(loss, logp)
    # gradient of -A r / 6 w.r.t. log r is -A r / 6; zero where clipped
    close(grad, t([-1.25 / 6, 0.0, -0.7 / 6], [0.0, 1.3 / 6, 0.9 / 6]))
    # with the symmetric 0.2 / 0.2 clip, 1.25 is clipped too: high 2/6
    _, sym = losses.policy_loss(logp, old, A, mask, eps_low=0.2, eps_high=0.2, agg="token-mean")
    close(sym["clip_frac_high"], 2 / 6)
    close(sym["clip_frac_low"], 1 / 6)


# paper-index: losses.policy_loss
@pytest.mark.parametrize("pi_old, eps_high, ceiling", [
    (0.01, 0.20, 0.012),  # a rare token: 0.01 * 1.2 = 0.012 is as far as one clipped step can push it
    (0.01, 0.28, 0.0128),  # clip-higher: 0.01 * 1.28 = 0.0128
    (0.90, 0.20, 1.08),  # a likely token: 0.9 * 1.2 = 1.08 > 1, so the clip never binds below probability 1
])
def test_clip_ceiling_of_a_token(pi_old, eps_high, ceiling):
    # with A > 0 the gradient vanishes exactly when pi / pi_old > 1 + eps_high, i.e. pi > pi_old (1 + eps_high)
    close(pi_old * (1 + eps_high), ceiling, atol=1e-12)
    old = torch.tensor([[math.log(pi_old)]], dtype=D)
    A, mask = torch.ones(1, dtype=D), torch.ones(1, 1, dtype=D)
    for pi, clipped in ((min(ceiling * 0.999, 0.999), False), (ceiling * 1.001, True)):
        if pi >= 1:
            continue  # not a probability: the ceiling is out of reach for this token
        logp = torch.tensor([[math.log(pi)]], dtype=D, requires_grad=True)
        loss, _ = losses.policy_loss(logp, old, A, mask, eps_low=0.2, eps_high=eps_high)
        (grad,) = torch.autograd.grad(loss, logp)
        assert (grad.abs().item() == 0.0) == clipped, (pi, grad)


def test_eps_high_defaults_to_eps_low_and_bad_eps_raise():
    old = torch.zeros(1, 1, dtype=D)
    logp = torch.full((1, 1), math.log(1.25), dtype=D)
    _, st = losses.policy_loss(logp, old, torch.ones(1, dtype=D), torch.ones(1, 1, dtype=D), eps_low=0.2)
    assert st["clip_frac_high"] == 1.0  # 1.25 > 1 + 0.2
    with pytest.raises(ValueError, match="eps_low"):
        losses.policy_loss(logp, old, torch.ones(1, dtype=D), torch.ones(1, 1, dtype=D), eps_low=1.0)


# --- dynamic sampling -------------------------------------------------------------------------------------------
ROUNDS = [t([1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]).flatten(), t([1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 1, 0]).flatten()]


def scripted(rounds, calls):
    def sample_round(i):
        calls.append(i)
        return rounds[i % len(rounds)], rounds[i % len(rounds)]  # the payload is the round's rewards
    return sample_round


def trained_rewards(ds, G=4):
    return [payload.view(-1, G)[g].tolist() for payload, groups in ds.picks for g in groups]


# paper-index: sampling.has_signal
def test_has_signal():
    # groups of 2: [0, 1] mixed, [1, 1] all right, [0, 0] all wrong
    assert sampling.has_signal(t(0, 1, 1, 1, 0, 0).flatten(), 2).tolist() == [True, False, False]
    assert sampling.has_signal(ROUNDS[0], 4).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="group_size"):
        sampling.has_signal(torch.zeros(5), 4)
    with pytest.raises(ValueError, match="rewards"):
        sampling.has_signal(torch.zeros(2, 4), 4)


# paper-index: sampling.dynamic_sampling
def test_dynamic_sampling_acceptance_example():
    # need 2 groups. Round 1: [1,1,1,1] no, [0,1,0,0] yes, [0,0,0,0] no -> 1 kept, 1 still needed.
    # Round 2: [1,0,1,1] yes (kept, batch full), [1,1,1,1] no, [0,0,1,0] yes but surplus -> dropped.
    calls = []
    ds = sampling.dynamic_sampling(scripted(ROUNDS, calls), num_groups=2, group_size=4, max_gen_batches=4)
    assert trained_rewards(ds) == [[0, 1, 0, 0], [1, 0, 1, 1]]
    assert calls == [0, 1] and ds.rounds == 2
    assert ds.samples == 24  # 2 rounds x 3 prompts x 4 samples
    assert (ds.groups_seen, ds.groups_with_signal, ds.groups_kept) == (6, 3, 2)


def test_dynamic_sampling_raises_when_rounds_run_out():
    # only round 1 repeated: 1 useful group per round, so 3 groups need 3 rounds but only 2 are allowed
    calls = []
    with pytest.raises(RuntimeError, match=r"found 2 of 3 groups.*max_gen_batches=2.*allow_partial"):
        sampling.dynamic_sampling(scripted(ROUNDS[:1], calls), num_groups=3, group_size=4, max_gen_batches=2)
    assert calls == [0, 1]  # never more rounds than max_gen_batches


def test_dynamic_sampling_never_loops_forever_on_zero_signal():
    calls = []
    with pytest.raises(RuntimeError, match="found 0 of 1"):
        sampling.dynamic_sampling(scripted([torch.ones(8)], calls), 1, 4, max_gen_batches=5)
    assert len(calls) == 5


def test_dynamic_sampling_allow_partial_returns_what_it_found():
    ds = sampling.dynamic_sampling(scripted(ROUNDS[:1], []), num_groups=3, group_size=4, max_gen_batches=2,
                                   allow_partial=True)
    assert trained_rewards(ds) == [[0, 1, 0, 0], [0, 1, 0, 0]]  # the useful group of each of the 2 rounds
    assert ds.groups_kept == 2 and ds.rounds == 2


def test_dynamic_sampling_bad_arguments():
    with pytest.raises(ValueError):
        sampling.dynamic_sampling(scripted(ROUNDS, []), num_groups=0, group_size=4, max_gen_batches=2)
    with pytest.raises(ValueError):
        sampling.dynamic_sampling(scripted(ROUNDS, []), num_groups=1, group_size=4, max_gen_batches=0)


# --- presets --------------------------------------------------------------------------------------------------------
def test_dr_grpo_preset_has_both_fixes():
    c = config.make_config("dr_grpo")
    assert c.adv_scale == "none" and c.agg == "seq-mean-token-sum-norm"
    assert c.beta == 0.0 and c.advantage == "group"
    # no std division: rewards [1, 0, 0, 0] -> minus the mean 0.25 only
    close(advantages.group_advantages(t(1, 0, 0, 0).flatten(), 4, scale=c.adv_scale), [0.75, -0.25, -0.25, -0.25])


def test_dapo_preset_has_its_four_changes():
    c = config.make_config("dapo")
    assert (c.eps_low, c.eps_high) == (0.2, 0.28)
    assert c.agg == "token-mean" and c.dynamic_sampling and c.overlong_shaping
    assert c.beta == 0.0 and c.adv_scale == "group"


def test_grpo_preset_is_the_baseline():
    c = config.make_config("grpo")
    assert (c.eps_low, c.eps_high, c.agg, c.adv_scale) == (0.2, 0.2, "seq-mean-token-mean", "group")
    assert not c.dynamic_sampling and not c.overlong_shaping and not c.overlong_filter


# --- the trainer paths, on a tiny real model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    return model, tok


def _fake_data(n=16):
    import datasets

    prompts = [f"{a}+{b}=" for a in range(1, 5) for b in range(1, 5)][:n]
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": ["0"] * len(prompts),
                                       "completion": ["#0"] * len(prompts)})


def test_trainer_dynamic_sampling_trains_on_exactly_the_kept_groups(tiny, monkeypatch):
    model, tok = tiny
    G = 4
    generated, scored, seen = [], [], {}
    real_generate = rollout.generate

    def recording_generate(*args, **kwargs):
        r = real_generate(*args, **kwargs)
        generated.append(r)
        return r

    def scripted_reward(prompts, completions, **columns):  # one call per generation round, none after
        scored.append(list(completions))
        return ROUNDS[len(scored) - 1].float().tolist()

    def capture(model_, optimizer, minibatch, cfg, **kw):
        seen.update(batch=minibatch, advantages=minibatch.advantages.clone())
        return real_update(model_, optimizer, minibatch, cfg, **kw)

    real_update = rl.update_minibatch
    monkeypatch.setattr(rl.rollout, "generate", recording_generate)
    monkeypatch.setattr(rl, "update_minibatch", capture)
    cfg = config.make_config("dapo", steps=1, prompts_per_step=2, gen_prompts_per_round=3, group_size=G,
                             max_gen_batches=4, max_new_tokens=6, num_iterations=1, num_minibatches=1,
                             overlong_shaping=False, lr=1e-4, progress=False)
    h = rl.train_rl(model, tok, cfg, _fake_data(), reward_fn=scripted_reward)
    assert len(generated) == 2 and len(scored) == 2  # the batch was full after 2 rounds, each scored once
    # kept: round 1 group 1 (rows 4..7) then round 2 group 0 (rows 0..3)
    T = max(generated[0].completion_ids.shape[1], generated[1].completion_ids.shape[1])
    exp_ids = torch.cat([torch.nn.functional.pad(generated[0].completion_ids[4:8],
                                                 (0, T - generated[0].completion_ids.shape[1]), value=0),
                         torch.nn.functional.pad(generated[1].completion_ids[0:4],
                                                 (0, T - generated[1].completion_ids.shape[1]), value=0)])
    batch = seen["batch"]  # the one minibatch is the whole batch, in a shuffled group order
    assert len(batch) == 2 * G
    P = batch.n_prompt_tokens
    trained = sorted(tuple(r) for r in batch.input_ids[:, P:].tolist())
    assert trained == sorted(tuple(r) for r in exp_ids.tolist())
    expected_adv = advantages.group_advantages(torch.tensor([0, 1, 0, 0, 1, 0, 1, 1.0]), G)  # kept groups' scores
    assert sorted(seen["advantages"].tolist()) == pytest.approx(sorted(expected_adv.tolist()))
    row = h.rows[-1]
    assert (row["gen_rounds"], row["gen_samples"], row["useful_groups_in_batch"]) == (2, 24, 2)
    close(row["useful_groups"], 3 / 6)  # 3 of the 6 generated groups had signal (one dropped as surplus)


def test_trainer_dynamic_sampling_raises_when_rounds_run_out(tiny, monkeypatch):
    model, tok = tiny
    cfg = config.make_config("dapo", steps=1, prompts_per_step=2, group_size=4, max_gen_batches=2,
                             max_new_tokens=4, overlong_cache_len=2, num_minibatches=1, progress=False)
    with pytest.raises(RuntimeError, match="max_gen_batches=2"):
        rl.train_rl(model, tok, cfg, _fake_data(), reward_fn=lambda prompts, completions, **_: [0.0] * len(prompts))


@pytest.fixture(scope="module")
def tiny_batch(tiny):
    """A real rollout of the tiny model (8 rows, some truncated) with perturbed behaviour log-probs."""
    model, tok = tiny
    torch.manual_seed(0)
    r = rollout.generate(model, tok, ["1+2=", "3+4+5=", "6+7=", "8+9+1+2="], group_size=2, max_new_tokens=10)
    g = torch.Generator().manual_seed(1)
    mask = r.completion_mask
    old = r.logprobs + 0.3 * torch.randn(mask.shape, generator=g) * mask  # ratios off 1, some clipped
    ref = r.logprobs + 0.2 * torch.randn(mask.shape, generator=g) * mask
    adv = torch.randn(mask.shape[0], generator=g)
    # the random model rarely stops, so give the rows different lengths in the loss mask (as EOS would), and
    # remove one row entirely (as overlong filtering does)
    lengths = torch.tensor([10, 0, 7, 3, 10, 5, 2, 9])
    loss_mask = mask * (torch.arange(mask.shape[1]) < lengths.unsqueeze(1)).to(mask.dtype)
    return r, old, ref, adv, loss_mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_gradient_accumulation_matches_one_batch_for_every_aggregation(tiny, tiny_batch, mode, beta):
    """The denominator logic of rl.update_minibatch: 3+3+2 micro-batches give the one-batch gradient."""
    model, _ = tiny
    r, old, ref, adv, loss_mask = tiny_batch
    assert loss_mask.sum(-1).tolist() == [10, 0, 7, 3, 10, 5, 2, 9]  # lengths differ: a wrong denominator shows
    rows = torch.arange(r.input_ids.shape[0])
    grads, totals = [], []
    for micro in (None, 3):
        cfg = config.make_config("grpo", agg=mode, beta=beta, max_new_tokens=10, micro_batch_size=micro,
                                 max_grad_norm=1e9, eps_high=0.28)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: read the gradient, leave the weights
        batch = rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=r.n_prompt_tokens,
                           completion_mask=r.completion_mask, loss_mask=loss_mask, old_logprobs=old, advantages=adv,
                           ref_logprobs=ref if beta > 0 else None)
        out = rl.update_minibatch(model, opt, batch[rows], cfg, beta=beta)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        totals.append(out["loss"])
    assert grads[0].abs().max() > 1e-4  # a real gradient, not a trivially equal zero
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-4)
    assert totals[1] == pytest.approx(totals[0], abs=1e-6)
    # and the logged loss is the loss of the whole minibatch computed in one go
    with torch.no_grad():
        logp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens)
        full, _ = losses.policy_loss(logp, old, adv, loss_mask, eps_low=0.2, eps_high=0.28, level="token", agg=mode,
                                     dual_clip=None, max_tokens=10)
        if beta > 0:
            from minirl import kl
            full = full + beta * losses.aggregate(kl.kl_in_loss(logp, ref), loss_mask, mode, max_tokens=10)
    assert totals[0] == pytest.approx(float(full), abs=1e-6)


def test_config_rejects_bad_dapo_settings():
    with pytest.raises(ValueError, match="gen_prompts_per_round"):
        config.make_config("dapo", gen_prompts_per_round=0)
    with pytest.raises(ValueError, match="overlong_cache_len"):
        config.make_config("dapo", max_new_tokens=16, overlong_cache_len=20)
    with pytest.raises(ValueError, match="max_gen_batches"):
        config.make_config("dapo", max_gen_batches=0)
