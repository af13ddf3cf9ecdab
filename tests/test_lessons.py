"""The lesson notebooks (notebooks/[0-9][0-9]_*.ipynb) read as lessons, not lab records (STYLE.md, "Notebooks:
lessons, not lab records"; issue 29): short markdown cells, short stored outputs without progress-bar chunks, no
project history in the prose, and every decimal figure of the prose traceable to what the notebook printed or to a
stored result it reads. Each check reports notebook, cell index and the offending text, so the author can fix the prose.
The figure check is only as sharp as the prose's digits: against a notebook that reads large sweeps, almost any
two-digit figure is the rounding of some stored number, while a three-digit one is matched by chance about half
the time; print the figures a lesson quotes and the check holds them exactly.

Run alone with ``python -m pytest tests/test_lessons.py -q`` (about a second: it only reads JSON)."""

import ast
import bisect
import io
import json
import re
import subprocess
import sys
import tokenize
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RESULTS = ROOT / "notebooks" / "results"
MAX_WORDS, MAX_LINES = 300, 60
MAX_LIST = 16  # a longer list in a stored result is a curve (see json_numbers)

# Constants a lesson may quote without printing them: paper values and settings written in the prose, not results.
# Keep each list short and say where the figure comes from; a measured figure belongs in an output, never here.
ALLOWED = {
    "00_task_and_models": [
        0.15,  # warm_start.SCREEN_MARGIN: the screen's distance from the target that triggers a full check
    ],
    "01_policy_gradient": [],
    "02_ppo": [],
    "03_grpo": [],
    "04_kl_estimators": [],
    "05_dapo": [],
    "07_gspo_moe": [
        0.9997, 1.0004,  # GSPO's sequence clip range 1 - 3e-4, 1 + 4e-4 (Zheng et al. 2025, section 5.1)
    ],
    "08_preference": [],
    "10_to_trl": [],
    "11_sampler_mismatch": [],
    "06_entropy": [],
    "09_distillation": [],
    "12_stale_samplers": [],
    "13_real_model": [],
    "14_multi_turn": [],
    "15_reward_models": [],
}

# A figure: a number with a decimal point (0.358, 2.79, .5, 1.5e-3) or a percentage (27%, 1.9%), signs dropped.
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?\s?%|\d*\.\d+(?:[eE][-+]?\d+)?)(?![\w.]*\d)")
NUMBER = re.compile(r"(?<![\w.])\d*\.?\d+(?:[eE][-+]?\d+)?")
NOT_FIGURES = [  # text in which a dotted number is not a measured figure
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"https?://\S+"),
    re.compile(r"\b\d+\.\d+\.\d+\b"),  # version numbers (torch 2.13.0)
    re.compile(r"\b[A-Za-z]+-\d+(?:\.\d+)+"),  # model names (Llama-3.1-8B; Qwen2.5 never matches a figure)
    re.compile(r"\b(?:torch|TRL|trl|Python|python|transformers|version|v)\s?\d+\.\d+\b"),  # TRL 1.16
    re.compile(r"\b\d{4}\.\d{4,5}\b"),  # arXiv identifiers
    re.compile(r"\b(?:eq|equation|section|sec|table|figure|fig)s?\.?\s\d+\.\d+", re.I),  # eq. 4.2
]
# Project history: a previous execution, an earlier warm start, or a commit ("at commit a91ca94", "over four commits");
# "names its command and commit", which says where a stored result's provenance is, is not history.
HISTORY = re.compile(r"previous(?:ly)? (?:execut|stored run)|notebook's previous|earlier (?:run|execution)s? of this "
                     r"notebook|(?:last|previous) (?:time|run) (?:of )?this notebook|this notebook previously"
                     r"|(?:earlier|previous|older) warm start|(?<!command, )(?<!command and )(?<!command, the )"
                     r"(?<!commands and )\bcommit(?:s|ted)?\b", re.I)
HEX = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
PROGRESS = re.compile(r"\r|it/s\]|s/it\]|\d+%\|")


def text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


@cache
def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def markdown(path: Path):
    return [(i, text(c["source"])) for i, c in enumerate(cells(path)) if c["cell_type"] == "markdown"]


