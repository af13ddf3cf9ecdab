"""GRPO on a real pretrained model: SmolLM2-135M-Instruct (``minirl.smollm2``, the Q4_1 weights dequantised to
float32) on generated one-step word problems (``minirl.word_problems``), by the library's own loop (``rl.train_rl``).

    python notebooks/results/smollm2_grpo.py --seed 0        # one seed: about 25 minutes on 2 CPU cores
    python notebooks/results/smollm2_grpo.py --seed 0 --minimal   # the same run with minirl/minimal/grpo.py

writes ``notebooks/results/smollm2_grpo/s<seed>.json`` (``minimal_s<seed>.json``): the settings, the held-out
evaluation before and after (answer accuracy sampled at the training temperature with its standard error over
prompts, greedy accuracy, format compliance, mean length, truncation), the per-step rows (reward, format
compliance, completion length), the command, commit, machine and wall time. The held-out problems are drawn from
another seed than the training ones and any question that also appears in training is dropped from training.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

import datasets
import torch
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minirl import gsm8k, models, smollm2, word_problems  # noqa: E402
from minirl.config import make_config  # noqa: E402
from minirl.decoding import generate  # noqa: E402

OUT = ROOT / "notebooks" / "results" / "smollm2_grpo"
#: The task and the run (results/README.md says how they were chosen): one-step problems with numbers up to 10,
#: where the model starts at about 20% sampled at T = 0.7 and 40% greedy; GRPO without a KL term (beta 0: no
#: reference copy), 4 prompts x 8 samples of at most 64 tokens, one optimiser step per batch (about 25 s a step).
TASK = dict(steps=1, max_number=10)
SETTINGS = dict(steps=45, prompts_per_step=4, group_size=8, max_new_tokens=64, temperature=0.7, lr=1e-5, beta=0.0,
                num_minibatches=1, generation_batch_size=32, completion_only_head=True, progress=True)
HELDOUT = dict(prompts=128, samples=2, seed=10_000)
TRAIN_ROWS, TRAIN_SEED = 2_000, 1


def data(tokenizer) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The training prompts and the held-out ones (as conversations: the model's chat template)."""
    held = word_problems.make(HELDOUT["prompts"], seed=HELDOUT["seed"], **TASK)
    seen = {r["question"] for r in held}
    train = [r for r in word_problems.make(TRAIN_ROWS, seed=TRAIN_SEED, **TASK) if r["question"] not in seen]
    return word_problems.as_dataset(train), word_problems.as_dataset(held)


