"""The sampler/trainer importance corrections (minirl.importance): hand values, exact gradients on small
categoricals (the corrected surrogate against the true on-policy gradient), edge cases, TRL 1.16's own code path
(its weights and its loss against minirl's). The weights inside each loss are tested in test_losses.py, their
settings in test_config.py and their TRL / verl mappings in test_interop.py.

Notation: r = pi_old / mu per token, mu the sampler, pi_old the trainer's recomputed policy; log-ratios in nats.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

from minirl import importance, interop, losses, models, rollout
from minirl.config import make_config

F64 = dict(dtype=torch.float64)


def lp(*rows):
    """(B, T) float64 tensor from lists."""
    return torch.tensor(rows, **F64)


# ------------------------------------------------------------------------------------------------ hand values
# paper-index: importance.token_tis_weights
def test_token_tis_weights_by_hand():
    old, sampler, mask = lp([0.0, 0.5, 1.5, -50.0]), torch.zeros(1, 4, **F64), torch.ones(1, 4, **F64)
    w = importance.token_tis_weights(old, sampler, mask, cap=2.0)
    # log-ratios [0, 0.5, 1.5, -50]: [e^0, e^0.5, min(e^1.5 = 4.48, 2), e^-50]
    torch.testing.assert_close(w, lp([1.0, math.exp(0.5), 2.0, math.exp(-50)]), rtol=1e-12, atol=0)
    assert w[0, 2] == 2.0  # the cap itself, not exp(log 2)
    w = importance.token_tis_weights(old, sampler, mask, cap=2.0, cap_low=0.5)  # two-sided, TRL's clip_min
    torch.testing.assert_close(w, lp([1.0, 1.6487212707001282, 2.0, 0.5]), rtol=1e-12, atol=0)
    # a padded position (log-prob -inf there) has weight 0
    w = importance.token_tis_weights(lp([-1.0, -math.inf]), lp([-1.2, -math.inf]), lp([1.0, 0.0]))
    torch.testing.assert_close(w, lp([math.exp(0.2), 0.0]))


# paper-index: importance.token_mis_weights
def test_token_mis_weights_by_hand():
    old, sampler, mask = lp([0.0, 0.5, 1.5, -3.0]), torch.zeros(1, 4, **F64), torch.ones(1, 4, **F64)
    w = importance.token_mis_weights(old, sampler, mask, cap=2.0, cap_low=0.5)
    # [1, e^0.5 = 1.648721, 0 (e^1.5 = 4.48 > 2), 0 (e^-3 = 0.0498 < 0.5)]
    torch.testing.assert_close(w, lp([1.0, 1.6487212707001282, 0.0, 0.0]), rtol=1e-12, atol=0)
    w = importance.token_mis_weights(old, sampler, mask, cap=2.0)  # no lower bound (TRL's default)
    torch.testing.assert_close(w, lp([1.0, 1.6487212707001282, 0.0, 0.049787068367863944]), rtol=1e-12, atol=0)


# paper-index: importance.sequence_log_ratio
def test_sequence_log_ratio_product_and_geometric_mean_by_hand():
    old = lp([0.1, -0.3, 0.5], [0.2, 7.0, 7.0], [9.0, 9.0, 9.0])
    mask = lp([1, 1, 1], [1, 0, 0], [0, 0, 0])
    sampler = torch.zeros_like(old)
    # row 0: 0.1 - 0.3 + 0.5 = 0.3, mean 0.3 / 3 = 0.1; row 1: one valid token 0.2; row 2: no valid token -> 0
    torch.testing.assert_close(importance.sequence_log_ratio(old, sampler, mask, form="product"),
                               torch.tensor([0.3, 0.2, 0.0], **F64))
    torch.testing.assert_close(importance.sequence_log_ratio(old, sampler, mask, form="geomean"),
                               torch.tensor([0.1, 0.2, 0.0], **F64))


# paper-index: importance.seq_tis_weights
def test_seq_tis_weights_by_hand():
    old = lp([0.1, -0.3, 0.5], [0.5, 0.5, 0.5], [-0.5, -0.5, -0.5])
    sampler, mask = torch.zeros_like(old), torch.ones_like(old)
    w = importance.seq_tis_weights(old, sampler, mask, cap=2.0)
    # product: min(e^0.3, 2) = 1.349859, min(e^1.5 = 4.48, 2) = 2, e^-1.5 = 0.223130
    torch.testing.assert_close(w, torch.tensor([math.exp(0.3), 2.0, math.exp(-1.5)], **F64), rtol=1e-12, atol=0)
    w = importance.seq_tis_weights(old, sampler, mask, cap=2.0, cap_low=0.5, form="geomean")
    # geomean: e^0.1 = 1.105171, e^0.5 = 1.648721, e^-0.5 = 0.606531 (all inside [0.5, 2])
    torch.testing.assert_close(w, torch.tensor([math.exp(0.1), math.exp(0.5), math.exp(-0.5)], **F64))
    w = importance.seq_tis_weights(old, sampler, mask, cap=2.0, cap_low=0.5)  # product, raised to 0.5
    assert w[2] == 0.5


# paper-index: importance.seq_mis_weights
def test_seq_mis_weights_by_hand():
    old = lp([0.1, -0.3, 0.5], [0.5, 0.5, 0.5], [-0.5, -0.5, -0.5])
    sampler, mask = torch.zeros_like(old), torch.ones_like(old)
    # product: e^0.3 = 1.349859 kept, e^1.5 = 4.48 > 2 dropped, e^-1.5 = 0.2231 < 0.5 dropped
    torch.testing.assert_close(importance.seq_mis_weights(old, sampler, mask, cap=2.0, cap_low=0.5),
                               torch.tensor([math.exp(0.3), 0.0, 0.0], **F64))
    # geomean: e^0.1, e^0.5 = 1.648721 and e^-0.5 = 0.606531 are all inside [0.5, 2]
    torch.testing.assert_close(importance.seq_mis_weights(old, sampler, mask, cap=2.0, cap_low=0.5, form="geomean"),
                               torch.tensor([math.exp(0.1), math.exp(0.5), math.exp(-0.5)], **F64))


# paper-index: importance.is_weights
def test_is_weights_dispatches_by_name():
    old, sampler = lp([0.3, -0.2, 0.9], [0.1, 2.0, 0.0]), lp([0.0, 0.0, 0.0], [0.0, 0.0, 5.0])
    mask = lp([1, 1, 1], [1, 1, 0])
    kw = dict(cap=1.5, cap_low=0.9)
    assert torch.equal(importance.is_weights(old, sampler, mask, correction="none"), mask)
    assert torch.equal(importance.is_weights(old, sampler, mask, correction="token_tis", **kw),
                       importance.token_tis_weights(old, sampler, mask, **kw))
    assert torch.equal(importance.is_weights(old, sampler, mask, correction="token_mis", **kw),
                       importance.token_mis_weights(old, sampler, mask, **kw))
    assert torch.equal(importance.is_weights(old, sampler, mask, correction="seq_tis", form="geomean", **kw),
                       importance.seq_tis_weights(old, sampler, mask, form="geomean", **kw))
    assert torch.equal(importance.is_weights(old, sampler, mask, correction="seq_mis", **kw),
                       importance.seq_mis_weights(old, sampler, mask, **kw))
    with pytest.raises(ValueError, match="correction"):
        importance.is_weights(old, sampler, mask, correction="tis")


# paper-index: importance.choose_old_logprobs
def test_choose_old_logprobs_naive_or_recomputed():
    old, sampler = lp([-1.0]), lp([-1.3])
    assert torch.equal(importance.choose_old_logprobs(old, sampler), old)  # recomputed: ratio 1 before the update
    assert torch.equal(importance.choose_old_logprobs(old, sampler, pi_old="naive"), sampler)
    assert torch.equal(importance.choose_old_logprobs(None, sampler, pi_old="naive"), sampler)
    # naive: before any update the ratio is pi / mu = e^(-1.0 + 1.3) = e^0.3 = 1.3499, outside PPO's 1 + 0.2
    logprobs = old.clone().requires_grad_(True)
    loss, stats = losses.policy_loss(logprobs, importance.choose_old_logprobs(old, sampler, pi_old="naive"),
                                     torch.tensor([1.0], **F64), torch.ones(1, 1, **F64))
    loss.backward()
    assert stats["ratio_max"] == pytest.approx(math.exp(0.3)) and stats["clip_frac_high"] == 1.0
    assert logprobs.grad.abs().max() == 0  # the mismatch alone removed this token's gradient
    with pytest.raises(ValueError, match="needs old_logprobs"):
        importance.choose_old_logprobs(None, sampler)
    with pytest.raises(ValueError, match="pi_old"):
        importance.choose_old_logprobs(old, sampler, pi_old="sampler")
    with pytest.raises(ValueError, match="shape"):
        importance.choose_old_logprobs(lp([-1.0, -2.0]), sampler)


# paper-index: importance.apply_weights
def test_apply_weights_by_hand():
    per_token = lp([1.0, 2.0], [3.0, math.inf]).requires_grad_(True)  # padding may hold anything
    mask = lp([1, 1], [1, 0])
    out = importance.apply_weights(per_token, lp([2.0, 0.5], [0.0, 9.0]), mask)
    torch.testing.assert_close(out, lp([2.0, 1.0], [0.0, 0.0]))  # [1*2, 2*0.5], [3*0, padding 0]
    out.sum().backward()
    torch.testing.assert_close(per_token.grad, lp([2.0, 0.5], [0.0, 0.0]))  # the weights, detached
    out = importance.apply_weights(per_token, torch.tensor([2.0, 0.5], **F64), mask)  # sequence weights
    torch.testing.assert_close(out, lp([2.0, 4.0], [1.5, 0.0]))
    assert torch.isfinite(importance.apply_weights(per_token, lp([1.0, 1.0], [1.0, math.nan]), mask)).all()
    with pytest.raises(ValueError, match="weights must be finite and >= 0"):
        importance.apply_weights(per_token, lp([1.0, -1.0], [1.0, 1.0]), mask)
    with pytest.raises(ValueError, match="weights must be finite"):
        importance.apply_weights(per_token, lp([1.0, math.nan], [1.0, 1.0]), mask)
    with pytest.raises(ValueError, match="weights must have shape"):
        importance.apply_weights(per_token, torch.ones(3, **F64), mask)


# paper-index: importance.mismatch_metrics
def test_mismatch_metrics_by_hand():
    old, sampler, mask = lp([-1.0, -1.0], [-2.0, 0.0]), lp([-1.0, -1.5], [-2.0, 0.0]), lp([1, 1], [1, 0])
    m = importance.mismatch_metrics(old, sampler, mask, correction="token_tis", cap=1.5)
    # valid log r = [0, 0.5, 0] (3 tokens): k1 = -(0 + 0.5 + 0) / 3, k2 = 0.125 / 3, k3 = (e^0.5 - 1.5) / 3
    assert m["k1"] == pytest.approx(-0.5 / 3) and m["k2"] == pytest.approx(0.125 / 3)
    assert m["k3"] == pytest.approx((math.exp(0.5) - 1.5) / 3)
    assert (m["logp_diff_mean"], m["logp_diff_max"]) == (pytest.approx(0.5 / 3), 0.5)
    assert (m["ratio_min"], m["ratio_max"]) == (1.0, pytest.approx(math.exp(0.5)))
    # e^0.5 = 1.65 > 1.5: 1 of 3 tokens truncated, in 1 of 2 sequences; weights [1, 1.5, 1] -> mean 3.5 / 3
    assert (m["tokens_truncated"], m["seqs_truncated"], m["tokens_masked"]) == (pytest.approx(1 / 3), 0.5, 0.0)
    assert m["weight_mean"] == pytest.approx(3.5 / 3)
    m = importance.mismatch_metrics(old, sampler, mask, correction="seq_mis", cap=1.5)
    # sequence 0's product e^0.5 > 1.5: both its tokens (2 of 3) and 1 of 2 sequences masked
    assert (m["tokens_masked"], m["seqs_masked"], m["tokens_truncated"]) == (pytest.approx(2 / 3), 0.5, 0.0)
    assert m["seq_ratio_max"] == pytest.approx(math.exp(0.5))
    none = importance.mismatch_metrics(old, sampler, mask)
    assert (none["tokens_truncated"], none["tokens_masked"], none["weight_mean"]) == (0.0, 0.0, 1.0)


# ------------------------------------------------------------------------------------------------ edge cases
CORRECTIONS = [(c, f) for c in importance.CORRECTIONS for f in importance.SEQ_FORMS]


@pytest.mark.parametrize("correction, form", CORRECTIONS)
def test_equal_logprobs_give_weights_of_exactly_one(correction, form):
    old = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) - 2.0  # float32, as a model's
    mask = torch.ones(4, 6)
    mask[1, 3:] = 0
    w = importance.is_weights(old, old.clone(), mask, correction=correction, cap=2.0, cap_low=0.5, form=form)
    w = w.unsqueeze(1).expand_as(mask) if w.dim() == 1 else w
    assert torch.equal(w[mask > 0], torch.ones(int(mask.sum())))


@pytest.mark.parametrize("correction, form", CORRECTIONS)
def test_fully_masked_rows_and_an_empty_batch(correction, form):
    old, sampler = lp([0.3, 0.9], [0.2, -0.4]), lp([0.0, 0.0], [0.0, 0.0])
    mask = lp([1, 1], [0, 0])
    w = importance.is_weights(old, sampler, mask, correction=correction, form=form)
    if w.dim() == 1:
        assert w[1] == 1.0  # a sequence weight of a row without tokens is neutral, never NaN
    else:
        assert torch.equal(w[1], torch.zeros(2, **F64))
    empty = importance.mismatch_metrics(old, sampler, torch.zeros_like(mask), correction=correction, form=form)
    assert all(math.isfinite(v) for v in empty.values())
    assert (empty["k3"], empty["ratio_max"], empty["tokens_masked"], empty["seqs_masked"]) == (0.0, 1.0, 0.0, 0.0)
    logprobs = old.clone().requires_grad_(True)  # a masked row through the weighted loss: finite, no gradient
    loss, _ = losses.policy_loss(logprobs, old, torch.tensor([1.0, -1.0], **F64), mask, is_weights=w)
    loss.backward()
    assert torch.isfinite(loss) and torch.equal(logprobs.grad[1], torch.zeros(2, **F64))


@pytest.mark.parametrize("correction", importance.CORRECTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_never_overflow(correction, dtype):
    # +-50 and +-1000 nats per token (exp(1000) is inf even in float64), and 40 tokens of +50: a sum of 2000
    old = torch.tensor([[50.0, -50.0, 1000.0, -1000.0], [50.0] * 4], dtype=dtype)
    sampler, mask = torch.zeros_like(old), torch.ones_like(old)
    for form in importance.SEQ_FORMS:
        w = importance.is_weights(old, sampler, mask, correction=correction, cap=3.0, cap_low=0.5, form=form)
        assert torch.isfinite(w).all() and (w >= 0).all() and (w <= 3.0).all()
        m = importance.mismatch_metrics(old, sampler, mask, correction=correction, cap=3.0, form=form)
        assert all(math.isfinite(v) for v in m.values()), m
    if correction == "token_tis":  # truncated at C above, raised to C_min below
        assert importance.is_weights(old, sampler, mask, correction=correction, cap=3.0, cap_low=0.5)[0].tolist() \
            == [3.0, 0.5, 3.0, 0.5]
    if correction == "token_mis":  # all outside [0.5, 3]; without C_min e^-50 is kept (and e^-1000 underflows to 0)
        assert importance.is_weights(old, sampler, mask, correction=correction, cap=3.0, cap_low=0.5).sum() == 0
        w = importance.is_weights(old, sampler, mask, correction=correction, cap=3.0)
        assert w[0].tolist() == [0.0, pytest.approx(math.exp(-50)), 0.0, 0.0]
    long = torch.full((1, 40), 50.0, dtype=dtype)
    assert importance.seq_tis_weights(long, torch.zeros_like(long), torch.ones_like(long), cap=3.0) == 3.0
    assert importance.seq_mis_weights(-long, torch.zeros_like(long), torch.ones_like(long), cap=3.0) == \
        torch.exp(torch.tensor(-2000.0, dtype=dtype))  # underflows to 0, harmlessly


@pytest.mark.parametrize("name", ["old_logprobs", "sampler_logprobs"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_logprobs_on_a_valid_token_raise_naming_the_argument(name, bad):
    good = lp([-1.0, -2.0], [-0.5, -0.1])
    mask = lp([1, 1], [1, 0])
    args = {"old_logprobs": good.clone(), "sampler_logprobs": good.clone()}
    args[name][0, 1] = bad
    for fn in (importance.token_tis_weights, importance.token_mis_weights, importance.seq_tis_weights,
               importance.seq_mis_weights, importance.sequence_log_ratio, importance.is_weights,
               importance.mismatch_metrics):
        with pytest.raises(ValueError, match=name):
            fn(args["old_logprobs"], args["sampler_logprobs"], mask)
    args[name][0, 1] = -1.0
    args[name][1, 1] = bad  # in the padding: never read
    assert torch.isfinite(importance.token_tis_weights(args["old_logprobs"], args["sampler_logprobs"], mask)).all()


def test_bad_shapes_and_bounds_raise():
    a, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="sampler_logprobs has shape"):
        importance.token_tis_weights(a, torch.zeros(2, 4), mask)
    with pytest.raises(ValueError, match="completion_mask has shape"):
        importance.seq_mis_weights(a, a, torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        importance.token_tis_weights(torch.zeros(3), torch.zeros(3), torch.ones(3))
    for cap, cap_low, match in [(0.0, None, "cap must be"), (-1.0, None, "cap must be"),
                                (math.exp(21), None, "cap must be"), (2.0, 3.0, "cap_low"), (2.0, 2.0, "cap_low"),
                                (2.0, 0.0, "cap_low"), (2.0, -0.5, "cap_low")]:
        for fn in (importance.token_tis_weights, importance.token_mis_weights, importance.seq_tis_weights,
                   importance.seq_mis_weights):
            with pytest.raises(ValueError, match=match):
                fn(a, a, mask, cap=cap, cap_low=cap_low)
    with pytest.raises(ValueError, match="form"):
        importance.seq_tis_weights(a, a, mask, form="mean")


# ------------------------------------------------------------------------------------------------ exact gradients
def _one_token_problem():
    """A categorical over 5 outcomes: the trainer's policy pi_theta (the target), a different sampler mu, and a
    reward f of each outcome (advantages, mixed signs)."""
    theta = torch.tensor([1.0, 0.0, -1.0, 0.5, -0.5], **F64, requires_grad=True)
    mu_logp = torch.log_softmax(torch.tensor([0.0, 0.3, 0.5, 0.5, -1.6], **F64), 0)
    f = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0], **F64)
    return theta, mu_logp, f


def _surrogate_gradient(theta, mu_logp, f, *, weights=None, old=None, eps=0.2):
    """d/dtheta of E_{y ~ mu}[policy_loss of the one-token sample y], enumerated: sum_y mu(y) * loss(y)."""
    logp = torch.log_softmax(theta, 0)
    pi_old = logp.detach() if old is None else old
    total = 0.0
    for y in range(len(f)):
        w = None if weights is None else weights[y].reshape(1, 1)
        loss, _ = losses.policy_loss(logp[y].reshape(1, 1), pi_old[y].reshape(1, 1), f[y].reshape(1), torch.ones(1, 1,
                                     **F64), eps_low=eps, eps_high=eps, is_weights=w)
        total = total + mu_logp[y].exp() * loss
    (grad,) = torch.autograd.grad(total, theta)
    return grad


def _weighted_score_gradient(theta, coef):
    """d/dtheta sum_y coef(y) log pi_theta(y), coef detached: the form every gradient below takes."""
    (grad,) = torch.autograd.grad((coef.detach() * torch.log_softmax(theta, 0)).sum(), theta)
    return grad


# paper-index: importance.token_tis_weights importance.token_mis_weights
def test_exact_gradient_one_token_recomputed_tis_and_mis_against_the_true_policy_gradient():
    theta, mu_logp, f = _one_token_problem()
    pi = torch.softmax(theta, 0).detach()
    (true_grad,) = torch.autograd.grad((torch.softmax(theta, 0) * f).sum(), theta)  # grad of E_pi[f]
    old, mask = torch.log(pi).reshape(5, 1), torch.ones(5, 1, **F64)
    ratio = (pi / mu_logp.exp())  # pi_old / mu per outcome
    print("pi_old / mu per outcome:", [round(float(r), 4) for r in ratio])
    assert ratio.max() > 1.6 and ratio.min() < 0.5  # a real mismatch both ways
    # untruncated (C above every ratio): exactly the on-policy gradient of the trainer's policy
    w = importance.token_tis_weights(old, mu_logp.reshape(5, 1), mask, cap=1e3).reshape(5)
    torch.testing.assert_close(-_surrogate_gradient(theta, mu_logp, f, weights=w), true_grad, rtol=0, atol=1e-12)
    # no correction at all: the sampler's measure, E_mu[f grad log pi] (biased)
    no_corr = -_surrogate_gradient(theta, mu_logp, f)
    torch.testing.assert_close(no_corr, _weighted_score_gradient(theta, mu_logp.exp() * f), rtol=0, atol=1e-12)
    assert (no_corr - true_grad).abs().max() > 0.05
    # TIS at C = 1.6: the outcomes above C lose (pi - C mu) f grad log pi, exactly
    w = importance.token_tis_weights(old, mu_logp.reshape(5, 1), mask, cap=1.6).reshape(5)
    above = ratio > 1.6
    bias = _weighted_score_gradient(theta, torch.where(above, pi - 1.6 * mu_logp.exp(), 0.0) * f)
    tis = -_surrogate_gradient(theta, mu_logp, f, weights=w)
    torch.testing.assert_close(tis, true_grad - bias, rtol=0, atol=1e-12)
    assert bias.abs().max() > 1e-3
    # MIS in [0.5, 1.6]: the outcomes outside are dropped whole, the others keep their exact weight
    w = importance.token_mis_weights(old, mu_logp.reshape(5, 1), mask, cap=1.6, cap_low=0.5).reshape(5)
    outside = (ratio > 1.6) | (ratio < 0.5)
    mis = -_surrogate_gradient(theta, mu_logp, f, weights=w)
    torch.testing.assert_close(mis, true_grad - _weighted_score_gradient(theta, torch.where(outside, pi, 0.0) * f),
                               rtol=0, atol=1e-12)


# paper-index: importance.choose_old_logprobs
def test_exact_gradient_one_token_naive_pi_old_loses_the_clipped_outcomes():
    """Naive (the sampler's log-probs as pi_old): the ratio pi / mu is 1 only where the engines agree. PPO's clip
    then removes the gradient of every outcome whose mismatch alone leaves the band on the side of its advantage;
    the rest is the exact on-policy gradient (E_mu[(pi / mu) f grad log pi] = E_pi[f grad log pi])."""
    theta, mu_logp, f = _one_token_problem()
    pi = torch.softmax(theta, 0).detach()
    (true_grad,) = torch.autograd.grad((torch.softmax(theta, 0) * f).sum(), theta)
    old = importance.choose_old_logprobs(torch.log(pi), mu_logp, pi_old="naive")
    naive = -_surrogate_gradient(theta, mu_logp, f, old=old)
    r = pi / mu_logp.exp()
    clipped = ((f > 0) & (r > 1.2)) | ((f < 0) & (r < 0.8))
    assert 0 < int(clipped.sum()) < 5, r
    expected = true_grad - _weighted_score_gradient(theta, torch.where(clipped, pi, 0.0) * f)
    torch.testing.assert_close(naive, expected, rtol=0, atol=1e-12)
    recomputed = -_surrogate_gradient(theta, mu_logp, f, weights=r)  # recomputed pi_old + exact weights
    torch.testing.assert_close(recomputed, true_grad, rtol=0, atol=1e-12)


def _two_token_problem():
    """Sequences y = (y1, y2) over V = 3, autoregressive: pi(y1) = softmax(a), pi(y2 | y1) = softmax(b[y1]) for
    the trainer (parameters with grad) and the same form with other values for the sampler; a reward per sequence."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(3, generator=g, **F64).requires_grad_(True)
    b = torch.randn(3, 3, generator=g, **F64).requires_grad_(True)
    mu_a, mu_b = a.detach() + 0.8 * torch.randn(3, generator=g, **F64), b.detach() + 0.8 * torch.randn(3, 3,
                                                                                                         generator=g,
                                                                                                         **F64)
    f = torch.randn(9, generator=g, **F64)  # reward of y = 3 * y1 + y2
    return a, b, mu_a, mu_b, f


def _token_logprobs(a, b):
    """(9, 2) log pi(y1), log pi(y2 | y1) for the 9 sequences y = 3 * y1 + y2."""
    y1, y2 = torch.arange(9) // 3, torch.arange(9) % 3
    return torch.stack([torch.log_softmax(a, 0)[y1], torch.log_softmax(b, 1)[y1, y2]], 1)


def _sequence_surrogate_gradient(a, b, mu_tok, f, weights):
    """d/d(a, b) of sum_y mu(y) * policy_loss(sequence y, summed over its 2 tokens, weighted by ``weights``)."""
    logp = _token_logprobs(a, b)  # (9, 2)
    mu_seq = mu_tok.sum(1).exp()  # (9,)
    total = 0.0
    for y in range(9):
        w = weights[y].reshape(1, -1) if weights.dim() == 2 else weights[y].reshape(1)
        loss, _ = losses.policy_loss(logp[y:y + 1], logp[y:y + 1].detach(), f[y].reshape(1), torch.ones(1, 2, **F64),
                                     agg="seq-mean-token-sum", is_weights=w)
        total = total + mu_seq[y] * loss
    return torch.autograd.grad(total, (a, b))


def _score_gradient(a, b, coef_tok):
    """d/d(a, b) of sum_y sum_t coef[y, t] log pi(y_t | y_<t), coef detached."""
    return torch.autograd.grad((coef_tok.detach() * _token_logprobs(a, b)).sum(), (a, b))


def _close(xs, ys):
    for x, y in zip(xs, ys, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)


def _gap(xs, ys):
    return max(float((x - y).abs().max()) for x, y in zip(xs, ys, strict=True))


# paper-index: importance.seq_tis_weights importance.seq_mis_weights
def test_exact_gradient_sequences_product_is_unbiased_token_and_geomean_are_not():
    """On 9 two-token sequences: the product weight pi_old(y) / mu(y) gives exactly the on-policy gradient; the
    token weights r_t give each token's gradient under a mixed measure (the other token from mu); the geometric
    mean gives the measure sqrt(pi_old mu); sequence truncation and masking remove exactly what they cut."""
    a, b, mu_a, mu_b, f = _two_token_problem()
    old = _token_logprobs(a, b).detach()  # (9, 2) pi_old = the current policy
    mu_tok = _token_logprobs(mu_a, mu_b)  # (9, 2)
    mask = torch.ones(9, 2, **F64)
    pi_seq, mu_seq = old.sum(1).exp(), mu_tok.sum(1).exp()  # (9,)
    true_grad = torch.autograd.grad((_token_logprobs(a, b).sum(1).exp() * f).sum(), (a, b))  # grad E_pi[f]
    ones = torch.ones(9, 2, **F64)
    # product, untruncated: exact
    w = importance.seq_tis_weights(old, mu_tok, mask, cap=1e6)
    torch.testing.assert_close(w, pi_seq / mu_seq)
    neg = [-g for g in _sequence_surrogate_gradient(a, b, mu_tok, f, w)]
    _close(neg, true_grad)
    # token weights, untruncated: token 1 under pi(y1) mu(y2 | y1), token 2 under mu(y1) pi(y2 | y1)
    w_tok = importance.token_tis_weights(old, mu_tok, mask, cap=1e6)
    neg = [-g for g in _sequence_surrogate_gradient(a, b, mu_tok, f, w_tok)]
    mixed = torch.stack([old[:, 0].exp() * mu_tok[:, 1].exp(), mu_tok[:, 0].exp() * old[:, 1].exp()], 1)
    _close(neg, _score_gradient(a, b, mixed * f.unsqueeze(1)))
    print(f"token-level weights: max |gradient - on-policy gradient| {_gap(neg, true_grad):.4f}")
    assert _gap(neg, true_grad) > 1e-2
    # geometric mean: the measure mu (pi_old / mu)^(1/2) = sqrt(pi_old mu)
    w_geo = importance.seq_tis_weights(old, mu_tok, mask, cap=1e6, form="geomean")
    neg = [-g for g in _sequence_surrogate_gradient(a, b, mu_tok, f, w_geo)]
    _close(neg, _score_gradient(a, b, (pi_seq * mu_seq).sqrt().unsqueeze(1) * f.unsqueeze(1) * ones))
    print(f"geometric-mean weights: max |gradient - on-policy gradient| {_gap(neg, true_grad):.4f}")
    assert _gap(neg, true_grad) > 1e-2
    # truncation at C: the sequences above C lose (pi_old - C mu) f grad log pi(y); masking drops them whole
    ratio = pi_seq / mu_seq
    C = float(ratio.sort().values[6])  # 2 of 9 sequences above it
    above = ratio > C
    assert int(above.sum()) == 2
    neg = [-g for g in _sequence_surrogate_gradient(a, b, mu_tok, f, importance.seq_tis_weights(old, mu_tok, mask,
                                                                                                   cap=C))]
    bias = _score_gradient(a, b, (torch.where(above, pi_seq - C * mu_seq, 0.0) * f).unsqueeze(1) * ones)
    _close(neg, [t - s for t, s in zip(true_grad, bias, strict=True)])
    neg = [-g for g in _sequence_surrogate_gradient(a, b, mu_tok, f, importance.seq_mis_weights(old, mu_tok, mask,
                                                                                                   cap=C))]
    dropped = _score_gradient(a, b, (torch.where(above, pi_seq, 0.0) * f).unsqueeze(1) * ones)
    _close(neg, [t - s for t, s in zip(true_grad, dropped, strict=True)])


# ------------------------------------------------------------------------------------------------ TRL 1.16
G = 4
PROMPTS = ["1+2=", "3+4+5="]
COMPLETIONS = ["3#3", "1+2=3#3", "1+2=3;3+3=6#6", "9", "12#12", "3+4=7;7+5=12#12", "7#7", "3+4=7#7"]
REWARDS = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def trl_setup(tok, tmp_path_factory):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")
    path = tmp_path_factory.mktemp("tiny_is")
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return models.load(str(path)), path


def _trl_generate_and_score(model, tok, cfg, tmp_path, sampler_shift):
    """TRL 1.16's own ``GRPOTrainer._generate_and_score_completions`` on the 8 fixed completions, with its
    generation replaced by a function that returns them and the sampler log-probs (trainer's pi_old - shift):
    TRL then recomputes pi_old and computes its importance ratio itself (its ``vllm_importance_sampling_*`` block).
    ``use_vllm`` is switched on after construction only to enable that block (no vLLM runs)."""
    import datasets
    import trl

    args = interop.to_trl(cfg, output_dir=str(tmp_path), report_to="none", use_cpu=True, logging_steps=1)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda prompts, completions, **_: REWARDS[:len(prompts)],
                              args=args, train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
                              processing_class=tok)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    trainer.use_vllm = True
    prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS for _ in range(G)]
    completion_ids = [tok(c, add_special_tokens=False).input_ids + [tok.eos_token_id] for c in COMPLETIONS]
    with torch.no_grad():  # the trainer's pi_old on these tokens, to build sampler log-probs near it
        T = max(map(len, completion_ids))
        P = max(map(len, prompt_ids))
        ids = torch.tensor([[tok.pad_token_id] * (P - len(p)) + p + c + [tok.pad_token_id] * (T - len(c))
                            for p, c in zip(prompt_ids, completion_ids, strict=True)])
        attn = torch.tensor([[0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c))
                             for p, c in zip(prompt_ids, completion_ids, strict=True)])
        old = rollout.token_logprobs(model, ids, attn, P)  # (B, T)
    sampler = [(old[i, :len(c)] - sampler_shift[i, :len(c)]).tolist() for i, c in enumerate(completion_ids)]
    trainer._generate = lambda prompts: (prompt_ids, completion_ids, None, COMPLETIONS, sampler, {}, None, None)
    out = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(G)])
    return trainer, out


