"""The paper index (notebooks/paper_index.md, and a page of the book), generated from the ``Source:`` lines of
minirl's docstrings.

One row per (paper, equation, function): every entry of a ``Source:`` line (entries are separated by ";" or by a
sentence) is split into the paper it names and the equations or sections it cites, so a function that implements
three papers' equations has three rows. Entries that cite engine source (TRL, verl) first are left out: engines
are not papers, and notebooks/reference.md's name table (minirl | TRL | verl) holds them. Rows are sorted by
paper, then by equation (numerically). Each function is linked to the test that checks it by a marker comment directly above that test:

    # paper-index: aggregation.aggregate
    def test_aggregate_docstring_example():

(several functions may share one marker line, separated by spaces), and to the first notebook code cell that uses
it. ``python tests/paper_index.py`` rewrites the section between the markers in notebooks/paper_index.md (README.md
links to it); ``tests/test_package.py::test_the_paper_index_is_up_to_date`` fails when that section is stale, and
``test_every_indexed_function_has_a_marked_test_that_calls_it`` when a function has no marked test or a marker names a
test that never mentions its function.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- paper-index:begin -->", "<!-- paper-index:end -->"
MARKER = re.compile(r"^\s*#\s*paper-index:\s*(.+?)\s*$")

#: The papers the docstrings cite, each as (how the index names it, a pattern that recognises a citation of it).
#: The first pattern that matches an entry names its paper; an entry that none matches keeps its own text.
PAPERS = [
    ("Agarwal et al. 2024 (GKD, on-policy distillation)", r"Agarwal"),
    ("Ahmadian et al. 2024 (RLOO)", r"Ahmadian"),
    ("Azar et al. 2023 (IPO)", r"Azar"),
    ("Chen et al. 2021 (Codex, unbiased pass@k)", r"Chen et al\. 2021|Codex"),
    ("Cover & Thomas, Elements of Information Theory", r"Cover & Thomas"),
    ("Cui et al. 2025 (The Entropy Mechanism of RL for Reasoning LMs, Clip-Cov, KL-Cov)", r"Cui et al|2505\.22617"),
    ("Ethayarajh et al. 2024 (KTO)", r"Ethayarajh"),
    ("Fedus et al. 2022 (Switch Transformer)", r"Fedus|Switch Transformer"),
    ("He et al. 2025 (Skywork-OR1, adaptive entropy control)", r"Skywork|2505\.22312"),
    ("Hu et al. 2021 (LoRA)", r"Hu et al\. 2021|\bLoRA\b"),
    ("Hu et al. 2025 (REINFORCE++)", r"\bHu et al|REINFORCE\+\+"),
    ("Huang et al. 2022 (37 implementation details of PPO)", r"Huang et al"),
    ("Kim & Rush 2016 (sequence-level knowledge distillation)", r"Kim & Rush"),
    ("Kool et al. 2019 (leave-one-out baseline)", r"Kool"),
    ("Kullback & Leibler 1951", r"Kullback"),
    ("Liu et al. 2026 (GDPO, group reward-decoupled normalisation)", r"GDPO|2601\.05242"),
    ("Liu et al. 2025 (Dr. GRPO)", r"Liu et al|Dr\. GRPO"),
    ("Liu & Li et al. 2025 (masked importance sampling, When Speed Kills Stability)", r"Liu & Li|Speed Kills"),
    ("Ma et al. 2025 (rollout routing replay, R3)", r"\bMa et al|2510\.11370"),
    ("Meng, Xia & Chen 2024 (SimPO)", r"Meng"),
    ("MiniMax 2025 (MiniMax-M1, CISPO)", r"MiniMax|CISPO|2506\.13585"),
    ("Mitchell 2023 (cDPO)", r"Mitchell"),
    ("Ouyang et al. 2022 (InstructGPT)", r"Ouyang|InstructGPT"),
    ("Rafailov et al. 2023 (DPO)", r"Rafailov"),
    ("SAPO 2025 (soft adaptive policy optimisation)", r"SAPO|2511\.20347"),
    ("GMPO 2025 (geometric-mean policy optimisation)", r"GMPO|2507\.20673"),
    ("Schulman 2020 (Approximating KL Divergence)", r"Approximating KL|Schulman \(?2020"),
    ("Schulman et al. 2016 (GAE)", r"Schulman et al\. 2016|\bGAE\b"),
    ("Schulman et al. 2017 (PPO)", r"Schulman et al\. 2017|\bPPO\b.*2017"),
    ("Shao et al. 2024 (DeepSeekMath, GRPO)", r"Shao et al"),
    ("Sutton et al. 2000 (policy gradient theorem)", r"Sutton"),
    ("Tang & Munos 2025 (KL gradient estimation)", r"Tang & Munos"),
    ("Thinking Machines 2025 (On-Policy Distillation, Tinker)", r"Thinking Machines"),
    ("Wang et al. 2025 (Beyond the 80/20 Rule, high-entropy forking tokens)", r"Wang et al|2506\.01939"),
    ("Williams 1992 (REINFORCE)", r"Williams"),
    ("Yao et al. 2025 (truncated importance sampling, TIS)", r"\bYao et al"),
    ("Ye et al. 2020 (dual-clip PPO)", r"\bYe et al"),
    ("Yu et al. 2025 (DAPO)", r"Yu et al|\bDAPO\b"),
    ("Zheng et al. 2025 (GSPO)", r"Zheng et al|\bGSPO\b"),
    ("Ziegler et al. 2019", r"Ziegler"),
    ("DeepSeek-R1 (Guo et al. 2025)", r"DeepSeek-R1"),
    ("DeepSeek-AI 2025 (DeepSeek-V3.2: keep sampling mask, off-policy sequence masking, unbiased KL)",
     r"DeepSeek-V3\.2|2512\.02556"),
    ("Fu et al. 2025 (AReaL, decoupled PPO)", r"\bFu et al|2505\.24298"),
    ("Qi et al. 2025 (Defeating the training-inference mismatch via FP16)", r"\bQi et al|2510\.26788"),
    ("Holtzman et al. 2020 (nucleus sampling, top-p)", r"Holtzman"),
]
#: Engine source a docstring cites beside its papers (an entry like "TRL 1.16 ``GRPOTrainer._compute_loss``"): not a
#: paper, so not a row; notebooks/reference.md's name table maps minirl's names to the engines'.
ENGINES = re.compile(r"\bTRL\b|\bverl\b")

EQUATION = re.compile(r"\b(?:eqs?\.|equations?|section|algorithm|thm\.|detail|lines?)\s*\d[\d.]*"
                      r"(?:\s*(?:-|and|,)\s*\d[\d.]*)*", re.I)
# an entry ends at ";" or at a sentence end: a full stop after a word or number, then a capital (not the initial of
# "J. Schulman", nor the abbreviations "Dr.", "cf.", "al.", "eq.")
ENTRY_SPLIT = re.compile(r";\s*|(?<=[a-z0-9)])(?<!\bDr)(?<!\bcf)(?<!\bal)(?<!\beq)\.\s+(?=[A-Z])")
YEAR = re.compile(r"\b(19|20)\d\d\b")


def sources() -> list[tuple[str, str, str]]:
    """(module, function, source text) for each public top-level function or class with a ``Source:`` line."""
    out = []
    # the engine bridge is a subpackage whose functions a reader calls as interop.NAME (its __init__ re-exports them)
    paths = sorted((ROOT / "minirl").glob("*.py")) + sorted((ROOT / "minirl" / "interop").glob("*.py"))
    for path in paths:
        module = "interop" if path.parent.name == "interop" else path.stem
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node) or ""
            m = re.search(r"^Source:\s*(.+?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
            if m:
                out.append((module, node.name, " ".join(m.group(1).split())))
    return out


def entries(text: str) -> list[tuple[str, str]]:
    """Split one ``Source:`` text into (paper, equations) pairs, one per cited entry.

    The paper is the one of ``PAPERS`` cited first in the entry. An entry that names an engine (``ENGINES``) before
    any paper is left out, and so is one that names no known paper and cites no year: such entries are engine
    source or notes ("derived again here by enumeration", "see ``expected_gradient``"), not papers. An entry with a
    year but no known paper keeps its own text (a source the table does not know yet).

    Example: "PPO, Schulman et al. 2017, eq. 7; GSPO, Zheng et al. 2025, eq. 5-7 and 13-14." ->
    [("Schulman et al. 2017 (PPO)", "eq. 7"), ("Zheng et al. 2025 (GSPO)", "eq. 5-7 and 13-14")].
    """
    out = []
    for part in ENTRY_SPLIT.split(text.strip().rstrip(".")):
        part = part.strip()
        hits = [(m.start(), name) for name, pattern in PAPERS if (m := re.search(pattern, part))]
        engine = ENGINES.search(part)
        if engine and (not hits or engine.start() < min(hits)[0]):
            continue
        if hits:
            paper = min(hits)[1]
        elif YEAR.search(part):
            paper = part
        else:
            continue
        equations = ", ".join(m.group(0).rstrip(".,") for m in EQUATION.finditer(part)) or "-"
        out.append((paper, equations))
    return out


def marked_tests() -> dict[str, list[str]]:
    """``module.function`` -> the tests (file::name) whose marker comment names it, in file order."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        lines = path.read_text().splitlines()
        for node in ast.parse("\n".join(lines)).body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])  # 1-based
            m = MARKER.match(lines[first - 2]) if first >= 2 else None
            for name in (m.group(1).split() if m else []):
                out.setdefault(name, []).append(f"{path.name}::{node.name}")
    return out