def outputs(path: Path):
    """(cell index, text) of every stored stream and text/plain (execute_result, display_data) output."""
    for i, c in enumerate(cells(path)):
        for out in c.get("outputs", []):
            if out["output_type"] == "stream":
                yield i, text(out.get("text"))
            elif out["output_type"] in ("execute_result", "display_data"):
                yield i, text(out.get("data", {}).get("text/plain"))


@cache
def repository_commits() -> tuple[str, ...]:
    """Every commit hash of this repository (empty outside a git checkout: then only the words are checked)."""
    run = subprocess.run(["git", "rev-list", "--all"], cwd=ROOT, capture_output=True, text=True, check=False)
    return tuple(run.stdout.split()) if run.returncode == 0 else ()


def code_numbers(source: str) -> list[str]:
    """Numeric literals of a code cell, comments left out (a figure typed in a comment is not a setting)."""
    lines = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(lines + "\n").readline)
                if t.type == tokenize.NUMBER]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return NUMBER.findall(re.sub(r"#.*", "", lines))


def read_files(path: Path) -> list[Path]:
    """Stored results this notebook's code names: a file or folder of notebooks/results/ whose name appears in a
    code cell; for a folder, the JSON directly in it (summary.json, sweep.json, ...), not its per-run logs."""
    code = "\n".join(text(c["source"]) for c in cells(path) if c["cell_type"] == "code")
    files = []
    for entry in sorted(RESULTS.iterdir()):  # named as a path: "results/NAME..." or a string "NAME" (RESULTS / "NAME")
        if re.search(rf"(?:results/|[\"'])(?:{re.escape(entry.name)}|{re.escape(entry.stem)}\.py)(?![\w.])", code):
            if entry.is_dir():
                files += sorted(entry.glob("*.json"))
            elif entry.suffix in (".json", ".txt"):  # README.md is prose about the results, not a result
                files.append(entry)
    return files


