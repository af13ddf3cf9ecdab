"""Tests of minirl.losses: aggregation modes and the token-level clipped policy loss, by hand."""

import math
from functools import partial

import helpers
import pytest
import torch

from minirl import config, kl
from minirl.losses import aggregate, policy_loss

D = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=D)


close = partial(helpers.close, atol=5e-7, dtype=D)  # the 6 decimals the expectations are written with


# --- aggregate -----------------------------------------------------------------------------------------------------
PER_TOKEN = [[2.0, 2.0, 2.0, 0.0], [10.0, 0.0, 0.0, 0.0]]
MASK = [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_token_mean():
    # (2 + 2 + 2 + 10) / 4 valid tokens = 4.0
    close(aggregate(t(PER_TOKEN), t(MASK), "token-mean"), 4.0)


def test_seq_mean_token_mean():
    # row means: (2+2+2)/3 = 2, 10/1 = 10; mean over sequences (2 + 10) / 2 = 6.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-mean"), 6.0)


def test_seq_mean_token_sum():
    # row sums 6 and 10; mean (6 + 10) / 2 = 8.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum"), 8.0)


def test_seq_mean_token_sum_norm():
    # Dr. GRPO: row sums / max_tokens: 6/4 = 1.5, 10/4 = 2.5; mean (1.5 + 2.5) / 2 = 2.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm", max_tokens=4), 2.0)
    # max_tokens defaults to T = 4
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm"), 2.0)
    # a budget of 8: 6/8 = 0.75, 10/8 = 1.25 -> mean 1.0
    close(aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm", max_tokens=8), 1.0)


def test_masked_values_never_leak():
    # garbage (even inf-free huge numbers) under the mask must not change anything
    dirty = t([[2.0, 2.0, 2.0, 1e6], [10.0, -1e6, 7.0, 3.0]])
    for mode, want in [("token-mean", 4.0), ("seq-mean-token-mean", 6.0), ("seq-mean-token-sum", 8.0)]:
        close(aggregate(dirty, t(MASK), mode), want)


def test_rows_with_no_valid_token_are_left_out_of_sequence_means():
    # a third row [7,7,7,7] with mask all 0: it must not count as a sequence (else 6.0 -> 4.0)
    per_token = t(PER_TOKEN + [[7.0, 7.0, 7.0, 7.0]])
    mask = t(MASK + [[0, 0, 0, 0]])
    close(aggregate(per_token, mask, "token-mean"), 4.0)  # still 16 / 4 tokens
    close(aggregate(per_token, mask, "seq-mean-token-mean"), 6.0)  # (2 + 10) / 2, not / 3
    close(aggregate(per_token, mask, "seq-mean-token-sum"), 8.0)  # (6 + 10) / 2
    close(aggregate(per_token, mask, "seq-mean-token-sum-norm", max_tokens=4), 2.0)  # (1.5 + 2.5) / 2


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_fully_masked_batch_is_zero_with_a_finite_zero_gradient(mode):
    x = t(PER_TOKEN).requires_grad_(True)
    loss = aggregate(x, torch.zeros(2, 4, dtype=D), mode)
    assert loss.item() == 0.0 and not torch.isnan(loss)
    loss.backward()  # the graph is kept, so a trainer can call backward() unconditionally
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_denominator_makes_micro_batches_add_up():
    per_token, mask = t(PER_TOKEN), t(MASK)
    # token-mean: the full batch has 4 tokens; row 0 alone: 6 / 4 = 1.5; row 1 alone: 10 / 4 = 2.5; sum 4.0
    parts = [aggregate(per_token[i:i + 1], mask[i:i + 1], "token-mean", denominator=4) for i in range(2)]
    close(parts, [1.5, 2.5])
    close(sum(parts), 4.0)
    # seq-mean-token-mean: 2 sequences; 2 / 2 = 1.0 and 10 / 2 = 5.0, sum 6.0
    parts = [aggregate(per_token[i:i + 1], mask[i:i + 1], "seq-mean-token-mean", denominator=2) for i in range(2)]
    close(sum(parts), 6.0)
    # without the shared denominator, the mean of the micro-batch means is wrong for token-mean: (6/3 + 10/1)/2 = 6
    naive = [aggregate(per_token[i:i + 1], mask[i:i + 1], "token-mean") for i in range(2)]
    close(sum(naive) / 2, 6.0)


def test_aggregate_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="aggregation mode 'mean'"):
        aggregate(t(PER_TOKEN), t(MASK), "mean")
    with pytest.raises(ValueError, match=r"per_token has shape \(2, 4\) but mask has shape \(2, 3\)"):
        aggregate(t(PER_TOKEN), torch.ones(2, 3, dtype=D), "token-mean")
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(t(PER_TOKEN), t(MASK), "seq-mean-token-sum-norm", max_tokens=0)
    with pytest.raises(ValueError, match="denominator"):
        aggregate(t(PER_TOKEN), t(MASK), "token-mean", denominator=0)
    with pytest.raises(ValueError, match="per_token"):
        aggregate(torch.ones(4, dtype=D), torch.ones(4, dtype=D), "token-mean")


# --- policy_loss at token level: one token, by hand ------------------------------------------------------------------
def one_token(logprob, old_logprob, advantage, **kw):
    """Loss and d loss / d logprob for a single token; also returns old_logprobs to check it got no gradient."""
    lp = t([[logprob]]).requires_grad_(True)
    old = t([[old_logprob]]).requires_grad_(True)
    loss, stats = policy_loss(lp, old, t([advantage]), t([[1.0]]), **kw)
    loss.backward()
    return loss.item(), lp.grad.item(), old, stats


def test_on_policy_loss_and_gradient():
    # ratio = exp(-1 - (-1)) = 1; loss = -A * ratio = -1; d(-A * exp(lp - old)) / d lp = -A * ratio = -1
    loss, grad, old, stats = one_token(-1.0, -1.0, 1.0)
    close(loss, -1.0)
    close(grad, -1.0)
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
    close(stats["approx_kl"], 0.0)


def test_old_logprobs_are_detached():
    # the behaviour log-probs are constants of the objective: no gradient may flow into them
    _, _, old, _ = one_token(-1.0, -1.0, 1.0)
    assert old.grad is None
    _, _, old, _ = one_token(-0.8, -1.0, 1.0, eps_high=0.28)
    assert old.grad is None


def test_after_an_update_the_clip_zeroes_the_gradient():
    # ratio = exp(-0.8 + 1) = e^0.2 = 1.221403 > 1 + 0.2: the clipped branch -A * 1.2 = -1.2 is the larger of
    # (-1.221403, -1.2), so the loss is -1.2, a constant: gradient 0
    loss, grad, _, stats = one_token(-0.8, -1.0, 1.0, eps_low=0.2, eps_high=0.2)
    close(loss, -1.2)
    close(grad, 0.0)
    assert stats["clip_frac_high"] == 1.0 and stats["clip_frac_low"] == 0.0
    close(stats["ratio_mean"], math.exp(0.2))


def test_clip_higher_keeps_the_gradient():
    # DAPO's eps_high = 0.28: 1.221403 < 1.28, unclipped: loss -1.221403, gradient -A * ratio = -1.221403
    loss, grad, _, stats = one_token(-0.8, -1.0, 1.0, eps_low=0.2, eps_high=0.28)
    close(loss, -1.221403)
    close(grad, -1.221403)
    assert stats["clip_frac"] == 0.0


def test_positive_advantage_below_the_range_is_not_clipped():
    # ratio e^-0.3 = 0.740818 < 0.8 but A > 0: max(-0.740818, -0.8) = -0.740818 (pessimistic: keep the gradient
    # that pushes the probability back up); gradient -0.740818
    loss, grad, _, stats = one_token(-1.3, -1.0, 1.0)
    close(loss, -0.740818)
    close(grad, -0.740818)
    assert stats["clip_frac"] == 0.0


def test_negative_advantage_clipped_low():
    # A = -1, ratio e^-0.3 = 0.740818 < 1 - 0.2: max(0.740818, 0.8) = 0.8, constant -> gradient 0
    loss, grad, _, stats = one_token(-1.3, -1.0, -1.0)
    close(loss, 0.8)
    close(grad, 0.0)
    assert stats["clip_frac_low"] == 1.0 and stats["clip_frac_high"] == 0.0


def test_negative_advantage_above_the_range_is_not_clipped():
    # A = -1, ratio e^0.2 = 1.221403 > 1.2: max(1.221403, 1.2) = 1.221403, gradient -A * ratio = +1.221403
    loss, grad, _, stats = one_token(-0.8, -1.0, -1.0)
    close(loss, 1.221403)
    close(grad, 1.221403)
    assert stats["clip_frac"] == 0.0


def test_dual_clip():
    # A = -1, ratio e^1.5 = 4.481689: PPO's max(4.481689, 1.2) = 4.481689; dual clip c = 3 caps it at
    # c * |A| = 3, a constant -> gradient 0
    loss, grad, _, _ = one_token(0.5, -1.0, -1.0, dual_clip=3.0)
    close(loss, 3.0)
    close(grad, 0.0)
    loss, grad, _, _ = one_token(0.5, -1.0, -1.0)  # without the dual clip
    close(loss, 4.481689)
    close(grad, 4.481689)
    # below the cap it changes nothing: ratio e^0.5 = 1.648721 < 3 -> loss 1.648721, gradient 1.648721
    loss, grad, _, _ = one_token(-0.5, -1.0, -1.0, dual_clip=3.0)
    close(loss, 1.648721)
    close(grad, 1.648721)
    # A > 0 is untouched: ratio e^1.5 is clipped at 1.2 as usual -> -1.2, gradient 0
    loss, grad, _, _ = one_token(0.5, -1.0, 1.0, dual_clip=3.0)
    close(loss, -1.2)
    close(grad, 0.0)


def test_dual_clip_must_exceed_one():
    # log r 0.5, A -1: PPO's loss max(-A r, -A clip(r, 0.8, 1.2)) = max(e^0.5, 1.2) = 1.648721. Dual clip caps it
    # at c |A|: with c = 0.5 the "cap" 0.5 is BELOW the plain PPO loss (and c = 1 caps at |A| = 1 < 1.648721), so
    # c <= 1 is refused at every level; c = 1.5 caps at 1.5, c = 3 leaves 1.648721.
    for c in (0.5, 1.0, 0.0, -2.0):
        for level in ("token", "sequence", "sequence-token"):
            with pytest.raises(ValueError, match=rf"dual_clip must be > 1.*got {c}"):
                one_token(0.5 - 1.0, -1.0, -1.0, dual_clip=c, level=level, agg="seq-mean-token-mean")
    close(one_token(-0.5, -1.0, -1.0)[0], math.exp(0.5))  # 1.648721
    close(one_token(-0.5, -1.0, -1.0, dual_clip=1.5)[0], 1.5)
    close(one_token(-0.5, -1.0, -1.0, dual_clip=3.0)[0], 1.648721)
    with pytest.raises(ValueError, match="dual_clip"):
        config.RLConfig(dual_clip=1.0).validate()
    config.RLConfig(dual_clip=3.0).validate()
    config.RLConfig(dual_clip=None).validate()


def test_extreme_log_ratio_stays_finite():
    # a log-ratio of 80 nats would overflow exp in float32; the clamp keeps loss and gradient finite
    lp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-80.0, -1.0]])
    loss, stats = policy_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert math.isfinite(stats["ratio_max"]) and math.isfinite(stats["approx_kl"])


