"""Regenerate the shipped task data: `python data/make_data.py` writes data/train.jsonl and data/test.jsonl.

The task ("running sums") asks for the sum of 2 to 5 single-digit numbers. The reference completion is a short
worked scratchpad, one partial sum per step, then the final answer after '#':

    prompt:     "7+5+9="
    completion: "7+5=12;12+9=21#21"

so completions range from 6 to 34 tokens (EOS included) and length effects (truncation, Dr. GRPO's length bias,
DAPO's overlong shaping) are visible. A fixed seed makes the files byte-for-byte reproducible; the test split
holds out whole prompts (no prompt of the test split occurs in the train split).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 1234
N_TRAIN = 4000
N_TEST = 256
MIN_TERMS, MAX_TERMS = 2, 5


def scratchpad(terms: list[int]) -> str:
    """The reference completion: running partial sums, then '#' and the answer."""
    steps, total = [], terms[0]
    for t in terms[1:]:
        steps.append(f"{total}+{t}={total + t}")
        total += t
    return ";".join(steps) + f"#{total}"


def make_example(rng: random.Random) -> dict:
    n = rng.randint(MIN_TERMS, MAX_TERMS)
    terms = [rng.randint(1, 9) for _ in range(n)]
    return {"prompt": "+".join(map(str, terms)) + "=", "completion": scratchpad(terms), "answer": str(sum(terms))}


def main(out_dir: Path = Path(__file__).parent) -> None:
    rng = random.Random(SEED)
    test, seen = [], set()
    while len(test) < N_TEST:
        ex = make_example(rng)
        if ex["prompt"] not in seen:
            seen.add(ex["prompt"])
            test.append(ex)
    train = []
    while len(train) < N_TRAIN:
        ex = make_example(rng)
        if ex["prompt"] not in seen:  # held-out prompts never appear in training
            train.append(ex)
    for name, rows in (("train", train), ("test", test)):
        with open(out_dir / f"{name}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"wrote {len(rows)} examples to data/{name}.jsonl")


if __name__ == "__main__":
    main()
