"""Build the student package of the course kit: what a teacher hands out, holding no answer.

    python notebooks/exercises/make_release.py --student ../minirl-student

DIR/ mirrors the repository, so every relative path the lessons and the checker use still holds:

- ``minirl/``: the package (the lessons import it, the check cells call ``minirl.exercises.check``), with the
  checker's answer key ``minirl/exercises/_reference.py`` replaced by a stand-in whose functions raise
  ``_NoReference``: ``check`` then runs the hand-worked cases and defers the ones that compare with the reference to
  grading. minirl's own modules stay: they ARE what the exercises reimplement, and a student can always read them.
- ``pyproject.toml``, ``README.md`` (a short one for students), ``data/`` (the task and the warm start).
- ``notebooks/[0-9][0-9]_*.ipynb``: the lessons, each cell that prints an exercise's solution replaced (see
  ``strip_lesson``).
- ``notebooks/results/``: the stored results the lessons and the experiment check read.
- ``notebooks/exercises/``: the stored release (stubs, no solutions, no hidden tests).

Left out: the source exercise notebooks, the teacher's page, ``tests/`` (whose wrong implementations sit next to
the solutions), the git history. Only files git tracks are copied (``tracked``), never the working folder as it is: a
built book (``notebooks/book/_build/``, the unstripped lessons), generated pages, caches and a teacher's scratch files
stay out.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KEY = Path("minirl") / "exercises" / "_reference.py"
TAG = "exercise-solution"
WRITTEN_OUT = "pg = torch.maximum(-a * ratio"  # 03's GRPO step writes out what exercise grpo_loss asks for
PRINTS = re.compile(r"\b(?:source|excerpt)\(")  # the ways a lesson prints a function


def answer_names() -> dict[str, tuple[str, str]]:
    """{"losses.cispo_loss": (exercise, exercise notebook)}: every minirl function that holds an exercise's answer
    (``Exercise.blocked`` and the function its ``source`` names), as a lesson writes it (module.function)."""
    from minirl import exercises

    notebooks = {p.stem[:2]: p.name for p in HERE.glob("[0-9][0-9]_*.ipynb")}
    names = {}
    # first the function each exercise asks for, then the others it blocks (aggregate is exercise aggregate's
    # answer, though grpo_loss blocks it too)
    for first in (True, False):
        for ex in exercises.EXERCISES.values():
            dotted_names = (ex.source.split()[0], ex.blocked[0]) if first else ex.blocked
            for dotted in dotted_names:
                if dotted.startswith("minirl."):
                    names.setdefault(".".join(dotted.split(".")[-2:]), (ex.name, notebooks[ex.chapter]))
    return names


def _pointer(names: list[tuple[str, str]]) -> str:
    exercises = sorted({f"`{ex}` (`exercises/{nb}`)" for ex, nb in names}) or ["of this chapter"]
    return ("*In the teacher's copy this cell prints minirl's implementation: it is the solution of exercise "
            f"{', '.join(exercises)}. Write it there first; minirl's source is always there to read afterwards.*")


STRING = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'")  # a one-line string literal


def _mentions(line: str, key: str) -> bool:
    """``line`` names the function of ``key`` ("losses.cispo_loss") through any module alias (``pref.dpo_loss``).
    Text inside a string literal does not count: an excerpt's needle ``"adv.gae("`` prints the line that calls
    ``gae``, not ``gae``."""
    code = STRING.sub('""', line)
    return re.search(rf"\b\w+\.{re.escape(key.split('.')[-1])}\b", code) is not None


def strip_lesson(nb: dict, names: dict[str, tuple[str, str]]) -> tuple[dict, int]:
    """The lesson with no cell that shows an exercise's solution; returns (notebook, number of cells changed).

    In every code cell a line that prints (``plots.source(...)``, ``plots.excerpt(...)``) an answer function, with
    the lines its call continues on, becomes a comment pointing to the exercise, and the cell's outputs are cleared;
    03's written-out GRPO step computes its surrogate with minirl's ``policy_loss`` instead. A cell tagged
    ``exercise-solution`` with nothing left but comments, or any cell that would still print an answer (a loop over
    functions), becomes a markdown pointer whole.
    """
    changed = 0
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            cells.append(cell)
            continue
        src = "".join(cell["source"])
        tagged = TAG in cell["metadata"].get("tags", [])
        new = _strip_code(src, names)
        if new == src and not tagged:
            cells.append(cell)
            continue
        changed += 1
        code_left = [line for line in new.split("\n") if line.strip() and not line.lstrip().startswith("#")]
        if _still_prints(new, names) or (tagged and not code_left):
            hit = [v for k, v in names.items() if _mentions(src, k)]
            hit += [v for v in set(names.values()) if re.search(rf"\b{v[0]}\b", src.split("\n")[0])]  # tag line
            cells.append({"cell_type": "markdown", "id": cell.get("id", "") + "-pointer", "metadata": {},
                          "source": _pointer(hit)})
            continue
        metadata = {k: v for k, v in cell["metadata"].items() if k != "tags"}
        cells.append({**cell, "metadata": metadata, "source": new, "outputs": [], "execution_count": None})
    return {**nb, "cells": cells}, changed


def _strip_code(src: str, names: dict[str, tuple[str, str]]) -> str:
    lines = src.split("\n")
    out = []
    open_parens = 0  # > 0 while inside a replaced call that goes on over the next lines
    for line in lines:
        if open_parens > 0:
            open_parens += _paren_balance(line)
            continue
        hit = [(k, v) for k, v in names.items() if _mentions(line, k)]
        if line.lstrip().startswith("# solution of exercise"):
            continue  # the tag's comment; the pointer below says it
        if hit and PRINTS.search(line):
            indent = line[:len(line) - len(line.lstrip())]
            ex, nb = hit[0][1]
            out.append(f"{indent}# (the teacher's copy prints {hit[0][0]} here: the solution of exercise {ex}, "
                       f"exercises/{nb})")
            open_parens = _paren_balance(line)
        else:
            out.append(line)
    text = "\n".join(out)
    if WRITTEN_OUT in text:
        text = _grpo_step_through_minirl(text)
    return text


def _paren_balance(line: str) -> int:
    """Opening minus closing brackets on ``line``, outside string literals and comments."""
    code = STRING.sub('""', line).split("#")[0]
    return sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")


def _grpo_step_through_minirl(text: str) -> str:
    """03's GRPO step: the written-out clipped surrogate (exercise grpo_loss) replaced by minirl's policy_loss, which
    computes the same term (the next cell checks the step against rl.train_rl either way)."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ratio = torch.exp("))
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("pg_loss = "))
    indent = lines[start][:len(lines[start]) - len(lines[start].lstrip())]
    n_seq = [line for line in lines[start:end] if line.lstrip().startswith("n_seq = ")]
    body = [f"{indent}# written out in the teacher's copy: the surrogate is exercise grpo_loss "
            "(exercises/03_grpo.ipynb)",
            *n_seq,
            f"{indent}pg_loss, _ = losses.policy_loss(logprobs, old_logprobs[mb], adv[mb], m, eps_low=cfg.eps_low,",
            f"{indent}                                eps_high=cfg.eps_high, agg=\"seq-mean-token-mean\", "
            "denominator=n_seq)"]
    return "\n".join(lines[:start] + body + lines[end + 1:])


