"""Policy and value losses: PPO's clipped surrogate per token (PPO, GRPO, Dr. GRPO, DAPO), per sequence (GSPO) and
per sequence on each token (GSPO-token), the critic's clipped value loss, and ``policy_loss``, which checks its
inputs and calls the family a setting picks.

Per-token terms are kept apart from their aggregation (``aggregation.aggregate``), because the aggregation is one of
the things the algorithms disagree about (GRPO vs DAPO vs Dr. GRPO). The losses that keep the gradient PPO's clip
removes (CISPO, SAPO, GMPO) are in ``clip_alternatives``; DPPO's divergence masks, the trust region anchored on the
sampler, in ``trust_region``.

To copy one algorithm's loss into your own trainer, copy the family function ``policy_loss`` calls for it
(token_clip_loss for PPO, GRPO, Dr. GRPO, DAPO, RLOO and REINFORCE++; gspo_loss, gspo_token_loss): its docstring's
"Copy with" line names the few helpers it needs; torch and checks.py's ``zero_outside``, ``exp_linear_above``,
``LOG_RATIO_LINEAR_ABOVE`` are all the rest. ``tests/test_losses.py`` runs each of them on its own."""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import AGGREGATIONS, aggregate, ratio_stats, sequence_mean
from .checks import (LOG_RATIO_LINEAR_ABOVE, choice, exp_linear_above, k3_of_log_ratio, ndim, same_device, same_shape,
                     zero_outside)
from .clip_alternatives import CISPO_FORMS, check_tau, cispo_loss, gmpo_loss, sapo_loss
from .trust_region import dppo_loss

