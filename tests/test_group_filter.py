"""Tests of minirl.group_filter: DAPO's dynamic sampling (has_signal, dynamic_sampling), by hand, and unscored
rows."""

import math

import pytest
import torch

from minirl import group_filter
from minirl.advantages import group_advantages

D = torch.float64


def t(*rows):
    return torch.tensor(rows, dtype=D)


# --- dynamic sampling -------------------------------------------------------------------------------------------
ROUNDS = [t([1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]).flatten(), t([1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 1, 0]).flatten()]


def scripted(rounds, calls):
    def sample_round(i):
        calls.append(i)
        return rounds[i % len(rounds)], rounds[i % len(rounds)]  # the payload is the round's rewards
    return sample_round


def trained_rewards(ds, G=4):
    return [payload.view(-1, G)[g].tolist() for payload, groups in ds.picks for g in groups]


# paper-index: group_filter.has_signal
def test_has_signal():
    # groups of 2: [0, 1] mixed, [1, 1] all right, [0, 0] all wrong
    assert group_filter.has_signal(t(0, 1, 1, 1, 0, 0).flatten(), 2).tolist() == [True, False, False]
    assert group_filter.has_signal(ROUNDS[0], 4).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="group_size"):
        group_filter.has_signal(torch.zeros(5), 4)
    with pytest.raises(ValueError, match="rewards"):
        group_filter.has_signal(torch.zeros(2, 4), 4)


# paper-index: group_filter.dynamic_sampling
def test_group_filter_acceptance_example():
    # need 2 groups. Round 1: [1,1,1,1] no, [0,1,0,0] yes, [0,0,0,0] no -> 1 kept, 1 still needed.
    # Round 2: [1,0,1,1] yes (kept, batch full), [1,1,1,1] no, [0,0,1,0] yes but surplus -> dropped.
    calls = []
    ds = group_filter.dynamic_sampling(scripted(ROUNDS, calls), num_groups=2, group_size=4, max_gen_batches=4)
    assert trained_rewards(ds) == [[0, 1, 0, 0], [1, 0, 1, 1]]
    assert calls == [0, 1] and ds.rounds == 2
    assert ds.samples == 24  # 2 rounds x 3 prompts x 4 samples
    assert (ds.groups_seen, ds.groups_with_signal, ds.groups_kept) == (6, 3, 2)


def test_group_filter_raises_when_rounds_run_out():
    # only round 1 repeated: 1 useful group per round, so 3 groups need 3 rounds but only 2 are allowed
    calls = []
    with pytest.raises(RuntimeError, match=r"found 2 of 3 groups.*max_gen_batches=2.*allow_partial"):
        group_filter.dynamic_sampling(scripted(ROUNDS[:1], calls), num_groups=3, group_size=4, max_gen_batches=2)
    assert calls == [0, 1]  # never more rounds than max_gen_batches


def test_group_filter_never_loops_forever_on_zero_signal():
    calls = []
    with pytest.raises(RuntimeError, match="found 0 of 1"):
        group_filter.dynamic_sampling(scripted([torch.ones(8)], calls), 1, 4, max_gen_batches=5)
    assert len(calls) == 5


def test_group_filter_allow_partial_returns_what_it_found():
    ds = group_filter.dynamic_sampling(scripted(ROUNDS[:1], []), num_groups=3, group_size=4, max_gen_batches=2,
                                   allow_partial=True)
    assert trained_rewards(ds) == [[0, 1, 0, 0], [0, 1, 0, 0]]  # the useful group of each of the 2 rounds
    assert ds.groups_kept == 2 and ds.rounds == 2


def test_group_filter_bad_arguments():
    with pytest.raises(ValueError):
        group_filter.dynamic_sampling(scripted(ROUNDS, []), num_groups=0, group_size=4, max_gen_batches=2)
    with pytest.raises(ValueError):
        group_filter.dynamic_sampling(scripted(ROUNDS, []), num_groups=1, group_size=4, max_gen_batches=0)


# --- unscored rows (NaN rewards) in has_signal ------------------------------------------------------------------------
def test_unscored_rows_and_has_signal():
    nan = math.nan
    r = torch.tensor([1, 0, 1, 1, 1, 1, 1, nan, 0, 1, nan, nan, nan, nan, nan])
    # differ | all equal | two scored rows that differ | one scored row | none scored
    assert group_filter.has_signal(r, 3).tolist() == [True, False, True, False, False]
    # consistent with the advantages: a group has signal exactly when one of its advantages is non-zero
    nonzero = group_advantages(r, 3).view(-1, 3).ne(0).any(1)
    assert torch.equal(group_filter.has_signal(r, 3), nonzero)
