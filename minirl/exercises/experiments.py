"""Experiment exercises of the course kit: predict, run a small experiment, read it against a stored spread.

Each experiment compares two arms of one switch of the RL loop (the KL coefficient, the group size, where the KL
goes, the upper clip range) with short GRPO runs on the cpu profile, started from the shipped warm start
(``warm_start("cpu", seed=0)``). The student first records a prediction (``predict``), then runs both arms
(``run_experiment``; 1 to 3 minutes on two shared cores), then ``check_experiment`` prints the run beside the spread
stored in ``notebooks/results/exercises/spread.json`` (the same budget, RL seeds 0-2) and says whether the prediction
held. It grades that a prediction was recorded before the runs and that the runs were done at the stored budget,
never whether the prediction was right.

The stored spread is measured with ``python -m minirl.exercises.experiments --out notebooks/results/exercises``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import _core

#: The budget of every run (what the stored spread was measured at): steps, prompts x G completions per step.
STEPS, PROMPTS, G, LR = 15, 8, 8, 1e-4
SPREAD_FILE = Path(__file__).resolve().parents[2] / "notebooks" / "results" / "exercises" / "spread.json"


@dataclass(frozen=True)
class Experiment:
    """Two arms (RLConfig overrides) of one question, the metric read from each run, and the prediction asked."""

    name: str
    chapter: str
    question: str
    arms: dict  # arm name -> RLConfig overrides on top of make_config("grpo", budget above)
    metric: str  # what is measured, in words, with its unit
    prediction: str  # "larger_arm": the name of the arm with the larger metric; "number": a value for ``arms[0]``
    ref_model: bool = False  # pass a frozen reference even at beta = 0, so the KL to it is measured


def _last(history, key: str, n: int = 5) -> float:
    values = [v for v in history.series(key)[1] if v is not None and not math.isnan(v)]
    return sum(values[-n:]) / len(values[-n:])


def _mean(history, key: str) -> float:
    values = [v for v in history.series(key)[1] if v is not None and not math.isnan(v)]
    return sum(values) / len(values)


METRICS = {
    "kl_ref_last5": lambda h: _last(h, "kl_ref"),
    "zero_signal_share": lambda h: 1.0 - _mean(h, "useful_groups"),
    "clip_frac_high": lambda h: _mean(h, "clip_frac_high"),
}

EXPERIMENTS = {
    "beta": Experiment(
        "beta", "02", "Which run ends further from the reference: no KL penalty, or k3 in the loss at beta = 0.5?",
        {"beta=0": dict(beta=0.0), "beta=0.5": dict(beta=0.5, kl_estimator="k3", kl_placement="loss")},
        "kl_ref_last5", "larger_arm", ref_model=True),
    "group_size": Experiment(
        "group_size", "03", "With 64 completions per step, what share of the groups carries no signal (all rewards "
        "equal, advantage 0) at G = 2? (Compare it with G = 8.)",
        {"G=2": dict(group_size=2, prompts_per_step=32), "G=8": dict(group_size=8, prompts_per_step=8)},
        "zero_signal_share", "number"),
    "kl_placement": Experiment(
        "kl_placement", "04", "At the same beta = 0.5, which run ends further from the reference: k1 in the reward "
        "(PPO's placement) or k3 in the loss (GRPO's)?",
        {"k1 in reward": dict(beta=0.5, kl_estimator="k1", kl_placement="reward"),
         "k3 in loss": dict(beta=0.5, kl_estimator="k3", kl_placement="loss")},
        "kl_ref_last5", "larger_arm", ref_model=True),
    "eps_high": Experiment(
        "eps_high", "05", "Which run clips more tokens at the upper bound: eps_high = 0.2 or DAPO's 0.28?",
        {"eps_high=0.2": dict(eps_high=0.2), "eps_high=0.28": dict(eps_high=0.28)},
        "clip_frac_high", "larger_arm"),
}

METRIC_WORDS = {
    "kl_ref_last5": "KL to the reference, nats per token (mean of the last 5 steps)",
    "zero_signal_share": "share of groups with all rewards equal (mean over the steps)",
    "clip_frac_high": "share of valid tokens clipped at 1 + eps_high (mean over the steps)",
}

_PREDICTIONS: dict[str, dict] = {}


def predict(name: str, value) -> None:
    """Record the prediction for experiment ``name`` BEFORE running it (a later call replaces it before a run).

    Args:
        name: an experiment of ``EXPERIMENTS``.
        value: for a "larger_arm" experiment, the name of the arm you expect to have the larger metric; for a
            "number" experiment, the value you expect for the first arm (a float).

    Raises:
        KeyError: for an unknown experiment; ValueError: for a value of the wrong kind.
    """
    ex = _experiment(name)
    if ex.prediction == "larger_arm" and value not in ex.arms:
        raise ValueError(f"{name}: predict the name of one arm, one of {list(ex.arms)}; got {value!r}")
    if ex.prediction == "number" and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value)):
        raise ValueError(f"{name}: predict a number (the metric of arm {list(ex.arms)[0]!r}); got {value!r}")
    _PREDICTIONS[name] = {"value": value, "time": time.time()}
    print(f"{name}: prediction recorded: {value!r}")


def _experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; the experiments are {list(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def run_arm(name: str, arm: str, *, seed: int = 0, steps: int = STEPS, progress: bool = False) -> dict:
    """One run of one arm at the stored budget, from the cpu profile's shipped warm start; returns its record."""
    import copy

    from transformers.utils import logging as hf_logging

    from .. import config, rl, tasks
    from ..warm_start import warm_start

    hf_logging.disable_progress_bar()  # no "Loading weights" bar in a stored notebook
    ex = _experiment(name)
    model, tok, _ = warm_start("cpu", seed=0, progress=False)
    ref = copy.deepcopy(model) if ex.ref_model else None
    cfg = config.make_config("grpo", **{"seed": seed, "steps": steps, "prompts_per_step": PROMPTS, "group_size": G,
                                        "lr": LR, "max_new_tokens": config.PROFILES["cpu"].max_new_tokens,
                                        "progress": progress, **ex.arms[arm]})
    t0 = time.time()
    history = rl.train_rl(model, tok, cfg, tasks.load_split("train"), ref_model=ref)
    return {"experiment": name, "arm": arm, "seed": seed, "steps": steps, "value": METRICS[ex.metric](history),
            "seconds": round(time.time() - t0, 1)}


