"""The shape of the package and of the README that maps it (issue 11), checked across modules: the math modules stay
copyable (torch, the standard library and checks.py only), no module outgrows the size cap and the loop fits two
screens; the README's own-task example runs as written, its paper index is current and its glossary explains every
logged metric."""

from __future__ import annotations

import ast
import math
import re
import sys
from pathlib import Path

import datasets
import pytest

from minirl import config, models, rl, tasks
from minirl.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parent.parent
MATH_MODULES = ("advantages", "aggregation", "losses", "clip_alternatives", "kl", "rewards", "group_filter",
                "preference", "importance", "entropy", "distill", "truncation", "stale_corrections", "trust_region",
                "reward_models")
#: The math modules build on checks.py alone, except the policy losses, which share the aggregation (and losses.py
#: dispatches to the clip alternatives and DPPO's trust region): copy those together.
MATH_IMPORTS = {"losses": {".aggregation", ".clip_alternatives", ".trust_region"},
                "clip_alternatives": {".aggregation"}, "trust_region": {".aggregation"}}


# --- copyable math modules ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", MATH_MODULES)
def test_math_modules_import_only_torch_the_standard_library_and_checks(module):
    tree = ast.parse((ROOT / "minirl" / f"{module}.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." + (node.module or "") if node.level else node.module.split(".")[0])
    allowed = {"torch", ".checks", "__future__"} | MATH_IMPORTS.get(module, set()) | set(sys.stdlib_module_names)
    assert imported <= allowed, f"minirl/{module}.py imports {sorted(imported - allowed)}"


def test_every_module_is_shorter_than_600_lines_and_the_loop_fits_two_screens():
    # one cap for every module of the package, subpackages included, with no per-file exception: a file that
    # outgrows it splits by idea, as the engine bridge did (minirl/interop/: one module per engine)
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "minirl").rglob("*.py")}
    assert max(lengths.values()) < 600, {p: n for p, n in lengths.items() if n >= 600}
    src = (ROOT / "minirl" / "rl.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "train_rl")
    assert fn.end_lineno - fn.lineno + 1 <= 120


# --- README ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_readme_custom_task_example_runs_as_written():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- example: your-own-task -->\s*```python\n(.*?)```", text, re.S)
    assert block, "README.md lost its 'your own task' example"
    namespace: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    history = namespace["history"]
    assert [r["step"] for r in history.rows] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["loss"]) for r in history.rows)


def test_the_paper_index_is_up_to_date():
    import paper_index

    text = paper_index.INDEX.read_text()
    assert paper_index.stored_section(text) == paper_index.stored_text(), (
        "notebooks/paper_index.md is stale: run `python tests/paper_index.py`")
    assert "](notebooks/paper_index.md)" in (ROOT / "README.md").read_text()  # the README links to it


def test_the_readme_is_what_a_newcomer_reads_first_and_links_the_reference():
    """Issue 54, point 8: the README holds the two commands, the lessons, the one-file algorithms, your own task
    and model and the book, within 16 KB; the name table, the glossary and the package map are one link away."""
    readme = (ROOT / "README.md").read_text()
    reference = (ROOT / "notebooks" / "reference.md").read_text()
    assert len(readme.encode()) <= 16 * 1024, f"README.md is {len(readme.encode())} bytes"
    for heading in ("## The two commands", "## The notebooks, in order", "## One algorithm, one file",
                    "## Your own task", "## Your own model", "## The book"):
        assert heading in readme, heading
    for heading in ("## Names in minirl, TRL and verl", "## Glossary of logged metrics", "## The package"):
        assert heading in reference and heading not in readme, heading
    assert "](notebooks/reference.md)" in readme


def test_every_indexed_function_has_a_marked_test_that_calls_it():
    """The index links each function to its test by a ``# paper-index:`` marker, not by whichever test happens to
    call it first; a marker must name a real function, and the test it sits on must mention that function."""
    import ast
    import re

    import paper_index

    indexed = {f"{m}.{n}" for m, n, _ in paper_index.sources()}
    marked = paper_index.marked_tests()
    assert indexed - set(marked) == set(), "functions of the paper index without a marked test"
    assert set(marked) - indexed == set(), "markers naming a function that is not in the index"
    bodies = {}
    for path in (ROOT / "tests").glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                bodies[f"{path.name}::{node.name}"] = ast.unparse(node)
    for name, tests in marked.items():
        short = name.split(".")[1]
        for test in tests:
            assert re.search(rf"\b{short}\b", bodies[test]), f"{test} is marked for {name} but never mentions it"


