"""GSM8K-style math word problems: the answer extractor, the reward in TRL's form, and the loader.

A GSM8K row is ``{"question": str, "answer": worked solution ending "#### N"}``. The model is asked the question
and its final number is compared with N: from ``#### N`` if it wrote one, else from the last ``\\boxed{N}``, else
the last number in its text (how answers are read for GSM8K in TRL's and the HF course's examples, and by most
math-RL codebases). Numbers may carry thousands commas, a sign and decimals: "1,000", "-5", "15.20" (= 15.2), ".5".
LaTeX's thousands separators join digit groups as a comma does: ``9{,}500``, ``9\\,500``, ``9\\!500`` and a thin
space (U+2009, U+202F) are 9500 (opencompass #2647: a grader that reads "500" there scores a right answer 0).

``data/gsm8k_style/train.jsonl`` holds 24 such problems written for minirl's tests and CPU demo (not GSM8K's);
a user with internet names the hub dataset instead (``load("openai/gsm8k")``).
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from pathlib import Path

from . import data_files
from .chat import as_conversation, with_system_prompt

#: The small GSM8K-format file shipped with minirl.
DATA = Path(__file__).resolve().parent.parent / "data" / "gsm8k_style" / "train.jsonl"

#: A number: an optional sign (not after a letter, digit or dot, so the "-" of "5-3" is a minus, not a sign), digits
#: with optional thousands commas (groups of exactly three) and optional decimals, or decimals alone (".5"), then an
#: optional "/ denominator" (a fraction, "1/2")
NUMBER = re.compile(r"(?:(?<![\w.])[-+])?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])\.\d+)(?:/\d+(?!\.?\d))?")
HASHES = re.compile(r"####\s*\$?\s*([^\n]*)")
BOXED = re.compile(r"\\boxed\{")
#: LaTeX's thin spaces (``\\,`` ``\\:`` ``\\;`` ``\\ ``) and Unicode's, between a digit and a group of three
THIN_SPACE = re.compile(r"(?<=\d)(?:\\[,:; ]|[\u2009\u202f])(?=\d{3}(?!\d))")
#: ``\\frac{a}{b}`` (and ``\\dfrac``, ``\\tfrac``) of two integers
FRAC = re.compile(r"\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(\d+)\s*\}")


def normalise(number: str) -> str | None:
    """The canonical text of a number: commas dropped, trailing zeros and "+" removed ("1,000.50" -> "1000.5",
    "+7" -> "7", "-0" -> "0", ".5" -> "0.5"); a fraction as its decimal when it has one ("1/2" -> "0.5",
    "6/3" -> "2"), else reduced ("2/6" -> "1/3", which equals no decimal reference); None if ``number`` is not one
    (a zero denominator included)."""
    numerator, _, denominator = number.replace(",", "").strip().partition("/")
    with localcontext(Context(prec=4 * len(number) + 30)):  # enough digits to be exact: no rounding anywhere
        try:
            value = Decimal(numerator)
            if denominator:
                ratio = Fraction(value) / Fraction(Decimal(denominator))  # ZeroDivisionError for "/0"
                q = ratio.denominator
                while q % 2 == 0 or q % 5 == 0:
                    q //= 2 if q % 2 == 0 else 5
                if q != 1:  # no finite decimal: the reduced fraction
                    return f"{ratio.numerator}/{ratio.denominator}"
                value = Decimal(ratio.numerator) / Decimal(ratio.denominator)  # the denominator is 2^a 5^b
        except (InvalidOperation, ZeroDivisionError, ValueError, OverflowError):  # the last two: NaN, inf / d
            return None
        if not value.is_finite():
            return None
        text = f"{value.normalize():f}"
    return "0" if text in ("-0", "+0") else text


def latex_plain(text: str) -> str:
    """``text`` with LaTeX's ways of writing a number made plain: thousands separators ``{,}`` and thin spaces
    between digit groups become commas, ``\\!`` (a negative thin space) and ``\\$`` go, ``\\frac{1}{2}`` becomes
    "1/2" and a Unicode minus "-". Example: ``\\$9{,}500`` -> "9,500"; ``9\\,500\\,000`` -> "9,500,000"."""
    text = text.replace("{,}", ",").replace("\\!", "").replace("\\$", "").replace("\u2212", "-")
    return FRAC.sub(r"\1/\2", THIN_SPACE.sub(",", text))


def boxed(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` in ``text``, braces inside balanced (``\\boxed{9{,}500}`` ->
    "9{,}500", ``\\boxed{\\text{7}}`` -> "\\text{7}"); a box left open runs to the end of the text."""
    found = []
    for m in BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found.append(text[m.end():i - 1 if depth == 0 else i])
    return found


