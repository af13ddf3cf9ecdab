"""Tests of the loop's parts: config (presets, validation), History, the SFT batch, evaluation, rl (RLBatch,
update_minibatch, gradient accumulation, reward functions in TRL's form, determinism) and the command line."""

import copy
import csv
import dataclasses
import json
import math
import subprocess
import sys
from functools import partial
from pathlib import Path

import helpers
import pytest
import torch
from helpers import tiny_model

from minirl import advantages, config, evaluation, history, losses, models, moe, rl, rollout, tasks, warm_start
from minirl.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TIMING = {"time", "time_generate", "time_optimise"}
D = torch.float64
MODES = losses.AGGREGATIONS


def t(*rows):
    return torch.tensor(rows, dtype=D)


close = partial(helpers.close, atol=1e-7, dtype=D)


# --- make_config / RLConfig -----------------------------------------------------------------------------------------
def test_presets_carry_the_papers_switches():
    grpo, dr = config.make_config("grpo"), config.make_config("dr_grpo")
    assert (grpo.adv_scale, grpo.agg, grpo.kl_estimator, grpo.kl_placement) == (
        "group", "seq-mean-token-mean", "k3", "loss")
    assert grpo.beta > 0 and grpo.eps_low == grpo.eps_high == 0.2
    # Dr. GRPO is both halves: no std division AND the constant normaliser, and no KL
    assert (dr.adv_scale, dr.agg, dr.beta) == ("none", "seq-mean-token-sum-norm", 0.0)
    for name in config.ALGORITHMS:
        cfg = config.make_config(name)
        assert cfg.algo == name
        cfg.validate()


def test_overrides_win_over_the_preset():
    cfg = config.make_config("grpo", beta=0.0, lr=1e-5, agg="token-mean")
    assert (cfg.beta, cfg.lr, cfg.agg, cfg.adv_scale) == (0.0, 1e-5, "token-mean", "group")


def test_unknown_algorithm_is_named():
    with pytest.raises(ValueError, match=r"algorithm 'foo'.*grpo"):
        config.make_config("foo")


def test_unknown_field_is_named():
    with pytest.raises(ValueError, match="unknown RLConfig field.*'learning_rate'"):
        config.make_config("grpo", learning_rate=1e-4)


@pytest.mark.parametrize("overrides, named", [
    (dict(agg="mean"), "agg"),
    (dict(adv_scale="std"), "adv_scale"),
    (dict(level="seq"), "level"),
    (dict(kl_estimator="k4"), "kl_estimator"),
    (dict(kl_placement="both"), "kl_placement"),
    (dict(steps=0), "steps"),
    (dict(group_size=1), "group_size"),
    (dict(prompts_per_step=6, num_minibatches=4), "num_minibatches"),
    (dict(temperature=0.0), "temperature"),
    (dict(level="sequence", agg="token-mean"), "agg"),
])
def test_invalid_settings_name_the_field(overrides, named):
    with pytest.raises(ValueError, match=named):
        config.make_config("grpo", **overrides)
    cfg = config.RLConfig(**overrides)  # a hand-built config is caught by validate()
    with pytest.raises(ValueError, match=named):
        cfg.validate()


# --- History --------------------------------------------------------------------------------------------------------
def make_history():
    h = history.History()
    h.log(step=0, eval_accuracy=0.25)
    h.log(step=1, reward=0.5, loss=-0.1)
    h.log(step=2, reward=0.75, loss=None)
    h.log(step=3, reward=1.0, eval_accuracy=0.5)
    return h


def test_history_series_and_last():
    h = make_history()
    assert h.series("reward") == ([1, 2, 3], [0.5, 0.75, 1.0])
    assert h.series("eval_accuracy") == ([0, 3], [0.25, 0.5])
    assert h.series("loss") == ([1], [-0.1])  # None values are skipped
    assert h.last("reward") == 1.0 and h.last("loss") == -0.1
    with pytest.raises(KeyError, match="entropy"):
        h.last("entropy")
    assert h.series("entropy") == ([], [])


