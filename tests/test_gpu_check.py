""".ci/gpu_check.sh, the GPU check, checked here without a GPU and without running it: the scripts parse, the wheel
list covers what datasets, nbval and ipykernel need beyond what the GPU image has, the wheels and the tree fit in
what a device run carries, the budgets add up to what notebooks/reference.md says, and the helper's install plan,
requirement check and summary behave on synthetic wheels and results."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from minirl import config

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / ".ci" / "gpu_check.sh"
WHEELS_SH = ROOT / ".ci" / "gpu_wheels.sh"
HELPER = ROOT / ".ci" / "gpu_check.py"
ROOTS = ("datasets", "nbval", "ipykernel")  # what the check imports beyond the image
# in the image (device KINDS.md) and too big to carry: not shipped, not walked into
NOT_SHIPPED = {"pyarrow", "numpy", "pandas", "huggingface-hub", "torch", "transformers", "tokenizers"}


def listed() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "gpu_wheels.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"not pinned with ==: {line!r}"
            assert canonicalize_name(name) not in pins, f"listed twice: {name}"
            pins[canonicalize_name(name)] = version
    return pins


def run_helper(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HELPER), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_scripts_parse():
    for script in (CHECK, WHEELS_SH):
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, (script, result.stderr)


def test_the_wheel_list_covers_what_datasets_nbval_and_ipykernel_need():
    """Walk the requirements (no extras, markers of this Python) from the roots, through every package that is not
    in NOT_SHIPPED: each one reached must be on the list. Read from this environment's metadata, whose versions
    are the ones the list pins where the dev environment and the list agree."""
    pins, reached, todo = listed(), set(), list(ROOTS)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in reached or name in NOT_SHIPPED:
            continue
        reached.add(name)
        for req in map(Requirement, importlib.metadata.requires(name) or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    missing = sorted(reached - set(pins))
    assert not missing, f"needed on the GPU machine but not in .ci/gpu_wheels.txt: {missing}"
    assert {"datasets", "dill", "multiprocess", "nbval", "ipykernel", "jupyter-client", "pyzmq", "tornado"} <= reached
    assert not NOT_SHIPPED & set(pins)


@pytest.mark.slow
def test_the_wheels_and_the_tree_fit_what_a_device_run_carries():
    """A device run sends the tracked tree and the carried .gpu-wheels/, 64 MiB in all; gpu_wheels.sh refuses
    wheels over MAX_MIB, so the tree must leave that much room."""
    max_mib = int(re.search(r"^MAX_MIB=(\d+)", WHEELS_SH.read_text(), re.M).group(1))
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if files.returncode != 0:
        pytest.skip("not a git checkout")
    tree = sum((ROOT / f).stat().st_size for f in files.stdout.split("\0") if f and (ROOT / f).is_file())
    assert tree + max_mib * 2**20 <= 64 * 2**20, (tree / 2**20, max_mib)
    assert re.search(r"^/\.gpu-wheels/$", (ROOT / ".gitignore").read_text(), re.M), "the wheels must not be committed"


def test_the_budgets_add_up_to_what_the_readme_says():
    text = CHECK.read_text()
    total = int(re.search(r"^TOTAL_BUDGET_S=(\d+)$", text, re.M).group(1))
    budgets = {m[0]: int(m[1]) for m in re.findall(r"^BUDGET_(\w+)=(\d+)$", text, re.M)}
    parts = re.findall(r"^part (\w+) ", text, re.M)
    assert parts == ["install", "imports", "bench", "warm_start", "train", "nb07", "nb03", "real_sizes", "smollm2"]
    assert set(parts) == set(budgets) and sum(budgets.values()) == total, (budgets, total)
    # the three device calls: each within the guide's 6 minutes (a call runs at most 10), every part in one of them
    calls = dict(re.findall(r'^    (\d)\) GPU_CHECK_ONLY="([\w ]+)" ;;$', text, re.M))
    assert sorted(calls) == ["1", "2", "3"] and {p for c in calls.values() for p in c.split()} == set(parts)
    for call, names in calls.items():
        assert names.split()[:2] == ["install", "imports"]  # a fresh machine needs them; on a warm one they are quick
        assert sum(budgets[n] for n in names.split()) <= 360, (call, names)
    steps = int(re.search(r'^TRAIN_STEPS="\$\{GPU_CHECK_TRAIN_STEPS:-(\d+)\}"', text, re.M).group(1))
    readme = " ".join((ROOT / "notebooks" / "reference.md").read_text().split())  # "Tested with"; prose wraps anywhere
    assert f"about {round(total / 60)} minutes ({total} s) in all" in readme
    assert f"{steps} of its {config.PROFILES['gpu'].rl_steps} RL steps" in readme
    assert "One run has been measured on a GPU" in readme and "as three device calls (`GPU_CHECK_CALL=1|2|3`" in readme
    for notebook in ("03", "07"):
        assert len(list((ROOT / "notebooks").glob(f"{notebook}_*.ipynb"))) == 1  # the globs the check runs
    assert "--profile '$PROFILE'" in text and "export MINIRL_PROFILE=\"$PROFILE\"" in text


def test_the_profile_variable_the_check_sets_is_the_one_the_notebooks_read(monkeypatch):
    monkeypatch.setenv("MINIRL_PROFILE", "cpu")
    assert config.resolve_profile().name == "cpu"
    monkeypatch.setenv("MINIRL_PROFILE", "gpu")
    if not config.torch.cuda.is_available():  # the check's import part relies on this refusal
        with pytest.raises(ValueError, match="needs a CUDA device"):
            config.resolve_profile()
    else:
        assert config.resolve_profile().name == "gpu"


# --- the helper, on synthetic wheels ----------------------------------------------------------------------------
def fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta)
    return path


@pytest.mark.slow
def test_the_plan_installs_only_what_is_missing(tmp_path):
    pytest_version = importlib.metadata.version("pytest")
    a = fake_wheel(tmp_path, "minirl-fake-a", "1.0", ("pytest>=1", "minirl-fake-b", "unshipped-x; extra == 'x'"))
    b = fake_wheel(tmp_path, "minirl-fake-b", "2.0")
    fake_wheel(tmp_path, "pytest", "999.0")
    result = run_helper("plan", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(a), str(b)]  # pytest is here and meets ">=1": kept
    assert f"pytest {pytest_version}" in result.stderr and "2 of 3 wheels to install" in result.stderr


@pytest.mark.slow
def test_the_plan_replaces_a_version_a_shipped_package_rules_out_but_never_torchs_stack(tmp_path):
    a = fake_wheel(tmp_path, "minirl-fake-a", "1.0", ("pytest>=999", "torch>=999"))
    shipped_pytest = fake_wheel(tmp_path, "pytest", "999.0")
    fake_wheel(tmp_path, "torch", "999.0")
    result = run_helper("plan", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(a), str(shipped_pytest)], result.stderr
    assert "replacing pytest" in result.stderr and "replacing torch" not in result.stderr


@pytest.mark.slow
def test_verify_names_what_is_missing_and_refuses_two_versions(tmp_path):
    fake_wheel(tmp_path, "minirl-fake-a", "1.0")
    result = run_helper("verify", str(tmp_path))
    assert result.returncode == 1 and "shipped but not installed: minirl-fake-a" in result.stdout
    fake_wheel(tmp_path, "minirl-fake-a", "1.1")
    result = run_helper("plan", str(tmp_path))
    assert result.returncode != 0 and "two wheels of minirl-fake-a" in result.stderr


@pytest.mark.slow
def test_verify_passes_on_this_environment_for_a_package_it_has(tmp_path):
    """pytest as the one shipped wheel: installed here with all its requirements, so nothing is missing."""
    fake_wheel(tmp_path, "pytest", importlib.metadata.version("pytest"))
    result = run_helper("verify", str(tmp_path))
    assert result.returncode == 0 and "0 missing" in result.stdout, result.stdout


# --- the summary, on synthetic results ---------------------------------------------------------------------------
def write_results(work: Path, nb03_status: str) -> None:
    rows = [("install", "ok", 9.5, 29), ("imports", "ok", 6.0, 40), ("bench", "ok", 20.0, 80),
            ("warm_start", "ok", 50.0, 140), ("train", "ok", 61.2, 210), ("nb03", nb03_status, 70.0, 85),
            ("nb07", "ok", 40.0, 120)]
    (work / "parts.tsv").write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))
    (work / "env.json").write_text(json.dumps({"python": "3.12.3", "device": "NVIDIA H200"}))
    seconds = {"generate": 0.1, "logprob_forwards": 0.02, "train_forward": 0.01, "backward": 0.02,
               "optimizer": 0.001, "total": 0.151}
    (work / "bench.json").write_text(json.dumps({"batch": "32 prompts x 16 samples", "gpu": "NVIDIA H200",
                                                 "dense": {"seconds": seconds, "peak_memory_mb": 900.0},
                                                 "moe": {"seconds": seconds, "peak_memory_mb": 1500.0}}))
    (work / "train").mkdir()
    side = {"sampled_accuracy": 0.4, "sampled_accuracy_stderr": 0.02, "greedy_accuracy": 0.5}
    (work / "train" / "summary.json").write_text(json.dumps(
        {"algo": "grpo", "profile": "gpu", "seed": 0, "steps": 3, "parameters": 5_000_000, "before": side,
         "after": {**side, "sampled_accuracy": 0.6}, "total_seconds": 61.2, "warm_start_seconds": 0.4}))
    (work / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "eval_accuracy": 0.4}, {"step": 1, "time": 0.3}, {"step": 2, "time": 0.5},
        {"step": 3, "time": 0.4})))
    (work / "nb07.log").write_text("....\n========== 22 passed, 1 warning in 39.12s ==========\n")


@pytest.mark.slow
def test_the_summary_prints_the_figures_and_passes_when_every_part_did(tmp_path):
    write_results(tmp_path, "ok")
    result = run_helper("summary", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "RESULT: PASS: 7 of 7 parts ok" in out
    assert "0.400 +- 0.020 -> 0.600 +- 0.020" in out and "median 0.400 s" in out  # median of 0.3, 0.5, 0.4
    assert "dense seconds (median): generate 0.1000" in out and "peak_memory_mb 1500.0" in out
    assert "nb07: ok; pytest: 22 passed, 1 warning in 39.12s" in out
    assert "all parts" in out and "256.7" in out  # 9.5 + 6 + 20 + 50 + 61.2 + 70 + 40


@pytest.mark.slow
def test_the_summary_fails_when_a_part_ran_out_of_time(tmp_path):
    write_results(tmp_path, "TIMEOUT")
    result = run_helper("summary", str(tmp_path))
    assert result.returncode == 1
    assert "RESULT: FAIL (nb03): 6 of 7 parts ok" in result.stdout
    assert "nb03: TIMEOUT; pytest: (no closing line)" in result.stdout