def _still_prints(src: str, names: dict[str, tuple[str, str]]) -> bool:
    """True when a code cell prints source and names an answer function anywhere (e.g. a loop over functions)."""
    return bool(PRINTS.search(src)) and any(_mentions(line, k) for line in src.split("\n")
                                            if not line.lstrip().startswith("#") for k in names)


def stand_in_key(text: str) -> str:
    """The answer key with every function replaced by one that raises ``_NoReference`` (``exp_lin``, which is
    ``checks.exp_linear_above``, and the constants stay)."""
    tree = ast.parse(text)
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != "exp_lin"]
    lines = ['"""Stand-in for the checker\'s answer key, which stays with the teacher.',
             "",
             "Every reference implementation here raises ``_NoReference``: ``exercises.check`` runs the hand-worked",
             "cases and defers the cases that compare with the reference (the seeded random ones) to grading.",
             '"""', "", "from __future__ import annotations", "", "from ..checks import exp_linear_above",
             "from ._core import _NoReference", "", "STAND_IN = True  # the checker defers a case only to this key", "",
             "CAP = 20.0", "", "",
             "def exp_lin(x):", "    return exp_linear_above(x, CAP)", "", "",
             "def _absent(*args, **kwargs):", "    raise _NoReference()", ""]
    lines += [f"{name} = _absent" for name in names]
    return "\n".join(lines) + "\n"


README = """# minirl: the student package

- `notebooks/[0-9][0-9]_*.ipynb`: the lessons. Where a lesson used to print minirl's implementation of one of your
  exercises, it points to the exercise instead.
- `notebooks/exercises/`: your exercise notebooks. Write each function in its cell and run the check cell under it:
  the cases worked out by hand run here; the seeded random cases compare with the teacher's reference and run when
  your work is graded. Use torch only: a submission that calls minirl's implementation is not graded.
- `minirl/`: the package the lessons and the checks import. Install it with `pip install -e ".[notebooks]"` from
  this folder. Its source is the thing the exercises reimplement: read it after you have written yours.
"""


