"""Stale and truncated samplers (issue 37, the math): top-k / top-p kept sets and the renormalised trainer log-probs
(minirl.truncation), off-policy sequence masking, decoupled PPO and the staleness metric (minirl.stale_corrections), the
ratio-weighted k3 (minirl.kl). Hand values, exact enumerations on small categoricals, edge cases, and equality with
transformers' warpers and TRL 1.16's own code (its staticmethod, and GRPOTrainer._compute_loss on a model-free stub).

Notation: pi the trainer's policy, mu the sampler, pi_old / pi_prox the trainer's policy before the update, ref the
reference; log-probs in nats. Each enumeration lays the K actions of a categorical out as K one-token rows (B = K,
T = 1), the layout the functions take.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from minirl import importance, kl, kl_toy, losses, stale_corrections, truncation

F64 = dict(dtype=torch.float64)


def lp(*rows):
    """(B, T) float64 tensor from lists."""
    return torch.tensor(rows, **F64)


def rows(x):
    """(K,) -> (K, 1): one action per row."""
    return x[:, None]


# ================================================================================ 1. truncated samplers (top-k/p)
# paper-index: truncation.kept_mask
def test_kept_mask_by_hand():
    logp = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    # ascending probabilities [0.05, 0.15, 0.3, 0.5], cumulative [0.05, 0.2, 0.5, 1.0]; drop cumulative <= 1 - top_p
    assert truncation.kept_mask(logp, top_p=0.75).tolist() == [True, True, False, False]  # drops <= 0.25
    assert truncation.kept_mask(logp, top_p=0.85).tolist() == [True, True, True, False]  # drops <= 0.15
    assert truncation.kept_mask(logp, top_p=0.4).tolist() == [True, False, False, False]  # drops <= 0.6
    assert truncation.kept_mask(logp, top_p=1e-9).tolist() == [True, False, False, False]  # the top one stays
    x = torch.tensor([1.0, 3.0, 3.0, 2.0])
    assert truncation.kept_mask(x, top_k=3).tolist() == [False, True, True, True]
    assert truncation.kept_mask(x, top_k=2).tolist() == [False, True, True, False]
    assert truncation.kept_mask(x, top_k=1).tolist() == [False, True, True, False]  # the tie at the k-th: both kept
    assert truncation.kept_mask(x, top_k=10).all()  # k > V keeps all
    # top-k then top-p on what it left: [0.5, 0.3, 0.15] renormalised by 0.95 -> [0.526, 0.316, 0.158]; top_p 0.8
    # drops cumulative <= 0.2: the 0.158 -> [T, T, F, F]
    assert truncation.kept_mask(logp, top_k=3, top_p=0.8).tolist() == [True, True, False, False]
    for off in (dict(), dict(top_k=0), dict(top_p=1.0), dict(top_k=None, top_p=None)):
        assert truncation.kept_mask(logp, **off).all()


def _transformers_kept(scores, top_k, top_p):
    """The tokens transformers' warpers leave finite, in generate's order (top-k, then top-p)."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
    if top_k:
        scores = TopKLogitsWarper(top_k=top_k)(None, scores)
    if top_p is not None and top_p < 1.0:
        scores = TopPLogitsWarper(top_p=top_p)(None, scores)
    return scores > -math.inf


@pytest.mark.parametrize("top_k,top_p", [(1, None), (5, None), (50, None), (60, None), (None, 0.9), (None, 0.5),
                                         (None, 0.05), (None, 0.999), (5, 0.9), (20, 0.3), (3, 0.99), (0, 0.7)])
@pytest.mark.parametrize("ties", [False, True])
def test_kept_mask_equals_transformers_warpers(top_k, top_p, ties):
    gen = torch.Generator().manual_seed(0)
    logits = 2 * torch.randn(64, 50, generator=gen)  # (B, V) float32, as generate's scores
    if ties:  # many equal logits, at the top-k boundary and inside the nucleus
        logits = logits.round()
    expected = _transformers_kept(logits.clone(), top_k, top_p)
    kept = truncation.kept_mask(logits, top_k=top_k, top_p=top_p)
    assert torch.equal(kept, expected)
    assert kept.any(-1).all()
    # (B, T, V) gives the same sets as its rows
    assert torch.equal(truncation.kept_mask(logits.reshape(8, 8, 50), top_k=top_k, top_p=top_p).reshape(64, 50),
                       expected)


