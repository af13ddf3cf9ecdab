"""Label noise over seeds: ``python notebooks/results/preference_noise.py`` writes preference_noise.json.

Notebook 08, section 4, repeated over seeds with a clean-data control: DPO, cDPO (label smoothing 0.3) and IPO
(tau 0.1, summed log-probs) trained on 64 pairs of the model's own samples, with 0% or 30% of the pairs flipped,
at 08's settings (60 steps of 16 pairs, lr 1e-4: 15 passes). Every run starts from the shipped cpu warm start
(seed 0); the seed picks the sampled pairs, the flipped ones, the batch order and the evaluation's samples, exactly
as 08's SEED does, so 08's live run with SEED = s repeats this file's seed s.

Per arm and seed: the implicit margin h (nats, labelled chosen minus labelled rejected, against the frozen warm
start) on the clean pairs and on the flip set (the pairs the 30% arm flips; at 0% the same pairs with their true
labels), every 10 steps; the share of flip-set pairs with h > 0; the share of 128 unseen pairs (true labels) the
policy ranks correctly and their mean margin; held-out task accuracy (256 test prompts, one sample each at T = 1,
and greedy) before and after.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from minirl import evaluation, preference_data, preference_loop, tasks
from minirl.warm_start import warm_start

SEEDS = (0, 1, 2)
NOISES = (0.0, 0.3)
METHODS = {  # 08's NOISE_METHODS
    "DPO": dict(method="dpo", beta=0.1),
    "cDPO": dict(method="dpo", beta=0.1, label_smoothing=0.3),
    "IPO": dict(method="ipo", tau=0.1, reduction="sum"),
}
N_PROMPTS, GROUP_SIZE, MAX_NEW_TOKENS, EVAL_SIZE = 256, 8, 40, 256  # 08's cpu profile
PAIRS_USED, BATCH, STEPS, LR, EVERY = 64, 16, 60, 1e-4, 10
UNSEEN = 128  # pairs after the first 64, never trained on
WEIGHTS: set[str] = set()  # sha256 of the warm start's weights, so a notebook can tell it starts from the same model


@torch.no_grad()
def summed_logps(model, enc):
    was = model.training
    out = preference_loop.reference_logps(model.eval(), enc).cpu()  # (N,) nats, summed over tokens
    model.train(was)
    return out


def margins(model, enc, ref):
    r = summed_logps(model, enc) - ref
    n = len(r) // 2
    return r[:n] - r[n:]  # (N,) labelled chosen minus labelled rejected


def held_out(model, tok, heldout, seed):
    sampled = evaluation.evaluate(model, tok, heldout, MAX_NEW_TOKENS, temperature=1.0, seed=seed)
    greedy = evaluation.evaluate(model, tok, heldout, MAX_NEW_TOKENS, greedy=True)
    return {"sampled": sampled["accuracy"], "greedy": greedy["accuracy"]}


def encode(tok, pairs):
    return preference_loop.encode_completions(tok, list(pairs["prompt"]) * 2,
                                              list(pairs["chosen"]) + list(pairs["rejected"]))


def run_seed(seed: int) -> list[dict]:
    base, tok, info = warm_start("cpu", seed=0, progress=False)
    WEIGHTS.add(info["sha256"]["model.safetensors"])
    heldout = tasks.load_split("test").select(range(EVAL_SIZE))
    pairs, _, _ = preference_data.sample_preference_data(base, tok, tasks.load_split("train"), n_prompts=N_PROMPTS,
                                                         group_size=GROUP_SIZE, max_new_tokens=MAX_NEW_TOKENS,
                                                         seed=seed)
    train = pairs.select(range(PAIRS_USED))
    unseen = pairs.select(range(PAIRS_USED, min(PAIRS_USED + UNSEEN, len(pairs))))
    flip_set = torch.tensor(preference_data.flip_pairs(train, 0.3, seed=seed)["flipped"])
    unseen_enc = encode(tok, unseen)
    unseen_ref = summed_logps(base, unseen_enc)
    before = held_out(base, tok, heldout, seed)
    rows = []
    for noise in NOISES:
        data = preference_data.flip_pairs(train, noise, seed=seed)
        enc = encode(tok, data)
        ref = summed_logps(base, enc)
        for name, kw in METHODS.items():
            t0 = time.time()
            model = warm_start("cpu", seed=0, progress=False)[0]
            track = [(0, 0.0, 0.0)]

            def cb(step, row, model=model, track=track, enc=enc, ref=ref):
                if step % EVERY == 0:
                    h = margins(model, enc, ref)
                    track.append((step, h[~flip_set].mean().item(), h[flip_set].mean().item()))

            cfg = preference_loop.PrefConfig(**kw, lr=LR, steps=STEPS, seed=seed, progress=False, batch_size=BATCH)
            preference_loop.train_preference(model, tok, data, cfg, callback=cb)
            h = margins(model, enc, ref)
            hu = margins(model, unseen_enc, unseen_ref)
            row = {"method": name, "noise": noise, "seed": seed,
                   "margin_clean": h[~flip_set].mean().item(), "margin_flip_set": h[flip_set].mean().item(),
                   "flip_set_positive": (h[flip_set] > 0).float().mean().item(),
                   "growth_last_20_steps": sum(track[-1][1:]) / 2 - sum(track[-3][1:]) / 2,
                   "unseen_pair_accuracy": (hu > 0).float().mean().item(), "unseen_margin": hu.mean().item(),
                   "heldout_before": before, "heldout_after": held_out(model, tok, heldout, seed),
                   "track": track, "seconds": round(time.time() - t0, 1)}
            rows.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                              if k != "track"}), flush=True)
    return rows


def main() -> None:
    t0 = time.time()
    runs = [row for seed in SEEDS for row in run_seed(seed)]
    keys = ("margin_clean", "margin_flip_set", "flip_set_positive", "growth_last_20_steps", "unseen_pair_accuracy",
            "unseen_margin")
    summary = []
    for noise in NOISES:
        for name in METHODS:
            arm = [r for r in runs if r["method"] == name and r["noise"] == noise]
            s = {k: statistics.mean(r[k] for r in arm) for k in keys}
            for split in ("sampled", "greedy"):
                s[f"heldout_{split}_after"] = statistics.mean(r["heldout_after"][split] for r in arm)
                s[f"heldout_{split}_change"] = statistics.mean(r["heldout_after"][split] - r["heldout_before"][split]
                                                               for r in arm)
            summary.append({"method": name, "noise": noise, **s})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"command": "python notebooks/results/preference_noise.py", "commit": commit,  # run at OMP_NUM_THREADS=1
           "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "seeds": list(SEEDS), "noises": list(NOISES),
           "settings": {"pairs": PAIRS_USED, "batch": BATCH, "steps": STEPS, "lr": LR, "unseen_pairs": UNSEEN,
                        "eval_prompts": EVAL_SIZE, "methods": METHODS, "warm_start": "cpu, seed 0"},
           "warm_start_sha256": WEIGHTS.pop() if len(WEIGHTS) == 1 else None,
           "wall_seconds": round(time.time() - t0, 1), "summary": summary, "runs": runs}
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
