"""Over-optimisation of a learned reward, measured with the task's exact gold reward: writes one JSON per seed into
``reward_overoptimisation/`` beside this file (``seed<S>.json``).

``python notebooks/results/reward_overoptimisation.py --seed S`` from the repository root (one seed, about 15 minutes
at one thread on 2 cores; the three seeds were run side by side, one thread each). Every seed starts from the shipped
dense warm start and:

1. samples 8 completions of each of 2,048 training prompts and pairs a right one with a wrong one (up to 2 pairs a
   prompt; ``reward_model_loop.gold_pairs``); held-out pairs come from 256 other training prompts;
2. trains Bradley-Terry reward models (``models.ValueModel``, the warm start's backbone and a scalar head, 400 steps of
   32 pairs, lr 1e-4): "small" on the first quarter of the pairs, "large" on all of them, and two more on all of them
   with other seeds, the three "large" ones forming a conservative ensemble (the minimum of the three scores);
3. trains an outcome and a process model on the same 4,096 gold-labelled completions of 512 training prompts (400
   steps of 32, lr 1e-4): matched samples, one label per completion against one per partial sum;
4. best-of-n on 128 held-out prompts for n = 1, 2, 4, 8, 16, 32 against each proxy (d = sqrt(log n - (n - 1)/n));
5. GRPO (40 steps of 8 prompts x 8, lr 5e-5, 2 minibatches, beta 0 unless named) against the proxies "small",
   "large", "large" with a KL penalty (beta 0.1, k3 in the loss), the ensemble, the process and the outcome models,
   and against the gold reward itself (the positive control: RL that is not fooled). Every 4 steps: 64 held-out
   prompts x 4 fresh samples, their gold reward, proxy score and true KL to the warm start
   (``reward_model_loop.proxy_and_gold``).

``--add-arm outcome`` runs one RL arm and adds it to an existing ``seed<S>.json`` (training only the reward model it
needs, as the full run trains it; recorded under "additions" with its own command, commit and time): the stored seeds
were run without the outcome arm first.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import time
from pathlib import Path

import torch

from minirl import models, rl, tasks
from minirl import reward_model_loop as rml
from minirl.config import make_config
from minirl.reward_models import ensemble_reward, learned_reward
from minirl.warm_start import warm_start

OUT = Path(__file__).with_suffix("")
PAIR_PROMPTS, HELD_PROMPTS, LABELLED_PROMPTS, BON_PROMPTS, PROBE_PROMPTS = 2048, 256, 512, 128, 64
RM = dict(steps=400, batch_size=32, lr=1e-4)
NS = [1, 2, 4, 8, 16, 32]
RL = dict(steps=40, prompts_per_step=8, group_size=8, max_new_tokens=40, lr=5e-5, num_minibatches=2, beta=0.0,
          progress=False)
PROBE_EVERY, PROBE_SAMPLES = 4, 4
ARMS = {"small": {}, "large": {}, "large_kl": dict(beta=0.1), "ensemble_min": {}, "process": {}, "gold": {},
        "outcome": {}}


def reward_model(policy, seed: int):
    torch.manual_seed(seed)  # the head's initialisation
    return models.ValueModel(policy)


def probe_callback(points: list, model, start, tok, probe, proxy, seed: int):
    """A ``train_rl`` callback that appends, every PROBE_EVERY steps, where ``model`` stands (gold, proxy, d)."""

    def measure(step: int, row: dict | None = None) -> None:
        if step % PROBE_EVERY == 0:
            points.append({"step": step, **rml.proxy_and_gold(model, start, tok, probe, proxy,
                                                                samples_per_prompt=PROBE_SAMPLES, seed=seed)})

    return measure


def labelled_models(policy, tok, train, seed: int, kinds=("outcome", "process")) -> dict:
    """The outcome and process models, trained on the same gold-labelled completions (matched samples)."""
    labelled = rml.gold_labelled(policy, tok, train.select(range(LABELLED_PROMPTS)), seed=seed + 200)
    proxies = {}
    for kind in kinds:
        model = reward_model(policy, 10 * seed + 5)
        rml.train_labelled(model, tok, labelled, kind=kind, **RM, seed=10 * seed + 5)
        proxies[kind] = learned_reward(model, tok) if kind == "outcome" else rml.process_reward(model, tok)
    return proxies, {"completions": len(labelled), "right": sum(labelled.outcome)}


def run_arm(arm: str, policy, tok, train, test, proxies: dict, seed: int) -> dict:
    """GRPO from ``policy`` against the arm's reward, probed every PROBE_EVERY steps."""
    t_arm = time.time()
    model, start = copy.deepcopy(policy), copy.deepcopy(policy).eval()
    proxy = proxies["large" if arm in ("large_kl", "gold") else arm]  # the gold arm is measured by "large"
    points = []
    measure = probe_callback(points, model, start, tok, test.select(range(PROBE_PROMPTS)), proxy, seed)
    measure(0)
    cfg = make_config("grpo", **{**RL, **ARMS[arm]}, seed=seed)
    rl.train_rl(model, tok, cfg, train, reward_fn=None if arm == "gold" else proxy, callback=measure)
    print(arm, [(p["step"], round(p["d"], 2), round(p["gold"], 3), round(p["proxy"], 2)) for p in points],
          flush=True)
    return {"points": points, "seconds": round(time.time() - t_arm, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--add-arm", choices=["outcome"], help="add one RL arm to an existing seed<S>.json")
    args = parser.parse_args()
    seed, t0 = args.seed, time.time()
    torch.set_num_threads(1)
    train, test = tasks.load_split("train"), tasks.load_split("test")
    policy, tok, _ = warm_start("cpu", seed=0, progress=False)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    command = f"python notebooks/results/reward_overoptimisation.py --seed {seed}"
    if args.add_arm:
        path = OUT / f"seed{seed}.json"
        out = json.loads(path.read_text())
        proxies, _ = labelled_models(policy, tok, train, seed, kinds=(args.add_arm,))
        out["rl"][args.add_arm] = run_arm(args.add_arm, policy, tok, train, test, proxies, seed)
        out["arms"] = ARMS
        out.setdefault("additions", []).append({"command": f"{command} --add-arm {args.add_arm}", "commit": commit,
                                                "seconds": round(time.time() - t0, 1)})
        path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
        return
    out = {"command": command, "commit": commit, "seed": seed, "rm": RM, "rl": RL, "ns": NS, "arms": ARMS}

    pairs = rml.gold_pairs(policy, tok, train.select(range(PAIR_PROMPTS)), seed=seed)
    held = rml.gold_pairs(policy, tok, train.select(range(3000, 3000 + HELD_PROMPTS)), seed=seed + 100)
    q = len(pairs) // 4
    quarter = rml.Pairs(pairs.chosen[:q], pairs.rejected[:q], pairs.flipped[:q])
    proxies, accuracy = {}, {}
    members = (("small", quarter, 0), ("large", pairs, 0), ("large_2", pairs, 1), ("large_3", pairs, 2))
    for name, data, member in members:
        model = reward_model(policy, 10 * seed + member)
        rml.train_reward_model(model, tok, data, **RM, seed=10 * seed + member)
        proxies[name] = learned_reward(model, tok)
        accuracy[name] = {"pairs": len(data), "train": rml.pair_accuracy(model, tok, data),
                          "held_out": rml.pair_accuracy(model, tok, held)}
        print(name, accuracy[name], round(time.time() - t0), flush=True)
    proxies["ensemble_min"] = ensemble_reward([proxies[k] for k in ("large", "large_2", "large_3")], how="min")
    labelled_proxies, out["labelled"] = labelled_models(policy, tok, train, seed)
    proxies.update(labelled_proxies)
    out["reward_models"] = accuracy

    bon_data = test.select(range(BON_PROMPTS))
    out["best_of_n"] = {name: rml.best_of_n(policy, tok, bon_data, proxies[name], NS, seed=seed)
                        for name in ("small", "large", "ensemble_min", "outcome", "process")}
    print("best-of-n", {k: [round(r["gold"], 3) for r in v] for k, v in out["best_of_n"].items()}, flush=True)
    out["rl"] = {arm: run_arm(arm, policy, tok, train, test, proxies, seed) for arm in ARMS}
    out["seconds"] = round(time.time() - t0, 1)
    OUT.mkdir(exist_ok=True)
    (OUT / f"seed{seed}.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
