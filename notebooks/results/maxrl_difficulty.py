"""MaxRL against GRPO on prompts of mixed difficulty: writes maxrl_difficulty.json beside this file.

``python notebooks/results/maxrl_difficulty.py`` from the repository root (about 8 minutes at one thread on 2 cores;
``--seed S`` runs one seed and keeps the others in the file; ``--start-only`` measures the warm start alone). Every
run starts from the shipped dense warm start and trains 40 steps of 8 prompts x 8 samples (GRPO's preset at beta 0,
2 minibatches, lr 1e-4) on the training split, whose prompts have 2 to 5 terms; the two arms differ only in the
advantage: GRPO's (r - mean) / std against MaxRL's (r - mean) / mean. After training, each of the 256 held-out
prompts is sampled 8 times (seed 0) and scored.

Difficulty is fixed before any run: the warm start's own accuracy on each held-out prompt from 16 samples at another
seed (1000), sorted; the hardest third is the 85 prompts with the lowest (ties broken by the prompt's order). The
file also holds the mechanism, measured on the warm start's 16 samples per prompt: the share of the total |advantage|
each estimator puts on the hardest third's groups (the positive control: where the two must differ).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from minirl import advantages, evaluation, rl, tasks
from minirl.config import make_config
from minirl.warm_start import warm_start

OUT = Path(__file__).with_suffix(".json")
SEEDS = (0, 1, 2)
BASE = dict(steps=40, prompts_per_step=8, group_size=8, max_new_tokens=40, lr=1e-4, num_minibatches=2, beta=0.0,
            progress=False)
ARMS = {"GRPO": dict(), "MaxRL": dict(advantage="maxrl", adv_scale="none")}
EVAL_SAMPLES, DIFFICULTY_SAMPLES = 8, 16


def per_prompt_scores(model, tok, data, samples: int, seed: int) -> torch.Tensor:
    """(N, samples) 0/1 scores of ``samples`` completions of each prompt of ``data``, in its order."""
    seen = []

    def recording(prompts, completions, answer, **kw):
        scores = tasks.running_sums_reward(prompts, completions, answer)
        seen.extend(scores)
        return scores

    evaluation.evaluate(model, tok, data, 40, samples_per_prompt=samples, seed=seed, reward_fn=recording)
    return torch.tensor(seen).view(len(data), samples)


def summary(s: torch.Tensor, hardest: list[int], test) -> dict:
    """Accuracy overall, on the hardest third, on the rest and by number of terms, from (256,) per-prompt means."""
    rest = [i for i in range(len(s)) if i not in set(hardest)]
    return {"accuracy": float(s.mean()), "accuracy_hardest": float(s[hardest].mean()),
            "accuracy_rest": float(s[rest].mean()),
            "accuracy_by_terms": {n: float(s[[i for i, q in enumerate(test["prompt"]) if q.count("+") + 1 == n]]
                                           .mean()) for n in (2, 3, 4, 5)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, action="append", help="run only these seeds (default 0, 1, 2)")
    parser.add_argument("--start-only", action="store_true", help="only measure the warm start as the runs are")
    args = parser.parse_args()
    seeds = () if args.start_only else (args.seed or SEEDS)
    out = json.loads(OUT.read_text()) if OUT.exists() else {"runs": []}
    runs = {(r["arm"], r["seed"]): r for r in out["runs"]}  # kept across --seed calls
    torch.set_num_threads(1)
    test, train = tasks.load_split("test"), tasks.load_split("train")
    model, tok, _ = warm_start("cpu", seed=0, progress=False)
    start = per_prompt_scores(model, tok, test, DIFFICULTY_SAMPLES, seed=1000)  # (256, 16)
    p = start.mean(1)
    order = sorted(range(len(p)), key=lambda i: (float(p[i]), i))
    hardest = sorted(order[: len(p) // 3])
    weight = {}
    for name, fn in (("GRPO", lambda r: advantages.group_advantages(r, DIFFICULTY_SAMPLES)),
                     ("MaxRL", lambda r: advantages.maxrl_advantages(r, group_size=DIFFICULTY_SAMPLES))):
        a = fn(start.flatten()).view_as(start).abs().sum(1)  # (256,) |A| summed over each prompt's group
        weight[name] = float(a[hardest].sum() / a.sum())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out.update(command="python notebooks/results/maxrl_difficulty.py", commit=commit, base=BASE, arms=ARMS,
               eval_samples=EVAL_SAMPLES, difficulty_samples=DIFFICULTY_SAMPLES, hardest=hardest,
               start_accuracy=float(p.mean()), start_accuracy_hardest=float(p[hardest].mean()),
               abs_advantage_share_on_hardest=weight)
    # the warm start measured as every run is after training (8 samples a prompt, seed 0): the "before" of each
    # column, free of the selection that made the hardest third hard (those prompts were picked at seed 1000)
    out["start_eval"] = summary(per_prompt_scores(model, tok, test, EVAL_SAMPLES, seed=0).mean(1), hardest, test)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for seed in seeds:
        for arm, switches in ARMS.items():
            t0 = time.time()
            model, tok, _ = warm_start("cpu", seed=0, progress=False)
            rl.train_rl(model, tok, make_config("grpo", **BASE, **switches, seed=seed), train)
            s = per_prompt_scores(model, tok, test, EVAL_SAMPLES, seed=0).mean(1)  # (256,)
            runs[arm, seed] = {"arm": arm, "seed": seed, **summary(s, hardest, test),
                               "seconds": round(time.time() - t0, 1), "commit": commit}
            out["runs"] = [runs[key] for key in sorted(runs, key=lambda k: (k[1], list(ARMS).index(k[0])))]
            OUT.write_text(json.dumps(out, indent=1) + "\n")
            print(arm, seed, runs[arm, seed])


if __name__ == "__main__":
    main()
