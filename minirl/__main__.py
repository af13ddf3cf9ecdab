"""Command line, three commands: ``python -m minirl train --algo grpo`` (the main job: warm start, evaluate, train
with RL, evaluate again), ``python -m minirl bench`` (time one RL step; ``--vs-trl``: against TRL's GRPOTrainer) and
``python -m minirl sweep SPEC`` (a grid of arms x seeds from a sweep spec, resumable). ``python -m minirl.interop``
prints every preset's TRL and verl settings."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main_job(algo: str = "grpo", profile: str | None = None, seed: int = 0, steps: int | None = None,
             out: str | Path = "runs/grpo", *, warm_start_seed: int = 0, **overrides) -> dict:
    """Load the warm start (the shipped one for the cpu profile's seed 0, else train it), evaluate, train with
    ``algo``, evaluate again, and write metrics and a plot. ``seed`` is the RL run's; ``warm_start_seed`` picks the
    starting model, so changing the one does not silently change the other.

    Writes under ``out``: metrics.jsonl (one row per step), summary.json (before/after figures) and
    curves.png (the standard learning curves).

    Returns:
        The summary dict.
    """
    from . import tasks
    from .config import make_config, resolve_profile
    from .plots import plot_history
    from .rl import train_rl
    from .warm_start import warm_start

    t0 = time.time()
    prof = resolve_profile(profile)
    model, tokenizer, info = warm_start(prof, seed=warm_start_seed)
    t_warm = time.time() - t0
    test = tasks.load_split("test")
    test = test.select(range(min(prof.eval_size, len(test))))
    cfg = make_config(algo, seed=seed, steps=steps or prof.rl_steps, prompts_per_step=prof.prompts_per_step,
                      group_size=prof.group_size, max_new_tokens=prof.max_new_tokens,
                      **{"eval_samples_per_prompt": 4, "eval_every": 50, **overrides})  # 4 samples: less eval noise
    history = train_rl(model, tokenizer, cfg, tasks.load_split("train"), eval_data=test)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    history.to_jsonl(out / "metrics.jsonl")
    first, last = history.rows[0], history.rows[-1]
    summary = {
        "algo": algo, "profile": prof.name, "seed": seed, "warm_start_seed": warm_start_seed, "steps": cfg.steps,
        **{when: {"sampled_accuracy": r["eval_accuracy"],
                  "sampled_accuracy_stderr": r["eval_accuracy_stderr_prompts"],  # over prompts: 4 samples each
                  "greedy_accuracy": r["eval_greedy_accuracy"]} for when, r in (("before", first), ("after", last))},
        "warm_start_seconds": round(t_warm, 1), "total_seconds": round(time.time() - t0, 1),
        "parameters": info["parameters"], "temperature": cfg.temperature,
        "warm_start_heldout": info["heldout"],  # the shared evaluation every notebook quotes (warm_start.py)
        "eval": f"{len(test)} held-out prompts, {cfg.eval_samples_per_prompt} samples each at T={cfg.temperature}; "
                f"greedy: 1 each",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    fig = plot_history(history, title=f"{algo} on the running-sums task ({prof.name} profile, seed {seed})")
    fig.savefig(out / "curves.png", dpi=110, bbox_inches="tight")
    return summary


def main(argv: list[str] | None = None) -> int:
    from .config import ALGORITHMS, PROFILES

    parser = argparse.ArgumentParser(prog="python -m minirl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="warm-start a tiny model, evaluate, train with RL, evaluate again")
    train.add_argument("--algo", default="grpo", choices=sorted(ALGORITHMS), help="algorithm preset (default grpo)")
    train.add_argument("--profile", default=None, choices=sorted(PROFILES),
                       help="cpu or gpu (default: MINIRL_PROFILE, else gpu if CUDA is available, else cpu)")
    train.add_argument("--seed", type=int, default=0, help="seed of the RL run: prompts, sampling (default 0)")
    train.add_argument("--warm-start-seed", type=int, default=0,
                       help="seed of the starting model (default 0: the shipped warm start of the cpu profile; "
                            "others are trained and cached)")
    train.add_argument("--steps", type=int, default=None, help="RL steps (default: the profile's)")
    train.add_argument("--out", default=None, help="output folder (default runs/<algo>)")
    bench = sub.add_parser("bench", help="time one RL step (generate / log-probs / backward / optimiser)")
    bench.add_argument("--profile", default=None, choices=sorted(PROFILES),
                       help="model sizes and batch (default: gpu if CUDA is available, else cpu)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random-weight models and prompts (default 0)")
    bench.add_argument("--repeats", type=int, default=5, help="timed steps per model (default 5)")
    bench.add_argument("--vs-trl", action="store_true",
                       help="time one GRPO step of minirl and of TRL's GRPOTrainer on identical work, alternating "
                            "the two, and print the ratio with its spread (needs the [trl] extra)")
    sweep = sub.add_parser("sweep", help="run a grid of arms x seeds from a sweep spec (JSON), resumable, and "
                                         "store every run's History and a summary over seeds beside the spec")
    sweep.add_argument("spec", help="a sweep spec, e.g. notebooks/results/kl_placements/sweep.json")
    sweep.add_argument("--out", default=None, help="output folder (default: the spec's folder)")
    args = parser.parse_args(argv)

    if args.command == "sweep":
        from .sweep import run_sweep

        summary = run_sweep(args.spec, args.out)
        print(json.dumps({k: v for k, v in summary.items() if k not in ("arms", "spec")}, indent=1))
        return 0

    if args.command == "train":
        from .warm_start import describe_heldout

        out = args.out or f"runs/{args.algo}"
        summary = main_job(args.algo, args.profile, args.seed, args.steps, out, warm_start_seed=args.warm_start_seed)
        b, a = summary["before"], summary["after"]
        print(f"\n{args.algo} on the {summary['profile']} profile, seed {args.seed}, {summary['steps']} steps, "
              f"{summary['total_seconds']} s in all (warm start {summary['warm_start_seconds']} s)")
        print(f"held-out accuracy, sampled at T={summary['temperature']}: "
              f"{b['sampled_accuracy']:.3f} +- {b['sampled_accuracy_stderr']:.3f} -> "
              f"{a['sampled_accuracy']:.3f} +- {a['sampled_accuracy_stderr']:.3f} (standard errors over prompts)")
        print(f"held-out accuracy, greedy:             {b['greedy_accuracy']:.3f} -> {a['greedy_accuracy']:.3f}")
        print(describe_heldout({"heldout": summary["warm_start_heldout"]}) + " (the shared evaluation)")
        print(f"wrote {out}/metrics.jsonl, {out}/summary.json and {out}/curves.png")
        return 0
    if args.vs_trl:
        from .bench import run_vs_trl

        print(json.dumps(run_vs_trl(args.seed, args.repeats), indent=2))
        return 0
    from .bench import run_bench

    print(json.dumps(run_bench(args.profile, args.seed, args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
