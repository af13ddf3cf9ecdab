"""Grading outside the student's kernel (issue 53): ``python -m minirl.exercises.grade SUBMITTED.ipynb ...``.

nbgrader runs a submitted notebook in one kernel, beside the student's own code, so a solution cell can replace
``exercises.check`` or ``experiments.run_arm`` and the check cells then report whatever it likes (cheat 2 of issue
53: 8/8 with nothing implemented). ``check`` itself refuses what it can see (a patched comparison, a patched case
list, answer code under any name), but not a replaced ``check``. This command regrades where the student's code
cannot reach the verdict:

1. **Screen** every solution cell of the submission (``screen``, read with ``ast``, never run): a cell that imports
   anything but torch, math, re, typing, collections.abc and minirl.checks, names eval / exec / getattr / globals /
   open / type / ..., reads an attribute beginning with "_", defines a class, assigns to or deletes anything it did
   not create (``exercises.check = ...``, ``torch.allclose = ...``), or uses the checker other than by calling
   ``exercises.check``, ``exercises.list_exercises`` or ``experiments.predict`` is refused, and the notebook's
   exercises score 0 with the reason.
2. **Run** the teacher's copy of the notebook (its setup cells) with the student's solution cells in a fresh Python
   process, which imported the checker (and fingerprinted it, ``_core.watch_all``) before any student code; the
   student's output is captured, the check cells are not run, and each exercise is checked there at seed 0 and at
   the hidden tests' seed 2024.
3. **Read** the verdicts from a file descriptor the child duplicated before any student code ran (stdout and stderr
   are redirected first), with a time limit; a child that dies or says nothing scores 0.

Experiment exercises are not rerun (two training runs each): with a clean screen their cells are nbgrader's own
locked cells and their points stand. The cell roles (setup, solution, check) come from the teacher's source notebook,
matched by nbgrader's ``grade_id``; a submission's edits to any other cell are ignored, as nbgrader ignores them.

Usage::

    python -m minirl.exercises.grade course/submitted/alice/minirl/*.ipynb --source notebooks/exercises
    python -m minirl.exercises.grade ... --csv grades.csv   # one row per exercise; exit 1 if any is refused

Given nbgrader's autograded notebooks (which hold the check cells' outputs), each row also says what nbgrader gave
and flags a disagreement: a check that passed in the student's kernel and fails here.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parents[2] / "notebooks" / "exercises"
SEEDS = (0, 2024)  # the check cell's seed and the hidden tests'
ALLOWED_IMPORTS = ("torch", "torch.nn", "torch.nn.functional", "math", "re", "typing", "collections.abc",
                   "minirl.checks")
REFUSED_NAMES = {"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "getattr", "setattr", "delattr",
                 "open", "input", "breakpoint", "memoryview", "type", "object", "super", "__builtins__", "In", "Out",
                 "get_ipython", "exit", "quit"}
SETUP_NAMES = {"exercises", "experiments", "torch", "math", "exp_linear_above", "check"}
CHECKER_CALLS = {("exercises", "check"), ("exercises", "list_exercises"), ("experiments", "predict")}
TORCH_REFUSED = {"load", "save", "hub", "ops", "library", "overrides", "utils", "jit", "compile", "package",
                 "classes", "set_default_dtype", "set_default_device"}
CHECK_CALL = re.compile(r'^assert exercises\.check\("(\w+)", (\w+)\) == (\d+)', re.M)


def screen(source: str) -> list[str]:
    """What in one solution cell's ``source`` reaches beyond writing its function; [] when nothing does.

    Read with ``ast``, never run. Refused: imports outside ``ALLOWED_IMPORTS``; the names of ``REFUSED_NAMES``
    (introspection and dynamic code); any attribute beginning with "_"; class definitions; torch's loaders and
    global switches (``TORCH_REFUSED``); the checker's modules used other than through ``CHECKER_CALLS``; assigning
    to or deleting an attribute or item of a name the cell did not bind itself.

    Raises:
        Nothing: a cell that does not parse is reported as such (the notebook's kernel would fail on it too).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"does not parse: {e.msg} (line {e.lineno})"]
    problems: list[str] = []
    own = _bound_names(tree) - SETUP_NAMES
    calls = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        line = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.module == "minirl":
                mods = ["minirl." + a.name for a in node.names]
            problems += [f"{line}: imports {m}" for m in mods if m not in ALLOWED_IMPORTS]
        elif isinstance(node, ast.Name) and node.id in REFUSED_NAMES:
            problems.append(f"{line}: uses {node.id}")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del) and node.id in SETUP_NAMES:
            problems.append(f"{line}: rebinds {node.id}, a name the notebook's setup cell binds")
        elif isinstance(node, ast.Attribute):
            root = _root(node)
            if node.attr.startswith("_"):
                problems.append(f"{line}: reads the attribute {node.attr}")
            elif root == "torch" and node.attr in TORCH_REFUSED:
                problems.append(f"{line}: uses torch's {node.attr}")
            elif root in ("exercises", "experiments") and (not isinstance(node.value, ast.Name)
                                                          or (root, node.attr) not in CHECKER_CALLS
                                                          or id(node) not in calls):
                problems.append(f"{line}: uses the checker ({root}.{node.attr}) other than by calling it")
        elif isinstance(node, ast.ClassDef):
            problems.append(f"{line}: defines a class ({node.name})")
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in _targets(targets):
                if isinstance(t, ast.Attribute | ast.Subscript) and _root(t) not in own:
                    problems.append(f"{line}: changes {ast.unparse(t)}, which it did not create")
    return problems


