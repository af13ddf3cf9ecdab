"""Copy verl 0.9.1's Clip-Cov / KL-Cov losses out of its wheel, for tests/test_entropy.py to run them beside minirl's.

verl cannot be imported without its heavy dependencies (ray, omegaconf, its config classes), and its wheel is not
installed here; the four functions the tests compare need only torch. This script takes them, unchanged, with ``ast``
from the wheel's sources (``compute_policy_loss_clip_cov``, ``compute_policy_loss_kl_cov`` and ``agg_loss`` from
verl/trainer/ppo/core_algos.py; ``masked_sum`` and ``masked_mean`` from verl/utils/torch_functional.py; decorators
left out) into ``tests/data/verl_0_9_1_cov_losses.py.txt`` (a .txt, so neither pytest nor ruff reads it as minirl's
code), headed by verl's licence and the wheel's sha256. The test executes that text with torch and a stub config.

    pip download verl==0.9.1 --no-deps -d /tmp/verlwheel
    python tests/extract_verl.py /tmp/verlwheel/verl-0.9.1-py3-none-any.whl
"""

from __future__ import annotations

import ast
import hashlib
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "verl_0_9_1_cov_losses.py.txt"
FUNCTIONS = {
    "verl/utils/torch_functional.py": ("masked_sum", "masked_mean"),
    "verl/trainer/ppo/core_algos.py": ("agg_loss", "compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov"),
}
HEADER = """\
# Extracted by tests/extract_verl.py from {wheel} (sha256 {sha256}), unchanged but for the decorators.
# verl: Copyright 2024 Bytedance Ltd. and/or its affiliates; licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Executed by tests/test_entropy.py with torch, typing's Any and
# Optional, verl_F (these masked_sum and masked_mean), and stand-ins for ActorConfig and AlgoConfig.
"""


def extract(wheel: Path) -> str:
    parts = [HEADER.format(wheel=wheel.name, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())]
    with zipfile.ZipFile(wheel) as z:
        for path, names in FUNCTIONS.items():
            source = z.read(path).decode()
            defs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
            for name in names:
                parts.append(f"# --- {path}: {name}\n{ast.get_source_segment(source, defs[name])}\n")
    return "\n\n".join(parts)


if __name__ == "__main__":
    OUT.write_text(extract(Path(sys.argv[1])))
    print(f"wrote {OUT}", file=sys.stderr)
