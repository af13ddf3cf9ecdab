"""The GSM8K-style answer extractor, reward and loader (issue 36, item 3c), on minirl's own GSM8K-format file."""

import pytest

from minirl import gsm8k, rewards


@pytest.mark.parametrize("text,expected", [
    ("3 + 4 = 7 apples.\n#### 7", "7"),
    ("First 12, then 30.\n#### 42", "42"),  # after ####, not the last number before it
    ("#### 1,000", "1000"),  # thousands commas
    ("#### $15.20", "15.2"),  # a currency sign and trailing zeros
    ("It fell to -5 degrees.", "-5"),  # a sign
    ("5-3=2", "2"),  # a minus between numbers is no sign
    ("So 10 - 4 = 6, the answer is \\boxed{6}. Check: 6 + 4 = 10", "6"),  # boxed wins over the last number
    ("\\boxed{1,250} dollars", "1250"),
    ("The answer is +7.", "7"),
    ("Each gets 2.5 kg, 3 friends.", "3"),  # the last number
    ("no idea", None),
    ("#### none", None),  # an answer line without a number is no answer
    ("#### -0.0", "0"),
    ("The lists 1,2,3 end at 3", "3"),  # "1,2,3" is not a thousands-grouped number
])
def test_extract_answer(text, expected):
    assert gsm8k.extract_answer(text) == expected


def test_the_reward_in_trls_form_for_text_and_conversational_completions():
    completions = ["so 4 * 6 = 24\n#### 24", "I get \\boxed{24.0}", "about 25", "#### 2,4"]
    answer = ["4 * 6 = 24 marbles.\n#### 24"] * 4
    # "#### 2,4" is no number with thousands commas: its first number is 2
    assert gsm8k.answer_reward(["q"] * 4, completions, answer) == [1.0, 1.0, 0.0, 0.0]
    assert gsm8k.format_reward(completions=completions) == [1.0, 1.0, 0.0, 1.0]
    conversation = [{"role": "user", "content": "q"}]
    scores = rewards.score_completions([gsm8k.answer_reward, gsm8k.format_reward], [conversation] * 4, completions,
                                       columns={"answer": answer}, weights=[1.0, 0.5])
    assert scores.tolist() == [1.5, 1.5, 0.0, 0.5]  # TRL's assistant messages reach both functions
    with pytest.raises(ValueError, match="no final number"):
        gsm8k.answer_reward(["q"], ["1"], ["none"])
    with pytest.raises(ValueError, match="one entry per completion"):
        gsm8k.answer_reward(["q"], ["1"], ["1", "2"])


def test_the_shipped_file_is_gsm8k_format_and_every_solution_checks_out():
    data = gsm8k.load()  # data/gsm8k_style/train.jsonl
    assert 10 <= len(data) <= 30 and set(data.column_names) == {"question", "prompt", "answer", "solution"}
    for row in data:
        assert row["solution"].splitlines()[-1].startswith("#### ")
        assert row["prompt"] == [{"role": "user", "content": row["question"]}]
        # the worked solution's own final number is the answer: the reward gives it 1
        assert gsm8k.answer_reward([row["prompt"]], [row["solution"]], [row["answer"]]) == [1.0]
    assert {"1000", "-5", "15.2", "4320"} <= set(data["answer"])  # commas, signs and decimals are exercised


def test_loader_options_and_errors(tmp_path):
    plain = gsm8k.load(chat=False, system_prompt="Solve it.")
    assert plain[0]["prompt"].startswith("Solve it.\n\nMia has 4 bags")
    chats = gsm8k.load(system_prompt="Solve it.")
    assert chats[0]["prompt"][0] == {"role": "system", "content": "Solve it."}
    with pytest.raises(ValueError, match="'question' and 'answer'"):
        gsm8k.to_prompts({"prompt": ["x"]})
    with pytest.raises(ValueError, match="row 0 .*'answer' is 'no number', not a string with a final number"):
        gsm8k.to_prompts({"question": ["x"], "answer": ["no number"]})
    with pytest.raises(FileNotFoundError):
        gsm8k.load(tmp_path / "missing.jsonl")


