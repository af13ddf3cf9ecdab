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
    with pytest.raises(ValueError, match="no final number"):
        gsm8k.to_prompts({"question": ["x"], "answer": ["no number"]})
    with pytest.raises(FileNotFoundError):
        gsm8k.load(tmp_path / "missing.jsonl")