def run_experiment(name: str, *, seed: int = 0) -> dict:
    """Run both arms of ``name`` (one seed each); a prediction must have been recorded first with ``predict``.

    Returns:
        {arm: record}, each record with the metric ``value``, the ``seed``, ``steps`` and wall ``seconds``, and the
        prediction that was on record when the runs started.

    Raises:
        RuntimeError: if no prediction was recorded for ``name``.
    """
    ex = _experiment(name)
    _core._refuse_if_tampered(name, "before the runs")  # e.g. run_arm replaced from a solution cell
    if name not in _PREDICTIONS:
        raise RuntimeError(f"{name}: record your prediction first: experiments.predict({name!r}, ...)")
    prediction = dict(_PREDICTIONS[name])
    runs = {arm: run_arm(name, arm, seed=seed) for arm in ex.arms}
    for record in runs.values():
        record["prediction"] = prediction
    return runs


def load_spread(path: Path = SPREAD_FILE) -> dict:
    """The stored spread: {experiment: {arm: {"values": [per seed], "mean", "min", "max"}}, plus provenance."""
    return json.loads(Path(path).read_text())


def compare_with_spread(value: float, arm: dict) -> str:
    """One arm's run read against its stored seeds, with the tolerance their spread implies, as one phrase.

    The stored values come from RL seeds 0, 1, 2 on one CPU; a run on another CPU (or thread count) differs from its
    stored seed by float round-off that 15 RL steps amplify, so it is one more draw from the seed-to-seed spread.
    The tolerance is therefore that spread's standard deviation sd (sample, over the stored seeds): a value inside
    [min, max] is "inside the stored range"; one within sd of either end is "just outside ..., within one
    seed-to-seed sd: consistent with the stored seeds"; only one further away is "outside". Every number is printed
    with 4 significant digits, and the distance to the range with its own, so the verdict never contradicts the
    digits shown.

    Example: stored [0.067693, 0.099522, 0.086960] (sd 0.01608): 0.06769262 is 3.8e-07 below the min, so "just
    outside the stored range (3.8e-07 below its min), within one seed-to-seed sd (0.016): consistent with the
    stored seeds"; 0.04 is 0.0277 below, more than one sd: "outside".

    Args:
        value: the run's metric.
        arm: the stored arm, {"values": [per seed], "mean", "min", "max"}.

    Returns:
        "stored mean ... (seeds ..., sd ...) -> <verdict>".
    """
    values = [float(v) for v in arm["values"]]
    lo, hi = min(values), max(values)
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    seeds = ", ".join(f"{v:.4g}" for v in values)
    head = f"stored mean {mean:.4g} (seeds {seeds}; sd {sd:.2g}) -> "
    if lo <= value <= hi:
        return head + "inside the stored range"
    gap, end = (lo - value, "min") if value < lo else (value - hi, "max")
    where = f"{gap:.2g} {'below' if end == 'min' else 'above'} its {end}"
    if gap <= sd:
        return head + f"just outside the stored range ({where}), within one seed-to-seed sd: consistent with the " \
                      "stored seeds"
    return head + f"outside the stored range ({where}, more than one seed-to-seed sd)"


