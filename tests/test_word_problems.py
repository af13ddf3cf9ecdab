"""The generated word problems (minirl/word_problems.py): exact answers, the difficulty dial, determinism."""

import re

import pytest

from minirl import gsm8k, word_problems


def test_the_same_seed_gives_the_same_rows_and_another_seed_other_rows():
    assert word_problems.make(20, seed=3) == word_problems.make(20, seed=3)
    assert word_problems.make(20, seed=3) != word_problems.make(20, seed=4)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_every_worked_line_is_right_and_chains_into_the_next_and_the_answer(steps):
    for row in word_problems.make(200, seed=steps, steps=steps, max_number=15):
        lines = row["answer"].splitlines()
        assert len(lines) == steps + 1 and lines[-1].startswith("#### ")
        total = None
        for line in lines[:-1]:
            a, op, b, result = re.fullmatch(r"(\d+) ([-+*]) (\d+) = (\d+)", line).groups()
            a, b, result = int(a), int(b), int(result)
            assert result == {"+": a + b, "-": a - b, "*": a * b}[op] and result >= 0
            assert total is None or a == total  # each step starts from the running total
            total = result
        assert gsm8k.extract_answer(row["answer"]) == str(total)
        assert row["question"].endswith("have now?") and row["question"].count(".") == steps


def solve(question: str) -> int:
    """An independent reader of the question's text: the amount it ends with."""
    first, *rest = [t.strip() for t in question.split(".") if t.strip()][:-1] + [question.split(".")[-1]]
    if m := re.search(r"has (\d+) \w+ and finds (\d+) more", first):
        total = int(m[1]) + int(m[2])
    elif m := re.search(r"has (\d+) \w+ and loses (\d+) of them", first):
        total = int(m[1]) - int(m[2])
    else:
        m = re.search(r"has (\d+) bags with (\d+) \w+ in each bag", first)
        total = int(m[1]) * int(m[2])
    for sentence in rest:
        if m := re.search(r"gets (\d+) more", sentence):
            total += int(m[1])
        elif m := re.search(r"gives away (\d+)", sentence):
            total -= int(m[1])
        elif "doubles" in sentence:
            total *= 2
    return total


def test_the_questions_text_alone_gives_the_answer():
    rows = word_problems.make(300, seed=7, steps=3, max_number=12) + word_problems.make(100, seed=8)
    for row in rows:
        assert str(solve(row["question"])) == gsm8k.extract_answer(row["answer"]), row
    # by hand: "Mia has 4 bags with 6 marbles in each bag. Then Mia gives away 5 marbles." -> 4 * 6 - 5 = 19
    assert solve("Mia has 4 bags with 6 marbles in each bag. Then Mia gives away 5 marbles. How many?") == 19


def test_numbers_stay_within_the_dial():
    for row in word_problems.make(300, seed=1, steps=1, max_number=5):
        first = row["answer"].splitlines()[0]
        a, _, b = first.split()[:3]
        assert 1 <= int(a) <= 10 and 1 <= int(b) <= 12  # sums and differences use 1..5; products 2..5 x 2..5
        if "+" in first or "-" in first:
            assert int(a) <= 5 and int(b) <= 5


def test_bad_dial_settings_are_refused_naming_them():
    with pytest.raises(ValueError, match="steps"):
        word_problems.make(1, steps=0)
    with pytest.raises(ValueError, match="max_number"):
        word_problems.make(1, max_number=1)


def test_as_dataset_gives_rl_prompts_with_the_final_number():
    rows = word_problems.make(3, seed=2)
    data = word_problems.as_dataset(rows)
    assert data["answer"] == [gsm8k.extract_answer(r["answer"]) for r in rows]
    assert data["prompt"][0] == [{"role": "user", "content": rows[0]["question"]}]
    assert word_problems.as_dataset(rows, chat=False)["prompt"][0] == rows[0]["question"]
