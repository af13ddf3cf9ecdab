"""Exercises of chapter 12: stale samplers (AReaL's decoupled PPO, DeepSeek-V3.2's off-policy sequence mask).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import torch

from . import _reference as ref
from ._core import _case, _exercise, _expect, _expect_finite, _grad, _leaf, _prefix_mask, _t

# ================================================================================================================
# 12 · decoupled PPO: the trust region around the proximal policy, the sampler corrected by a weight

ex = _exercise("decoupled_ppo_terms", "12", "decoupled_ppo_terms(logprobs, prox_logprobs, behaviour_logprobs, "
               "advantages, mask, *, eps_low=0.2, eps_high=None, weight_cap=None) -> (B, T) (advantages (B,))",
               "minirl.stale_corrections.decoupled_ppo_terms", ("minirl.stale_corrections.decoupled_ppo_terms",))
BEHAVIOUR_CLIP = ("the clip is around the stale BEHAVIOUR policy (r = pi / mu, naive PPO with the sampler as pi_old): "
                  "a token is clipped for the sampler's staleness before any update and loses its gradient; decoupled "
                  "PPO clips r = pi / pi_prox and corrects for the sampler with the weight pi_prox / mu")
NO_WEIGHT = ("the weight pi_prox / mu is missing: the tokens were drawn by the sampler mu, so each term is weighted "
             "by pi_prox / mu (detached) to average over pi_prox instead")
WEIGHT_UPSIDE_DOWN = "the weight is pi_prox / mu (the proximal policy over the sampler), not mu / pi_prox"
MIN_NOT_MAX = ("min instead of max: the sign error of a min / max clip for negative advantages (PPO takes the "
               "pessimistic MAX of -A r and -A clip(r): with A < 0 and r above 1 + eps_high the unclipped term wins "
               "and keeps pulling the ratio back)")
PROX_DETACHED = ("pi_prox is a constant: when it is the very tensor logprobs (the first update after a rollout) the "
                 "ratio pi / pi_prox must still carry the gradient of pi; detach the proximal log-probs")
CAP_MASKS = ("a weight above weight_cap MASKS the token (weight 0, AReaL's behav_imp_weight_cap); truncating it to the "
             "cap is TIS, another correction")
NO_CAP = "apply weight_cap: a token whose weight pi_prox / mu exceeds it gets weight 0"
EPS_HIGH_NONE = "eps_high=None means eps_high = eps_low (a symmetric clip), not 'no upper bound'"
STALE_PAD = ("mask the log-ratios before exp: the padding holds garbage (a 200-nat gap overflows exp to inf, and "
             "inf * 0 = NaN), and the terms outside the mask are 0")


def _terms(fn, lp, prox, mu, adv, mask, **settings):
    return fn(lp, _t(prox) if not isinstance(prox, torch.Tensor) else prox, _t(mu), _t(adv), _t(mask), **settings)


@_case(ex, "A > 0, stale by half a nat, by hand", BEHAVIOUR_CLIP)
def _(fn, gen):
    lp = _leaf([[-1.0, -0.5]])
    out = _terms(fn, lp, [[-1.0, -1.0]], [[-1.5, -1.5]], [2.0], [[1, 1]], eps_low=0.2, eps_high=0.2)
    # weight pi_prox / mu = e^0.5 = 1.648721; r = pi / pi_prox = (1, e^0.5 = 1.6487 > 1.2, clipped):
    # (-2 * 1.648721, -2 * 1.2 * 1.648721) = (-3.297443, -3.956931), gradient (-3.297443, 0).
    # Clip around mu (r = pi / mu = e^0.5, e^1, both clipped at 1.2): (-2.4, -2.4), gradient 0 (times the weight:
    # -3.956931 twice); no weight: (-2, -2.4); weight upside down (e^-0.5): (-1.213061, -1.455674); min instead of
    # max: (-3.297443, -2 e = -5.436564)
    _expect(out, [[-3.297443, -3.956931]],
            [([[-2.4, -2.4]], BEHAVIOUR_CLIP), ([[-3.956931, -3.956931]], BEHAVIOUR_CLIP), ([[-2.0, -2.4]], NO_WEIGHT),
             ([[-1.213061, -1.455674]], WEIGHT_UPSIDE_DOWN), ([[-3.297443, -5.436564]], MIN_NOT_MAX)], what="the terms")
    _expect(_grad(out, lp), [[-3.297443, 0.0]], [([[0.0, 0.0]], BEHAVIOUR_CLIP)], what="the gradient")


@_case(ex, "A < 0, one ratio above the band and one below", MIN_NOT_MAX)
def _(fn, gen):
    lp = _leaf([[-0.5, -1.5]])
    out = _terms(fn, lp, [[-1.0, -1.0]], [[-1.2, -1.2]], [-1.0], [[1, 1]], eps_low=0.2, eps_high=0.2)
    # weight e^0.2 = 1.221403; r = (e^0.5, e^-0.5): max(r, clip(r)) = (1.648721, 0.8): (e^0.7, 0.8 e^0.2) =
    # (2.013753, 0.977122), gradient (2.013753, 0); min: (1.2 e^0.2, e^-0.3) = (1.465683, 0.740818)
    _expect(out, [[2.013753, 0.977122]], [([[1.465683, 0.740818]], MIN_NOT_MAX)], what="the terms")
    _expect(_grad(out, lp), [[2.013753, 0.0]], [([[0.0, 0.740818]], MIN_NOT_MAX)], what="the gradient")


@_case(ex, "prox_logprobs is the same tensor as logprobs", PROX_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    out = _terms(fn, lp, lp, [[-1.5, -2.0]], [1.0], [[1, 1]])
    # r = 1 with d r / d lp = 1: gradient -A * weight = (-1.648721, -1)
    _expect(_grad(out, lp, no_grad_hint=PROX_DETACHED), [[-1.648721, -1.0]], [([[0.0, 0.0]], PROX_DETACHED)],
            what="the gradient")


@_case(ex, "eps_high 0.28, and the default eps_high (None: eps_low)", EPS_HIGH_NONE)
def _(fn, gen):
    # no staleness (weight 1), r = e^0.24 = 1.271249, A = 1: inside [0.8, 1.28] -> -1.271249; by default the band
    # is [0.8, 1.2] -> -1.2
    args = ([[-0.76]], [[-1.0]], [[-1.0]], [1.0], [[1]])
    _expect(_terms(fn, _t(args[0]), *args[1:], eps_high=0.28), [[-1.271249]], what="eps_high 0.28")
    _expect(_terms(fn, _t(args[0]), *args[1:]), [[-1.2]], [([[-1.271249]], EPS_HIGH_NONE)], what="the default")


@_case(ex, "weight_cap 2: a weight above it masks the token", CAP_MASKS)
def _(fn, gen):
    out = _terms(fn, _t([[-1.0, -1.0]]), [[-1.0, -1.0]], [[-2.0, -1.5]], [1.0], [[1, 1]], weight_cap=2.0)
    # weights (e = 2.718282 > 2, e^0.5 = 1.648721), r = 1, A = 1: (0, -1.648721); truncated to the cap: (-2, ...);
    # no cap: (-2.718282, ...)
    _expect(out, [[0.0, -1.648721]], [([[-2.0, -1.648721]], CAP_MASKS), ([[-2.718282, -1.648721]], NO_CAP)],
            what="the terms")


@_case(ex, "garbage in padding (a 200-nat gap)", STALE_PAD)
def _(fn, gen):
    lp = _leaf([[-1.0, 100.0]])
    out = _terms(fn, lp, [[-1.0, 0.0]], [[-1.5, -100.0]], [2.0], [[1, 0]])
    g = _expect_finite(out, lp, "the terms")
    _expect(out, [[-3.297443, 0.0]], what="the terms")
    _expect(g, [[-3.297443, 0.0]], what="the gradient")


@_case(ex, "random batch, both signs, random clip range, against the definition", BEHAVIOUR_CLIP)
def _(fn, gen):
    mask = _prefix_mask([6, 2, 0, 5], 6)
    lp = (-torch.rand(4, 6, generator=gen) * 2).requires_grad_(True)
    prox = lp.detach() + 0.3 * torch.randn(4, 6, generator=gen)
    mu = prox + 0.4 * torch.randn(4, 6, generator=gen)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0]) * (1 + torch.rand(4, generator=gen))
    eps_low, eps_high = (0.1 + 0.2 * torch.rand(2, generator=gen)).tolist()
    want = ref.decoupled_ppo_terms(lp, prox, mu, adv, mask, eps_low=eps_low, eps_high=eps_high)
    out = fn(lp, prox, mu, adv, mask, eps_low=eps_low, eps_high=eps_high)
    _expect(out, want.detach(), what="the terms")
    w = torch.rand(4, 6, generator=gen)
    _expect(_grad(out, lp, w), torch.autograd.grad((want * w).sum(), lp)[0], what="the gradient")


# ================================================================================================================
# 12 · DeepSeek-V3.2's off-policy sequence mask

ex = _exercise("off_policy_sequence_mask", "12", "off_policy_sequence_mask(logprobs, sampler_logprobs, advantages, "
               "mask, *, threshold) -> (B,) float, 1 keep / 0 drop",
               "minirl.stale_corrections.off_policy_sequence_mask",
               ("minirl.stale_corrections.off_policy_sequence_mask",))
MASK_DIRECTION = ("the log-ratio is log mu - log pi (the SAMPLER over the current policy): large when the current "
                  "policy finds the sequence much less likely than the sampler did")
DROPS_POSITIVE = ("only sequences with a NEGATIVE advantage are dropped: a positive (or zero) advantage is always "
                  "kept (DeepSeek-V3.2 eq. 9)")
MASK_SUM = "the mean log-ratio over the sequence's valid tokens (a k1 estimate per token), not their sum"
MASK_PAD = "average over the row's valid tokens only: padding holds garbage, and the padded length T is not the row's"
MASK_STRICT = "a sequence exactly at the threshold is kept: drop only when the mean log-ratio is ABOVE it"
MASK_EMPTY = ("a row with no valid token counts as on-policy (mean log-ratio 0): kept, not the NaN of 0 / 0 (NaN > "
              "threshold is False, NaN <= threshold is False too)")


@_case(ex, "two sequences with A < 0, by hand", MASK_DIRECTION)
def _(fn, gen):
    mu, pi = _t([[-1.0, -2.0], [-1.0, -1.0]]), _t([[-2.0, -3.0], [-1.2, -1.0]])
    # mean log mu - log pi: row 0 (1 + 1) / 2 = 1.0 > 0.5 -> drop; row 1 (0.2 + 0) / 2 = 0.1 -> keep.
    # Upside down (log pi - log mu: -1.0, -0.1): both kept
    _expect(fn(pi, mu, _t([-1.0, -1.0]), _t([[1, 1], [1, 1]]), threshold=0.5), [0.0, 1.0],
            [([1.0, 1.0], MASK_DIRECTION)], what="the mask")


@_case(ex, "A >= 0 is always kept", DROPS_POSITIVE)
def _(fn, gen):
    mu, pi = _t([[-1.0, -2.0], [-1.0, -1.0]]), _t([[-2.0, -3.0], [-1.2, -1.0]])
    for adv in ([1.0, -1.0], [0.0, -1.0]):  # row 0 is far off-policy but its advantage is not negative
        _expect(fn(pi, mu, _t(adv), _t([[1, 1], [1, 1]]), threshold=0.5), [1.0, 1.0], [([0.0, 1.0], DROPS_POSITIVE)],
                what=f"the mask with advantages {adv}")


@_case(ex, "the mean over each row's valid tokens, garbage in padding", MASK_SUM)
def _(fn, gen):
    mu, pi = _t([[-1.0, -1.0, 5.0], [-1.0, 3.0, 3.0]]), _t([[-1.3, -1.3, -9.0], [-1.9, -4.0, -4.0]])
    # row 0: (0.3 + 0.3) / 2 = 0.3 -> keep (sum 0.6 -> drop); row 1: 0.9 -> drop (over T = 3: 0.3 -> keep);
    # padding counted: row 0 (0.3 + 0.3 + 14) / 3 -> drop
    _expect(fn(pi, mu, _t([-1.0, -1.0]), _t([[1, 1, 0], [1, 0, 0]]), threshold=0.5), [1.0, 0.0],
            [([0.0, 0.0], MASK_SUM), ([1.0, 1.0], MASK_PAD)], what="the mask")


@_case(ex, "exactly at the threshold, and an empty row", MASK_STRICT)
def _(fn, gen):
    # row 0: (0.25 + 0.75) / 2 = 0.5 exactly (binary fractions): kept; row 1 has no valid token: kept
    got = fn(_t([[-1.25, -1.75], [-9.0, -9.0]]), _t([[-1.0, -1.0], [0.0, 0.0]]), _t([-1.0, -1.0]),
             _t([[1, 1], [0, 0]]), threshold=0.5)
    _expect(got, [1.0, 1.0], [([0.0, 1.0], MASK_STRICT), ([1.0, 0.0], MASK_EMPTY), ([0.0, 0.0], MASK_STRICT)],
            what="the mask")


@_case(ex, "random sequences, advantages and threshold, against the definition", DROPS_POSITIVE)
def _(fn, gen):
    mask = _prefix_mask([7, 3, 0, 5, 1, 6], 7)
    pi = -torch.rand(6, 7, generator=gen) * 3
    mu = pi + 0.6 * torch.randn(6, 7, generator=gen).abs()
    adv = torch.randn(6, generator=gen)
    threshold = 0.2 + 0.3 * float(torch.rand(1, generator=gen))
    _expect(fn(pi, mu, adv, mask, threshold=threshold),
            ref.off_policy_sequence_mask(pi, mu, adv, mask, threshold=threshold), what="the mask")


# ================================================================================================================
# 12 · DPPO: the trust region anchored on the sampler, a divergence on the sampled token (section 6)

ex = _exercise("dppo_mask", "12", "dppo_mask(logprobs, old_logprobs, advantages, *, divergence=\"tv\", delta_low=0.2, "
               "delta_high=0.2) -> (B, T) float mask", "minirl.trust_region.dppo_mask",
               ("minirl.trust_region.dppo_mask",))
RATIO_BOUND = ("this bounds the RATIO p / q (PPO's clip): DPPO bounds a divergence between the two-outcome "
               "distributions, binary TV = p - q, so a rare token (q = 0.02) may move to 0.05, a ratio of 2.5, while "
               "a likely one may not move by more than delta")
BOTH_SIDES = ("only the side the advantage PUSHES is bounded (p up for A > 0, down for A <= 0): a token that moved "
              "against its advantage keeps its gradient, which pulls it back")
SIDES_SWAPPED = "A > 0 pushes p UP: it is bounded by p - q <= delta_high; A <= 0 by p - q >= -delta_low (swapped here)"
ZERO_UP = "A = 0 belongs to the A <= 0 side (p - q >= -delta_low), as verl's dppo masks do: only A > 0 is bounded above"
DELTAS_SWAPPED = "delta_high bounds A > 0 (the rise of p), delta_low bounds A <= 0 (its fall): swapped here"
DELTAS_IGNORED = "delta_low and delta_high were ignored (0.2 used for both)"
KL_FORM = ("the binary KL is KL(mu || pi) of {y_t, not y_t}: q log(q / p) + (1 - q) log((1 - q) / (1 - p)) with q the "
           "SAMPLER's probability; the TV, or the KL the other way round, keep this token")
_LOG = torch.log


@_case(ex, "binary TV, delta 0.2, both signs, by hand", BOTH_SIDES)
def _(fn, gen):
    # (q, p, A): (0.5, 0.8, +1) p - q = 0.3 > 0.2 -> 0; (0.5, 0.8, -1) against the push -> 1; (0.02, 0.05, +1)
    # 0.03 -> 1 (the ratio 2.5); (0.9, 0.6, -1) -0.3 -> 0; (0.5, 0.2, +1) against the push -> 1; (0.5, 0.75, 0) the
    # A <= 0 side: 0.25 >= -0.2 -> 1
    q, p = _t([[0.5, 0.5, 0.02, 0.9, 0.5, 0.5]]), _t([[0.8, 0.8, 0.05, 0.6, 0.2, 0.75]])
    A = _t([[1.0, -1.0, 1.0, -1.0, 1.0, 0.0]])
    _expect(fn(_LOG(p), _LOG(q), A, divergence="tv", delta_low=0.2, delta_high=0.2), [[0.0, 1, 1, 0, 1, 1]],
            [([[0.0, 1, 0, 0, 1, 1]], RATIO_BOUND), ([[0.0, 0, 1, 0, 0, 0]], BOTH_SIDES),
             ([[1.0, 0, 1, 1, 0, 0]], SIDES_SWAPPED), ([[0.0, 1, 1, 0, 1, 0]], ZERO_UP)], what="the mask")


@_case(ex, "delta_low 0.1 and delta_high 0.3", DELTAS_SWAPPED)
def _(fn, gen):
    # (0.5, 0.75, +1): 0.25 <= 0.3 -> 1; (0.5, 0.25, -1): -0.25 < -0.1 -> 0; swapped: 0, 1; both 0.2: 0, 0
    q, p, A = _t([[0.5, 0.5]]), _t([[0.75, 0.25]]), _t([[1.0, -1.0]])
    _expect(fn(_LOG(p), _LOG(q), A, divergence="tv", delta_low=0.1, delta_high=0.3), [[1.0, 0.0]],
            [([[0.0, 1.0]], DELTAS_SWAPPED), ([[0.0, 0.0]], DELTAS_IGNORED)], what="the mask")


@_case(ex, "binary KL, delta 0.1, by hand", KL_FORM)
def _(fn, gen):
    # (0.9, 0.99, +1): KL(mu || pi) = 0.9 ln(0.9 / 0.99) + 0.1 ln(0.1 / 0.01) = -0.085778 + 0.230259 = 0.144480 > 0.1
    # -> 0 (its TV, 0.09, and KL(pi || mu), 0.071335, would keep it); (0.5, 0.2, +1) and (0.5, 0.8, -1): against the
    # push -> 1
    q, p, A = _t([[0.9, 0.5, 0.5]]), _t([[0.99, 0.2, 0.8]]), _t([[1.0, 1.0, -1.0]])
    _expect(fn(_LOG(p), _LOG(q), A, divergence="kl", delta_low=0.1, delta_high=0.1), [[0.0, 1.0, 1.0]],
            [([[1.0, 1.0, 1.0]], KL_FORM)], what="the mask")


@_case(ex, "the defaults: the TV, 0.2 on both sides", DELTAS_IGNORED)
def _(fn, gen):
    q, p, A = _t([[0.5, 0.5, 0.5]]), _t([[0.68, 0.75, 0.32]]), _t([[1.0, 1.0, -1.0]])
    # 0.18 -> 1; 0.25 -> 0; -0.18 -> 1
    _expect(fn(_LOG(p), _LOG(q), A), [[1.0, 0.0, 1.0]], what="the mask")


@_case(ex, "random tokens, both divergences, random deltas, against the definition", RATIO_BOUND)
def _(fn, gen):
    for divergence in ("tv", "kl"):
        q, p = torch.rand(4, 9, generator=gen) * 0.98 + 0.01, torch.rand(4, 9, generator=gen) * 0.98 + 0.01
        A = torch.randn(4, 9, generator=gen).where(torch.rand(4, 9, generator=gen) < 0.8, torch.zeros(()))
        lo, hi = (float(x) for x in torch.rand(2, generator=gen) * 0.4)
        lp = _LOG(p).requires_grad_()
        got = fn(lp, _LOG(q), A, divergence=divergence, delta_low=lo, delta_high=hi)
        _expect(got, ref.dppo_mask(lp, _LOG(q), A, divergence=divergence, delta_low=lo, delta_high=hi),
                what=f"the mask ({divergence})")
