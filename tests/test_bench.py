"""Tests of minirl.bench: the timed parts of a step cover it, and the report says what it measured."""

import pytest

from minirl import bench, models, rl, tasks
from minirl.config import make_config
from minirl.tokenizer import build_tokenizer

pytestmark = pytest.mark.slow  # times real RL steps (it trains)

PARTS = ("generate", "logprob_forwards", "train_forward", "backward", "optimizer")


def check_parts_cover_the_total(sec: dict) -> None:
    """Each timed part is positive, and together they cover at least 80% of the step and at most all of it.

    With 2 repeats a median is the mean of the two, so the parts' medians add up to the mean of the parts, which
    is at most the mean total (the parts are disjoint intervals inside each step), up to the 6-decimal rounding of
    each figure. What is left untimed (the advantages, building the batch) is small next to the forwards.
    """
    assert all(sec[k] > 0 for k in PARTS), sec
    covered = sum(sec[k] for k in PARTS)
    assert 0.8 * sec["total"] <= covered <= sec["total"] + 1e-5, (covered, sec["total"])


def bench_tiny(tok, repeats=2):
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    data = tasks.load_split("train").select(range(4))
    cfg = make_config("grpo", prompts_per_step=4, group_size=2, max_new_tokens=6, progress=False)
    out = bench.bench_model(model, tok, data, cfg, repeats=repeats, device="cpu")
    return model, out


def test_bench_model_parts_cover_the_total():
    tok = build_tokenizer()
    model, out = bench_tiny(tok)
    sec = out["seconds"]
    check_parts_cover_the_total(sec)
    assert out["completions_per_step"] == 8
    assert out["parameters"] == models.count_parameters(model)
    # exactly max_new_tokens 6 x 8 completions are generated per step: the work is fixed (min_new_tokens)
    assert out["generated_tokens_per_step"] == 6 * 8
    assert rl.policy_logprobs.__name__ == "policy_logprobs"  # the timing wrapper is undone
    # the rate is that count over the median generation time; both figures are rounded, so compare loosely
    rate = out["generated_tokens_per_step"] / sec["generate"]
    assert abs(out["generated_tokens_per_s"] - rate) <= 0.01 * rate


def test_the_coverage_check_fails_when_the_step_does_untimed_work(monkeypatch):
    """The check above can fail: when the advantages (untimed) take twice as long as the timed parts of an honest
    step, the parts cover about a third of the step, on an idle machine or a loaded one alike (the sleep is sized
    from the honest step measured here)."""
    import time

    import pytest

    tok = build_tokenizer()
    _, honest = bench_tiny(tok)
    timed = sum(honest["seconds"][k] for k in PARTS)  # seconds of timed work in one step
    real = rl.compute_advantages

    def slow_advantages(*args, **kwargs):
        time.sleep(2 * timed)  # 2x the timed work of a step
        return real(*args, **kwargs)

    monkeypatch.setattr(bench.rl, "compute_advantages", slow_advantages)
    _, out = bench_tiny(tok)
    with pytest.raises(AssertionError):
        check_parts_cover_the_total(out["seconds"])


def test_run_bench_on_cpu_reports_one_process_memory_figure():
    out = bench.run_bench("cpu", seed=0, repeats=1)
    assert out["device"] == "cpu" and out["profile"] == "cpu"
    assert out["peak_rss_mb"] > 0
    for kind in ("dense", "moe"):
        assert "peak_memory_mb" not in out[kind]  # a per-model figure would be the same process peak twice
        assert set(PARTS) <= set(out[kind]["seconds"])
    assert out["moe"]["parameters"] > out["dense"]["parameters"]


def test_vs_trl_runs_identical_fixed_length_work():
    """bench --vs-trl on a small slice: both engines step, and minirl's rollouts have exactly the fixed length
    (run_vs_trl asserts 2 x 2 x 6 completion tokens per step inside)."""
    import pytest

    pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")
    out = bench.run_vs_trl(seed=0, repeats=2, prompts_per_step=2, group_size=2, completion_tokens=6)
    assert out["repeats"] == 2 and out["minirl_seconds"]["min"] > 0 and out["trl_seconds"]["min"] > 0
    ratio = out["ratio_trl_over_minirl"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"]
