"""The shape of the package a reader relies on (issue 11): copyable math modules, the reward as an argument in
TRL's form, the three policy-loss functions behind the dispatcher, the README's example, paper index and glossary."""

from __future__ import annotations

import ast
import math
import re
import sys
from pathlib import Path

import datasets
import pytest
import torch

from minirl import config, losses, models, rewards, rl, tasks
from minirl.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parent.parent
MATH_MODULES = ("advantages", "losses", "kl", "rewards", "sampling", "preference", "importance")


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
    allowed = {"torch", ".checks", "__future__"} | set(sys.stdlib_module_names)
    assert imported <= allowed, f"minirl/{module}.py imports {sorted(imported - allowed)}"


def test_no_module_is_longer_than_about_600_lines_and_the_loop_fits_two_screens():
    # 600, not 450: losses.py keeps every policy loss of the field side by side (clip, GSPO, GSPO-token, CISPO,
    # SAPO, GMPO: one function each), and interop.py every engine mapping with its reviewed field lists; splitting
    # either would send a reader to a second file for the same idea
    # interop.py: 675, since it maps the sampler corrections and refuses the simulated sampler too (TRL's
    # vllm_importance_sampling_*, verl's rollout_correction) beside every other switch; one file per engine would
    # split the name table a reader compares
    lengths = {str(p): len(p.read_text().splitlines()) for p in (ROOT / "minirl").rglob("*.py")}
    assert max(n for p, n in lengths.items() if not p.endswith("interop.py")) <= 600, lengths
    assert lengths[str(ROOT / "minirl" / "interop.py")] <= 675, lengths
    src = (ROOT / "minirl" / "rl.py").read_text()
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "train_rl")
    assert fn.end_lineno - fn.lineno + 1 <= 120


