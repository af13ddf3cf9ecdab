"""Tests of minirl.rl, the RL loop: compute_advantages' paths, update_minibatch (gradient accumulation, the router's
aux loss), dynamic sampling and routing replay in the trainer, the adaptive KL controller, reward functions in TRL's
form and unscored rows, determinism, and short runs of PPO and of every foundation preset."""

import copy
import math
from functools import partial

import datasets
import helpers
import pytest
import torch
from helpers import tiny_model

from minirl import advantages, config, decoding, kl, losses, models, moe, rl, rollout, tasks, warm_start
from minirl.tokenizer import build_tokenizer

TIMING = {"time", "time_generate", "time_optimise"}
D = torch.float64
MODES = losses.AGGREGATIONS


def t(*rows):
    return torch.tensor(rows, dtype=D)


close = partial(helpers.close, atol=1e-7, dtype=D)


# --- gradient accumulation ------------------------------------------------------------------------------------------
def fake_batch(model, tok, seed=0):
    """8 rows = 2 groups of 4: left-padded prompts, completions of lengths 1..6 ending in EOS (one truncated),
    behaviour log-probs that differ from the current policy (so some ratios are clipped)."""
    g = torch.Generator().manual_seed(seed)
    prompts = ["1+2=", "3+4+5+6="] * 4
    enc = tok(prompts, return_tensors="pt", padding=True)
    T = 6
    lengths = [1, 3, 6, 2, 4, 6, 5, 2]
    comp = torch.randint(4, len(tok), (8, T), generator=g)
    for i, n in enumerate(lengths):
        if i != 2:  # row 2 is truncated: 6 tokens, no EOS
            comp[i, n - 1] = tok.eos_token_id
            comp[i, n:] = tok.pad_token_id
    mask = rollout.completion_mask(comp, tok.eos_token_id)
    batch = rollout.Rollout(
        input_ids=torch.cat([enc.input_ids, comp], 1), attention_mask=torch.cat([enc.attention_mask, mask.long()], 1),
        completion_ids=comp, completion_mask=mask, truncated=mask.sum(1) == T, prompt_index=torch.arange(8) // 4,
        completions=[""] * 8, logprobs=torch.zeros(8, T), group_size=4)
    with torch.no_grad():
        lp = rollout.token_logprobs(model, batch.input_ids, batch.attention_mask, batch.n_prompt_tokens)
    old = (lp + 0.3 * torch.randn(8, T, generator=g)) * mask
    ref = (lp + 0.2 * torch.randn(8, T, generator=g)) * mask
    adv = torch.randn(8, generator=g)
    return batch, old, ref, adv


@pytest.mark.parametrize("algo, beta", [("grpo", 0.04), ("grpo", 0.0), ("dapo", 0.0), ("dr_grpo", 0.0),
                                        ("gspo", 0.0)])
def test_two_accumulation_steps_give_the_same_gradient_as_one(tok, algo, beta):
    # seq-mean-token-mean (grpo, gspo), token-mean (dapo), seq-mean-token-sum-norm (dr_grpo): with the FULL
    # minibatch's count as every micro-batch's denominator, the micro-batch gradients add up to the full one
    model = tiny_model(tok)
    batch, old, ref, adv = fake_batch(model, tok)
    loss_mask = batch.completion_mask.clone()
    loss_mask[5] = 0  # a row with no valid token (e.g. overlong-filtered) must not count as a sequence
    rows = torch.arange(8)
    grads, losses_ = [], []
    for micro in (None, 4):  # one pass of 8 rows; two accumulation steps of 4 rows
        cfg = config.make_config(algo, beta=beta, micro_batch_size=micro, max_grad_norm=1e9, temperature=1.0)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay put, the gradients stay readable
        mb = rl.RLBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        n_prompt_tokens=batch.n_prompt_tokens, completion_mask=batch.completion_mask,
                        loss_mask=loss_mask, old_logprobs=old, advantages=adv, ref_logprobs=ref if beta > 0 else None)
        out = rl.update_minibatch(model, opt, mb[rows], cfg, beta=beta)
        grads.append([p.grad.clone() for p in model.parameters()])
        losses_.append(out["loss"])
    assert any(g.abs().sum() > 0 for g in grads[0])
    for g1, g2 in zip(*grads, strict=True):
        torch.testing.assert_close(g2, g1, atol=1e-7, rtol=1e-5)
    assert losses_[1] == pytest.approx(losses_[0], rel=1e-5, abs=1e-7)