def exact_and_ours(d, advantage, dual_clip, eps=0.2):
    """By hand, float64: the exact PPO loss gradient d/dlogprob at log-ratio d, and minirl's (value, gradient).

    One token, per-token loss max(-A r, -A clip(r, 1 - eps, 1 + eps)), capped at c |A| for A < 0 with a dual clip.
    minirl's r is e^d up to 20 nats and e^20 (1 + d - 20) above (the tangent), so r' = e^20 there.
    """
    r_exact, r, r_slope = math.exp(d), math.exp(d), math.exp(d)
    if d > 20:
        r, r_slope = math.exp(20) * (1 + d - 20), math.exp(20)

    def branch(ratio):  # which branch is active, and the loss value
        unclipped, clipped = -advantage * ratio, -advantage * min(max(ratio, 1 - eps), 1 + eps)
        loss, active = (unclipped, "unclipped") if unclipped >= clipped else (clipped, "clipped")
        if dual_clip is not None and advantage < 0 and -advantage * dual_clip < loss:
            loss, active = -advantage * dual_clip, "dual"
        return loss, active

    _, active_exact = branch(r_exact)
    loss, active = branch(r)
    assert active == active_exact  # the continuation never changes which branch is active
    exact_grad = -advantage * r_exact if active == "unclipped" else 0.0
    grad = -advantage * r_slope if active == "unclipped" else 0.0
    return loss, grad, exact_grad


