"""Single-turn GRPO against multi-turn GRPO with the retry environment: writes multiturn_retry.json and the runs'
histories (multiturn_retry/<arm>__s<seed>.jsonl) beside this file.

``python notebooks/results/multiturn_retry.py`` from the repository root (``--seed S`` runs one seed and keeps the
others). Every run starts from the shipped dense warm start: GRPO at beta 0, 8 prompts x 8 samples a step, 2
minibatches, lr 1e-4, 40 tokens a turn. Arms:

- "single-turn": 30 steps, one turn scored by the task's reward (today's loop);
- "multi-turn": 30 steps of episodes with ``RetryEnv(max_turns=3, decay=0.5, hint=True)``: a wrong answer gets the
  problem again with the correct partial sums up to its first wrong one; reward 1, 0.5, 0.25 by the turn it is solved;
- "multi-turn, observations in the loss": the same with ``mask_observations=False`` (the positive control: the
  environment's tokens trained on, with the episode's advantage);
- "single-turn, matched tokens": single-turn run for as many steps as give the multi-turn run's model tokens (30 x the
  ratio of the two runs' model tokens, same seed), so the two are compared at matched model tokens.

Every run is evaluated before and after (and every 10 steps) on the first 128 held-out prompts x 2 samples as
episodes of the same retry environment: ``first_try_accuracy`` (solved on the first turn: the single-turn accuracy)
and ``final_accuracy`` (solved within 3 turns).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from minirl import multiturn, rl, tasks
from minirl.config import make_config
from minirl.warm_start import warm_start

OUT = Path(__file__).with_suffix(".json")
RUNS = Path(__file__).with_suffix("")
SEEDS = (0, 1, 2)
BASE = dict(steps=30, prompts_per_step=8, group_size=8, max_new_tokens=40, lr=1e-4, num_minibatches=2, beta=0.0,
            eval_every=10, eval_samples_per_prompt=2, progress=False)
ENV = dict(max_turns=3, decay=0.5, hint=True)
EVAL_PROMPTS = 128


def env_factory():
    return multiturn.RetryEnv(**ENV)


def run(arm: str, seed: int, steps: int, test, train) -> dict:
    """One run: its History's rows (every row has the step's model tokens), written to RUNS/<arm>__s<seed>.jsonl."""
    t0 = time.time()
    model, tok, _ = warm_start("cpu", seed=0, progress=False)
    multi = arm.startswith("multi-turn")
    cfg = make_config("grpo", **{**BASE, "steps": steps, "seed": seed, "max_turns": ENV["max_turns"] if multi else 1,
                                 "mask_observations": "observations in the loss" not in arm})
    evals = {}

    def evaluate(step, row=None):  # the episodes' evaluation, for every arm alike (the single-turn arms too)
        if step == 0 or step == steps or step % BASE["eval_every"] == 0:
            evals[step] = multiturn.evaluate_episodes(model, tok, test, env_factory, BASE["max_new_tokens"],
                                                      max_turns=ENV["max_turns"], samples_per_prompt=2, seed=0)

    evaluate(0)
    history = rl.train_rl(model, tok, cfg, train, env_factory=env_factory if multi else None, callback=evaluate)
    rows = [{k: v for k, v in r.items() if not k.startswith("rewards/")} for r in history.rows]
    tokens = sum(r["completion_length"] * BASE["prompts_per_step"] * BASE["group_size"] for r in rows)
    RUNS.mkdir(exist_ok=True)
    path = RUNS / f"{arm.replace(' ', '_').replace(',', '')}__s{seed}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"arm": arm, "seed": seed, "steps": steps, "model_tokens": tokens, "evals": evals,
            "seconds": round(time.time() - t0, 1), "history": path.name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, action="append", help="run only these seeds (default 0, 1, 2)")
    seeds = parser.parse_args().seed or SEEDS
    torch.set_num_threads(1)
    out = json.loads(OUT.read_text()) if OUT.exists() else {"runs": []}
    runs = {(r["arm"], r["seed"]): r for r in out["runs"]}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out.update(command="python notebooks/results/multiturn_retry.py", commit=commit, base=BASE, env=ENV,
               eval_prompts=EVAL_PROMPTS)
    test, train = tasks.load_split("test").select(range(EVAL_PROMPTS)), tasks.load_split("train")
    for seed in seeds:
        for arm in ("single-turn", "multi-turn", "multi-turn, observations in the loss"):
            runs[arm, seed] = {**run(arm, seed, BASE["steps"], test, train), "commit": commit}
        ratio = runs["multi-turn", seed]["model_tokens"] / runs["single-turn", seed]["model_tokens"]
        runs["single-turn, matched tokens", seed] = {
            **run("single-turn, matched tokens", seed, round(BASE["steps"] * ratio), test, train), "commit": commit}
        out["runs"] = [runs[k] for k in sorted(runs, key=lambda k: (k[1], k[0]))]
        OUT.write_text(json.dumps(out, indent=1) + "\n")
        for arm in ("single-turn", "multi-turn", "multi-turn, observations in the loss", "single-turn, matched tokens"):
            r = runs[arm, seed]
            end = r["evals"][max(r["evals"], key=int)]
            print(f"seed {seed} {arm:<38} steps {r['steps']:>3} tokens {r['model_tokens']:>8.0f} first try "
                  f"{r['evals'][0]['first_try_accuracy']:.3f} -> {end['first_try_accuracy']:.3f}, final "
                  f"{r['evals'][0]['final_accuracy']:.3f} -> {end['final_accuracy']:.3f}  ({r['seconds']} s)")


if __name__ == "__main__":
    main()
