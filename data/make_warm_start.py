"""Train the cpu profile's seed-0 warm start and ship it under data/warm_start/ (a ``save_pretrained`` directory).

    OMP_NUM_THREADS=1 python data/make_warm_start.py            # the dense model (what the notebooks start from)
    OMP_NUM_THREADS=1 python data/make_warm_start.py --moe      # the MoE model

It trains with ``warm_start(..., train=True, cache=False)`` (the code every other seed trains with), at one thread,
then writes the model, the tokenizer and an ``info.json`` that records how it was made: the command, the commit
(the working tree must be clean, so the commit is the code that ran), the machine, the thread count, the library
versions, the shared held-out evaluation and the sha256 of the weights. ``tests/test_shipped_warm_start.py`` checks
the weights against that sha256 and re-evaluates them against the stored evaluation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moe", action="store_true", help="the tiny MoE instead of the dense model")
    parser.add_argument("--allow-dirty", action="store_true", help="record a commit with uncommitted changes")
    args = parser.parse_args()

    import torch
    import transformers

    from minirl import models
    from minirl.config import resolve_profile
    from minirl.warm_start import SHIPPED_DIR, warm_start

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "minirl", "data/make_warm_start.py"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip())
    if dirty and not args.allow_dirty:
        print("minirl/ has uncommitted changes: commit first, so the recorded commit is the code that ran",
              file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # one thread: the reduction order of the notebooks' stored runs
    profile = resolve_profile("cpu")
    t0 = time.time()
    model, tokenizer, info = warm_start(profile, seed=0, moe=args.moe, train=True, cache=False, progress=False)
    out = SHIPPED_DIR / f"{'moe' if args.moe else 'dense'}-{profile.name}-s0"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    info.pop("path", None)
    info["made_by"] = {
        "command": "OMP_NUM_THREADS=1 python data/make_warm_start.py" + (" --moe" if args.moe else ""),
        "commit": commit + ("-dirty" if dirty else ""), "machine": f"{cpu_name()} ({platform.machine()})",
        "threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "seconds": round(time.time() - t0, 1),
    }
    info["sha256"] = {"model.safetensors": sha256(out / "model.safetensors")}
    info["parameters"] = models.count_parameters(model)
    (out / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    h = info["heldout"]
    print(f"wrote {out.relative_to(ROOT)}: sampled {h['sampled']:.3f} +- {h['sampled_se']:.3f}, "
          f"greedy {h['greedy']:.3f} +- {h['greedy_se']:.3f}, {(out / 'model.safetensors').stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
