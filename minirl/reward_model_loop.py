"""Training a reward model on the policy's own completions, labelled by the task's gold reward.

``gold_pairs`` samples G completions of each prompt from a policy and pairs, within each group, a right answer
(chosen) with a wrong one (rejected), as a preference dataset labelled by a perfect annotator would be; ``noise``
flips a share of the pairs (an annotator who is sometimes wrong). ``train_reward_model`` fits a scalar-head model
(``models.ValueModel``) to them with ``reward_models.bradley_terry_loss``; ``pair_accuracy`` measures it on held-out
pairs. The trained model becomes a reward with ``reward_models.learned_reward``. ``gold_labelled`` and
``train_labelled`` do the same for an outcome model (right or wrong) and a process model (each partial sum, read at
the token that closes it: ``step_end_columns``). ``best_of_n`` measures best-of-n against a proxy with the gold
reward, at d = sqrt(KL) of the best-of-n distribution; ``proxy_and_gold`` measures a policy during RL against a
proxy: its fresh samples' gold reward, proxy score and true KL to the start, d = sqrt(KL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import decoding, evaluation, tasks
from .checks import choice
from .reward_models import (
    as_reward_function,
    best_of_n_gold,
    best_of_n_kl,
    bradley_terry_loss,
    outcome_loss,
    process_loss,
    sequence_scores,
    step_labels,
)


@dataclass
class Pairs:
    """Preference pairs as texts (prompt + completion), chosen and rejected, and whether each label was flipped."""

    chosen: list[str]
    rejected: list[str]
    flipped: list[bool]

    def __len__(self) -> int:
        return len(self.chosen)


@torch.no_grad()
def _gold_scored_samples(policy, tokenizer, data, n: int, max_new_tokens: int, seed: int):
    """``n`` samples of each prompt of ``data`` (seeded, the global RNG restored) and their gold rewards, (P * n,)
    in the rollout's order (each prompt's samples together)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        r = decoding.generate(policy, tokenizer, list(data["prompt"]), n, max_new_tokens, recompute_logprobs=False)
    answers = [a for a in data["answer"] for _ in range(n)]
    return r, [tasks.score(c, a).reward for c, a in zip(r.completions, answers, strict=True)]


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
    r, gold = _gold_scored_samples(policy, tokenizer, data, group_size, max_new_tokens, seed)
    right = [g == 1.0 for g in gold]
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

    def batch_loss(rows: list[int]) -> Tensor:
        batch = Pairs([pairs.chosen[i] for i in rows], [pairs.rejected[i] for i in rows], [])
        return bradley_terry_loss(*pair_scores(reward_model, tokenizer, batch), center_coef=center_coef)

    return _fit(reward_model, len(pairs), batch_loss, steps=steps, batch_size=batch_size, lr=lr, seed=seed)


def _fit(reward_model, n_rows: int, batch_loss, *, steps: int, batch_size: int, lr: float, seed: int) -> list[float]:
    """``steps`` AdamW steps on ``batch_loss(rows)``, each on a minibatch of row indices drawn with replacement from
    ``n_rows``; the model in train mode while it runs, left in eval mode; returns each step's loss."""
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(reward_model.parameters(), lr=lr)
    reward_model.train()
    losses = []
    for _ in range(steps):
        loss = batch_loss(torch.randint(n_rows, (min(batch_size, n_rows),), generator=gen).tolist())
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


# ------------------------------------------------------------------------------------- outcome and process models
@dataclass
class Labelled:
    """Completions with their gold labels: right or wrong (``outcome``), and each partial sum's (``steps``)."""

    prompts: list[str]
    completions: list[str]
    outcome: list[int]
    steps: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, rows: list[int]) -> Labelled:
        return Labelled(*([getattr(self, f)[i] for i in rows] for f in ("prompts", "completions", "outcome", "steps")))


