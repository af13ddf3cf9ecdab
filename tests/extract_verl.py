"""Read verl 0.9.1's policy losses, advantage estimators and KL estimators out of its wheel, for
tests/test_entropy.py, tests/test_trust_region.py and tests/test_verl_presets.py to run them beside minirl's.

verl cannot be imported without its heavy dependencies (ray, omegaconf, its config classes); the functions the tests
compare need only torch. ``extract`` takes them, unchanged, with ``ast`` from the wheel's sources
(``FUNCTIONS``: the policy losses, advantage estimators, KL estimators and ``agg_loss`` of
verl/trainer/ppo/core_algos.py; the masked reductions of verl/utils/torch_functional.py; decorators left out), at
test time: verl's code is read from the wheel the user fetched, never copied into this repository.
``.ci/run`` fetches the wheel into ``.cache/verl/`` (git-ignored); elsewhere the tests that need it skip, saying how:

    pip download verl==0.9.1 --no-deps -d .cache/verl
"""

from __future__ import annotations

import ast
import hashlib
import zipfile
from pathlib import Path

WHEEL = Path(__file__).resolve().parent.parent / ".cache" / "verl" / "verl-0.9.1-py3-none-any.whl"
FUNCTIONS = {
    "verl/utils/torch_functional.py": ("masked_sum", "masked_mean", "masked_var", "masked_whiten"),
    "verl/trainer/ppo/core_algos.py": ("agg_loss", "compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov",
                                       "compute_policy_loss_dppo_tv", "compute_policy_loss_dppo_kl",
                                       # tests/test_verl_presets.py: every preset's loss and advantages
                                       "compute_policy_loss_vanilla", "compute_policy_loss_gspo",
                                       "compute_policy_loss_sapo", "compute_policy_loss_geo_mean",
                                       "compute_policy_loss_cispo", "compute_grpo_outcome_advantage",
                                       "compute_rloo_outcome_advantage",
                                       "compute_reinforce_plus_plus_outcome_advantage",
                                       "compute_reinforce_plus_plus_baseline_outcome_advantage",
                                       "compute_gae_advantage_return", "kl_penalty", "kl_penalty_forward"),
}
HEADER = "# verl 0.9.1's functions, read from {wheel} (sha256 {sha256}), unchanged but for the decorators.\n"


def extract(wheel: Path) -> str:
    parts = [HEADER.format(wheel=wheel.name, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())]
    with zipfile.ZipFile(wheel) as z:
        for path, names in FUNCTIONS.items():
            source = z.read(path).decode()
            defs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
            for name in names:
                parts.append(f"# --- {path}: {name}\n{ast.get_source_segment(source, defs[name])}\n")
    return "\n\n".join(parts)



def functions() -> dict:
    """verl's functions (``FUNCTIONS``), read from the wheel and executed with torch and stand-ins for what they
    import (its config classes, ``verl_F``); the test that asks is skipped, saying how, when the wheel is missing."""
    from collections import defaultdict
    from types import SimpleNamespace
    from typing import Any, Optional

    import numpy
    import pytest
    import torch

    if not WHEEL.exists():
        pytest.skip(f"verl's wheel is not at {WHEEL}: pip download verl==0.9.1 --no-deps -d .cache/verl")

    class AlgoConfig:  # only ever the target of verl's isinstance check
        pass

    namespace = {"torch": torch, "Any": Any, "Optional": Optional, "ActorConfig": object, "AlgoConfig": AlgoConfig,
                 "DictConfig": object, "np": numpy, "defaultdict": defaultdict}
    exec(compile(extract(WHEEL), "verl 0.9.1", "exec"), namespace)
    namespace["verl_F"] = SimpleNamespace(**{n: namespace[n] for n in FUNCTIONS["verl/utils/torch_functional.py"]})
    return namespace
