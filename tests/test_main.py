"""Tests of the command line (minirl.__main__): help, an unknown algorithm, and `train` writing its summary."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_model

from minirl import warm_start

ROOT = Path(__file__).resolve().parent.parent


# --- command line ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
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


@pytest.mark.slow
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
