"""Stale and truncated samplers (issue 37, the math): top-k / top-p kept sets and the renormalised trainer log-probs
(minirl.truncation), off-policy sequence masking, decoupled PPO and the staleness metric (minirl.stale), the
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

from minirl import importance, kl, kl_toy, losses, stale, truncation

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
