"""Tests of the task (minirl.tasks, data/): answers, scores, the shipped data and its reward in TRL's form. (The
char-level tokenizer: test_tokenizer.py.)"""

import importlib.util
import json
from pathlib import Path

import pytest

from minirl import tasks

DATA = Path(__file__).resolve().parent.parent / "data"


# --- answer parsing and scoring ------------------------------------------------------------------------------------
@pytest.mark.parametrize("completion, parsed", [
    ("7+5=12;12+9=21#21", "21"),  # the reference form
    ("#21", "21"),  # no scratchpad is still well formed
    ("  7+5=12#12\n", "12"),  # surrounding white space is ignored
    ("#-3", "-3"),  # negative answers parse
    ("7+5=12;12+9=21", None),  # missing '#'
    ("21", None),  # a bare number has no delimiter
    ("1#2#3", None),  # two '#'
    ("7+5=12#", None),  # nothing after '#'
    ("7+5=12#1a", None),  # junk after the answer
    ("abc#12", None),  # letters in the scratchpad
    ("", None),
])
def test_parse_answer(completion, parsed):
    assert tasks.parse_answer(completion) == parsed


# paper-index: tasks.score
def test_score_correct_and_well_formed():
    s = tasks.score("7+5=12;12+9=21#21", "21")
    assert (s.reward, s.formatted, s.correct) == (1.0, True, True)


def test_score_wrong_answer_is_formatted_but_not_correct():
    s = tasks.score("7+5=12;12+9=22#22", "21")
    assert (s.reward, s.formatted, s.correct) == (0.0, True, False)


@pytest.mark.parametrize("completion", ["7+5=12;12+9=21", "21", "1#21#21", ""])
def test_score_malformed_gets_nothing_even_if_the_number_is_right(completion):
    s = tasks.score(completion, "21")
    assert (s.reward, s.formatted, s.correct) == (0.0, False, False)


def test_score_negative_and_leading_zero_answers():
    assert tasks.score("#-3", "-3").correct
    assert not tasks.score("#3", "-3").correct
    assert tasks.score("#021", "21").correct  # an exact integer match, not a string match


def test_a_reference_answer_that_is_not_an_integer_is_an_error_naming_it():
    # used to be "ValueError: invalid literal for int()" from deep inside the reward, and only for completions
    # that were well formed; now the same clear error for every completion
    for completion in ("1+8=9#9", "no answer", "#nine"):
        with pytest.raises(ValueError, match="reference answer 'nine' is not an integer"):
            tasks.score(completion, "nine")
    with pytest.raises(ValueError, match="reference answer None"):
        tasks.score("#9", None)
    # an integer, as text or as an int, is fine: "#9" against 9 -> correct; "#-3" against " -3 " -> correct
    assert tasks.score("#9", 9).correct and tasks.score("#-3", " -3 ").correct


def test_the_scratchpad_does_not_count_only_the_answer():
    # a wrong scratchpad with the right final answer is rewarded: the check is on the answer after '#'
    assert tasks.score("1+1=3#21", "21").reward == 1.0


# --- the shipped data ----------------------------------------------------------------------------------------------
def test_splits_load_with_the_expected_columns():
    train, test = tasks.load_split("train"), tasks.load_split("test")
    assert set(train.column_names) == {"prompt", "completion", "answer"}
    assert len(train) == 4000 and len(test) == 256


def test_reference_completions_score_one():
    test = tasks.load_split("test")
    assert all(tasks.score(c, a).reward == 1.0 for c, a in zip(test["completion"], test["answer"], strict=True))


def test_no_test_prompt_appears_in_train():
    train, test = tasks.load_split("train"), tasks.load_split("test")
    assert not set(train["prompt"]) & set(test["prompt"])
    assert len(set(test["prompt"])) == len(test)  # the test prompts are distinct, too


def test_completion_lengths_vary():
    lengths = [len(c) for c in tasks.load_split("test")["completion"]]
    assert min(lengths) <= 8 and max(lengths) >= 25  # 2 terms "1+1=2#2" (7) ... 5 terms (about 30)


def test_make_data_regenerates_the_shipped_files_byte_for_byte(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("make_data", DATA / "make_data.py")
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    make_data.main(tmp_path)
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_bytes() == (DATA / f"{split}.jsonl").read_bytes(), split


# --- malformed data ------------------------------------------------------------------------------------------------
GOOD = json.dumps({"prompt": "1+2=", "completion": "1+2=3#3", "answer": "3"})


@pytest.mark.parametrize("bad, why", [
    ('{"prompt": "1+2=", "completion": ', "not valid JSON"),
    ('["1+2=", "1+2=3#3", "3"]', "expected a JSON object"),
    ('{"prompt": "1+2=", "completion": "1+2=3#3"}', "'answer'"),
    ('{"prompt": "1+2=", "completion": "1+2=3#3", "answer": 3}', "'answer'"),
    ('{"prompt": "1+2=", "completion": "1+2=3#3", "answer": "nine"}', "answer 'nine' is not an integer"),
    ('{"prompt": "1+2=", "completion": "1+2=3#3", "answer": "3.0"}', "answer '3.0' is not an integer"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad, why):
    (tmp_path / "train.jsonl").write_text("\n".join([GOOD, GOOD, bad, GOOD]) + "\n")
    with pytest.raises(ValueError, match=rf"train\.jsonl, line 3: .*{why}"):
        tasks.load_split("train", data_dir=tmp_path)


def test_a_good_temp_split_loads_and_blank_lines_are_skipped(tmp_path):
    (tmp_path / "test.jsonl").write_text(GOOD + "\n\n" + GOOD + "\n")
    ds = tasks.load_split("test", data_dir=tmp_path)
    assert len(ds) == 2 and ds[0]["answer"] == "3"


def test_missing_split_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_data"):
        tasks.load_split("valid", data_dir=tmp_path)


# paper-index: tasks.running_sums_reward
def test_running_sums_reward_is_the_task_score():
    assert tasks.running_sums_reward(["1+2=", "1+2=", "1+2="], ["1+2=3#3", "1+2=3#4", "3"],
                                     answer=["3", "3", "3"]) == [1.0, 0.0, 0.0]
