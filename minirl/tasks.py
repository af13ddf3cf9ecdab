"""The verifiable task: running sums with a short scratchpad, a delimited answer, and a 0/1 reward.

A record is ``{"prompt": "7+5+9=", "completion": "7+5=12;12+9=21#21", "answer": "21"}``. The model sees the
prompt and must write a completion; the text after the single '#' is the final answer. The reward is 1 for a
well-formed completion whose answer is correct and 0 otherwise; format and correctness are reported apart so a
reader can tell "cannot add" from "forgot the '#'".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import datasets

DATA_DIR = Path(__file__).resolve().parent.parent / "data"

#: A well-formed completion: a scratchpad of digits, '+', '=', ';' and exactly one '#' followed by an integer.
_FORMAT = re.compile(r"^[0-9+=;]*#(-?[0-9]+)$")
#: A reference answer: an integer written as the completions write it (digits, an optional leading '-').
_INTEGER = re.compile(r"-?[0-9]+")


def load_split(split: str = "train", data_dir: str | Path | None = None) -> datasets.Dataset:
    """Load a JSONL split of the task as a ``datasets.Dataset`` with columns prompt, completion, answer.

    Each line is validated first, so a malformed line fails with the file name and line number rather than
    somewhere deep inside ``datasets``.

    Args:
        split: "train" or "test" (the file ``{split}.jsonl`` in ``data_dir``).
        data_dir: folder holding the JSONL files; defaults to the repository's ``data/``.

    Returns:
        A Dataset of N rows.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: "train.jsonl, line 7: ..." for a line that is not a JSON object with string fields
            prompt, completion and answer, or whose answer is not an integer.
    """
    path = Path(data_dir or DATA_DIR) / f"{split}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no task data at {path}; run `python data/make_data.py` to regenerate it")
    validate_jsonl(path)
    datasets.disable_progress_bars()  # a bar per tiny JSONL file is noise in notebooks
    return datasets.load_dataset("json", data_files=str(path), split="train")


def validate_jsonl(path: str | Path) -> int:
    """Check every line of a task JSONL file; return the number of records.

    Each line must be a JSON object whose prompt, completion and answer are strings, and whose answer is an
    integer ("21", "-3"): a row with answer "nine" would otherwise load and then fail mid-training inside the
    reward, with no file or line to go on.

    Raises:
        ValueError: naming the file and the 1-based line number of the first bad line.
    """
    path = Path(path)
    n = 0
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path.name}, line {lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path.name}, line {lineno}: expected a JSON object, got {type(row).__name__}")
            for key in ("prompt", "completion", "answer"):
                if not isinstance(row.get(key), str):
                    raise ValueError(f"{path.name}, line {lineno}: field {key!r} missing or not a string")
            if not _INTEGER.fullmatch(row["answer"].strip()):
                raise ValueError(f"{path.name}, line {lineno}: answer {row['answer']!r} is not an integer (digits with "
                                 f"an optional leading '-')")
            n += 1
    return n


def parse_answer(completion: str) -> str | None:
    """The final answer of a completion, or None when the completion is not well formed.

    "7+5=12;12+9=21#21" -> "21"; "7+5=12#" -> None; "21" -> None (no delimiter); "1#2#3" -> None.
    """
    m = _FORMAT.match(completion.strip())
    return m.group(1) if m else None


@dataclass
class Score:
    """The score of one completion: ``reward`` = 1.0 iff well formed and correct."""

    reward: float
    formatted: bool
    correct: bool


def score(completion: str, answer: str) -> Score:
    """Score one completion against the reference answer (exact integer match after '#').

    Example: score("7+5=12;12+9=21#21", "21") -> reward 1.0; score("#021", "21") is correct too (integers, not
    strings, are compared).

    Args:
        completion: the model's completion text.
        answer: the reference answer, a string of digits with an optional leading '-' (or an int).

    Returns:
        A ``Score``: reward 1.0 iff the completion is well formed and its answer equals the reference.

    Raises:
        ValueError: naming the answer, if the reference answer is not an integer (e.g. "nine"), whatever the
            completion: a reference that cannot be checked is a data error, not a wrong completion.

    Source: the verifiable-reward setting of DeepSeek-R1 / DAPO (accuracy reward, rule based, no reward model).
    """
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)  # an int column (e.g. a user's own dataset) is fine
    if not isinstance(answer, str) or not _INTEGER.fullmatch(answer.strip()):
        raise ValueError(f"the reference answer {answer!r} is not an integer (a string of digits with an optional "
                         f"leading '-')")
    parsed = parse_answer(completion)
    formatted = parsed is not None
    correct = formatted and int(parsed) == int(answer)
    return Score(reward=1.0 if correct else 0.0, formatted=formatted, correct=correct)


def running_sums_reward(prompts: list[str], completions: list[str], answer: list[str], **columns) -> list[float]:
    """The task's reward in TRL's reward-function form: 1.0 for a well-formed, correct completion, else 0.0.

    A reward function receives the prompts and completions (one entry per completion, B of each) and, by name,
    the dataset's other columns repeated per completion (here ``answer``); extra columns are ignored. The same
    function works as a ``reward_funcs`` entry of TRL's GRPOTrainer.

    Example: running_sums_reward(["1+2="], ["1+2=3#3"], answer=["3"]) -> [1.0].

    Raises:
        ValueError: if the three lists differ in length.

    Source: the verifiable-reward setting of DeepSeek-R1 / DAPO (rule-based accuracy reward); the signature is
    TRL's ``reward_funcs`` convention.
    """
    if not len(prompts) == len(completions) == len(answer):
        raise ValueError(f"prompts, completions and answer must have one entry per completion, got "
                         f"{len(prompts)}, {len(completions)} and {len(answer)}")
    return [score(c, a).reward for c, a in zip(completions, answer, strict=True)]
