"""Tests of minirl.rewards: reward functions in TRL's form (score_completions), DAPO's overlong shaping and PPO's
token-level rewards.

TRL 1.16's reward contract, as minirl keeps it (issue 23). A reward function is called by name with ``prompts``,
``completions``, ``completion_ids`` and the dataset's other columns (plus ``trainer_state`` and ``log_metric`` in the
RL loop). ``None`` for a row means "does not apply": it is left out of that function's weighted sum; a row None for
every function is warned about, is NaN, is left out of its group's mean and std and gets advantage 0, the same
numbers as TRL's nanmean / nanstd / nan_to_num. NaN, inf, a non-number or a wrong count is an error naming the
function (and the row). (The advantages of unscored rows are tested in test_advantages.py, the loop around them in
test_rl.py.)

The examples of TRL's documentation run here unchanged: "Using a custom reward function", examples 1.1, 3 and 4 of
docs/source/grpo_trainer.md (TRL 1.16), and the two plain-text functions of ``trl.rewards``
(``get_soft_overlong_punishment``, ``get_repetition_penalty_reward``), with their documented values. Out of scope:
the conversational examples (example 2, ``accuracy_reward``, ``think_format_reward``: they read
``completion[0]["content"]``, and minirl's completions are strings), and example 5 (``async def``: minirl calls
reward functions synchronously). Example 1 reads a parameter ``completions_ids`` (sic) that TRL never passes: it
fails in TRL and here alike (tested).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from functools import partial

import datasets
import helpers
import pytest
import torch

from minirl import config, models, rewards, tasks
from minirl.tokenizer import build_tokenizer

D = torch.float64
close = partial(helpers.close, atol=1e-7, dtype=D)
close_5e7 = partial(helpers.close, atol=5e-7)


# ------------------------------------------------------------------------------------------------ TRL's doc examples
# Copied as TRL 1.16's docs/source/grpo_trainer.md writes them (Apache-2.0, the HuggingFace team): the point is that
# they run unchanged.
def example_1_reward_func(completions_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completions_ids]


def example_1_1_reward_func(completions, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of character count)."""
    return [float(len(completion)) for completion in completions]


def example_3_reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]  # noqa: B905 (as the docs write it)


def check_math_solution(prompt, completion):  # the docs leave example 4's two helpers to the reader
    return completion.strip() == {"What is 2+2?": "4", "What is 3*4?": "12"}[prompt]


def test_code_solution(prompt, completion):  # noqa: PT028 (the docs' name; not a test)
    return "return" in completion


test_code_solution.__test__ = False  # pytest: not a test


def math_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):  # noqa: B905 (as the docs write it)
        if t == "math":
            # Calculate math-specific reward
            correct = check_math_solution(prompt, completion)
            reward = 1.0 if correct else -1.0
            rewards.append(reward)
        else:
            # Return None for non-math tasks
            rewards.append(None)
    return rewards


def coding_reward_func(prompts, completions, task, **kwargs):
    rewards = []
    for prompt, completion, t in zip(prompts, completions, task):  # noqa: B905 (as the docs write it)
        if t == "coding":
            # Calculate coding-specific reward
            works = test_code_solution(prompt, completion)
            reward = 1.0 if works else -1.0
            rewards.append(reward)
        else:
            # Return None for non-coding tasks
            rewards.append(None)
    return rewards


PROMPTS = ["The sky is", "The sun is"]
COMPLETIONS = [" blue.", " in the sky."]
COMPLETION_IDS = [[6303, 13], [304, 279, 12884, 13]]


def test_doc_example_1_1_character_length():
    out = rewards.score_completions(example_1_1_reward_func, PROMPTS, COMPLETIONS, completion_ids=COMPLETION_IDS)
    assert out.tolist() == [6.0, 12.0]  # the docs' values: len(" blue.") = 6, len(" in the sky.") = 12


def test_doc_example_1_fails_as_in_trl():
    """It asks for ``completions_ids``; TRL (and minirl) pass ``completion_ids``: a TypeError in both."""
    with pytest.raises(TypeError, match="completions_ids"):
        rewards.score_completions(example_1_reward_func, PROMPTS, COMPLETIONS, completion_ids=COMPLETION_IDS)


