"""minirl/minimal/dpo.py computes what the library's preference pipeline computes.

The file and the library (``preference_data.sample_preference_data``, then ``preference_loop.train_preference`` with
method "dpo") start from the same weights, data and seed. Both draw their random numbers in the same order (the
prompts from one seeded generator, the sampling from torch's global one seeded again, the order of the pairs from a
second seeded generator), so each builds the same pairs on its own: nothing is handed from one side to the other.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_minimal import TOL, _largest_gaps, _load, _weights

from minirl import preference_data, preference_loop, tasks
from minirl.minimal import dpo


@pytest.mark.slow
def test_dpo_file_equals_the_library_step_by_step():
    """3 DPO steps of dpo.py and of the library from the warm start: the same pairs (compared as text), then the
    same loss, gradient norm and weights after each optimiser step, within float32 round-off (TOL; measured: bit for
    bit, 0.0 on every quantity). 32 prompts sampled 16 at a time exercise the sampling's chunks; 3 steps of 12 pairs
    read past the end of the first shuffle when there are fewer than 36 pairs (measured: 29); lr 1e-4 moves the
    weights."""
    args = dpo.Args(steps=3, n_prompts=32, group_size=4, sample_batch=16, batch_size=12, lr=1e-4, device="cpu")
    model, tokenizer = _load()
    ours, pairs = [], []
    sample_pairs = dpo.sample_pairs

    def recording_sample_pairs(*a, **kw):
        out = sample_pairs(*a, **kw)
        pairs.extend(out[0])
        return out

    dpo.sample_pairs = recording_sample_pairs  # restored below; records the file's pairs
    try:
        dpo.train(args, model, tokenizer, dpo.load_jsonl(args.train_data),
                  on_update=lambda stats: ours.append((stats, _weights(model))))
    finally:
        dpo.sample_pairs = sample_pairs

    model, tokenizer = _load()
    data, _, _ = preference_data.sample_preference_data(
        model, tokenizer, tasks.load_split("train"), n_prompts=args.n_prompts, group_size=args.group_size,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
        prompts_per_batch=args.sample_batch)
    assert [dict(r) for r in data] == pairs and len(pairs) > 0
    cfg = preference_loop.PrefConfig(method="dpo", beta=args.beta, lr=args.lr, steps=args.steps, seed=args.seed,
                                     batch_size=args.batch_size, temperature=args.temperature, progress=False)
    assert (cfg.max_grad_norm, cfg.weight_decay, cfg.label_smoothing, cfg.resolved()["reduction"]) == (
        args.max_grad_norm, 0.0, 0.0, "sum")
    theirs = []
    preference_loop.train_preference(model, tokenizer, data, cfg,
                                     callback=lambda step, row: theirs.append((row, _weights(model))))
    assert len(ours) == 3
    gaps = _largest_gaps(ours, theirs)
    assert gaps["loss"] < TOL and gaps["grad_norm"] < TOL and gaps["weights"] < TOL, gaps
    assert ours[0][0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # step 1: policy = reference


def test_dpo_loss_by_hand():
    # pair 1: policy = reference, h = 0: -log sigmoid(0) = ln 2 = 0.693147
    # pair 2: chosen up 2 nats, rejected down 3 nats against the reference: h = 2 - (-3) = 5; beta h = 0.5:
    #   -log sigmoid(0.5) = log(1 + e^-0.5) = 0.474077; the mean of the two = 0.583612
    # d loss / d chosen_2 = -(1 - sigmoid(0.5)) * beta / 2 pairs = -0.377541 * 0.1 / 2 = -0.0188771
    chosen = torch.tensor([-4.0, -1.0], requires_grad=True)
    loss, stats = dpo.dpo_loss(chosen, torch.tensor([-6.0, -9.0]), torch.tensor([-4.0, -3.0]),
                               torch.tensor([-6.0, -6.0]), beta=0.1)
    loss.backward()
    assert loss.item() == pytest.approx((math.log(2) + math.log(1 + math.exp(-0.5))) / 2, abs=1e-6)
    assert loss.item() == pytest.approx(0.583612, abs=1e-6)
    assert chosen.grad.tolist() == pytest.approx([-0.025, -0.0188771], abs=1e-6)  # pair 1: -(1 - 0.5) * 0.1 / 2
    assert stats["margin"] == pytest.approx(0.25) and stats["accuracy"] == 0.5  # beta * mean h = 0.1 * 2.5


def test_dpo_pairs_the_kth_right_answer_with_the_kth_wrong_one(monkeypatch):
    # a scripted sampler: "1+1=" answers right, wrong, right, wrong -> 2 pairs (1st right with 1st wrong, 2nd with
    # 2nd); "2+2=" answers all right -> none; 6 of 8 answers right
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    answers = {"1+1=": ["1+1=2#2", "1+1=3#3", " 1+1=2#2", "#9"], "2+2=": ["2+2=4#4"] * 4}
    drawn = [rows[i] for i in torch.randperm(2, generator=torch.Generator().manual_seed(0)).tolist()]

    class Tok:  # decodes the scripted answers, group by group in the order the prompts were drawn
        def batch_decode(self, ids, skip_special_tokens):
            return [t for r in drawn for t in answers[r["prompt"]]]

    monkeypatch.setattr(dpo, "sample", lambda *a, **kw: (torch.zeros(8, 1), torch.ones(8, 1)))
    pairs, right = dpo.sample_pairs(None, Tok(), rows, dpo.Args(n_prompts=2, group_size=4))
    assert pairs == [{"prompt": "1+1=", "chosen": "1+1=2#2", "rejected": "1+1=3#3"},
                     {"prompt": "1+1=", "chosen": " 1+1=2#2", "rejected": "#9"}]
    assert right == 6 / 8


def test_dpo_help_shows_each_setting_with_its_docstring(capsys):
    with pytest.raises(SystemExit):
        dpo.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--pairs" in out and "--beta" in out and "inverse temperature" in out


@pytest.mark.slow
def test_dpo_reads_pairs_from_a_file(tmp_path):
    # two hand-written pairs, one step: policy = reference at step 1, so the loss is ln 2, and the weights move
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "1+2=", "chosen": "1+2=3#3", "rejected": "1+2=4#4"}\n'
                    '{"prompt": "2+2=", "chosen": "2+2=4#4", "rejected": "#5"}\n')
    model, tokenizer = _load()
    before, seen = _weights(model), []
    args = dpo.Args(pairs=str(path), steps=1, batch_size=2, device="cpu")
    dpo.train(args, model, tokenizer, [], on_update=seen.append)
    assert seen[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, _weights(model), strict=True))
