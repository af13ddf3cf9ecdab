"""History: the per-step metrics of a run, one dict per row, saved as JSONL or CSV.

The loops log one row per step (and a step-0 row of held-out metrics before training); the glossary of
notebooks/reference.md says what each logged metric means and in which unit.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class History:
    """Per-step metrics of a run: a list of dicts, one per step (plus evaluation rows)."""

    rows: list[dict] = field(default_factory=list)

    def log(self, **metrics) -> None:
        self.rows.append(metrics)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the rows that have ``key``; undefined values (None, NaN) are left out, e.g. the
        explained variance of a step whose returns were all equal."""
        pts = [(r["step"], r[key]) for r in self.rows if _defined(r.get(key))]
        return [s for s, _ in pts], [v for _, v in pts]

    def last(self, key: str):
        """The most recent value of ``key``."""
        vals = self.series(key)[1]
        if not vals:
            raise KeyError(f"no logged value for {key!r}")
        return vals[-1]

    def to_jsonl(self, path: str | Path) -> None:
        """One JSON object per row; NaN and inf (not valid JSON) are written as null."""
        with open(path, "w") as f:
            for r in self.rows:
                f.write(json.dumps({k: v if _defined(v) or not isinstance(v, float) else None for k, v in r.items()})
                        + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> History:
        """Read back what ``to_jsonl`` wrote."""
        with open(path) as f:
            return cls([json.loads(line) for line in f if line.strip()])

    def to_csv(self, path: str | Path) -> None:
        keys = sorted({k for r in self.rows for k in r})
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)


def _defined(value) -> bool:
    """False for None and for a float NaN or infinity."""
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))
