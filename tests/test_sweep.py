"""Tests of minirl.sweep: a spec runs every (arm, seed) once, resumes without rerunning, and its summary is the
mean / std / min / max over seeds of the stored runs."""

import json
import statistics

import pytest
import torch

from minirl import models, sweep
from minirl.tokenizer import build_tokenizer

BASE = {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6, "num_minibatches": 1}


@pytest.fixture
def tiny_warm_start(monkeypatch):
    """Replace the (minute-long) warm start with a tiny random model; count the training runs."""
    calls = []

    def fake_warm_start(profile, seed=0, moe=False, progress=True):
        tok = build_tokenizer()
        return models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                 seed=seed), tok, {"sha256": {"model.safetensors": "ab12"}}

    real_train = sweep.rl.train_rl

    def counting_train(*args, **kwargs):
        calls.append(args[2].seed)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(sweep, "warm_start", fake_warm_start)
    monkeypatch.setattr(sweep.rl, "train_rl", counting_train)
    return calls


def write_spec(tmp_path, **extra):
    spec = {"name": "t", "seeds": [0, 1], "base": BASE, "eval_prompts": 4,
            "arms": {"grpo": {"algo": "grpo"}, "dr grpo": {"algo": "dr_grpo"}}, **extra}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.slow
def test_sweep_runs_each_arm_and_seed_once_and_resumes(tmp_path, tiny_warm_start):
    path = write_spec(tmp_path)
    summary = sweep.run_sweep(path, progress=False)
    assert sorted(tiny_warm_start) == [0, 0, 1, 1]  # 2 arms x 2 seeds
    assert sorted(p.name for p in (tmp_path / "runs").glob("*.jsonl")) == [
        "dr_grpo__s0.jsonl", "dr_grpo__s1.jsonl", "grpo__s0.jsonl", "grpo__s1.jsonl"]
    assert summary["command"] == f"python -m minirl sweep {path}" and len(summary["commit"]) >= 7
    assert set(summary["run_seconds"]) == {"grpo__s0", "grpo__s1", "dr_grpo__s0", "dr_grpo__s1"}
    assert json.loads((tmp_path / "summary.json").read_text())["arms"].keys() == {"grpo", "dr grpo"}
    assert summary["warm_start_sha256"] == "ab12"  # every run names the start it trained from
    assert sweep.same_start(summary, {"sha256": {"model.safetensors": "ab12"}})
    assert not sweep.same_start(summary, {"sha256": {"model.safetensors": "ff00"}})  # another start
    assert not sweep.same_start(summary, {})  # a start that names no weights is never "the same"
    # a second call finds every run stored: nothing is trained again
    sweep.run_sweep(path, progress=False)
    assert len(tiny_warm_start) == 4
    # a removed run (an interrupted sweep) is the only one rerun
    (tmp_path / "runs" / "grpo__s1.jsonl").unlink()
    sweep.run_sweep(path, progress=False)
    assert tiny_warm_start[4:] == [1]
    # runs from two different starts: the summary names none of them rather than one
    meta = tmp_path / "runs" / "grpo__s0.meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "warm_start_sha256": "cd34"}))
    mixed = sweep.run_sweep(path, progress=False)
    assert mixed["warm_start_sha256"] is None and not sweep.same_start(mixed, {"sha256": {"model.safetensors": "ab12"}})


@pytest.mark.slow
def test_summary_is_the_statistics_over_seeds_of_the_stored_rows(tmp_path, tiny_warm_start):
    path = write_spec(tmp_path)
    summary = sweep.run_sweep(path, progress=False)
    rows = {s: [json.loads(line) for line in (tmp_path / "runs" / f"grpo__s{s}.jsonl").open()] for s in (0, 1)}
    m = summary["arms"]["grpo"]["metrics"]["score"]
    assert m["step"] == [1, 2]
    for i, step in enumerate(m["step"]):
        a, b = (next(r["score"] for r in rows[s] if r["step"] == step and "score" in r) for s in (0, 1))
        assert m["mean"][i] == pytest.approx((a + b) / 2)
        assert m["std"][i] == pytest.approx(statistics.stdev([a, b]))  # sample std: |a - b| / sqrt(2)
        assert (m["min"][i], m["max"][i]) == (min(a, b), max(a, b))
    # held-out accuracy at step 0 is the same evaluation of the same model for every arm and seed
    e0 = [summary["arms"][arm]["metrics"]["eval_accuracy"]["mean"][0] for arm in ("grpo", "dr grpo")]
    assert e0[0] == e0[1]
    # samples so far: 2 prompts x 2 completions a step
    assert summary["arms"]["grpo"]["gen_samples_cum"]["mean"] == [4.0, 8.0]