def check_experiment(name: str, runs: dict, *, spread: dict | None = None) -> bool:
    """Grade an experiment exercise: a prediction recorded before the runs, both arms run at the stored budget.

    Prints each arm's value beside the stored seeds (``compare_with_spread``: inside, just outside within one
    seed-to-seed sd, or outside), whether the gap between the arms
    is larger than the seed-to-seed spread, and whether the prediction held. Returns True when graded; the
    correctness of the prediction is reported, never graded.

    Raises:
        AssertionError: no prediction on record before the runs, an arm missing, or a run not at the budget.
    """
    ex = _experiment(name)
    _core._refuse_if_tampered(name, "before the experiment was graded")
    spread = (spread or load_spread())["experiments"][name]
    assert isinstance(runs, dict) and set(runs) == set(ex.arms), (
        f"{name}: run both arms with run_experiment({name!r}), then pass what it returned")
    for arm, r in runs.items():
        assert r.get("experiment") == name and r.get("arm") == arm and r.get("steps") == STEPS, (
            f"{name}: arm {arm!r} was not run by run_experiment at the stored budget ({STEPS} steps)")
        assert isinstance(r.get("value"), float) and math.isfinite(r["value"]), f"{name}: arm {arm!r} has no value"
        assert r.get("prediction") and r["prediction"]["value"] is not None, (
            f"{name}: no prediction was on record when the runs started: call experiments.predict first")
    prediction = next(iter(runs.values()))["prediction"]["value"]
    first, second = list(ex.arms)
    print(f"{name}: {METRIC_WORDS[ex.metric]}; stored spread over RL seeds {spread['seeds']} at {STEPS} steps")
    for arm in ex.arms:
        value = runs[arm]["value"]
        print(f"  {arm:>14}: your run {value:.4g}; {compare_with_spread(value, spread['arms'][arm])}")
    a, b = spread["arms"][first], spread["arms"][second]
    separated = a["min"] > b["max"] or b["min"] > a["max"]
    print("  the stored ranges of the two arms " + ("do not overlap: the gap is larger than the seed-to-seed spread"
                                                     if separated else "overlap: at this budget the gap is within "
                                                     "the noise of one seed"))
    if ex.prediction == "larger_arm":
        yours = first if runs[first]["value"] > runs[second]["value"] else second
        stored = first if a["mean"] > b["mean"] else second
        held = prediction == stored
        print(f"  you predicted {prediction!r} larger; your run: {yours!r}; the stored means: {stored!r} -> "
              f"the prediction {'held' if held else 'did not hold'}"
              + ("" if separated else " (but the stored ranges overlap, so one seed cannot settle it)"))
    else:
        held = a["min"] - 0.05 <= prediction <= a["max"] + 0.05
        print(f"  you predicted {prediction:.3f} for {first!r}; the stored range is {a['min']:.3f}-{a['max']:.3f} "
              f"-> the prediction {'held' if held else 'did not hold'} (within 0.05 of the stored range)")
    return True


def _commit() -> str:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    """Measure the stored spread: every arm of every experiment over RL seeds 0-2 (``--out`` a folder)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(SPREAD_FILE.parent))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    done = {}
    if runs_path.exists():  # resumable: arms shared between experiments and finished runs are not rerun
        for line in runs_path.read_text().splitlines():
            r = json.loads(line)
            done[(r["key"], r["seed"])] = r
    t_all = time.time()
    result = {"command": "OMP_NUM_THREADS=1 MINIRL_PROFILE=cpu python -m minirl.exercises.experiments --out "
                         "notebooks/results/exercises",
              "commit": _commit(), "budget": {"steps": STEPS, "prompts_per_step": PROMPTS, "group_size": G, "lr": LR,
                                              "warm_start": "cpu, seed 0"},
              "torch_threads": os.environ.get("OMP_NUM_THREADS"), "experiments": {}}
    for name, ex in EXPERIMENTS.items():
        arms = {}
        for arm, overrides in ex.arms.items():
            key = json.dumps({**overrides, "ref": ex.ref_model, "metric": ex.metric}, sort_keys=True)
            values = []
            for seed in args.seeds:
                if (key, seed) not in done:
                    r = run_arm(name, arm, seed=seed)
                    done[(key, seed)] = {"key": key, "seed": seed, "value": r["value"], "seconds": r["seconds"]}
                    with runs_path.open("a") as f:
                        f.write(json.dumps(done[(key, seed)]) + "\n")
                    print(f"{name} {arm} seed {seed}: {r['value']:.5f} ({r['seconds']} s)", flush=True)
                values.append(done[(key, seed)]["value"])
            arms[arm] = {"values": values, "mean": sum(values) / len(values), "min": min(values), "max": max(values),
                         "seconds": [done[(key, s)]["seconds"] for s in args.seeds]}
        result["experiments"][name] = {"chapter": ex.chapter, "metric": ex.metric, "seeds": args.seeds, "arms": arms}
    result["wall_seconds"] = round(time.time() - t_all, 1)
    (out / "spread.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / 'spread.json'} in {result['wall_seconds']} s", file=sys.stderr)


# imported after the checker took its fingerprints (a notebook's first cell imports it second): fingerprint it too
_core.watch(__name__, globals())

if __name__ == "__main__":
    main()
