"""Losses that keep the gradient PPO's clip removes: CISPO, SAPO and GMPO, one function each.

PPO's clip sets a token's gradient to zero once its ratio pi / pi_old leaves [1 - eps_low, 1 + eps_high] on the
side its advantage pushes. These three keep a gradient there: CISPO clips a detached weight instead of the ratio
(REINFORCE on every token), SAPO replaces the hard band by a smooth gate, GMPO clips in log space and takes a
sequence's geometric mean. ``losses.policy_loss`` calls them by ``loss_mode``; each returns (loss, stats) with the
clip fractions of its own rule and ``ppo_clip_frac``, PPO's, for comparison.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import aggregate, ratio_stats, sequence_mean
from .checks import LOG_RATIO_LINEAR_ABOVE, choice, exp_linear_above, zero_outside

#: CISPO's weight: the paper's and verl's two-sided clip, or TRL's one-sided cap (see ``cispo_loss``).
CISPO_FORMS = ("two-sided", "one-sided")
#: PPO's band (eps 0.2 / 0.2) of the ``ppo_clip_frac`` diagnostic, comparable across the losses that do not clip.
PPO_BAND = 0.2


def check_tau(tau_pos: float, tau_neg: float) -> None:
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO's temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")


def cispo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float = 0.2,
               eps_high: float = 0.2, form: str = "two-sided", agg: str = "token-mean", max_tokens: int | None = None,
               denominator: float | None = None) -> tuple[Tensor, dict]:
    """CISPO: REINFORCE on every token, weighted by a detached, clipped importance ratio.

    Per token: L_t = -sg(w_t) A_t log pi(y_t), with r_t = pi(y_t) / pi_old(y_t) and
    w_t = clip(r_t, 1 - eps_low, 1 + eps_high) ("two-sided", the paper's eq. 5 and verl's "cispo") or
    w_t = min(r_t, 1 + eps_high) ("one-sided", TRL's "cispo", whose ``epsilon_high`` is the absolute cap
    1 + eps_high). The gradient is -w_t A_t d log pi: where PPO's clip sets a token's gradient to 0, CISPO keeps
    it, only its weight stops growing. The paper sets no lower bound in practice (a large eps_low), which is the
    one-sided form.

    Example: logprobs = old_logprobs = -1.0, A = +1: w = 1, loss = -1 * 1 * (-1.0) = 1.0, d loss / d logprobs = -1.
    After an update to -0.5 (r = e^0.5 = 1.648721), eps 0.2 / 0.28: w = 1.28, loss = -1.28 * (-0.5) = 0.64 and the
    gradient is -1.28 (PPO's is 0 there); one-sided with eps_high = 4 (cap 5): w = r = 1.648721, loss 0.824361,
    gradient -1.648721.

    Args:
        logprobs, old_logprobs, mask: (B, T); old_logprobs without grad.
        advantages: (B, T).
        eps_low, eps_high: the weight's bounds 1 - eps_low (two-sided only) and 1 + eps_high.
        form: one of ``CISPO_FORMS`` (ValueError otherwise; ``check_settings`` checks the rest).
        agg, max_tokens, denominator: see ``aggregate`` (the paper: token-mean).

    Returns:
        (loss, stats): clip_frac_low / clip_frac_high = share of valid tokens whose weight was raised to
        1 - eps_low / capped at 1 + eps_high (their gradient is scaled, not removed), clip_frac their sum,
        ppo_clip_frac (see ``PPO_BAND``) and the ratio summaries of ``policy_loss``.

    Copy with: CISPO_FORMS, aggregate, AGGREGATIONS, ratio_stats, own_clip_stats, PPO_BAND.

    Source: MiniMax-M1, MiniMax 2025 (arXiv 2506.13585), eq. 4-5 (CISPO); TRL 1.16 ``loss_type="cispo"``;
    verl ``loss_mode="cispo"``.
    """
    choice("cispo form", form, CISPO_FORMS)
    advantages = zero_outside(advantages, mask)  # (B, T); padding is never read
    ratio = exp_linear_above(zero_outside(logprobs - old_logprobs, mask), LOG_RATIO_LINEAR_ABOVE)  # (B, T)
    low = 1 - eps_low if form == "two-sided" else 0.0
    weight = torch.clamp(ratio, low, 1 + eps_high).detach()  # (B, T) sg(w): no gradient through the ratio
    per_token = -weight * advantages * logprobs  # (B, T); logprobs is 0 outside the mask (policy_loss zeroes it)
    loss = aggregate(per_token, mask, agg, max_tokens=max_tokens, denominator=denominator)
    stats = ratio_stats(ratio, advantages, mask, PPO_BAND, PPO_BAND)
    return loss, own_clip_stats(stats, ratio < low, ratio > 1 + eps_high, mask)  # one-sided: low 0, never below


def sapo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, tau_pos: float = 1.0,
              tau_neg: float = 1.05, agg: str = "seq-mean-token-mean", max_tokens: int | None = None,
              denominator: float | None = None) -> tuple[Tensor, dict]:
    """SAPO: a smooth, temperature-controlled gate in place of the hard clip.

    Per token: L_t = -f(r_t) A_t with f(r) = (4 / tau) sigmoid(tau (r - 1)), tau = tau_pos for A_t > 0 and tau_neg
    otherwise. Its gradient with respect to log pi is -A_t * 4 r s (1 - s), s = sigmoid(tau (r - 1)): exactly
    -A_t at r = 1 (the 4 / tau makes the on-policy gradient that of the plain policy gradient whatever tau), then
    decaying smoothly as r leaves 1, never switched off at a band edge. tau_neg > tau_pos makes negative-advantage
    tokens decay faster (their updates spread over the whole vocabulary).

    Example: on-policy (r = 1), A = +1, tau 1: f = 4 * 0.5 = 2, loss = -2, gradient -4 * 0.25 = -1. At
    r = e^0.5 = 1.648721: s = sigmoid(0.648721) = 0.656722, f = 4 s = 2.626889, loss = -2.626889, gradient
    -4 * 1.648721 * 0.656722 * 0.343278 = -1.486739 (PPO's is 0 there).

    Args:
        logprobs, old_logprobs, mask: (B, T); old_logprobs without grad.
        advantages: (B, T).
        tau_pos, tau_neg: gate temperatures (the paper's 1.0 and 1.05); ValueError unless both are > 0.
        agg, max_tokens, denominator: see ``aggregate`` (the paper: seq-mean-token-mean, as GRPO).

    Returns:
        (loss, stats): clip_frac* are 0 (nothing is clipped), ppo_clip_frac (see ``PPO_BAND``), gate_mean (mean
        f'(r) r of valid tokens: the share of the plain policy gradient the gate lets through, 1 on-policy) and the
        ratio summaries of ``policy_loss``.

    Copy with: check_tau, aggregate, AGGREGATIONS, ratio_stats, own_clip_stats, PPO_BAND.

    Source: SAPO, Gao et al. 2025 (arXiv 2511.20347), eq. 5-6; TRL 1.16 ``loss_type="sapo"``; verl
    ``loss_mode="sapo"``.
    """
    check_tau(tau_pos, tau_neg)
    advantages = zero_outside(advantages, mask)  # (B, T); padding is never read
    ratio = exp_linear_above(zero_outside(logprobs - old_logprobs, mask), LOG_RATIO_LINEAR_ABOVE)  # (B, T)
    # (B, T) in the ratio's dtype: torch.where of two Python floats would give float32 even for float64 inputs
    tau = torch.full_like(ratio, tau_neg).masked_fill(advantages > 0, tau_pos)
    gate = torch.sigmoid(tau * (ratio - 1)) * (4 / tau)  # (B, T) f(r)
    per_token = -gate * advantages  # (B, T)
    loss = aggregate(per_token, mask, agg, max_tokens=max_tokens, denominator=denominator)
    stats = ratio_stats(ratio, advantages, mask, PPO_BAND, PPO_BAND)
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1))
        through = zero_outside(4 * ratio * s * (1 - s), mask)  # (B, T) d f / d log r
    nothing = torch.zeros_like(ratio, dtype=torch.bool)  # nothing is clipped
    gate_mean = float(through.sum() / mask.sum().clamp(min=1))
    return loss, {**own_clip_stats(stats, nothing, nothing, mask), "gate_mean": gate_mean}


def gmpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *, eps_low: float = 0.4,
              eps_high: float = 0.4, denominator: float | None = None) -> tuple[Tensor, dict]:
    """GMPO: one term per sequence, the geometric mean of its sign-aware, log-space-clipped token ratios.

    With l_t = log r_t and c_t = clip(l_t, -eps_low, eps_high): m_t = min(l_t, c_t) for A > 0 and max(l_t, c_t)
    for A < 0 (PPO's pessimistic side, taken in log space), then L = mean_i -A_i exp(mean_t m_t). A clipped token
    loses its own gradient but not its sequence's; a token ratio enters as its 1/|o|-th power, so one outlier
    moves the sequence's weight far less than in GRPO's arithmetic mean. Rows with no valid token are left out.

    Example (eps 0.4 / 0.4): log-ratios [0.6, 0.0] with A = +1: m = [0.4, 0.0] (the first is clipped), weight
    e^0.2 = 1.221403, loss -1.221403; d loss / d logprobs = [0, -1.221403 / 2 = -0.610701]. With A = -1 the first
    is not clipped (max(0.6, 0.4)): weight e^0.3 = 1.349859, loss 1.349859, gradient [0.674929, 0.674929].

    Args:
        logprobs, old_logprobs, mask: (B, T); old_logprobs without grad.
        advantages: (B,) one per sequence.
        eps_low, eps_high: log-ratio bounds (the ratio stays in [e^-eps_low, e^eps_high]; the paper's 0.4 / 0.4).
        denominator: number of sequences to divide by (the whole minibatch's, under gradient accumulation).

    Returns:
        (loss, stats): clip_frac_low / clip_frac_high = share of valid tokens whose gradient the log-space clip
        removed (A < 0 below, A > 0 above), clip_frac their sum, ppo_clip_frac (see ``PPO_BAND``), and the
        token-ratio summaries of ``policy_loss``.

    Copy with: sequence_mean, ratio_stats, own_clip_stats, PPO_BAND.

    Source: GMPO, Zhao et al. 2025 (arXiv 2507.20673), eq. 4; TRL 1.16 ``trl.experimental.gmpo``; verl
    ``loss_mode="geo_mean"``.
    """
    B, T = logprobs.shape
    has_tokens = mask.sum(-1) > 0  # (B,)
    advantages = torch.where(has_tokens, advantages, 0.0)  # the advantage of a row with no valid token is not read
    log_ratio = zero_outside(logprobs - old_logprobs, mask)  # (B, T)
    clipped = torch.clamp(log_ratio, -eps_low, eps_high)  # (B, T)
    a = advantages.unsqueeze(1)  # (B, 1)
    pessimistic = torch.where(a > 0, torch.minimum(log_ratio, clipped), torch.maximum(log_ratio, clipped))  # (B, T)
    mean_log = zero_outside(pessimistic, mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
    weight = exp_linear_above(mean_log, LOG_RATIO_LINEAR_ABOVE)  # (B,) geometric mean of the clipped ratios
    per_seq = -advantages * weight  # (B,)
    loss = sequence_mean(per_seq, has_tokens, denominator)
    ratio = exp_linear_above(log_ratio, LOG_RATIO_LINEAR_ABOVE).detach()  # (B, T) token ratios, for the stats
    a_tok = a.expand(B, T)
    stats = ratio_stats(ratio, a_tok, mask, PPO_BAND, PPO_BAND)
    return loss, own_clip_stats(stats, (log_ratio < -eps_low) & (a_tok < 0), (log_ratio > eps_high) & (a_tok > 0),
                                 mask)


def own_clip_stats(stats: dict, low: Tensor, high: Tensor, mask: Tensor) -> dict:
    """``stats`` of PPO's band (kept as ppo_clip_frac) with the clip fractions replaced by a loss's own: the shares
    of valid tokens in the (B, T) boolean ``low`` and ``high``."""
    valid = mask > 0
    n = valid.sum().clamp(min=1)
    lo, hi = float((low & valid).sum() / n), float((high & valid).sum() / n)
    return {**stats, "ppo_clip_frac": stats["clip_frac"], "clip_frac_low": lo, "clip_frac_high": hi,
            "clip_frac": lo + hi}
