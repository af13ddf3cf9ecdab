"""Stage 4 of the RL loop (``rl.train_rl``): one optimiser step on a minibatch of the rollout.

``RLBatch`` holds what the update reads, row-aligned, so ``batch[rows]`` is a minibatch or a micro-batch;
``update_minibatch`` accumulates the gradient of pg_loss + beta * kl_loss (+ Kimi's squared log-ratio to the sampler,
+ PPO's value loss, + an MoE's load-balancing loss) over micro-batches, each term divided by the whole minibatch's
count, so the micro-batch size changes nothing (Clip-Cov's and KL-Cov's selection included:
``entropy_control.with_cov_selection``); the loss terms and the forwards it runs are the functions below it, in
reading order. ``rl`` re-exports every name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from . import entropy_control, importance, losses, models, precision, rl_offpolicy, rollout, trust_region
from .config import RLConfig
from .moe import Routes, capture_router_logits, load_balancing_loss, replay_routing


# ------------------------------------------------------------------------------------------------ 4. optimise
@dataclass(kw_only=True)
class RLBatch:
    """The stage data of one rollout that the update reads, row-aligned: ``batch[rows]`` picks a minibatch or
    micro-batch of every field at once, recorded routes included. B rows, T completion tokens, P prompt tokens.
    Built by keyword only: two of its masks have the same shape, so a positional mix-up would pass silently."""

    input_ids: Tensor  # (B, P + T) prompt + completion
    attention_mask: Tensor  # (B, P + T)
    n_prompt_tokens: int  # P: the completion starts at column P of input_ids
    completion_mask: Tensor  # (B, T) 1 up to and including EOS
    loss_mask: Tensor  # (B, T) the tokens that count in the loss (completion mask, maybe overlong-filtered)
    old_logprobs: Tensor | None  # (B, T) pi_old, at the sampling temperature; None on-policy (pi_old_source)
    advantages: Tensor  # (B,) or (B, T)
    ref_logprobs: Tensor | None = None  # (B, T) the reference's, when there is one
    old_values: Tensor | None = None  # (B, T) the critic's at rollout time (PPO)
    returns: Tensor | None = None  # (B, T) the critic's regression targets (PPO)
    routes: Routes | None = None  # recorded MoE routing of pi_old's forward (routing replay)
    sampler_logprobs: Tensor | None = None  # (B, T) the sampler's own, for an importance correction
    kept: Tensor | None = None  # (B, T, V) bool, a top-k / top-p sampler's kept sets
    cov_selected: Tensor | None = None  # (B, T) bool, Clip-Cov's / KL-Cov's tokens, chosen over the whole minibatch
    teacher_input_ids: Tensor | None = None  # (B, P' + T) a self-distillation teacher's context + prompt + completion
    teacher_attention_mask: Tensor | None = None  # (B, P' + T)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, rows: Tensor) -> RLBatch:
        picked = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in picked.items():
            if isinstance(value, Tensor):
                picked[name] = value[rows]
        picked["routes"] = None if self.routes is None else self.routes.select(rows)
        return replace(self, **picked)

    def split(self, size: int) -> Iterator[RLBatch]:
        """Consecutive micro-batches of at most ``size`` rows."""
        for rows in torch.arange(len(self), device=self.input_ids.device).split(size):
            yield self[rows]


def minibatches(n_rows: int, cfg: RLConfig, gen: torch.Generator) -> list[Tensor]:
    """A fresh random split of the rollout's groups into cfg.num_minibatches minibatches; row indices of each
    (a group's G rows stay together, so group statistics are never split)."""
    G = cfg.group_size
    order = torch.randperm(n_rows // G, generator=gen)
    return [(groups.unsqueeze(1) * G + torch.arange(G)).flatten() for groups in order.chunk(cfg.num_minibatches)]


def update_minibatch(model, optimizer, minibatch: RLBatch, cfg: RLConfig, *, beta: float, critic=None,
                     ent: entropy_control.EntropyState | None = None) -> dict:
    """One optimiser step on ``minibatch``, accumulating gradients over micro-batches of cfg.micro_batch_size rows.

    The objective is pg_loss + beta * kl_loss (KL in the loss) + the sampler term (Kimi K2.5's tau (log pi / mu)^2,
    with cfg.sampler_kl_tau > 0) + value_loss (PPO's critic, which shares no parameter with the policy) +
    router_aux_loss_coef * aux_loss (an MoE's load-balancing loss, when switched on).
    Every term but the last is divided by the WHOLE minibatch's count (tokens or sequences, see
    ``loss_denominator``), so the micro-batch losses add up to exactly the minibatch's loss whatever their size.
    The policy (and critic) are in train mode while it runs (``precision.train_mode``: gradient checkpointing
    recomputes only then), mode restored after; forwards run in ``cfg.precision``'s autocast, the backward outside
    it; recorded routes are forced through the backward too, so checkpointing's recompute replays them.

    Returns:
        dict of floats: the policy loss's stats (clip fractions, ratios, approx_kl), loss, value_loss (PPO),
        aux_loss (with the load-balancing loss on), entropy (nats per token, at the sampling temperature) and
        grad_norm (before clipping).
    """
    minibatch = entropy_control.with_cov_selection(minibatch, cfg, lambda m: current_logprobs(model, m, cfg))
    denominator = loss_denominator(minibatch.loss_mask, cfg)
    n_tokens = float(minibatch.loss_mask.sum().clamp(min=1))  # the value loss is a token mean
    optimizer.zero_grad(set_to_none=True)
    stats, entropy_sum, kl_in_loss = [], 0.0, beta > 0 and cfg.kl_placement == "loss"
    for micro in minibatch.split(cfg.micro_batch_size or len(minibatch)):
        with precision.train_mode(model, critic), replaying(model, micro.routes):  # held through the backward
            with precision.autocast(model, cfg.precision), router_logits_if(model, cfg) as router_logits:
                logprobs, entropy = policy_logprobs(model, micro, cfg)  # (b, T)
                old_logprobs = logprobs.detach() if micro.old_logprobs is None else micro.old_logprobs  # "current"
                weights = None  # the sampler is not pi_old: re-weight its samples towards pi_old (importance.py)
                if cfg.is_correction != "none":
                    weights = importance.is_weights(old_logprobs, micro.sampler_logprobs, micro.completion_mask,
                                                    correction=cfg.is_correction, cap=cfg.is_cap,
                                                    cap_low=cfg.is_cap_low, form=cfg.is_seq_form)
                weights = rl_offpolicy.sequence_weights(weights, logprobs, micro.sampler_logprobs, micro.advantages,
                                                     micro.completion_mask, cfg)  # DeepSeek-V3.2's sequence mask
                pg_loss, st = entropy_control.policy_objective(  # losses.policy_loss with cfg's entropy controls
                    logprobs, entropy, old_logprobs, micro, cfg, denominator=denominator, is_weights=weights,
                    state=ent, share=len(micro) / len(minibatch))
                kl_loss = kl_loss_term(logprobs, old_logprobs, micro, cfg, denominator) if kl_in_loss else 0.0
                if cfg.sampler_kl_tau > 0:  # Kimi K2.5: pulls each token back towards the sampler's probability
                    pg_loss = pg_loss + sampler_term(logprobs, micro, cfg, denominator)
                value_loss, vst = value_loss_term(critic, micro, cfg, n_tokens) if critic is not None else (0.0, {})
                aux_loss = router_aux_term(router_logits, micro, model, len(minibatch)) if router_logits else 0.0
                policy_objective = pg_loss + beta * kl_loss + cfg.router_aux_loss_coef * aux_loss
            (policy_objective + value_loss).backward()  # the whole objective, outside autocast
        stats.append({**st, **vst, "loss": float(policy_objective.detach())})
        if router_logits:
            stats[-1]["aux_loss"] = float(aux_loss.detach()) * len(minibatch) / len(micro)  # this micro-batch's
        entropy_sum += float((entropy.detach() * micro.completion_mask).sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)  # once, after accumulation
    if critic is not None:
        torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
    optimizer.step()
    entropy_control.end_step(ent, cfg)  # the adaptive entropy coefficient moves once per optimiser step
    out = {k: float(np.mean([s[k] for s in stats])) for k in stats[0] if k not in ("loss", "value_loss")}
    out.update(loss=sum(s["loss"] for s in stats), grad_norm=float(grad_norm),
               entropy=entropy_sum / max(float(minibatch.completion_mask.sum()), 1.0))
    if critic is not None:
        out["value_loss"] = sum(s["value_loss"] for s in stats)
    return out


def loss_denominator(mask: Tensor, cfg: RLConfig) -> float:
    """The minibatch's count the aggregation divides by: valid tokens for token-mean, valid sequences otherwise
    (GSPO always counts sequences); at least 1, so an all-masked minibatch has loss 0."""
    if cfg.agg == "token-mean" and cfg.level != "sequence":
        return max(float(mask.sum()), 1.0)
    return max(float((mask.sum(-1) > 0).sum()), 1.0)


def policy_logprobs(model, micro: RLBatch, cfg: RLConfig) -> tuple[Tensor, Tensor]:
    """(b, T) log-probs (with grad) and entropies (with grad only for the entropy bonus) of the micro-batch; with
    recorded routes, call it inside ``replaying(model, micro.routes)`` (``update_minibatch`` does)."""
    return rollout.token_logprobs(model, micro.input_ids, micro.attention_mask, micro.n_prompt_tokens,
                                  temperature=cfg.temperature, return_entropy=True,
                                  completion_only=cfg.completion_only_head,
                                  kept=rl_offpolicy.kept_sets(micro.kept, cfg),
                                  entropy_grad=entropy_control.needs_entropy_grad(cfg))


def current_logprobs(model, micro: RLBatch, cfg: RLConfig) -> Tensor:
    """(b, T) the policy's log-probs as the update's training forward computes them (train mode, autocast, the
    recorded routes), for a selection made before the update (``entropy_control.with_cov_selection``)."""
    with precision.train_mode(model), replaying(model, micro.routes), precision.autocast(model, cfg.precision):
        return policy_logprobs(model, micro, cfg)[0]


def replaying(model, routes: Routes | None):
    """``moe.replay_routing`` of the recorded routes (routing replay), or a block that does nothing without any.
    Held around forward AND backward: gradient checkpointing recomputes the layers inside the backward, and a
    recompute without the forced experts would route differently (torch raises ``CheckpointError``)."""
    return nullcontext() if routes is None else replay_routing(model, routes)


def router_logits_if(model, cfg: RLConfig):
    """``moe.capture_router_logits`` when the load-balancing loss is on, else a block that yields no logits."""
    return capture_router_logits(model) if cfg.router_aux_loss_coef > 0 else nullcontext([])


def router_aux_term(router_logits: list[Tensor], micro: RLBatch, model, n_minibatch: int) -> Tensor:
    """The micro-batch's load-balancing loss (``moe.load_balancing_loss`` over its prompt and completion tokens),
    weighted by its share of the minibatch's rows: with equal micro-batches the sum over them is the mean of the
    micro-batch losses, as TRL averages them over gradient accumulation (the loss is not linear in the tokens, so no
    weighting makes it exactly the whole minibatch's)."""
    aux = load_balancing_loss(router_logits, micro.attention_mask, top_k=model.config.num_experts_per_tok)
    return aux * len(micro) / n_minibatch


def kl_loss_term(logprobs: Tensor, old_logprobs: Tensor, micro: RLBatch, cfg: RLConfig, denominator: float
                 ) -> Tensor:
    """The KL in the loss: the per-token estimate (ratio-weighted k3 with cfg.kl_ratio_weighted), differentiated,
    aggregated like the policy loss (by sequence under GSPO, whose policy loss has one term per sequence)."""
    agg = "seq-mean-token-mean" if cfg.level == "sequence" else cfg.agg
    per_token = rl_offpolicy.kl_terms(logprobs, old_logprobs, micro.ref_logprobs, micro.loss_mask, cfg)  # (b, T)
    return losses.aggregate(per_token, micro.loss_mask, agg, max_tokens=cfg.max_new_tokens, denominator=denominator)


def sampler_term(logprobs: Tensor, micro: RLBatch, cfg: RLConfig, denominator: float) -> Tensor:
    """Kimi K2.5's term tau (log pi - log mu)^2 against the sampler's log-probs (``trust_region.
    sampler_log_ratio_penalty``), aggregated like the policy loss, over the same denominator."""
    if micro.sampler_logprobs is None:
        raise ValueError("sampler_kl_tau needs the sampler's log-probs (rollout.sampler_logprobs)")
    per_token = trust_region.sampler_log_ratio_penalty(logprobs, micro.sampler_logprobs, micro.loss_mask,
                                                       tau=cfg.sampler_kl_tau)  # (b, T)
    return losses.aggregate(per_token, micro.loss_mask, cfg.agg, max_tokens=cfg.max_new_tokens,
                            denominator=denominator)


def value_loss_term(critic, micro: RLBatch, cfg: RLConfig, n_tokens: float) -> tuple[Tensor, dict]:
    """PPO's clipped value loss of the micro-batch, divided by the whole minibatch's token count."""
    values = models.token_values(critic, micro.input_ids, micro.attention_mask, micro.n_prompt_tokens)  # (b, T)
    value_loss, st = losses.value_loss(values, micro.old_values, micro.returns, micro.loss_mask, clip=cfg.value_clip,
                                       agg="token-mean", denominator=n_tokens)
    return value_loss, {**st, "value_loss": float(value_loss.detach())}