def test_naive_accumulation_would_differ(tok):
    # the bug the shared denominator avoids: averaging each micro-batch's OWN token-mean weights a token of the
    # micro-batch with fewer tokens more. Rows 0-3 hold 1+3+6+2 = 12 tokens, rows 4-7 hold 4+6+5+2 = 17.
    model = tiny_model(tok)
    batch, old, _, adv = fake_batch(model, tok)
    mask, P = batch.completion_mask, batch.n_prompt_tokens

    def loss_on(rows, denominator=None):
        lp = rollout.token_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows], P)
        return losses.policy_loss(lp, old[rows], adv[rows], mask[rows], agg="token-mean",
                                  denominator=denominator)[0]

    with torch.no_grad():
        full = loss_on(torch.arange(8)).item()
        halves = [torch.arange(4), torch.arange(4, 8)]
        shared = sum(loss_on(r, denominator=float(mask.sum())).item() for r in halves)
        naive = sum(loss_on(r).item() for r in halves) / 2
    assert float(mask.sum()) == 29.0
    assert shared == pytest.approx(full, abs=1e-6)
    assert abs(naive - full) > 1e-3


# --- determinism of the whole loop ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_same_seed_same_history(tok):
    # a tiny model, briefly fine-tuned so its completions vary in length; overlong shaping turns the lengths into
    # rewards that differ inside a group, so the advantages are not all 0 and the updates are real
    base = tiny_model(tok)
    train = tasks.load_split("train")
    warm_start.sft(base, tok, train, steps=15, batch_size=16, lr=3e-3, progress=False)
    cfg = config.make_config("grpo", seed=3, steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16,
                              overlong_shaping=True, overlong_cache_len=12, lr=1e-3, num_iterations=2,
                              num_minibatches=2, progress=False)
    eval_data = tasks.load_split("test").select(range(4))
    runs, finals = [], []
    for _ in range(2):
        model = copy.deepcopy(base)
        h = rl.train_rl(model, tok, cfg, train, eval_data=eval_data)
        runs.append([{k: v for k, v in r.items() if k not in TIMING} for r in h.rows])
        finals.append(model)
    assert runs[0] == runs[1]
    assert [r["step"] for r in runs[0]] == [0, 1, 2]
    assert "eval_accuracy" in runs[0][0] and "eval_accuracy" in runs[0][-1]
    assert all(r["grad_norm"] > 0 for r in runs[0][1:])  # the runs did train
    assert all(torch.equal(p, q) for p, q in zip(finals[0].parameters(), finals[1].parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(base.parameters(), finals[0].parameters(), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_the_foundation_presets_train_end_to_end(tok, algo):
    # overlong shaping makes the rewards differ inside a group (by length), so every estimator has signal
    base = tiny_model(tok)
    train = tasks.load_split("train")
    warm_start.sft(base, tok, train, steps=15, batch_size=16, lr=3e-3, progress=False)
    cfg = config.make_config(algo, seed=1, steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16,
                              overlong_shaping=True, overlong_cache_len=12, lr=1e-3, progress=False)
    model = copy.deepcopy(base)
    h = rl.train_rl(model, tok, cfg, train)
    assert [r["step"] for r in h.rows if "grad_norm" in r] == [1, 2]
    assert all(r["grad_norm"] > 0 for r in h.rows if "grad_norm" in r)
    assert not all(torch.equal(p, q) for p, q in zip(base.parameters(), model.parameters(), strict=True))


# --- the gpu profile, checked on CPU ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_gpu_profile_models_build_and_take_an_rl_step_on_cpu(tok, kind):
    # No GPU in CI: this checks that the gpu profile's sizes make valid models (heads divide the width, 16 experts
    # route) and that one RL step runs on them; it cannot check CUDA itself.
    prof = config.PROFILES["gpu"]
    build = models.tiny_moe if kind == "moe" else models.tiny_dense
    model = build(tok, seed=0, **getattr(prof, kind))
    n = models.count_parameters(model)
    small = models.count_parameters(build(tok, seed=0, **getattr(config.PROFILES["cpu"], kind)))
    assert n > 3 * small  # the gpu profile really is bigger
    cfg = config.make_config("gspo" if kind == "moe" else "grpo", seed=0, steps=1, prompts_per_step=2, group_size=2,
                              max_new_tokens=prof.max_new_tokens // 5, progress=False)
    h = rl.train_rl(model, tok, cfg, tasks.load_split("train"))
    # an untrained model scores 0 everywhere, so its advantages (and gradient) are 0: check the step ran cleanly
    assert [r["step"] for r in h.rows] == [1]
    for key in ("loss", "grad_norm", "entropy", "completion_length"):
        assert torch.isfinite(torch.tensor(h.last(key))), key


# --- dynamic sampling -------------------------------------------------------------------------------------------
ROUNDS = [t([1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]).flatten(), t([1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 1, 0]).flatten()]


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


@pytest.mark.slow
def test_trainer_dynamic_sampling_trains_on_exactly_the_kept_groups(tiny, monkeypatch):
    model, tok = tiny
    G = 4
    generated, scored, seen = [], [], {}
    real_generate = decoding.generate

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
    monkeypatch.setattr(rl.decoding, "generate", recording_generate)
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


@pytest.mark.slow
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
    r = decoding.generate(model, tok, ["1+2=", "3+4+5=", "6+7=", "8+9+1+2="], group_size=2, max_new_tokens=10)
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


# ------------------------------------------------------------------------------------------------------ adaptive KL
# paper-index: kl.adaptive_kl_beta
@pytest.mark.parametrize("observed, expected", [
    (0.10, 0.1 * (1 + 0.2 * 64 / 1000)),   # KL twice the target: error 1 clipped to +0.2 -> 0.10128
    (0.055, 0.1 * (1 + 0.1 * 64 / 1000)),  # 10% over: error 0.1 -> 0.10064
    (0.05, 0.1),                           # on target: unchanged
    (0.0, 0.1 * (1 - 0.2 * 64 / 1000)),    # no KL at all: error -1 clipped to -0.2 -> 0.09872
])
def test_adaptive_kl_controller_arithmetic(observed, expected):
    beta = kl.adaptive_kl_beta(0.1, observed, target_kl=0.05, horizon=1000, n_samples=64)
    assert math.isclose(beta, expected, rel_tol=1e-12)


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


@pytest.mark.slow
def test_ppo_smoke_run_logs_critic_and_kl_metrics(warm):
    h = _ppo(warm)
    assert len(h.rows) == 2
    for key in ("value_loss", "explained_variance", "kl_ref", "approx_kl", "clip_frac", "entropy", "reward"):
        assert all(math.isfinite(v) for v in h.series(key)[1]), key
    assert h.last("value_loss") > 0
    assert h.series("beta")[1] == [0.05, 0.05]  # fixed beta


@pytest.mark.slow
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


@pytest.mark.slow
def test_ppo_value_loss_is_the_same_under_gradient_accumulation(warm):
    # micro-batches share the minibatch's token count as denominator, so their losses add up to the full one
    whole = _ppo(warm, steps=1)
    split = _ppo(warm, steps=1, micro_batch_size=1)
    assert math.isclose(whole.last("value_loss"), split.last("value_loss"), rel_tol=1e-3)


@pytest.mark.slow
def test_trainer_routing_replay_is_exactly_on_policy_at_the_first_update(tok):
    # one rollout, one epoch, one minibatch (in micro-batches of 3 rows): the only update is on-policy, so every
    # ratio is 1 to float precision when replay restores the behaviour forward's experts
    model = models.tiny_moe(tok, seed=1)
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=10,
                              num_iterations=1, num_minibatches=1, micro_batch_size=3, beta=0.0,
                              routing_replay=True, progress=False)
    h = rl.train_rl(model, tok, cfg, tasks.load_split("train"))
    assert abs(h.last("ratio_min") - 1) < 1e-5 and abs(h.last("ratio_max") - 1) < 1e-5
    with pytest.raises(ValueError, match="MoE"):
        rl.train_rl(models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2), tok, cfg,
                         tasks.load_split("train"))


@pytest.mark.parametrize("micro", [None, 4])
def test_update_adds_exactly_coef_times_the_aux_loss(tok, moe_rollout, micro):
    # the same update with and without the switch: the objective differs by coef x the mean over equal micro-batches
    # of their load-balancing losses, and the router weights get a different gradient
    model0, r = moe_rollout
    adv = torch.tensor([1.0, -1.0] * 4)
    mb = rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=r.n_prompt_tokens,
                    completion_mask=r.completion_mask, loss_mask=r.completion_mask, old_logprobs=r.logprobs,
                    advantages=adv)
    out, grads = {}, {}
    for coef in (0.0, 0.5):
        model = models.tiny_moe(tok, seed=0)
        model.load_state_dict(model0.state_dict())
        cfg = config.make_config("grpo", beta=0.0, router_aux_loss_coef=coef, micro_batch_size=micro, progress=False)
        out[coef] = rl.update_minibatch(model, torch.optim.SGD(model.parameters(), lr=0.0), mb, cfg, beta=0.0)
        grads[coef] = moe.routers(model)[0].weight.grad.clone()
    with torch.no_grad(), moe.capture_router_logits(model0) as logits:
        model0(input_ids=r.input_ids, attention_mask=r.attention_mask)
    if micro is None:
        expected = moe.load_balancing_loss(logits, r.attention_mask, top_k=2)
    else:  # 8 rows in micro-batches of 4: the mean of the two halves' losses
        layers = len(logits)
        halves = [moe.load_balancing_loss([x.view(8, -1, x.shape[-1])[rows].reshape(-1, x.shape[-1])
                                           for x in logits[:layers]], r.attention_mask[rows], top_k=2)
                  for rows in (slice(0, 4), slice(4, 8))]
        expected = sum(halves) / 2
    assert abs(out[0.5]["loss"] - out[0.0]["loss"] - 0.5 * float(expected)) < 1e-6
    assert abs(out[0.5]["aux_loss"] - float(expected)) < 1e-6 and "aux_loss" not in out[0.0]
    assert float((grads[0.5] - grads[0.0]).abs().max()) > 1e-6


# paper-index: rl.train_rl
@pytest.mark.slow
def test_a_trl_style_reward_function_trains_one_step():
    # TRL's signature: (prompts, completions, **kwargs) with the dataset's other columns by name
    seen = {}

    def trl_reward(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [c.count("1") / max(len(c), 1) for c in completions]  # varies with what is written

    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    before = [p.clone() for p in model.parameters()]
    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="] * 4, "target": ["3", "7"] * 4})
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, lr=1e-3,
                             progress=False)
    h = rl.train_rl(model, tok, cfg, data, reward_fn=trl_reward)
    # the extra column (one value per completion), the token ids, and what of TRL's context minirl passes
    assert set(seen) == {"target", "completion_ids", "trainer_state", "log_metric"} and len(seen["target"]) == 8
    assert h.rows[-1]["step"] == 1 and math.isfinite(h.rows[-1]["loss"])
    moved = any(not torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))
    assert moved  # the step changed the policy