def _shift(seed=0):
    """(8, 16) per-token log pi_old - log mu: 0.35 N(0, 1), plus one token of +50 and one of -50 nats."""
    s = 0.35 * torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
    s[1, 2], s[5, 4] = 50.0, -50.0
    return s


TRL_CASES = {  # minirl setting -> TRL 1.16's mode (interop.to_trl writes it)
    "token_tis": dict(is_correction="token_tis", is_cap=1.5),
    "token_tis_two_sided": dict(is_correction="token_tis", is_cap=1.5, is_cap_low=0.8),
    "token_mis": dict(is_correction="token_mis", is_cap=1.5, is_cap_low=0.7),
    "seq_tis": dict(is_correction="seq_tis", is_cap=3.0),
    "seq_mis_trl_default": dict(is_correction="seq_mis", is_cap=3.0),  # TRL 1.16's default: sequence_mask, 3.0
    "seq_mis_two_sided": dict(is_correction="seq_mis", is_cap=3.0, is_cap_low=0.4),  # drops a ratio of 0.35 too
}


@pytest.mark.parametrize("case", list(TRL_CASES))
def test_weights_and_weighted_loss_match_trls_own_code(case, tok, trl_setup, tmp_path):
    """The same sampler / trainer log-probs through TRL 1.16's ``_generate_and_score_completions`` (its weights,
    exp of (old - sampler) per token, or of its SUM per sequence, a product of ratios, then clamp or masked_fill
    outside [clip_min, clip_max]) and its ``_compute_loss`` (per_token_loss * importance_sampling_ratio, then GRPO's
    aggregation): minirl's weights and policy_loss(is_weights=...) agree to 1e-6, loss and gradient, with ratios
    outside the bounds on both sides."""
    base, _ = trl_setup
    cfg = make_config("grpo", prompts_per_step=2, group_size=G, num_minibatches=1, max_new_tokens=16, beta=0.0,
                      **TRL_CASES[case])
    model_t, model_m = copy.deepcopy(base), copy.deepcopy(base)
    trainer, out = _trl_generate_and_score(model_t, tok, cfg, tmp_path, _shift())
    mask = out["completion_mask"].float()
    old, sampler = out["old_per_token_logps"], out["sampling_per_token_logps"]
    ours = importance.is_weights(old, sampler, mask, correction=cfg.is_correction, cap=cfg.is_cap,
                                 cap_low=cfg.is_cap_low, form=cfg.is_seq_form)
    theirs = out["importance_sampling_ratio"]  # (B, T) token modes (1 on padding), (B, 1) sequence modes
    if ours.dim() == 1:
        diff = (ours - theirs[:, 0]).abs().max()
    else:
        diff = (ours - theirs)[mask > 0].abs().max()
    m = importance.mismatch_metrics(old, sampler, mask, correction=cfg.is_correction, cap=cfg.is_cap,
                                    cap_low=cfg.is_cap_low, form=cfg.is_seq_form)
    acted = m["tokens_truncated"] + m["tokens_masked"]
    print(f"{case}: max |minirl - TRL| weight {float(diff):.2e}; share of tokens truncated or masked {acted:.2f}")
    assert diff < 1e-6
    assert 0.05 < acted < 0.95  # the bounds acted on part of the batch, not all or none of it
    # the loss and its gradient, on-policy (ratio 1) and with pi shifted away from pi_old (ratios clipped)
    P = out["prompt_ids"].shape[1]
    input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    for old_shift in (0.0, 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))):
        inputs = {**out, "old_per_token_logps": old + old_shift}
        model_t.zero_grad(set_to_none=True)
        loss_t = trainer.compute_loss(model_t, inputs)
        loss_t.backward()
        loss_t = loss_t.detach()
        model_m.zero_grad(set_to_none=True)
        logprobs = rollout.token_logprobs(model_m, input_ids, attention_mask, P)
        loss_m, _ = losses.policy_loss(logprobs, old + old_shift, out["advantages"], mask, eps_low=cfg.eps_low,
                                       eps_high=cfg.eps_high, agg=cfg.agg, is_weights=ours)
        loss_m.backward()
        loss_m = loss_m.detach()
        gdiff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(model_t.parameters(), model_m.parameters(),
                                                                         strict=True))
        gscale = max(float(q.grad.abs().max()) for q in model_m.parameters())
        print(f"  loss TRL {float(loss_t):.6f} minirl {float(loss_m):.6f} (gap {abs(float(loss_t - loss_m)):.1e}); "
              f"max |grad gap| {gdiff:.2e} "
              f"(max |grad| {gscale:.2e})")
        assert abs(float(loss_t) - float(loss_m)) < 1e-6 and gdiff < 1e-6 and gscale > 1e-3
    unweighted, _ = losses.policy_loss(logprobs.detach(), old + old_shift, out["advantages"], mask, agg=cfg.agg)
    assert abs(float(unweighted) - float(loss_m)) > 1e-3  # the correction changed the loss


