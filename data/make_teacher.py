"""Train the teacher of the distillation lesson and ship it under data/warm_start/teacher-dense-cpu-s0.

    OMP_NUM_THREADS=1 python data/make_teacher.py

The teacher is the main job's model: the shipped dense warm start (data/warm_start/dense-cpu-s0) after 150 steps of
GRPO with the main job's settings (``python -m minirl train``: seed 0, 16 prompts x 8 samples per step, 40 new tokens;
the job's evaluations fork the random generators, so they do not change its weights). Same architecture and tokenizer
as the student (the warm start), so on-policy distillation compares their next-token distributions directly.

It writes the model, the tokenizer and an ``info.json`` like the warm starts' (command, commit, machine, threads,
versions, seconds, sha256 of the weights) with the shared held-out evaluation (``warm_start.heldout_evaluation``: all
256 test prompts, 16 samples each at T = 1, and greedy), the accuracy the distillation runs aim for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "data"))

from make_warm_start import cpu_name, sha256  # noqa: E402

STEPS = 150  # the cpu profile's rl_steps: the main job's length


def main() -> int:
    import platform

    import torch
    import transformers

    from minirl import models, tasks
    from minirl.config import make_config, resolve_profile
    from minirl.rl import train_rl
    from minirl.warm_start import SHIPPED_DIR, heldout_evaluation, warm_start

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "minirl", "data/make_teacher.py"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip())
    torch.set_num_threads(1)  # one thread: the reduction order of the notebooks' stored runs
    profile = resolve_profile("cpu")
    t0 = time.time()
    model, tokenizer, start = warm_start(profile, seed=0, progress=False)
    cfg = make_config("grpo", seed=0, steps=STEPS, prompts_per_step=profile.prompts_per_step,
                      group_size=profile.group_size, max_new_tokens=profile.max_new_tokens, progress=False)
    train_rl(model, tokenizer, cfg, tasks.load_split("train"))
    model.eval()
    out = SHIPPED_DIR / f"teacher-dense-{profile.name}-s0"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    info = {"student": "dense-cpu-s0", "student_sha256": start["sha256"]["model.safetensors"],
            "algo": "grpo", "steps": STEPS, "config": {k: getattr(cfg, k) for k in (
                "seed", "prompts_per_step", "group_size", "max_new_tokens", "lr", "beta", "num_minibatches")},
            "heldout": heldout_evaluation(model, tokenizer, profile), "parameters": models.count_parameters(model)}
    info["made_by"] = {
        "command": "OMP_NUM_THREADS=1 python data/make_teacher.py", "commit": commit + ("-dirty" if dirty else ""),
        "machine": f"{cpu_name()} ({platform.machine()})", "threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "seconds": round(time.time() - t0, 1)}
    info["sha256"] = {"model.safetensors": sha256(out / "model.safetensors")}
    (out / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    h = info["heldout"]
    print(f"wrote {out.relative_to(ROOT)}: sampled {h['sampled']:.3f} +- {h['sampled_se']:.3f}, greedy "
          f"{h['greedy']:.3f} +- {h['greedy_se']:.3f}, {info['made_by']['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