@torch.no_grad()
def gold_labelled(policy, tokenizer, data, *, group_size: int = 8, max_new_tokens: int = 40, seed: int = 0
                  ) -> Labelled:
    """``group_size`` samples of each prompt of ``data`` from ``policy``, each labelled by the gold reward (outcome)
    and by ``reward_models.step_labels`` (each partial sum)."""
    r, gold = _gold_scored_samples(policy, tokenizer, data, group_size, max_new_tokens, seed)
    return Labelled(list(r.prompts), list(r.completions), [int(g == 1.0) for g in gold],
                    [step_labels(p, c) for p, c in zip(r.prompts, r.completions, strict=True)])


def step_end_columns(tokenizer, prompt: str, completion: str, length: int) -> list[int]:
    """The column, in the left-padded row of ``length`` tokens, of the token that closes each partial sum of
    ``completion`` (its ';' or '#', or its last character when the completion stops before one): where a process
    model reads a step's score, once the whole step has been written."""
    enc = tokenizer(prompt + completion, return_offsets_mapping=True)
    offsets, pad = enc["offset_mapping"], length - len(enc["input_ids"])
    ends, i = [], len(prompt)
    for segment in completion.split("#")[0].split(";"):
        i += len(segment)
        char = min(i, len(prompt) + len(completion) - 1)  # the separator after the step, or the step's last char
        ends.append(pad + next(k for k, (a, b) in enumerate(offsets) if a <= char < b))
        i += 1
    return ends


def process_scores(reward_model, tokenizer, prompts: list[str], completions: list[str]) -> tuple[Tensor, Tensor]:
    """(B, S) a process model's score of each partial sum (read at ``step_end_columns``) and the (B, S) mask of real
    steps, S the most steps of a completion."""
    device = next(reward_model.parameters()).device
    enc = tokenizer([p + c for p, c in zip(prompts, completions, strict=True)], return_tensors="pt", padding=True)
    values = reward_model(enc.input_ids.to(device), enc.attention_mask.to(device))  # (B, L)
    cols = [step_end_columns(tokenizer, p, c, enc.input_ids.shape[1]) for p, c in zip(prompts, completions,
                                                                                       strict=True)]
    S = max(len(c) for c in cols)
    index = torch.tensor([c + [c[-1]] * (S - len(c)) for c in cols], device=device)
    mask = torch.tensor([[1.0] * len(c) + [0.0] * (S - len(c)) for c in cols], device=device)
    return values.gather(1, index), mask


def train_labelled(reward_model, tokenizer, labelled: Labelled, *, kind: str, steps: int = 200, batch_size: int = 32,
                   lr: float = 1e-3, seed: int = 0) -> list[float]:
    """Fit an outcome model (``kind="outcome"``: ``reward_models.outcome_loss`` on ``sequence_scores``) or a process
    model (``kind="process"``: ``reward_models.process_loss`` on ``process_scores``) to gold-labelled completions;
    returns each step's loss; the model is left in eval mode.

    Raises:
        ValueError: for another kind, no completions or steps < 1.
    """
    choice("kind", kind, ("outcome", "process"))
    if len(labelled) == 0 or steps < 1:
        raise ValueError(f"need completions and steps >= 1, got {len(labelled)} and steps={steps}")
    device = next(reward_model.parameters()).device

    def batch_loss(rows: list[int]) -> Tensor:
        batch = labelled[rows]
        if kind == "outcome":
            enc = tokenizer([p + c for p, c in zip(batch.prompts, batch.completions, strict=True)],
                            return_tensors="pt", padding=True).to(device)
            return outcome_loss(sequence_scores(reward_model, enc.input_ids, enc.attention_mask),
                                torch.tensor(batch.outcome, dtype=torch.float32, device=device))
        scores, mask = process_scores(reward_model, tokenizer, batch.prompts, batch.completions)
        labels = torch.tensor([s + [0] * (scores.shape[1] - len(s)) for s in batch.steps], dtype=torch.float32,
                              device=device)
        return process_loss(scores, labels, mask)

    return _fit(reward_model, len(labelled), batch_loss, steps=steps, batch_size=batch_size, lr=lr, seed=seed)


