"""Preference data from task rollouts: sample G completions per prompt from the model itself, score them with
the task's checker, and pair right with wrong inside each group (DPO, IPO, SimPO) or label each completion (KTO).

This is the offline pipeline of Rafailov et al. 2023 (sample from the SFT model, label, then optimise against the
frozen SFT model); ``flip_pairs`` adds label noise on purpose (notebook 08).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from . import decoding, tasks


@torch.no_grad()
def sample_preference_data(model, tokenizer, prompts_data, *, n_prompts: int, group_size: int, max_new_tokens: int,
                           temperature: float = 1.0, seed: int = 0, prompts_per_batch: int = 64):
    """Preference data from the model's own samples: G completions per prompt, scored by the task's checker.

    ``n_prompts`` prompts are drawn without replacement (seeded), each sampled ``group_size`` times with
    ``decoding.generate``, scored with ``tasks.score``; then ``build_preference_pairs`` makes
    (correct, wrong) pairs inside each group and ``build_kto_examples`` labels every completion
    (all groups: KTO can use the groups that are all correct or all wrong, which give no pair).

    Args:
        prompts_data: Dataset with prompt and answer columns (e.g. the train split).
        n_prompts, group_size, max_new_tokens, temperature: what to sample.
        seed: the prompt choice and the sampling (the global RNG is restored afterwards).
        prompts_per_batch: prompts per generate call.

    Returns:
        (pairs Dataset, kto examples Dataset, info dict with samples, sample_accuracy, mixed_groups (share of
        groups with both a correct and a wrong completion), truncated_rate and pairs).
    """
    gen = torch.Generator().manual_seed(seed)
    rows = prompts_data.select(torch.randperm(len(prompts_data), generator=gen)[:n_prompts].tolist())
    prompts, answers = list(rows["prompt"]), list(rows["answer"])
    completions, rewards, truncated = [], [], []
    with torch.random.fork_rng():  # CPU and CUDA generators are restored on exit
        torch.manual_seed(seed)
        for i in range(0, len(prompts), prompts_per_batch):
            r = decoding.generate(model, tokenizer, prompts[i:i + prompts_per_batch], group_size, max_new_tokens,
                                 temperature=temperature, recompute_logprobs=False)
            completions += r.completions
            truncated += r.truncated.tolist()
            rewards += [tasks.score(c, answers[i + j // group_size]).reward for j, c in enumerate(r.completions)]
    pairs = build_preference_pairs(prompts, completions, rewards, group_size)
    examples = build_kto_examples(prompts, completions, rewards, group_size)
    per_group = torch.tensor(rewards).view(-1, group_size)
    mixed = ((per_group > 0.5).any(1) & (per_group <= 0.5).any(1)).float().mean()
    info = {"samples": len(completions), "sample_accuracy": float(np.mean(rewards)), "mixed_groups": float(mixed),
            "truncated_rate": float(np.mean(truncated)), "pairs": len(pairs)}
    return pairs, examples, info


def _group_prompts(prompts: Sequence[str], n: int, group_size: int) -> list[str]:
    """One prompt per group from either one prompt per group or one per completion (identical within a group)."""
    n_groups = n // group_size
    if len(prompts) == n_groups:
        return list(prompts)
    if len(prompts) == n:
        grouped = [prompts[g * group_size] for g in range(n_groups)]
        for g in range(n_groups):
            if any(p != grouped[g] for p in prompts[g * group_size:(g + 1) * group_size]):
                raise ValueError(f"prompts differ inside group {g}; completions must be laid out group by group")
        return grouped
    raise ValueError(f"prompts must have one entry per group ({n_groups}) or per completion ({n}), got {len(prompts)}")


def _check_rollouts(prompts, completions, rewards, group_size: int) -> tuple[list[str], list[float]]:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    rewards = rewards.tolist() if isinstance(rewards, Tensor) else list(rewards)
    if len(rewards) != len(completions):
        raise ValueError(f"rewards has {len(rewards)} entries but completions has {len(completions)}; one reward per "
                         "completion")
    if len(completions) % group_size != 0:
        raise ValueError(f"completions has {len(completions)} entries, not a multiple of group_size={group_size}")
    return _group_prompts(prompts, len(completions), group_size), [float(r) for r in rewards]


def build_preference_pairs(prompts: Sequence[str], completions: Sequence[str], rewards: Sequence[float] | Tensor,
                           group_size: int, *, threshold: float = 0.5):
    """Turn groups of sampled completions with verifiable rewards into (prompt, chosen, rejected) pairs.

    Completions come group by group (G = ``group_size`` samples of the same prompt, as ``decoding.generate`` lays
    them out). In each group a completion is correct when its reward > ``threshold`` (0/1 rewards: reward 1).
    The k-th correct completion (in sampling order) is paired with the k-th wrong one, so a group gives
    min(#correct, #wrong) pairs and no completion is used twice; a group with no correct or no wrong completion
    gives none. Deterministic: same input, same pairs, same order.

    Why min and not all #correct x #wrong pairs: every completion appears in at most one pair, so no single sample
    dominates the loss and the number of pairs is the number of independent comparisons.

    Args:
        prompts: one prompt per group (length B / G), or one per completion (length B, equal within a group).
        completions: (B,) completion strings, group by group.
        rewards: (B,) rewards (list or tensor), e.g. 0/1 correctness.
        group_size: G >= 2.
        threshold: reward above which a completion counts as correct.

    Returns:
        datasets.Dataset with string columns ``prompt``, ``chosen``, ``rejected`` (possibly 0 rows).

    Raises:
        ValueError: if group_size < 2, the lengths of prompts / completions / rewards do not match, B is not a
            multiple of group_size, or prompts differ within a group.
    """
    from datasets import Dataset, Features, Value

    if isinstance(group_size, int) and not isinstance(group_size, bool) and group_size < 2:
        raise ValueError(f"group_size must be >= 2 to pair completions of the same prompt, got {group_size}")
    group_prompts, rewards = _check_rollouts(prompts, completions, rewards, group_size)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for g, prompt in enumerate(group_prompts):
        idx = range(g * group_size, (g + 1) * group_size)
        correct = [completions[i] for i in idx if rewards[i] > threshold]
        wrong = [completions[i] for i in idx if rewards[i] <= threshold]
        for chosen, rejected in zip(correct, wrong, strict=False):  # zip stops at min(#correct, #wrong)
            rows["prompt"].append(prompt)
            rows["chosen"].append(chosen)
            rows["rejected"].append(rejected)
    features = Features({"prompt": Value("string"), "chosen": Value("string"), "rejected": Value("string")})
    return Dataset.from_dict(rows, features=features)


def build_kto_examples(prompts: Sequence[str], completions: Sequence[str], rewards: Sequence[float] | Tensor,
                       group_size: int, *, threshold: float = 0.5, only_mixed_groups: bool = False):
    """Turn sampled completions with verifiable rewards into KTO's unpaired (prompt, completion, label) examples.

    Every completion becomes one example, labelled desirable when its reward > ``threshold``. With
    ``only_mixed_groups=True`` only groups that hold both a correct and a wrong completion are kept, i.e. the
    same completions ``build_preference_pairs`` can draw from (for a like-for-like comparison with DPO).
    Order is preserved (group by group, sampling order).

    Args:
        prompts: one prompt per group (length B / G), or one per completion (length B, equal within a group).
        completions: (B,) completion strings, group by group.
        rewards: (B,) rewards (list or tensor), e.g. 0/1 correctness.
        group_size: G >= 1.
        threshold: reward above which a completion is desirable.
        only_mixed_groups: drop groups whose completions are all correct or all wrong.

    Returns:
        datasets.Dataset with columns ``prompt`` (string), ``completion`` (string), ``label`` (bool, desirable).

    Raises:
        ValueError: if the lengths of prompts / completions / rewards do not match, B is not a multiple of
            group_size, group_size < 1, or prompts differ within a group.
    """
    from datasets import Dataset, Features, Value

    group_prompts, rewards = _check_rollouts(prompts, completions, rewards, group_size)
    rows = {"prompt": [], "completion": [], "label": []}
    for g, prompt in enumerate(group_prompts):
        idx = range(g * group_size, (g + 1) * group_size)
        labels = [rewards[i] > threshold for i in idx]
        if only_mixed_groups and (all(labels) or not any(labels)):
            continue
        for i, label in zip(idx, labels, strict=True):
            rows["prompt"].append(prompt)
            rows["completion"].append(completions[i])
            rows["label"].append(label)
    features = Features({"prompt": Value("string"), "completion": Value("string"), "label": Value("bool")})
    return Dataset.from_dict(rows, features=features)


def pairs_to_examples(pairs):
    """Unpair preference pairs into KTO examples: each chosen completion desirable, each rejected one not.

    KTO then sees exactly the completions DPO sees, with the pairing thrown away, which makes the comparison of
    the two like for like. Order: the chosen then the rejected completion of pair 0, then of pair 1, ...

    Args:
        pairs: a Dataset (or dict of lists) with columns ``prompt``, ``chosen``, ``rejected``.

    Returns:
        datasets.Dataset with columns ``prompt``, ``completion``, ``label`` (bool), twice as many rows as pairs.
    """
    from datasets import Dataset, Features, Value

    rows = {"prompt": [], "completion": [], "label": []}
    for prompt, chosen, rejected in zip(pairs["prompt"], pairs["chosen"], pairs["rejected"], strict=True):
        rows["prompt"] += [prompt, prompt]
        rows["completion"] += [chosen, rejected]
        rows["label"] += [True, False]
    features = Features({"prompt": Value("string"), "completion": Value("string"), "label": Value("bool")})
    return Dataset.from_dict(rows, features=features)


def flip_pairs(pairs, fraction: float, seed: int = 0):
    """Label noise: swap chosen and rejected in a random share of the pairs.

    Exactly ``round(fraction * n)`` pairs are flipped, chosen without replacement by a seeded permutation (same
    seed, same flips). A column ``flipped`` (bool) records which, so a notebook can follow the noisy pairs.

    Args:
        pairs: a Dataset with columns ``prompt``, ``chosen``, ``rejected``.
        fraction: share of pairs to flip, in [0, 1].
        seed: seed of the choice of pairs.

    Returns:
        datasets.Dataset with the same columns plus ``flipped``.

    Raises:
        ValueError: if fraction is outside [0, 1].
    """
    from datasets import Dataset, Features, Value

    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    n = len(pairs)
    k = round(fraction * n)
    flipped = torch.zeros(n, dtype=torch.bool)
    flipped[torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k]] = True
    chosen, rejected = list(pairs["chosen"]), list(pairs["rejected"])
    rows = {"prompt": list(pairs["prompt"]), "chosen": [], "rejected": [], "flipped": flipped.tolist()}
    for c, r, f in zip(chosen, rejected, rows["flipped"], strict=True):
        rows["chosen"].append(r if f else c)
        rows["rejected"].append(c if f else r)
    features = Features({"prompt": Value("string"), "chosen": Value("string"), "rejected": Value("string"),
                         "flipped": Value("bool")})
    return Dataset.from_dict(rows, features=features)

