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


SWEEPS = sorted((Path(__file__).resolve().parent.parent / "notebooks" / "results").glob("*/summary.json"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.parent.name)
def test_a_stored_sweep_names_its_command_commit_time_and_keeps_every_run(path):
    from minirl import sweep

    summary = json.loads(path.read_text())
    spec_path = path.parent / "sweep.json"
    assert summary["command"].startswith("python -m minirl sweep ") and summary["command"].endswith(
        f"{path.parent.name}/sweep.json"), summary["command"]
    assert len(summary["commit"]) >= 7 and all(c in "0123456789abcdef" for c in summary["commit"]), summary["commit"]
    assert summary["wall_seconds"] > 0 and summary["run_seconds"]
    spec = sweep.load_spec(spec_path)
    assert summary["spec"]["arms"] == spec.arms and summary["spec"]["seeds"] == spec.seeds  # stored = current spec
    for arm in spec.arms:  # every run the summary averages is stored, so the figures can be re-plotted
        for seed in spec.seeds:
            assert sweep.run_file(path.parent, arm, seed).exists(), (arm, seed)
    assert summary == {**sweep.summarize(spec, path.parent), **{k: summary[k] for k in summary
                                                                   if k not in ("name", "spec", "arms")}}


PER_SEED = sorted((Path(__file__).resolve().parent.parent / "notebooks" / "results").glob("*/seed*.json"))


@pytest.mark.parametrize("path", PER_SEED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_per_seed_result_names_its_script_seed_commit_and_time(path):
    """A script that writes one file per seed (``results/NAME.py --seed S`` -> ``results/NAME/seedS.json``)."""
    result = json.loads(path.read_text())
    script = path.parent.with_suffix(".py")
    assert script.exists(), script
    assert result["command"] == f"python notebooks/results/{script.name} --seed {result['seed']}", result["command"]
    assert path.name == f"seed{result['seed']}.json"
    assert len(result["commit"]) >= 7 and all(c in "0123456789abcdef" for c in result["commit"]), result["commit"]
    assert result["seconds"] > 0