def json_numbers(value) -> list[float]:
    """Absolute values of the numbers in a JSON value. Of a long list (a per-step curve) only the first and the last
    count: a figure read off the middle of a curve must be printed by the notebook before the prose quotes it."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in json_numbers(v)]
    if isinstance(value, list):
        return [x for v in (value if len(value) <= MAX_LIST else value[:1] + value[-1:]) for x in json_numbers(v)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [abs(float(value))]
    return [abs(float(n)) for n in NUMBER.findall(str(value))]


@cache
def known_values(path: Path) -> list[float]:
    """Sorted absolute values of every number the notebook printed, set in code, reads from a stored result, or
    allows; what a prose figure must be a rounding of."""
    values = [abs(float(n)) for _, t in outputs(path) for n in NUMBER.findall(t)]
    values += [abs(float(n)) for c in cells(path) if c["cell_type"] == "code"
               for n in code_numbers(text(c["source"])) if not n.lower().endswith("j")]
    for f in read_files(path):
        raw = f.read_text()
        values += json_numbers(json.loads(raw)) if f.suffix == ".json" else json_numbers(raw)
    values += [abs(v) for v in ALLOWED[path.stem]]
    return sorted(values)


def traced(figure: str, values: list[float]) -> bool:
    """Whether ``figure`` (as typed in the prose) is some known value rounded to the prose's digits; a percentage
    p% also matches p/100 (27% matches 0.27x)."""
    number = figure.rstrip("% ").strip()
    mantissa = re.split(r"[eE]", number)[0]
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    x = float(number)
    half = 0.5 * 10.0 ** (-digits) * (10.0 ** int(re.split(r"[eE]", number)[1]) if "e" in number.lower() else 1)
    targets = [(x, half)] + ([(x / 100, half / 100)] if figure.endswith("%") else [])
    for centre, width in targets:
        lo = bisect.bisect_left(values, centre - width * (1 + 1e-9) - 1e-12)
        if lo < len(values) and values[lo] <= centre + width * (1 + 1e-9) + 1e-12:
            return True
    return False


def prose_figures(source: str) -> list[str]:
    for pattern in NOT_FIGURES:
        source = pattern.sub(" ", source)
    return FIGURE.findall(source)


# Each check returns its violations as "notebook cN: what", N the cell's index (0-based, as nbformat counts).
def long_markdown(path: Path) -> list[str]:
    return [f"{path.stem} c{i}: {len(s.split())} words" for i, s in markdown(path) if len(s.split()) > MAX_WORDS]


def noisy_outputs(path: Path) -> list[str]:
    bad = []
    for i, t in outputs(path):
        if len(t.splitlines()) > MAX_LINES:
            bad.append(f"{path.stem} c{i}: an output of {len(t.splitlines())} lines")
        if PROGRESS.search(t):
            bad.append(f"{path.stem} c{i}: a progress-bar chunk {t[:50]!r}")
    return bad


def project_history(path: Path) -> list[str]:
    commits = repository_commits()
    bad = []
    for i, s in markdown(path):
        bad += [f"{path.stem} c{i}: {m.group()!r}" for m in HISTORY.finditer(s)]
        bad += [f"{path.stem} c{i}: commit {m.group()!r}" for m in HEX.finditer(s)
                if any(c.startswith(m.group()) for c in commits)]
    return bad


def untraced_figures(path: Path) -> list[str]:
    values = known_values(path)
    return [f"{path.stem} c{i}: {f!r}" for i, s in markdown(path) for f in prose_figures(s) if not traced(f, values)]


ids = [p.stem for p in NOTEBOOKS]


def test_there_are_lessons():
    assert len(NOTEBOOKS) >= 8, NOTEBOOKS


def test_a_figure_is_traced_only_by_a_value_that_rounds_to_it():
    assert traced("0.36", [0.3581]) and traced("0.358", [0.3581])  # 0.3581 rounds to both
    assert not traced("0.359", [0.3581]) and not traced("0.35", [0.3581])
    assert traced("27%", [0.2731]) and traced("27%", [27.3]) and not traced("27%", [0.2751])  # 27.51% is 28%
    assert traced("1.5e-3", [0.00149]) and not traced("1.5e-3", [0.0016])
    assert prose_figures("torch 2.13.0 and Llama-3.1-8B, eps 0.2, 27% [link](https://x.org/1.5)") == ["0.2", "27%"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_markdown_cells_are_short(path):
    bad = long_markdown(path)
    assert not bad, f"{len(bad)} markdown cells over {MAX_WORDS} words:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_stored_outputs_are_short_and_free_of_progress_bars(path):
    bad = noisy_outputs(path)
    assert not bad, (f"{len(bad)} outputs over {MAX_LINES} lines or with progress bars (the settings cell turns "
                     "progress off; print less):\n" + "\n".join(bad))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_prose_names_no_commit_or_previous_execution(path):
    bad = project_history(path)
    assert not bad, (f"{len(bad)} mentions of project history (it belongs in notebooks/results/README.md):\n"
                     + "\n".join(bad))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_prose_figure_comes_from_an_output_or_a_stored_result(path):
    bad = untraced_figures(path)
    files = ", ".join(str(f.relative_to(RESULTS)) for f in read_files(path)) or "none"
    assert not bad, (f"{len(bad)} figures in the prose that are no rounding, to the prose's digits, of a number in a "
                     f"stored output, a code cell, a stored result the code names ({files}) or the notebook's "
                     "ALLOWED list in tests/test_lessons.py; print them from a code cell:\n" + "\n".join(bad))



# What a lesson imports must install with the package and its notebooks extra (issue 35, defect 7: notebook 11 stopped
# at "No module named 'trl'" after `pip install -e ".[notebooks]"`). Import name -> distribution, for every third-party
# module a lesson imports; a new one fails test_every_lesson_import_is_known until it is added here.
DISTRIBUTION = {"torch": "torch", "transformers": "transformers", "datasets": "datasets", "numpy": "numpy",
                "matplotlib": "matplotlib", "pandas": "pandas", "trl": "trl"}
# minirl functions that import an optional module inside their body: a lesson that calls one needs that module too
CALL_NEEDS = {"to_trl": "trl", "trl_kwargs": "trl"}
LOCAL = {"minirl"} | {p.stem for p in (ROOT / "notebooks").rglob("*.py")}  # the package; scripts beside the lessons


def code_source(cell: dict) -> str:
    """A code cell's Python: shell and magic lines blanked (kept as empty lines, so line numbers still match)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in text(cell["source"]).splitlines())