def test_doc_example_3_ground_truth_column():
    prompts = ["Problem: Solve the equation $2x + 3 = 7$. Solution:", "Problem: Solve the equation $3x - 5 = 10$."]
    completions = [r" The solution is \boxed{2}.", r" The solution is \boxed{6}."]
    out = rewards.score_completions(example_3_reward_func, prompts, completions,
                                    columns={"ground_truth": ["2", "5"]})
    assert out.tolist() == [1.0, 0.0]  # the docs' values


def test_doc_example_4_multi_task_with_none():
    """The docs' dataset says task "code" but coding_reward_func tests t == "coding": as written, both functions
    return None on the code rows, so those are unscored (warned, NaN), in TRL as here. Math rows: 2+2 -> "4" right
    (+1), 3*4 -> "13" wrong (-1); coding_reward_func's None adds nothing to them (nansum)."""
    data = {"prompt": ["What is 2+2?", "Write a function that returns the sum of two numbers.", "What is 3*4?",
                       "Write a function that returns the product of two numbers."],
            "task": ["math", "code", "math", "code"]}
    completions = ["4", "def f(a, b): return a + b", "13", "def f(a, b): return a * b"]
    with pytest.warns(UserWarning, match="every reward function returned None for 2 of 4 completions"):
        out = rewards.score_completions([math_reward_func, coding_reward_func], data["prompt"], completions,
                                        columns={"task": data["task"]})
    assert out[[0, 2]].tolist() == [1.0, -1.0] and out[[1, 3]].isnan().all()
    # with the task spelled as the function expects, every row is scored: the code rows by coding_reward_func
    out = rewards.score_completions([math_reward_func, coding_reward_func], data["prompt"], completions,
                                    columns={"task": ["math", "coding", "math", "coding"]})
    assert out.tolist() == [1.0, 1.0, -1.0, 1.0]


def test_trl_rewards_plain_text_functions_run_unchanged():
    """trl.rewards' two plain-text functions read ``completion_ids``; their docstring values come back."""
    trl_rewards = pytest.importorskip("trl.rewards")
    overlong = trl_rewards.get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=20)
    out = rewards.score_completions(overlong, ["p"], ["x"], completion_ids=[[1] * 90])
    assert out.tolist() == [-0.5]  # (80 - 90) / 20
    repetition = trl_rewards.get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0)
    out = rewards.score_completions(repetition, ["p", "q"], ["a", "b"], completion_ids=[[1, 2, 3, 4], [5] * 5])
    assert out.tolist() == [0.0, -0.75]  # 4 bigrams of [5]*5, 1 distinct: (1 - 1/4) * -1


def test_running_sums_reward_through_trls_reward_path(tmp_path):
    """minirl's task reward unchanged as a reward_funcs entry of TRL's real GRPOTrainer: its _calculate_rewards
    (the call with prompts, completions, completion_ids, the columns, trainer_state, log_extra, log_metric) gives
    the task's scores, next to a function returning None, through TRL's nansum."""
    trl = pytest.importorskip("trl")
    from minirl import interop

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tok = build_tokenizer()
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")

    def only_first(prompts, completions, **_):
        return [0.5] + [None] * (len(prompts) - 1)

    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="], "answer": ["3", "7"]})
    args = interop.to_trl(config.make_config("grpo"), output_dir=str(tmp_path / "out"), report_to="none",
                          use_cpu=True)
    trainer = trl.GRPOTrainer(model=models.load(str(tmp_path / "m")), args=args, train_dataset=data,
                              processing_class=tok, reward_funcs=[tasks.running_sums_reward, only_first])
    completions = ["1+2=3#3", "3#4", "3+4=7#7"]
    inputs = [{"prompt": p, "answer": a} for p, a in [("1+2=", "3"), ("1+2=", "3"), ("3+4=", "7")]]
    prompts = [x["prompt"] for x in inputs]
    ids = [tok(c, add_special_tokens=False).input_ids + [tok.eos_token_id] for c in completions]
    per_func = trainer._calculate_rewards(inputs, prompts, completions, ids)  # (3, 2), NaN for None
    assert per_func[:, 0].tolist() == [1.0, 0.0, 1.0] == tasks.running_sums_reward(prompts, completions,
                                                                                      answer=["3", "3", "7"])
    trl_total = (per_func * trainer.reward_weights).nansum(dim=1)  # TRL's weighted sum
    ours = rewards.score_completions([tasks.running_sums_reward, only_first], prompts, completions,
                                     completion_ids=ids, columns={"answer": ["3", "3", "7"]})
    assert ours.tolist() == trl_total.tolist() == [1.5, 0.0, 1.0]


