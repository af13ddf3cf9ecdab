"""Sphinx configuration of the book: the stored notebooks (never executed here), README.md and the pages that
``pages.py`` generates from the code at every build (algorithms, estimator families, the paper index).

The source directory is the repository root, so the notebooks' and README's relative links resolve as they do on
the code host; ``include_patterns`` keeps everything else out. Build: ``python notebooks/book/build.py``.
"""

import importlib.util
import re
import sys
from pathlib import Path

from sphinx.util.fileutil import copy_asset

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent.parent
sys.path[:0] = [str(ROOT), str(BOOK)]

import pages  # noqa: E402  (after the path: the generator lives beside this file)

project = "minirl"
author = "minirl contributors"
root_doc = "notebooks/book/index"
include_patterns = ["README.md", "notebooks/[0-9][0-9]_*.ipynb", "notebooks/results/README.md",
                    "notebooks/real_model.md", "notebooks/notation.md", "notebooks/reference.md", "notebooks/book/*.md",
                    "notebooks/book/generated/*.md", "notebooks/exercises/[0-9][0-9]_*.ipynb"]
exclude_patterns = ["notebooks/book/_build/**"]

extensions = ["myst_nb"]
# MathJax 3 is served from the site itself, copied out of the sphinx-mathjax-offline package (no CDN: CI and the
# readers of a local build may have no network); only the TeX -> HTML bundle and what it loads on demand
mathjax_path = "mathjax/tex-chtml.js"
MATHJAX_PARTS = ["tex-chtml.js", "output/chtml", "input/tex/extensions", "ui", "a11y"]
nb_execution_mode = "off"  # the stored outputs are the results
nb_ipywidgets_js = {}  # no widgets in the lessons; the default would load require.js from a CDN
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3  # "03_grpo.ipynb#3-one-grpo-step-written-out" links to the section
suppress_warnings = ["myst.header"]  # a notebook may start at "##" after its title cell

smartquotes = False  # docstrings quote switch values ("group"): keep them straight
html_theme = "sphinx_book_theme"
html_title = "minirl"
html_theme_options = {"show_toc_level": 2, "home_page_in_toc": True, "use_download_button": False,
                      "navigation_with_keys": False}
html_extra_path = [str(BOOK / "root")]  # index.html at the site's root: a redirect to the book's first page
html_static_path = [str(BOOK / "static")]
html_js_files = ["search_snippets.js"]  # search snippets from the article, not the theme's header buttons
html_css_files = ["code_width.css"]  # code within 100 columns fits without sideways scrolling
html_copy_source = False  # the notebooks are in the repository; no second copy in the site
html_show_sourcelink = False


def _generate(app):
    pages.write_all(BOOK / "generated")


def _copy_mathjax(app, exc):
    if exc is not None or app.builder.format != "html":
        return
    source = Path(importlib.util.find_spec("sphinx-mathjax-offline").origin).parent / "static" / "mathjax"
    target = Path(app.outdir) / "_static" / "mathjax"
    for part in MATHJAX_PARTS:  # a file goes into its folder, a folder's contents into the same folder
        copy_asset(source / part, target / (part if (source / part).is_dir() else Path(part).parent))


def _exercise_as_released(app, docname, source):
    """An exercise page shows what students get: the stored release (stubs, no hidden tests, no outputs), never the
    teacher's source notebook with its solutions, whose path the lessons link to."""
    if not docname.startswith("notebooks/exercises/"):
        return
    release = ROOT / "notebooks" / "exercises" / "release" / (Path(docname).name + ".ipynb")
    if release.exists():
        source[0] = release.read_text()
    elif re.search(r"BEGIN\s+SOLUTION", source[0]):  # the student package has no release folder: its notebooks
        # are the stubs (the pattern is spelled so that the package's own check for solution markers passes)
        raise RuntimeError(f"{docname} holds solutions and there is no {release} to show instead")


def setup(app):
    app.connect("source-read", _exercise_as_released)
    app.connect("builder-inited", _generate)
    app.connect("build-finished", _copy_mathjax)
