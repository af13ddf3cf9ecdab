"""Exercises of chapter 03: GRPO.

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch

from . import _reference as ref
from ._core import (
    CLAMPED,
    _as_tensor,
    _case,
    _exercise,
    _expect,
    _expect_raises,
    _grad,
    _leaf,
    _loss,
    _Mismatch,
    _prefix_mask,
    _t,
)

# ================================================================================================================
# 03 · GRPO


ex = _exercise("group_advantages", "03",
               "group_advantages(rewards, group_size, *, scale='group', eps=1e-4) -> (B,)  (scales 'group' and 'none')",
               "minirl.advantages.group_advantages", ("minirl.advantages.group_advantages",))
DDOF0 = "population std (ddof=0); GRPO divides by the unbiased sample std (ddof=1), plus eps"
EPS_INSIDE = "eps is inside the square root: GRPO adds it to the std, std + eps, not sqrt(var + eps)"
LAYOUT = ("the groups are laid out group by group: the G samples of a prompt are consecutive rows; these "
          "advantages mix samples of different prompts")
EQUAL_GROUP = ("a group whose rewards are all equal carries no signal and must give exactly 0, never NaN (0/0 at "
               "eps = 0) nor noise from float round-off")
DRGRPO_DIVIDES = "Dr. GRPO (scale='none') removes the std division: only the group mean is subtracted"


@_case(ex, "one group by hand", DDOF0)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0]), 4)  # the defaults: scale 'group', eps 1e-4
    # mean 0.25; unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5; (0.75, -0.25) / 0.5001
    # ddof=0: std sqrt(0.75 / 4) = 0.4330127; (0.75, -0.25) / 0.4331127
    _expect(got, [0.75 / 0.5001] + [-0.25 / 0.5001] * 3, [([0.75 / 0.4331127] + [-0.25 / 0.4331127] * 3, DDOF0)])


@_case(ex, "eps = 0.1 is added to the std", EPS_INSIDE)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0]), 4, scale="group", eps=0.1)
    # std + eps = 0.6: (1.25, -0.416667); sqrt(0.25 + 0.1) = 0.591608: (1.267731, -0.422577)
    s = math.sqrt(0.35)
    _expect(got, [1.25] + [-0.25 / 0.6] * 3, [([0.75 / s] + [-0.25 / s] * 3, EPS_INSIDE)])


@_case(ex, "three groups of two, laid out group by group", LAYOUT)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), 2, scale="group", eps=1e-4)
    # groups (1, 0), (0, 0), (1, 1): the first has mean 0.5, std sqrt(0.5) = 0.707107 -> +-0.5 / 0.707207
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    _expect(got, [a, -a, 0, 0, 0, 0])


@_case(ex, "a group of equal rewards at eps = 0", EQUAL_GROUP)
def _(fn, gen):
    got = fn(_t([1.0, 1.0, 0.0, 1.0]), 2, scale="group", eps=0.0)
    # (1, 1) -> 0, 0; (0, 1) -> -+0.5 / sqrt(0.5) = -+0.707107
    _expect(got, [0, 0, -math.sqrt(0.5), math.sqrt(0.5)])


@_case(ex, "equal rewards that float32 cannot represent exactly", EQUAL_GROUP)
def _(fn, gen):
    got = fn(_t([0.7, 0.7, 0.7, 0.1, 0.1, 0.1]), 3, scale="group", eps=0.0)  # float32 means leave ~1e-8 of round-off
    _expect(got, [0.0] * 6, atol=1e-6)


@_case(ex, "scale='none' (Dr. GRPO), by hand", DRGRPO_DIVIDES)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0]), 4, scale="none", eps=1e-4)
    _expect(got, [0.75, -0.25, -0.25, -0.25], [([0.75 / 0.5001] + [-0.25 / 0.5001] * 3, DRGRPO_DIVIDES)])


@_case(ex, "random groups against the definition", "mean and unbiased std per group, eps added to the std")
def _(fn, gen):
    r = torch.randint(0, 3, (24,), generator=gen).float() / 2
    _expect(fn(r, 6, scale="group", eps=1e-4), ref.group_advantages(r, 6, scale="group", eps=1e-4))
    _expect(fn(r, 6, scale="none", eps=1e-4), ref.group_advantages(r, 6, scale="none"), what="scale='none'")


@_case(ex, "B not a multiple of group_size", "raise ValueError when the batch is not a whole number of groups "
       "(reshaping anyway would mix prompts, or crash with an unclear message)")
def _(fn, gen):
    _expect_raises(lambda: fn(_t([1.0, 0.0, 0.0]), 2, scale="group", eps=1e-4), ValueError, None)


# --------------------------------------------------------------------------------------------------- grpo_loss

ex = _exercise("grpo_loss", "03",
               "grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, *, eps=0.2, beta=0.04) -> loss",
               "minirl.losses.policy_loss + beta * aggregate(kl.kl_in_loss(..., 'k3')), both seq-mean-token-mean",
               ("minirl.losses.policy_loss", "minirl.losses.token_clip_loss", "minirl.aggregation.aggregate",
                "minirl.kl.k3", "minirl.kl.kl_in_loss", "minirl.kl.kl_estimate"))
TOKEN_MEAN_NOT_SEQ = ("this is the per-token mean over the whole batch: DAPO's mode, not GRPO's (GRPO averages "
                      "each sequence's tokens, then the sequences)")
K3_UPSIDE_DOWN = ("k3's ratio is upside down: r = ref / pi = exp(ref_logprobs - logprobs) for tokens sampled from "
                  "the policy")
KL_NO_GRAD = ("the KL term carries no gradient: in GRPO the k3 penalty sits in the LOSS and is differentiated "
              "through logprobs (only ref_logprobs is a constant)")
K1_IN_LOSS = ("this is k1 = log pi - log ref in the loss: its expected gradient is zero; GRPO puts k3 in the loss")
KL_SIGN = "the KL is a penalty: the loss ADDS beta * KL"


def _grpo(fn, lp, old, ref_lp, adv, mask, **settings):
    return _loss(fn(lp, old, ref_lp, adv, mask, **settings))


@_case(ex, "rows of different lengths, on-policy, policy = reference", TOKEN_MEAN_NOT_SEQ)
def _(fn, gen):
    lp = _leaf([[-1.0, -1.0, -1.0, -3.0], [-1.0, -3.0, -3.0, -3.0]])
    mask = _t([[1, 1, 1, 0], [1, 0, 0, 0]])
    loss = _grpo(fn, lp, lp.detach().clone(), lp.detach().clone(), _t([1.0, -1.0]), mask, eps=0.2, beta=0.04)
    # terms -1, -1, -1 | +1; seq-mean-token-mean (-1 + 1) / 2 = 0; token-mean (-3 + 1) / 4 = -0.5
    _expect(loss, 0.0, [(-0.5, TOKEN_MEAN_NOT_SEQ)], what="the loss")
    # row 0: -1 / 3 / 2 = -1/6 per token; row 1: +1 / 2; token-mean would give -1/4 and +1/4
    _expect(_grad(loss, lp), [[-1 / 6, -1 / 6, -1 / 6, 0], [0.5, 0, 0, 0]],
            [([[-0.25, -0.25, -0.25, 0], [0.25, 0, 0, 0]], TOKEN_MEAN_NOT_SEQ),
             # k1 in the loss adds beta / n_i / B per token: -1/6 + 0.04/6 = -0.16 and 0.5 + 0.04/2 = 0.52
             ([[-0.16, -0.16, -0.16, 0], [0.52, 0, 0, 0]], K1_IN_LOSS)], what="the gradient")


@_case(ex, "the KL term alone, by hand", K3_UPSIDE_DOWN)
def _(fn, gen):
    lp = _leaf([[-1.0]])
    loss = _grpo(fn, lp, _t([[-1.0]]), _t([[-2.0]]), _t([0.0]), _t([[1]]), eps=0.2, beta=0.04)
    # log r = ref - lp = -1: k3 = e^-1 - 1 + 1 = 0.367879; times beta: 0.0147152
    # upside down (log r = +1): e - 2 = 0.718282 -> 0.0287313; k1 = lp - ref = 1 -> 0.04; subtracted: -0.0147152
    _expect(loss, 0.04 * math.exp(-1), [(0.04 * (math.e - 2), K3_UPSIDE_DOWN), (0.04, K1_IN_LOSS),
                                        (-0.04 * math.exp(-1), KL_SIGN)], what="the loss")
    # d k3 / d lp = 1 - e^(ref - lp) = 0.632121; times beta: 0.0252848
    _expect(_grad(loss, lp, no_grad_hint=KL_NO_GRAD), [[0.04 * (1 - math.exp(-1))]],
            [([[0.0]], KL_NO_GRAD), ([[0.04]], K1_IN_LOSS)], what="the gradient")


@_case(ex, "random batch with padding against the definition", "the clipped surrogate plus beta * k3, each "
       "aggregated seq-mean-token-mean over the valid tokens")
def _(fn, gen):
    mask = _prefix_mask([5, 2, 4], 5)
    lp = (-torch.rand(3, 5, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    ref_lp = lp.detach() + 0.5 * torch.randn(3, 5, generator=gen)
    adv = torch.randn(3, generator=gen)
    want = ref.grpo_loss(lp, old, ref_lp, adv, mask, eps=0.2, beta=0.04)
    want_g = torch.autograd.grad(want, lp)[0]
    loss = _grpo(fn, lp, old, ref_lp, adv, mask)  # the defaults: eps 0.2, beta 0.04
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, lp), want_g, what="the gradient")


@_case(ex, "random settings (eps 0.1, beta 0.3) against the definition", "eps and beta are settings: use the "
       "values passed, not the defaults")
def _(fn, gen):
    mask = _prefix_mask([3, 4], 4)
    lp = (-torch.rand(2, 4, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.3 * torch.randn(2, 4, generator=gen)
    ref_lp = lp.detach() + 0.5 * torch.randn(2, 4, generator=gen)
    adv = torch.randn(2, generator=gen)
    want = ref.grpo_loss(lp, old, ref_lp, adv, mask, eps=0.1, beta=0.3)
    loss = _grpo(fn, lp, old, ref_lp, adv, mask, eps=0.1, beta=0.3)
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient")


@_case(ex, "a 30-nat log-ratio to the reference", CLAMPED)
def _(fn, gen):
    lp = _leaf([[-31.0, -1.0]])
    loss = _grpo(fn, lp, lp.detach().clone(), _t([[-1.0, -1.0]]), _t([0.0]), _t([[1, 1]]), eps=0.2, beta=0.04)
    # log r = ref - lp = 30 on token 0: d k3 / d lp = 1 - r, hugely negative (tangent above 20 nats: 1 - e^20)
    g = _grad(loss, lp)
    if not (torch.isfinite(_as_tensor(loss, "the loss")).all() and torch.isfinite(g).all()):
        raise _Mismatch(None, "the loss or its gradient is not finite")
    if not g[0, 0] < 0:
        raise _Mismatch(CLAMPED, f"the gradient on the 30-nat token is {float(g[0, 0]):.4g}, expected < 0")


# --------------------------------------------------------------------------------------------- rloo_advantages

ex = _exercise("rloo_advantages", "03", "rloo_advantages(rewards, group_size) -> (B,)  A_i = r_i - mean of the G - 1 "
               "other rewards of its group", "minirl.advantages.rloo_advantages (RLOO)",
               ("minirl.advantages.rloo_advantages", "minirl.advantages.group_advantages"))
LOO_SELF = ("the sample is in its own baseline: that is the group mean (GRPO's baseline, G/(G-1) times smaller); "
            "leave-one-out averages the G - 1 OTHER rewards of the group")
LOO_BY_G = ("the sum of the other rewards was divided by G: there are G - 1 of them, so the baseline is their sum "
            "/ (G - 1)")


@_case(ex, "one group by hand", LOO_SELF)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0]), 4)
    # others' means: 0, 1/3, 1/3, 1/3 -> A = (1, -1/3, -1/3, -1/3); group mean: (0.75, -0.25, ...);
    # others' sum / G: 0, 1/4, 1/4, 1/4 -> (1, -0.25, -0.25, -0.25)
    _expect(got, [1.0, -1 / 3, -1 / 3, -1 / 3], [([0.75, -0.25, -0.25, -0.25], LOO_SELF),
                                                 ([1.0, -0.25, -0.25, -0.25], LOO_BY_G)])


@_case(ex, "two groups of three, laid out group by group", LAYOUT)
def _(fn, gen):
    got = fn(_t([1.0, 0.5, 0.0, 1.0, 1.0, 1.0]), 3)
    # group (1, 0.5, 0): 1 - 0.25 = 0.75, 0.5 - 0.5 = 0, 0 - 0.75 = -0.75; group (1, 1, 1): 0
    # divided by G: (1 - 0.5/3, 0.5 - 1/3, 0 - 1.5/3) = (5/6, 1/6, -1/2) and 1 - 2/3 = 1/3 in the equal group
    _expect(got, [0.75, 0.0, -0.75, 0.0, 0.0, 0.0], [([0.5, 0.0, -0.5, 0.0, 0.0, 0.0], LOO_SELF),
                                                     ([5 / 6, 1 / 6, -0.5, 1 / 3, 1 / 3, 1 / 3], LOO_BY_G)])


@_case(ex, "random groups of four against the definition", LOO_SELF)
def _(fn, gen):
    r = torch.rand(16, generator=gen)
    _expect(fn(r, 4), ref.rloo_advantages(r, 4), [(ref.group_advantages(r, 4, scale="none"), LOO_SELF)])


@_case(ex, "B not a multiple of group_size", "raise ValueError when the batch is not a whole number of groups")
def _(fn, gen):
    _expect_raises(lambda: fn(_t([1.0, 0.0, 0.0]), 2), ValueError, None)