LEVELS = ("token", "sequence", "sequence-token")
#: The policy-loss families of ``policy_loss``: PPO's clipped surrogate (at ``level``), CISPO, SAPO, GMPO, and DPPO's
#: binary-TV and binary-KL trust regions (eps_low / eps_high are then DPPO's deltas, as verl reads clip_ratio_low/high).
LOSS_MODES = ("clip", "cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl")
#: The loss modes of DPPO (``trust_region.dppo_loss``) and the divergence each bounds.
DPPO_MODES = {"dppo_tv": "tv", "dppo_kl": "kl"}


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, *, eps_low: float, eps_high: float,
                       dual_clip: float | None) -> Tensor:
    """Per-element PPO loss: max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)), dual-clipped for A < 0."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        # Dual-clip PPO (Ye et al. 2020, eq. 5): for A < 0 the loss is capped at dual_clip * |A|, so one token with
        # a huge ratio cannot dominate the batch.
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    return loss


#: The settings that pick and shape the loss: ``RLConfig`` fields of the same names, forwarded by its
#: ``policy_loss_kwargs``; a new loss mode adds its own here, in ``check_settings`` and in ``policy_loss``.
SETTINGS = ("eps_low", "eps_high", "level", "agg", "dual_clip", "loss_mode", "cispo_form", "tau_pos", "tau_neg",
            "dppo_cap")


def one_term_per_sequence(*, level: str, loss_mode: str) -> bool:
    """Whether the loss has one term per sequence (GSPO, GMPO): its advantages and importance weights are then (B,)."""
    return level == "sequence" or loss_mode == "gmpo"


def check_settings(*, eps_low: float, eps_high: float, level: str, agg: str, dual_clip: float | None,
                   loss_mode: str, cispo_form: str, tau_pos: float, tau_neg: float, dppo_cap: float = 20.0) -> None:
    """Raise ValueError naming the setting for any invalid combination of ``SETTINGS``; the one place these rules
    live (``policy_loss`` and ``RLConfig.validate`` both call it).

    Raises:
        ValueError: for an unknown level, agg, loss_mode or cispo_form; eps outside 0 <= eps_low < 1, eps_high >= 0
            (GMPO and DPPO: both >= 0, log-space bounds or deltas); dppo_cap <= 0; dual_clip <= 1; tau <= 0; a
            loss_mode other than "clip" with
            level != "token" or a dual_clip; one term per sequence with agg other than "seq-mean-token-mean".
    """
    choice("level", level, LEVELS)
    choice("aggregation mode", agg, AGGREGATIONS)
    choice("loss_mode", loss_mode, LOSS_MODES)
    choice("cispo_form", cispo_form, CISPO_FORMS)
    if loss_mode == "gmpo" or loss_mode in DPPO_MODES:  # GMPO's log-space bounds, DPPO's deltas: any value >= 0
        if not (eps_low >= 0 and eps_high >= 0):
            raise ValueError(f"{loss_mode} needs eps_low >= 0 and eps_high >= 0 (GMPO: log-ratio bounds; DPPO: the "
                             f"deltas), got eps_low={eps_low}, eps_high={eps_high}")
    elif not (0 <= eps_low < 1 and eps_high >= 0):
        raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if dual_clip is not None and not dual_clip > 1:
        # with c <= 1 the "cap" c * |A| falls below PPO's own loss (log r 0.5, A -1, c 0.5: 0.5 < e^0.5 = 1.6487)
        raise ValueError(f"dual_clip must be > 1 (dual-clip PPO, Ye et al. 2020, eq. 5) or None, got {dual_clip}")
    if loss_mode != "clip" and (level != "token" or dual_clip is not None):
        raise ValueError(f"loss_mode={loss_mode!r} defines its own ratio: it needs level='token' and dual_clip=None, "
                         f"got level={level!r}, dual_clip={dual_clip}")
    check_tau(tau_pos, tau_neg)
    if not dppo_cap > 0:
        raise ValueError(f"dppo_cap must be > 0 (DPPO's cap on the detached ratio, verl's clip_ratio_c), "
                         f"got {dppo_cap}")
    if one_term_per_sequence(level=level, loss_mode=loss_mode) and agg != "seq-mean-token-mean":
        raise ValueError(f"level={level!r} with loss_mode={loss_mode!r} has one term per sequence: agg must be "
                         f"'seq-mean-token-mean', got {agg!r}")


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float = 0.2,
                eps_high: float | None = None, level: str = "token", agg: str = "token-mean",
                dual_clip: float | None = None, max_tokens: int | None = None, denominator: float | None = None,
                loss_mode: str = "clip", cispo_form: str = "two-sided", tau_pos: float = 1.0,
                tau_neg: float = 1.05, dppo_cap: float = 20.0, is_weights: Tensor | None = None
                ) -> tuple[Tensor, dict]:
    """The policy-gradient loss: checks the inputs, then calls ``token_clip_loss`` (PPO, GRPO, DAPO),
    ``gspo_loss`` (GSPO) or ``gspo_token_loss`` (GSPO-token) by ``level``, or, by ``loss_mode``, one of the
    losses that keep the gradient the clip removes: ``cispo_loss``, ``sapo_loss``, ``gmpo_loss``, or DPPO's
    trust region anchored on the sampler, ``trust_region.dppo_loss``.

    Above ``LOG_RATIO_LINEAR_ABOVE`` (20 nats) a log-ratio's exp is continued by its tangent, so the ratio stays
    finite and its gradient keeps its exact sign (|A| e^20 > 0 where the unclipped branch is active, 0 where a
    clip is, as exactly); below, it is exp. ``old_logprobs`` is detached. Masked positions are never read
    (padding may hold a -inf log-prob): value and gradient are those of the valid tokens alone.

    Args:
        logprobs: (B, T) current policy log-probs of the sampled tokens (with grad).
        old_logprobs: (B, T) behaviour-policy log-probs of the same tokens.
        advantages: (B,) one per sequence, or (B, T) per token (not with level="sequence").
        mask: (B, T) 1 on tokens that count.
        eps_low, eps_high: the clip range [1 - eps_low, 1 + eps_high] (eps_high defaults to eps_low; DAPO's
            clip-higher 0.28); CISPO's weight bounds; GMPO's log-ratio bounds [-eps_low, eps_high]; DPPO's deltas
            (delta_low for A <= 0, delta_high for A > 0; verl's clip_ratio_low / high under dppo_tv / dppo_kl).
        level: "token", "sequence" (GSPO) or "sequence-token" (GSPO-token).
        agg: aggregation mode (see ``aggregate``); "seq-mean-token-mean" for one term per sequence.
        dual_clip: optional c > 1 of dual-clip PPO: for A < 0 the loss is capped at c * |A|.
        max_tokens, denominator: passed to ``aggregate`` (denominator counts sequences for GSPO and GMPO).
        loss_mode: "clip" (PPO's clipped surrogate at ``level``), "cispo", "sapo", "gmpo", "dppo_tv" or "dppo_kl"
            (each at level="token", without dual_clip). DPPO's anchor is ``old_logprobs``: the sampler's with
            pi_old="naive", as the paper anchors it on the behaviour policy.
        cispo_form: "two-sided" (paper eq. 5, verl) or "one-sided" (TRL: only the cap 1 + eps_high).
        tau_pos, tau_neg: SAPO's gate temperatures for A > 0 and A <= 0 (> 0).
        dppo_cap: DPPO's cap C on the detached ratio (> 0; verl's clip_ratio_c, 20 by the paper's section 5.4).
        is_weights: optional importance weights between a sampler and the trainer (``importance.is_weights``):
            (B, T), or (B,) per sequence (only (B,) for GSPO and GMPO), finite, >= 0, detached. Each loss term is
            multiplied by its weight before aggregation, as TRL and verl do, done as A * w: exact, since every loss
            here is positively homogeneous in A (w >= 0 keeps A's sign, so SAPO's temperature and GMPO's side do
            not change). The clip-fraction stats then leave out weight-0 tokens.

    Returns:
        (loss, stats). stats (floats): clip_frac_low / clip_frac_high (share of valid tokens whose gradient the
        clip removed, low / high side; every token of a clipped sequence for GSPO and GSPO-token, as GSPO's paper
        counts), clip_frac (their sum), ratio_mean / _min / _max / _std over valid tokens (a sequence's s_i on each
        of its tokens), approx_kl (k3 of KL(pi_old || pi) per token); CISPO, SAPO, GMPO add ppo_clip_frac; DPPO
        gives dppo_masked_frac (tokens its trust region left without gradient, also as clip_frac) and capped_frac.

    Raises:
        ValueError: if logprobs, old_logprobs and mask differ in shape, advantages or is_weights have the wrong
            shape, is_weights is negative or not finite on a valid token, or a setting is invalid
            (``check_settings``).

    Source: PPO, Schulman et al. 2017, eq. 7; GRPO, Shao et al. 2024, eq. 3; DAPO, Yu et al. 2025, eq. 8;
    GSPO, Zheng et al. 2025, eq. 5-7 and 13-14; CISPO, MiniMax 2025 (arXiv 2506.13585), eq. 4-5; SAPO, Gao et
    al. 2025 (arXiv 2511.20347), eq. 5-6; GMPO, Zhao et al. 2025 (arXiv 2507.20673), eq. 4; DPPO, Qi et al. 2026
    (arXiv 2602.04879).
    """
    same_shape(logprobs=logprobs, old_logprobs=old_logprobs, mask=mask)
    same_device(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    ndim("logprobs", logprobs, 2, "(B, T)")
    one_per_seq = one_term_per_sequence(level=level, loss_mode=loss_mode)
    B, T = logprobs.shape
    if advantages.shape == (B,):
        advantages = advantages.unsqueeze(1).expand(B, T)  # (B, T)
    elif advantages.shape != (B, T) or one_per_seq:
        raise ValueError(f"advantages must have shape ({B},) or ({B}, {T}) (only (B,) at level='sequence' and for "
                         f"GMPO), got {tuple(advantages.shape)}")
    eps_high = eps_low if eps_high is None else eps_high
    check_settings(eps_low=eps_low, eps_high=eps_high, level=level, agg=agg, dual_clip=dual_clip,
                   loss_mode=loss_mode, cispo_form=cispo_form, tau_pos=tau_pos, tau_neg=tau_neg, dppo_cap=dppo_cap)
    advantages = advantages.detach().to(logprobs.dtype)
    mask = mask.to(logprobs.dtype)
    if is_weights is not None:  # w L(A) = L(w A) for w >= 0 (see the Args): the weight reaches every loss below
        advantages = advantages * _per_token_weights(is_weights, mask, one_per_seq)
    # from here on only valid positions are read: padding may hold anything (a pad token's log-prob can be -inf)
    logprobs, old_logprobs = zero_outside(logprobs, mask), zero_outside(old_logprobs.detach(), mask)
    if loss_mode == "cispo":
        loss, stats = cispo_loss(logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high,
                                 form=cispo_form, agg=agg, max_tokens=max_tokens, denominator=denominator)
    elif loss_mode == "sapo":
        loss, stats = sapo_loss(logprobs, old_logprobs, advantages, mask, tau_pos=tau_pos, tau_neg=tau_neg, agg=agg,
                                max_tokens=max_tokens, denominator=denominator)
    elif loss_mode in DPPO_MODES:
        loss, stats = dppo_loss(logprobs, old_logprobs, advantages, mask, divergence=DPPO_MODES[loss_mode],
                                delta_low=eps_low, delta_high=eps_high, is_cap=dppo_cap, agg=agg,
                                max_tokens=max_tokens, denominator=denominator)
        stats["clip_frac"] = stats["dppo_masked_frac"]  # the tokens its trust region stopped, as PPO's clip_frac
    elif loss_mode == "gmpo":
        loss, stats = gmpo_loss(logprobs, old_logprobs, advantages[:, 0], mask, eps_low=eps_low, eps_high=eps_high,
                                denominator=denominator)
    elif level == "token":
        loss, stats = token_clip_loss(logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high,
                                      agg=agg, dual_clip=dual_clip, max_tokens=max_tokens, denominator=denominator)
    elif level == "sequence":
        loss, stats = gspo_loss(logprobs, old_logprobs, advantages[:, 0], mask, eps_low=eps_low, eps_high=eps_high,
                                dual_clip=dual_clip, denominator=denominator)
    else:
        loss, stats = gspo_token_loss(logprobs, old_logprobs, advantages, mask, eps_low=eps_low, eps_high=eps_high,
                                      agg=agg, dual_clip=dual_clip, max_tokens=max_tokens, denominator=denominator)
    # PPO's "approx_kl": k3 estimate of KL(pi_old || pi) from pi_old's samples, (r - 1) - log r with r = pi / pi_old
    # (r continued linearly past 20 nats like the loss's ratio: finite, and increasing as the true value)
    lr = (logprobs - old_logprobs).detach()  # (B, T), 0 outside the mask
    kl_tokens = k3_of_log_ratio(lr, LOG_RATIO_LINEAR_ABOVE)  # (B, T), exact near r = 1
    stats["approx_kl"] = float(zero_outside(kl_tokens, mask).sum() / mask.sum().clamp(min=1))
    return loss, stats


def _per_token_weights(is_weights: Tensor, mask: Tensor, one_per_seq: bool) -> Tensor:
    """(B, T) detached importance weights from (B,) or (B, T), never read outside the valid tokens (rows); finite
    and >= 0 there, or ValueError."""
    B, T = mask.shape
    if is_weights.shape == (B,):  # one weight per row, for every position (GSPO reads column 0)
        w = torch.where(mask.sum(-1) > 0, is_weights.detach(), 0.0).unsqueeze(1).expand(B, T)
    elif is_weights.shape == (B, T) and not one_per_seq:
        w = zero_outside(is_weights.detach(), mask)
    else:
        raise ValueError(f"is_weights must have shape ({B},) or ({B}, {T}) (only (B,) at level='sequence' and for "
                         f"GMPO), got {tuple(is_weights.shape)}")
    if not (torch.isfinite(w).all() and (w >= 0).all()):
        raise ValueError("is_weights must be finite and >= 0 on valid tokens")
    return w.to(mask.dtype)


def token_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float,
                    eps_high: float, agg: str, dual_clip: float | None = None, max_tokens: int | None = None,
                    denominator: float | None = None) -> tuple[Tensor, dict]:
    """Token-level clipped surrogate: one importance ratio per token, then ``aggregate``.

    r_t = pi(y_t) / pi_old(y_t); the loss per token is max(-A_t r_t, -A_t clip(r_t, 1 - eps_low, 1 + eps_high)).

    Example: on-policy, logprobs = old_logprobs = -1.0, A = +1: ratio 1, loss -1, d loss / d logprobs = -1.
    After an update to -0.8: ratio e^0.2 = 1.2214 > 1.2, so with eps 0.2/0.2 the loss is -1.2 with gradient 0
    (clipped); with eps_high 0.28 it is -1.221403 with gradient -1.221403.

    Args:
        logprobs, old_logprobs, mask: (B, T); old_logprobs without grad.
        advantages: (B, T) (a sequence's advantage repeated over its tokens for outcome rewards).
        eps_low, eps_high, dual_clip: the clip ranges, as in ``policy_loss``.
        agg, max_tokens, denominator: see ``aggregate``.

    Returns:
        (loss, stats) as in ``policy_loss`` (without approx_kl).

    Copy with: _clipped_surrogate, aggregate, AGGREGATIONS, ratio_stats.

    Source: PPO, Schulman et al. 2017, eq. 7; GRPO, Shao et al. 2024, eq. 3; DAPO (clip-higher), Yu et al. 2025,
    eq. 8-10.
    """
    advantages = zero_outside(advantages, mask)  # (B, T); padding is never read
    log_ratio = zero_outside(logprobs - old_logprobs, mask)  # (B, T)
    ratio = exp_linear_above(log_ratio, LOG_RATIO_LINEAR_ABOVE)  # (B, T) exp, continued linearly above 20 nats
    per_token = _clipped_surrogate(ratio, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)  # (B, T)
    loss = aggregate(per_token, mask, agg, max_tokens=max_tokens, denominator=denominator)
    return loss, ratio_stats(ratio, advantages, mask, eps_low, eps_high)


def sequence_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's sequence importance ratio s_i = exp(mean over valid tokens of log(pi / pi_old)), a geometric mean.

    Example: log-ratios [3e-4, -1e-4, 1e-4] -> s = e^(3e-4 / 3) = e^1e-4 = 1.00010001. A row with no valid token
    gets s = 1. Above ``LOG_RATIO_LINEAR_ABOVE`` nats, exp is continued by its tangent (finite, gradient of the right
    sign). (B, T) -> (B,).

    Source: GSPO, Zheng et al. 2025, eq. 7.
    """
    return exp_linear_above(_mean_log_ratio(logprobs, old_logprobs, mask), LOG_RATIO_LINEAR_ABOVE)  # (B,)


def _mean_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """(B,) mean over each row's valid tokens of log(pi / pi_old); 0 for a row with no valid token."""
    return zero_outside(logprobs - old_logprobs, mask).sum(-1) / mask.sum(-1).clamp(min=1)


def gspo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float,
              eps_high: float, dual_clip: float | None = None, denominator: float | None = None
              ) -> tuple[Tensor, dict]:
    """GSPO: one clipped term per sequence with the sequence ratio s_i, averaged over sequences.

    L = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)). A sequence term is never spread over
    its tokens (that would weigh long sequences more); rows with no valid token are left out.

    Example (eps 3e-4 / 4e-4): token log-ratios [3e-4, -1e-4, 1e-4] and [6e-4], advantages [+1, -1]:
    s = [e^1e-4, e^6e-4] = [1.00010001, 1.00060018]; seq 0 is inside [0.9997, 1.0004], seq 1 is above it but
    A < 0 keeps the unclipped branch, so the loss is (-1.00010001 + 1.00060018) / 2 = 0.00025009.

    Args:
        logprobs, old_logprobs, mask: (B, T); old_logprobs without grad.
        advantages: (B,) one per sequence.
        eps_low, eps_high, dual_clip: clip ranges (GSPO uses 3e-4 / 4e-4).
        denominator: number of sequences to divide by (the whole minibatch's, under gradient accumulation).

    Returns:
        (loss, stats) as in ``policy_loss`` (without approx_kl); stats count every token of a clipped sequence.

    Copy with: sequence_ratio, _mean_log_ratio, _clipped_surrogate, sequence_mean, ratio_stats.

    Source: GSPO, Zheng et al. 2025, eq. 5-7.
    """
    B, T = logprobs.shape
    has_tokens = mask.sum(-1) > 0  # (B,)
    advantages = torch.where(has_tokens, advantages, 0.0)  # the advantage of a row with no valid token is not read
    seq_ratio = sequence_ratio(logprobs, old_logprobs, mask)  # (B,)
    per_seq = _clipped_surrogate(seq_ratio, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)  # (B,)
    loss = sequence_mean(per_seq, has_tokens, denominator)
    # stats per token (each token of a clipped sequence lost its gradient), as GSPO's paper counts them
    per_token_ratio = seq_ratio.detach().unsqueeze(1).expand(B, T)
    return loss, ratio_stats(per_token_ratio, advantages.unsqueeze(1).expand(B, T), mask, eps_low, eps_high)


def gspo_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float,
                    eps_high: float, agg: str = "seq-mean-token-mean", dual_clip: float | None = None,
                    max_tokens: int | None = None, denominator: float | None = None) -> tuple[Tensor, dict]:
    """GSPO-token: s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)], clipped per token, then ``aggregate``.

    s_it has the value of the sequence ratio s_i, but its gradient flows through each token's own log-prob, so
    per-token advantages are allowed; with advantages constant per sequence it has GSPO's value and gradient.

    Args:
        logprobs, old_logprobs, mask: (B, T); old_logprobs without grad.
        advantages: (B, T).
        eps_low, eps_high, dual_clip: clip ranges.
        agg, max_tokens, denominator: see ``aggregate``.

    Returns:
        (loss, stats) as in ``policy_loss`` (without approx_kl).

    Copy with: sequence_ratio, _mean_log_ratio, _clipped_surrogate, aggregate, AGGREGATIONS, ratio_stats.

    Source: GSPO, Zheng et al. 2025, eq. 13-14.
    """
    logprobs, advantages = zero_outside(logprobs, mask), zero_outside(advantages, mask)  # padding is never read
    seq_ratio = sequence_ratio(logprobs, old_logprobs, mask)  # (B,)
    # past 20 nats d s_i / d(mean log-ratio) is e^20, not s_i: scaling by that slope / s_i keeps GSPO's gradient
    mean_lr = _mean_log_ratio(logprobs, old_logprobs, mask).detach()  # (B,)
    slope = torch.where(mean_lr <= LOG_RATIO_LINEAR_ABOVE, 1.0,
                        1 / (1 + (mean_lr - LOG_RATIO_LINEAR_ABOVE))).unsqueeze(1)  # (B, 1)
    ratio = seq_ratio.detach().unsqueeze(1) * torch.exp((logprobs - logprobs.detach()) * slope)  # (B, T)
    per_token = _clipped_surrogate(ratio, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)  # (B, T)
    loss = aggregate(per_token, mask, agg, max_tokens=max_tokens, denominator=denominator)
    return loss, ratio_stats(ratio, advantages, mask, eps_low, eps_high)


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip: float | None = 0.2,
               agg: str = "token-mean", denominator: float | None = None) -> tuple[Tensor, dict]:
    """Clipped value loss of RLHF-style PPO: 0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old).

    The clip keeps the critic from moving further than ``clip`` from its rollout-time prediction in one rollout's
    updates, like the ratio clip does for the policy; taking the max makes it pessimistic.

    Args:
        values: (B, T) current critic predictions (with grad).
        old_values: (B, T) predictions at rollout time.
        returns: (B, T) regression targets (GAE returns).
        mask: (B, T) 1 on valid tokens.
        clip: the clip range (> 0), or None for the plain squared error.
        agg, denominator: see ``aggregate``.

    Returns:
        (loss, stats) with stats value_clip_frac (share of tokens where the clipped branch is the larger) and
        value_mean.

    Raises:
        ValueError: on shape mismatch or clip <= 0.

    Source: Ziegler et al. 2019 / OpenAI lm-human-preferences; Huang et al. 2022 ("37 implementation details of
    PPO", detail 9).
    """
    same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    if clip is not None and clip <= 0:
        raise ValueError(f"clip must be > 0 or None, got {clip}")
    # padding is never read: it may hold anything, inf and NaN included
    values, old_values, returns = (zero_outside(x, mask) for x in (values, old_values.detach(), returns.detach()))
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token, clipped_branch = 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (v_clipped - returns) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        clipped_branch = clipped > unclipped
    loss = aggregate(per_token, mask, agg, denominator=denominator)
    with torch.no_grad():
        m = mask > 0
        n = m.sum().clamp(min=1)
        stats = {"value_clip_frac": float((clipped_branch & m).sum() / n),
                 "value_mean": float((values * m).sum() / n)}
    return loss, stats