def marked_answers(text: str) -> list[str]:
    """Where ``text`` marks its final answer, LaTeX made plain (``latex_plain``): what follows each ``####``, else
    the contents of each ``\\boxed{}``, in which a space between digit groups joins them as a comma does (TeX's math
    mode prints "9 500" as 9500); [] when the text marks none."""
    text = latex_plain(text)
    return HASHES.findall(text) or [re.sub(r"(?<=\d) (?=\d{3}(?!\d))", ",", b) for b in boxed(text)]


def extract_answer(text: str) -> str | None:
    """The final number of a solution, normalised (``normalise``): the first number after the last ``####``, else
    in the last ``\\boxed{...}``, else the last number anywhere; None when the text has no number there.

    Examples: "3 + 4 = 7.\\n#### 7" -> "7"; "so \\boxed{1,250}" -> "1250"; "it fell to -5 degrees." -> "-5";
    "#### $15.20" -> "15.2"; "no idea" -> None. LaTeX as graders accept it (``latex_plain``):
    ``\\boxed{9{,}500}``, ``\\boxed{9\\,500}``, ``\\boxed{9\\!500}``, ``$9,500$``, ``\\boxed{9 500}`` and
    ``\\boxed{9500\\text{ dollars}}`` are "9500"; ``\\boxed{.5}`` is "0.5", ``-3`` "-3".
    Decisions: a plain space outside ``\\boxed{}`` separates two numbers, as GSM8K's graders read it (lm-eval's and
    opencompass's): "#### 9 500" is "9", "it is 9 500" is "500". A fraction is its value
    (``normalise``): "1/2" and ``\\frac{1}{2}`` are "0.5", so they never pass for the reference 2 (a grader that
    reads the last number of "1/2" would score them right for 2).
    """
    marked = marked_answers(text)
    if marked:
        numbers = NUMBER.findall(marked[-1])
        return normalise(numbers[0]) if numbers else None
    numbers = NUMBER.findall(latex_plain(text))
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
    return [float(any(NUMBER.search(m) for m in marked_answers(_text(c)))) for c in completions]


#: What a GSM8K row's fields must hold (``data_files.check_fields``): a question a prompt can be made of, a
#: reference whose final number the reward compares with
FIELDS = {"question": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
          "answer": (lambda v: isinstance(v, str) and extract_answer(v) is not None,
                     "a string with a final number (GSM8K: a worked solution ending '#### 42', or '42')")}


def to_prompts(rows, *, chat: bool = True, system_prompt: str | None = None) -> dict[str, list]:
    """GSM8K rows as RL prompts: ``prompt`` (a one-message conversation, or the question as plain text) and
    ``answer`` (the reference's final number, normalised), the other columns kept.

    Args:
        rows: a dict of lists or a ``datasets.Dataset`` with ``question`` and ``answer`` columns.
        chat: conversational prompts (rendered by the tokenizer's chat template; plain text without one).
        system_prompt: an optional system prompt (a first paragraph of a plain-text prompt).

    Raises:
        ValueError: if a column is missing, a question is not a non-empty string or an answer has no final number
            (naming the row).
    """
    names = rows.column_names if hasattr(rows, "column_names") else list(rows)
    if "question" not in names or "answer" not in names:
        raise ValueError(f"GSM8K rows need 'question' and 'answer' columns, got {names}")
    for name, (ok, what) in FIELDS.items():  # before a None question becomes the prompt text "None"
        bad = next((i for i, v in enumerate(rows[name]) if not ok(v)), None)
        if bad is not None:
            raise ValueError(f"row {bad} (0-based): field {name!r} is {rows[name][bad]!r}, not {what}")
    answers = [extract_answer(a) for a in rows["answer"]]
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
        ValueError: for a file, naming it, the line and the field (``data_files``): no rows, a line that is not a
            JSON object, a row without a non-empty ``question`` or with an ``answer`` that has no final number;
            from ``to_prompts`` for a hub dataset. FileNotFoundError (or the hub's error) if the data cannot be
            found. A ``.json`` file may hold JSON Lines or one array of rows.
    """
    import datasets

    path = Path(name_or_path)
    if path.suffix in (".jsonl", ".json"):
        if not path.is_file():
            raise FileNotFoundError(f"no GSM8K-format file at {path}")
        records = data_files.read_rows(path)  # every line checked first: the error names the file, line and field
        data_files.check_fields(path, records, FIELDS)
        rows = {k: [r.get(k) for _, r in records] for k in records[0][1]}
    else:
        rows = datasets.load_dataset(str(name_or_path), "main", split=split)
    return datasets.Dataset.from_dict(to_prompts(rows, chat=chat, system_prompt=system_prompt))