def test_kept_mask_rejects_bad_settings():
    x = torch.zeros(3)
    for bad in (dict(top_k=-1), dict(top_k=1.5), dict(top_k=True), dict(top_p=0.0), dict(top_p=1.5),
                dict(top_p=-0.1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            truncation.kept_mask(x, **bad)
    with pytest.raises(ValueError, match="logits"):
        truncation.kept_mask(torch.tensor(1.0), top_k=1)


# paper-index: truncation.kept_logprobs truncation.kept_mass
def test_kept_logprobs_and_kept_mass_by_hand():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05], **F64).log()[None, None]  # (1, 1, 4)
    kept = torch.tensor([True, True, False, False])[None, None]  # top_p 0.75: mass 0.8
    mask = torch.ones(1, 1, **F64)
    # y = 1: log 0.3 - log 0.8 = log 0.375 = -0.980829 (full vocabulary: log 0.3 = -1.203973)
    out = truncation.kept_logprobs(logits, torch.tensor([[1]]), kept, mask)
    torch.testing.assert_close(out, lp([math.log(0.375)]), rtol=0, atol=1e-15)
    torch.testing.assert_close(truncation.kept_mass(logits, kept, mask), lp([0.8]), rtol=0, atol=1e-15)
    # temperature 2: pi = softmax(log p / 2) ~ sqrt(p): sqrt [0.5, 0.3, 0.15, 0.05] = [0.7071, 0.5477, 0.3873, 0.2236]
    # / 1.8657; kept mass (0.7071 + 0.5477) / 1.8657 = 0.672557; y = 1: 0.5477 / 1.2548 = 0.436482
    s = torch.tensor([0.5, 0.3, 0.15, 0.05], **F64).sqrt()
    torch.testing.assert_close(truncation.kept_mass(logits, kept, mask, temperature=2.0), lp([(s[:2].sum() / s.sum())]))
    torch.testing.assert_close(truncation.kept_logprobs(logits, torch.tensor([[1]]), kept, mask, temperature=2.0),
                               lp([math.log(s[1] / s[:2].sum())]))


def _truncated_categorical(seed=0, B=4, T=3, V=12, top_k=6, top_p=0.8, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    logits = (1.5 * torch.randn(B, T, V, generator=gen)).to(dtype)
    kept = truncation.kept_mask(logits, top_k=top_k, top_p=top_p)  # (B, T, V)
    log_mu = torch.log_softmax(logits.masked_fill(~kept, -math.inf), -1)  # what the truncated sampler draws from
    return logits, kept, log_mu


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-7), (torch.float32, 2.4e-7)])  # float32: 2 ulps of 1
def test_truncated_sampler_naive_ratio_is_the_kept_mass_and_the_corrected_ratio_is_one(dtype, tol):
    """Every kept token y of every position, sampler = trainer: the full-vocabulary ratio pi(y) / mu(y) is S, the
    kept mass (so mu / pi = 1 / S), the same for every y of a position; the renormalised ratio is 1 (float64: to
    1e-7, in fact ~1e-15; float32: to its round-off, 2 ulps)."""
    logits, kept, log_mu = _truncated_categorical(dtype=dtype)
    B, T, V = logits.shape
    mask = torch.ones(B, T, dtype=dtype)
    S = truncation.kept_mass(logits, kept, mask)  # (B, T)
    assert (S < 1).all() and (S > 0.3).all()  # the truncation removes mass at every position here
    log_pi = torch.log_softmax(logits, -1)
    for y in range(V):
        tokens = torch.full((B, T), y)
        on = kept[..., y]  # positions where y could be drawn
        naive = (log_pi[..., y] - log_mu[..., y]).exp()
        torch.testing.assert_close(naive[on], S[on], rtol=0, atol=10 * tol)
        if not on.any():
            continue
        corrected = (truncation.kept_logprobs(logits, tokens, kept, on.to(dtype)) - log_mu[..., y]).exp()
        assert (corrected[on] - 1).abs().max() <= tol, (corrected[on] - 1).abs().max()


def test_kept_logprobs_gradient_by_enumeration():
    """One position, V = 8, A(y) fixed: the expected policy gradient over the sampler's tokens,
    sum_{y in K} mu(y) A(y) grad log pi_K(y) (autograd through kept_logprobs), is exactly grad_theta of the truncated
    policy's objective sum_{y in K} pi_K(y) A(y), and 0 on the dropped logits; the naive full-vocabulary log pi
    gives a gradient that moves the dropped logits (by -E_mu[A] pi(v)) and is not that objective's."""
    gen = torch.Generator().manual_seed(3)
    V = 8
    theta = torch.randn(V, generator=gen, **F64)
    A = torch.randn(V, generator=gen, **F64)
    kept_v = truncation.kept_mask(theta, top_p=0.7)
    assert 1 < kept_v.sum() < V
    ys = kept_v.nonzero()[:, 0]  # the kept actions, one row each
    n = len(ys)
    log_mu = torch.log_softmax(theta.masked_fill(~kept_v, -math.inf), -1).detach()

    def expected(use_kept):
        t = theta.clone().requires_grad_(True)
        logits = t[None, None].expand(n, 1, V)  # (n, 1, V)
        if use_kept:
            logp = truncation.kept_logprobs(logits, ys[:, None], kept_v.expand(n, 1, V), torch.ones(n, 1, **F64))
        else:
            logp = torch.log_softmax(logits, -1).gather(-1, ys[:, None, None])[..., 0]
        (log_mu[ys] .exp() * A[ys] * logp[:, 0]).sum().backward()  # sum_y mu(y) A(y) log pi(y), mu detached
        return t.grad

    t = theta.clone().requires_grad_(True)
    pi_K = torch.softmax(t.masked_fill(~kept_v, -math.inf), -1)
    (pi_K * torch.where(kept_v, A, 0.0)).sum().backward()
    g_true = t.grad
    g_kept, g_naive = expected(True), expected(False)
    torch.testing.assert_close(g_kept, g_true, rtol=0, atol=1e-14)
    assert (g_kept[~kept_v] == 0).all()
    E_mu_A = (log_mu[ys].exp() * A[ys]).sum()
    pi = torch.softmax(theta, -1)
    torch.testing.assert_close(g_naive[~kept_v], -E_mu_A * pi[~kept_v], rtol=0, atol=1e-14)
    assert (g_naive - g_true).abs().max() > 1e-3