# --- the three policy-loss functions behind policy_loss ---------------------------------------------------------
def _inputs():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -3.0, -3.0]], dtype=torch.float64)
    log_ratio = torch.tensor([[3e-4, -1e-4, 1e-4], [6e-4, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    return old, old + log_ratio, mask, torch.tensor([1.0, -1.0], dtype=torch.float64)


# paper-index: losses.sequence_ratio
def test_sequence_ratio_is_the_geometric_mean_by_hand():
    old, new, mask, _ = _inputs()
    # row 0: mean log-ratio (3e-4 - 1e-4 + 1e-4) / 3 = 1e-4; row 1: 6e-4 (one valid token)
    torch.testing.assert_close(losses.sequence_ratio(new, old, mask),
                               torch.tensor([math.exp(1e-4), math.exp(6e-4)], dtype=torch.float64))


# paper-index: losses.gspo_loss
def test_gspo_loss_by_hand_and_through_the_dispatcher():
    old, new, mask, adv = _inputs()
    # s = [1.00010001, 1.00060018]; seq 0 inside [1 - 3e-4, 1 + 4e-4]: -1 * s0; seq 1 above, but A < 0 keeps the
    # unclipped branch: +s1. Mean over 2 sequences: (-1.00010001 + 1.00060018) / 2 = 0.00025009
    loss, _ = losses.gspo_loss(new, old, adv, mask, eps_low=3e-4, eps_high=4e-4)
    assert loss.item() == pytest.approx((-math.exp(1e-4) + math.exp(6e-4)) / 2, abs=1e-12)
    via, _ = losses.policy_loss(new, old, adv, mask, eps_low=3e-4, eps_high=4e-4, level="sequence",
                                agg="seq-mean-token-mean")
    assert via.item() == loss.item()


# paper-index: losses.gspo_token_loss
def test_gspo_token_loss_equals_gspo_for_per_sequence_advantages():
    old, new, mask, adv = _inputs()
    grads = []
    for fn in (lambda x: losses.gspo_loss(x, old, adv, mask, eps_low=3e-4, eps_high=4e-4)[0],
               lambda x: losses.gspo_token_loss(x, old, adv.unsqueeze(1).expand(2, 3), mask, eps_low=3e-4,
                                                eps_high=4e-4)[0]):
        x = new.clone().requires_grad_(True)
        fn(x).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)


# paper-index: losses.token_clip_loss
def test_token_clip_loss_by_hand():
    # one token, A = +1: on-policy ratio 1 -> loss -1; log-ratio 0.2 -> ratio 1.2214 clipped at 1.2 -> loss -1.2
    old = torch.tensor([[-1.0]])
    for new, expected in ((-1.0, -1.0), (-0.8, -1.2)):
        loss, _ = losses.token_clip_loss(torch.tensor([[new]]), old, torch.ones(1, 1), torch.ones(1, 1), eps_low=0.2,
                                         eps_high=0.2,
                                         agg="token-mean")
        assert loss.item() == pytest.approx(expected, abs=1e-6)


# --- reward functions in TRL's form ---------------------------------------------------------------------------------
# paper-index: rewards.score_completions
def test_score_completions_weights_and_columns_by_hand():
    def exact(prompts, completions, answer, **_):
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    def length(prompts, completions, **_):
        return [len(c) / 10 for c in completions]

    out = rewards.score_completions([exact, length], ["p", "q"], ["12", "7"], columns={"answer": ["12", "8"]},
                                    weights=[1.0, 2.0])
    # [1 + 2 * 0.2, 0 + 2 * 0.1] = [1.4, 0.2]
    torch.testing.assert_close(out, torch.tensor([1.4, 0.2]))


def test_bad_reward_values_are_errors_naming_the_function():
    def wordy(prompts, completions, **_):
        return [1.0, "yes"]

    with pytest.raises(ValueError, match=r"wordy returned 'yes' at completion 1"):
        rewards.score_completions(wordy, ["p", "q"], ["a", "b"])
    with pytest.raises(ValueError, match="returned 1 values for 2 completions"):
        rewards.score_completions(lambda prompts, completions, **_: [1.0], ["p", "q"], ["a", "b"])
    with pytest.raises(ValueError, match="one weight per function"):
        rewards.score_completions([wordy], ["p"], ["a"], weights=[1.0, 2.0])


# paper-index: tasks.running_sums_reward
def test_running_sums_reward_is_the_task_score():
    assert tasks.running_sums_reward(["1+2=", "1+2=", "1+2="], ["1+2=3#3", "1+2=3#4", "3"],
                                     answer=["3", "3", "3"]) == [1.0, 0.0, 0.0]


# paper-index: rl.train_rl
def test_a_trl_style_reward_function_trains_one_step():
    # TRL's signature: (prompts, completions, **kwargs) with the dataset's other columns by name
    seen = {}

    def trl_reward(prompts, completions, **kwargs):
        seen.update(kwargs)
        return [c.count("1") / max(len(c), 1) for c in completions]  # varies with what is written

    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    before = [p.clone() for p in model.parameters()]
    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="] * 4, "target": ["3", "7"] * 4})
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, lr=1e-3,
                             progress=False)
    h = rl.train_rl(model, tok, cfg, data, reward_fn=trl_reward)
    # the extra column (one value per completion), the token ids, and what of TRL's context minirl passes
    assert set(seen) == {"target", "completion_ids", "trainer_state", "log_metric"} and len(seen["target"]) == 8
    assert h.rows[-1]["step"] == 1 and math.isfinite(h.rows[-1]["loss"])
    moved = any(not torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))
    assert moved  # the step changed the policy


def test_train_rl_names_a_missing_prompt_column():
    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    with pytest.raises(ValueError, match="'prompt' column"):
        rl.train_rl(model, tok, config.make_config("grpo", steps=1), datasets.Dataset.from_dict({"text": ["x"]}))


# --- README ---------------------------------------------------------------------------------------------------------
def test_the_readme_custom_task_example_runs_as_written():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- example: your-own-task -->\s*```python\n(.*?)```", text, re.S)
    assert block, "README.md lost its 'your own task' example"
    namespace: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    history = namespace["history"]
    assert [r["step"] for r in history.rows] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(r["loss"]) for r in history.rows)


def test_the_readme_paper_index_is_up_to_date():
    import paper_index

    text = (ROOT / "README.md").read_text()
    assert paper_index.readme_section(text) == paper_index.section(), (
        "README.md's paper index is stale: run `python tests/paper_index.py`")


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
    aggregate = sorted((paper, eq) for paper, eq, fn, _, _ in rows if fn == "`losses.aggregate`")
    assert aggregate == [("Liu et al. 2025 (Dr. GRPO)", "eq. 2"), ("Shao et al. 2024 (DeepSeekMath, GRPO)", "eq. 3"),
                         ("Yu et al. 2025 (DAPO)", "eq. 12")]
    papers = [r[0].lower() for r in rows]
    assert papers == sorted(papers), "rows are sorted by paper"