def test_train_rl_names_a_missing_prompt_column():
    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    with pytest.raises(ValueError, match="'prompt' column"):
        rl.train_rl(model, tok, config.make_config("grpo", steps=1), datasets.Dataset.from_dict({"text": ["x"]}))


# paper-index: rl.compute_advantages
def test_compute_advantages_takes_the_group_path_or_the_kl_to_go_path():
    from types import SimpleNamespace

    batch = SimpleNamespace(completion_mask=torch.ones(4, 2))
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv, returns, values = rl.compute_advantages(scores, None, batch, config.make_config("grpo", group_size=2),
                                                 beta=0.04)
    # group 0: [1, 0] - 0.5 = [0.5, -0.5], unbiased std 0.7071 + 1e-4; group 1 all equal: exactly 0
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0, 0]) / torch.tensor([0.70721, 0.70721, 1, 1]))
    assert returns is None and values is None
    # KL in the reward (beta 0.5): penalties-to-go, centred by the group mean of the first token's (no std)
    cfg = config.make_config("grpo", group_size=2, kl_placement="reward", kl_estimator="k1", beta=0.5)
    kl_tokens = torch.tensor([[0.2, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    adv, _, _ = rl.compute_advantages(scores, kl_tokens, batch, cfg, beta=0.5)
    # row 0: C = [0.1, 0], group mean of C_0 = 0.05: A = 0.70700 - [0.05, -0.05]; row 1: -0.70700 + 0.05
    a = 0.5 / 0.70721
    torch.testing.assert_close(adv[:2], torch.tensor([[a - 0.05, a + 0.05], [-a + 0.05, -a + 0.05]]), atol=1e-5,
                               rtol=0)


def test_compute_advantages_takes_the_rloo_and_reinforce_pp_paths():
    from types import SimpleNamespace

    batch = SimpleNamespace(completion_mask=torch.ones(4, 2))
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv, returns, values = rl.compute_advantages(scores, None, batch, config.make_config("rloo", group_size=2),
                                                 beta=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))  # 1 - 0 and 0 - 1; the equal group 0
    assert returns is None and values is None
    adv, _, _ = rl.compute_advantages(scores, None, batch, config.make_config("reinforce_pp", group_size=2), beta=0.0)
    # batch mean 0.75, std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 (+ 1e-4): [0.25, -0.75, 0.25, 0.25] / 0.5001
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, 0.25, 0.25]) / 0.5001)
    cfg = config.make_config("reinforce_pp_baseline", group_size=2)
    adv, _, _ = rl.compute_advantages(scores, None, batch, cfg, beta=0.0)
    # c = [0.5, -0.5, 0, 0], std_B(c) = sqrt(0.5 / 3) = 0.40825 (+ 1e-4)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]) / ((0.5 / 3) ** 0.5 + 1e-4))