@pytest.mark.parametrize("level", ["token", "sequence", "sequence-token"])
@pytest.mark.parametrize("d", [25.0, 50.0, 100.0, -25.0, -50.0, -100.0])
@pytest.mark.parametrize("advantage", [1.0, -1.0])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_policy_gradient_past_the_ratio_cap_keeps_the_exact_sign(level, d, advantage, dual_clip):
    # log-ratio d = logprob - old_logprob. Where each branch is active (eps 0.2):
    #   d > 0, A = +1: r > 1.2, clipped: loss -1.2, gradient 0 (exact 0).
    #   d > 0, A = -1: unclipped, loss -A r = r: d = 25 -> e^20 * 6 = 2.910991e9, gradient e^20 = 4.851652e8 > 0
    #     (exact e^25 = 7.200490e10 > 0; a clamp at 20 nats used to give 0). With dual clip 3: loss 3, gradient 0.
    #   d < 0, A = +1: r < 0.8, unclipped: loss -r = -e^d, gradient -e^d < 0, exact (no clamp below: e^-100 =
    #     3.720076e-44 in float64; a clamp at -20 used to give -e^-20 and gradient 0).
    #   d < 0, A = -1: r < 0.8, clipped at 0.8: loss 0.8, gradient 0 (exact 0).
    # With one token per sequence the sequence levels have the same ratio, hence the same numbers.
    expected_loss, expected_grad, exact_grad = exact_and_ours(d, advantage, dual_clip)
    agg = "token-mean" if level == "token" else "seq-mean-token-mean"
    loss, grad, _, stats = one_token(d - 1.0, -1.0, advantage, dual_clip=dual_clip, level=level, agg=agg)
    assert math.isfinite(loss) and math.isfinite(grad)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    assert grad == pytest.approx(expected_grad, rel=1e-12, abs=0)
    assert (grad > 0) == (exact_grad > 0) and (grad < 0) == (exact_grad < 0) and (grad == 0) == (exact_grad == 0)
    assert all(math.isfinite(v) for v in stats.values())
    if (d, advantage, dual_clip) == (25.0, -1.0, None):
        assert (loss, grad, exact_grad) == pytest.approx((2.910991172e9, 4.851651954e8, 7.200489934e10), rel=1e-9)