def test_the_paper_index_splits_every_cited_equation():
    """A docstring citing four papers gives four rows; an entry's equations are all kept (no first-entry-only)."""
    import paper_index

    assert paper_index.entries("PPO, Schulman et al. 2017, eq. 7; GRPO, Shao et al. 2024, eq. 3; DAPO, Yu et al. "
                               "2025, eq. 8; GSPO, Zheng et al. 2025, eq. 5-7 and 13-14.") == [
        ("Schulman et al. 2017 (PPO)", "eq. 7"), ("Shao et al. 2024 (DeepSeekMath, GRPO)", "eq. 3"),
        ("Yu et al. 2025 (DAPO)", "eq. 8"), ("Zheng et al. 2025 (GSPO)", "eq. 5-7 and 13-14")]
    rows = paper_index.rows()
    aggregate = sorted((paper, eq) for paper, eq, fn, _, _ in rows if fn == "`aggregation.aggregate`")
    assert aggregate == [("Liu et al. 2025 (Dr. GRPO)", "eq. 2"), ("Shao et al. 2024 (DeepSeekMath, GRPO)", "eq. 3"),
                         ("Yu et al. 2025 (DAPO)", "eq. 12")]
    papers = [r[0].lower() for r in rows]
    assert papers == sorted(papers), "rows are sorted by paper"


@pytest.mark.slow
def test_every_logged_metric_is_in_the_reference_glossary():
    """Short real runs that together log every key minirl writes into a History (PPO with its critic; SAPO on a MoE
    with the load-balancing loss, a mismatched sampler with TIS and both sweep probes; DPO, IPO and KTO), each key
    looked up in notebooks/reference.md's "Glossary of logged metrics" (a per-layer key ``x_l3`` is documented as
    ``x_l{i}``)."""
    from minirl import preference_data, sweep
    from minirl import preference_loop as loop

    tok, train, test = build_tokenizer(), tasks.load_split("train"), tasks.load_split("test").select(range(4))
    logged = set()
    mismatched_moe = dict(router_aux_loss_coef=0.01, sampler_router_noise=0.3, is_correction="token_tis")
    for algo, moe, extra in [("ppo", False, {}), ("sapo", True, mismatched_moe)]:
        model = (models.tiny_moe(tok, hidden_size=32, num_layers=1, num_heads=2, num_experts=4) if moe else
                 models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64))
        cfg = config.make_config(algo, steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8, eval_every=1,
                                 progress=False, **extra)
        probes, hooks = [], []
        if moe:
            probes.append(sweep._kl_probe({"prompts": 2, "samples": 1, "every": 1}, model, tok, test, cfg))
            callback, hook = sweep._update_probe({"prompts": 2, "samples": 1}, model, tok, test, cfg)
            probes, hooks = [*probes, callback], [hook]
        try:
            history = rl.train_rl(model, tok, cfg, train, test,
                                  callback=lambda s, r, probes=probes: [p(s, r) for p in probes])
        finally:
            for hook in hooks:
                hook.remove()
        logged |= {k for row in history.rows for k in row}
    pairs = datasets.Dataset.from_dict({"prompt": ["3+4=", "8+1="], "chosen": ["3+4=7#7", "8+1=9#9"],
                                        "rejected": ["3+4=8#8", "8+1=9#"]})
    for method in ("dpo", "ipo", "kto"):
        data = preference_data.pairs_to_examples(pairs) if method == "kto" else pairs
        model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
        cfg = loop.PrefConfig(method=method, steps=1, batch_size=2, max_new_tokens=8, progress=False)
        logged |= {k for row in loop.train_preference(model, tok, data, cfg, eval_data=test).rows for k in row}
    text = (ROOT / "notebooks" / "reference.md").read_text()
    glossary = text[text.index("## Glossary of logged metrics"):]
    glossary = glossary[:glossary.index("\n## ", 1)]
    documented = set(re.findall(r"`([a-z_0-9{}<>/]+)`", glossary))
    # a per-layer key x_l3 is documented as x_l{i}, a per-reward key rewards/answer_reward/mean as rewards/<name>/mean
    missing = {k for k in logged if re.sub(r"^rewards/.+/", "rewards/<name>/", re.sub(r"_l\d+$", "_l{i}", k))
               not in documented}
    assert len(logged) > 80 and not missing, f"logged keys the reference's glossary does not explain: {sorted(missing)}"
