"""Docstrings that must not lag the code (issue 35): the presets rl.py and config.py name are ``ALGORITHMS``, the
package docstring names every module, the command line's docstring every command; as
``test_every_logged_metric_is_in_the_reference_glossary`` does for the glossary of notebooks/reference.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from minirl import __main__ as cli
from minirl.config import ALGORITHMS

ROOT = Path(__file__).resolve().parent.parent


def _module_docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


@pytest.mark.parametrize("module", ["rl", "config"])
def test_module_docstrings_name_every_preset_of_algorithms(module):
    """From "The presets:" to the end of its paragraph, the docstring names each preset once as ``name``; a preset
    added to ``ALGORITHMS`` (or removed) without the docstring fails here."""
    doc = _module_docstring(ROOT / "minirl" / f"{module}.py")
    assert "The presets:" in doc, f"minirl/{module}.py's docstring lost its list of presets ('The presets: ...')"
    listed = doc[doc.index("The presets:"):]
    listed = listed.split("\n\n")[0]  # the paragraph, not the sentence: "Dr. GRPO" has a full stop
    named = re.findall(r"``([a-z_0-9]+)``", listed)
    assert len(named) == len(set(named)), f"minirl/{module}.py names a preset twice: {named}"
    assert set(named) == set(ALGORITHMS), (
        f"minirl/{module}.py's docstring names presets {sorted(set(named) - set(ALGORITHMS))} that ALGORITHMS lacks "
        f"and lacks {sorted(set(ALGORITHMS) - set(named))}")


def test_package_docstring_names_every_module():
    """Each module of minirl/ (a file, or a subpackage such as exercises/) appears as a word in __init__'s
    docstring."""
    doc = _module_docstring(ROOT / "minirl" / "__init__.py")
    package = ROOT / "minirl"
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in package.glob("*/__init__.py")}
    missing = {m for m in modules if not re.search(rf"\b{re.escape(m)}\b", doc)}
    assert len(modules) > 25 and not missing, f"modules minirl/__init__.py's docstring does not name: {sorted(missing)}"


def test_command_line_docstring_names_every_command(capsys):
    """``python -m minirl --help`` lists its commands as {train,bench,...}; each is in __main__'s docstring as
    ``python -m minirl COMMAND``."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    commands = re.search(r"\{([a-z0-9_,-]+)\}", capsys.readouterr().out).group(1).split(",")
    missing = [c for c in commands if f"python -m minirl {c}" not in cli.__doc__]
    assert len(commands) >= 3 and not missing, f"commands minirl/__main__.py's docstring does not name: {missing}"


def test_the_paper_index_holds_papers_not_engine_source():
    """An entry that cites TRL or verl source first is no paper: left out of the index (notebooks/reference.md's name
    table holds the engines), while the papers of the same ``Source:`` line keep their rows."""
    import paper_index

    source = "Yao et al. 2025 (TIS); TRL 1.16 ``GRPOTrainer._compute_loss``; verl 0.9.1 ``rollout_is=token``"
    assert paper_index.entries(source) == [("Yao et al. 2025 (truncated importance sampling, TIS)", "-")]
    engine_rows = [r for r in paper_index.rows() if paper_index.ENGINES.search(r[0])]
    assert not engine_rows, f"paper-index rows that name an engine as their paper: {engine_rows}"
