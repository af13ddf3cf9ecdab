"""GDPO's per-reward normalisation (issue 36, item 3d): by hand, equal to TRL 1.16's ``normalize_then_sum`` lines
run on the same inputs, and wired into the loop as ``RLConfig.multi_objective_aggregation``."""

import inspect
import math
import textwrap
import warnings
from types import SimpleNamespace

import datasets
import pytest
import torch

from minirl import advantages, config, models, rewards, rl


# paper-index: advantages.gdpo_advantages
def test_gdpo_by_hand_and_what_summing_first_loses():
    r = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])  # (answer, format) of one group of 4
    # each column: mean 0.5, std sqrt(1/3) = 0.57735, so +-0.5 / 0.57745 = +-0.86588; sums [0, 0, 1.73176, -1.73176];
    # over the batch: mean 0, std sqrt(2 * 1.73176^2 / 3) = 1.41397, A = 1.73176 / 1.41407 = 1.22466
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    s = 2 * a
    expected = torch.tensor([0.0, 0.0, s, -s]) / (math.sqrt(2 * s * s / 3) + 1e-4)
    got = advantages.gdpo_advantages(r, torch.ones(2), group_size=4)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    # the format reward on a 0/3 scale: GDPO changes only by eps's share (7e-5, eps / std); summing first lets it
    # dominate the answer
    r3 = r * torch.tensor([1.0, 3.0])
    torch.testing.assert_close(advantages.gdpo_advantages(r3, torch.ones(2), group_size=4), got, atol=1e-4, rtol=0)
    grpo = advantages.group_advantages(r3.sum(1), 4)
    assert grpo[1] > grpo[0]  # "format right, answer wrong" beats "answer right, format wrong" (0.5477 vs -0.5477)


def trl_normalize_then_sum():
    """TRL 1.16's own lines, from the unscorable mask to the advantages' nan_to_num in
    ``GRPOTrainer._generate_and_score_completions``, read from the installed trl and run as they are."""
    trl = pytest.importorskip("trl")
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import nanstd

    assert trl.__version__ == "1.16.0"
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = source.index("        unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)")
    end = source.index("advantages = torch.nan_to_num(advantages, nan=0.0)")
    block = textwrap.dedent(source[start:end] + "advantages = torch.nan_to_num(advantages, nan=0.0)\n")
    assert 'elif self.multi_objective_aggregation == "normalize_then_sum":' in block

    def run(rewards_per_func, weights, num_generations):
        trainer = SimpleNamespace(multi_objective_aggregation="normalize_then_sum", scale_rewards="group",
                                  reward_weights=weights, reward_funcs=[None] * weights.numel())
        scope = {"torch": torch, "nanstd": nanstd, "self": trainer, "rewards_per_func": rewards_per_func,
                 "num_generations": num_generations, "device": "cpu"}
        exec(block, scope)
        return scope["advantages"]

    return run


@pytest.mark.parametrize("G,K,seed", [(4, 2, 0), (8, 3, 1), (2, 1, 2), (16, 2, 3)])
def test_gdpo_equals_trls_normalize_then_sum(G, K, seed):
    trl_run = trl_normalize_then_sum()
    gen = torch.Generator().manual_seed(seed)
    n_groups = 5
    r = torch.randint(0, 3, (n_groups * G, K), generator=gen).float() * torch.rand(K, generator=gen) * 4
    r[torch.rand(r.shape, generator=gen) < 0.2] = torch.nan  # functions that returned None
    r[1] = torch.nan  # an unscored row: None from every function
    r[G:2 * G, 0] = 1.0  # a function constant in a group
    weights = torch.randn(K, generator=gen)  # negative weights too
    ours, theirs = advantages.gdpo_advantages(r, weights, group_size=G), trl_run(r, weights, G)
    assert ours[1] == 0 and torch.isfinite(ours).all()
    assert torch.equal(ours, theirs)  # bit for bit: the same operations in the same order


