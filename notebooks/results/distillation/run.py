"""On-policy distillation against RL, over seeds: ``python notebooks/results/distillation/run.py`` writes runs/ and
comparison.json beside this file (read by notebooks/09_distillation.ipynb; not named summary.json, which marks a
``python -m minirl sweep`` result).

Every run starts from the shipped cpu warm start (the student, data/warm_start/dense-cpu-s0) and learns from the
shipped teacher (data/warm_start/teacher-dense-cpu-s0: the same model after the main job's 150 GRPO steps). The arms,
one ``distill_loop.train_distill`` call each (``rl.train_rl`` for GRPO):

- on-policy distillation: the sampled per-token reverse-KL reward (``distill="reverse_kl"``, gamma 0, Tinker's);
- full-vocab distillation: the exact reverse KL over the 54 tokens at every visited position (``"full_reverse_kl"``);
- SFT on teacher samples: the NLL of completions the teacher sampled (``"sft"``), off-policy distillation;
- GRPO (task reward): the control, the main job's preset and settings (the way the teacher itself was made);
- mix: on-policy distillation plus GRPO's task advantage (``task_coef=1``).

Matched budget: every arm samples the same 16 prompts x 8 completions = 128 completions per step (the student's own,
or the teacher's for SFT) for the same number of steps, and runs one no-grad forward of a second model on them per
step (the teacher; GRPO's reference for its k3 term); GRPO takes its preset's two optimiser steps per rollout, the
distillation arms one. Every ``EVERY`` steps (and at step 0) a probe samples 2 fresh completions for each of the 256
held-out prompts at T = 1 and measures on them the accuracy and the true KL(student || teacher) per completion
(``evaluation.fresh_sample_kl``, exact per-position KL summed along the sample). Seeds 0, 1, 2 pick the training
prompts, the samples and the probe's samples.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from minirl import distill_loop, evaluation, rl, tasks
from minirl.config import make_config, resolve_profile
from minirl.warm_start import warm_start

HERE = Path(__file__).resolve().parent
SEEDS = (0, 1, 2)
STEPS, EVERY, PROBE_SAMPLES = 40, 5, 1
DISTILL = dict(algo="grpo", beta=0.0, num_minibatches=1)  # one optimiser step per rollout, no reference
ARMS = {
    "on-policy distillation": dict(DISTILL, distill="reverse_kl", distill_gamma=0.0),
    "full-vocab distillation": dict(DISTILL, distill="full_reverse_kl"),
    "SFT on teacher samples": dict(DISTILL, distill="sft"),
    "GRPO (task reward)": dict(algo="grpo"),
    "mix": dict(DISTILL, distill="reverse_kl", distill_gamma=0.0, task_coef=1.0),
}


def slug(arm: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in arm.lower()).strip("_").replace("__", "_")


def probe(model, teacher, tokenizer, test, seed: int) -> dict:
    """Accuracy and KL(student || teacher) on the same fresh samples of every held-out prompt."""
    m = evaluation.fresh_sample_kl(model, teacher, tokenizer, test["prompt"], samples_per_prompt=PROBE_SAMPLES,
                                   max_new_tokens=40, temperature=1.0, seed=seed + 1, answers=test["answer"])
    return {"probe_accuracy": m["accuracy"], "probe_kl": m["kl"], "probe_kl_stderr": m["kl_stderr"],
            "probe_kl_per_token": m["kl_per_token"], "probe_length": m["length"]}


def run_one(arm: str, seed: int, teacher, test, first: dict) -> dict:
    profile = resolve_profile("cpu")
    model, tokenizer, start = warm_start(profile, seed=0, progress=False)
    settings = dict(ARMS[arm])
    cfg = make_config(settings.pop("algo"), seed=seed, steps=STEPS, prompts_per_step=profile.prompts_per_step,
                      group_size=profile.group_size, max_new_tokens=profile.max_new_tokens, progress=False, **settings)
    t0 = time.time()

    def callback(step: int, row: dict) -> None:
        if step % EVERY == 0 or step == STEPS:
            row.update(probe(model, teacher, tokenizer, test, seed))

    if cfg.distill == "none":
        history = rl.train_rl(model, tokenizer, cfg, tasks.load_split("train"), callback=callback)
    else:
        history = distill_loop.train_distill(model, tokenizer, cfg, tasks.load_split("train"), teacher=teacher,
                                             callback=callback)
    rows = [{"step": 0, **first}, *history.rows]  # step 0: the warm start's probe, the same in every arm
    return {"rows": rows, "seconds": round(time.time() - t0, 1), "start_sha256": start["sha256"]["model.safetensors"]}


def steps_to(rows: list[dict], target: float) -> int | None:
    """The first probed step whose accuracy is at or above ``target`` (None: not within the run)."""
    return next((r["step"] for r in rows if r.get("probe_accuracy", -1) >= target), None)


def main() -> int:
    torch.set_num_threads(1)
    teacher, tokenizer, teacher_info = distill_loop.load_teacher("cpu")
    test = tasks.load_split("test")
    t_all = time.time()
    teacher_probe = {s: probe(teacher, teacher, tokenizer, test, s) for s in SEEDS}  # on the probe's samples
    student = warm_start(resolve_profile("cpu"), seed=0, progress=False)[0]
    start_probe = {s: probe(student, teacher, tokenizer, test, s) for s in SEEDS}
    (HERE / "runs").mkdir(exist_ok=True)
    for seed in SEEDS:  # seed by seed: an interrupted run leaves whole comparisons
        for arm in ARMS:
            path = HERE / "runs" / f"{slug(arm)}__s{seed}.json"
            if path.exists():  # resumable: a finished run is not run again
                continue
            out = run_one(arm, seed, teacher, test, start_probe[seed])
            path.write_text(json.dumps(out) + "\n")
            last = out["rows"][-1]
            print(f"{arm}, seed {seed}: accuracy {last['probe_accuracy']:.3f}, KL {last['probe_kl']:.3f}, "
                  f"{out['seconds']} s", flush=True)
    target = teacher_info["heldout"]["sampled"]  # the teacher's shared evaluation: 256 prompts x 16 samples
    arms = {}
    for arm in ARMS:
        runs = [json.loads((HERE / "runs" / f"{slug(arm)}__s{s}.json").read_text()) for s in SEEDS]
        probed = [[r for r in run["rows"] if "probe_accuracy" in r] for run in runs]
        arms[arm] = {
            "settings": ARMS[arm], "steps": [r["step"] for r in probed[0]],
            "accuracy": [[r["probe_accuracy"] for r in p] for p in probed],  # [seed][probe]
            "kl": [[r["probe_kl"] for r in p] for p in probed],  # nats per completion
            "kl_per_token": [[r["probe_kl_per_token"] for r in p] for p in probed],
            "steps_to_teacher": [steps_to(p, target) for p in probed],
            "seconds": [run["seconds"] for run in runs],
            "seconds_per_step": [statistics.fmean(r["time"] for r in run["rows"][1:]) for run in runs],
        }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "minirl", str(Path(__file__))],
                                capture_output=True, text=True).stdout.strip())
    summary = {
        "command": "OMP_NUM_THREADS=1 python notebooks/results/distillation/run.py", "commit": commit, "dirty": dirty,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "threads": torch.get_num_threads(),
        "torch": torch.__version__, "seeds": list(SEEDS), "steps": STEPS, "probe_every": EVERY,
        "probe": f"{len(test)} held-out prompts x {PROBE_SAMPLES} fresh samples at T = 1 (seed + 1)",
        "budget": "128 sampled completions per step (16 prompts x 8) and one no-grad forward of a second model on "
                  "them, in every arm; GRPO takes 2 optimiser steps per rollout, the distillation arms 1",
        "teacher": {"heldout": teacher_info["heldout"], "sha256": teacher_info["sha256"]["model.safetensors"],
                    "probe_accuracy": {str(s): p["probe_accuracy"] for s, p in teacher_probe.items()},
                    "target": target, "command": teacher_info["made_by"]["command"]},
        "warm_start_sha256": json.loads((HERE / "runs" / f"{slug('mix')}__s0.json").read_text())["start_sha256"],
        "wall_seconds": round(time.time() - t_all, 1), "arms": arms}
    (HERE / "comparison.json").write_text(json.dumps(summary, indent=1) + "\n")
    for arm, a in arms.items():
        print(f"{arm:26s} final accuracy {[round(x[-1], 3) for x in a['accuracy']]}, "
              f"KL {[round(x[-1], 2) for x in a['kl']]}, steps to the teacher's {target:.3f}: {a['steps_to_teacher']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