def tracked(folder: str) -> list[Path]:
    """The files git tracks under ``folder`` (relative to the repository), as paths relative to it.

    Raises:
        RuntimeError: outside a git checkout (the package is never built from an untracked working folder).
    """
    run = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"the student package is built from the files git tracks, and {ROOT} is not a git "
                           f"checkout: {run.stderr.strip()}")
    return [Path(p) for p in run.stdout.split("\0") if p]


def _copy(paths: list[Path], out: Path) -> None:
    for rel in paths:
        if (ROOT / rel).is_file():  # a tracked file deleted in the working tree is left out
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, out / rel)


def build(out: Path) -> str:
    """Write the student package to ``out`` (emptied first; refused inside the repository) from the files git tracks,
    and describe it.

    Raises:
        ValueError: for a folder inside the repository. RuntimeError: outside a git checkout (``tracked``).
    """
    out = Path(out).resolve()
    if out == ROOT or ROOT in out.parents:
        raise ValueError(f"build the student package outside the repository, not in {out}")
    if out.exists():
        shutil.rmtree(out)
    _copy(tracked("minirl") + tracked("data"), out)
    (out / KEY).write_text(stand_in_key((ROOT / KEY).read_text()))
    shutil.copy(ROOT / "pyproject.toml", out / "pyproject.toml")
    (out / "README.md").write_text(README)
    nbdir = out / "notebooks"
    nbdir.mkdir()
    # the lessons' folders (results, figures, the book's sources ...): tracked files only, never build output
    _copy([p for p in tracked("notebooks") if len(p.parts) > 2 and p.parts[1] != "exercises"], out)
    names = answer_names()
    changed = {}
    for lesson in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb, n = strip_lesson(json.loads(lesson.read_text()), names)
        (nbdir / lesson.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        changed[lesson.stem] = n
    (nbdir / "exercises").mkdir()
    for release in sorted((HERE / "release").glob("*.ipynb")):
        shutil.copy(release, nbdir / "exercises" / release.name)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
    return (f"wrote the student package to {out} ({size:.0f} MiB): cells changed per lesson {changed}; "
            f"{len(list((nbdir / 'exercises').glob('*.ipynb')))} exercise notebooks")


TABLE_BEGIN = "<!-- solution cells: generated by `python notebooks/exercises/make_release.py --table`; do not edit -->"
TABLE_END = "<!-- end of the generated table -->"


def solution_cells_table() -> str:
    """The markdown table of the lessons' cells that show an exercise's solution, and what the student package does
    with each (from the lessons as they are now: ``strip_lesson``'s own decisions)."""
    names = answer_names()
    rows = ["| lesson | section | cell id | shows | solution of exercise | in the student package |",
            "|---|---|---|---|---|---|"]
    for lesson in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(lesson.read_text())
        section = ""
        stripped, _ = strip_lesson(nb, names)
        after = {c.get("id"): c for c in stripped["cells"]}
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                heads = [line for line in src.split("\n") if line.startswith("## ")]
                section = heads[-1][3:].strip() if heads else section
                continue
            new = after.get(cell.get("id"))
            if new is not None and new.get("source") == cell["source"]:
                continue  # unchanged
            hit = sorted({k for k in names if any(_mentions(line, k) for line in src.split("\n")
                                                   if PRINTS.search(line))}) or sorted({k for k in names
                                                                                       if _mentions(src, k)})
            shows = ", ".join(f"`{k}`" for k in hit) or ("the written-out clipped surrogate" if WRITTEN_OUT in src
                                                         else "?")
            exercises = sorted({names[k][0] for k in hit}) or (["grpo_loss"] if WRITTEN_OUT in src else [])
            what = ("cell replaced by a pointer" if new is None else
                    "surrogate computed by `losses.policy_loss`" if WRITTEN_OUT in src else
                    "printing lines replaced by a pointer comment")
            rows.append(f"| {lesson.stem} | {section.replace('|', '/')} | `{cell.get('id')}` | {shows} | "
                        f"{', '.join(f'`{e}`' for e in exercises)} | {what} |")
    return "\n".join(rows)


def page_table(page: str) -> str:
    """The generated table's block of the teacher's page (``README.md``), between its two markers."""
    return page[page.index(TABLE_BEGIN) + len(TABLE_BEGIN):page.index(TABLE_END)].strip()


def write_table(page_path: Path = HERE / "README.md") -> None:
    """Rewrite the teacher's page's table of solution cells from the lessons as they are now."""
    page = page_path.read_text()
    old = page_table(page)
    page_path.write_text(page.replace(old, solution_cells_table(), 1))
