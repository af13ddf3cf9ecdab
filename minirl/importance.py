"""Importance corrections between a sampler (the inference engine) and the trainer.

Real systems sample with one engine (vLLM, SGLang: bfloat16, other kernels, other MoE routes) and train with
another, so the tokens come from a sampler mu that is not quite the trainer's pi_old. Two log-probs of the same
tokens are then at hand, both (B, T), in nats:

- ``sampler_logprobs``: log mu(y_t), what the sampler reported while it decoded;
- ``old_logprobs``: log pi_old(y_t), the same tokens scored again by the trainer before the update.

"Naive" training uses the sampler's log-probs as pi_old (the PPO ratio is then pi / mu and its clip acts on the
mismatch too); "recomputed" uses the trainer's own pi_old, so the ratio is exactly 1 before the first update, and the
remaining gap mu -> pi_old is corrected by a detached importance weight w on each term of the policy loss:

    grad = E_{y ~ mu}[ w(y) * (per-token policy-loss gradient under pi_old) ],  w = pi_old / mu.

Untruncated, the sequence weight prod_t pi_old(y_t) / mu(y_t) makes this exactly the on-policy gradient of pi_old
(tests/test_importance.py shows it by enumeration); its variance grows with length, hence the field's variants:
token weights (TIS: truncated at C; MIS: masked outside [C_min, C_max]) and sequence weights (a product of token
ratios, what TRL and verl use, or their geometric mean), truncated or masked. All work in log space: no weight
overflows, whatever the log-ratio; a weight is never differentiated (the trainer's pi_old has no gradient anyway).

Where they enter the loss: each per-token policy-loss term is multiplied by w before aggregation (TRL 1.16
``GRPOTrainer._compute_loss``, verl's ``pg_losses * rollout_is_weights``): ``apply_weights`` for any per-token loss,
``losses.policy_loss(..., is_weights=w)`` for minirl's. The KL-to-reference term is not weighted (as in TRL).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .checks import LOG_RATIO_LINEAR_ABOVE, choice, exp_linear_above, k3_of_log_ratio, ndim, same_shape, zero_outside

#: Which log-probs serve as pi_old in the PPO ratio (see ``choose_old_logprobs``).
PI_OLD = ("recomputed", "naive")
#: The corrections of ``is_weights``: none, token TIS / MIS, sequence TIS / MIS.
CORRECTIONS = ("none", "token_tis", "token_mis", "seq_tis", "seq_mis")
#: The corrections that give one weight per token, (B, T): a loss with one term per sequence cannot take them.
TOKEN_CORRECTIONS = ("token_tis", "token_mis")
#: A sequence weight's two forms: the product of its token ratios, or their geometric mean.
SEQ_FORMS = ("product", "geomean")
#: The largest cap: e^20 (``checks.LOG_RATIO_LINEAR_ABOVE``), a ratio of 4.9e8 is already no cap.
MAX_CAP = math.exp(LOG_RATIO_LINEAR_ABOVE)


def _log_ratio(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor) -> Tensor:
    """(B, T) log(pi_old / mu) on valid tokens, 0 elsewhere, after checking shapes and finiteness."""
    same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, completion_mask=completion_mask)
    ndim("old_logprobs", old_logprobs, 2, "(B, T)")
    valid = completion_mask > 0
    for name, t in (("old_logprobs", old_logprobs), ("sampler_logprobs", sampler_logprobs)):
        if not torch.isfinite(t[valid]).all():  # padding may hold -inf; a valid token may not
            raise ValueError(f"{name} holds a non-finite value (NaN or inf) on a valid token of completion_mask")
    return zero_outside(old_logprobs.detach() - sampler_logprobs.detach(), completion_mask)


def _log_bounds(cap: float, cap_low: float | None) -> tuple[float, float]:
    """(log cap_low or -inf, log cap) after checking 0 < cap_low < cap <= e^20."""
    if not 0 < cap <= MAX_CAP:
        raise ValueError(f"cap must be in (0, e^{LOG_RATIO_LINEAR_ABOVE:g}], got {cap}")
    if cap_low is not None and not 0 < cap_low < cap:
        raise ValueError(f"cap_low must be None or in (0, cap={cap}), got {cap_low}")
    return (-math.inf if cap_low is None else math.log(cap_low)), math.log(cap)


def _truncate(log_w: Tensor, cap: float, cap_low: float | None) -> Tensor:
    """exp(log_w) clipped to [cap_low, cap], exact at the bounds (the bound itself, not exp(log(bound)))."""
    lo, hi = _log_bounds(cap, cap_low)
    w = torch.exp(log_w.clamp(min=lo, max=hi))  # never above cap, so never overflows
    w = torch.where(log_w >= hi, cap, w)
    return w if cap_low is None else torch.where(log_w <= lo, cap_low, w)


def _mask(log_w: Tensor, cap: float, cap_low: float | None) -> Tensor:
    """exp(log_w) where cap_low <= exp(log_w) <= cap, 0 elsewhere."""
    lo, hi = _log_bounds(cap, cap_low)
    keep = (log_w >= lo) & (log_w <= hi)
    return torch.where(keep, torch.exp(log_w.clamp(max=hi)), 0.0)


def choose_old_logprobs(old_logprobs: Tensor | None, sampler_logprobs: Tensor, *, pi_old: str = "recomputed"
                        ) -> Tensor:
    """The log-probs that play pi_old in the PPO ratio pi / pi_old: the trainer's recomputed ones, or the sampler's.

    - "recomputed" (minirl, TRL with vLLM, verl's default "decoupled" mode): ``old_logprobs``, the trainer's own
      forward on the sampled tokens. The ratio is exactly 1 before the first update; the sampler/trainer gap is left
      to an importance weight (``is_weights``), which can be truncated or masked.
    - "naive" (verl's ``bypass_mode=True``; any loop that trusts the engine's log-probs): ``sampler_logprobs``.
      The ratio pi / mu then carries the mismatch, and PPO's clip removes the gradient of every token whose
      mismatch alone leaves the band [1 - eps_low, 1 + eps_high] (for A > 0 above it, for A < 0 below it);
      no extra weight can help (pi_old / mu would be taken with pi_old = mu: exactly 1).

    Example: old_logprobs [[-1.0]], sampler_logprobs [[-1.3]]: "recomputed" -> [[-1.0]] (ratio 1 before the
    update), "naive" -> [[-1.3]] (ratio e^0.3 = 1.3499 before the update: clipped at eps 0.2 when A > 0).

    Args:
        old_logprobs: (B, T) pi_old recomputed by the trainer, nats; may be None with pi_old="naive".
        sampler_logprobs: (B, T) the sampler's log-probs of the same tokens, nats.
        pi_old: one of ``PI_OLD``.

    Returns:
        (B, T) the chosen log-probs, detached.

    Raises:
        ValueError: for an unknown pi_old, a shape mismatch, or old_logprobs None with pi_old="recomputed".

    Source: verl 0.9.1 ``verl/trainer/ppo/rollout_corr_helper.py`` ``apply_bypass_mode`` (naive) vs the decoupled
    mode; Yao et al. 2025 ("Your efficient RL framework secretly brings you off-policy RL training") on why the
    naive ratio is off-policy.
    """
    choice("pi_old", pi_old, PI_OLD)
    if pi_old == "naive":
        return sampler_logprobs.detach()
    if old_logprobs is None:
        raise ValueError("pi_old='recomputed' needs old_logprobs (the trainer's forward on the sampled tokens)")
    same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs)
    return old_logprobs.detach()


def token_tis_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, *, cap: float = 2.0,
                      cap_low: float | None = None) -> Tensor:
    """Token-level truncated importance sampling (TIS): w_t = min(pi_old(y_t) / mu(y_t), C), detached.

    Truncation bounds each token's weight (variance) at the price of a bias where pi_old / mu > C; with
    ``cap_low`` the weight is also raised to C_min from below (TRL's ``clip_min`` in ``token_truncate``). Computed
    as exp(min(log-ratio, log C)), so a log-ratio of +50 nats gives exactly C, never inf.

    Example: log-ratios [0, 0.5, 1.5, -50] (nats), C = 2: [e^0 = 1, e^0.5 = 1.648721, min(e^1.5 = 4.48, 2) = 2,
    e^-50 = 1.9e-22]; with cap_low 0.5 the last becomes 0.5.

    Args:
        old_logprobs: (B, T) pi_old, recomputed by the trainer (nats).
        sampler_logprobs: (B, T) the sampler's log-probs mu of the same tokens (nats).
        completion_mask: (B, T) 1 on valid tokens.
        cap: C > 0 (at most e^20); Yao et al. use 2, TRL's default clip_max is 3.
        cap_low: optional C_min in (0, C).

    Returns:
        (B, T) weights (ratios, unitless), 0 outside the mask.

    Raises:
        ValueError: on shape mismatch, a non-finite log-prob on a valid token (naming the argument), cap not in
            (0, e^20], cap_low not in (0, cap).

    Source: Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training" (TIS);
    TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` (``vllm_importance_sampling_mode="token_truncate"``);
    verl 0.9.1 ``rollout_corr_helper.compute_rollout_correction_weights`` (``rollout_is=token``).
    """
    log_ratio = _log_ratio(old_logprobs, sampler_logprobs, completion_mask)  # (B, T)
    return zero_outside(_truncate(log_ratio, cap, cap_low), completion_mask)


def token_mis_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, *, cap: float = 2.0,
                      cap_low: float | None = None) -> Tensor:
    """Token-level masked importance sampling (MIS): w_t = r_t if C_min <= r_t <= C_max else 0, r_t = pi_old / mu.

    Instead of trusting a wildly mismatched token at weight C (TIS), MIS drops it from the gradient; a token inside
    the bounds keeps its full ratio. Without ``cap_low`` there is no lower bound (TRL's default).

    Example: log-ratios [0, 0.5, 1.5, -3] (nats), C_max = 2, C_min = 0.5: [1, 1.648721, 0 (4.48 > 2),
    0 (e^-3 = 0.0498 < 0.5)]; without C_min the last is 0.049787.

    Args:
        old_logprobs, sampler_logprobs, completion_mask: (B, T), as in ``token_tis_weights``.
        cap: C_max > 0 (at most e^20).
        cap_low: optional C_min in (0, C_max).

    Returns:
        (B, T) weights, 0 outside the mask and on masked tokens.

    Raises:
        ValueError: as ``token_tis_weights``.

    Source: Liu & Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
    Mismatch" (masked IS); TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` (``token_mask``); verl 0.9.1
    ``rollout_is=token`` with a "lower_upper" threshold (IcePop).
    """
    log_ratio = _log_ratio(old_logprobs, sampler_logprobs, completion_mask)  # (B, T)
    return zero_outside(_mask(log_ratio, cap, cap_low), completion_mask)


def sequence_log_ratio(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, *,
                       form: str = "product") -> Tensor:
    """log of a sequence's importance ratio: sum_t log(pi_old / mu) ("product") or its mean ("geomean").

    The product prod_t pi_old(y_t) / mu(y_t) = pi_old(y) / mu(y) is the exact sequence ratio (unbiased, variance
    growing with length); the geometric mean (prod_t r_t)^(1/|y|) is length-normalised, as GSPO's ratio, and stays
    near 1 on long sequences, but is no importance ratio of y (biased). TRL's and verl's sequence modes use the
    product (TRL issue #5814 asks for the geometric mean).

    Example: log-ratios [0.1, -0.3, 0.5] on 3 valid tokens: product 0.1 - 0.3 + 0.5 = 0.3 (ratio e^0.3 = 1.349859),
    geomean 0.3 / 3 = 0.1 (ratio 1.105171). A row with no valid token: 0.

    Args:
        old_logprobs, sampler_logprobs, completion_mask: (B, T), as in ``token_tis_weights``.
        form: one of ``SEQ_FORMS``.

    Returns:
        (B,) log-ratios in nats.

    Raises:
        ValueError: as ``token_tis_weights``, or for an unknown form.

    Source: Liu & Li et al. 2025, "When Speed Kills Stability" (sequence-level IS); TRL 1.16
    ``GRPOTrainer._generate_and_score_completions`` (the sum, in the ``sequence_*`` modes); GSPO, Zheng et al. 2025,
    eq. 7 (the geometric mean).
    """
    choice("form", form, SEQ_FORMS)
    total = _log_ratio(old_logprobs, sampler_logprobs, completion_mask).sum(-1)  # (B,)
    return total if form == "product" else total / (completion_mask > 0).sum(-1).clamp(min=1)


def seq_tis_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, *, cap: float = 2.0,
                    cap_low: float | None = None, form: str = "product") -> Tensor:
    """Sequence-level truncated IS: w_i = min(exp(sequence_log_ratio_i), C), one weight for all of y_i's tokens.

    Example: token log-ratios [0.1, -0.3, 0.5], C = 2: product min(e^0.3, 2) = 1.349859; log-ratios
    [0.5, 0.5, 0.5]: product min(e^1.5, 2) = 2, geomean e^0.5 = 1.648721. A row with no valid token: 1.

    Args:
        old_logprobs, sampler_logprobs, completion_mask: (B, T), as in ``token_tis_weights``.
        cap, cap_low: as in ``token_tis_weights``.
        form: "product" (TRL's and verl's) or "geomean" (see ``sequence_log_ratio``).

    Returns:
        (B,) weights; multiply every token of row i by w_i (``apply_weights`` broadcasts them).

    Raises:
        ValueError: as ``sequence_log_ratio`` and ``token_tis_weights``.

    Source: TRL 1.16 ``GRPOTrainer._generate_and_score_completions`` (``sequence_truncate``); verl 0.9.1
    ``rollout_is=sequence``; Yao et al. 2025 (truncation).
    """
    log_w = sequence_log_ratio(old_logprobs, sampler_logprobs, completion_mask, form=form)  # (B,)
    return torch.where((completion_mask > 0).any(-1), _truncate(log_w, cap, cap_low), 1.0)


def seq_mis_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, *, cap: float = 2.0,
                    cap_low: float | None = None, form: str = "product") -> Tensor:
    """Sequence-level masked IS: w_i = exp(L_i) if C_min <= exp(L_i) <= C_max else 0, L = ``sequence_log_ratio``.

    A sequence whose ratio leaves the bounds is dropped whole (TRL 1.16's default correction: ``sequence_mask``
    with C_max = 3 and the product form; Liu & Li et al. 2025's sequence MIS).

    Example: token log-ratios [0.5, 0.5, 0.5], C_max = 2: product e^1.5 = 4.48 > 2 -> 0; geomean e^0.5 = 1.648721
    (kept). [0.1, -0.3, 0.5]: product e^0.3 = 1.349859 (kept). A row with no valid token: 1.

    Args:
        old_logprobs, sampler_logprobs, completion_mask: (B, T), as in ``token_tis_weights``.
        cap, cap_low: C_max and optional C_min, as in ``token_mis_weights``.
        form: "product" or "geomean".

    Returns:
        (B,) weights.

    Raises:
        ValueError: as ``seq_tis_weights``.

    Source: Liu & Li et al. 2025, "When Speed Kills Stability" (sequence-level MIS); TRL 1.16
    ``GRPOTrainer._generate_and_score_completions`` (``sequence_mask``); verl 0.9.1 ``rollout_is=sequence`` with a
    "lower_upper" threshold.
    """
    log_w = sequence_log_ratio(old_logprobs, sampler_logprobs, completion_mask, form=form)  # (B,)
    return torch.where((completion_mask > 0).any(-1), _mask(log_w, cap, cap_low), 1.0)


def is_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, *, correction: str = "none",
               cap: float = 2.0, cap_low: float | None = None, form: str = "product") -> Tensor:
    """The importance weights of one correction, by name (what ``RLConfig.is_correction`` selects).

    "none" -> ones (B, T) on valid tokens; "token_tis" / "token_mis" -> (B, T) (``token_tis_weights``,
    ``token_mis_weights``); "seq_tis" / "seq_mis" -> (B,) (``seq_tis_weights``, ``seq_mis_weights``).

    Example: equal log-probs give weights exactly 1 for every correction (log-ratio 0, inside any bounds that
    contain 1).

    Args:
        old_logprobs, sampler_logprobs, completion_mask: (B, T), as in ``token_tis_weights``.
        correction: one of ``CORRECTIONS``.
        cap, cap_low, form: passed on (form only to the sequence corrections).

    Returns:
        (B, T) or (B,) detached weights, ready for ``apply_weights`` or ``losses.policy_loss(is_weights=...)``.

    Raises:
        ValueError: for an unknown correction, and as the function it calls.

    Source: the functions it calls (TRL 1.16 ``vllm_importance_sampling_mode``; verl 0.9.1 ``rollout_is``).
    """
    choice("correction", correction, CORRECTIONS)
    if correction == "none":
        _log_ratio(old_logprobs, sampler_logprobs, completion_mask)  # the same checks as the others
        return (completion_mask > 0).to(old_logprobs.dtype)
    fn = {"token_tis": token_tis_weights, "token_mis": token_mis_weights}.get(correction)
    if fn is not None:
        return fn(old_logprobs, sampler_logprobs, completion_mask, cap=cap, cap_low=cap_low)
    fn = seq_tis_weights if correction == "seq_tis" else seq_mis_weights
    return fn(old_logprobs, sampler_logprobs, completion_mask, cap=cap, cap_low=cap_low, form=form)


def apply_weights(per_token_loss: Tensor, weights: Tensor, completion_mask: Tensor) -> Tensor:
    """Multiply a per-token policy loss by detached importance weights, before aggregation: sg(w_t) * L_t.

    The weight changes the measure the gradient is averaged over (samples of mu re-weighted towards pi_old), not the
    objective: it is detached, and applied to the policy-gradient term only (TRL adds the KL term after weighting).
    Then aggregate as usual (``losses.aggregate``). Sequence weights (B,) are broadcast over the row's tokens.

    Example: per-token loss [[1.0, 2.0], [3.0, 0.0]], mask [[1, 1], [1, 0]], token weights [[2.0, 0.5], [0.0, 9]]
    -> [[2.0, 1.0], [0.0, 0.0]] (padding stays 0 whatever it holds); sequence weights [2.0, 0.5] ->
    [[2.0, 4.0], [1.5, 0.0]].

    Args:
        per_token_loss: (B, T) per-token loss terms (with grad).
        weights: (B, T) token weights or (B,) sequence weights, finite and >= 0.
        completion_mask: (B, T) 1 on valid tokens.

    Returns:
        (B, T) weighted per-token loss, 0 outside the mask.

    Raises:
        ValueError: on a shape mismatch, or weights that are negative or not finite on valid tokens.

    Source: TRL 1.16 ``GRPOTrainer._compute_loss`` (``per_token_loss * inputs["importance_sampling_ratio"]``);
    verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` (``pg_losses * rollout_is_weights``).
    """
    same_shape(per_token_loss=per_token_loss, completion_mask=completion_mask)
    ndim("per_token_loss", per_token_loss, 2, "(B, T)")
    B, T = per_token_loss.shape
    if weights.shape == (B,):
        weights = weights.unsqueeze(1).expand(B, T)  # (B, T)
    elif weights.shape != (B, T):
        raise ValueError(f"weights must have shape ({B},) or ({B}, {T}), got {tuple(weights.shape)}")
    valid = completion_mask > 0
    w = weights.detach()[valid]
    if not (torch.isfinite(w).all() and (w >= 0).all()):
        raise ValueError("weights must be finite and >= 0 on valid tokens")
    return zero_outside(weights.detach().to(per_token_loss.dtype) * per_token_loss, completion_mask)


def mismatch_metrics(old_logprobs: Tensor, sampler_logprobs: Tensor, completion_mask: Tensor, *,
                     correction: str = "none", cap: float = 2.0, cap_low: float | None = None,
                     form: str = "product") -> dict:
    """What the engines log about the sampler/trainer gap and what a correction did to the batch.

    With log r_t = log pi_old(y_t) - log mu(y_t) over valid tokens (sampled from mu), the three KL estimators of
    KL(mu || pi_old) (Schulman 2020): k1 = -log r (verl's ``rollout_corr/kl``), k2 = (log r)^2 / 2,
    k3 = r - 1 - log r (verl's ``rollout_corr/k3_kl``); TRL's ``sampling_logp_difference`` (mean and max |log r|);
    the token ratio's min and max (exp continued linearly past 20 nats, as ``checks.exp_linear_above``: finite);
    the sequence ratio's max (``form``); and the share of tokens and of sequences whose weight the correction
    truncated or masked.

    Example: old [[-1.0, -1.0]], sampler [[-1.0, -1.5]], all valid: log r = [0, 0.5]; k1 = (0 - 0.5)/2 = -0.25,
    k2 = (0 + 0.125)/2 = 0.0625, k3 = (0 + e^0.5 - 1.5)/2 = 0.074361; with token_tis, C = 1.5: one of 2 tokens
    truncated (e^0.5 = 1.65 > 1.5), tokens_truncated 0.5, seqs_truncated 1.0.

    Args:
        old_logprobs, sampler_logprobs, completion_mask: (B, T), as in ``token_tis_weights``.
        correction, cap, cap_low, form: as in ``is_weights``.

    Returns:
        dict of floats: k1, k2, k3 (nats / token), logp_diff_mean / logp_diff_max (nats), ratio_min, ratio_max,
        seq_ratio_max, weight_mean (mean weight per valid token), tokens_truncated, tokens_masked, seqs_truncated,
        seqs_masked (shares of valid tokens / of rows with a valid token; a sequence counts when any of its tokens
        does). An empty batch gives zeros (ratios 1).

    Raises:
        ValueError: as ``is_weights``.

    Source: Schulman 2020 ("Approximating KL Divergence", k1 / k2 / k3); TRL 1.16
    ``GRPOTrainer._generate_and_score_completions`` (the ``sampling/*`` metrics); verl 0.9.1
    ``rollout_corr_helper.compute_offpolicy_metrics``.
    """
    log_r = _log_ratio(old_logprobs, sampler_logprobs, completion_mask)  # (B, T)
    weights = is_weights(old_logprobs, sampler_logprobs, completion_mask, correction=correction, cap=cap,
                         cap_low=cap_low, form=form)
    valid = completion_mask > 0
    rows = valid.any(-1)  # (B,)
    n, n_rows = valid.sum().clamp(min=1), rows.sum().clamp(min=1)
    lr, ratio = log_r[valid], exp_linear_above(log_r[valid])  # (N,) over valid tokens
    seq_lr = sequence_log_ratio(old_logprobs, sampler_logprobs, completion_mask, form=form)  # (B,)
    # the log-ratio each weight was computed from, per token, and whether it left [log cap_low, log cap]
    acted_on = seq_lr.unsqueeze(1).expand_as(log_r) if correction.startswith("seq") else log_r  # (B, T)
    lo, hi = _log_bounds(cap, cap_low)
    outside = valid & ((acted_on > hi) | (acted_on < lo)) & (correction != "none")  # (B, T)
    truncated = outside if correction.endswith("tis") else torch.zeros_like(outside)
    masked = outside if correction.endswith("mis") else torch.zeros_like(outside)
    w = weights.unsqueeze(1).expand_as(log_r) if weights.dim() == 1 else weights  # (B, T)
    empty = lr.numel() == 0
    return {
        "k1": float((-lr).sum() / n), "k2": float((0.5 * lr**2).sum() / n),
        "k3": float(k3_of_log_ratio(lr).sum() / n),  # exact near r = 1
        "logp_diff_mean": float(lr.abs().sum() / n), "logp_diff_max": 0.0 if empty else float(lr.abs().max()),
        "ratio_min": 1.0 if empty else float(ratio.min()), "ratio_max": 1.0 if empty else float(ratio.max()),
        "seq_ratio_max": 1.0 if empty else float(exp_linear_above(seq_lr[rows]).max()),
        "weight_mean": float(zero_outside(w, completion_mask).sum() / n),
        "tokens_truncated": float(truncated.sum() / n), "tokens_masked": float(masked.sum() / n),
        "seqs_truncated": float(truncated.any(-1).sum() / n_rows), "seqs_masked": float(masked.any(-1).sum() / n_rows),
    }