@torch.no_grad()
def heldout(model, tokenizer, held: datasets.Dataset, *, seed: int) -> dict:
    """Answer accuracy sampled at the training temperature (``samples`` per prompt; standard error over prompts),
    greedy accuracy, and the sampled completions' format compliance (``#### N`` or ``\\boxed{N}``), length and
    truncation."""
    torch.manual_seed(seed)
    n, k, T = len(held), HELDOUT["samples"], SETTINGS["max_new_tokens"]
    out = {}
    for name, kw in (("sampled", dict(group_size=k, temperature=SETTINGS["temperature"])),
                     ("greedy", dict(group_size=1, greedy=True))):
        r = generate(model, tokenizer, held["prompt"], max_new_tokens=T, recompute_logprobs=False,
                     batch_size=SETTINGS["generation_batch_size"], **kw)
        g = kw["group_size"]
        answers = [a for a in held["answer"] for _ in range(g)]
        right = torch.tensor(gsm8k.answer_reward(None, r.completions, answers)).view(n, g)
        per_prompt = right.mean(1)
        out[name] = {"accuracy": round(float(right.mean()), 4),
                     "stderr": round(float(per_prompt.std(unbiased=True)) / math.sqrt(n), 4),
                     "format": round(sum(gsm8k.format_reward(r.completions)) / len(r.completions), 4),
                     "mean_length": round(float(r.completion_mask.sum(1).float().mean()), 1),
                     "truncated": round(float(r.truncated.float().mean()), 4),
                     "example": r.completions[0]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=SETTINGS["steps"])
    parser.add_argument("--minimal", action="store_true", help="train with minirl/minimal/grpo.py instead")
    parser.add_argument("--out", default=str(OUT),
                        help="folder for s<seed>.json (default notebooks/results/smollm2_grpo)")
    args = parser.parse_args()
    t0 = time.time()
    folder = smollm2.get()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU check runs it too (.ci/gpu_check.sh)
    model = models.load(str(folder), attn_implementation="sdpa").to(device)
    train, held = data(tokenizer)
    before = heldout(model, tokenizer, held, seed=args.seed)
    print("before", json.dumps({k: {m: v for m, v in d.items() if m != "example"} for k, d in before.items()}),
          flush=True)
    settings = {**SETTINGS, "steps": args.steps}
    t1 = time.time()
    if args.minimal:
        rows = train_minimal(model, tokenizer, train, settings, args.seed)
    else:
        from minirl.rl import train_rl

        cfg = make_config("grpo", seed=args.seed, **settings)
        history = train_rl(model, tokenizer, cfg, train, reward_fn=[gsm8k.answer_reward, gsm8k.format_reward],
                           reward_weights=[1.0, 0.0])  # format: logged, weight 0 (the reward is the answer)
        rows = [{k: r[k] for k in ("step", "reward", "rewards/format_reward/mean", "completion_length",
                                   "truncated_rate", "useful_groups", "entropy", "time") if k in r}
                for r in history.rows if "reward" in r]
    t_train = time.time() - t1
    after = heldout(model, tokenizer, held, seed=args.seed)
    print("after ", json.dumps({k: {m: v for m, v in d.items() if m != "example"} for k, d in after.items()}),
          flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    result = {"command": "python notebooks/results/smollm2_grpo.py " + " ".join(sys.argv[1:]), "commit": commit,
              "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
              "torch": torch.__version__, "seed": args.seed, "trainer": "minimal/grpo.py" if args.minimal else "rl",
              "task": TASK, "settings": settings, "heldout": HELDOUT, "train_rows": len(train),
              "before": before, "after": after, "rows": rows,
              "seconds": {"train": round(t_train, 1), "total": round(time.time() - t0, 1)}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{'minimal_' if args.minimal else ''}s{args.seed}.json"
    (out / name).write_text(json.dumps(result, indent=1))
    print(f"wrote {out / name}: sampled {before['sampled']['accuracy']:.3f} +- {before['sampled']['stderr']:.3f} -> "
          f"{after['sampled']['accuracy']:.3f} +- {after['sampled']['stderr']:.3f}, greedy "
          f"{before['greedy']['accuracy']:.3f} -> {after['greedy']['accuracy']:.3f}, {t_train:.0f} s training")


def train_minimal(model, tokenizer, train: datasets.Dataset, settings: dict, seed: int) -> list[dict]:
    """The same run with ``minirl/minimal/grpo.py``: its prompts are strings, so the chat template is rendered to
    text first (``apply_chat_template``, as its tokenizer call then adds no second BOS: SmolLM2's template starts
    with ``<|im_start|>``), and its reward (the toy's '#N') is replaced by this task's (``gsm8k.answer_reward``)."""
    from minirl.minimal import grpo as minimal

    minimal.reward = lambda completion, answer: gsm8k.answer_reward(None, [completion], [str(answer)])[0]
    args = minimal.Args(seed=seed, **{k: settings[k] for k in ("steps", "prompts_per_step", "group_size",
                                                                 "max_new_tokens", "temperature", "lr", "beta",
                                                                 "num_minibatches")},
                        device=str(next(model.parameters()).device))
    rows = [{"prompt": tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True), "answer": a}
            for p, a in zip(train["prompt"], train["answer"], strict=True)]
    return minimal.train(args, model, tokenizer, rows)


if __name__ == "__main__":
    main()