def test_kept_logprobs_padding_is_never_read_and_fully_masked_rows_give_zero():
    logits, kept, _ = _truncated_categorical(B=3, T=4, dtype=torch.float64)
    mask = lp([1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1])
    tokens = kept.float().argmax(-1)  # a kept token at every position
    logits = logits.clone()
    logits[0, 2:] = math.nan  # padding: NaN logits, an empty kept set, a pad id outside the vocabulary's kept set
    logits[1] = math.inf
    kept = kept.clone()
    kept[0, 2:] = False
    kept[1] = False
    tokens[1] = 11
    leaf = logits.clone().requires_grad_(True)
    out = truncation.kept_logprobs(leaf, tokens, kept, mask)
    assert torch.isfinite(out).all() and (out[mask == 0] == 0).all()
    out.sum().backward()
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[mask == 0] == 0).all()
    S = truncation.kept_mass(logits, kept, mask)
    assert torch.isfinite(S).all() and (S[mask == 0] == 1).all()


def test_kept_logprobs_without_truncation_is_the_full_log_softmax_and_rejects_foreign_tokens():
    logits, _, _ = _truncated_categorical(B=2, T=3, dtype=torch.float64)
    tokens = torch.tensor([[0, 5, 11], [3, 3, 7]])
    full = torch.ones_like(logits, dtype=torch.bool)
    mask = torch.ones(2, 3, **F64)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(truncation.kept_logprobs(logits, tokens, full, mask), expected, rtol=0, atol=1e-15)
    kept = full.clone()
    kept[1, 2, 7] = False
    with pytest.raises(ValueError, match="outside its kept set"):
        truncation.kept_logprobs(logits, tokens, kept, mask)
    with pytest.raises(ValueError, match="temperature"):
        truncation.kept_logprobs(logits, tokens, full, mask, temperature=0.0)
    with pytest.raises(ValueError, match="kept"):
        truncation.kept_logprobs(logits, tokens, full[..., :5], mask)
    with pytest.raises(ValueError, match="logits"):
        truncation.kept_logprobs(logits[0], tokens, full, mask)


# ================================================================================ 2. DeepSeek-V3.2's corrections
# paper-index: stale_corrections.off_policy_sequence_mask
def test_off_policy_sequence_mask_by_hand():
    sampler, current, mask = lp([-1.0, -2.0], [-1.0, -1.0]), lp([-2.0, -3.0], [-1.2, -1.0]), torch.ones(2, 2, **F64)
    # mean log(mu / pi): row 0 ((-1 + 2) + (-2 + 3)) / 2 = 1.0 > 0.5 -> dropped; row 1 (0.2 + 0) / 2 = 0.1 -> kept
    out = stale_corrections.off_policy_sequence_mask(current, sampler, torch.tensor([-1.0, -1.0]), mask, threshold=0.5)
    assert out.tolist() == [0.0, 1.0] and out.dtype == torch.float64
    out = stale_corrections.off_policy_sequence_mask(current, sampler, torch.tensor([1.0, -1.0]), mask, threshold=0.5)
    assert out.tolist() == [1.0, 1.0]  # a positive advantage is always kept
    # the boundaries: A = 0 kept; a mean exactly at the threshold kept (drop only when strictly above)
    out = stale_corrections.off_policy_sequence_mask(current, sampler, torch.tensor([0.0, -1.0]), mask, threshold=1.0)
    assert out.tolist() == [1.0, 1.0]
    # the mean is over valid tokens only: row 0 with its 2nd token masked -> (-1 + 2) / 1 = 1.0; the padding holds -inf
    # and NaN and is never read; a row with no valid token is on-policy (mean 0): kept
    out = stale_corrections.off_policy_sequence_mask(lp([-2.0, math.nan], [-math.inf, 0.0]),
                                                     lp([-1.0, -math.inf], [0.0, 0.0]),
                                                     torch.tensor([-1.0, -1.0]), lp([1, 0], [0, 0]), threshold=0.99)
    assert out.tolist() == [0.0, 1.0]
    # equal policies: log-ratio 0 <= any threshold >= 0: all kept
    out = stale_corrections.off_policy_sequence_mask(current, current.clone(), torch.tensor([-1.0, -5.0]), mask,
                                                     threshold=0.0)
    assert out.tolist() == [1.0, 1.0]


