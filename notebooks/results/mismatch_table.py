"""The sampler/trainer mismatch, measured: ``python notebooks/results/mismatch_table.py`` writes mismatch_table.json.

For the shipped warm starts (dense and MoE, cpu profile, seed 0) and each sampler setting (a bfloat16 copy, a
float16 copy, and noise of growing size on the final logits or, for the MoE, on the router logits): one rollout of
16 prompts x 8 samples from the sampler, then pi_old recomputed by the float32 trainer on the same tokens. Per
setting and rollout seed: the token log-ratio log pi_old - log mu (mean |.|, max |.|, variance over valid tokens),
the sequence log-ratio as a product (sum over the tokens) and as a geometric mean (per-token mean), and for the MoE
the share of (token, layer) expert choices that differ between the sampler's decoding and the trainer's forward.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from minirl import decoding, moe, rollout, tasks
from minirl.inference_engine import make_sampler
from minirl.warm_start import warm_start

SETTINGS = {
    "dense": [dict(dtype="bfloat16"), dict(dtype="float16"), dict(logit_noise=0.1), dict(logit_noise=0.3),
              dict(logit_noise=1.0)],
    "moe": [dict(dtype="bfloat16"), dict(dtype="float16"), dict(router_noise=0.1), dict(router_noise=0.3),
            dict(router_noise=1.0), dict(logit_noise=0.3)],
}
SEEDS = (0, 1, 2)


def measure(model, tok, prompts, setting: dict, seed: int, is_moe: bool) -> dict:
    sampler = make_sampler(model, seed=seed, **setting)
    torch.manual_seed(seed)
    r = decoding.generate(sampler, tok, prompts, 8, 40, recompute_logprobs=False, record_sampler_routes=is_moe)
    with torch.no_grad(), (moe.record_routing(model) if is_moe else torch.no_grad()) as own:
        old = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens)
    mask = r.completion_mask
    log_r = (old - r.sampler_logprobs) * mask  # (B, T)
    valid = log_r[mask > 0]
    seq_sum = log_r.sum(-1)
    seq_mean = seq_sum / mask.sum(-1)
    out = {"token_abs_mean": float(valid.abs().mean()), "token_abs_max": float(valid.abs().max()),
           "token_var": float(valid.var()), "seq_product_abs_mean": float(seq_sum.abs().mean()),
           "seq_product_abs_max": float(seq_sum.abs().max()), "seq_geomean_abs_mean": float(seq_mean.abs().mean()),
           "seq_geomean_abs_max": float(seq_mean.abs().max())}
    if is_moe:
        fed = r.attention_mask.clone()
        fed[:, -1] = 0  # the last position is never fed to the sampler
        out["routing_gap"] = moe.routing_change_fraction(own, r.sampler_routes, fed)
    return out


def main() -> None:
    t0 = time.time()
    prompts = list(tasks.load_split("train").select(range(16))["prompt"])
    rows = []
    for kind, settings in SETTINGS.items():
        model, tok, _ = warm_start("cpu", seed=0, moe=kind == "moe", progress=False)
        model.eval()
        for setting in settings:
            per_seed = [measure(model, tok, prompts, setting, s, kind == "moe") for s in SEEDS]
            summary = {k: {"mean": statistics.mean(d[k] for d in per_seed), "min": min(d[k] for d in per_seed),
                           "max": max(d[k] for d in per_seed)} for k in per_seed[0]}
            rows.append({"model": kind, "sampler": setting, "per_seed": per_seed, "summary": summary})
            print(kind, setting, {k: round(v["mean"], 5) for k, v in summary.items()}, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"command": "python notebooks/results/mismatch_table.py", "commit": commit,  # run at OMP_NUM_THREADS=1
           "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "torch": torch.__version__, "seeds": list(SEEDS), "rollout": "16 prompts x 8 samples, 40 new tokens",
           "wall_seconds": round(time.time() - t0, 1), "rows": rows}
    Path(__file__).with_suffix(".json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
