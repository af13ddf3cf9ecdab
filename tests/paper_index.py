"""The paper index of README.md, generated from the ``Source:`` lines of minirl's docstrings.

For every public function (or class) whose docstring names its source, one row: the paper and the equation or
section it cites, the minirl function, the first test that calls it, and the first notebook cell that uses it.
``python tests/paper_index.py`` rewrites the section between the markers in README.md;
tests/test_paper_index.py fails when the README's section is stale.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- paper-index:begin -->", "<!-- paper-index:end -->"


def sources() -> list[tuple[str, str, str]]:
    """(module, function, source text) for each public top-level function or class with a ``Source:`` line."""
    out = []
    for path in sorted((ROOT / "minirl").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node) or ""
            m = re.search(r"^Source:\s*(.+?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
            if m:
                out.append((path.stem, node.name, " ".join(m.group(1).split())))
    return out


def first_test(name: str) -> str:
    """The first test function (file::name) whose body calls ``name(``, or '-'."""
    call = re.compile(rf"\b{re.escape(name)}\(")
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and call.search(ast.unparse(node)):
                return f"{path.name}::{node.name}"
    return "-"


def first_cell(name: str) -> str:
    """The first notebook code cell (notebook, cell index) that mentions ``name``, or '-'."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code" and word.search("".join(cell["source"])):
                return f"[{path.stem} cell {i}](notebooks/{path.name})"
    return "-"


EQUATION = re.compile(r"\b(?:eqs?\.|equations?|section|algorithm|thm\.|detail)\s*[\d.\-]*\d(?:\s*(?:and|-)\s*[\d.]+)?",
                      re.I)


def table() -> str:
    """The markdown table, sorted by source then function: the first source a docstring names (the others, if
    any, stay in the docstring), the equations or sections it cites, where it is tested and where it is shown."""
    rows = []
    for module, name, text in sources():
        first = text.rstrip(".").split(";")[0].strip()
        equations = ", ".join(m.group(0) for m in EQUATION.finditer(first)) or "-"
        rows.append((first, equations, f"`{module}.{name}`", first_test(name), first_cell(name)))
    rows.sort(key=lambda r: (r[0].lower(), r[2]))
    lines = ["| source (as the docstring cites it) | equation | minirl | test | notebook |", "|---|---|---|---|---|"]
    lines += [f"| {p} | {e} | {f} | `{t}` | {c} |" for p, e, f, t, c in rows]
    return "\n".join(lines)


def section() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def readme_section(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


if __name__ == "__main__":
    readme = ROOT / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace(readme_section(text), section()))
    print(f"wrote {len(sources())} rows into README.md", file=sys.stderr)
