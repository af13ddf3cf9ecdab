"""notebooks/real_model.md, "from the toy to a real model" (issue 36, item 6; it links lesson 13): its tables
are the output of the command it names, every number of its prose comes from those commands, the README links it,
the book includes it."""

import contextlib
import io
import re
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "notebooks" / "real_model.md"


def command(*args: str) -> str:
    """What ``python -m ARGS`` prints, run in this process (``runpy``, as ``-m`` runs it)."""
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [args[0], *args[1:]]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_module(args[0], run_name="__main__", alter_sys=False)
    except SystemExit:  # argparse's --help
        pass
    finally:
        sys.argv = argv
    return out.getvalue()


def test_the_tables_are_the_commands_output_and_the_prose_quotes_only_them():
    text = PAGE.read_text()
    memory_out, help_out = command("minirl.memory"), command("minirl", "train", "--help")
    assert "`python -m minirl.memory`" in text and "python -m minirl train --help" in text
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table and "\n".join(table) in memory_out  # the fit table, verbatim
    for block in re.findall(r"```\n(.*?)\n```", text, re.S):
        assert block in memory_out, block[:80]  # each per-term table, verbatim
    prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"```.*?```", "", text, flags=re.S))  # link targets are no figures
    prose = "\n".join(re.sub(r"^\d+\. ", "", ln) for ln in prose.splitlines() if not ln.startswith("|"))
    numbers = set(re.findall(r"(?<![\w.])\d[\d,.]*(?:e-?\d+)?", prose))
    sources = memory_out + help_out
    missing = sorted(n.rstrip(".,") for n in numbers if n.rstrip(".,") not in sources)
    assert not missing, f"numbers in notebooks/real_model.md that its commands do not print: {missing}"
    # a real model's measured figures live in lesson 13, which the page links; the page's own are predictions
    assert "](13_real_model.ipynb)" in text and "every number below is a prediction" in text


def test_the_readme_links_it_and_the_book_includes_it():
    assert "](notebooks/real_model.md)" in (ROOT / "README.md").read_text()
    book = ROOT / "notebooks" / "book"
    assert "notebooks/real_model.md" in (book / "conf.py").read_text()
    assert "/notebooks/real_model" in (book / "index.md").read_text()
