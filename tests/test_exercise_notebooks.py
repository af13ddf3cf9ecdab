"""The exercise notebooks (notebooks/exercises/) are valid nbgrader source notebooks, and nbgrader grades them:
the solutions score full marks and the unsolved release scores zero, so the checks are not vacuous.

The structure tests need only the standard library and nbformat. The nbgrader round trip (generate_assignment,
then autograde of two submissions) runs in a temporary course directory, never inside the repository; it is skipped
when nbgrader (the [course] extra) is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minirl import exercises

ROOT = Path(__file__).resolve().parent.parent
EXERCISE_DIR = ROOT / "notebooks" / "exercises"
NOTEBOOKS = sorted(EXERCISE_DIR.glob("*.ipynb"))
CHAPTERS = ["00_task_and_models", "01_ppo", "02_grpo", "03_kl_estimators", "04_dapo", "05_gspo_moe", "06_preference"]
ASSIGNMENT = "minirl"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _nbgrader_cells(nb: dict, kind: str) -> list[dict]:
    return [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get(kind)]


def test_one_exercise_notebook_per_chapter():
    assert [p.stem for p in NOTEBOOKS] == CHAPTERS  # same names as the main notebooks, in reading order


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_nbgrader_source_format(path):
    nb = _load(path)
    solutions, checks = _nbgrader_cells(nb, "solution"), _nbgrader_cells(nb, "grade")
    assert 2 <= len(solutions) == len(checks) <= 4
    grade_ids = [c["metadata"]["nbgrader"]["grade_id"] for c in solutions + checks]
    assert len(grade_ids) == len(set(grade_ids))
    for c in solutions:
        assert c["cell_type"] == "code"
        assert c["metadata"]["nbgrader"] == {"solution": True, "grade": False, "locked": False,
                                             "grade_id": c["metadata"]["nbgrader"]["grade_id"], "schema_version": 3}
        src = _src(c)
        assert src.index("### BEGIN SOLUTION") < src.index("### END SOLUTION")
        assert src.lstrip().startswith("def ")  # the stub keeps the signature and docstring
    for c in checks:
        meta = c["metadata"]["nbgrader"]
        assert c["cell_type"] == "code"
        assert meta == {"grade": True, "solution": False, "locked": True, "points": meta["points"],
                        "grade_id": meta["grade_id"], "schema_version": 3}
        assert meta["points"] > 0
        src = _src(c)
        assert "assert " in src
        assert src.index("### BEGIN HIDDEN TESTS") < src.index("### END HIDDEN TESTS")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_check_cells_match_the_checker(path):
    """Each check cell grades one exercise of its own chapter, with the checker's current number of cases."""
    chapter = path.stem[:2]
    for c in _nbgrader_cells(_load(path), "grade"):
        for name, n in re.findall(r'exercises\.check\("([a-z0-9_]+)", \w+(?:, seed=\d+, quiet=True)?\) == (\d+)',
                                  _src(c)):
            assert exercises.EXERCISES[name].chapter == chapter
            assert int(n) == len(exercises.EXERCISES[name].cases), name


def test_every_exercise_is_in_a_notebook():
    graded = set()
    for path in NOTEBOOKS:
        for c in _nbgrader_cells(_load(path), "grade"):
            graded |= set(re.findall(r'exercises\.check\("([a-z0-9_]+)"', _src(c)))
    assert graded == set(exercises.list_exercises())
    assert len(graded) >= 15


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_executed_top_to_bottom_without_machine_paths(path):
    nb = _load(path)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    for c in code:
        for out in c["outputs"]:
            assert out["output_type"] != "error"
            text = json.dumps(out)
            for machine_path in ("/work", "/root", "/tmp", "/home/"):
                assert machine_path not in text
    passed = [o for c in _nbgrader_cells(nb, "grade") for o in c["outputs"] if "cases passed" in "".join(o["text"])]
    assert len(passed) == len(_nbgrader_cells(nb, "grade"))


# ----------------------------------------------------------------------------------------------------------------
# the nbgrader round trip


def _nbgrader(args: list[str], course: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # the kernel must import this checkout's minirl; nbgrader calls the `alembic` script next to the interpreter
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course}"]
    proc = subprocess.run(cmd, cwd=course, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _solved_copy(release_nb: dict, source_nb: dict) -> dict:
    """The release notebook with each solution cell filled in from the source: a student who solved everything."""
    solutions = {c["metadata"]["nbgrader"]["grade_id"]: c["source"] for c in _nbgrader_cells(source_nb, "solution")}
    for c in _nbgrader_cells(release_nb, "solution"):
        c["source"] = solutions[c["metadata"]["nbgrader"]["grade_id"]]
    return release_nb


def test_nbgrader_generate_and_autograde(tmp_path):
    pytest.importorskip("nbgrader", reason="nbgrader is not installed (pip install -e '.[course]')")
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    for path in NOTEBOOKS:
        shutil.copy(path, course / "source" / ASSIGNMENT / path.name)
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"c.CourseDirectory.course_id = {ASSIGNMENT!r}\n"
        "c.Execute.timeout = 300\n"
    )

    _nbgrader(["generate_assignment", ASSIGNMENT, "--force"], course)
    release = course / "release" / ASSIGNMENT
    assert sorted(p.name for p in release.glob("*.ipynb")) == [p.name for p in NOTEBOOKS]
    for path in release.glob("*.ipynb"):
        text = path.read_text()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "seed=2024"):
            assert marker not in text, (path.name, marker)
        stubs = _nbgrader_cells(_load(path), "solution")
        assert stubs and all("raise NotImplementedError()" in _src(c) for c in stubs)

    for student in ("solved", "blank"):
        (course / "submitted" / student / ASSIGNMENT).mkdir(parents=True)
    for path in release.glob("*.ipynb"):
        shutil.copy(path, course / "submitted" / "blank" / ASSIGNMENT / path.name)
        solved = _solved_copy(_load(path), _load(EXERCISE_DIR / path.name))
        (course / "submitted" / "solved" / ASSIGNMENT / path.name).write_text(json.dumps(solved))

    _nbgrader(["autograde", ASSIGNMENT, "--force"], course)

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        solved = gb.find_submission(ASSIGNMENT, "solved")
        blank = gb.find_submission(ASSIGNMENT, "blank")
        assert solved.max_score == blank.max_score == 2 * len(exercises.list_exercises())
        assert solved.score == solved.max_score, {nb.name: nb.score for nb in solved.notebooks}
        assert blank.score == 0, {nb.name: nb.score for nb in blank.notebooks}
        assert all(nb.max_score > 0 for nb in blank.notebooks) and len(blank.notebooks) == len(NOTEBOOKS)
