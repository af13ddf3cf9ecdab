"""Command line: ``python -m minirl train --algo grpo`` (the main job) and ``python -m minirl bench``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from .trainer import ALGORITHMS, PROFILES

    parser = argparse.ArgumentParser(prog="python -m minirl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="warm-start a tiny model, evaluate, train with RL, evaluate again")
    train.add_argument("--algo", default="grpo", choices=sorted(ALGORITHMS), help="algorithm preset (default grpo)")
    train.add_argument("--profile", default=None, choices=sorted(PROFILES),
                       help="cpu or gpu (default: MINIRL_PROFILE, else gpu if CUDA is available, else cpu)")
    train.add_argument("--seed", type=int, default=0, help="seed for everything (default 0)")
    train.add_argument("--steps", type=int, default=None, help="RL steps (default: the profile's)")
    train.add_argument("--out", default=None, help="output folder (default runs/<algo>)")
    bench = sub.add_parser("bench", help="time one RL step (generate / log-probs / backward / optimiser)")
    bench.add_argument("--profile", default=None, choices=sorted(PROFILES))
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--repeats", type=int, default=5, help="timed steps per model (default 5)")
    args = parser.parse_args(argv)

    if args.command == "train":
        from .trainer import main_job

        out = args.out or f"runs/{args.algo}"
        summary = main_job(args.algo, args.profile, args.seed, args.steps, out)
        b, a = summary["before"], summary["after"]
        print(f"\n{args.algo} on the {summary['profile']} profile, seed {args.seed}, {summary['steps']} steps, "
              f"{summary['total_seconds']} s in all (warm start {summary['warm_start_seconds']} s)")
        print(f"held-out accuracy, sampled at T={summary['temperature']}: "
              f"{b['sampled_accuracy']:.3f} -> {a['sampled_accuracy']:.3f}")
        print(f"held-out accuracy, greedy:             {b['greedy_accuracy']:.3f} -> {a['greedy_accuracy']:.3f}")
        print(f"wrote {out}/metrics.jsonl, {out}/summary.json and {out}/curves.png")
        return 0
    from .bench import run_bench

    print(json.dumps(run_bench(args.profile, args.seed, args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