# --- TRL's reward contract in the loop: unscored rows (test_rewards.py) -----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"])
def test_train_rl_passes_the_contract_and_trains_around_unscored_rows(algo):
    """One step of each outcome estimator (RLOO and REINFORCE++ raised here before; issue 35, defect 4): the
    reward function gets completion_ids (the ids up to EOS, matching the texts), the dataset column, trainer_state
    (global_step 0 of max_steps 1) and log_metric (logged in the History row);
    it returns None for the prompts of task "skip", which are unscored (warned, advantage 0), and the step is
    finite and moves the policy."""
    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    before = [p.clone() for p in model.parameters()]
    seen = {}

    def multi_task(prompts, completions, completion_ids, task, trainer_state, log_metric, **_):
        seen.update(ids=completion_ids, completions=completions, step=trainer_state.global_step,
                    max_steps=trainer_state.max_steps)
        log_metric("my_metric", 2.5)
        return [None if t == "skip" else c.count("1") / max(len(c), 1) for c, t in zip(completions, task, strict=True)]

    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="], "task": ["count", "skip"]})
    cfg = config.make_config(algo, steps=1, prompts_per_step=4, group_size=4, max_new_tokens=8, lr=1e-3,
                             progress=False, seed=0)
    with pytest.warns(UserWarning, match="every reward function returned None"):
        h = rl.train_rl(model, tok, cfg, data, reward_fn=multi_task)
    assert (seen["step"], seen["max_steps"]) == (0, 1)
    assert [tok.decode(ids, skip_special_tokens=True) for ids in seen["ids"]] == seen["completions"]
    row = h.rows[-1]
    assert row["my_metric"] == 2.5 and row["unscored"] % 4 == 0 and row["unscored"] > 0
    assert math.isfinite(row["loss"]) and math.isfinite(row["reward"])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))