def first_cell(name: str) -> str:
    """The first notebook code cell (notebook, cell index) that mentions ``name``, or '-'."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code" and word.search("".join(cell["source"])):
                return f"[{path.stem} cell {i}](notebooks/{path.name})"
    return "-"


def _equation_key(equations: str) -> tuple:
    """Sort key: equations before sections and algorithms, then numerically ("eq. 3" before "eq. 12")."""
    kind = 0 if equations.lower().startswith("eq") else 1 if equations != "-" else 2
    return (kind, [int(n) for n in re.findall(r"\d+", equations)], equations)


def rows() -> list[tuple[str, str, str, str, str]]:
    """(paper, equations, minirl function, test, notebook cell), sorted by paper, then equation, then function."""
    tests = marked_tests()
    out = []
    for module, name, text in sources():
        test = tests.get(f"{module}.{name}", ["-"])[0]
        cell = first_cell(name)
        for paper, equations in entries(text):
            out.append((paper, equations, f"`{module}.{name}`", f"`{test}`" if test != "-" else "-", cell))
    unique = sorted(set(out), key=lambda r: (r[0].lower(), _equation_key(r[1]), r[2]))
    return unique


def table() -> str:
    lines = ["| paper | equation | minirl | test | notebook |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows()]
    return "\n".join(lines)


def section() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def stored_section(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


#: Where the index is stored: beside the lessons, so its notebook links are relative to notebooks/.
INDEX = ROOT / "notebooks" / "paper_index.md"


def stored_text() -> str:
    """The section as notebooks/paper_index.md holds it: the table, its notebook links relative to that folder."""
    return section().replace("](notebooks/", "](")


if __name__ == "__main__":
    text = INDEX.read_text()
    INDEX.write_text(text.replace(stored_section(text), stored_text()))
    print(f"wrote {len(rows())} rows ({len(sources())} functions) into {INDEX.relative_to(ROOT)}", file=sys.stderr)
