"""The loop's side of stale and truncated samplers: the decisions ``rl.train_rl`` makes with them, one function each.

The math is elsewhere (``truncation``: the kept sets and the renormalised log-probs; ``stale_corrections``: off-policy
sequence
masking, decoupled PPO, the staleness metric; ``kl.ratio_weighted_k3``); these functions read an ``RLConfig`` and the
step's tensors and call it. Every switch is off by default (``check_settings`` says which combinations make sense):

- ``top_k`` / ``top_p``: the rollouts come from a truncated sampler (``decoding.generate``), its kept sets recorded;
  ``keep_sampling_mask`` renormalises the trainer's pi_old and pi over them (``kept_sets``).
- ``sampler_sync_every``: the sampler is a copy reloaded every k steps (``make_step_sampler``, ``sync_due``);
  ``staleness_metrics`` logs how far behind it is. Which pi_old corrects it is the existing switches: naive
  (``pi_old="naive"``: the stale sampler's log-probs), recomputed (``pi_old="recomputed"``, the default),
  recomputed + TIS (``is_correction="token_tis"``), and decoupled PPO (AReaL: the recomputed pi_old is the proximal
  policy, the weight pi_prox / mu uncapped, ``is_correction="token_tis"`` with ``is_cap`` at its e^20 maximum, or
  masked above AReaL's ``behav_imp_weight_cap`` with ``is_correction="token_mis"``: ``decoupled_config``).
- ``off_policy_mask_threshold``: DeepSeek-V3.2's off-policy sequence masking, as a (B,) weight (``sequence_weights``).
- ``kl_ratio_weighted``: the KL in the loss is (pi / pi_old) k3 (``kl_terms``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from . import importance, kl, stale_corrections
from .inference_engine import make_sampler, sync_sampler

if TYPE_CHECKING:  # config.py imports this module for check_settings
    from .config import RLConfig


def check_settings(cfg: RLConfig) -> None:
    """Raise ValueError naming the field for an invalid stale / truncated sampler setting (``RLConfig.validate``)."""
    if isinstance(cfg.top_k, bool) or not isinstance(cfg.top_k, int) or cfg.top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0: off), got {cfg.top_k!r}")
    if not 0 < cfg.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1.0: off), got {cfg.top_p!r}")
    if cfg.keep_sampling_mask and not truncating(cfg):
        raise ValueError("keep_sampling_mask renormalises over the sampler's kept sets: it needs top_k > 0 or "
                         "top_p < 1 (without truncation every set is the whole vocabulary)")
    if isinstance(cfg.sampler_sync_every, bool) or not isinstance(cfg.sampler_sync_every, int) \
            or cfg.sampler_sync_every < 1:
        raise ValueError(f"sampler_sync_every must be an int >= 1 (1: synced after every step), got "
                         f"{cfg.sampler_sync_every!r}")
    t = cfg.off_policy_mask_threshold
    if t is not None and not (math.isfinite(t) and t >= 0):
        raise ValueError(f"off_policy_mask_threshold must be None or a finite number >= 0 (nats per token), got {t}")
    per_token = cfg.advantage == "gae" or (cfg.beta > 0 and cfg.kl_placement == "reward")
    if t is not None and per_token:  # DeepSeek-V3.2 states the rule for one advantage per sequence; no sign rule
        # for per-token advantages is published, and minirl does not invent one
        raise ValueError(f"off_policy_mask_threshold masks a sequence whose advantage is negative: it needs one "
                         f"advantage per sequence, but advantage={cfg.advantage!r} with beta={cfg.beta} and "
                         f"kl_placement={cfg.kl_placement!r} gives one per token (GAE, or the KL penalty in the "
                         f"reward); use kl_placement='loss' with a group advantage, or the importance corrections "
                         f"(is_correction) for a per-token advantage")
    if cfg.kl_ratio_weighted and not (cfg.beta > 0 and cfg.kl_placement == "loss" and cfg.kl_estimator == "k3"):
        raise ValueError(f"kl_ratio_weighted weights k3 in the loss: it needs beta > 0, kl_placement='loss' and "
                         f"kl_estimator='k3', got beta={cfg.beta}, {cfg.kl_placement!r}, {cfg.kl_estimator!r}")


def resume_sampler(sampler: torch.nn.Module, model: torch.nn.Module, step: int, cfg: RLConfig) -> None:
    """A run resumed after ``step`` restarts its sampler from the trainer's weights (``inference_engine.sync_sampler``):
    the
    uninterrupted run's sampler holds those weights only when it reloaded them after that step.

    Raises:
        ValueError: when it did not (a stale sampler's weights are not checkpointed).
    """
    if not sync_due(step, cfg):
        raise ValueError(f"resuming after step {step} with sampler_sync_every={cfg.sampler_sync_every}: the sampler's "
                         f"stale weights are not in the checkpoint; resume from a step that is a multiple of it")
    sync_sampler(sampler, model)


def truncating(cfg: RLConfig) -> bool:
    """Whether the rollouts' sampler truncates its distribution (top-k or top-p on)."""
    return cfg.top_k > 0 or cfg.top_p < 1.0


def decoupled_config(*, cap: float | None = None) -> dict:
    """The RLConfig switches of decoupled PPO (AReaL): pi_old recomputed (the proximal policy) and the detached token
    weight pi_prox / mu, uncapped (``is_cap`` e^20, the largest), or masked above ``cap`` (AReaL's
    ``behav_imp_weight_cap``). ``losses.policy_loss`` multiplies each token's clipped term by the weight, which is
    ``stale_corrections.decoupled_ppo_terms`` exactly (tests/test_rl_offpolicy.py)."""
    if cap is None:
        return dict(pi_old="recomputed", is_correction="token_tis", is_cap=importance.MAX_CAP)
    return dict(pi_old="recomputed", is_correction="token_mis", is_cap=cap)


def make_step_sampler(model: torch.nn.Module, cfg: RLConfig) -> torch.nn.Module:
    """The model that samples the rollouts: ``inference_engine.make_sampler`` of cfg's dials, a separate copy when it
    lags
    the trainer (``sampler_sync_every`` > 1); the trainer itself by default."""
    return make_sampler(model, dtype=cfg.sampler_dtype, logit_noise=cfg.sampler_logit_noise,
                        router_noise=cfg.sampler_router_noise, seed=cfg.seed, separate=cfg.sampler_sync_every > 1)


def sync_due(step: int, cfg: RLConfig) -> bool:
    """Whether the sampler reloads the weights after ``step`` (1-based): every ``sampler_sync_every`` steps."""
    return step % cfg.sampler_sync_every == 0


def sync_if_due(sampler: torch.nn.Module, model: torch.nn.Module, step: int, cfg: RLConfig) -> None:
    """After ``step``'s updates: the sampler reloads the trainer's weights when ``sync_due`` (every step by default)."""
    if sync_due(step, cfg):
        sync_sampler(sampler, model)


def updates_behind(step: int, cfg: RLConfig) -> int:
    """Optimiser updates the sampler of ``step``'s rollout (1-based) lags the trainer by: 0 when synced every step;
    with k = sampler_sync_every, ((step - 1) mod k) x num_minibatches x num_iterations (0 right after a reload)."""
    return ((step - 1) % cfg.sampler_sync_every) * cfg.num_minibatches * cfg.num_iterations


def kept_sets(kept: Tensor | None, cfg: RLConfig) -> Tensor | None:
    """(B, T, V) the sampler's kept sets when the trainer renormalises over them (``keep_sampling_mask``), else None:
    the argument ``rollout.token_logprobs(kept=...)`` takes for pi_old and for pi alike."""
    return kept if cfg.keep_sampling_mask else None


def sequence_weights(weights: Tensor | None, logprobs: Tensor, sampler_logprobs: Tensor | None, advantages: Tensor,
                     completion_mask: Tensor, cfg: RLConfig) -> Tensor | None:
    """The policy loss's importance weights with DeepSeek-V3.2's off-policy sequence mask multiplied in.

    ``stale_corrections.off_policy_sequence_mask`` of the current log-probs (detached) against the sampler's, one 0/1
    per
    sequence; TRL 1.16 multiplies it into the per-token loss, so the KL term is left unmasked here too.

    Args:
        weights: None, (B,) or (B, T) importance weights (``importance.is_weights``).
        logprobs: (B, T) the current policy's log-probs.
        sampler_logprobs: (B, T) the sampler's log-probs of the same tokens.
        advantages: (B,) one per sequence.
        completion_mask: (B, T).
        cfg: reads ``off_policy_mask_threshold`` (None: ``weights`` returned unchanged).

    Returns:
        None, (B,) or (B, T) weights: the mask alone when ``weights`` is None.

    Raises:
        ValueError: if the threshold is set and the sampler's log-probs are missing, or advantages are not (B,).

    Source: DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv 2512.02556), section 3.1, eq. 9; TRL 1.16
    ``off_policy_mask_threshold``.
    """
    if cfg.off_policy_mask_threshold is None:
        return weights
    if sampler_logprobs is None:
        raise ValueError("off_policy_mask_threshold needs the sampler's log-probs (rollout.sampler_logprobs)")
    keep = stale_corrections.off_policy_sequence_mask(logprobs, sampler_logprobs, advantages, completion_mask,
                                          threshold=cfg.off_policy_mask_threshold)  # (B,)
    if weights is None:
        return keep
    return weights * (keep if weights.dim() == 1 else keep[:, None])


def kl_terms(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, cfg: RLConfig) -> Tensor:
    """(B, T) the KL-in-the-loss terms: ``kl.ratio_weighted_k3`` with ``kl_ratio_weighted`` (the reverse-KL gradient
    off-policy too), else ``kl.kl_in_loss`` of cfg's estimator; 0 outside ``mask``."""
    if cfg.kl_ratio_weighted:
        return kl.ratio_weighted_k3(logprobs, old_logprobs, ref_logprobs, mask=mask)
    return kl.kl_in_loss(logprobs, ref_logprobs, estimator=cfg.kl_estimator, mask=mask)


@torch.no_grad()
def staleness_metrics(step: int, cfg: RLConfig, batch, old_logprobs: Tensor | None) -> dict:
    """The step's staleness, logged only with ``sampler_sync_every`` > 1 (the default row is unchanged).

    - ``sampler_updates_behind``: ``updates_behind``, optimiser updates the rollout's sampler lags the trainer by;
    - ``staleness_k3``: ``stale_corrections.staleness_kl`` of the sampler to the recomputed pi_old, nats per token (with
      pi_old="recomputed" only: the naive arm never computes the trainer's pi_old).

    Args:
        step: the step (1-based).
        cfg: the config.
        batch: the step's ``rollout.Rollout`` (its ``sampler_logprobs`` and ``completion_mask``, (B, T)).
        old_logprobs: (B, T) the recomputed pi_old, or None.

    Returns:
        dict of floats (empty when the sampler is synced every step).
    """
    if cfg.sampler_sync_every == 1:
        return {}
    row = {"sampler_updates_behind": float(updates_behind(step, cfg))}
    if old_logprobs is not None and batch.sampler_logprobs is not None and cfg.pi_old == "recomputed":
        row["staleness_k3"] = float(stale_corrections.staleness_kl(batch.sampler_logprobs, old_logprobs,
        batch.completion_mask))
    return row
