"""Where the warm start lands, over seeds and thread counts: writes warm_start_spread.json beside this file.

Each (seed, threads) pair runs in its own process (the thread count must be set before torch starts): ``python
notebooks/results/warm_start_spread.py`` from the repository root, about 2 minutes a run on 2 idle cores;
``--threads 1`` runs one thread count only and ``--seed 0`` one seed only, keeping the other runs in the file. Every
run trains ``warm_start(profile="cpu", cache=False)`` and measures the held-out split: greedy, and 16 samples per
prompt at T = 1 (so the measurement's own noise, about 0.008, is well below the spread it measures). The file
records the command, the commit and the wall time of each run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).with_suffix(".json")
SEEDS, THREADS = (0, 1, 2), (2, 1)


def one_run(seed: int, threads: int) -> dict:
    import torch

    from minirl import evaluation, tasks
    from minirl.warm_start import warm_start

    torch.set_num_threads(threads)
    t0 = time.time()
    model, tok, info = warm_start("cpu", seed=seed, cache=False, progress=False, train=True)  # never the shipped one
    test = tasks.load_split("test")
    sampled = evaluation.evaluate(model, tok, test, 40, temperature=1.0, samples_per_prompt=16, seed=0)
    greedy = evaluation.evaluate(model, tok, test, 40, greedy=True)
    return {"seed": seed, "threads": threads, "sft_steps": len(info["sft_loss"]),
            "kept_step": info["kept_step"],
            "validation_sampled": next(c[2] for c in info["validation_checks"] if c[0] == info["kept_step"]),
            "test_greedy": greedy["accuracy"],
            "test_sampled": sampled["accuracy"], "test_sampled_stderr": sampled["accuracy_stderr"],
            "seconds": round(time.time() - t0, 1)}


if __name__ == "__main__":
    if len(sys.argv) == 3 and not sys.argv[1].startswith("--"):  # a child process: one run, printed as JSON
        print(json.dumps(one_run(int(sys.argv[1]), int(sys.argv[2]))))
        sys.exit(0)
    # ``--threads N`` runs only that thread count, ``--seed S`` only that seed; the file keeps the other runs
    threads_asked = (int(sys.argv[2]),) if len(sys.argv) == 3 and sys.argv[1] == "--threads" else THREADS
    seeds_asked = (int(sys.argv[2]),) if len(sys.argv) == 3 and sys.argv[1] == "--seed" else SEEDS
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    old = json.loads(OUT.read_text())["runs"] if OUT.exists() else []
    runs = [r for r in old if r["threads"] not in threads_asked or r["seed"] not in seeds_asked]
    for seed in seeds_asked:
        for threads in threads_asked:
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MINIRL_PROFILE": "cpu"}
            out = subprocess.run([sys.executable, __file__, str(seed), str(threads)], env=env, capture_output=True,
                                 text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    OUT.write_text(json.dumps({"command": "python notebooks/results/warm_start_spread.py", "commit": commit,
                               "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
                               "runs": sorted(runs, key=lambda r: (r["seed"], -r["threads"]))}, indent=1) + "\n")
    print(f"wrote {OUT}")