def _targets(nodes) -> list[ast.AST]:
    # the things assigned to, unpacked (a, b.c = ...), without their indices (x[torch.arange(n)] changes x only)
    out = []
    for t in nodes:
        if isinstance(t, ast.Tuple | ast.List):
            out += _targets(t.elts)
        else:
            out.append(t.value if isinstance(t, ast.Starred) else t)
    return out


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_names(tree: ast.AST) -> set[str]:
    """Names the cell binds itself: assignment targets, loop and with targets, functions, their parameters."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.Lambda):
            if isinstance(node, ast.FunctionDef):
                names.add(node.name)
            a = node.args
            names |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    return names


def similarity(source: str, fn_name: str, exercise: str) -> tuple[float, str]:
    """How closely the function ``fn_name`` in ``source`` follows minirl's own function or the answer key's for
    ``exercise``: (the best ratio in [0, 1], whose function), or (0.0, "") when it is not found.

    Both are compared as their syntax trees with every name and parameter renamed and the docstring dropped
    (``difflib`` over the dumped trees), so renaming variables or reformatting does not lower it. A short correct
    function is close to minirl's whatever its author did (there are few ways to write k3); a long one at 0.95 or
    more is worth reading beside minirl's. It is a pointer for the teacher, never a grade.
    """
    import difflib
    import importlib
    import inspect

    from . import EXERCISES

    mine = _normalised(source, fn_name)
    if mine is None or exercise not in EXERCISES:
        return 0.0, ""
    best = (0.0, "")
    for dotted in (*EXERCISES[exercise].blocked, f"minirl.exercises._reference.{exercise}"):
        module, attr = dotted.rsplit(".", 1)
        fn = inspect.unwrap(getattr(importlib.import_module(module), attr, None))
        theirs = _normalised(inspect.getsource(fn), attr) if callable(fn) else None
        if theirs is not None:
            ratio = difflib.SequenceMatcher(None, mine, theirs, autojunk=False).ratio()
            best = max(best, (round(ratio, 3), dotted))
    return best


def _normalised(source: str, fn_name: str) -> list[str] | None:
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return None
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn_name), None)
    if fn is None:
        return None
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(
        getattr(fn.body[0], "value", None), ast.Constant) else fn.body
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Name):
            node.id = "v"
        elif isinstance(node, ast.arg):
            node.arg = "a"
        elif isinstance(node, ast.FunctionDef):
            node.name = "f"
    return re.findall(r"\w+|[^\w\s]", " ".join(ast.dump(b, annotate_fields=False) for b in body))


def _cells(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text())["cells"]


def _meta(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def program(submitted: Path, source: Path) -> tuple[list[str], list[tuple[str, str, int, int]], dict[str, list[str]]]:
    """(the cells to run, the checks [(exercise, function name, cases, points)], {solution grade_id: problems}).

    The cells are the source notebook's code cells in order, each solution cell replaced by the submission's cell of
    the same ``grade_id`` (absent: left out), the graded cells (checks) left out."""
    theirs = {_meta(c).get("grade_id"): "".join(c["source"]) for c in _cells(submitted) if _meta(c).get("solution")}
    cells, checks, problems = [], [], {}
    for cell in _cells(source):
        if cell["cell_type"] != "code":
            continue
        meta, text = _meta(cell), "".join(cell["source"])
        if meta.get("solution"):
            if meta["grade_id"] in theirs:
                cells.append(theirs[meta["grade_id"]])
                problems[meta["grade_id"]] = screen(theirs[meta["grade_id"]])
        elif meta.get("grade"):
            checks += [(m[0], m[1], int(m[2]), int(meta.get("points", 0))) for m in CHECK_CALL.findall(text)]
        else:
            cells.append(text)
    return cells, checks, problems


def _child() -> None:
    """The fresh process: fingerprint the checker, run the cells with output captured, check, write the verdicts on
    the descriptor saved before any student code ran."""
    verdict = os.fdopen(os.dup(1), "w")
    sink = os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    job = json.loads(sys.stdin.read())
    from minirl import exercises  # fingerprints the checker (watch_all) before any cell runs
    from minirl.exercises import _core

    check = exercises.check
    namespace: dict = {"__name__": "__main__"}
    results, error = {}, None
    for cell in job["cells"]:
        try:
            exec(compile(cell, "<cell>", "exec"), namespace)
        except BaseException as e:  # as in a notebook: the next cells still run; a function left undefined fails
            error = error or f"a cell raised {type(e).__name__}: {e}"
    for name, fn_name, n_cases, _ in job["checks"]:
        try:
            _core._refuse_if_tampered(name, "before the check")
            if fn_name not in namespace:
                why = f" ({error})" if error else ""
                raise AssertionError(f"{name}: the function {fn_name} is not defined{why}")
            for seed in SEEDS:
                if check(name, namespace[fn_name], seed=seed, quiet=True) != n_cases:
                    raise AssertionError(f"{name}: not {n_cases} cases")
            results[name] = "passed"
        except BaseException as e:
            results[name] = " ".join(str(e).split()) or type(e).__name__  # the checker's message, on one line
    verdict.write(json.dumps(results))
    verdict.close()


def grade_notebook(submitted: Path, source: Path, *, timeout: float = 300.0) -> list[dict]:
    """The function exercises of one submitted notebook, graded outside its kernel.

    Returns:
        One dict per exercise: ``exercise``, ``points`` (0 or the check cell's), ``max``, ``verdict`` ("passed", the
        checker's message, or why it was not graded), ``nbgrader`` (what the autograded notebook's check cell shows:
        "passed", "failed", or "" when the notebook holds no outputs) and ``disagrees``.
    """
    cells, checks, problems = program(Path(submitted), Path(source))
    refused = [f"solution cell {gid}: {p}" for gid, ps in problems.items() for p in ps]
    if refused:
        verdicts = {name: "not graded: " + "; ".join(refused) for name, *_ in checks}
    elif checks:
        job = json.dumps({"cells": cells, "checks": checks})
        try:
            done = subprocess.run([sys.executable, "-m", "minirl.exercises.grade", "--child"], input=job,
                                  capture_output=True, text=True, timeout=timeout)
            verdicts = json.loads(done.stdout) if done.stdout.strip() else {}
        except (subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            verdicts = {name: f"no verdict: {type(e).__name__}" for name, *_ in checks}
    else:
        verdicts = {}
    shown = _nbgrader_results(Path(submitted))
    solutions = "\n".join(c for c in cells)
    parts = Path(submitted).resolve().parts
    rows = []
    for name, fn_name, _, points in checks:
        v = verdicts.get(name, "no verdict: the grading process ended without one")
        ok = v == "passed"
        like, whose = similarity(solutions, fn_name, name)
        rows.append({"student": parts[-3] if len(parts) >= 3 else "", "notebook": Path(submitted).name,
                     "exercise": name, "points": points if ok else 0, "max": points, "verdict": v,
                     "nbgrader": shown.get(name, ""), "disagrees": shown.get(name) == "passed" and not ok,
                     "like_minirl": like, "like_which": whose})
    return rows


def _nbgrader_results(path: Path) -> dict[str, str]:
    """{exercise: "passed" / "failed"} from the check cells' outputs of an executed (autograded) notebook."""
    out = {}
    for cell in _cells(path):
        if _meta(cell).get("grade") and cell.get("cell_type") == "code" and cell.get("execution_count"):
            failed = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
            for name, *_ in CHECK_CALL.findall("".join(cell["source"])):
                out[name] = "failed" if failed else "passed"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minirl.exercises.grade", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="submitted or autograded exercise notebooks")
    parser.add_argument("--source", type=Path, default=SOURCE_DIR, help="the teacher's source notebooks' folder")
    parser.add_argument("--csv", type=Path, default=None, help="also write one row per exercise to this CSV file")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per notebook (default 300)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child()
        return 0
    rows, t0 = [], time.time()
    for path in args.notebooks:
        source = args.source / path.name
        if not source.exists():
            parser.error(f"{path}: no source notebook {source}")
        rows += grade_notebook(path, source, timeout=args.timeout)
    for r in rows:
        flag = "  <- nbgrader passed it" if r["disagrees"] else ""
        like = f"  ({r['like_minirl']:.2f} like {r['like_which']})" if r["like_minirl"] >= 0.95 else ""
        print(f"{r['student']:12s} {r['notebook']:28s} {r['exercise']:24s} {r['points']}/{r['max']}  "
              f"{r['verdict'][:160]}{flag}{like}")
    total, best = sum(r["points"] for r in rows), sum(r["max"] for r in rows)
    print(f"{total} of {best} points in {len(rows)} function exercises, {time.time() - t0:.1f} s")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["notebook"])
            writer.writeheader()
            writer.writerows(rows)
    return 1 if any(r["verdict"].startswith(("not graded", "no verdict")) or r["disagrees"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