def test_off_policy_sequence_mask_raises_naming_the_argument():
    x, m, a = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2)
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(ValueError, match="threshold"):
            stale_corrections.off_policy_sequence_mask(x, x, a, m, threshold=bad)
    with pytest.raises(ValueError, match="advantages"):
        stale_corrections.off_policy_sequence_mask(x, x, torch.zeros(2, 3), m, threshold=0.5)
    with pytest.raises(ValueError, match="sampler_logprobs"):
        stale_corrections.off_policy_sequence_mask(x, torch.full((2, 3), math.nan), a, m, threshold=0.5)
    with pytest.raises(ValueError, match="shape"):
        stale_corrections.off_policy_sequence_mask(x, torch.zeros(2, 4), a, m, threshold=0.5)


def _trl():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]'")


def _random_batch(seed, B=8, T=6, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None] < torch.randint(1, T + 1, (B,), generator=gen)[:, None]).to(dtype)  # (B, T)
    old = -torch.rand(B, T, generator=gen, dtype=dtype) * 3  # pi_old (the trainer before the update)
    logprobs = old + 0.3 * torch.randn(B, T, generator=gen, dtype=dtype)  # pi after some updates
    sampler = old + 0.5 * torch.randn(B, T, generator=gen, dtype=dtype)  # a stale, mismatched sampler
    ref = old + 0.4 * torch.randn(B, T, generator=gen, dtype=dtype)
    advantages = torch.randn(B, generator=gen, dtype=dtype)
    return logprobs, old, sampler, ref, advantages, mask


# paper-index: stale_corrections.off_policy_sequence_mask
@pytest.mark.parametrize("threshold", [0.0, 0.05, 0.2, 0.5, 2.0])
def test_off_policy_sequence_mask_equals_trls_staticmethod(threshold):
    """TRL 1.16 ``GRPOTrainer.get_off_policy_mask`` (a staticmethod: called as it is), on a batch with padding, at
    several thresholds (0.05 and 0.2 split the batch), and with the boundary case mean == threshold built in."""
    trl = _trl()
    dropped = 0
    for seed in range(5):
        logprobs, _, sampler, _, advantages, mask = _random_batch(seed)
        advantages[0] = 0.0  # A = 0: kept by both
        advantages[1] = -1.0  # mean log(mu / pi) at the threshold (up to the same float32 round-off in both)
        sampler[1] = torch.where(mask[1] > 0, logprobs[1] + threshold, 0.0)
        theirs = trl.GRPOTrainer.get_off_policy_mask(advantages=advantages[:, None], per_token_logps=logprobs,
                                                     sampling_per_token_logps=sampler, mask=mask,
                                                     off_policy_threshold=threshold)  # (B, 1)
        ours = stale_corrections.off_policy_sequence_mask(logprobs, sampler, advantages, mask, threshold=threshold)
        assert torch.equal(ours, theirs[:, 0]), (seed, ours, theirs[:, 0])
        dropped += int((ours == 0).sum())
    assert dropped > 0 or threshold >= 0.5  # the low thresholds do drop sequences of this batch


# paper-index: kl.ratio_weighted_k3
def test_ratio_weighted_k3_by_hand():
    logprobs = lp([-1.0]).requires_grad_(True)
    out = kl.ratio_weighted_k3(logprobs, lp([-1.2]), lp([-0.5]))
    # ratio e^0.2 = 1.221403; k3 = e^0.5 - 1 - 0.5 = 0.148721; term 1.221403 * 0.148721 = 0.181649
    torch.testing.assert_close(out, lp([math.exp(0.2) * (math.exp(0.5) - 1.5)]), rtol=0, atol=1e-15)
    assert abs(float(out.detach()) - 0.181649) < 5e-7
    out.sum().backward()
    # d/dlog pi = ratio * k3 + ratio * (1 - e^0.5) = 1.221403 * (0.148721 - 0.648721) = -0.610701
    assert abs(float(logprobs.grad) - (-0.610701)) < 5e-7
    # on-policy (old = pi): the value is k3 exactly; the gradient is grad k3 + k3 grad log pi, not grad k3
    x = lp([-1.0, -2.0]).requires_grad_(True)
    ref = lp([-0.5, -2.5])
    on = kl.ratio_weighted_k3(x, x.detach().clone(), ref)
    assert torch.equal(on, kl.k3(x, ref))
    g_on, = torch.autograd.grad(on.sum(), x)
    g_k3, = torch.autograd.grad(kl.k3(x, ref).sum(), x)
    torch.testing.assert_close(g_on, g_k3 + kl.k3(x, ref).detach(), rtol=0, atol=1e-15)


def test_ratio_weighted_k3_masks_padding_and_never_overflows():
    x = lp([-1.0, -math.inf, math.nan]).requires_grad_(True)
    out = kl.ratio_weighted_k3(x, lp([-1.0, 0.0, -math.inf]), lp([-2.0, math.nan, 0.0]), mask=lp([1, 0, 0]))
    assert out[0, 1:].tolist() == [0.0, 0.0] and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[0, 1:].tolist() == [0.0, 0.0]
    # a log-ratio of 60 nats to pi_old, and 40 to the reference: finite (exp continued linearly past 20 nats)
    y = lp([0.0]).requires_grad_(True)
    out = kl.ratio_weighted_k3(y, lp([-60.0]), lp([40.0]))
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(y.grad).all()
    with pytest.raises(ValueError, match="old_logprobs"):
        kl.ratio_weighted_k3(x, lp([-1.0, 0.0]), x)