# ------------------------------------------------------------------------------------------------ None rows
def test_none_rows_weighted_sum_by_hand():
    f1 = lambda prompts, completions, **_: [1.0, 0.0, None]  # noqa: E731
    f2 = lambda prompts, completions, **_: [0.5, None, None]  # noqa: E731
    with pytest.warns(UserWarning, match=r"1 of 3 completions \(first: row 2"):
        out = rewards.score_completions([f1, f2], ["p"] * 3, ["a", "b", "c"], weights=[1.0, 2.0])
    # [1 + 2 * 0.5, 0 + (None adds nothing), every function None -> NaN]
    assert out[:2].tolist() == [2.0, 0.0] and math.isnan(out[2])


def test_no_warning_when_every_row_is_scored():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = rewards.score_completions([lambda prompts, completions, **_: [None, 1.0],
                                         lambda prompts, completions, **_: [3.0, None]], ["p", "q"], ["a", "b"])
    assert out.tolist() == [3.0, 1.0]  # each row scored by one function


# ------------------------------------------------------------------------------------------------ bad values
@pytest.mark.parametrize("bad, text", [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")])
def test_nan_and_inf_are_errors_naming_the_function_and_the_row(bad, text):
    def shaky(prompts, completions, **_):
        return [1.0, 0.0, bad]

    with pytest.raises(ValueError, match=rf"shaky returned {text} at completion 2; rewards must be finite"):
        rewards.score_completions(shaky, ["p"] * 3, ["a", "b", "c"])


@pytest.mark.parametrize("bad", ["1.0", [1.0], torch.tensor(1.0)])
def test_a_non_number_is_an_error_naming_the_function(bad):
    def odd(prompts, completions, **_):
        return [bad, 1.0]

    with pytest.raises(ValueError, match=r"odd returned .* at completion 0; every reward must be a number"):
        rewards.score_completions(odd, ["p", "q"], ["a", "b"])


def test_a_wrong_length_is_an_error_naming_the_function():
    def short(prompts, completions, **_):
        return [1.0]

    with pytest.raises(ValueError, match="reward function short returned 1 values for 2 completions"):
        rewards.score_completions(short, ["p", "q"], ["a", "b"])


# --- overlong reward shaping (DAPO eq. 13) ---------------------------------------------------------------------------
# paper-index: rewards.overlong_penalty
def test_overlong_penalty_acceptance_values():
    # max_len 20, cache 4: the ramp starts after 20 - 4 = 16 tokens: (16 - |y|) / 4 for 16 < |y| <= 20, -1 beyond
    lengths = torch.tensor([15, 16, 17, 18, 19, 20, 21])
    close(rewards.overlong_penalty(lengths, max_len=20, cache_len=4), [0, 0, -0.25, -0.5, -0.75, -1.0, -1.0])


def test_overlong_penalty_bounds_and_errors():
    p = rewards.overlong_penalty(torch.arange(0, 50), max_len=32, cache_len=8)
    assert p.max() == 0.0 and p.min() == -1.0 and bool((p[1:] <= p[:-1]).all())  # in [-1, 0], non-increasing
    with pytest.raises(ValueError, match="cache_len"):
        rewards.overlong_penalty(torch.tensor([3]), max_len=4, cache_len=5)
    with pytest.raises(ValueError, match="cache_len"):
        rewards.overlong_penalty(torch.tensor([3]), max_len=4, cache_len=0)
    with pytest.raises(ValueError, match="lengths"):
        rewards.overlong_penalty(torch.tensor([[3]]), max_len=4, cache_len=2)


# -------------------------------------------------------------------------------------------- token-level rewards (PPO)
def test_token_level_rewards_refuses_a_mask_that_is_not_a_prefix():
    # [1, 0, 1] sums to 2, so the score would land on position 1, a masked token
    with pytest.raises(ValueError, match=r"mask must be a prefix of ones.*row 0"):
        rewards.token_level_rewards(torch.tensor([1.0]), torch.tensor([[1, 0, 1]]))


def test_token_level_rewards_put_the_score_on_the_last_valid_token():
    scores = torch.tensor([1.0, 0.5, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    close_5e7(rewards.token_level_rewards(scores, mask).double(), [[0, 0, 1.0], [0.5, 0, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="scores"):
        rewards.token_level_rewards(torch.tensor([1.0, 0.5]), mask)
    with pytest.raises(ValueError, match="mask"):
        rewards.token_level_rewards(scores, torch.ones(3))


# --- reward functions in TRL's form ---------------------------------------------------------------------------------
# paper-index: rewards.score_completions
def test_score_completions_weights_and_columns_by_hand():
    def exact(prompts, completions, answer, **_):
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    def length(prompts, completions, **_):
        return [len(c) / 10 for c in completions]

    out = rewards.score_completions([exact, length], ["p", "q"], ["12", "7"], columns={"answer": ["12", "8"]},
                                    weights=[1.0, 2.0])
    # [1 + 2 * 0.2, 0 + 2 * 0.1] = [1.4, 0.2]
    torch.testing.assert_close(out, torch.tensor([1.4, 0.2]))


def test_bad_reward_values_are_errors_naming_the_function():
    def wordy(prompts, completions, **_):
        return [1.0, "yes"]

    with pytest.raises(ValueError, match=r"wordy returned 'yes' at completion 1"):
        rewards.score_completions(wordy, ["p", "q"], ["a", "b"])
    with pytest.raises(ValueError, match="returned 1 values for 2 completions"):
        rewards.score_completions(lambda prompts, completions, **_: [1.0], ["p", "q"], ["a", "b"])
    with pytest.raises(ValueError, match="one weight per function"):
        rewards.score_completions([wordy], ["p"], ["a"], weights=[1.0, 2.0])


# ------------------------------------------------------------------------------------------------ per-reward metrics
# paper-index: rewards.reward_metrics
def test_each_reward_functions_own_mean_unweighted_with_none_rows_left_out():
    """Issue 47 item 13: with several rewards only their weighted sum was logged; each function's own mean is
    logged as TRL's rewards/<name>/mean (the nanmean of its unweighted column)."""
    def answer_reward(**_):
        return []

    def format_reward(**_):
        return []

    per_function = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, math.nan], [0.0, 0.0]])  # (B=4, K=2)
    out = rewards.reward_metrics([answer_reward, format_reward], per_function, {"my_metric": [1.0, 2.0]})
    # answer: 1/4; format: (1 + 1 + 0) / 3 rows it scored; my_metric: (1 + 2) / 2
    assert out == {"rewards/answer_reward/mean": 0.25, "rewards/format_reward/mean": pytest.approx(2 / 3),
                   "my_metric": 1.5}
    never = rewards.reward_metrics(answer_reward, torch.full((2, 1), math.nan))["rewards/answer_reward/mean"]
    assert math.isnan(never)  # a function that scored no row: NaN, as TRL's nanmean
    assert rewards.reward_metrics(answer_reward, None) == {}
    with pytest.raises(ValueError, match="2 columns for 1 reward functions"):
        rewards.reward_metrics(answer_reward, per_function)


def test_reward_function_names_repeat_with_a_suffix_so_no_metric_hides_another():
    class Scorer:
        def __call__(self, **_):
            return []

    f = lambda **_: []  # noqa: E731
    assert rewards.function_names([tasks.running_sums_reward, f, f, Scorer(), partial(f)]) == \
        ["running_sums_reward", "<lambda>", "<lambda>_2", "Scorer", "partial"]