@pytest.mark.parametrize("bad, match", [
    ({"arms": {}}, "must not be empty"),
    ({"arms": {"a": {"algo": "grpo", "kl_estimatr": "k3"}}}, "unknown RLConfig field"),
    ({"arms": {"GRPO": {"algo": "grpo"}, "grpo": {"algo": "grpo"}}}, "must differ"),
    ({"arms": {"//": {"algo": "grpo"}}}, "must differ"),
    ({"seed": [0]}, "needs name, arms and seeds"),
    ({"arms": {"a": {"algo": "grpo", "model": {"num_layerz": 8}}}}, "model must map sizes"),
    ({"arms": {"a": {"algo": "grpo", "model": {"num_experts": 16}}}}, "model must map sizes"),  # dense: no experts
])
def test_a_bad_spec_fails_before_anything_runs(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        sweep.load_spec(write_spec(tmp_path, **bad))


def test_an_arms_model_key_changes_the_model_sizes_and_nothing_else(tmp_path):
    spec = sweep.load_spec(write_spec(tmp_path, moe=True, arms={
        "deep": {"algo": "grpo", "model": {"num_layers": 8}}, "wide": {"algo": "grpo", "model": {"num_experts": 16}},
        "plain": {"algo": "grpo"}}))
    cpu = sweep.resolve_profile("cpu")
    assert spec.profile_of("deep").moe == {**cpu.moe, "num_layers": 8}
    assert spec.profile_of("wide").moe == {**cpu.moe, "num_experts": 16}
    assert spec.profile_of("plain") == cpu and spec.profile_of("deep").dense == cpu.dense
    assert spec.config("deep", 0) == spec.config("plain", 0)  # "model" is not an RLConfig field


@pytest.mark.slow
def test_plot_metric_draws_the_mean_and_a_min_max_band(tmp_path, tiny_warm_start):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = sweep.run_sweep(write_spec(tmp_path), progress=False)
    fig, ax = plt.subplots()
    sweep.plot_metric(ax, summary, "score", x="samples")
    m = summary["arms"]["grpo"]["metrics"]["score"]
    line = ax.lines[0]
    assert list(line.get_xdata()) == [4.0, 8.0] and list(line.get_ydata()) == m["mean"]
    assert len(ax.lines) == 2 and len(ax.collections) == 2  # one line and one band per arm
    plt.close(fig)


def first_position_kl(model, reference, tok, prompts) -> float:
    """Mean over ``prompts`` of the exact KL(model || reference) of the first completion token's distribution."""
    from minirl import kl

    out = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = [m(input_ids=ids).logits[:, -1:, :] for m in (model, reference)]  # (1, 1, V) each
        out.append(float(kl.exact_token_kl(*logits)))
    return sum(out) / len(out)


@pytest.mark.slow
def test_the_kl_probe_logs_the_true_kl_in_the_runs_rows(tmp_path, tiny_warm_start, monkeypatch):
    """kl_probe adds true_kl (nats per sequence) to the rows it measures, through train_rl's callback: the
    callback runs before the row is logged.

    A floor it must clear: a completion's KL is the sum over its positions of the exact per-position KL, each >= 0,
    and every completion has a first token, whose distribution depends on the prompt alone. So the mean KL per
    sequence is at least the mean first-position KL over the probe's prompts, which this test computes from the
    probe's own two models. The run has moved away from its start: weight decay shrinks every weight at each
    step (a tiny random model rarely earns a reward, so without it the policy might not move at all).
    """
    calls = []
    real = sweep.fresh_sample_kl

    def spy(model, reference, tokenizer, prompts, **kw):
        out = real(model, reference, tokenizer, prompts, **kw)
        calls.append((first_position_kl(model, reference, tokenizer, prompts), out["kl"]))
        return out

    monkeypatch.setattr(sweep, "fresh_sample_kl", spy)
    path = write_spec(tmp_path, kl_probe={"prompts": 2, "samples": 1, "every": 2}, seeds=[0],
                      arms={"grpo": {"algo": "grpo", "lr": 1e-2, "weight_decay": 0.5}})
    summary = sweep.run_sweep(path, progress=False)
    m = summary["arms"]["grpo"]["metrics"]["true_kl"]
    (floor, measured), = calls  # measured once: at step 2 (every 2, and the last step)
    assert floor > 1e-8  # the model has moved: its first-token distributions differ from the start's
    assert m["step"] == [2] and m["mean"][0] == measured >= floor * (1 - 1e-6)
    rows = [json.loads(line) for line in (tmp_path / "runs" / "grpo__s0.jsonl").open()]
    assert [r["step"] for r in rows if "true_kl" in r] == [2]
    assert all(k in rows[-1] for k in ("true_kl_stderr", "true_kl_per_token", "fresh_entropy"))


@pytest.mark.slow
def test_update_probe_measures_every_update_without_changing_the_run(tmp_path, monkeypatch):
    """update_probe: a dense arm and an MoE arm side by side (the arm's own "moe" key); every optimiser step is
    measured on the fixed probe batch (2 steps x 2 minibatches = 4 updates per run), the MoE rows carry routing
    change, router entropy and expert load, the dense rows only the token-ratio variance; the run's own numbers are
    the same as without the probe (its sampling restores the RNG, its forwards are no-grad); the hook is removed."""
    import torch.optim.optimizer as optim_module

    def fake_warm_start(profile, seed=0, moe=False, progress=True):
        tok = build_tokenizer()
        if moe:
            return models.tiny_moe(tok, hidden_size=32, num_layers=2, num_heads=2, num_experts=4, expert_size=32,
                                   seed=seed), tok, {}
        return models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                 seed=seed), tok, {}

    monkeypatch.setattr(sweep, "warm_start", fake_warm_start)
    calls = []
    real_change = sweep.moe.routing_change_fraction
    monkeypatch.setattr(sweep.moe, "routing_change_fraction", lambda *a, **k: calls.append(1) or real_change(*a, **k))
    # weight decay moves the weights even where a tiny random model earns no reward (all advantages 0)
    arms = {"dense": {"algo": "grpo", "lr": 1e-2, "weight_decay": 0.5},
            "moe": {"algo": "grpo", "lr": 1e-2, "weight_decay": 0.5, "moe": True}}
    base = {**BASE, "num_minibatches": 2}
    hooks_before = len(optim_module._global_optimizer_post_hooks)
    (tmp_path / "probed").mkdir()
    (tmp_path / "plain").mkdir()
    probed = sweep.run_sweep(write_spec(tmp_path / "probed", seeds=[0], base=base, arms=arms,
                                        update_probe={"prompts": 2, "samples": 2}), progress=False)
    plain = sweep.run_sweep(write_spec(tmp_path / "plain", seeds=[0], base=base, arms=arms), progress=False)
    assert len(optim_module._global_optimizer_post_hooks) == hooks_before
    m, d = probed["arms"]["moe"]["metrics"], probed["arms"]["dense"]["metrics"]
    assert len(calls) == 2 * 2 + 2  # one per update, plus one per step for the whole rollout
    for key in ("update_routing_change", "update_routing_change_l1", "rollout_routing_change", "router_entropy",
                "expert_load_max", "update_token_ratio_var"):
        assert m[key]["step"] == [1, 2], key
    assert all(0 <= v <= 1 for v in m["update_routing_change"]["mean"])
    assert all(0.25 - 1e-6 <= v <= 1 for v in m["expert_load_max"]["mean"])  # >= 1 / 4 experts
    assert "update_routing_change" not in d and min(d["update_token_ratio_var"]["mean"]) > 0
    assert min(d["update_abs_log_ratio"]["mean"]) > 0 and "rollout_abs_log_ratio" in m
    for arm in arms:  # the probe changed nothing the run computes
        assert probed["arms"][arm]["metrics"]["score"] == plain["arms"][arm]["metrics"]["score"]
        assert probed["arms"][arm]["metrics"]["loss"] == plain["arms"][arm]["metrics"]["loss"]
