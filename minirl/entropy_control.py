"""The entropy controls inside the RL loop: ``RLConfig``'s entropy switches turned into the policy objective.

``rl.update_minibatch`` calls ``policy_objective`` where it would call ``losses.policy_loss``; with every switch off
(the default) it IS that call, so the loop's figures do not move. With a switch on it adds, one at a time or
together, the controls of ``entropy.py``:

- ``top_entropy_quantile`` < 1: only the top-rho entropy tokens of the micro-batch train (Wang et al. 2025; TRL's
  name): the others' loss terms are multiplied by 0, while the denominators still count them, as TRL does;
- ``cov_mode`` "clip_cov" / "kl_cov": Cui et al.'s Clip-Cov / KL-Cov replace PPO's clipped loss (verl's loss modes);
- ``entropy_coef`` > 0: the bonus -coef * mean token entropy (TRL's, the same meaning for every aggregation);
- ``adaptive_entropy``: Skywork-OR1's controller, the coefficient moved by ``entropy_coef_delta`` after every
  optimiser step toward keeping the entropy at ``entropy_target``, applied only while it is at or below it (TRL).

Each of them (and ``log_covariance`` alone) logs ``covariance``, the batch Cov(log pi, A) over the loss tokens whose
sign says which way the step pushes the entropy (``entropy.token_covariance``), and the bonus logs ``entropy_coef``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from . import entropy, losses
from .checks import LOG_RATIO_LINEAR_ABOVE, k3_of_log_ratio, zero_outside

#: The Clip-Cov / KL-Cov switch: "none" keeps the config's own policy loss.
COV_MODES = ("none", "clip_cov", "kl_cov")


@dataclass
class EntropyState:
    """What the controls carry from one optimiser step to the next: the coefficient, the entropy measured at the
    last optimiser step (inf before the first: no adaptive bonus in the first step, as TRL 1.16), and the running
    entropy sum and token count of the optimiser step in progress (its micro-batches)."""

    coef: float
    last_entropy: float = math.inf
    entropy_sum: float = 0.0
    tokens: float = 0.0


def is_on(cfg) -> bool:
    """Whether any entropy switch of ``cfg`` is on (``log_covariance`` included)."""
    return (cfg.entropy_coef > 0 or cfg.adaptive_entropy or cfg.top_entropy_quantile < 1 or cfg.cov_mode != "none"
            or cfg.log_covariance)


def make_state(cfg, *, resuming: bool = False) -> EntropyState | None:
    """The controls' state for a run of ``cfg``, or None when every switch is off (the loop is then unchanged).

    Raises:
        ValueError: when resuming a run with the adaptive controller, whose state checkpoints do not hold.
    """
    if resuming and cfg.adaptive_entropy:
        raise ValueError("resuming with adaptive_entropy is not supported: checkpoints do not hold the controller's "
                         "coefficient and last entropy")
    return EntropyState(coef=cfg.entropy_coef) if is_on(cfg) else None


def needs_entropy_grad(cfg) -> bool:
    """Whether the update needs the entropy with its gradient (the bonus differentiates it)."""
    return cfg.entropy_coef > 0 or cfg.adaptive_entropy


def coef_in_use(state: EntropyState, cfg) -> float:
    """The bonus's coefficient for this optimiser step: the fixed ``entropy_coef``, or the adaptive controller's
    while the last measured entropy is at or below the target and 0 above it (``entropy.entropy_coef_in_use``)."""
    if not cfg.adaptive_entropy:
        return cfg.entropy_coef
    return entropy.entropy_coef_in_use(state.coef, state.last_entropy, target=cfg.entropy_target)


def policy_objective(logprobs: Tensor, token_entropy: Tensor, old_logprobs: Tensor, micro, cfg, *,
                     denominator: float, is_weights: Tensor | None, state: EntropyState | None,
                     share: float = 1.0) -> tuple[Tensor, dict]:
    """The micro-batch's policy loss with ``cfg``'s entropy controls: ``losses.policy_loss`` when they are off.

    Args:
        logprobs: (b, T) current log-probs (with grad); old_logprobs (b, T) pi_old's.
        token_entropy: (b, T) the policy's next-token entropy (nats), with its gradient when the bonus is on.
        micro: the ``rl.RLBatch`` micro-batch (advantages, loss_mask).
        cfg: the RLConfig.
        denominator: the whole minibatch's count (``rl.loss_denominator``).
        is_weights: the sampler correction's weights, or None.
        state: ``make_state``'s (None: every control off).
        share: the micro-batch's share of the minibatch's rows: the bonus, a mean per micro-batch, is weighted by
            it, as TRL divides it by the accumulation steps.

    Returns:
        (loss, stats): stats are ``losses.policy_loss``'s (approx_kl always its k3 of KL(pi_old || pi)), plus
        covariance, and entropy_coef (the coefficient applied) when the bonus is on, clip_cov_frac / kl_cov_frac
        for Clip-Cov / KL-Cov.

    Source: Cui et al. 2025, arXiv 2505.22617 (Clip-Cov, KL-Cov); Wang et al. 2025, arXiv 2506.01939 (top-entropy
    tokens); He et al. 2025, arXiv 2505.22312 (Skywork-OR1's adaptive entropy); TRL 1.16 ``GRPOTrainer._compute_loss``.
    """
    mask = micro.loss_mask
    if state is None:
        return losses.policy_loss(logprobs, old_logprobs, micro.advantages, mask, **cfg.policy_loss_kwargs(),
                                  denominator=denominator, is_weights=is_weights)
    trained = mask  # (b, T) the tokens whose loss counts
    if cfg.top_entropy_quantile < 1:  # the others' terms times 0, the denominators unchanged (TRL)
        top = entropy.top_entropy_mask(token_entropy, mask, top_fraction=cfg.top_entropy_quantile).to(mask.dtype)
        is_weights, trained = (top if is_weights is None else is_weights * top), mask * top
    if cfg.cov_mode == "none":
        loss, stats = losses.policy_loss(logprobs, old_logprobs, micro.advantages, mask, **cfg.policy_loss_kwargs(),
                                         denominator=denominator, is_weights=is_weights)
    else:
        loss, stats = cov_loss(logprobs, old_logprobs, micro.advantages, mask, cfg, denominator=denominator,
                               selected=getattr(micro, "cov_selected", None))
    n = mask.gt(0).sum().clamp(min=1)
    stats["covariance"] = float(entropy.token_covariance(logprobs, micro.advantages, mask).sum() / n)
    if needs_entropy_grad(cfg):
        coef = coef_in_use(state, cfg)
        loss = loss + share * entropy.entropy_bonus(token_entropy, trained, coef=coef)  # -coef * mean H
        stats["entropy_coef"] = coef
        state.entropy_sum += float((token_entropy.detach() * trained).sum())  # the adaptive controller's reading
        state.tokens += float(trained.sum())
    return loss, stats


def with_cov_selection(minibatch, cfg, forward: Callable):
    """The optimiser minibatch with Clip-Cov's or KL-Cov's tokens chosen over all of it (``cov_selected``).

    Both select over a batch: the covariance is centred on its means, and the share kept is a share of its tokens.
    Chosen per micro-batch, micro_batch_size 1 kept one token per row and Clip-Cov none at all (inside one row A is
    constant, so every covariance is 0): the micro-batch size changed the update (verl PR #7830, the same bug). With
    micro-batches, the policy's log-probs of every row are taken first without gradient (one forward more per
    minibatch, with no activations kept: about a third of a training forward-and-backward, and only when cov_mode
    is on), the selection made on them, and each micro-batch's loss reads its rows of it. With one micro-batch
    nothing is added: ``cov_loss`` selects over it, the same tokens, from the training forward's own log-probs.
    They are the training forward's log-probs exactly only while the forward draws no random numbers (dropout 0,
    as every model here; verl also restores the RNG state after its extra forward).

    Args:
        minibatch: ``rl.RLBatch``; cfg: reads cov_mode, micro_batch_size and the selection's settings.
        forward: ``forward(micro) -> (b, T)`` the current policy's log-probs of a micro-batch, as the update's
            training forward computes them (``rl.current_logprobs``).

    Returns:
        The minibatch, with ``cov_selected`` (B, T) bool when micro-batches are used, unchanged otherwise.

    Source: Cui et al. 2025, arXiv 2505.22617 (the sets I_clip and I_KL, over a batch); verl PR #7830.
    """
    if cfg.cov_mode == "none" or not cfg.micro_batch_size or cfg.micro_batch_size >= len(minibatch):
        return minibatch
    with torch.no_grad():
        logprobs = torch.cat([forward(micro) for micro in minibatch.split(cfg.micro_batch_size)])  # (B, T)
    old = logprobs if minibatch.old_logprobs is None else minibatch.old_logprobs  # "current": pi_old is pi
    if cfg.cov_mode == "clip_cov":
        selected = entropy.clip_cov_mask(logprobs, old, minibatch.advantages, minibatch.loss_mask,
                                         fraction=cfg.cov_fraction, cov_low=cfg.clip_cov_low,
                                         cov_high=cfg.clip_cov_high, eps_low=cfg.eps_low, eps_high=cfg.eps_high)
    else:
        selected = entropy.kl_cov_mask(logprobs, minibatch.advantages, minibatch.loss_mask, fraction=cfg.cov_fraction)
    return replace(minibatch, cov_selected=selected)


def cov_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, cfg, *,
             denominator: float, selected: Tensor | None = None) -> tuple[Tensor, dict]:
    """Clip-Cov's or KL-Cov's per-token loss (``entropy.clip_cov_token_loss`` / ``kl_cov_token_loss``), aggregated
    by ``cfg.agg`` over the minibatch's ``denominator``; stats add approx_kl (k3, as ``losses.policy_loss``).
    ``selected``: the tokens chosen over the whole minibatch (``with_cov_selection``), or None to choose here."""
    if cfg.cov_mode == "clip_cov":
        per_token, stats = entropy.clip_cov_token_loss(logprobs, old_logprobs, advantages, mask,
                                                       fraction=cfg.cov_fraction, cov_low=cfg.clip_cov_low,
                                                       cov_high=cfg.clip_cov_high, eps_low=cfg.eps_low,
                                                       eps_high=cfg.eps_high, selected=selected)
    else:
        per_token, stats = entropy.kl_cov_token_loss(logprobs, old_logprobs, advantages, mask,
                                                     fraction=cfg.cov_fraction, kl_coef=cfg.kl_cov_coef,
                                                     selected=selected)
    loss = losses.aggregate(per_token, mask, cfg.agg, max_tokens=cfg.max_new_tokens, denominator=denominator)
    log_ratio = zero_outside(logprobs.detach() - old_logprobs, mask)  # (b, T)
    k3 = k3_of_log_ratio(log_ratio, LOG_RATIO_LINEAR_ABOVE)  # exact near r = 1
    stats["approx_kl"] = float(zero_outside(k3, mask).sum() / mask.gt(0).sum().clamp(min=1))
    return loss, stats


def end_step(state: EntropyState | None, cfg) -> None:
    """After an optimiser step: the adaptive controller reads the step's mean entropy over the trained tokens and
    moves its coefficient (``entropy.adaptive_entropy_coef``, TRL 1.16's rule); nothing without it."""
    if state is None or not cfg.adaptive_entropy:
        return
    measured = state.entropy_sum / max(state.tokens, 1.0)
    state.coef = entropy.adaptive_entropy_coef(state.coef, measured, target=cfg.entropy_target,
                                               delta=cfg.entropy_coef_delta, coef_min=cfg.entropy_coef_min,
                                               coef_max=cfg.entropy_coef_max)
    state.last_entropy, state.entropy_sum, state.tokens = measured, 0.0, 0.0


def check_config(cfg) -> None:
    """RLConfig.validate's rules for the entropy switches.

    Raises:
        ValueError: naming the field, for a negative coefficient, a quantile outside [0, 1], an unknown cov_mode,
            a fraction outside (0, 1], cov bounds out of order, or a combination the loop does not define.
    """
    if cfg.cov_mode not in COV_MODES:
        raise ValueError(f"cov_mode must be one of {COV_MODES}, got {cfg.cov_mode!r}")
    for name in ("entropy_coef", "entropy_coef_delta", "entropy_coef_min", "kl_cov_coef"):
        if not (getattr(cfg, name) >= 0 and math.isfinite(getattr(cfg, name))):
            raise ValueError(f"{name} must be a finite number >= 0, got {getattr(cfg, name)}")
    if cfg.entropy_coef_min > cfg.entropy_coef_max:
        raise ValueError(f"entropy_coef_min must be <= entropy_coef_max, got {cfg.entropy_coef_min} and "
                         f"{cfg.entropy_coef_max}")
    if not 0 <= cfg.top_entropy_quantile <= 1:
        raise ValueError(f"top_entropy_quantile must be in [0, 1], got {cfg.top_entropy_quantile}")
    if not 0 < cfg.cov_fraction <= 1:
        raise ValueError(f"cov_fraction must be in (0, 1], got {cfg.cov_fraction}")
    if not cfg.clip_cov_low < cfg.clip_cov_high:
        raise ValueError(f"clip_cov_low must be below clip_cov_high, got {cfg.clip_cov_low}, {cfg.clip_cov_high}")
    token_clip = cfg.level == "token" and cfg.loss_mode == "clip"
    if cfg.cov_mode != "none" and not (token_clip and cfg.dual_clip is None and cfg.is_correction == "none"
                                        and cfg.top_entropy_quantile == 1 and cfg.off_policy_mask_threshold is None):
        # its loss takes no per-token weights: a sampler correction or a sequence mask would be dropped silently
        raise ValueError(f"cov_mode={cfg.cov_mode!r} replaces PPO's token clip: it needs level='token', "
                         "loss_mode='clip', dual_clip=None, is_correction='none', top_entropy_quantile=1 and "
                         "off_policy_mask_threshold=None")
    if cfg.top_entropy_quantile < 1 and losses.one_term_per_sequence(level=cfg.level, loss_mode=cfg.loss_mode):
        raise ValueError("top_entropy_quantile < 1 masks tokens; level='sequence' and loss_mode='gmpo' have one term "
                         "per sequence")
