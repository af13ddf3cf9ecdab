"""Tests of minirl.warm_start: the SFT batch and schedule, the held-out validation rows, and when the warm start stops,
caches and shares its held-out evaluation (on a tiny model with scripted evaluations). The shipped checkpoint:
test_shipped_warm_start.py."""

import copy
import dataclasses
import json

import pytest
import torch
from helpers import tiny_model

from minirl import tasks, warm_start


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


@pytest.mark.slow
def test_sft_stops_when_asked(tok):
    model = tiny_model(tok)
    calls = []
    curve = warm_start.sft(model, tok, tasks.load_split("train").select(range(64)), steps=50, batch_size=4,
                           progress=False, stop=lambda n: calls.append(n) or n == 3)
    assert len(curve) == 3 and calls == [1, 2, 3]  # stop(n) after each step; True ends the run there


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