def test_gdpo_bad_input():
    with pytest.raises(ValueError, match="weights"):
        advantages.gdpo_advantages(torch.zeros(4, 2), torch.ones(3), group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        advantages.gdpo_advantages(torch.zeros(5, 2), torch.ones(2), group_size=2)
    with pytest.raises(ValueError, match="finite"):
        advantages.gdpo_advantages(torch.tensor([[math.inf]]), torch.ones(1), group_size=1)
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        config.make_config("grpo", multi_objective_aggregation="mean")
    with pytest.raises(ValueError, match="normalize_then_sum"):
        config.make_config("rloo", multi_objective_aggregation="normalize_then_sum")
    with pytest.raises(ValueError, match="normalize_then_sum"):
        config.make_config("dr_grpo", multi_objective_aggregation="normalize_then_sum")


def test_score_completions_returns_each_functions_scores():
    with pytest.warns(UserWarning, match="unscored"):
        total, per = rewards.score_completions([lambda completions, **_: [1, 0, None],
                                                lambda completions, **_: [0.5, None, None]],
                                               ["p"] * 3, ["a", "b", "c"], weights=[1, 2], per_function=True)
    assert total.tolist()[:2] == [2.0, 0.0] and math.isnan(total[2])  # the docstring's example
    torch.testing.assert_close(per, torch.tensor([[1.0, 0.5], [0.0, math.nan], [math.nan, math.nan]]),
                               equal_nan=True)


def test_the_loop_trains_on_gdpo_advantages_of_each_functions_scores(tok, monkeypatch):
    seen = []
    original = advantages.gdpo_advantages

    def spy(per_func, weights, **kwargs):
        out = original(per_func, weights, **kwargs)
        seen.append((per_func, weights, out))
        return out

    monkeypatch.setattr(advantages, "gdpo_advantages", spy)

    def length(completions, **_):
        return [float(len(c)) for c in completions]

    def has_digit(completions, **_):
        return [None if i % 4 == 3 else float(any(ch.isdigit() for ch in c)) for i, c in enumerate(completions)]

    cfg = config.make_config("dapo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=6, progress=False,
                             dynamic_sampling=False, multi_objective_aggregation="normalize_then_sum",
                             overlong_cache_len=4, num_minibatches=1)
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        history = rl.train_rl(model, tok, cfg, data, reward_fn=[length, has_digit], reward_weights=[0.5, 2.0])
    per_func, weights, adv = seen[0]
    assert per_func.shape == (8, 3) and weights.tolist() == [0.5, 2.0, 1.0]  # DAPO's overlong penalty: a third
    assert per_func[3::4, 1].isnan().all() and not per_func[:, 0].isnan().any()  # None stays NaN, per function
    assert (per_func[:, 2] <= 0).all() and math.isfinite(history.rows[0]["loss"])
    torch.testing.assert_close(adv, original(per_func, weights, group_size=4))


# paper-index: advantages.gdpo_group_sums
def test_dynamic_sampling_under_gdpo_keeps_a_group_whose_advantages_differ(tok):
    """Issue 47 item 4: f1 = [1, 0], f2 = [0, 2], weights [2, 1]. The weighted sums are [2, 2], equal, so DAPO's filter
    on them dropped the group ("found 0 of 1 groups"), though GDPO normalises each function first and its
    advantages are +-0.707. Under GDPO the filter reads the group-normalised sums: the group is kept."""
    # by hand: f1 normalised [0.7071, -0.7071]; f2 [-0.7071, 0.7071] (std 1.4142 + eps); s = 2 f1~ + f2~
    per_func, weights = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([2.0, 1.0])
    s = advantages.gdpo_group_sums(per_func, weights, group_size=2)
    torch.testing.assert_close(s, torch.tensor([2 / (0.5**0.5 + 1e-4) * 0.5 - 1 / (2**0.5 + 1e-4),
                                                -2 / (0.5**0.5 + 1e-4) * 0.5 + 1 / (2**0.5 + 1e-4)]))
    torch.testing.assert_close(advantages.gdpo_advantages(per_func, weights, group_size=2),
                               torch.tensor([0.7071, -0.7071]), atol=1e-3, rtol=0)
    equal = advantages.gdpo_group_sums(torch.tensor([[1.0, 2.0], [1.0, 2.0]]), weights, group_size=2)
    assert equal.tolist() == [0.0, 0.0]  # every function constant in the group: no signal

    def f1(completions, **_):  # rows alternate within each group of 2
        return [float(i % 2 == 0) for i in range(len(completions))]

    def f2(completions, **_):
        return [2.0 * (i % 2) for i in range(len(completions))]

    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="]})
    for aggregation, kept in (("normalize_then_sum", True), ("sum_then_normalize", False)):
        cfg = config.make_config("grpo", steps=1, prompts_per_step=1, group_size=2, max_new_tokens=4, progress=False,
                                 dynamic_sampling=True, max_gen_batches=2, multi_objective_aggregation=aggregation,
                                 num_minibatches=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if kept:
                row = rl.train_rl(model, tok, cfg, data, reward_fn=[f1, f2], reward_weights=[2.0, 1.0]).rows[-1]
                assert (row["gen_rounds"], row["useful_groups"], row["useful_groups_in_batch"]) == (1, 1.0, 1)
            else:  # summed first, the rewards [2, 2] are equal: no advantage, and the group is rightly dropped
                with pytest.raises((RuntimeError, ValueError), match="group"):
                    rl.train_rl(model, tok, cfg, data, reward_fn=[f1, f2], reward_weights=[2.0, 1.0])