# paper-index: rl.compute_advantages
def test_compute_advantages_takes_the_group_path_or_the_kl_to_go_path():
    from types import SimpleNamespace

    batch = SimpleNamespace(completion_mask=torch.ones(4, 2))
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv, returns, values = rl.compute_advantages(scores, None, batch, config.make_config("grpo", group_size=2),
                                                 beta=0.04)
    # group 0: [1, 0] - 0.5 = [0.5, -0.5], unbiased std 0.7071 + 1e-4; group 1 all equal: exactly 0
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0, 0]) / torch.tensor([0.70721, 0.70721, 1, 1]))
    assert returns is None and values is None
    # KL in the reward (beta 0.5): penalties-to-go, centred by the group mean of the first token's (no std)
    cfg = config.make_config("grpo", group_size=2, kl_placement="reward", kl_estimator="k1", beta=0.5)
    kl_tokens = torch.tensor([[0.2, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    adv, _, _ = rl.compute_advantages(scores, kl_tokens, batch, cfg, beta=0.5)
    # row 0: C = [0.1, 0], group mean of C_0 = 0.05: A = 0.70700 - [0.05, -0.05]; row 1: -0.70700 + 0.05
    a = 0.5 / 0.70721
    torch.testing.assert_close(adv[:2], torch.tensor([[a - 0.05, a + 0.05], [-a + 0.05, -a + 0.05]]), atol=1e-5,
                               rtol=0)


def test_compute_advantages_takes_the_rloo_and_reinforce_pp_paths():
    from types import SimpleNamespace

    batch = SimpleNamespace(completion_mask=torch.ones(4, 2))
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv, returns, values = rl.compute_advantages(scores, None, batch, config.make_config("rloo", group_size=2),
                                                 beta=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]))  # 1 - 0 and 0 - 1; the equal group 0
    assert returns is None and values is None
    adv, _, _ = rl.compute_advantages(scores, None, batch, config.make_config("reinforce_pp", group_size=2), beta=0.0)
    # batch mean 0.75, std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5 (+ 1e-4): [0.25, -0.75, 0.25, 0.25] / 0.5001
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, 0.25, 0.25]) / 0.5001)
    cfg = config.make_config("reinforce_pp_baseline", group_size=2)
    adv, _, _ = rl.compute_advantages(scores, None, batch, cfg, beta=0.0)
    # c = [0.5, -0.5, 0, 0], std_B(c) = sqrt(0.5 / 3) = 0.40825 (+ 1e-4)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.0, 0.0]) / ((0.5 / 3) ** 0.5 + 1e-4))


@pytest.mark.parametrize("overrides, message", [
    (dict(advantage="rloo"), "adv_scale='group' applies to advantage='group' only"),  # RLConfig's default scale
    (dict(advantage="reinforce_pp_baseline", adv_scale="batch"), "set adv_scale='none'"),
    (dict(advantage="rloo", adv_scale="none", group_size=1), "needs group_size >= 2"),
    (dict(advantage="rloo", adv_scale="none", beta=0.1, kl_placement="reward"), "kl_placement='reward'"),
    (dict(advantage="reinforce_plus_plus"), "unknown advantage"),
])
def test_new_advantage_switches_are_validated(overrides, message):
    with pytest.raises(ValueError, match=message):
        config.RLConfig(**overrides).validate()


def test_reinforce_pp_needs_no_groups_and_the_presets_are_valid():
    config.RLConfig(advantage="reinforce_pp", adv_scale="none", group_size=1).validate()  # k >= 1 in the paper
    for algo, advantage in [("rloo", "rloo"), ("reinforce_pp", "reinforce_pp"),
                            ("reinforce_pp_baseline", "reinforce_pp_baseline")]:
        c = config.make_config(algo)
        assert (c.advantage, c.adv_scale, c.beta) == (advantage, "none", 0.0)
    assert (config.make_config("rloo").agg, config.make_config("rloo").num_minibatches) == ("seq-mean-token-sum", 1)


def test_every_logged_metric_is_in_the_readme_glossary():
    """Short real runs that together log every key minirl writes into a History (PPO with its critic; SAPO on a MoE
    with the load-balancing loss, a mismatched sampler with TIS and both sweep probes; DPO, IPO and KTO), each key
    looked up in the README's "Glossary of logged metrics" (a per-layer key ``x_l3`` is documented as ``x_l{i}``)."""
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
    text = (ROOT / "README.md").read_text()
    glossary = text[text.index("## Glossary of logged metrics"):]
    glossary = glossary[:glossary.index("\n## ", 1)]
    documented = set(re.findall(r"`([a-z_0-9{}]+)`", glossary))
    missing = {k for k in logged if re.sub(r"_l\d+$", "_l{i}", k) not in documented}
    assert len(logged) > 80 and not missing, f"logged keys the README's glossary does not explain: {sorted(missing)}"
