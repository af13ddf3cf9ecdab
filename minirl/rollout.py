"""Rollouts: what a batch of sampled completions holds (``Rollout``), their masks, and their token log-probs.

``decoding.generate`` fills a ``Rollout``: G sampled completions per prompt. This module holds what the trainer reads
of it. The behaviour log-probs are recomputed by one ordinary forward pass at the SAME temperature the sampler used
(``token_logprobs``): that is the distribution the tokens were really drawn from, so at the first optimisation step
the importance ratio is exactly 1. (A classic bug is to sample at temperature 0.7 and compute the log-probs at 1.0:
every ratio is then off before any update.) The forward is chunked by micro-batch and takes a selective
log-softmax, so no (B, T, V) float32 tensor of log-probs is ever held whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import choice, ndim, same_shape, zero_outside
from .moe import Routes
from .truncation import kept_logprobs


@dataclass
class Rollout:
    """One batch of sampled completions, laid out group by group (the G samples of prompt i are rows i*G..i*G+G-1).

    Fields (B = number of prompts x group_size, P = padded prompt length, T = completion length):
        input_ids: (B, P + T) left-padded prompt followed by the completion (pad after EOS).
        attention_mask: (B, P + T) 1 on real prompt tokens and on completion tokens up to and including EOS.
        completion_ids: (B, T) sampled tokens.
        completion_mask: (B, T) float, 1 up to and including the first EOS.
        truncated: (B,) bool, True when the completion has no EOS (cut at max_new_tokens).
        prompt_index: (B,) long, index of the prompt (in the list passed to ``generate``) of each row.
        completions: the decoded completion texts (special tokens dropped), B strings.
        logprobs: (B, T) behaviour log-probs of the sampled tokens at the sampling temperature, 0 where masked:
            recomputed by one full forward (``token_logprobs``), or the sampler's own when ``generate`` was told
            not to recompute them.
        group_size: G.
        routes: the recorded MoE routing of the behaviour forward (``moe.Routes``), when asked for.
        prompts: the prompt of each row as given, B strings or conversations (each prompt repeated G times).
        columns: the dataset's other columns, each a list of B values (row i gets the value of its prompt), for
            the reward functions (``rewards.score_completions``); filled by whoever sampled from a dataset.
        sampler_logprobs: (B, T) the log-probs the decode loop computed while sampling (from its incremental,
            KV-cached forwards), 0 where masked; None for rollouts built by hand.
        sampler_routes: the experts the sampler used while decoding (``moe.Routes`` of shape (B, P + T, k) per
            layer), when asked for: what Rollout Routing Replay (R3) replays in the trainer.
        rewards_per_func: (B, K) each reward function's score, NaN where it returned None; filled by the RL loop
            for GDPO (``advantages.gdpo_advantages``), else None.
        kept: (B, T, V) bool, the top-k / top-p sampler's kept set at each position (``truncation.kept_mask``),
            all True after EOS; None when the sampler does not truncate. B x T x V bytes: small here, 1.6 GB for
            64 x 160 tokens at V = 151,936 (a real run would keep the kept ids, or the boundary logit, instead).
        author, turn, turn_rewards, episode_rewards: a multi-turn episode's (``multiturn.generate_episodes``): (B, T)
            1 where the model wrote the token and 0 where the environment did; (B, T) the turn of each token;
            (B, K) each model turn's reward; (B,) their sum. None for single-turn rollouts. In an episode
            ``completion_mask`` is the model's tokens only, and the attention mask every real token.
    """

    input_ids: Tensor
    attention_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    truncated: Tensor
    prompt_index: Tensor
    completions: list[str]
    logprobs: Tensor
    group_size: int
    routes: object = None
    prompts: list = field(default_factory=list)
    columns: dict[str, list] = field(default_factory=dict)
    sampler_logprobs: Tensor | None = None
    sampler_routes: object = None
    rewards_per_func: Tensor | None = None
    kept: Tensor | None = None
    author: Tensor | None = None
    turn: Tensor | None = None
    turn_rewards: Tensor | None = None
    episode_rewards: Tensor | None = None

    @property
    def n_prompt_tokens(self) -> int:
        return self.input_ids.shape[1] - self.completion_ids.shape[1]

    @property
    def lengths(self) -> Tensor:
        """(B,) number of valid completion tokens (EOS included)."""
        return self.completion_mask.sum(-1)


def completion_mask(completion_ids: Tensor, eos_token_id: int | Sequence[int]) -> Tensor:
    """1 for every token up to and including the first EOS, 0 after it; a row with no EOS is all ones (truncated).

    The mask is never inferred from the pad id: a model may legitimately sample the pad token, and some tokenizers
    use the same id for pad and EOS.

    Example (EOS 2, pad 0): [[5,7,2,0,0],[5,2,9,9,9],[4,4,4,4,4]] -> [[1,1,1,0,0],[1,1,0,0,0],[1,1,1,1,1]].

    Args:
        completion_ids: (B, T) sampled token ids.
        eos_token_id: one id or a list of ids (e.g. Llama-3's several end tokens); any of them ends a completion.

    Returns:
        (B, T) float mask.

    Raises:
        ValueError: if completion_ids is not 2-D or the EOS list is empty.
    """
    ndim("completion_ids", completion_ids, 2, "(B, T)")
    eos = torch.as_tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    if eos.numel() == 0:
        raise ValueError("eos_token_id must be an id or a non-empty list of ids")
    is_eos = torch.isin(completion_ids, eos.to(completion_ids.device))  # (B, T)
    # tokens strictly after the first EOS have at least one EOS before them
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # (B, T)
    return (eos_before == 0).float()


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: the first real token is position 0, as ``generate`` numbers them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def check_tokenizer(tokenizer) -> None:
    """Refuse a tokenizer that would silently corrupt a batch of prompts: right padding, or no pad token.

    ``generate`` reads each row's next-token distribution at the LAST column of the padded prompts. With right
    padding a shorter prompt ends earlier, so its first completion token would be drawn from a pad position's
    output (on the tests' stand-in, KL 1.34 nats from the prompt's own distribution, against 0.09 between two
    different prompts), and no metric shows it. Qwen's and SmolLM2's tokenizers pad on the right by default.

    Raises:
        ValueError: naming ``tokenizer.padding_side`` when it is not "left", or when ``pad_token_id`` is None.
    """
    if getattr(tokenizer, "padding_side", "left") != "left":
        raise ValueError(f"tokenizer.padding_side is {tokenizer.padding_side!r}: minirl left-pads prompts so every "
                         f"row's completion starts at the same column (with right padding a shorter prompt draws its "
                         f"first token from a pad position); set tokenizer.padding_side = 'left'")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token (pad_token_id is None): set one, e.g. "
                         "tokenizer.pad_token = tokenizer.eos_token (masks never read the pad id, so sharing is safe)")


def eos_token_ids(tokenizer, model: torch.nn.Module | None = None) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and each EOS of the checkpoint's generation config.

    A chat checkpoint often lists several (Qwen3: ``[151645, 151643]``, <|im_end|> and <|endoftext|>; Llama-3:
    three), while its tokenizer names one. Stopping at the tokenizer's alone lets a row that ends in another run
    to ``max_new_tokens`` with every later token in the loss.

    Args:
        tokenizer: supplies ``eos_token_id`` (may be None when the generation config has them).
        model: optional; its ``generation_config.eos_token_id`` (an int or a list) is added when present.

    Returns:
        The distinct ids, the tokenizer's first.

    Raises:
        ValueError: if neither names an EOS id.
    """
    ids = [tokenizer.eos_token_id]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += list(extra) if isinstance(extra, (list, tuple)) else [extra]
    ids = list(dict.fromkeys(int(i) for i in ids if i is not None))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config names an EOS id")
    return ids


def completion_logits(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, n_prompt_tokens: int, *,
                      completion_only: bool = True) -> Tensor:
    """(B, T, V) raw logits that predict the completion tokens: one full-sequence forward, positions P-1 .. P+T-2.

    The logits at position t predict token t+1; position ids skip the left padding exactly as ``generate`` numbers
    them, so a rollout's distributions are reproduced to float precision. ``token_logprobs`` and
    ``evaluation.sequence_kl`` both read this forward. A model whose forward takes ``logits_to_keep`` (every
    transformers causal LM) applies its LM head to the last T + 1 positions only: (B, T + 1, V) logits instead of
    (B, L, V), which at V = 151,936 is most of a forward's memory. The values are the same, but the head's matrix
    product has another shape, so its gradient differs by round-off; ``completion_only=False`` keeps the full head
    (``RLConfig.completion_only_head``; the toy's stored figures were made with it).

    Args:
        model: a causal LM returning ``.logits`` of shape (B, L, V).
        input_ids: (B, L) prompt + completion, L = P + T.
        attention_mask: (B, L).
        n_prompt_tokens: P, the padded prompt length; the completion is ``input_ids[:, P:]``.
        completion_only: apply the LM head to the completion positions only, where the forward takes
            ``logits_to_keep`` (False: the (B, L, V) logits, sliced).

    Returns:
        (B, T, V) logits in the model's dtype (not temperature-scaled).

    Raises:
        ValueError: on shape mismatch or P outside [1, L).
    """
    ndim("input_ids", input_ids, 2, "(B, L)")
    same_shape(input_ids=input_ids, attention_mask=attention_mask)
    L = input_ids.shape[1]
    if not 1 <= n_prompt_tokens < L:
        raise ValueError(f"n_prompt_tokens must be in [1, {L}) for input_ids of length {L}, got {n_prompt_tokens}")
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask,
                  position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    if completion_only and "logits_to_keep" in inspect.signature(model.forward).parameters:  # lm_head on T+1 rows
        return model(**kwargs, logits_to_keep=L - n_prompt_tokens + 1).logits[:, :-1]
    return model(**kwargs).logits[:, n_prompt_tokens - 1:-1]  # any other LM: the (B, L, V) logits, sliced


def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    """log softmax(logits)[index] at every position, one row at a time, so no (B, T, V) log-softmax temporary.

    Each row's log-softmax is a (T, V) temporary, gathered at once: without grad (pi_old, the reference,
    evaluation) at most one exists at a time; with grad each row saves its own for the backward, which is what the
    logits themselves would cost (the logits are freed). Bit for bit ``log_softmax(logits).gather(index)``, so the
    toy's trajectories do not move (the logsumexp form, the gathered logit minus logsumexp, differs by round-off).

    Args:
        logits: (B, T, V) float logits (already divided by the temperature).
        index: (B, T) long, the token whose log-probability is wanted at each position.

    Returns:
        (B, T) log-probs (nats) in ``logits``' dtype.
    """
    return torch.stack([F.log_softmax(row, dim=-1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
                        for row, idx in zip(logits, index, strict=True)])  # (B, T)


def entropy_from_logits(logits: Tensor, *, grad: bool = False) -> Tensor:
    """(B, T) entropy (nats) of softmax(logits) at each position, one row at a time; without grad (it is logged)
    unless ``grad`` (an entropy bonus differentiates it). ``logits``: (B, T, V) float, divided by the temperature."""
    def one(row: Tensor) -> Tensor:  # (T, V) -> (T,)
        logp = F.log_softmax(row, dim=-1)
        return -(logp.exp() * logp).sum(-1)
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        return torch.stack([one(row) for row in logits])


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, n_prompt_tokens: int, *,
                   temperature: float = 1.0, return_entropy: bool = False, batch_size: int | None = None,
                   completion_only: bool = True, kept: Tensor | None = None,
                   entropy_grad: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probabilities of the completion tokens under ``model``, from logits / temperature, in float32.

    The logits at position t predict token t+1, so the completion's log-probs come from positions
    P-1 .. P+T-2. Position ids skip the left padding exactly as ``generate`` does, so a rollout's log-probs are
    reproduced to float precision. Memory: the forward runs on ``batch_size`` rows at a time, keeps only the
    completion positions' logits (``completion_logits``), and never builds a (B, T, V) log-softmax
    (``selective_log_softmax``); the entropy is computed without grad.

    Args:
        model: a causal LM returning ``.logits`` of shape (B, L, V).
        input_ids: (B, L) prompt + completion, L = P + T.
        attention_mask: (B, L).
        n_prompt_tokens: P, the padded prompt length; the completion is ``input_ids[:, P:]``.
        temperature: the sampling temperature (> 0) the completion was drawn at.
        return_entropy: also return the (B, T) entropy (nats) of the temperature-scaled next-token distribution
            (detached, a measurement, unless ``entropy_grad``: the entropy bonus differentiates it).
        batch_size: rows per forward (None: all B at once); for the no-grad forwards of pi_old, the reference and
            evaluation (``RLConfig.logprob_batch_size``). Each row's result does not depend on it beyond round-off.
        completion_only: the LM head on the completion positions only (``completion_logits``).
        kept: optional (B, T, V) bool kept sets of a top-k / top-p sampler (``Rollout.kept``): the log-probs are
            then renormalised over them (``truncation.kept_logprobs``, DeepSeek-V3.2's keep-sampling-mask), 0 off the
            completion (``attention_mask[:, P:]``); the entropy stays the full vocabulary's.

    Returns:
        (B, T) log-probs (nats) of the completion tokens, with grad if the model has grad enabled; positions after
        EOS hold the log-prob of the pad token and must be masked. With ``return_entropy``, (logprobs, entropy).

    Raises:
        ValueError: on shape mismatch, P outside [1, L), temperature <= 0 or batch_size < 1.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    ndim("input_ids", input_ids, 2, "(B, L)")
    if batch_size is not None and batch_size < input_ids.shape[0]:
        parts = [token_logprobs(model, ids, mask, n_prompt_tokens, temperature=temperature, kept=k,
                                return_entropy=return_entropy, completion_only=completion_only,
                                entropy_grad=entropy_grad)
                 for ids, mask, k in zip(input_ids.split(batch_size), attention_mask.split(batch_size),
                                         (kept.split(batch_size) if kept is not None else
                                          [None] * len(input_ids.split(batch_size))), strict=True)]
        if not return_entropy:
            return torch.cat(parts)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    logits = completion_logits(model, input_ids, attention_mask, n_prompt_tokens,
                               completion_only=completion_only).float() / temperature  # (B, T, V)
    tokens = input_ids[:, n_prompt_tokens:]  # (B, T); with kept sets: log pi - log S over each
    logprobs = (selective_log_softmax(logits, tokens) if kept is None
                else kept_logprobs(logits, tokens, kept, attention_mask[:, n_prompt_tokens:]))  # (B, T)
    if not return_entropy:
        return logprobs
    return logprobs, entropy_from_logits(logits, grad=entropy_grad)


def sequence_logprobs(token_logprobs: Tensor, mask: Tensor, *, reduction: str = "sum") -> Tensor:
    """Per-sequence log-probability from per-token log-probs: the masked sum, or the masked mean.

    DPO uses the sum (the sequence's log-likelihood); SimPO and TRL's IPO use the mean (length-normalised).

    Args:
        token_logprobs: (B, T) log-probs (nats); never read outside the mask (a pad token's -inf is fine there).
        mask: (B, T) 1 on valid tokens.
        reduction: "sum" or "mean".

    Returns:
        (B,) per-sequence log-probs (nats, or nats per token for "mean").

    Raises:
        ValueError: on shape mismatch, unknown reduction, or (for "mean") a row with no valid token, whose mean
            is undefined (never returned as NaN).
    """
    same_shape(token_logprobs=token_logprobs, mask=mask)
    choice("reduction", reduction, ("sum", "mean"))
    mask = mask.to(token_logprobs.dtype)
    total = zero_outside(token_logprobs, mask).sum(-1)  # (B,); not a product: -inf * 0 would be NaN
    if reduction == "sum":
        return total
    n = mask.sum(-1)
    if (n == 0).any():
        rows = (n == 0).nonzero().flatten().tolist()
        raise ValueError(f"mask has rows with no valid token {rows}; their mean log-prob is undefined")
    return total / n


def select_groups(rollout: Rollout, groups: Sequence[int]) -> Rollout:
    """The rows of the given groups (group g = rows g*G .. g*G+G-1), in the order given."""
    G = rollout.group_size
    rows = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long,
                        device=rollout.input_ids.device)
    return Rollout(
        input_ids=rollout.input_ids[rows], attention_mask=rollout.attention_mask[rows],
        completion_ids=rollout.completion_ids[rows], completion_mask=rollout.completion_mask[rows],
        truncated=rollout.truncated[rows], prompt_index=rollout.prompt_index[rows],
        completions=[rollout.completions[i] for i in rows.tolist()], logprobs=rollout.logprobs[rows],
        group_size=G, routes=None if rollout.routes is None else rollout.routes.select(rows),
        prompts=[rollout.prompts[i] for i in rows.tolist()] if rollout.prompts else [],
        columns={k: [v[i] for i in rows.tolist()] for k, v in rollout.columns.items()},
        sampler_logprobs=None if rollout.sampler_logprobs is None else rollout.sampler_logprobs[rows],
        sampler_routes=None if rollout.sampler_routes is None else rollout.sampler_routes.select(rows),
        rewards_per_func=None if rollout.rewards_per_func is None else rollout.rewards_per_func[rows.cpu()],
        kept=None if rollout.kept is None else rollout.kept[rows],
        **{name: _rows(getattr(rollout, name), rows) for name in EPISODE_FIELDS},
    )


#: The fields of a multi-turn episode (``multiturn.generate_episodes``), None for single-turn rollouts.
EPISODE_FIELDS = ("author", "turn", "turn_rewards", "episode_rewards")


def _rows(x: Tensor | None, rows: Tensor) -> Tensor | None:
    """``x[rows]`` on x's own device (turn rewards live on the CPU), or None."""
    return None if x is None else x[rows.to(x.device)]


def concat(rollouts: Sequence[Rollout], pad_token_id: int) -> Rollout:
    """Stack rollouts of possibly different prompt / completion lengths: prompts are left-padded and completions
    right-padded to the longest (padding is masked out). Routes cannot be re-padded, so concatenating rollouts with
    recorded routes of different lengths raises ValueError."""
    if len(rollouts) == 1:
        return rollouts[0]
    P = max(r.n_prompt_tokens for r in rollouts)
    T = max(r.completion_ids.shape[1] for r in rollouts)

    def pad(x, left, right, value):
        return F.pad(x, (left, right), value=value)

    parts = dict(input_ids=[], attention_mask=[], completion_ids=[], completion_mask=[], logprobs=[])
    for r in rollouts:
        p, t = r.n_prompt_tokens, r.completion_ids.shape[1]
        parts["input_ids"].append(pad(r.input_ids, P - p, T - t, pad_token_id))
        parts["attention_mask"].append(pad(r.attention_mask, P - p, T - t, 0))
        parts["completion_ids"].append(pad(r.completion_ids, 0, T - t, pad_token_id))
        parts["completion_mask"].append(pad(r.completion_mask, 0, T - t, 0.0))
        parts["logprobs"].append(pad(r.logprobs, 0, T - t, 0.0))
    sampler = None
    if all(r.sampler_logprobs is not None for r in rollouts):
        sampler = torch.cat([pad(r.sampler_logprobs, 0, T - r.completion_ids.shape[1], 0.0) for r in rollouts])
    routes, sampler_routes = _concat_routes(rollouts, "routes"), _concat_routes(rollouts, "sampler_routes")
    kept = None if rollouts[0].kept is None else torch.cat(
        [F.pad(r.kept, (0, 0, 0, T - r.kept.shape[1]), value=True) for r in rollouts])  # (B, T, V)
    offsets, out_index = 0, []
    for r in rollouts:  # prompt indices stay unique across rounds
        out_index.append(r.prompt_index - r.prompt_index.min() + offsets)
        offsets += int(r.prompt_index.max() - r.prompt_index.min()) + 1
    episode = {}
    if rollouts[0].author is not None:  # multi-turn episodes: the per-token fields right-padded like the completion
        episode = dict(author=torch.cat([pad(r.author, 0, T - r.author.shape[1], 0) for r in rollouts]),
                       turn=torch.cat([pad(r.turn, 0, T - r.turn.shape[1], 0) for r in rollouts]),
                       turn_rewards=torch.cat([r.turn_rewards for r in rollouts]),
                       episode_rewards=torch.cat([r.episode_rewards for r in rollouts]))
    return Rollout(**{k: torch.cat(v) for k, v in parts.items()}, **episode,
                   truncated=torch.cat([r.truncated for r in rollouts]),
                   prompt_index=torch.cat(out_index), completions=[c for r in rollouts for c in r.completions],
                   group_size=rollouts[0].group_size, routes=routes, prompts=[p for r in rollouts for p in r.prompts],
                   columns={k: [v for r in rollouts for v in r.columns[k]] for k in rollouts[0].columns},
                   sampler_logprobs=sampler, sampler_routes=sampler_routes, kept=kept,
                   rewards_per_func=None if rollouts[0].rewards_per_func is None else torch.cat(
                       [r.rewards_per_func for r in rollouts]))


def _concat_routes(rollouts: Sequence[Rollout], name: str):
    """The rollouts' recorded routes (field ``name``) stacked along the batch; None when none has them."""
    if all(getattr(r, name) is None for r in rollouts):
        return None
    if len({r.input_ids.shape[1] for r in rollouts}) > 1 or any(getattr(r, name) is None for r in rollouts):
        raise ValueError(f"cannot concatenate rollouts with recorded {name} of different lengths (or only some)")
    return Routes([torch.cat(x) for x in zip(*[getattr(r, name).indices for r in rollouts], strict=True)],
                  [torch.cat(x) for x in zip(*[getattr(r, name).entropy for r in rollouts], strict=True)])


def dataset_columns(rows, prompt_index: Tensor) -> dict[str, list]:
    """The columns of a dataset slice other than ``prompt`` and ``completion``, one value per sampled completion.

    Row i of a rollout answers prompt ``prompt_index[i]`` of ``rows``, so it gets that row's values: these are the
    keyword arguments a reward function receives (TRL passes the same columns, and likewise leaves out the prompt
    and the dataset's reference completion).

    Args:
        rows: a ``datasets.Dataset`` (or dict of lists) of the N prompts that were sampled.
        prompt_index: (B,) long, the prompt of each completion.

    Returns:
        dict column name -> list of B values.
    """
    names = rows.column_names if hasattr(rows, "column_names") else list(rows)
    index = prompt_index.tolist()
    columns = {}
    for name in names:
        if name not in ("prompt", "completion"):
            values = list(rows[name])
            columns[name] = [values[i] for i in index]
    return columns