def test_each_reward_function_is_logged_beside_the_weighted_sum():
    """Issue 47 item 13: a run with two rewards logs each one's own mean (rewards/<name>/mean, unweighted, as TRL),
    so a reward that never fires shows as 0 though the weighted sum moves. Scripted rewards: the situation holds
    whatever the model samples."""
    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)

    def answer_reward(completions, **_):
        return [0.0] * len(completions)  # never fires

    def format_reward(completions, **_):
        return [float(i % 2) for i in range(len(completions))]  # half of the rows

    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="]})
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, progress=False)
    fns = [answer_reward, format_reward]
    row = rl.train_rl(model, tok, cfg, data, reward_fn=fns, reward_weights=[2.0, 0.5]).rows[-1]
    assert row["rewards/answer_reward/mean"] == 0.0 and row["rewards/format_reward/mean"] == 0.5
    assert row["reward"] == 0.25  # 2 x 0 + 0.5 x 0.5: the sum alone would not say which reward fired


def test_ppo_with_unscored_rows_is_an_error():
    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    data = datasets.Dataset.from_dict({"prompt": ["1+2="]})
    cfg = config.make_config("ppo", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, progress=False)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="PPO's critic needs a reward"):
        rl.train_rl(model, tok, cfg, data, reward_fn=lambda prompts, completions, **_: [None] * len(prompts))