def _expected_k3_gradient(theta, theta_old, ref_logits, *, detach_ratio=False, weighted=True):
    """sum_a pi_old(a) grad_theta[w(a) k3(a)], w = pi(a) / pi_old(a) (or 1): the exact mean gradient over samples
    of pi_old, each action a one-token row."""
    t = theta.clone().requires_grad_(True)
    log_pi, log_old, log_ref = t.log_softmax(-1), theta_old.log_softmax(-1), ref_logits.log_softmax(-1)
    if not weighted:
        terms = kl.k3(rows(log_pi), rows(log_ref))
    elif detach_ratio:
        terms = (rows(log_pi) - rows(log_old)).exp().detach() * kl.k3(rows(log_pi), rows(log_ref))
    else:
        terms = kl.ratio_weighted_k3(rows(log_pi), rows(log_old), rows(log_ref))
    (log_old.exp() * terms[:, 0]).sum().backward()
    return t.grad


# paper-index: kl.ratio_weighted_k3
def test_ratio_weighted_k3_expected_gradient_is_the_reverse_kl_gradient_off_policy():
    """Enumeration on a categorical (K = 6), samples from pi_old != pi: ratio_weighted_k3 gives exactly
    grad KL(pi || ref); with the ratio detached it gives grad KL(ref || pi) (the forward KL, as k3 in the loss
    on-policy); plain k3 on pi_old's samples gives neither."""
    gen = torch.Generator().manual_seed(1)
    theta, theta_old, ref = (torch.randn(6, generator=gen, **F64) for _ in range(3))
    t = theta.clone().requires_grad_(True)
    g_rkl, = torch.autograd.grad(kl_toy.true_kl(t, ref), t)
    g_fkl, = torch.autograd.grad(kl_toy.forward_kl(t, ref), t)
    g = _expected_k3_gradient(theta, theta_old, ref)
    torch.testing.assert_close(g, g_rkl, rtol=0, atol=1e-14)
    torch.testing.assert_close(_expected_k3_gradient(theta, theta_old, ref, detach_ratio=True), g_fkl, rtol=0,
                               atol=1e-14)
    plain = _expected_k3_gradient(theta, theta_old, ref, weighted=False)
    assert (plain - g_rkl).abs().max() > 1e-2 and (plain - g_fkl).abs().max() > 1e-2
    # on-policy too (pi_old = pi): the reverse KL's gradient, where plain k3 gives the forward KL's
    torch.testing.assert_close(_expected_k3_gradient(theta, theta, ref), g_rkl, rtol=0, atol=1e-14)
    torch.testing.assert_close(_expected_k3_gradient(theta, theta, ref, weighted=False), g_fkl, rtol=0, atol=1e-14)
    # the same as kl_toy's off-policy "loss" placement with the importance weight (its k3 row)
    torch.testing.assert_close(g, kl_toy.expected_gradient(theta, ref, "k3", "loss", behaviour_logits=theta_old),
                               rtol=0, atol=1e-14)


def _trl_compute_loss(logprobs, old, sampler, ref, advantages, mask, **settings):
    """TRL 1.16's ``GRPOTrainer._compute_loss`` itself, on a model-free stub: the trainer's ``__init__`` is skipped
    and its log-prob forward returns ``logprobs`` (a leaf), so everything after the forward is TRL's own code. The
    settings are GRPOConfig's defaults (read from the installed dataclass) overridden by ``settings``; the trainer
    attributes _compute_loss reads are set as GRPOTrainer.__init__ sets them from the config. Returns (loss,
    d loss / d logprobs, the stub's config)."""
    trl = _trl()
    args = SimpleNamespace(**{f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)})
    for name, value in settings.items():
        assert hasattr(args, name), name
        setattr(args, name, value)
    args.steps_per_generation = 1  # GRPOConfig.__post_init__: gradient_accumulation_steps (1)
    leaf = logprobs.detach().clone().requires_grad_(True)

    class Stub(trl.GRPOTrainer):
        def __init__(self):  # no model, no accelerator: only what _compute_loss reads
            pass

        def _get_per_token_logps_and_entropies(self, model, *_, **__):
            return leaf, torch.zeros_like(leaf), None

    t = Stub()
    t.args, t.beta, t.loss_type = args, args.beta, args.loss_type
    t.epsilon_low, t.epsilon_high = args.epsilon, args.epsilon_high if args.epsilon_high is not None else args.epsilon
    t.importance_sampling_level, t.off_policy_mask_threshold = args.importance_sampling_level, \
        args.off_policy_mask_threshold
    t.top_entropy_quantile, t.use_vllm = args.top_entropy_quantile, args.use_vllm
    t.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
    t._entropy_bonus_enabled = args.entropy_coef != 0.0 or args.use_adaptive_entropy
    t.aux_loss_enabled, t.model, t.current_gradient_accumulation_steps = False, SimpleNamespace(training=True), 1
    t.accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x)
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    B = logprobs.shape[0]
    inputs = dict(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                  completion_ids=torch.zeros_like(mask, dtype=torch.long), completion_mask=mask.long(),
                  advantages=advantages, old_per_token_logps=old, sampling_per_token_logps=sampler,
                  ref_per_token_logps=ref, num_items_in_batch=mask.sum())
    loss = t._compute_loss(None, inputs)
    loss.backward()
    return loss.detach(), leaf.grad, args


