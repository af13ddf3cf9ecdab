"""The same GRPO run with minirl and with TRL's GRPOTrainer, over several seeds; writes trl_vs_minirl.json.

Both start from the warm-started tiny model of the cpu profile (``warm_start(profile, seed=0)``, saved with
``save_pretrained`` and loaded with ``models.load``), train on the running-sums task with ``to_trl(cfg)`` /
``cfg``, the same budget (STEPS rollouts of PROMPTS x G completions, one optimiser step each) and seed, and are
evaluated on the same held-out prompts. Notebook 10 imports ``run_pair`` from here and reruns one seed live.

Command (from the repository root): python notebooks/results/trl_vs_minirl.py
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from minirl import evaluation, interop, models, rl, tasks  # noqa: E402
from minirl.config import make_config, resolve_profile  # noqa: E402
from minirl.warm_start import warm_start  # noqa: E402

STEPS, PROMPTS, G, EVAL_PROMPTS, SEEDS = 12, 4, 8, 64, (0, 1, 2)


def settings(seed: int):
    return make_config("grpo", seed=seed, steps=STEPS, prompts_per_step=PROMPTS, group_size=G, num_minibatches=1,
                       max_new_tokens=40, progress=False)


def held_out_accuracy(model, tokenizer, test, cfg) -> float:
    """Mean reward of 4 samples per held-out prompt at the training temperature (seeded)."""
    return float(evaluation.evaluate(model, tokenizer, test, cfg.max_new_tokens, temperature=cfg.temperature,
                                     samples_per_prompt=4)["accuracy"])


def run_pair(seed: int, ckpt: str, tokenizer, train, test) -> dict:
    """minirl's train_rl and TRL's GRPOTrainer from the checkpoint ``ckpt``, same config and seed."""
    from trl import GRPOTrainer

    cfg = settings(seed)
    out = {"seed": seed}
    t0 = time.time()
    model = models.load(ckpt)
    hist = rl.train_rl(model, tokenizer, cfg, train)
    out["minirl_reward"] = [r["score"] for r in hist.rows]
    out["minirl_eval"] = held_out_accuracy(model, tokenizer, test, cfg)
    out["minirl_seconds"] = round(time.time() - t0, 1)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        args = interop.to_trl(cfg, output_dir=tmp, report_to="none", use_cpu=True, logging_steps=1,
                              save_strategy="no", disable_tqdm=True)
        trainer = GRPOTrainer(model=models.load(ckpt), reward_funcs=tasks.running_sums_reward, args=args,
                              train_dataset=train.remove_columns("completion"), processing_class=tokenizer)
        trainer.train()
    out["trl_reward"] = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    out["trl_eval"] = held_out_accuracy(trainer.model, tokenizer, test, cfg)
    out["trl_seconds"] = round(time.time() - t0, 1)
    return out


def setup():
    """The warm-started model saved to a local checkpoint, the tokenizer, the train split and held-out prompts."""
    profile = resolve_profile("cpu")
    model, tokenizer, _ = warm_start(profile, seed=0, progress=False)
    ckpt = tempfile.mkdtemp(prefix="minirl-07-")
    model.save_pretrained(ckpt)
    tokenizer.save_pretrained(ckpt)
    test = tasks.load_split("test")
    return ckpt, tokenizer, tasks.load_split("train"), test.select(range(EVAL_PROMPTS))


if __name__ == "__main__":
    t0 = time.time()
    ckpt, tokenizer, train, test = setup()
    runs = [run_pair(s, ckpt, tokenizer, train, test) for s in SEEDS]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"command": "python notebooks/results/trl_vs_minirl.py", "commit": commit,
              "wall_seconds": round(time.time() - t0, 1), "loadavg_after": open("/proc/loadavg").read().split()[:3],
              "steps": STEPS, "prompts_per_step": PROMPTS, "group_size": G, "eval_prompts": EVAL_PROMPTS,
              "runs": runs}
    Path(__file__).with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}), file=sys.stderr)
