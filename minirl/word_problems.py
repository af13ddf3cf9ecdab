"""Generated arithmetic word problems with exact answers and a difficulty dial, in GSM8K's format.

For a real pretrained model (``smollm2``) the running-sums task is meaningless and GSM8K itself is too hard for a
135M model (it starts near 0%, and RL cannot learn from groups that are all wrong). These problems are GSM8K-shaped
("Mia has 4 bags with 6 marbles in each bag. How many marbles does she have?") and the dial sets how hard they
are: ``steps`` operations chained, numbers up to ``max_number``. Every answer is a whole number >= 0, computed
exactly. Rows are ``{"question", "answer"}`` with the answer as a worked solution ending ``#### N``, so
``gsm8k.to_prompts`` and ``gsm8k.answer_reward`` read them as they read GSM8K. The same seed gives the same rows.
"""

from __future__ import annotations

import random

NAMES = ("Mia", "Leo", "Ava", "Sam", "Zoe", "Ben", "Ivy", "Max", "Lily", "Omar", "Nora", "Tom")
THINGS = ("apples", "marbles", "stickers", "books", "coins", "shells", "pencils", "cards", "eggs", "stamps")


def _step(rng: random.Random, total: int, name: str, thing: str, max_number: int) -> tuple[str, str, int]:
    """One more sentence: an operation on the running total. Returns (sentence, worked line, new total)."""
    kinds = ["gets", "gives"] + (["doubles"] if total <= max_number else [])
    kind = rng.choice(kinds if total > 0 else ["gets"])
    if kind == "gets":
        n = rng.randint(1, max_number)
        return f"Then {name} gets {n} more {thing}.", f"{total} + {n} = {total + n}", total + n
    if kind == "gives":
        n = rng.randint(1, total)
        return f"Then {name} gives away {n} {thing}.", f"{total} - {n} = {total - n}", total - n
    return f"Then the number of {thing} doubles.", f"{total} * 2 = {2 * total}", 2 * total


def problem(rng: random.Random, *, steps: int = 1, max_number: int = 20) -> dict:
    """One word problem of ``steps`` operations after the starting amount (>= 1), numbers in [1, max_number].

    Steps 1 opens with one of three forms (two amounts added, one taken from another, groups times size); each
    further step adds, removes or doubles.

    Raises:
        ValueError: for steps < 1 or max_number < 2.
    """
    if steps < 1 or max_number < 2:
        raise ValueError(f"need steps >= 1 and max_number >= 2, got steps={steps}, max_number={max_number}")
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(1, max_number), rng.randint(1, max_number)
    form = rng.choice(("add", "sub", "mul"))
    if form == "add":
        text, line, total = f"{name} has {a} {thing} and finds {b} more.", f"{a} + {b} = {a + b}", a + b
    elif form == "sub":
        a, b = max(a, b), min(a, b)
        text, line, total = f"{name} has {a} {thing} and loses {b} of them.", f"{a} - {b} = {a - b}", a - b
    else:
        a, b = rng.randint(2, min(max_number, 10)), rng.randint(2, min(max_number, 12))
        text, line, total = (f"{name} has {a} bags with {b} {thing} in each bag.", f"{a} * {b} = {a * b}", a * b)
    lines = [line]
    for _ in range(steps - 1):
        sentence, line, total = _step(rng, total, name, thing, max_number)
        text, lines = text + " " + sentence, lines + [line]
    question = f"{text} How many {thing} does {name} have now?"
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {total}"}


def make(n: int, *, seed: int = 0, steps: int = 1, max_number: int = 20) -> list[dict]:
    """``n`` problems (``problem``) from ``random.Random(seed)``: the same seed, the same rows."""
    rng = random.Random(seed)
    return [problem(rng, steps=steps, max_number=max_number) for _ in range(n)]


def as_dataset(rows: list[dict], *, chat: bool = True):
    """``rows`` (from ``make``) as RL prompts: a ``datasets.Dataset`` with ``prompt`` (a conversation, or plain text
    with ``chat=False``), ``answer`` (the final number), ``question`` and ``solution`` (``gsm8k.to_prompts``)."""
    import datasets

    from .gsm8k import to_prompts

    return datasets.Dataset.from_dict(to_prompts({k: [r[k] for r in rows] for k in ("question", "answer")},
                                                 chat=chat))