def _minirl_loss(logprobs, old, sampler, ref, advantages, mask, *, agg, beta, eps, threshold, bias_correction):
    """minirl's composition: policy_loss with the off-policy mask as a (B,) weight, plus beta times the aggregated
    ratio-weighted k3 (or plain k3 in the loss). Returns (loss, d loss / d logprobs)."""
    leaf = logprobs.detach().clone().requires_grad_(True)
    weights = None
    if threshold is not None:
        weights = stale_corrections.off_policy_sequence_mask(leaf, sampler, advantages, mask, threshold=threshold)
    loss, _ = losses.policy_loss(leaf, old, advantages, mask, eps_low=eps, eps_high=eps, agg=agg, is_weights=weights)
    if beta:
        terms = (kl.ratio_weighted_k3(leaf, old, ref, mask=mask) if bias_correction
                 else kl.kl_in_loss(leaf, ref, estimator="k3", mask=mask))
        loss = loss + beta * losses.aggregate(terms, mask, agg)
    loss.backward()
    return loss.detach(), leaf.grad


TRL_AGG = {"dapo": "token-mean", "grpo": "seq-mean-token-mean"}  # TRL's loss_type -> minirl's aggregation
TRL_LOSS_CASES = {  # name -> settings on top of GRPOConfig's defaults (loss_type "dapo", beta 0, bias correction on)
    "defaults": {},
    "defaults_beta": dict(beta=0.04),  # the default use_bias_correction_kl=True only acts once beta != 0
    "defaults_beta_mask": dict(beta=0.04, off_policy_mask_threshold=0.1),
    "mask_only": dict(off_policy_mask_threshold=0.05),
    "grpo_beta_mask": dict(loss_type="grpo", beta=0.1, off_policy_mask_threshold=0.1),
    "no_bias_correction": dict(beta=0.04, use_bias_correction_kl=False),
}


@pytest.mark.parametrize("case", list(TRL_LOSS_CASES))
def test_loss_and_gradient_equal_trls_compute_loss(case):
    """Loss and gradient (w.r.t. the token log-probs) equal to TRL 1.16's _compute_loss to 1e-6, off-policy (pi
    moved from pi_old, a stale sampler, ratios outside the clip band, padding), on GRPOConfig's defaults and with
    off_policy_mask_threshold and beta set; TRL's mask reads the sampler's log-probs (sampling_per_token_logps)."""
    for seed in range(3):
        batch = _random_batch(seed)
        loss_t, grad_t, args = _trl_compute_loss(*batch, **TRL_LOSS_CASES[case])
        assert args.epsilon_high is None or case != "defaults"
        loss_m, grad_m = _minirl_loss(*batch, agg=TRL_AGG[args.loss_type], beta=args.beta, eps=args.epsilon,
                                      threshold=args.off_policy_mask_threshold,
                                      bias_correction=args.use_bias_correction_kl)
        assert abs(float(loss_t - loss_m)) <= 1e-6, (seed, loss_t, loss_m)
        assert float((grad_t - grad_m).abs().max()) <= 1e-6, (seed, (grad_t - grad_m).abs().max())
        assert float(grad_m.abs().max()) > 1e-3


def test_trls_defaults_are_what_the_report_says():
    """TRL 1.16's GRPOConfig: use_bias_correction_kl on, but beta 0 (no KL term at all) and no off-policy mask, by
    default; loss_type "dapo" (token-mean), epsilon 0.2, token-level ratios; top_k 0 and top_p 1.0 (no
    truncation)."""
    trl = _trl()
    d = {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig)}
    assert (d["use_bias_correction_kl"], d["beta"], d["off_policy_mask_threshold"]) == (True, 0.0, None)
    assert (d["loss_type"], d["epsilon"], d["importance_sampling_level"]) == ("dapo", 0.2, "token")
    assert (d["top_k"], d["top_p"]) == (0, 1.0)


