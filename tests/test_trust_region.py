"""DPPO's divergence masks and loss (minirl/trust_region.py): hand values, the mask's truth table, the exact
gradient on a categorical, edge cases, and equality with verl 0.9.1's ``dppo_tv`` / ``dppo_kl`` read from its
wheel (tests/extract_verl.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from minirl import aggregation, trust_region


def lp(*probs):
    return torch.tensor([list(probs)], dtype=torch.float64).log()


# paper-index: trust_region.binary_kl
def test_binary_kl_by_hand():
    # q = 0.5, p = 0.8: 0.5 ln(0.5 / 0.8) + 0.5 ln(0.5 / 0.2) = -0.2350018 + 0.4581454 = 0.2231436
    assert float(trust_region.binary_kl(lp(0.8), lp(0.5))) == pytest.approx(0.2231436, abs=1e-6)
    assert float(trust_region.binary_kl(lp(0.3), lp(0.3))) == pytest.approx(0.0, abs=1e-12)


# (p, q, A) -> kept?  delta 0.2 on both sides
TV_TABLE = [
    (0.8, 0.5, +1, 0),   # p rose 0.3 > 0.2 and A pushes it up: dropped
    (0.8, 0.5, -1, 1),   # A pushes it back down: kept
    (0.6, 0.5, +1, 1),   # rose 0.1 <= 0.2: kept
    (0.6, 0.5, -1, 1),
    (0.2, 0.5, -1, 0),   # fell 0.3 and A pushes it down: dropped
    (0.2, 0.5, +1, 1),   # A pushes it back up: kept
    (0.4, 0.5, -1, 1),   # fell 0.1: kept
    (0.4, 0.5, +1, 1),
]


# paper-index: trust_region.dppo_mask
@pytest.mark.parametrize("p,q,A,kept", TV_TABLE)
def test_dppo_tv_mask_truth_table(p, q, A, kept):
    mask = trust_region.dppo_mask(lp(p), lp(q), torch.tensor([[float(A)]]), divergence="tv")
    assert float(mask) == kept


# binary KL of (p, q): (0.8, 0.5) 0.2231 > 0.2; (0.6, 0.5) 0.0204; (0.2, 0.5) 0.2231; (0.4, 0.5) 0.0204
KL_TABLE = [(0.8, 0.5, +1, 0), (0.8, 0.5, -1, 1), (0.6, 0.5, +1, 1), (0.6, 0.5, -1, 1),
            (0.2, 0.5, -1, 0), (0.2, 0.5, +1, 1), (0.4, 0.5, -1, 1), (0.4, 0.5, +1, 1)]


@pytest.mark.parametrize("p,q,A,kept", KL_TABLE)
def test_dppo_kl_mask_truth_table(p, q, A, kept):
    mask = trust_region.dppo_mask(lp(p), lp(q), torch.tensor([[float(A)]]), divergence="kl")
    assert float(mask) == kept


def test_tv_and_kl_treat_a_rare_and_a_likely_token_differently_from_a_ratio():
    # both tokens doubled (r = 2): the rare one moved 0.001 in probability, the likely one 0.4
    rare = trust_region.dppo_mask(lp(0.002), lp(0.001), torch.ones(1, 1), divergence="tv")
    likely = trust_region.dppo_mask(lp(0.8), lp(0.4), torch.ones(1, 1), divergence="tv")
    assert float(rare) == 1 and float(likely) == 0


# paper-index: trust_region.dppo_loss
def test_dppo_loss_by_hand():
    # q = 0.5, p = 0.8, r = 1.6, A = -1: kept; L = -(-1) * 1.6 * ln 0.8 = -0.3570302; dL/dlogpi = -A * 1.6 = 1.6
    logprobs = lp(0.8).requires_grad_(True)
    loss, stats = trust_region.dppo_loss(logprobs, lp(0.5), torch.tensor([-1.0], dtype=torch.float64),
                                         torch.ones(1, 1), divergence="tv")
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-0.3570302, abs=1e-6) and float(logprobs.grad) == pytest.approx(1.6)
    assert stats["dppo_masked_frac"] == 0
    # A = +1: dropped, no loss, no gradient
    logprobs = lp(0.8).requires_grad_(True)
    loss, stats = trust_region.dppo_loss(logprobs, lp(0.5), torch.tensor([1.0], dtype=torch.float64),
                                         torch.ones(1, 1), divergence="tv")
    loss.backward()
    assert float(loss.detach()) == 0 and float(logprobs.grad) == 0 and stats["dppo_masked_frac"] == 1


def test_the_cap_weights_the_gradient_by_C_not_r():
    # r = e^3 = 20.09 > C = 5: weight 5; A = -1 keeps a token that rose (TV's sign rule), gradient -A * 5 = 5
    logprobs = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    loss, stats = trust_region.dppo_loss(logprobs, torch.tensor([[-4.0]], dtype=torch.float64),
                                         torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1), is_cap=5.0)
    loss.backward()
    assert float(logprobs.grad) == pytest.approx(5.0) and stats["capped_frac"] == 1


def test_the_expected_gradient_under_the_sampler_is_the_exact_policy_gradient_inside_the_region():
    # a categorical over 6 tokens: pi = softmax(theta), the sampler mu near it; with deltas the tokens stay inside,
    # sum_y mu(y) * grad L(y) = -grad sum_y pi(y) A(y) (REINFORCE with r = pi / mu: unbiased)
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=g, dtype=torch.float64)
    mu_logits = theta + 0.05 * torch.randn(6, generator=g, dtype=torch.float64)
    A = torch.randn(6, generator=g, dtype=torch.float64)
    t = theta.clone().requires_grad_(True)
    logprobs = t.log_softmax(-1)[:, None]  # one row per token y
    old = mu_logits.log_softmax(-1)[:, None]
    per_row_weight = old.exp().squeeze(1)  # mu(y): the expectation over the sampler, as a weighted sum of rows
    loss, stats = trust_region.dppo_loss(logprobs, old, A * per_row_weight, torch.ones(6, 1, dtype=torch.float64),
                                         divergence="kl", delta_low=0.05, delta_high=0.05, agg="seq-mean-token-sum")
    assert stats["dppo_masked_frac"] == 0
    (6 * loss).backward()  # seq-mean divides by the 6 rows
    t2 = theta.clone().requires_grad_(True)
    exact = torch.autograd.grad(-(t2.softmax(-1) * A).sum(), t2)[0]
    assert torch.allclose(t.grad, exact, atol=1e-12)


def test_edge_cases_masked_rows_extreme_ratios_and_padding():
    logprobs = torch.tensor([[-1.0, -math.inf], [0.0, -60.0], [-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.2, math.nan], [-60.0, 0.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # row 2 fully masked; padding holds -inf and NaN
    for divergence in ("tv", "kl"):
        loss, stats = trust_region.dppo_loss(logprobs, old, torch.tensor([1.0, -1.0, 2.0]), mask,
                                             divergence=divergence, agg="seq-mean-token-mean")
        (grad,) = torch.autograd.grad(loss, logprobs)
        assert torch.isfinite(loss) and torch.isfinite(grad).all() and (grad[2] == 0).all() and grad[0, 1] == 0
        assert all(math.isfinite(v) for v in stats.values())


def test_bad_settings_are_refused_naming_them():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="divergence"):
        trust_region.dppo_mask(x, x, x, divergence="js")
    with pytest.raises(ValueError, match="delta"):
        trust_region.dppo_mask(x, x, x, delta_low=-0.1)
    with pytest.raises(ValueError, match="is_cap"):
        trust_region.dppo_loss(x, x, x, x, is_cap=0.0)
    with pytest.raises(ValueError, match="advantages"):
        trust_region.dppo_loss(x, x, torch.zeros(2), x)


# --- equality with verl 0.9.1 (its functions, from the wheel) ------------------------------------------------------
@pytest.fixture(scope="module")
def verl():
    import extract_verl

    namespace = extract_verl.functions()
    return SimpleNamespace(tv=namespace["compute_policy_loss_dppo_tv"], kl=namespace["compute_policy_loss_dppo_kl"])


class VerlConfig(SimpleNamespace):
    def get(self, key, default=None):  # verl's config is a dict-like dataclass
        return getattr(self, key, default)


@pytest.mark.parametrize("divergence", ["tv", "kl"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("deltas", [(0.2, 0.2), (0.05, 0.1)])
def test_dppo_loss_and_gradient_match_verl_091(verl, divergence, agg, seed, deltas):
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(5, 7, generator=g) * 1.5
    old = logprobs + (torch.rand(5, 7, generator=g) - 0.5) * 2.4  # up to +-1.2 nats: some tokens leave the region
    mask = (torch.arange(7)[None] < torch.tensor([7, 5, 3, 0, 6])[:, None]).float()
    adv = (torch.randn(5, generator=g) * 1.5)[:, None].expand(5, 7).contiguous()
    lp_v, lp_m = logprobs.clone().requires_grad_(True), logprobs.clone().requires_grad_(True)
    cfg = VerlConfig(clip_ratio=deltas[0], clip_ratio_low=deltas[0], clip_ratio_high=deltas[1], global_batch_info={})
    loss_v, metrics = getattr(verl, divergence)(old, lp_v, adv, mask, loss_agg_mode=agg, config=cfg)
    loss_m, stats = trust_region.dppo_loss(lp_m, old, adv, mask, divergence=divergence, delta_low=deltas[0],
                                           delta_high=deltas[1], agg=agg)
    assert float(loss_m.detach()) == pytest.approx(float(loss_v.detach()), abs=1e-6)
    loss_v.backward(), loss_m.backward()
    assert torch.allclose(lp_m.grad, lp_v.grad, atol=1e-6)
    assert stats["dppo_masked_frac"] == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-6)
    assert 0 < stats["dppo_masked_frac"] < 1  # the inputs put some tokens outside the region, not all


def test_aggregation_is_the_librarys():
    assert trust_region.aggregate is aggregation.aggregate


# paper-index: trust_region.sampler_log_ratio_penalty
def test_the_kimi_term_and_its_gradient_by_hand():
    # log pi = -1.0, log mu = -1.5, tau 1e-3: 1e-3 * 0.5^2 = 2.5e-4; gradient 2 * 1e-3 * 0.5 = 1e-3; on-policy 0 and 0
    logprobs = torch.tensor([[-1.0, -2.0, -7.0]], dtype=torch.float64, requires_grad=True)
    sampler = torch.tensor([[-1.5, -2.0, math.nan]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)  # the padding's NaN is never read
    terms = trust_region.sampler_log_ratio_penalty(logprobs, sampler, mask, tau=1e-3)
    terms.sum().backward()
    assert terms.detach()[0].tolist() == pytest.approx([2.5e-4, 0.0, 0.0])
    assert logprobs.grad[0].tolist() == pytest.approx([1e-3, 0.0, 0.0])
    with pytest.raises(ValueError, match="tau"):
        trust_region.sampler_log_ratio_penalty(logprobs, sampler, mask, tau=-1.0)
