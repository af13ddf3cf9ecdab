"""Training a reward model on the policy's own completions, labelled by the task's gold reward.

``gold_pairs`` samples G completions of each prompt from a policy and pairs, within each group, a right answer
(chosen) with a wrong one (rejected), as a preference dataset labelled by a perfect annotator would be; ``noise``
flips a share of the pairs (an annotator who is sometimes wrong). ``train_reward_model`` fits a scalar-head model
(``models.ValueModel``) to them with ``reward_models.bradley_terry_loss``; ``pair_accuracy`` measures it on held-out
pairs. The trained model becomes a reward with ``reward_models.learned_reward``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import decoding, tasks
from .reward_models import bradley_terry_loss, sequence_scores


@dataclass
class Pairs:
    """Preference pairs as texts (prompt + completion), chosen and rejected, and whether each label was flipped."""

    chosen: list[str]
    rejected: list[str]
    flipped: list[bool]

    def __len__(self) -> int:
        return len(self.chosen)


@torch.no_grad()
def gold_pairs(policy, tokenizer, data, *, group_size: int = 8, max_new_tokens: int = 40, noise: float = 0.0,
               seed: int = 0, pairs_per_group: int = 2) -> Pairs:
    """Up to ``pairs_per_group`` (right, wrong) pairs from each prompt's ``group_size`` samples of ``policy`` (a
    group all right or all wrong gives none), each label flipped with probability ``noise``.

    Args:
        policy: the causal LM whose completions are labelled (the reward model must judge the policy's own text).
        tokenizer: its tokenizer.
        data: a Dataset with ``prompt`` and ``answer`` columns (the running-sums task).
        group_size, max_new_tokens: the sampling.
        noise: the share of pairs whose label is flipped, in [0, 0.5).
        seed: seeds the sampling and the flips.
        pairs_per_group: the most pairs taken from one group (right i with wrong i, in sampling order).

    Raises:
        ValueError: for noise outside [0, 0.5) or pairs_per_group < 1.
    """
    if not 0 <= noise < 0.5 or pairs_per_group < 1:
        raise ValueError(f"need 0 <= noise < 0.5 and pairs_per_group >= 1, got {noise}, {pairs_per_group}")
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        r = decoding.generate(policy, tokenizer, list(data["prompt"]), group_size, max_new_tokens,
                              recompute_logprobs=False)
    answers = [a for a in data["answer"] for _ in range(group_size)]
    right = [tasks.score(c, a).reward == 1.0 for c, a in zip(r.completions, answers, strict=True)]
    chosen, rejected, flipped = [], [], []
    for g in range(len(data)):
        rows = range(g * group_size, (g + 1) * group_size)
        good = [r.prompts[i] + r.completions[i] for i in rows if right[i]]
        bad = [r.prompts[i] + r.completions[i] for i in rows if not right[i]]
        for c, w in list(zip(good, bad, strict=False))[:pairs_per_group]:  # as many as the shorter side
            flip = bool(torch.rand(1, generator=gen) < noise)
            chosen.append(w if flip else c)
            rejected.append(c if flip else w)
            flipped.append(flip)
    return Pairs(chosen, rejected, flipped)


def pair_scores(reward_model, tokenizer, pairs: Pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) scores of every pair, (N,) each, with gradient (training) unless called under no_grad."""
    device = next(reward_model.parameters()).device
    enc = tokenizer(pairs.chosen + pairs.rejected, return_tensors="pt", padding=True).to(device)
    scores = sequence_scores(reward_model, enc.input_ids, enc.attention_mask)
    return scores[:len(pairs)], scores[len(pairs):]


def train_reward_model(reward_model, tokenizer, pairs: Pairs, *, steps: int = 200, batch_size: int = 32,
                       lr: float = 1e-3, center_coef: float | None = 0.01, seed: int = 0) -> list[float]:
    """Fit ``reward_model`` to ``pairs`` with the Bradley-Terry loss (AdamW, ``steps`` minibatches drawn with
    replacement); returns the loss of each step. The model is left in eval mode.

    Raises:
        ValueError: for no pairs or steps < 1.
    """
    if len(pairs) == 0 or steps < 1:
        raise ValueError(f"need pairs and steps >= 1, got {len(pairs)} pairs and steps={steps}")
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(reward_model.parameters(), lr=lr)
    reward_model.train()
    losses = []
    for _ in range(steps):
        rows = torch.randint(len(pairs), (min(batch_size, len(pairs)),), generator=gen).tolist()
        batch = Pairs([pairs.chosen[i] for i in rows], [pairs.rejected[i] for i in rows], [])
        chosen, rejected = pair_scores(reward_model, tokenizer, batch)
        loss = bradley_terry_loss(chosen, rejected, center_coef=center_coef)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    reward_model.eval()
    return losses


@torch.no_grad()
def pair_accuracy(reward_model, tokenizer, pairs: Pairs) -> float:
    """The share of pairs whose chosen answer the model scores higher (ties count as wrong)."""
    chosen, rejected = pair_scores(reward_model, tokenizer, pairs)
    return float((chosen > rejected).float().mean())
