"""Build the book: ``python notebooks/book/build.py [OUT]`` (default notebooks/book/_build/html), then open
OUT/index.html. Offline: the notebooks are read as stored (never executed) and MathJax comes from an installed
package. Needs the ``book`` extra: ``pip install -e ".[book]"``."""

import sys
from pathlib import Path

from sphinx.cmd.build import build_main

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent.parent


def build(out: Path | str = BOOK / "_build" / "html", *extra: str) -> int:
    """Sphinx's html build of the book into ``out``; returns its exit status (warnings are printed, not fatal)."""
    return build_main(["-b", "html", "-q", "-c", str(BOOK), str(ROOT), str(out), *extra])


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)  # Sphinx would take "--help" for the output folder
        sys.exit(0)
    status = build(*sys.argv[1:])
    if status == 0:
        print("Expected warnings, 4: 'Unknown source document' for notebooks/exercises/README (the teacher's page "
              "is not in the book; linked from README.md and lesson 13) and notebooks/paper_index (the book has the "
              "generated paper index; linked from README.md and notebooks/reference.md); those links show as plain "
              "text.", file=sys.stderr)
    sys.exit(status)