def test_approx_kl_past_the_cap_is_finite_and_still_increasing():
    # k3 of KL(pi_old || pi) per token: r - 1 - log r with log r = d; past 20 nats r = e^20 (1 + d - 20):
    # d = 25: 6 e^20 - 26 = 2.910991146e9; d = 50: 31 e^20 - 51 = 1.504012101e10 (a clamped r would give
    # e^20 - 1 - d, DEcreasing in d); d = -25: e^-25 - 1 + 25 = 24 (exact)
    kls = [one_token(d - 1.0, -1.0, 1.0)[3]["approx_kl"] for d in (25.0, 50.0, -25.0)]
    assert kls == pytest.approx([6 * math.exp(20) - 26, 31 * math.exp(20) - 51, 24 + math.exp(-25)], rel=1e-12)


def test_token_mean_vs_seq_mean_on_two_rows():
    # on-policy, A = +1: per-token loss -1 on every valid token.
    # grads: token-mean: -1 / 4 tokens = -0.25 on each valid token.
    # seq-mean-token-mean: row 0 has 3 tokens: -1 / 3 / 2 = -0.166667; row 1 has 1 token: -1 / 1 / 2 = -0.5
    mask = t(MASK)
    for agg, g0, g1 in [("token-mean", -0.25, -0.25), ("seq-mean-token-mean", -1 / 6, -0.5)]:
        lp = torch.full((2, 4), -1.0, dtype=D, requires_grad=True)
        loss, _ = policy_loss(lp, lp.detach().clone(), t([1.0, 1.0]), mask, agg=agg)
        loss.backward()
        close(loss, -1.0)
        close(lp.grad, [[g0, g0, g0, 0.0], [g1, 0.0, 0.0, 0.0]])


def test_per_token_advantages():
    # advantages may be (B, T): on-policy the per-token loss is -A_t, token-mean over the 4 valid tokens:
    # -(1 + 2 + 3 + 4) / 4 = -2.5
    lp = torch.full((2, 4), -1.0, dtype=D)
    a = t([[1.0, 2.0, 3.0, 99.0], [4.0, 99.0, 99.0, 99.0]])
    loss, _ = policy_loss(lp, lp, a, t(MASK))
    close(loss, -2.5)


def test_fully_masked_policy_loss_is_zero():
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    loss, stats = policy_loss(lp, lp.detach() - 5, torch.ones(2), torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(2, 3))
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


