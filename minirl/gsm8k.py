"""GSM8K-style math word problems: the answer extractor, the reward in TRL's form, and the loader.

A GSM8K row is ``{"question": str, "answer": worked solution ending "#### N"}``. The model is asked the question
and its final number is compared with N: from ``#### N`` if it wrote one, else from the last ``\\boxed{N}``, else
the last number in its text (how answers are read for GSM8K in TRL's and the HF course's examples, and by most
math-RL codebases). Numbers may carry thousands commas, a sign and decimals: "1,000", "-5", "15.20" (= 15.2).

``data/gsm8k_style/train.jsonl`` holds 24 such problems written for minirl's tests and CPU demo (not GSM8K's);
a user with internet names the hub dataset instead (``load("openai/gsm8k")``).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

from .chat import as_conversation, with_system_prompt

#: The small GSM8K-format file shipped with minirl.
DATA = Path(__file__).resolve().parent.parent / "data" / "gsm8k_style" / "train.jsonl"

#: A number: an optional sign (not after a letter, digit or dot, so the "-" of "5-3" is a minus, not a sign), digits
#: with optional thousands commas (groups of exactly three), optional decimals
NUMBER = re.compile(r"(?:(?<![\w.])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
HASHES = re.compile(r"####\s*\$?\s*([^\n]*)")
BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def normalise(number: str) -> str | None:
    """The canonical text of a number: commas dropped, trailing zeros and "+" removed ("1,000.50" -> "1000.5",
    "+7" -> "7", "-0" -> "0"); None if ``number`` is not one."""
    try:
        value = Decimal(number.replace(",", "").strip())
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    text = f"{value.normalize():f}"
    return "0" if text in ("-0", "+0") else text


def extract_answer(text: str) -> str | None:
    """The final number of a solution, normalised (``normalise``): after the last ``####``, else in the last
    ``\\boxed{...}``, else the last number anywhere; None when the text has no number there.

    Examples: "3 + 4 = 7.\\n#### 7" -> "7"; "so \\boxed{1,250}" -> "1250"; "it fell to -5 degrees." -> "-5";
    "#### $15.20" -> "15.2"; "no idea" -> None.
    """
    for pattern in (HASHES, BOXED):
        found = pattern.findall(text)
        if found:
            numbers = NUMBER.findall(found[-1])
            return normalise(numbers[0]) if numbers else None
    numbers = NUMBER.findall(text)
    return normalise(numbers[-1]) if numbers else None


def _text(completion) -> str:
    """A completion's text: the string itself, or the content of TRL's ``[{"role": "assistant", ...}]``."""
    return completion if isinstance(completion, str) else completion[0]["content"]


def answer_reward(prompts: list, completions: list, answer: list[str], **_) -> list[float]:
    """1.0 where the completion's final number (``extract_answer``) equals the reference, else 0.0.

    TRL's reward-function form: ``answer`` is the dataset's column (a worked solution ending "#### N", or the
    number itself), one per completion; completions are strings or, for conversational prompts, TRL's
    ``[{"role": "assistant", "content": text}]``.

    Raises:
        ValueError: if the lengths differ, or a reference answer has no number.
    """
    if len(completions) != len(answer):
        raise ValueError(f"completions and answer must have one entry per completion, got {len(completions)} and "
                         f"{len(answer)}")
    out = []
    for completion, reference in zip(completions, answer, strict=True):
        target = extract_answer(reference)
        if target is None:
            raise ValueError(f"answer {reference!r} has no final number")
        out.append(float(extract_answer(_text(completion)) == target))
    return out


def format_reward(completions: list, **_) -> list[float]:
    """1.0 where the completion marks its final answer (``#### N`` or ``\\boxed{N}`` with a number), else 0.0: the
    usual second reward beside ``answer_reward`` (GDPO normalises the two separately)."""
    return [float(any(NUMBER.search(m) for p in (HASHES, BOXED) for m in p.findall(_text(c)))) for c in completions]


def to_prompts(rows, *, chat: bool = True, system_prompt: str | None = None) -> dict[str, list]:
    """GSM8K rows as RL prompts: ``prompt`` (a one-message conversation, or the question as plain text) and
    ``answer`` (the reference's final number, normalised), the other columns kept.

    Args:
        rows: a dict of lists or a ``datasets.Dataset`` with ``question`` and ``answer`` columns.
        chat: conversational prompts (rendered by the tokenizer's chat template; plain text without one).
        system_prompt: an optional system prompt (a first paragraph of a plain-text prompt).

    Raises:
        ValueError: if a column is missing or an answer has no final number.
    """
    names = rows.column_names if hasattr(rows, "column_names") else list(rows)
    if "question" not in names or "answer" not in names:
        raise ValueError(f"GSM8K rows need 'question' and 'answer' columns, got {names}")
    answers = [extract_answer(a) for a in rows["answer"]]
    if None in answers:
        raise ValueError(f"answer {rows['answer'][answers.index(None)]!r} has no final number")
    prompts = [as_conversation(q, system_prompt) if chat else with_system_prompt(q, system_prompt)
               for q in rows["question"]]
    return {**{k: list(rows[k]) for k in names if k not in ("answer", "prompt")}, "prompt": prompts,
            "answer": answers, "solution": list(rows["answer"])}


def load(name_or_path: str | Path = DATA, *, split: str = "train", chat: bool = True,
         system_prompt: str | None = None):
    """A GSM8K-format dataset as RL prompts (``to_prompts``): a local JSONL file, or a hub name (with internet:
    "openai/gsm8k", config "main").

    Returns:
        A ``datasets.Dataset`` with ``prompt``, ``answer``, ``question`` and ``solution`` columns.

    Raises:
        ValueError: from ``to_prompts``; FileNotFoundError (or the hub's error) if the data cannot be found.
    """
    import datasets

    path = Path(name_or_path)
    if path.suffix in (".jsonl", ".json"):
        if not path.is_file():
            raise FileNotFoundError(f"no GSM8K-format file at {path}")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = {k: [r.get(k) for r in records] for k in records[0]} if records else {}
    else:
        rows = datasets.load_dataset(str(name_or_path), "main", split=split)
    return datasets.Dataset.from_dict(to_prompts(rows, chat=chat, system_prompt=system_prompt))
