"""The GPU check's real-size part (issue 36, item 5), run here at a CPU's size: ``bench.run_real_sizes`` builds a
Qwen3-0.6B-shaped model with the real vocabulary, runs RL steps of fixed work and puts each stage's time beside
``memory_plan``; the check's summary prints it."""

import json
import subprocess
import sys
from pathlib import Path

from minirl import bench, memory

HELPER = Path(__file__).resolve().parent.parent / ".ci" / "gpu_check.py"


def test_run_real_sizes_at_a_cpus_size():
    result = bench.run_real_sizes(batches=((1, 2),), max_new_tokens=4, prompt_tokens=6, steps=1, layers=1,
                                  hidden_size=64)
    assert result["parameters"] > 151_936 * 64  # the real vocabulary's embedding
    (key, steps), = result["batches"].items()
    assert key == "1x2x4" and len(steps) == 1 and set(steps[0]) == {"generation", "logprob_forward", "update"}
    assert all(seconds > 0 for seconds, _ in steps[0].values())
    assert set(result["plan"][key]) == set(steps[0]) and "peak_rss_gb" in result
    assert bench.REAL_SIZES_SETTINGS in memory.FIT_SETTINGS
    assert "1x2x4" in bench.real_sizes_table(result)


def test_the_check_summary_prints_the_real_sizes(tmp_path):
    (tmp_path / "parts.tsv").write_text("real_sizes\tok\t100.0\t180\n")
    (tmp_path / "real_sizes.json").write_text(json.dumps({
        "parameters": 596_049_920, "device": "NVIDIA H200", "settings": "s",
        "plan": {"8x8x512": {"generation": 20.0, "logprob_forward": 30.0, "update": 25.0}},
        "batches": {"8x8x512": [{"generation": [9.0, 18.0], "logprob_forward": [2.0, 28.0], "update": [5.0, 24.0]},
                                {"generation": [7.0, 18.5], "logprob_forward": [1.0, 29.0], "update": [4.0, 24.5]}]}}))
    done = subprocess.run([sys.executable, str(HELPER), "summary", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # the median of the steps after the first, the largest peak of all
    assert "8x8x512 generation           7.00 s  peak  18.50 GB  planned 20.00 GB" in done.stdout
    assert "596 M parameters on NVIDIA H200" in done.stdout