# --- bad input -----------------------------------------------------------------------------------------------------
def test_policy_loss_shape_mismatch_names_the_arguments():
    a, b = torch.zeros(2, 3), torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"old_logprobs has shape \(2, 4\)"):
        policy_loss(a, b, torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        policy_loss(a, a, torch.zeros(2), torch.ones(3, 2))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(a, a, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(a, a, torch.zeros(2, 3), torch.ones(2, 3), level="sequence")
    with pytest.raises(ValueError, match="aggregation mode"):
        policy_loss(a, a, torch.zeros(2), torch.ones(2, 3), agg="sum")
    with pytest.raises(ValueError, match="level"):
        policy_loss(a, a, torch.zeros(2), torch.ones(2, 3), level="tokens")
    with pytest.raises(ValueError, match="eps_low"):
        policy_loss(a, a, torch.zeros(2), torch.ones(2, 3), eps_low=1.5)


@pytest.mark.parametrize("estimator", [kl.k1, kl.k2, kl.k3])
def test_kl_estimators_refuse_mismatched_shapes(estimator):
    with pytest.raises(ValueError, match="ref_logprobs"):
        estimator(torch.zeros(2, 3), torch.zeros(3, 2))


# --- defects of issue 35 and the copy a reader takes -----------------------------------------------------------------
def test_sapo_temperatures_keep_the_inputs_float64():
    """r = e^-0.5, A = -1, tau_neg 1.05: loss = (4 / 1.05) sigmoid(1.05 (e^-0.5 - 1)) in float64. A torch.where of
    two Python floats built float32 temperatures and gave 1.5167954188682087 (issue 35, defect 3)."""
    from minirl.losses import sapo_loss

    expected = (4 / 1.05) / (1 + math.exp(-1.05 * (math.exp(-0.5) - 1)))  # = 1.5167953328585435
    lp = torch.tensor([[-0.5]], dtype=torch.float64, requires_grad=True)
    loss, _ = sapo_loss(lp, torch.zeros(1, 1, dtype=torch.float64), torch.tensor([[-1.0]], dtype=torch.float64),
                        torch.ones(1, 1, dtype=torch.float64))
    assert loss.dtype == torch.float64 and loss.item() == expected


_COPY_SETTINGS = {"token_clip_loss": dict(level="token", agg="seq-mean-token-mean", dual_clip=3.0),
                  "gspo_loss": dict(level="sequence", agg="seq-mean-token-mean", eps_low=3e-4, eps_high=4e-4),
                  "gspo_token_loss": dict(level="sequence-token", agg="token-mean", eps_low=3e-4, eps_high=4e-4),
                  "cispo_loss": dict(loss_mode="cispo", agg="token-mean", cispo_form="one-sided", eps_high=4.0),
                  "sapo_loss": dict(loss_mode="sapo", agg="seq-mean-token-mean"),
                  "gmpo_loss": dict(loss_mode="gmpo", agg="seq-mean-token-mean", eps_low=0.4, eps_high=0.4)}


@pytest.mark.parametrize("family", list(_COPY_SETTINGS))
def test_each_loss_family_runs_alone_with_the_helpers_its_docstring_names(family):
    """What the module docstring promises a reader who copies one loss into a torch-only file: the function, the
    helpers its "Copy with" line names, and checks.py's guards are all it needs, and the copy gives policy_loss's
    value and gradient bit for bit."""
    import inspect
    import re

    from minirl import checks, losses

    fn = getattr(losses, family)
    helpers_line = re.search(r"Copy with: (.+?)\.\n", fn.__doc__).group(1)
    names = [family, *(n.strip() for n in helpers_line.split(","))]
    namespace = {"torch": torch, "Tensor": torch.Tensor, **{n: getattr(checks, n) for n in (
        "zero_outside", "exp_linear_above", "LOG_RATIO_LINEAR_ABOVE", "same_shape", "ndim", "choice")}}
    source = "\n\n".join(inspect.getsource(getattr(losses, n)) if callable(getattr(losses, n))
                         else f"{n} = {getattr(losses, n)!r}" for n in reversed(names))
    exec(compile("from __future__ import annotations\n" + source, f"copy of {family}", "exec"), namespace)
    g = torch.Generator().manual_seed(0)
    B, T = 4, 5
    logprobs = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 2).requires_grad_()
    old = logprobs.detach() + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0], dtype=torch.float64)
    settings = _COPY_SETTINGS[family]
    want, _ = policy_loss(logprobs, old, adv, mask, **settings)
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in {"eps_low": 0.2, "eps_high": 0.2, **settings}.items() if k in params}
    if "form" in params:
        kwargs["form"] = settings["cispo_form"]
    per_seq = family in ("gspo_loss", "gmpo_loss")
    a = adv if per_seq else adv.unsqueeze(1).expand(B, T)
    lp, old0 = torch.where(mask > 0, logprobs, 0.0), torch.where(mask > 0, old, 0.0)  # what policy_loss hands on
    got, _ = namespace[family](lp, old0, a, mask, **kwargs)
    assert got.item() == want.item()
    (g_want,), (g_got,) = torch.autograd.grad(want, logprobs), torch.autograd.grad(got, logprobs)
    assert torch.equal(g_want, g_got)
