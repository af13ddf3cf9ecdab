"""TRL's GRPOTrainer from minirl's grpo and dapo presets on two processes (torchrun, two gloo ranks on CPU).

notebooks/scripts/trl_two_process.py runs under ``torchrun --nproc_per_node 2`` on a tiny random Qwen3 saved with
save_pretrained, ``OMP_NUM_THREADS=1`` per rank and a free port chosen here (parallel test workers do not
collide). Inside the run it asserts world size 2; on fixed completions split one group per rank, TRL's
compute_loss gradients averaged over the ranks (what DDP does) equal minirl's update_minibatch gradient on the whole
global batch to 1e-6 (for dapo this exercises TRL's global token count, num_items_in_batch / num_processes); then
trainer.train() runs 2 real steps (generation, rewards, DDP) and every parameter must change, identically on both
ranks. About 25 s per preset on 2 cores.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # launches torchrun

pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "notebooks" / "scripts" / "trl_two_process.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("preset", ["grpo", "dapo"])
def test_two_process_trl_run_matches_minirl(preset, tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRL_EXPERIMENTAL_SILENCE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(SCRIPT), "--preset", preset, "--steps", "2", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert (r["world_size"], r["num_processes"], r["backend"]) == (2, 2, "gloo")
    assert r["grad_max_abs"] > 1e-2  # a real gradient
    assert r["grad_max_abs_diff"] < 1e-6, r
    assert r["loss_diff"] < 1e-6, r
    assert r["train_steps"] == 2
    assert r["params_changed"] == r["n_params"] and r["ranks_equal_after"], r
