"""Every stored result a notebook plots or quotes names the command and the commit that produced it, and its wall
time, so a reader can re-run it (README: "Every number in a notebook's prose comes from an executed cell or a
stored, re-plottable result")."""

import json
from pathlib import Path

import pytest

RESULTS = sorted((Path(__file__).resolve().parent.parent / "notebooks" / "results").glob("*.json"))


def test_there_are_stored_results():
    assert RESULTS, "notebooks/results/ holds no stored result"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_a_stored_result_names_its_command_commit_and_time(path):
    result = json.loads(path.read_text())
    assert result["command"].startswith("python "), result["command"]
    assert len(result["commit"]) >= 7 and all(c in "0123456789abcdef" for c in result["commit"]), result["commit"]
    script = path.with_suffix(".py")
    assert script.exists() and script.name in result["command"], (script, result["command"])
    times = [r.get("seconds") for r in result.get("runs", [])] + [result.get("wall_seconds")]
    assert any(t is not None and t > 0 for t in times), "no wall time recorded"
