"""The real model's time and memory on this machine (issue 49): ``python notebooks/results/smollm2_bench.py`` writes
smollm2_bench.json, ``minirl.bench.run_smollm2``'s result (what ``python -m minirl bench --smollm2`` prints) with the
command, commit and wall time. About 4 minutes on 2 idle cores; run it on an idle machine (it measures time)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minirl.bench import run_smollm2, smollm2_table  # noqa: E402

if __name__ == "__main__":
    t0 = time.time()
    result = run_smollm2()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    result.update(command="python notebooks/results/smollm2_bench.py", commit=commit,
                  cpu=platform.processor() or platform.machine(), wall_seconds=round(time.time() - t0, 1))
    out = Path(__file__).with_suffix(".json")
    out.write_text(json.dumps(result, indent=1))
    print(smollm2_table(result))
    print(f"wrote {out} in {result['wall_seconds']} s")