# ================================================================================ 3. stale rollouts
# paper-index: stale_corrections.decoupled_ppo_terms
def test_decoupled_ppo_terms_by_hand():
    prox, mu, mask, A = lp([-1.0, -1.0]), lp([-1.5, -1.5]), torch.ones(1, 2, **F64), torch.tensor([2.0], **F64)
    x = lp([-1.0, -0.5]).requires_grad_(True)
    out = stale_corrections.decoupled_ppo_terms(x, prox, mu, A, mask)
    # weight pi_prox / mu = e^0.5 = 1.648721 on both; token 0: r = 1, -2 * 1 * 1.648721 = -3.297443;
    # token 1: r = e^0.5 = 1.6487 > 1.2, clipped (A > 0): -2 * 1.2 * 1.648721 = -3.956931
    w = math.exp(0.5)
    torch.testing.assert_close(out, lp([-2 * w, -2 * 1.2 * w]), rtol=0, atol=1e-15)
    assert abs(float(out[0, 0].detach()) + 3.297443) < 5e-7 and abs(float(out[0, 1].detach()) + 3.956931) < 5e-7
    out.sum().backward()
    # d/dlog pi of -A w r = -A w r: token 0 -3.297443; token 1 clipped: 0
    torch.testing.assert_close(x.grad, lp([-2 * w, 0.0]), rtol=0, atol=1e-15)
    # weight_cap 1.5 < e^0.5: both tokens masked (AReaL's behav_imp_weight_cap); cap 2: unchanged
    assert stale_corrections.decoupled_ppo_terms(x, prox, mu, A, mask, weight_cap=1.5).tolist() == [[0.0, 0.0]]
    torch.testing.assert_close(stale_corrections.decoupled_ppo_terms(x, prox, mu, A, mask, weight_cap=2.0), out)
    # (B, T) advantages give the same as (B,) broadcast; A < 0 clips below: r = e^-0.5 = 0.61 < 0.8 -> -(-2) * 0.8 * w
    torch.testing.assert_close(stale_corrections.decoupled_ppo_terms(x, prox, mu, A[:, None].expand(1, 2), mask), out)
    y = lp([-1.5])
    torch.testing.assert_close(stale_corrections.decoupled_ppo_terms(y, lp([-1.0]), lp([-1.5]), -A, torch.ones(1, 1,
    **F64)),
                               lp([2 * 0.8 * w]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_decoupled_ppo_with_the_proximal_policy_as_sampler_is_ppos_token_loss(agg):
    """pi_prox = mu: the weight is exactly 1 and the terms are PPO's (losses.policy_loss, token level), value and
    gradient, with asymmetric clips and padding."""
    logprobs, old, _, _, advantages, mask = _random_batch(0, dtype=torch.float64)
    a, b = logprobs.clone().requires_grad_(True), logprobs.clone().requires_grad_(True)
    ours = losses.aggregate(stale_corrections.decoupled_ppo_terms(a, old, old.clone(), advantages, mask, eps_low=0.2,
                                                      eps_high=0.28), mask, agg)
    ppo, _ = losses.policy_loss(b, old, advantages, mask, eps_low=0.2, eps_high=0.28, agg=agg)
    torch.testing.assert_close(ours, ppo, rtol=0, atol=1e-14)
    ours.backward()
    ppo.backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-14)


def _bandit(seed=0, K=6, step=0.03):
    """A categorical bandit: fixed advantages A(a), a stale sampler mu, a proximal policy several updates later
    (moved towards the positive advantages, so pi_prox / mu > 1.2 on some of them), and pi a step after it (all its
    ratios pi / pi_prox inside [0.8, 1.2] when step is small)."""
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(K, generator=gen, **F64)
    theta_mu = torch.randn(K, generator=gen, **F64)
    theta_prox = theta_mu + 0.8 * A + 0.3 * torch.randn(K, generator=gen, **F64)  # stale: pi_prox / mu far from 1
    theta = theta_prox + step * torch.randn(K, generator=gen, **F64)
    return theta, theta_prox, theta_mu, A


def _expected_decoupled_gradient(theta, theta_prox, theta_behaviour, A, sample_from, **kw):
    """sum_a q(a) grad_theta decoupled_ppo_terms(a), q = softmax(sample_from): the exact mean gradient over the
    sampled actions, one one-token row per action."""
    t = theta.clone().requires_grad_(True)
    terms = stale_corrections.decoupled_ppo_terms(rows(t.log_softmax(-1)), rows(theta_prox.log_softmax(-1)),
                                      rows(theta_behaviour.log_softmax(-1)), A, torch.ones(len(A), 1, **F64), **kw)
    (sample_from.softmax(-1) * terms[:, 0]).sum().backward()
    return t.grad


# paper-index: stale_corrections.decoupled_ppo_terms
@pytest.mark.parametrize("seed", range(4))
def test_decoupled_ppo_exact_bandit_gradient(seed):
    """Enumeration on a K = 6 bandit with a stale sampler, through decoupled_ppo_terms. (1) The decoupled gradient
    under mu equals PPO's plain
    gradient under pi_prox, E_mu[sg(pi_prox / mu) grad L] = E_prox[grad L], at any theta. (2) Where every proximal
    ratio is inside its clip, it is the exact policy gradient -grad E_pi[A]. (3) The naive loss (clip pi / mu, no
    weight) is not: the staleness alone takes ratios out of the band and their actions lose their gradient.
    (4) Past the band (a large step), the clipped actions lose their gradient in the decoupled loss too."""
    theta, theta_prox, theta_mu, A = _bandit(seed)
    ratio = (theta.log_softmax(-1) - theta_prox.log_softmax(-1)).exp()
    assert ((ratio > 0.8) & (ratio < 1.2)).all()  # (2)'s premise
    decoupled = _expected_decoupled_gradient(theta, theta_prox, theta_mu, A, theta_mu)
    on_prox = _expected_decoupled_gradient(theta, theta_prox, theta_prox, A, theta_prox)  # weight 1: PPO
    torch.testing.assert_close(decoupled, on_prox, rtol=0, atol=1e-14)  # (1)
    t = theta.clone().requires_grad_(True)
    g_true, = torch.autograd.grad(-(t.softmax(-1) * A).sum(), t)  # minimise -E_pi[A]
    torch.testing.assert_close(decoupled, g_true, rtol=0, atol=1e-14)  # (2)
    naive = _expected_decoupled_gradient(theta, theta_mu, theta_mu, A, theta_mu)  # (3): mu as pi_old
    naive_ratio = (theta.log_softmax(-1) - theta_mu.log_softmax(-1)).exp()
    assert (((naive_ratio > 1.2) & (A > 0)) | ((naive_ratio < 0.8) & (A < 0))).any()  # clipped by staleness alone
    assert (naive - g_true).abs().max() > 1e-2
    far, far_prox, far_mu, far_A = _bandit(seed, step=1.0)  # (4)
    far_ratio = (far.log_softmax(-1) - far_prox.log_softmax(-1)).exp()
    clipped = ((far_ratio > 1.2) & (far_A > 0)) | ((far_ratio < 0.8) & (far_A < 0))
    assert clipped.any()
    g = _expected_decoupled_gradient(far, far_prox, far_mu, far_A, far_mu)
    torch.testing.assert_close(g, _expected_decoupled_gradient(far, far_prox, far_prox, far_A, far_prox), rtol=0,
                               atol=1e-14)
    t = far.clone().requires_grad_(True)
    g_far_true, = torch.autograd.grad(-(t.softmax(-1) * far_A).sum(), t)
    assert (g - g_far_true).abs().max() > 1e-3


def test_decoupled_ppo_padding_extreme_ratios_and_bad_settings():
    x = lp([-1.0, math.nan], [0.0, 0.0]).requires_grad_(True)
    prox, mu = lp([-1.0, -math.inf], [-70.0, 0.0]), lp([-61.0, math.nan], [0.0, 0.0])
    mask, A = lp([1, 0], [0, 0]), torch.tensor([1.0, -1.0], **F64)
    # weight e^60: continued linearly past 20 nats, finite
    out = stale_corrections.decoupled_ppo_terms(x, prox, mu, A, mask)
    assert torch.isfinite(out).all() and out[0, 1] == 0 and (out[1] == 0).all()  # a fully masked row: 0, no NaN
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[0, 1] == 0 and (x.grad[1] == 0).all()
    assert float(stale_corrections.decoupled_ppo_terms(x, prox, mu, A, mask, weight_cap=10.0)[0, 0].detach()) == 0.0
    full = torch.ones(2, 2, **F64)
    for kw, name in ((dict(eps_low=1.0), "eps_low"), (dict(eps_high=-0.1), "eps_high"),
                     (dict(weight_cap=0.0), "weight_cap")):
        with pytest.raises(ValueError, match=name):
            stale_corrections.decoupled_ppo_terms(x, prox, mu, A, mask, **kw)
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        stale_corrections.decoupled_ppo_terms(x.detach(), full, full.clone().fill_(math.nan), A, full)
    with pytest.raises(ValueError, match="advantages"):
        stale_corrections.decoupled_ppo_terms(x.detach(), full, full, torch.zeros(2, 3), full)


# paper-index: stale_corrections.staleness_kl
def test_staleness_kl_by_hand_and_against_mismatch_metrics():
    # log r = log pi - log mu = [0, -0.5]: (0 + e^-0.5 - 1 + 0.5) / 2 = 0.053265
    out = stale_corrections.staleness_kl(lp([-1.0, -1.0]), lp([-1.0, -1.5]), torch.ones(1, 2, **F64))
    torch.testing.assert_close(out, torch.tensor((math.exp(-0.5) - 0.5) / 2, **F64), rtol=0, atol=1e-15)
    assert abs(float(out) - 0.053265) < 5e-7
    logprobs, _, sampler, _, _, mask = _random_batch(2, dtype=torch.float64)
    metric = importance.mismatch_metrics(logprobs, sampler, mask)["k3"]
    assert abs(float(stale_corrections.staleness_kl(sampler, logprobs, mask)) - metric) < 1e-12
    # equal policies: exactly 0; no valid token: 0; padding (-inf, NaN) never read; 60 nats apart: finite
    assert float(stale_corrections.staleness_kl(logprobs, logprobs.clone(), mask)) == 0.0
    assert float(stale_corrections.staleness_kl(lp([math.nan]), lp([-math.inf]), lp([0]))) == 0.0
    assert math.isfinite(float(stale_corrections.staleness_kl(lp([-61.0]), lp([-1.0]), lp([1]))))
    with pytest.raises(ValueError, match="logprobs"):
        stale_corrections.staleness_kl(lp([0.0]), lp([math.nan]), lp([1]))