# Issue 47 item 3 (opencompass #2647): LaTeX's thousands separators, and what GSM8K's graders accept
LATEX_TABLE = [
    ("\\boxed{9{,}500}", "9500"),  # was "500": the nested braces hid the box, the last number was read
    ("\\boxed{9\\!500}", "9500"),  # a negative thin space
    ("\\boxed{9\\,500}", "9500"),  # a thin space
    ("\\boxed{9\\,500\\,000}", "9500000"),
    ("So it is \\boxed{\\$9{,}500\\text{ dollars}}.", "9500"),
    ("$9,500$", "9500"),
    ("#### \\$9{,}500", "9500"),
    ("It costs 9\u2009500 dollars.", "9500"),  # a Unicode thin space, the SI separator
    ("\\boxed{9 500}", "9500"),  # TeX's math mode prints "9 500" as 9500
    ("#### 9 500", "9"),  # outside a box a plain space separates two numbers, as lm-eval's grader reads it
    ("it is 9 500", "500"),  # ... and opencompass's (the last number)
    ("\\boxed{500\\text{ dollars}}", "500"),
    ("\\boxed{\\text{9,500}}", "9500"),
    ("\\boxed{-3}", "-3"),
    ("The change is \u22123.", "-3"),  # a Unicode minus
    ("\\boxed{.5}", "0.5"),  # was "5"
    ("about .5 kg", "0.5"),
    ("\\boxed{1/2}", "0.5"),  # was "1": a fraction is its value, never its numerator or denominator
    ("half of it: 1/2.", "0.5"),  # was "2", which scored right for the reference 2
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{-\\dfrac{3}{4}}", "-0.75"),
    ("\\boxed{2/6}", "1/3"),  # no finite decimal: the reduced fraction, equal to no GSM8K answer
    ("\\boxed{6/3}", "2"),
]


@pytest.mark.parametrize("text,expected", LATEX_TABLE)
def test_latex_thousands_separators_and_signs_decimals_fractions_extract_as_graders_read_them(text, expected):
    assert gsm8k.extract_answer(text) == expected


@pytest.mark.parametrize("completion", ["\\boxed{9{,}500}", "\\boxed{9\\!500}", "\\boxed{9\\,500}", "\\boxed{9 500}",
                                        "#### $9,500$", "#### 9{,}500", "\\boxed{9500\\text{ dollars}}",
                                        "\\boxed{\\$9\\,500}"])
def test_a_right_answer_with_a_latex_thousands_separator_earns_the_answer_and_format_rewards(completion):
    assert gsm8k.answer_reward(["q"], [completion], ["9,500 in all.\n#### 9500"]) == [1.0]
    assert gsm8k.format_reward(completions=[completion]) == [1.0]


def test_normalise_reads_fractions_exactly_and_refuses_what_is_no_number():
    assert [gsm8k.normalise(x) for x in ("1/2", "-3/4", "3.5/2", "10/4", "1/3", "5/0", "nan/2", ".5")] == \
        ["0.5", "-0.75", "1.75", "2.5", "1/3", None, None, "0.5"]
    assert gsm8k.normalise("123456789012345678901234567890123") == "123456789012345678901234567890123"  # no rounding


def test_the_loader_names_the_file_line_and_field_of_a_bad_row(tmp_path):
    """Issue 47 item 12: a later row without an answer was a TypeError naming no row, an empty file an empty
    dataset error, a None question the prompt text "None"."""
    import json

    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n" + json.dumps({"question": "r"}) + "\n")
    with pytest.raises(ValueError, match="math.jsonl, line 2: field 'answer' missing"):
        gsm8k.load(path)
    path.write_text("")
    with pytest.raises(ValueError, match="math.jsonl: no rows"):
        gsm8k.load(path)
    with pytest.raises(ValueError, match="row 1 .*'question' is None, not a non-empty string"):
        gsm8k.to_prompts({"question": ["q", None], "answer": ["1", "2"]}, chat=False, system_prompt="Solve it.")
