"""The one-file algorithms (minirl/minimal/) compute what the library computes, and run alone.

Each file and the library's loop start from the same weights, data and seed and run 3 steps; after every optimiser
step the loss, the gradient norm (before clipping) and every weight are compared. Both draw their random numbers
in the same order (prompts and minibatch order from one seeded generator, sampling from torch's global one), so the
rollouts are the same and nothing is handed from one side to the other; a change to either side's algorithm
(a clip range, the KL estimator, the aggregation, the advantage's std) moves the figures and fails the test.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minirl import config, rl, tasks
from minirl.minimal import grpo

ROOT = Path(__file__).resolve().parent.parent
WARM = ROOT / "data" / "warm_start" / "dense-cpu-s0"
MINIMAL = sorted((ROOT / "minirl" / "minimal").glob("[!_]*.py"))
#: float32 round-off of two implementations that order a few sums differently (measured: below 1e-7 on the loss)
TOL = 1e-6


def _load():
    return (AutoModelForCausalLM.from_pretrained(WARM, dtype=torch.float32),
            AutoTokenizer.from_pretrained(WARM, padding_side="left"))


def _weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _library_updates(monkeypatch, cfg, reward_fn=None, **kwargs) -> list[tuple[dict, list[torch.Tensor]]]:
    """(stats, weights after the step) of every optimiser step of ``rl.train_rl`` on the warm start."""
    model, tokenizer = _load()
    seen, original = [], rl.update_minibatch

    def recording(*args, **kw):
        out = original(*args, **kw)
        seen.append((out, _weights(model)))
        return out

    monkeypatch.setattr(rl, "update_minibatch", recording)
    rl.train_rl(model, tokenizer, cfg, tasks.load_split("train"), reward_fn=reward_fn, **kwargs)
    return seen


def _largest_gaps(ours, theirs) -> dict:
    assert len(ours) == len(theirs) > 0
    gaps = {"loss": 0.0, "grad_norm": 0.0, "weights": 0.0}
    for (a, wa), (b, wb) in zip(ours, theirs, strict=True):
        gaps["loss"] = max(gaps["loss"], abs(a["loss"] - b["loss"]))
        gaps["grad_norm"] = max(gaps["grad_norm"], abs(a["grad_norm"] - b["grad_norm"]) / max(b["grad_norm"], 1e-12))
        gaps["weights"] = max(gaps["weights"], max(float((x - y).abs().max()) for x, y in zip(wa, wb, strict=True)))
    return gaps


@pytest.mark.slow
def test_grpo_file_equals_the_library_step_by_step(monkeypatch):
    """3 GRPO steps x 2 minibatches of grpo.py and of rl.train_rl(make_config("grpo")): the same loss, gradient
    norm and weights after each of the 6 optimiser steps, within float32 round-off (TOL; measured: bit for bit, 0.0
    on every quantity at every step). lr 1e-4 moves the weights far enough that the second minibatch's ratios leave
    the clip band, so the clip is exercised too, and the KL to the reference reaches 0.02 nats per token."""
    args = grpo.Args(steps=3, prompts_per_step=8, group_size=4, max_new_tokens=24, lr=1e-4, device="cpu")
    model, tokenizer = _load()
    ours = []
    grpo.train(args, model, tokenizer, grpo.load_jsonl(args.train_data),
               on_update=lambda stats: ours.append((stats, _weights(model))))
    cfg = config.make_config("grpo", seed=args.seed, steps=args.steps, prompts_per_step=args.prompts_per_step,
                             group_size=args.group_size, max_new_tokens=args.max_new_tokens, lr=args.lr)
    assert (cfg.eps_low, cfg.eps_high, cfg.beta, cfg.adv_eps, cfg.num_minibatches, cfg.max_grad_norm) == (
        args.eps, args.eps, args.beta, args.adv_eps, args.num_minibatches, args.max_grad_norm)
    theirs = _library_updates(monkeypatch, cfg)
    assert len(ours) == 6
    gaps = _largest_gaps(ours, theirs)
    assert gaps["loss"] < TOL and gaps["grad_norm"] < TOL and gaps["weights"] < TOL, gaps
    assert max(s["clip_frac"] for s, _ in ours) > 0  # the clip acted on some token


@pytest.mark.parametrize("path", MINIMAL, ids=lambda p: p.name)
def test_a_one_file_algorithm_imports_torch_transformers_and_the_standard_library_only(path):
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import of {node.module}"
            imported.add(node.module.split(".")[0])
    assert imported <= {"torch", "transformers", "__future__"} | set(sys.stdlib_module_names), imported
    assert len(path.read_text().splitlines()) <= 400, "a one-file algorithm stays under 400 lines"


@pytest.mark.slow
@pytest.mark.parametrize("path", MINIMAL, ids=lambda p: p.name)
def test_a_one_file_algorithm_copied_alone_runs_two_steps(path, tmp_path):
    """The file copied into an empty folder and run there as a script, with ``minirl`` made unimportable: it trains
    2 steps on the toy (MINIRL_DATA names minirl's data folder, which the copy cannot find beside itself) and prints
    its held-out accuracy."""
    shutil.copy(path, tmp_path / path.name)
    blocker = ("import runpy, sys; sys.modules['minirl'] = None; sys.argv = sys.argv[1:]; "
               "runpy.run_path(sys.argv[0], run_name='__main__')")
    cmd = [sys.executable, "-c", blocker, path.name, "--steps", "2", "--eval-size", "8", "--device", "cpu"]
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MINIRL_DATA": str(ROOT / "data")}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out accuracy" in done.stdout, done.stdout


def test_grpo_help_shows_each_setting_with_its_docstring(capsys):
    with pytest.raises(SystemExit):
        grpo.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--group-size" in out and "answers sampled per prompt" in out and "--beta" in out


def test_grpo_group_advantages_by_hand():
    # group 1: rewards [1, 0, 0, 1]: mean 0.5, std sqrt((4 * 0.25) / 3) = 0.57735; A = +-0.5 / (0.57735 + 1e-4)
    # group 2: all equal: exactly 0
    a = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]), 4, 1e-4)
    expected = 0.5 / (3 ** -0.5 + 1e-4)
    assert torch.allclose(a[:4], torch.tensor([expected, -expected, -expected, expected]))
    assert torch.equal(a[4:], torch.zeros(4))


def test_grpo_loss_by_hand():
    # one answer of 2 tokens, on-policy (rho = 1), A = +1, pi = ref: surrogate -1 per token, k3 = 0 -> loss -1;
    # d loss / d logprob_t = -A / 2 tokens = -0.5 (the clip is inactive at rho = 1)
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = grpo.grpo_loss(lp, lp.detach(), lp.detach(), torch.tensor([1.0]), torch.ones(1, 2), eps=0.2,
                                 beta=0.04, n_seqs=1)
    loss.backward()
    assert loss.item() == -1.0 and stats["kl"] == 0.0
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, -0.5]]))
