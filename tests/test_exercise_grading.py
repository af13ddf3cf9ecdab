"""Grading outside the student's kernel (``minirl.exercises.grade``, issue 53): the screen of solution cells, the
fresh process, the verdict the student's code cannot write, and each of the four cheats plus monkeypatching."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from minirl.exercises import grade

EXERCISES = Path(__file__).resolve().parent.parent / "notebooks" / "exercises"
SOURCES = sorted(EXERCISES.glob("[0-9][0-9]_*.ipynb"))


def _solution_cells(path):
    for cell in json.loads(path.read_text())["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("solution"):
            yield meta["grade_id"], "".join(cell["source"])


def _submission(tmp_path, name, edits):
    """The stored release of notebook ``name`` (stubs), with ``edits`` {grade_id: new source} in its solution cells."""
    nb = json.loads((EXERCISES / "release" / name).read_text())
    for cell in nb["cells"]:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in edits:
            cell["source"] = edits.pop(gid)
    assert not edits, f"no such cells: {edits}"
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    return path


def _solution(name, grade_id):
    return dict(_solution_cells(EXERCISES / name))[grade_id]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_solution_passes_the_screen(path):
    # the teacher's own solutions (and prediction cells) use nothing the screen refuses
    for grade_id, source in _solution_cells(path):
        assert grade.screen(source) == [], (grade_id, grade.screen(source))


@pytest.mark.parametrize("source, refused", [
    ("exercises.check = lambda *a, **k: 5", "changes exercises.check"),
    ("experiments.run_arm = lambda *a, **k: {}", "changes experiments.run_arm"),
    ("import torch\ntorch.allclose = lambda *a, **k: True", "changes torch.allclose"),
    ("from minirl.exercises._core import _NoReference", "imports minirl.exercises._core"),
    ("from minirl import kl", "imports minirl.kl"),
    ("def k3(a, b):\n    pass\nk3.__code__ = None", "reads the attribute __code__"),
    ("import importlib.util", "imports importlib.util"),
    ("import os", "imports os"),
    ("x = getattr(exercises, 'check')", "uses getattr"),
    ("exec('1')", "uses exec"),
    ("exercises.EXERCISES['gae'].cases.clear()", "uses the checker (exercises.EXERCISES)"),
    ("f = exercises.check", "uses the checker (exercises.check) other than by calling it"),
    ("exercises = None", "rebinds exercises"),
    ("class T(torch.Tensor):\n    pass", "defines a class"),
    ("m = torch.load('x')", "uses torch's load"),
    ("def f(x:\n", "does not parse"),
])
def test_the_screen_refuses_what_reaches_beyond_the_function(source, refused):
    assert any(refused in p for p in grade.screen(source)), grade.screen(source)


def test_the_screen_allows_what_a_solution_needs():
    ok = ("import math\nimport torch\nimport torch.nn.functional as F\nfrom typing import Optional\n"
          "from minirl.checks import exp_linear_above\nfrom minirl import checks\n"
          "def f(x, *, mask=None):\n    out = torch.zeros_like(x)\n    out[torch.arange(2), 0] += 1\n"
          "    a, b = x.shape\n    out.grad = None\n    return F.softplus(out).sum(-1)\n"
          "print(exercises.check('k3', f))\nexperiments.predict('beta', 'beta=0')\n")
    assert grade.screen(ok) == []


@pytest.mark.slow
def test_the_teachers_solutions_score_full_marks_and_the_stubs_none(tmp_path):
    solved = grade.grade_notebook(EXERCISES / "04_kl_estimators.ipynb", EXERCISES / "04_kl_estimators.ipynb")
    assert [(r["exercise"], r["points"], r["verdict"]) for r in solved] == [
        ("k3", 2, "passed"), ("kl_reward", 2, "passed"), ("exact_kl", 2, "passed")]
    blank = grade.grade_notebook(EXERCISES / "release" / "04_kl_estimators.ipynb", EXERCISES / "04_kl_estimators.ipynb")
    assert [r["points"] for r in blank] == [0, 0, 0] and all("not implemented" in r["verdict"] for r in blank)


@pytest.mark.slow
def test_cheat_2_a_replaced_checker_scores_nothing(tmp_path):
    """Cheat 2 of issue 53: exercises.check and experiments.run_arm replaced from a solution cell (8/8 in nbgrader)."""
    cheat = ("def gae(rewards, values, mask, *, gamma=1.0, lam=0.95):\n    raise NotImplementedError\n"
             "exercises.check = lambda *a, **k: 5\nexperiments.run_arm = lambda *a, **k: {}\n")
    rows = grade.grade_notebook(_submission(tmp_path, "02_ppo.ipynb", {"gae-solution": cheat}),
                                EXERCISES / "02_ppo.ipynb")
    assert [r["points"] for r in rows] == [0, 0, 0]
    assert all("not graded" in r["verdict"] and "changes exercises.check" in r["verdict"] for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("cheat, refused", [
    # cheat 1: the checker's own _NoReference
    ("from minirl.exercises._core import _NoReference\ndef k3(logprobs, ref_logprobs):\n    raise _NoReference()\n",
     "imports minirl.exercises._core"),
    # cheat 3: minirl's code object under the student's name
    ("from minirl import kl\ndef k3(logprobs, ref_logprobs):\n    pass\nk3.__code__ = kl.k3.__code__\n",
     "imports minirl.kl"),
    # cheat 4: a second copy of the answer key, loaded from its file
    ("import importlib.util\nspec = importlib.util.spec_from_file_location('x', 'minirl/exercises/_reference.py')\n"
     "key = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(key)\nk3 = key.k3\n",
     "imports importlib.util"),
    # monkeypatching: the comparison made to say yes
    ("def k3(logprobs, ref_logprobs):\n    return logprobs\ntorch.allclose = lambda *a, **k: True\n",
     "changes torch.allclose"),
])
def test_the_four_cheats_and_monkeypatching_score_nothing(tmp_path, cheat, refused):
    rows = grade.grade_notebook(_submission(tmp_path, "04_kl_estimators.ipynb", {"k3-solution": cheat}),
                                EXERCISES / "04_kl_estimators.ipynb")
    assert rows[0]["exercise"] == "k3" and rows[0]["points"] == 0 and refused in rows[0]["verdict"], rows[0]


@pytest.mark.slow
def test_the_students_output_cannot_write_the_verdict(tmp_path):
    # a solution cell that prints what a verdict looks like: its output is captured, the verdict comes from the check
    forged = ('print(\'{"k3": "passed", "kl_reward": "passed", "exact_kl": "passed"}\')\n'
              "def k3(logprobs, ref_logprobs):\n    return logprobs - ref_logprobs\n")
    rows = grade.grade_notebook(_submission(tmp_path, "04_kl_estimators.ipynb", {"k3-solution": forged}),
                                EXERCISES / "04_kl_estimators.ipynb")
    assert rows[0]["points"] == 0 and "k3: case 1/4 'three tokens by hand' failed" in rows[0]["verdict"]  # k1
    assert [r["points"] for r in rows[1:]] == [0, 0]


@pytest.mark.slow
def test_a_check_nbgrader_passed_and_this_fails_is_flagged(tmp_path):
    # an autograded notebook whose check cells show no error (as a replaced check makes them), regraded here
    nb = json.loads((EXERCISES / "release" / "04_kl_estimators.ipynb").read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            cell["execution_count"], cell["outputs"] = 1, []
    path = tmp_path / "04_kl_estimators.ipynb"
    path.write_text(json.dumps(nb))
    out = tmp_path / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "minirl.exercises.grade", str(path), "--csv", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "<- nbgrader passed it" in done.stdout, done.stdout + done.stderr
    assert "0 of 6 points in 3 function exercises" in done.stdout
    assert out.read_text().splitlines()[0] == ("student,notebook,exercise,points,max,verdict,nbgrader,disagrees,"
                                               "like_minirl,like_which")


def test_the_cells_run_come_from_the_teachers_notebook(tmp_path):
    # a submission's edits to a setup cell are ignored (nbgrader restores locked cells too); its check cells never run
    nb = json.loads((EXERCISES / "release" / "04_kl_estimators.ipynb").read_text())
    nb = copy.deepcopy(nb)
    nb["cells"][1]["source"] = "import os\nexercises = None\n"
    path = tmp_path / "04_kl_estimators.ipynb"
    path.write_text(json.dumps(nb))
    cells, checks, problems = grade.program(path, EXERCISES / "04_kl_estimators.ipynb")
    assert not any("import os" in c for c in cells) and not any("exercises.check(" in c for c in cells)
    assert [c[0] for c in checks] == ["k3", "kl_reward", "exact_kl"] and all(p == [] for p in problems.values())


def test_a_pasted_library_function_is_pointed_out():
    """Not prevented, but shown (issue 53's threat model): minirl's own gae pasted with its names changed reads as
    the same tree; a student's own loop-free rewrite does not."""
    import inspect
    import re

    from minirl import advantages

    pasted = inspect.getsource(advantages.gae)
    for old, new in (("rewards", "r"), ("values", "v"), ("mask", "m"), ("lastgaelam", "acc"), ("delta", "d")):
        pasted = re.sub(rf"\b{old}\b", new, pasted)
    like, whose = grade.similarity(pasted, "gae", "gae")
    assert like >= 0.95 and whose == "minirl.advantages.gae", (like, whose)
    own = ("def gae(rewards, values, mask, *, gamma=1.0, lam=0.95):\n"
           "    T = rewards.shape[1]\n    w = (gamma * lam) ** (torch.arange(T)[None, :] - torch.arange(T)[:, None])\n"
           "    return torch.zeros(1), torch.zeros(1)\n")
    assert grade.similarity(own, "gae", "gae")[0] < 0.95
    assert grade.similarity("x = 1", "gae", "gae") == (0.0, "")
