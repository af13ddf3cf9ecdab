"""Tests of minirl.preference_data: preference pairs and KTO examples from groups of scored samples, by hand.
(sample_preference_data, which needs a model, is tested in test_preference_loop.py.)"""

import pytest
import torch
from datasets import Dataset

from minirl.preference_data import build_kto_examples, build_preference_pairs

COMPLETIONS = ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "c0", "c1", "c2", "c3"]
REWARDS = [1, 0, 0, 1,  # group a: 2 correct, 2 wrong -> min(2, 2) = 2 pairs: (a0, a1), (a3, a2)
           1, 1, 1, 1,  # group b: all correct -> no pair
           0, 1, 0, 0]  # group c: 1 correct, 3 wrong -> 1 pair: (c1, c0)


def test_build_preference_pairs_min_pairs_in_order():
    ds = build_preference_pairs(["pa", "pb", "pc"], COMPLETIONS, REWARDS, group_size=4)
    assert ds.column_names == ["prompt", "chosen", "rejected"]
    assert ds["prompt"] == ["pa", "pa", "pc"]
    assert ds["chosen"] == ["a0", "a3", "c1"]
    assert ds["rejected"] == ["a1", "a2", "c0"]
    # one prompt per completion (the rollout layout) and tensor rewards give the same pairs
    per_completion = [p for p in ["pa", "pb", "pc"] for _ in range(4)]
    ds2 = build_preference_pairs(per_completion, COMPLETIONS, torch.tensor(REWARDS, dtype=torch.float32), 4)
    assert ds2.to_dict() == ds.to_dict()


def test_build_preference_pairs_without_signal_is_empty_with_columns():
    ds = build_preference_pairs(["p"], ["x", "y"], [0.0, 0.0], group_size=2)
    assert len(ds) == 0 and ds.column_names == ["prompt", "chosen", "rejected"]


def test_build_kto_examples():
    ds = build_kto_examples(["pa", "pb", "pc"], COMPLETIONS, REWARDS, group_size=4)
    assert ds.column_names == ["prompt", "completion", "label"]
    assert len(ds) == 12 and ds["label"] == [bool(r) for r in REWARDS]
    mixed = build_kto_examples(["pa", "pb", "pc"], COMPLETIONS, REWARDS, group_size=4, only_mixed_groups=True)
    assert mixed["completion"] == ["a0", "a1", "a2", "a3", "c0", "c1", "c2", "c3"]  # group b dropped
    assert mixed["label"] == [True, False, False, True, False, True, False, False]


@pytest.mark.parametrize("builder", [build_preference_pairs, build_kto_examples])
@pytest.mark.parametrize("args, match", [
    ((["p"], ["x", "y"], [1.0], 2), "rewards"),
    ((["p"], ["x", "y", "z"], [1.0, 0.0, 1.0], 2), "completions"),
    ((["p", "q", "r"], ["x", "y", "z", "w"], [1.0, 0.0, 1.0, 0.0], 2), "prompts"),
    ((["p", "p", "q", "p"], ["x", "y", "z", "w"], [1.0, 0.0, 1.0, 0.0], 2), "prompts differ"),
    ((["p"], ["x", "y"], [1.0, 0.0], 0), "group_size"),
])
def test_builders_validate_lengths(builder, args, match):
    with pytest.raises(ValueError, match=match):
        builder(*args)


def test_build_preference_pairs_needs_groups_of_two():
    with pytest.raises(ValueError, match="group_size"):
        build_preference_pairs(["p", "q"], ["x", "y"], [1.0, 0.0], group_size=1)


def test_pairs_to_examples_unpairs_chosen_and_rejected():
    from minirl.preference_data import pairs_to_examples

    pairs = {"prompt": ["p", "q"], "chosen": ["c0", "c1"], "rejected": ["r0", "r1"]}
    ds = pairs_to_examples(pairs)
    assert ds.column_names == ["prompt", "completion", "label"]
    assert ds["prompt"] == ["p", "p", "q", "q"]
    assert ds["completion"] == ["c0", "r0", "c1", "r1"]
    assert ds["label"] == [True, False, True, False]


def test_flip_pairs_swaps_exactly_the_share_asked_for():

    from minirl.preference_data import flip_pairs

    pairs = Dataset.from_dict({"prompt": [f"p{i}" for i in range(10)], "chosen": [f"c{i}" for i in range(10)],
                               "rejected": [f"r{i}" for i in range(10)]})
    noisy = flip_pairs(pairs, 0.3, seed=4)
    assert sum(noisy["flipped"]) == 3  # round(0.3 * 10)
    for i, f in enumerate(noisy["flipped"]):
        assert (noisy["chosen"][i], noisy["rejected"][i]) == ((f"r{i}", f"c{i}") if f else (f"c{i}", f"r{i}"))
    assert noisy.to_dict() == flip_pairs(pairs, 0.3, seed=4).to_dict()  # same seed, same flips
    assert sum(flip_pairs(pairs, 0.0)["flipped"]) == 0 and sum(flip_pairs(pairs, 1.0)["flipped"]) == 10
    with pytest.raises(ValueError, match="fraction"):
        flip_pairs(pairs, 1.5)
