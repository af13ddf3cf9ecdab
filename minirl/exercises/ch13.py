"""Exercises of chapter 13: the real model's reward (the final number of a GSM8K solution).

A reward that misreads a right answer trains the model against zeros without an error anywhere; each named mistake
here is one a public GSM8K grader shipped: a thousands separator that splits the number (opencompass issue #2647:
"\\boxed{8,000}" read as "000"), a comma after the final number read as the number (HELM issue #4337, omlx PR #3484:
"72 clips, altogether." scored 0), an answer dropped because the text after "####" ran on (verl PR #7274: only the
last 300 characters were searched). Each case is worked out by hand, or compared on seeded random texts with the
checker's reference copy (``_reference``), never with minirl's function, which refuses to run while its exercise is
graded."""

from __future__ import annotations

import torch

from . import _reference as ref
from ._core import _case, _exercise, _Mismatch

ex = _exercise("final_answer", "13", "final_answer(text) -> float, or None when the text has no number there",
               "minirl.gsm8k.extract_answer", ("minirl.gsm8k.extract_answer",))
SPLIT_COMMA = ("a comma between digit groups is a thousands separator: \"1,250\" is one number, 1250, not 1 and 250 "
               "(opencompass issue #2647 read \"8,000\" as 000)")
COMMA_AFTER = ("a comma AFTER the number is punctuation: \"72 clips, altogether.\" ends with the number 72 (HELM issue "
               "#4337 took the lone comma as the last number and scored a right answer 0)")
LAST_MARKER = "the answer follows the LAST \"####\": a solution may mark a first try and correct it"
MARKED_WINS = ("when the text marks its answer with \"####\", the answer is the first number after the mark, not the "
               "last number of the text")
LAST_NUMBER = "without a \"####\" mark the answer is the LAST number of the text (where a solution ends), not the first"
SIGN = "a minus sign before the number (after a space) is part of it: \"fell to -5 degrees\" is -5"
DOLLAR = "\"#### $15.20\" is 15.2: a dollar sign before the number is not the number's end"
TAIL_WINDOW = ("the whole text is searched: an answer followed by a long tail is still the answer (verl PR #7274 read "
               "only the last 300 characters and paid 0 for a right answer)")
NOT_FLOAT = "return a float (or None), e.g. 1250.0, not a string or an int"


def _same(got, want) -> bool:
    if got is None or want is None:
        return got is want
    return isinstance(got, float) and abs(got - want) <= 1e-9 * max(1.0, abs(want))


def _expect_number(got, want, mistakes=(), what="the answer"):
    """Pass if ``got`` is ``want`` (a float, or None); else raise the hint of the known mistake whose value it is."""
    if _same(got, want):
        return
    if want is not None and isinstance(got, str | int) and not isinstance(got, bool):
        hint = NOT_FLOAT  # "1250" or 1250 for 1250.0
    else:
        hint = next((h for w, h in mistakes if _same(got, w)), None)
    raise _Mismatch(hint, f"{what}: got {got!r}, expected {want!r}")


@_case(ex, "marked answers by hand, one with a thousands separator", SPLIT_COMMA)
def _(fn, gen):
    _expect_number(fn("3 + 4 = 7.\n#### 7"), 7.0)
    # split at the comma: 1 (the first piece) or 250 (the last)
    _expect_number(fn("25 * 50 = 1,250 pens\n#### 1,250"), 1250.0, [(1.0, SPLIT_COMMA), (250.0, SPLIT_COMMA)])


@_case(ex, "no mark: the last number, with a comma after it", COMMA_AFTER)
def _(fn, gen):
    # "[\d,]+" matches the lone ", " after 72: the last match is "," -> "" -> nothing (HELM #4337)
    _expect_number(fn("He had 12 boxes of 6, so the total is 72 clips, altogether."), 72.0,
                   [(None, COMMA_AFTER), (12.0, LAST_NUMBER)])


@_case(ex, "the mark wins over later numbers", MARKED_WINS)
def _(fn, gen):
    # the last number of the text is 5; the marked answer is 18
    _expect_number(fn("16 - 3 - 4 = 9 eggs, 9 * 2 = 18\n#### 18\nThat used 3 of 5 boxes."), 18.0,
                   [(5.0, MARKED_WINS)])


@_case(ex, "two marks: the last one", LAST_MARKER)
def _(fn, gen):
    _expect_number(fn("#### 5\nWait, 2 + 4 = 6.\n#### 6"), 6.0, [(5.0, LAST_MARKER)])


@_case(ex, "a sign, a decimal, a dollar", SIGN)
def _(fn, gen):
    _expect_number(fn("It was 3 degrees and it fell by 8, to -5 degrees."), -5.0, [(5.0, SIGN), (3.0, LAST_NUMBER)])
    _expect_number(fn("Each costs $3.80, 4 of them: 15.2\n#### $15.20"), 15.2, [(None, DOLLAR)])


@_case(ex, "an answer followed by a long tail, and a text with no number", TAIL_WINDOW)
def _(fn, gen):
    tail = " and the reasoning above confirms this result." * 10  # 470 characters, no number
    _expect_number(fn("2 + 40 = 42\n#### 42\n" + tail), 42.0, [(None, TAIL_WINDOW)])
    _expect_number(fn("I do not know."), None)


WORDS = ["eggs", "so", "the total is", "he paid", "left", "and", "boxes of", "then", "each"]


def random_text(gen: torch.Generator) -> str:
    """A seeded solution-like text: words and numbers (signs, decimals, thousands separators, a dollar sign, a comma
    or full stop after), sometimes a "####" line, sometimes more text after it."""
    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    def number():
        n = int(torch.randint(0, 10 ** int(torch.randint(1, 7, (1,), generator=gen)), (1,), generator=gen))
        text = f"{n:,}" if n >= 1000 and torch.rand(1, generator=gen) < 0.6 else str(n)
        if torch.rand(1, generator=gen) < 0.2:
            text += f".{int(torch.randint(1, 100, (1,), generator=gen))}"
        if torch.rand(1, generator=gen) < 0.15:
            text = "-" + text
        elif torch.rand(1, generator=gen) < 0.15:
            text = "$" + text
        return text + pick(["", "", ",", "."])

    def sentence(k):
        return " ".join(pick(WORDS) if torch.rand(1, generator=gen) < 0.5 else number() for _ in range(k))

    parts = [sentence(int(torch.randint(1, 9, (1,), generator=gen)))]
    for _ in range(int(torch.randint(0, 3, (1,), generator=gen))):  # 0, 1 or 2 marks
        parts.append("#### " + number().rstrip(",."))
        if torch.rand(1, generator=gen) < 0.5:
            parts.append(sentence(int(torch.randint(1, 6, (1,), generator=gen))))
    return "\n".join(parts)


@_case(ex, "random solution-like texts against the definition", LAST_NUMBER)
def _(fn, gen):
    for _ in range(40):
        text = random_text(gen)
        _expect_number(fn(text), ref.final_answer(text), what=f"the answer of {text!r}")