def test_history_to_jsonl_and_csv(tmp_path):
    h = make_history()
    h.to_jsonl(tmp_path / "m.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert rows == h.rows
    h.to_csv(tmp_path / "m.csv")
    with open(tmp_path / "m.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4
    assert set(table[0]) == {"step", "reward", "loss", "eval_accuracy"}  # the union of all keys
    assert table[1]["reward"] == "0.5" and table[0]["reward"] == ""  # missing values are empty cells


# --- SFT batch ------------------------------------------------------------------------------------------------------
def test_sft_batch_by_hand(tok):
    b = warm_start.sft_batch(tok, ["1+1=", "2+3+4="], ["1+1=2#2", "5#5"])
    # row 0: <bos> 1 + 1 = (5 ids) + "1+1=2#2" (7) + <eos> = 13; row 1: <bos> 2 + 3 + 4 = (7) + "5#5" (3) + <eos> = 11
    # right-padded to 13; the labels are -100 on the prompt and on the padding
    assert b["input_ids"].shape == b["labels"].shape == b["attention_mask"].shape == (2, 13)
    assert b["attention_mask"].sum(1).tolist() == [13, 11]
    assert b["input_ids"][1, -2:].tolist() == [tok.pad_token_id] * 2
    eos = tok.eos_token_id
    assert b["labels"][0].tolist() == [-100] * 5 + tok("1+1=2#2", add_special_tokens=False).input_ids + [eos]
    assert b["labels"][1].tolist() == [-100] * 7 + tok("5#5", add_special_tokens=False).input_ids + [eos, -100, -100]
    assert b["input_ids"][0, 0] == tok.bos_token_id


# --- evaluate -------------------------------------------------------------------------------------------------------
def test_evaluate_is_repeatable_and_leaves_the_rng_alone(tok):
    model = tiny_model(tok)
    data = tasks.load_split("test").select(range(6))
    state = torch.get_rng_state()
    a = evaluation.evaluate(model, tok, data, max_new_tokens=8, temperature=1.0, samples_per_prompt=2, batch_size=4)
    assert torch.equal(torch.get_rng_state(), state)  # evaluating does not change the course of training
    b = evaluation.evaluate(model, tok, data, max_new_tokens=8, temperature=1.0, samples_per_prompt=2, batch_size=4)
    assert a == b
    assert a["n"] == 12 and set(a) >= {"accuracy", "format_rate", "mean_length", "truncated_rate", "n"}
    assert 0 <= a["accuracy"] <= a["format_rate"] <= 1 and 1 <= a["mean_length"] <= 8
    g = evaluation.evaluate(model, tok, data, max_new_tokens=8, greedy=True, samples_per_prompt=5)
    assert g["n"] == 6  # greedy takes one completion per prompt


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


# --- command line ---------------------------------------------------------------------------------------------------
def test_cli_help(capsys):
    # the real entry point, in a fresh interpreter (imports torch and transformers: a few seconds)
    top = subprocess.run([sys.executable, "-m", "minirl", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=180)
    assert top.returncode == 0, top.stderr
    assert "train" in top.stdout and "bench" in top.stdout
    # the subcommand's help, in this process (same parser, no second interpreter start-up)
    from minirl.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    train = capsys.readouterr().out
    for flag in ("--algo", "--seed", "--profile", "--steps", "--out"):
        assert flag in train
    assert "grpo" in train and "dr_grpo" in train


def test_cli_unknown_algorithm(capsys):
    from minirl.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--algo", "foo"])
    assert e.value.code == 2
    assert "--algo" in capsys.readouterr().err


def test_cli_train_writes_its_summary_and_quotes_the_shared_warm_start_evaluation(tok, monkeypatch, tmp_path, capsys):
    """`python -m minirl train` end to end on a tiny model (the warm start replaced, so nothing is trained for
    minutes): one RL step, the three files written, and the warm start's shared evaluation in the summary and the
    printout, as every notebook quotes it."""
    from minirl.__main__ import main

    heldout = {"sampled": 0.3, "sampled_se": 0.02, "greedy": 0.5, "greedy_se": 0.03, "prompts": 256, "samples": 16}
    small, asked = tiny_model(tok), []

    def fake_warm_start(prof, seed=0):
        asked.append(seed)
        return small, tok, {"parameters": 1, "heldout": heldout}

    monkeypatch.setattr(warm_start, "warm_start", fake_warm_start)
    assert main(["train", "--algo", "grpo", "--steps", "1", "--seed", "3", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["warm_start_heldout"] == heldout and summary["steps"] == 1
    # the RL seed does not pick the starting model: --warm-start-seed does (default 0, the shipped one)
    assert asked == [0] and (summary["seed"], summary["warm_start_seed"]) == (3, 0)
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "curves.png").exists()
    assert "warm start (256 test prompts): sampled at T = 1 0.300 +- 0.020" in capsys.readouterr().out


# --- the warm start's schedule ----------------------------------------------------------------------------------------
def test_sft_schedule_warms_up_then_decays_to_zero_by_hand():
    f = warm_start.sft_lr_factor
    # warm-up: (s + 1) / 20; decay: 0.5 * (1 + cos(pi * (s + 1 - 20) / (100 - 20)))
    assert f(0, 100) == pytest.approx(0.05) and f(19, 100) == pytest.approx(1.0)
    assert f(59, 100) == pytest.approx(0.5)  # halfway through the decay: (60 - 20) / 80 = 0.5 -> cos = 0
    assert f(99, 100) == pytest.approx(0.0, abs=1e-12)  # the last step has (almost) no learning rate left
    assert all(f(s, 100) >= f(s + 1, 100) for s in range(19, 99))  # monotone after the warm-up


def test_the_warm_start_validation_rows_are_held_out_of_sft():
    train = tasks.load_split("train")
    sft_rows, validation = warm_start.split_validation(train)
    assert len(validation) == warm_start.VALIDATION_SIZE == 256 == len(set(validation["prompt"]))  # distinct
    assert not set(sft_rows["prompt"]) & set(validation["prompt"])  # no validation prompt is fine-tuned on
    assert len(sft_rows) + len(validation) <= len(train) and len(sft_rows) > 0.8 * len(train)


def test_sft_stops_when_asked(tok):
    model = tiny_model(tok)
    calls = []
    curve = warm_start.sft(model, tok, tasks.load_split("train").select(range(64)), steps=50, batch_size=4,
                           progress=False, stop=lambda n: calls.append(n) or n == 3)
    assert len(curve) == 3 and calls == [1, 2, 3]  # stop(n) after each step; True ends the run there


def test_warm_start_stops_at_the_first_full_check_that_reaches_the_target(tok, monkeypatch, tmp_path, capsys):
    """The stopping rule with scripted accuracies (target 0.35, screen margin 0.15): the full check runs only when
    the screen reaches 0.20, and the run stops at the first full check >= 0.35, not at a screen above it."""
    from minirl.config import PROFILES

    screens = iter([0.05, 0.10, 0.40, 0.25, 0.30, 0.50])  # checks at steps 5, 10, ..., 30
    fulls = iter([0.30, 0.33, 0.36])  # full checks at steps 15, 20, 25 (the screen 0.10 at step 10 skips one)
    calls = []

    def scripted_evaluate(model, tokenizer, dataset, max_new_tokens, temperature=1.0, greedy=False,
                          samples_per_prompt=1, **kw):
        full = len(dataset) == warm_start.VALIDATION_SIZE
        calls.append((len(dataset), samples_per_prompt))
        return {"accuracy": next(fulls) if full else next(screens)}

    monkeypatch.setattr(warm_start, "evaluate", scripted_evaluate)
    monkeypatch.setattr(warm_start, "heldout_evaluation", lambda *a: {})  # the test split is not what is scripted
    small = tiny_model(tok)
    monkeypatch.setattr(warm_start.models, "tiny_dense", lambda tok, seed=0, **kw: small)
    profile = dataclasses.replace(PROFILES["cpu"], sft_batch_size=4, sft_steps=100)
    _, _, info = warm_start.warm_start(profile, seed=0, cache=False, progress=True)
    assert len(info["sft_loss"]) == 25
    # the progress bar stops at 25 of 100: the run says why
    assert ("warm start: stopped after 25 of 100 SFT steps (sampled accuracy on the validation prompts reached the "
            "target 0.35); kept the weights of step 25") in capsys.readouterr().out
    assert info["validation_checks"] == [(5, 0.05, None), (10, 0.10, None), (15, 0.40, 0.30), (20, 0.25, 0.33),
                                         (25, 0.30, 0.36)]
    assert calls.count((warm_start.SCREEN_PROMPTS, 1)) == 5 and calls.count((256, warm_start.SAMPLES_PER_PROMPT)) == 3
    # 0.36 is 0.01 above the target, 0.33 is 0.02 below: the reached one is closer and kept
    assert info["kept_step"] == 25


def test_warm_start_keeps_the_check_closer_to_the_target(tok, monkeypatch):
    """A jump past the target (0.30 -> 0.46 at target 0.35): the weights of the check below, 0.05 away, are kept
    instead of those 0.11 above; they are the weights the model had at that check."""
    from minirl.config import PROFILES

    accuracies = iter([0.30, 0.46])
    small = tiny_model(tok)
    saved = {}

    def scripted_evaluate(model, tokenizer, dataset, *args, samples_per_prompt=1, **kw):
        if len(dataset) < warm_start.VALIDATION_SIZE:
            return {"accuracy": 0.3}  # the screen lets every full check run
        accuracy = next(accuracies)
        saved[accuracy] = {k: v.clone() for k, v in model.state_dict().items()}
        return {"accuracy": accuracy}

    monkeypatch.setattr(warm_start, "evaluate", scripted_evaluate)
    monkeypatch.setattr(warm_start, "heldout_evaluation", lambda *a: {})  # the test split is not what is scripted
    monkeypatch.setattr(warm_start.models, "tiny_dense", lambda tok, seed=0, **kw: small)
    profile = dataclasses.replace(PROFILES["cpu"], sft_batch_size=4, sft_steps=100)
    model, _, info = warm_start.warm_start(profile, seed=0, cache=False, progress=False)
    assert len(info["sft_loss"]) == 10 and info["kept_step"] == 5
    assert all(torch.equal(v, saved[0.30][k]) for k, v in model.state_dict().items())
    assert not all(torch.equal(v, saved[0.46][k]) for k, v in model.state_dict().items())


def test_evaluate_standard_error_over_prompts_by_hand(tok):
    """A reward that depends only on the prompt: prompt 0 always right, prompt 1 always wrong, 2 samples each.
    Over completions the scores are [1, 1, 0, 0]: std (n - 1) = sqrt(1/3) = 0.57735, SE = 0.57735 / 2 = 0.28868.
    Over prompts the means are [1, 0]: std = sqrt(1/2) = 0.70711, SE = 0.70711 / sqrt(2) = 0.5, the honest one,
    because a prompt's two completions carry one prompt's worth of information."""
    data = tasks.load_split("test").select(range(2))
    first = data["prompt"][0]

    def by_prompt(prompts, completions, **kw):
        return [1.0 if p == first else 0.0 for p in prompts]

    out = evaluation.evaluate(tiny_model(tok), tok, data, max_new_tokens=4, samples_per_prompt=2, reward_fn=by_prompt)
    assert out["accuracy"] == 0.5
    assert out["accuracy_stderr"] == pytest.approx(3 ** -0.5 / 2, abs=1e-6)
    assert out["accuracy_stderr_prompts"] == pytest.approx(0.5, abs=1e-6)


def _scripted_warm_start(tok, monkeypatch, tmp_path, builds):
    """warm_start on a tiny model with every evaluation scripted (validation 0.4, so the first full check stops
    the run; test split: sampled 0.3, greedy 0.5), caching under tmp_path; ``builds`` counts the models built."""
    from minirl.config import PROFILES

    def scripted_evaluate(model, tokenizer, dataset, max_new_tokens, temperature=1.0, greedy=False,
                          samples_per_prompt=1, **kw):
        if dataset["prompt"] == tasks.load_split("test")["prompt"]:
            return {"accuracy": 0.5 if greedy else 0.3, "accuracy_stderr": 0.03, "accuracy_stderr_prompts": 0.02}
        return {"accuracy": 0.4}

    small = tiny_model(tok)

    def build(tok, seed=0, **kw):
        builds.append(seed)
        return copy.deepcopy(small)

    monkeypatch.setattr(warm_start, "evaluate", scripted_evaluate)
    monkeypatch.setattr(warm_start, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(warm_start.models, "tiny_dense", build)
    return dataclasses.replace(PROFILES["cpu"], sft_batch_size=4, sft_steps=100)


def test_the_warm_start_carries_one_shared_heldout_evaluation(tok, monkeypatch, tmp_path):
    """Trained once, then loaded: both return the same ``heldout`` record (every test prompt, 16 samples at T = 1,
    and greedy) and ``describe_heldout`` quotes it; a checkpoint cached before the record existed gets it on load."""
    builds = []
    profile = _scripted_warm_start(tok, monkeypatch, tmp_path, builds)
    _, _, trained = warm_start.warm_start(profile, seed=0, progress=False)
    _, _, loaded = warm_start.warm_start(profile, seed=0, progress=False)
    assert builds == [0] and trained["heldout"] == loaded["heldout"] == {
        "sampled": 0.3, "sampled_se": 0.02, "greedy": 0.5, "greedy_se": 0.03, "prompts": 256, "samples": 16}
    assert warm_start.describe_heldout(loaded) == ("warm start (256 test prompts): sampled at T = 1 0.300 +- 0.020 "
                                           "(16 samples each), greedy 0.500 +- 0.030")
    info_file = next(tmp_path.glob("warmstart/*/info.json"))
    old = json.loads(info_file.read_text())
    del old["heldout"]
    info_file.write_text(json.dumps(old))
    _, _, upgraded = warm_start.warm_start(profile, seed=0, progress=False)
    assert builds == [0] and upgraded["heldout"] == trained["heldout"]
    assert json.loads(info_file.read_text())["heldout"] == trained["heldout"]


def test_two_processes_asking_for_the_same_warm_start_train_it_once(tok, monkeypatch, tmp_path):
    """Notebooks may run in parallel (CI's second configuration uses pytest -n 2): the cache is locked, so a
    second caller waits for the first one's checkpoint instead of training it again or reading half a file."""
    import threading

    builds = []
    profile = _scripted_warm_start(tok, monkeypatch, tmp_path, builds)
    results = []
    threads = [threading.Thread(target=lambda: results.append(warm_start.warm_start(profile, progress=False)[2]))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds == [0] and len(results) == 2 and results[0]["heldout"] == results[1]["heldout"]


def test_show_completions_gives_each_model_the_same_prompts_and_scores_them(tok, capsys):
    rows = tasks.load_split("test").select(range(2))
    a, b = tiny_model(tok, seed=0), tiny_model(tok, seed=1)
    out = evaluation.show_completions({"a": a, "b": b}, tok, rows, max_new_tokens=6, samples_per_prompt=2)
    assert [r["model"] for r in out] == ["a"] * 4 + ["b"] * 4
    assert [r["prompt"] for r in out[:4]] == [rows[0]["prompt"]] * 2 + [rows[1]["prompt"]] * 2
    answer = {row["prompt"]: row["answer"] for row in rows}
    for r in out:  # the reward is the task's score of the completion shown
        assert r["reward"] == float(tasks.score(r["completion"], answer[r["prompt"]]).correct)
    assert len(capsys.readouterr().out.strip().splitlines()) == 8
    again = evaluation.show_completions({"a": a}, tok, rows, max_new_tokens=6, samples_per_prompt=2)
    assert [r["completion"] for r in again] == [r["completion"] for r in out[:4]]  # seeded: repeatable


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
