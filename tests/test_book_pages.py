"""The book's algorithm pages, as markdown (``notebooks/book/pages.py``), without building the site (issue 54,
point 5): each preset's page gives a paragraph of why, one step in pseudocode read off its switches and within 100
columns, the equations, the papers with links, the code of every function it runs in full with what that code needs
beside it, the switches, the engines' names, the tests and the lessons. About 2 s; needs the book extra (its pages
import myst_parser's slug function)."""

import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("myst_parser", reason="the book extra is not installed: pip install -e '.[book]'")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "notebooks" / "book"))
pages = importlib.import_module("pages")

from minirl import config  # noqa: E402

SECTIONS = ["## Why", "## One step, in pseudocode", "## The equations", "## The papers", "## The code",
            "## The switches", "## In TRL and verl", "## In the lessons", "## The functions"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("generated")
    pages.write_all(out)
    return out


@pytest.mark.parametrize("name", list(config.ALGORITHMS))
def test_an_algorithm_page_has_every_part_in_order(written, name):
    text = (written / f"algo_{name}.md").read_text()
    at = [text.index(s) for s in SECTIONS]
    assert at == sorted(at), name
    assert pages.WHY[name] in text
    papers = text[text.index("## The papers"):text.index("## The code")]
    assert re.search(r"^- \[.+\]\(https?://", papers, re.M), f"{name}: no paper with a link"
    for qualname in pages.preset_functions(name):
        assert inspect.getsource(pages.resolve(qualname)).rstrip() in text, f"{name}: {qualname} not in full"
    pseudocode = text[text.index("```text", text.index("## One step")):text.index("## The equations")]
    assert max(len(line) for line in pseudocode.splitlines()) <= 100
    assert repr(config.make_config(name).agg) in pseudocode  # the aggregation the preset sets


def test_a_page_cites_the_paper_of_a_function_defined_in_another_module(written):
    # losses.cispo_loss is clip_alternatives.cispo_loss: its Source line (MiniMax-M1) and its tests are found
    text = (written / "algo_cispo.md").read_text()
    papers = text[text.index("## The papers"):text.index("## The code")]
    assert papers.splitlines()[2].startswith("- [MiniMax 2025") and "2506.13585" in papers  # the preset's own first
    assert "test_each_function_directly_equals_policy_loss" in text


def test_a_function_is_shown_with_what_its_copy_with_line_names(written):
    text = (written / "algo_cispo.md").read_text()
    for needed in ("def ratio_stats(", "def own_clip_stats(", "PPO_BAND = 0.2", "CISPO_FORMS = ("):
        assert needed in text, needed


def test_the_pseudocode_follows_the_switches():
    ppo, grpo, dapo = (pages.pseudocode(n) for n in ("ppo", "grpo", "dapo"))
    assert "r_t = r_t - beta * k1_t" in ppo and "GAE(r, V)" in ppo and "sqrt(var A + 1e-8)" in ppo
    assert "value_loss" in ppo and "beta * aggregate" not in ppo  # PPO's KL is in the reward
    assert "L = L + beta * aggregate(k3_t)" in grpo and "GAE" not in grpo
    assert dapo.index("has_signal") < dapo.index("overlong_penalty")  # the filter reads the task's reward
    assert "eps_high 0.28" in dapo and "k3" not in dapo
    with pytest.raises(ValueError, match="100 columns"):
        original = pages.ADVANTAGE_STEPS[("group", "group")]
        pages.ADVANTAGE_STEPS[("group", "group")] = [("A = " + "x" * 120, "too wide")]
        try:
            pages.pseudocode("grpo")
        finally:
            pages.ADVANTAGE_STEPS[("group", "group")] = original
