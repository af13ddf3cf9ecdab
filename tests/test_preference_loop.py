"""The preference training loop of minirl.preference_loop: DPO, IPO, KTO, SimPO on a tiny random model.

Hand values: with the reference equal to the policy every log-ratio is 0, so at the first step DPO's loss is
ln 2 = 0.693147, IPO's is (0 - 1/(2 tau))^2 = 25.0 for tau = 0.1, and KTO's is 1 - sigmoid(0) = 0.5 per example.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from datasets import Dataset

from minirl import decoding, models, preference_data, rollout
from minirl import preference as pref
from minirl import preference_loop as loop

PAIRS = {
    "prompt": ["3+4=", "9+9+1=", "2+5+6=", "8+1="],
    "chosen": ["3+4=7#7", "9+9=18;18+1=19#19", "2+5=7;7+6=13#13", "8+1=9#9"],
    "rejected": ["3+4=8#8", "9+9=18;18+1=91#91", "2+5=7;7+6=12#12", "8+1=9#"],
}


def tiny(tok, seed=0):
    return models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=seed)


@pytest.fixture()
def pairs():
    return Dataset.from_dict(PAIRS)


def cfg(method, **kw):
    base = dict(method=method, steps=1, batch_size=4, lr=1e-3, progress=False)
    return loop.PrefConfig(**{**base, **kw})


def data_for(method, pairs):
    return preference_data.pairs_to_examples(pairs) if method == "kto" else pairs


# ---------------------------------------------------------------------------------------------- encoding


def test_encode_completions_reproduces_rollout_logprobs(tok):
    # re-encoding sampled texts gives the rollout's own behaviour log-probs (rows that ended with EOS)
    model = tiny(tok)
    torch.manual_seed(0)
    r = decoding.generate(model, tok, ["3+4=", "9+9+1+2="], 16, 24)
    special = set(tok.all_special_ids)

    def plain(i):  # ended with EOS and sampled no other special token (decoding would drop it)
        n = int(r.completion_mask[i].sum())
        return not r.truncated[i] and not special & set(r.completion_ids[i, :n - 1].tolist())

    keep = [i for i in range(32) if plain(i)]
    assert len(keep) >= 3, "the random model should end some samples with EOS within 24 tokens"
    prompts = [["3+4=", "9+9+1+2="][i // 16] for i in keep]
    enc = loop.encode_completions(tok, prompts, [r.completions[i] for i in keep])
    model.eval()
    with torch.no_grad():
        lp = loop._completion_logps(model, enc, 1.0)
    mine = rollout.sequence_logprobs(lp, enc["completion_mask"])
    theirs = rollout.sequence_logprobs(r.logprobs[keep], r.completion_mask[keep])
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


def test_encode_completions_layout(tok):
    enc = loop.encode_completions(tok, ["1+2=", "9+9+9="], ["1+2=3#3", "x"])
    # prompts: BOS + 4 chars and BOS + 6 chars -> P = 7; completions: 7 + EOS and 1 + EOS -> T = 8
    assert enc["n_prompt_tokens"] == 7
    assert enc["input_ids"].shape == (2, 15)
    assert enc["completion_mask"].sum(-1).tolist() == [8.0, 2.0]
    assert enc["attention_mask"].sum(-1).tolist() == [5 + 8, 7 + 2]
    assert enc["input_ids"][0, 0].item() == tok.pad_token_id  # the shorter prompt is left-padded
    assert enc["input_ids"][1, 7 + 1].item() == tok.eos_token_id


def test_encode_completions_rejects_bad_input(tok):
    with pytest.raises(ValueError, match="as many prompts"):
        loop.encode_completions(tok, ["1+2="], ["3#3", "4#4"])
    with pytest.raises(ValueError, match="at least one"):
        loop.encode_completions(tok, [], [])


# ---------------------------------------------------------------------------------------------- first step values


# paper-index: preference_loop.train_preference
@pytest.mark.slow
@pytest.mark.parametrize("method,expected", [("dpo", math.log(2)), ("ipo", 25.0), ("kto", 0.5)])
def test_first_step_loss_with_reference_equal_to_policy(tok, pairs, method, expected):
    # dpo: -log sigmoid(0) = ln 2 = 0.693147; ipo tau 0.1: (0 - 5)^2 = 25; kto: 1 - sigmoid(0) = 0.5
    h = loop.train_preference(tiny(tok), tok, data_for(method, pairs), cfg(method, batch_size=4))
    row = h.rows[0]
    assert row["loss"] == pytest.approx(expected, abs=1e-6)
    if method != "kto":
        assert row["chosen_rewards"] == 0.0 and row["rejected_rewards"] == 0.0 and row["margins"] == 0.0
    else:
        assert row["z0"] == 0.0 and row["desirable_rewards"] == 0.0


@pytest.mark.slow
def test_dpo_first_step_is_ln2_with_label_smoothing_too(tok, pairs):
    h = loop.train_preference(tiny(tok), tok, pairs, cfg("dpo", label_smoothing=0.2))
    assert h.rows[0]["loss"] == pytest.approx(0.693147, abs=1e-6)


@pytest.mark.slow
def test_simpo_first_step_matches_hand_computation(tok, pairs):
    model = tiny(tok)
    enc = loop.encode_completions(tok, PAIRS["prompt"] * 2, PAIRS["chosen"] + PAIRS["rejected"])
    with torch.no_grad():
        mean = rollout.sequence_logprobs(loop._completion_logps(model, enc, 1.0), enc["completion_mask"],
                                         reduction="mean")
    expected = -torch.nn.functional.logsigmoid(2.0 * (mean[:4] - mean[4:]) - 1.0).mean()  # beta 2, gamma 1
    h = loop.train_preference(model, tok, pairs, cfg("simpo"))
    assert h.rows[0]["loss"] == pytest.approx(expected.item(), abs=1e-5)


# paper-index: preference_loop.preference_pair_loss
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_ipo_reduction_is_the_one_asked_for(tok, pairs, reduction):
    # ref = a different model, so h != 0 and the reduction matters
    model, ref = tiny(tok, seed=0), tiny(tok, seed=1).eval()
    c = cfg("ipo", reduction=reduction)
    enc = loop.encode_completions(tok, PAIRS["prompt"] * 2, PAIRS["chosen"] + PAIRS["rejected"])
    with torch.no_grad():
        pol = rollout.sequence_logprobs(loop._completion_logps(model, enc, 1.0), enc["completion_mask"],
                                        reduction=reduction)
    refl = loop.reference_logps(ref, enc, 1.0, reduction)
    expected, _ = pref.ipo_loss(pol[:4], pol[4:], refl[:4], refl[4:], tau=0.1)
    loss, _ = loop.preference_pair_loss(model, ref, tok, PAIRS, c)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_method_defaults_follow_the_papers():
    assert loop.PrefConfig(method="dpo").resolved() == {"beta": 0.1, "reduction": "sum"}
    assert loop.PrefConfig(method="simpo").resolved() == {"beta": 2.0, "reduction": "mean"}
    assert loop.PrefConfig(method="kto").resolved() == {"beta": 0.1, "reduction": "sum"}
    assert loop.PrefConfig(method="ipo").resolved()["reduction"] == "sum"
    assert loop.PrefConfig(method="ipo", reduction="mean").resolved()["reduction"] == "mean"


# ---------------------------------------------------------------------------------------------- the reference model


@pytest.mark.slow
def test_reference_is_frozen_in_eval_mode_and_run_without_grad(tok, pairs):
    model, ref = tiny(tok), tiny(tok)
    ref.train()  # the loop must switch it to eval mode
    before = copy.deepcopy(ref.state_dict())
    seen = []
    ref.register_forward_hook(lambda mod, inp, out: seen.append((torch.is_grad_enabled(), mod.training)))
    loop.train_preference(model, tok, pairs, cfg("dpo", steps=3), ref_model=ref)
    assert seen and all(grad is False and training is False for grad, training in seen)
    assert all(p.grad is None and not p.requires_grad for p in ref.parameters())
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


@pytest.mark.slow
def test_default_reference_is_a_frozen_copy_of_the_start(tok, pairs):
    model = tiny(tok)
    start = copy.deepcopy(model.state_dict())
    h = loop.train_preference(model, tok, pairs, cfg("dpo", steps=2))
    # the policy moved, the reference (a copy made at the start) held the reference bytes
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())
    assert h.rows[-1]["memory_reference_bytes"] == h.rows[-1]["memory_policy_bytes"]


def test_reference_logps_refuses_train_mode(tok):
    enc = loop.encode_completions(tok, ["1+2="], ["1+2=3#3"])
    with pytest.raises(ValueError, match="eval mode"):
        loop.reference_logps(tiny(tok).train(), enc)


@pytest.mark.slow
def test_simpo_makes_no_reference(tok, pairs, monkeypatch):
    model, ref = tiny(tok), tiny(tok, seed=1)
    real = copy.deepcopy

    def no_model_copies(x, *a, **k):
        if isinstance(x, torch.nn.Module):
            pytest.fail("SimPO must not copy the policy")
        return real(x, *a, **k)

    monkeypatch.setattr(loop.copy, "deepcopy", no_model_copies)
    calls = []
    ref.register_forward_hook(lambda *a: calls.append(1))
    h = loop.train_preference(model, tok, pairs, cfg("simpo", steps=2), ref_model=ref)
    assert calls == []  # a reference handed in is ignored
    assert h.rows[-1]["memory_reference_bytes"] == 0


@pytest.mark.slow
def test_memory_held_counts_parameters_grads_adam_and_reference(tok, pairs):
    n = models.count_parameters(tiny(tok))  # tied embeddings counted once
    dpo = loop.train_preference(tiny(tok), tok, pairs, cfg("dpo")).rows[-1]
    simpo = loop.train_preference(tiny(tok), tok, pairs, cfg("simpo")).rows[-1]
    assert dpo["memory_policy_bytes"] == 4 * n  # float32
    assert dpo["memory_grad_bytes"] == 4 * n
    n_tensors = len(list(tiny(tok).parameters()))
    assert dpo["memory_optimizer_bytes"] == 2 * 4 * n + 4 * n_tensors  # AdamW: two moments + a step counter each
    assert dpo["memory_total_bytes"] - simpo["memory_total_bytes"] == 4 * n  # exactly the reference's parameters


# ---------------------------------------------------------------------------------------------- KTO's reference point


def test_kto_reference_pairs_never_pair_an_example_with_itself():
    prompts, comps = ["a", "b", "c"], ["A", "B", "C"]
    for seed in range(20):
        p, c, idx = loop.kto_reference_pairs(prompts, comps, torch.Generator().manual_seed(seed))
        assert p == prompts
        assert all(j != i for i, j in enumerate(idx.tolist()))
        assert c == [comps[j] for j in idx.tolist()]


@pytest.mark.slow
def test_kto_loop_pairs_no_example_with_itself(tok, pairs, monkeypatch):
    drawn = []
    real = loop.kto_reference_pairs

    def spy(prompts, completions, generator=None):
        out = real(prompts, completions, generator)
        drawn.append(out[2])
        return out

    monkeypatch.setattr(loop, "kto_reference_pairs", spy)
    h = loop.train_preference(tiny(tok), tok, data_for("kto", pairs), cfg("kto", steps=4, batch_size=8))
    assert len(drawn) == 4
    for idx in drawn:
        assert all(j != i for i, j in enumerate(idx.tolist()))
    assert len({tuple(i.tolist()) for i in drawn}) > 1  # a fresh random pairing each step
    assert all(r["z0"] >= 0 for r in h.rows)  # clamped


# paper-index: preference_loop.preference_kto_loss
def test_kto_z0_is_mismatched_log_ratio_clamped_and_detached(tok, pairs):
    model, ref = tiny(tok, seed=0), tiny(tok, seed=1).eval()
    c = cfg("kto", batch_size=8)
    batch = preference_data.pairs_to_examples(pairs)[:]
    loss, st = loop.preference_kto_loss(model, ref, tok, batch, c, generator=None)  # shift-by-one pairing
    shifted = [batch["completion"][(i + 1) % 8] for i in range(8)]
    enc = loop.encode_completions(tok, batch["prompt"], shifted)
    model.eval()
    raw = (loop.reference_logps(model, enc) - loop.reference_logps(ref, enc)).mean().item()
    assert st["kl_raw"] == pytest.approx(raw, abs=1e-4)
    assert st["z0"] == pytest.approx(max(raw, 0.0), abs=1e-4)
    loss.backward()  # z0 carries no graph: the backward goes through the examples' own log-probs only


# ---------------------------------------------------------------------------------------------- learning


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dpo", "ipo", "kto", "simpo"])
def test_a_few_steps_raise_the_chosen_minus_rejected_margin(tok, pairs, method):
    model = tiny(tok)
    enc = loop.encode_completions(tok, PAIRS["prompt"] * 2, PAIRS["chosen"] + PAIRS["rejected"])

    def margin():
        with torch.no_grad():
            s = rollout.sequence_logprobs(loop._completion_logps(model.eval(), enc, 1.0), enc["completion_mask"])
        return (s[:4] - s[4:]).mean().item()  # nats

    before = margin()
    loop.train_preference(model, tok, data_for(method, pairs),
                             cfg(method, steps=8, lr=3e-3, batch_size=8 if method == "kto" else 4))
    assert margin() > before + 1.0


@pytest.mark.slow
def test_same_seed_same_history(tok, pairs):
    a = loop.train_preference(tiny(tok), tok, pairs, cfg("dpo", steps=3, batch_size=2, seed=5))
    b = loop.train_preference(tiny(tok), tok, pairs, cfg("dpo", steps=3, batch_size=2, seed=5))
    drop = ("time",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in a.rows] == \
           [{k: v for k, v in r.items() if k not in drop} for r in b.rows]


def test_batches_cover_each_row_once_per_epoch():
    gen = torch.Generator().manual_seed(0)
    batches = list(loop._batch_indices(5, 2, 5, gen))  # 10 rows drawn = 2 epochs of 5
    flat = [i for b in batches for i in b]
    assert sorted(flat[:5]) == [0, 1, 2, 3, 4] and sorted(flat[5:]) == [0, 1, 2, 3, 4]
    assert all(len(b) == 2 for b in batches)


@pytest.mark.slow
def test_eval_rows_at_start_and_end(tok, pairs):
    test = Dataset.from_dict({"prompt": ["1+2=", "3+3="], "answer": ["3", "6"]})
    h = loop.train_preference(tiny(tok), tok, pairs, cfg("dpo", steps=2, max_new_tokens=4), eval_data=test)
    assert h.series("eval_accuracy")[0] == [0, 2]
    assert h.series("eval_greedy_accuracy")[0] == [0, 2]


# ---------------------------------------------------------------------------------------------- config and data errors


@pytest.mark.parametrize("kw,match", [
    (dict(method="orpo"), "method"),
    (dict(method="kto", batch_size=1), "batch_size"),
    (dict(method="ipo", label_smoothing=0.1), "label_smoothing"),
    (dict(method="dpo", beta=0.0), "beta"),
    (dict(method="dpo", reduction="max"), "reduction"),
    (dict(method="dpo", steps=0), "steps"),
    (dict(method="ipo", tau=0.0), "tau"),
])
def test_bad_config_raises(kw, match):
    with pytest.raises(ValueError, match=match):
        loop.PrefConfig(**kw).validate()


def test_data_without_the_methods_columns_raises(tok, pairs):
    with pytest.raises(ValueError, match="completion"):
        loop.train_preference(tiny(tok), tok, pairs, cfg("kto"))
    with pytest.raises(ValueError, match="chosen"):
        loop.train_preference(tiny(tok), tok, preference_data.pairs_to_examples(pairs), cfg("dpo"))
    with pytest.raises(ValueError, match="empty"):
        loop.train_preference(tiny(tok), tok, pairs.select([]), cfg("dpo"))


# ---------------------------------------------------------------------------------------------- pairs from own samples


def test_sample_preference_data_pairs_follow_the_score(tok, monkeypatch):
    # a stand-in checker: a completion is "correct" when its length is even; the pairs must follow it
    tasks = preference_data.tasks
    monkeypatch.setattr(tasks, "score", lambda c, a: tasks.Score(float(len(c) % 2 == 0), True, len(c) % 2 == 0))
    data = Dataset.from_dict({"prompt": ["1+2=", "3+4=", "5+6=", "7+8+9="], "answer": ["3", "7", "11", "24"]})
    state = torch.get_rng_state()
    pairs, examples, info = preference_data.sample_preference_data(tiny(tok), tok, data, n_prompts=3, group_size=6,
                                                                   max_new_tokens=10, seed=1)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left as it was
    again, _, _ = preference_data.sample_preference_data(tiny(tok), tok, data, n_prompts=3, group_size=6,
                                                         max_new_tokens=10, seed=1)
    assert pairs[:] == again[:]
    assert info["samples"] == 18 and len(examples) == 18 and info["pairs"] == len(pairs) > 0
    assert all(len(c) % 2 == 0 and len(r) % 2 == 1 for c, r in zip(pairs["chosen"], pairs["rejected"], strict=True))
    assert all(lab == (len(c) % 2 == 0) for c, lab in zip(examples["completion"], examples["label"], strict=True))
    assert set(pairs["prompt"]) <= set(data["prompt"])