def lesson_imports(path: Path) -> set[str]:
    """Top-level modules a lesson's code cells import (import lines; shell and magic lines left out), plus the
    optional modules of the minirl functions it calls (CALL_NEEDS)."""
    found = set()
    for c in cells(path):
        if c["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse(code_source(c))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.Attribute) and node.attr in CALL_NEEDS:
                found.add(CALL_NEEDS[node.attr])
            elif isinstance(node, ast.Name) and node.id in CALL_NEEDS:
                found.add(CALL_NEEDS[node.id])
    return found


def pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def test_every_lesson_import_is_known():
    unknown = sorted({f"{p.stem}: {m}" for p in NOTEBOOKS for m in lesson_imports(p)
                      if m not in DISTRIBUTION and m not in LOCAL and m not in sys.stdlib_module_names})
    assert not unknown, f"third-party modules missing from DISTRIBUTION in tests/test_lessons.py: {unknown}"
    assert "trl" in lesson_imports(ROOT / "notebooks" / "11_sampler_mismatch.ipynb")  # through interop.to_trl


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_the_notebooks_extra_installs_what_the_lesson_imports(path):
    project = pyproject()
    installed = {requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["notebooks"]}
    missing = sorted(m for m in lesson_imports(path) if m in DISTRIBUTION and DISTRIBUTION[m] not in installed)
    assert not missing, (f"{path.stem} imports {missing}, which neither the dependencies nor the notebooks extra of "
                         "pyproject.toml install")


def test_each_requirement_has_one_bound_and_environment_yml_lists_it():
    # a distribution in two extras (trl in notebooks and trl) carries the same bound in both, and environment.yml,
    # which installs everything, lists that bound
    project = pyproject()
    bounds = {}
    for requirement in project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]:
        bounds.setdefault(requirement_name(requirement), set()).add(requirement.strip())
    assert all(len(b) == 1 for b in bounds.values()), {k: b for k, b in bounds.items() if len(b) > 1}
    environment = (ROOT / "environment.yml").read_text()
    missing = [b for (b,) in bounds.values() if f"- {b}\n" not in environment]
    assert not missing, f"environment.yml lacks {missing}"


# Issue 54, point 4: a lesson's checks are gathered in one code cell after every other code cell, and each check (a
# top-level statement of that cell that asserts: an `assert`, or a loop or branch holding asserts) has one comment
# line saying what it checks, at the end of its first line or on the line just above it.
def asserts_in(node) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def unexplained_checks(source: str) -> list[str]:
    lines = source.splitlines()
    comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source + "\n").readline)
                if tok.type == tokenize.COMMENT}
    bad = []
    for node in ast.parse(source).body:
        if asserts_in(node) and not {node.lineno, node.lineno - 1} & comments:
            bad.append(f"line {node.lineno}: {lines[node.lineno - 1].strip()[:90]}")
    return bad


def check_cells(path: Path) -> list[int]:
    return [i for i, c in enumerate(cells(path)) if c["cell_type"] == "code" and asserts_in(ast.parse(code_source(c)))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_checks_are_gathered_in_one_cell_at_the_end(path):
    found = check_cells(path)
    code = [i for i, c in enumerate(cells(path)) if c["cell_type"] == "code"]
    assert len(found) == 1, f"{path.name}: code cells {found} assert; gather the checks in one cell at the end"
    assert found[0] == code[-1], f"{path.name}: the check cell {found[0]} is not the last code cell ({code[-1]})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_each_check_says_what_it_checks(path):
    bad = [f"cell {i}, {line}" for i in check_cells(path) for line in unexplained_checks(code_source(cells(path)[i]))]
    assert not bad, f"{path.name}: checks without a comment line on or above them:\n" + "\n".join(bad)


def test_a_check_without_its_comment_is_found():
    assert unexplained_checks("x = 1\nassert x == 1\n") == ["line 2: assert x == 1"]
    assert unexplained_checks("# x is one\nassert x == 1\nfor s in S:  # every seed positive\n    assert s > 0\n") == []
    assert unexplained_checks("# one\nassert x\nassert y\n") == ["line 3: assert y"]