# ------------------------------------------------------------------------------------------------ best-of-n
@torch.no_grad()
def best_of_n(policy, tokenizer, data, proxy_fn, ns: list[int], *, max_new_tokens: int = 40, seed: int = 0
              ) -> list[dict]:
    """Best-of-n against a proxy reward, measured by the gold one: max(ns) samples of each prompt of ``data`` drawn
    once; for each n, the first n of each prompt's samples, the one the proxy scores highest (the first of equals).

    Args:
        policy: the causal LM sampled.
        tokenizer: its tokenizer.
        data: a Dataset with ``prompt`` and ``answer`` columns.
        proxy_fn: a reward function in TRL's form (``reward_models.learned_reward``), called once on every sample.
        ns: the n to measure, each >= 1.
        max_new_tokens, seed: the sampling.

    Returns:
        One dict per n: n, kl (``reward_models.best_of_n_kl``, nats), d (its square root), gold (the picks' mean gold
        reward), proxy (their mean proxy score).

    Raises:
        ValueError: for an n < 1.
    """
    if not ns or min(ns) < 1:
        raise ValueError(f"every n must be >= 1, got {ns}")
    N = max(ns)
    r, gold = _gold_scored_samples(policy, tokenizer, data, N, max_new_tokens, seed)
    gold = torch.tensor(gold).view(-1, N)
    proxy = torch.tensor(proxy_fn(r.prompts, r.completions), dtype=torch.float32).view(-1, N)
    gold_at, proxy_at = best_of_n_gold(proxy, gold, ns), best_of_n_gold(proxy, proxy, ns)  # (len(ns),) each
    rows = []
    for n, g, p in zip(ns, gold_at.tolist(), proxy_at.tolist(), strict=True):
        kl = best_of_n_kl(n)
        rows.append({"n": n, "kl": kl, "d": math.sqrt(kl), "gold": g, "proxy": p})
    return rows


def proxy_and_gold(policy, start_policy, tokenizer, data, proxy_fn, *, samples_per_prompt: int = 4,
                   max_new_tokens: int = 40, seed: int = 0) -> dict:
    """Where a policy trained against a proxy stands: fresh samples of each prompt of ``data``, their mean gold
    reward, their mean proxy score and the policy's true KL to ``start_policy`` on them (``evaluation.sequence_kl``,
    nats per completion), d = sqrt(KL): ``evaluation.fresh_sample_kl`` with the proxy as its ``reward_fn``. The global
    RNG is restored (safe inside a ``train_rl`` callback).

    Returns:
        dict with gold, proxy, kl, d (sqrt of kl, 0 for a KL below 0 from round-off), n (completions).

    Raises:
        ValueError: for samples_per_prompt < 1 (``decoding.generate``).

    Source: the measurement of Gao, Schulman and Hilton 2023, section 2 (gold and proxy against d = sqrt(KL)).
    """
    m = evaluation.fresh_sample_kl(policy, start_policy, tokenizer, data["prompt"], answers=data["answer"],
                                   reward_fn=proxy_fn, samples_per_prompt=samples_per_prompt,
                                   max_new_tokens=max_new_tokens, seed=seed)
    return {"gold": m["accuracy"], "proxy": m["reward"], "kl": m["kl"], "d": math.sqrt(max(m["kl"], 0.0)),
            "n": m["n"]}


def process_reward(reward_model, tokenizer, *, batch_size: int = 64):
    """A process model as a reward function in TRL's form: each completion's weakest step, the minimum over its
    partial sums of the step's logit (a solution is as good as its worst step: the aggregate of Lightman et al.
    2023, section 3, taken on logits, which orders completions as the minimum probability does). Batched, without
    gradient, the model in eval mode (restored after)."""

    def score_batch(prompts, completions):
        scores, mask = process_scores(reward_model, tokenizer, prompts, completions)  # (b, S) each
        return scores.masked_fill(mask == 0, float("inf")).min(1).values.tolist()

    return as_reward_function(reward_model, score_batch, batch_size=batch_size)