def test_overlong_shaping_scores_an_unscored_row_as_trl_does():
    """In TRL the overlong penalty is one more reward function, so a row None for the task is not None for
    every function: its reward is the penalty alone (nansum). max_len 20, cache 4: lengths 18 and 20 ->
    -0.5 and -1; task scores [1, None] -> [1 - 0.5, 0 - 1] = [0.5, -1.0]."""
    from types import SimpleNamespace

    cfg = config.make_config("dapo", max_new_tokens=20, overlong_cache_len=4)
    batch = SimpleNamespace(lengths=torch.tensor([18.0, 20.0]), completion_mask=torch.ones(2, 20))
    assert rl.shape_rewards(torch.tensor([1.0, math.nan]), batch, cfg).tolist() == [0.5, -1.0]


# --- which log-probs play pi_old: decided once (rl.pi_old_source) -----------------------------------------------
@pytest.mark.parametrize("overrides, sampler_is_trainer, expected", [
    (dict(num_minibatches=1), True, "current"),  # one update per rollout: the training forward's own, detached
    (dict(num_minibatches=2), True, "recomputed"),  # later minibatches see an updated policy
    (dict(num_minibatches=1, num_iterations=2), True, "recomputed"),
    (dict(num_minibatches=1), False, "recomputed"),  # a sampler that is not the trainer: its gap is measured
    (dict(num_minibatches=1, routing_replay=True), True, "recomputed"),  # R2 records pi_old's experts
    (dict(num_minibatches=1, beta=0.05, kl_placement="reward"), True, "recomputed"),  # read before the update
    (dict(num_minibatches=1, pi_old="naive"), True, "sampler"),
    (dict(num_minibatches=2, pi_old="naive"), False, "sampler"),
])
def test_pi_old_source_decides_once(overrides, sampler_is_trainer, expected):
    cfg = config.make_config("grpo", **overrides)
    assert rl.pi_old_source(cfg, sampler_is_trainer=sampler_is_trainer) == expected


@pytest.mark.parametrize("source", ["current", "recomputed", "sampler"])
def test_behaviour_logprobs_follow_the_source(tok, source):
    """"current": None (the update detaches its own); "recomputed": the trainer's forward; "sampler": the decode
    loop's own log-probs, exactly."""
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    torch.manual_seed(0)
    r = decoding.generate(model, tok, ["1+2=", "3+4="], 2, 6, recompute_logprobs=False)
    cfg = config.make_config("grpo", pi_old="naive" if source == "sampler" else "recomputed")
    old, _, _ = rl.behaviour_logprobs(model, None, r, cfg, source=source)
    if source == "current":
        assert old is None
    elif source == "sampler":
        assert torch.equal(old, torch.where(r.completion_mask > 0, r.sampler_logprobs, 0.0))
    else:
        want = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens)
        torch.testing.assert_close(old, torch.where(r.completion_mask > 0, want, 0.0))
    with pytest.raises(ValueError, match="source"):
        rl.behaviour_logprobs(model, None, r, cfg, source="trainer")
