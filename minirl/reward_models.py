"""Learned rewards: the losses that train a reward model, and the exact labels the running-sums task gives them.

A reward model here is a scalar head on the tiny transformer (``models.ValueModel``, the critic's architecture) read
at a completion's last token (an outcome score) or at the end of each partial sum (a process score). Three losses,
one function each (B = pairs or completions, S = steps):

- ``bradley_terry_loss``: pairs (chosen, rejected), -log sigmoid(r_c - r_r - margin) (InstructGPT; TRL's
  ``RewardTrainer``, with its optional margin and centring term);
- ``outcome_loss``: right or wrong per completion, binary cross-entropy on the score as a logit (an ORM);
- ``process_loss``: right or wrong per partial sum, binary cross-entropy over each completion's steps (a PRM,
  Lightman et al. 2023).

The task has an exact gold reward and exact step labels (``step_labels``): every partial sum is right or wrong, so a
learned reward can be measured against the truth, which no real task allows. Over-optimisation is read against the
distance d = sqrt(KL) from the starting policy: ``best_of_n_kl`` for best-of-n, and ``gao_fit`` fits Gao et al.'s
forms of the gold reward against d.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import choice, ndim, same_shape, zero_outside


def bradley_terry_loss(chosen_rewards: Tensor, rejected_rewards: Tensor, *, margin: Tensor | None = None,
                       center_coef: float | None = None) -> Tensor:
    """The Bradley-Terry loss of a reward model on preference pairs: -mean log sigmoid(r_c - r_r - margin), plus
    ``center_coef`` * mean((r_c + r_r)^2) (TRL's ``center_rewards_coefficient``: keeps the rewards near 0, since the
    loss alone sees only differences).

    Example: r_c = [1.0, 0.0], r_r = [0.0, 0.0]: -(log sigmoid(1) + log sigmoid(0)) / 2 = (0.313262 + 0.693147) / 2 =
    0.503204; with margin [1, 0] the first term is -log sigmoid(0) = 0.693147: 0.693147; centring 0.01 adds
    0.01 * (1 + 0) / 2 = 0.005. Gradient d/d r_c = -sigmoid(-(r_c - r_r - m)) / B: (-0.134471, -0.25).

    Args:
        chosen_rewards, rejected_rewards: (B,) the reward model's scores of each pair's preferred and other answer.
        margin: optional (B,) how much better the chosen is (TRL's ``margin`` column); None: 0.
        center_coef: optional weight of the centring term (TRL's default None: off).

    Returns:
        The scalar loss (mean over pairs).

    Raises:
        ValueError: for mismatched or non-1-D shapes, a non-finite reward, or center_coef < 0.

    Source: Bradley & Terry 1952; Ouyang et al. 2022 (InstructGPT), eq. 1; TRL 1.16 ``RewardTrainer.compute_loss``
    (margin: Touvron et al. 2023, Llama 2, eq. 2; centring: Eisenstein et al. 2023).
    """
    ndim("chosen_rewards", chosen_rewards, 1, "(B,)")
    same_shape(chosen_rewards=chosen_rewards, rejected_rewards=rejected_rewards)
    if not (torch.isfinite(chosen_rewards).all() and torch.isfinite(rejected_rewards).all()):
        raise ValueError("chosen_rewards and rejected_rewards must be finite")
    if center_coef is not None and center_coef < 0:
        raise ValueError(f"center_coef must be >= 0 or None, got {center_coef}")
    diff = chosen_rewards - rejected_rewards
    if margin is not None:
        same_shape(chosen_rewards=chosen_rewards, margin=margin)
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()  # logsigmoid: finite for any difference
    if center_coef:
        loss = loss + center_coef * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss


def outcome_loss(scores: Tensor, labels: Tensor) -> Tensor:
    """An outcome reward model's loss: binary cross-entropy of each completion's score (a logit) against its 0/1
    label (right or wrong). The trained score is then log-odds of being right.

    Example: scores [0, 2], labels [1, 0]: (log 2 + log(1 + e^2)) / 2 = (0.693147 + 2.126928) / 2 = 1.410038.

    Args:
        scores: (B,) logits.
        labels: (B,) 0 or 1.

    Raises:
        ValueError: for mismatched shapes or a label other than 0 or 1.

    Source: Cobbe et al. 2021 (verifiers, GSM8K); Lightman et al. 2023 ("Let's Verify Step by Step"), the ORM.
    """
    ndim("scores", scores, 1, "(B,)")
    same_shape(scores=scores, labels=labels)
    _binary("labels", labels)
    return F.binary_cross_entropy_with_logits(scores, labels.to(scores.dtype))


def process_loss(step_scores: Tensor, step_labels: Tensor, step_mask: Tensor) -> Tensor:
    """A process reward model's loss: binary cross-entropy of every step's score against its 0/1 label (was this
    partial sum right?), averaged over the valid steps of the batch; 0 for a batch without one.

    Example: scores [[0, 2], [1, 9]], labels [[1, 1], [0, 1]], mask [[1, 1], [1, 0]]: (log 2 + log(1 + e^-2) +
    log(1 + e)) / 3 = (0.693147 + 0.126928 + 1.313262) / 3 = 0.711112 (the masked 9 is never read).

    Args:
        step_scores: (B, S) logits, one per step.
        step_labels: (B, S) 0 or 1 on valid steps (anything elsewhere).
        step_mask: (B, S) 1 on valid steps.

    Raises:
        ValueError: for mismatched shapes or a label other than 0 or 1 on a valid step.

    Source: Lightman et al. 2023, the PRM (per-step correctness); Uesato et al. 2022.
    """
    same_shape(step_scores=step_scores, step_labels=step_labels, step_mask=step_mask)
    ndim("step_scores", step_scores, 2, "(B, S)")
    valid = step_mask > 0
    _binary("step_labels", step_labels[valid])
    per_step = F.binary_cross_entropy_with_logits(zero_outside(step_scores, step_mask),
                                                  zero_outside(step_labels.to(step_scores.dtype), step_mask),
                                                  reduction="none")
    return zero_outside(per_step, step_mask).sum() / valid.sum().clamp(min=1)


def _binary(name: str, x: Tensor) -> None:
    if not ((x == 0) | (x == 1)).all():
        raise ValueError(f"{name} must be 0 or 1, got {x[~((x == 0) | (x == 1))][:3].tolist()}")


def step_labels(prompt: str, completion: str) -> list[int]:
    """The gold label of each partial sum a completion writes: 1 when "a+b=c" has the right running total on the left
    and the right sum on the right, 0 otherwise (a step after a wrong one is judged against the true running total).

    Example: "7+5+9=", "7+5=13;13+9=22#22" -> [0, 0]; "7+5=12;12+9=22#22" -> [1, 0]; "7+5=12;12+9=21#21" -> [1, 1];
    a step that does not parse counts as wrong: "7+5=12;x#1" -> [1, 0].

    Raises:
        ValueError: for a prompt that is not "a+b+...=".
    """
    try:
        terms = [int(t) for t in prompt.rstrip("=").split("+")]
    except ValueError:
        raise ValueError(f"prompt must be a running sum 'a+b+...=', got {prompt!r}") from None
    labels, total = [], terms[0]
    for i, step in enumerate(completion.split("#")[0].split(";")):
        if i + 1 >= len(terms):
            labels.append(0)  # more steps than the problem has
            continue
        total_next = total + terms[i + 1]
        labels.append(int(step == f"{total}+{terms[i + 1]}={total_next}"))
        total = total_next
    return labels


def sequence_scores(reward_model, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """(B,) a scalar-head model's score of each sequence: its output at the last real token (left padding: the
    last column), as a sequence-classification head reads it (TRL's reward models).

    Raises:
        ValueError: for a row with no real token.
    """
    ndim("input_ids", input_ids, 2, "(B, L)")
    if not (attention_mask.sum(-1) > 0).all():
        raise ValueError("attention_mask has a row with no real token: it has no score")
    values = reward_model(input_ids, attention_mask)  # (B, L)
    last = attention_mask.shape[1] - 1 - attention_mask.flip(-1).float().argmax(-1)  # (B,) the last real token
    return values.gather(1, last.unsqueeze(1)).squeeze(1)


def learned_reward(reward_model, tokenizer, *, batch_size: int = 64):
    """A reward function in TRL's form (``rewards.score_completions``) that scores prompt + completion with
    ``reward_model`` (``sequence_scores``): batched, without gradient, the model in eval mode (restored after), each
    row scored alone (its own padding), so the result does not depend on the batch or its order.

    Example: ``rl.train_rl(policy, tok, cfg, data, reward_fn=learned_reward(rm, tok))`` trains against the proxy.
    """

    def score_batch(prompts, completions):
        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        enc = tokenizer(texts, return_tensors="pt", padding=True).to(next(reward_model.parameters()).device)
        return sequence_scores(reward_model, enc.input_ids, enc.attention_mask).tolist()

    return as_reward_function(reward_model, score_batch, batch_size=batch_size)


def as_reward_function(reward_model, score_batch, *, batch_size: int = 64):
    """A reward function in TRL's form from ``score_batch(prompts, completions) -> list[float]``: called on
    ``batch_size`` rows at a time, without gradient, with ``reward_model`` in eval mode (its mode restored after).
    ``learned_reward`` and ``reward_model_loop.process_reward`` are two of them."""

    @torch.no_grad()
    def reward_model_score(prompts, completions, **columns):
        was_training = reward_model.training
        reward_model.eval()
        out = []
        for i in range(0, len(prompts), batch_size):
            out += score_batch(prompts[i:i + batch_size], completions[i:i + batch_size])
        reward_model.train(was_training)
        return out

    return reward_model_score


def ensemble_reward(reward_fns, *, how: str = "mean"):
    """One reward function from several (TRL's form): each row's mean, or its minimum, over the members' scores.
    The minimum is the conservative ensemble (a completion scores high only if every member agrees).

    Example: members scoring [1.0, -2.0] and [3.0, 0.0]: mean [2.0, -1.0], min [1.0, -2.0].

    Raises:
        ValueError: for no members or another ``how``.

    Source: Coste et al. 2024, "Reward Model Ensembles Help Mitigate Overoptimization", section 3 (mean, worst-case).
    """
    choice("how", how, ("mean", "min"))
    reward_fns = list(reward_fns)
    if not reward_fns:
        raise ValueError("reward_fns is empty: an ensemble needs at least one member")

    def ensemble_score(prompts, completions, **columns):
        scores = torch.tensor([fn(prompts, completions, **columns) for fn in reward_fns], dtype=torch.float64)
        return (scores.mean(0) if how == "mean" else scores.min(0).values).tolist()

    return ensemble_score


def best_of_n_gold(proxy: Tensor, gold: Tensor, ns) -> Tensor:
    """Best-of-n measured by another score: for each n, each prompt's pick is the sample the proxy scores highest
    among its first n (the first of equals), and the result is the picks' mean ``gold`` score.
    ``best_of_n_gold(proxy, proxy, ns)`` is the picks' proxy score.

    Example: one prompt, proxy [0.1, 0.9, 0.5, 0.95], gold [1, 0, 1, 0]: n = 1 picks sample 0 (gold 1), n = 2 and 3
    sample 1 (gold 0), n = 4 sample 3 (gold 0): [1, 0, 0, 0].

    Args:
        proxy: (P, N) the proxy's score of N samples of each of P prompts, in sampling order.
        gold: (P, N) the score that measures the picks (the true reward).
        ns: the n to measure, each in [1, N].

    Returns:
        (len(ns),) the mean over prompts of the pick's gold score, for each n.

    Raises:
        ValueError: for mismatched or non-2-D shapes, a non-finite proxy score, or an n outside [1, N].

    Source: Nakano et al. 2021 (WebGPT), section 3.3; Gao, Schulman and Hilton 2023, section 2.
    """
    ndim("proxy", proxy, 2, "(P, N)")
    same_shape(proxy=proxy, gold=gold)
    if not torch.isfinite(proxy).all():
        raise ValueError("proxy must be finite: a NaN score would be picked or skipped silently")
    ns = list(ns)
    if not ns or min(ns) < 1 or max(ns) > proxy.shape[1]:
        raise ValueError(f"every n must be in [1, {proxy.shape[1]}] (the samples per prompt), got {ns}")
    picks = [proxy[:, :n].argmax(1, keepdim=True) for n in ns]  # (P, 1) each: argmax returns the first of equals
    return torch.stack([gold.gather(1, pick).double().mean() for pick in picks])


def best_of_n_kl(n: int) -> float:
    """KL(best-of-n || the policy) in nats: log n - (n - 1) / n (0 at n = 1), the distance Gao et al. plot their
    best-of-n curves against. Exact when no two samples can tie (every completion distinct); when the same completion
    can be drawn twice, as on a small task, it is an upper bound on the true KL (Beirami et al. 2024).

    Example: n = 4: log 4 - 3/4 = 0.636294.

    Raises:
        ValueError: for n < 1.

    Source: Stiennon et al. 2020, appendix G.3; Gao, Schulman and Hilton 2023, section 2; Beirami et al. 2024,
    "Theoretical guarantees on the best-of-n alignment policy".
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return math.log(n) - (n - 1) / n


#: The functional forms of the gold reward against d = sqrt(KL) (Gao et al. 2023, eq. 1-2): d (alpha - beta d) for
#: best-of-n, d (alpha - beta log d) for RL.
GAO_FORMS = ("bon", "rl")


def gao_fit(d: Tensor, gold_gain: Tensor, *, form: str) -> tuple[float, float]:
    """Least-squares (alpha, beta) of Gao et al.'s form for the gold reward's gain over the start at distance
    d = sqrt(KL): "bon" R(d) = d (alpha - beta d), "rl" R(d) = d (alpha - beta log d). Linear in (alpha, beta), so
    one least-squares solve; the peak is at d = alpha / (2 beta) ("bon") or exp(alpha / beta - 1) ("rl").

    Example: d = [1, 2, 3], R = d (1 - 0.2 d) = [0.8, 1.2, 1.2]: "bon" gives (1.0, 0.2) exactly.

    Args:
        d: (N,) distances, sqrt(nats), > 0.
        gold_gain: (N,) the gold reward minus its value at d = 0.
        form: one of ``GAO_FORMS``.

    Raises:
        ValueError: for an unknown form, mismatched shapes, fewer than 2 points, or d <= 0.

    Source: Gao, Schulman and Hilton 2023 ("Scaling Laws for Reward Model Overoptimization"), eq. 1-2.
    """
    choice("form", form, GAO_FORMS)
    ndim("d", d, 1, "(N,)")
    same_shape(d=d, gold_gain=gold_gain)
    if len(d) < 2 or not (d > 0).all():
        raise ValueError(f"need at least 2 points with d > 0, got {d.tolist()}")
    d = d.double()
    second = d * d if form == "bon" else d * torch.log(d)
    features = torch.stack([d, -second], 1)  # (N, 2): R = alpha d - beta second
    solution = torch.linalg.lstsq(features, gold_gain.double().unsqueeze(1)).solution.squeeze(1)
    return float(solution[0]), float(solution[1])