def test_trls_sequence_weight_is_a_product_not_a_geometric_mean(tok, trl_setup, tmp_path):
    """TRL 1.16 exponentiates the SUM of a sequence's token log-ratios (``_generate_and_score_completions``): with every
    token at log(pi_old / mu) = 0.1, a sequence of n tokens gets e^(0.1 n) (product), not e^0.1 (geometric mean,
    what TRL issue #5814 asks for); to_trl refuses minirl's geometric-mean form."""
    base, _ = trl_setup
    cfg = make_config("grpo", prompts_per_step=2, group_size=G, num_minibatches=1, max_new_tokens=16, beta=0.0,
                      is_correction="seq_tis", is_cap=1e6)
    _, out = _trl_generate_and_score(copy.deepcopy(base), tok, cfg, tmp_path, torch.full((8, 16), 0.1))
    n = out["completion_mask"].sum(1).double()  # tokens per completion: 4, 8, 14, 2, 6, 16, 4, 8
    assert n.tolist() == [4, 8, 14, 2, 6, 16, 4, 8]
    torch.testing.assert_close(out["importance_sampling_ratio"][:, 0].double(), torch.exp(0.1 * n), rtol=1e-5, atol=0)
    with pytest.raises(NotImplementedError, match="is_seq_form='geomean'"):
        interop.trl_kwargs(make_config("grpo", is_correction="seq_tis", is_seq_form="geomean"))
