"""Tests of minirl.entropy (the covariance term, Clip-Cov, KL-Cov, the top-entropy mask, the entropy bonus and its
adaptive coefficient, pass@k) and minirl.entropy_toy (the entropy change of one step on a softmax bandit).

Hand values carry their arithmetic; the engines' own functions are run on the same inputs: TRL 1.16's
``GRPOTrainer.get_high_entropy_mask`` (installed), and verl 0.9.1's ``compute_policy_loss_clip_cov`` /
``compute_policy_loss_kl_cov``, which tests/extract_verl.py reads out of the wheel."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from helpers import close as _close

from minirl import entropy, entropy_toy, losses

close = partial(_close, atol=5e-7)
LN2 = math.log(2)
D = torch.float64


# --- the covariance term -------------------------------------------------------------------------------------------
# paper-index: entropy.token_covariance
def test_token_covariance_by_hand():
    # pi = 1/2, 1/2, 1/4, 1/4: mean log-prob (-ln2 - ln2 - 2ln2 - 2ln2)/4 = -1.5 ln2; mean advantage 0;
    # each term (+-0.5 ln2) * (+-0.5) = 0.25 ln2 = 0.173287; the second row is padding (never read)
    logprobs = torch.tensor([[-LN2, -LN2, -2 * LN2, -2 * LN2], [-math.inf, math.nan, 0.0, 0.0]], dtype=D)
    advantages = torch.tensor([[0.5, 0.5, -0.5, -0.5], [math.nan, 1.0, 2.0, 3.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])
    cov = entropy.token_covariance(logprobs, advantages, mask)
    close(cov, [[0.25 * LN2] * 4, [0.0] * 4])
    close(cov.sum() / 4, 0.173287)  # the batch covariance Cov(log pi, A)
    # advantages (B,), one per sequence: the same as repeating each over its tokens
    seq = torch.tensor([2.0, -1.0], dtype=D)
    lp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], dtype=D)
    both = torch.ones(2, 2)
    # mean log-prob -2.5, mean advantage (2 + 2 - 1 - 1)/4 = 0.5: [[1.5 * 1.5, 0.5 * 1.5], [-0.5 * -1.5, -1.5 * -1.5]]
    close(entropy.token_covariance(lp, seq, both), [[2.25, 0.75], [0.75, 2.25]])
    close(entropy.token_covariance(lp, seq, both), entropy.token_covariance(lp, seq[:, None].expand(2, 2), both))


def test_token_covariance_fully_masked_batch_is_zero_not_nan_and_shapes_are_checked():
    cov = entropy.token_covariance(torch.full((2, 3), -math.inf), torch.zeros(2), torch.zeros(2, 3))
    assert torch.equal(cov, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        entropy.token_covariance(torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        entropy.token_covariance(torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 4))


# --- Clip-Cov -------------------------------------------------------------------------------------------------------
def _clip_cov_example():
    """One row of 4 valid tokens and one fully masked row (padding -inf / NaN).

    log-probs [0, 0, -4, -4] (mean -2, centred [2, 2, -2, -2]); advantages [2, 0.5, -0.5, -2] (mean 0);
    covariances [4, 1, 1, 4]. Token 0 moved: old log-prob -0.5, so r = e^0.5 = 1.648721 > 1.2 with A > 0, PPO's
    clip holds it. The others are on-policy (r = 1)."""
    logprobs = torch.tensor([[0.0, 0.0, -4.0, -4.0], [-math.inf] * 4], dtype=D, requires_grad=True)
    old = torch.tensor([[-0.5, 0.0, -4.0, -4.0], [-math.inf] * 4], dtype=D)
    advantages = torch.tensor([[2.0, 0.5, -0.5, -2.0], [math.nan] * 4], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])
    return logprobs, old, advantages, mask


# paper-index: entropy.clip_cov_mask
def test_clip_cov_mask_by_hand():
    logprobs, old, advantages, mask = _clip_cov_example()
    close(entropy.token_covariance(logprobs, advantages, mask)[0], [4.0, 1.0, 1.0, 4.0])
    # candidates, band (1, 5) strict: token 0 is PPO-clipped, tokens 1 and 2 sit ON the lower bound (1 is not > 1),
    # token 3 (cov 4) is the only one; fraction 0.5 of N = 4 allows 2, there is 1
    sel = entropy.clip_cov_mask(logprobs, old, advantages, mask, fraction=0.5)
    assert sel.tolist() == [[False, False, False, True], [False] * 4]
    # a band from 0.5 takes tokens 1 and 2 in as well: 3 candidates, max(1, floor(0.5 * 4)) = 2 stopped
    wide = entropy.clip_cov_mask(logprobs, old, advantages, mask, fraction=0.5, cov_low=0.5)
    assert int(wide.sum()) == 2 and not wide[0, 0] and not wide[1].any()
    # an upper bound of 4 leaves no candidate: nothing is stopped
    assert not entropy.clip_cov_mask(logprobs, old, advantages, mask, fraction=0.5, cov_high=4.0).any()
    # with eps_high 0.7 (1.648721 < 1.7) token 0 is no longer clipped and becomes a candidate (cov 4)
    loose = entropy.clip_cov_mask(logprobs, old, advantages, mask, fraction=0.5, eps_high=0.7)
    assert loose[0].tolist() == [True, False, False, True]


def test_clip_cov_mask_counts_and_randomness():
    # 8 tokens, all with covariance (+-2) * (+-1.5) = 3 inside (1, 5), on-policy
    logprobs = torch.tensor([[0.0] * 4 + [-4.0] * 4], dtype=D)
    advantages = torch.tensor([[1.5] * 4 + [-1.5] * 4], dtype=D)
    mask = torch.ones(1, 8)

    def pick(fraction, seed):
        return entropy.clip_cov_mask(logprobs, logprobs, advantages, mask, fraction=fraction,
                                     generator=torch.Generator().manual_seed(seed))

    assert int(pick(0.25, 0).sum()) == 2  # floor(0.25 * 8) = 2
    assert int(pick(1e-4, 0).sum()) == 1  # floor(8e-4) = 0 -> at least 1
    assert int(pick(1.0, 0).sum()) == 8
    assert torch.equal(pick(0.25, 7), pick(0.25, 7))  # the generator decides the draw
    assert len({tuple(pick(0.25, s).nonzero()[:, 1].tolist()) for s in range(20)}) > 1  # and it is a draw
    torch.manual_seed(3)
    default = entropy.clip_cov_mask(logprobs, logprobs, advantages, mask, fraction=0.25)
    assert torch.equal(default, pick(0.25, 3))  # generator None: torch's global generator, as verl
    for bad in ({"fraction": 0.0}, {"fraction": 1.5}, {"cov_low": 5.0}, {"eps_low": -0.1}):
        with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
            entropy.clip_cov_mask(logprobs, logprobs, advantages, mask, **bad)


# paper-index: entropy.clip_cov_token_loss
def test_clip_cov_token_loss_by_hand():
    logprobs, old, advantages, mask = _clip_cov_example()
    per_token, stats = entropy.clip_cov_token_loss(logprobs, old, advantages, mask, fraction=0.5)
    # token 0: max(-2 * 1.648721, -2 * 1.2) = -2.4 (clipped); token 1: -0.5 * 1; token 2: +0.5 * 1;
    # token 3: stopped by Clip-Cov, 0 instead of +2
    close(per_token, [[-2.4, -0.5, 0.5, 0.0], [0.0] * 4])
    loss = losses.aggregate(per_token, mask, "token-mean")
    close(loss, (-2.4 - 0.5 + 0.5 + 0.0) / 4)  # = -0.6
    loss.backward()
    # d/d logprob of -A r / 4 is -A / 4 where unclipped (r = 1): token 1 -0.125, token 2 +0.125; 0 on the clipped
    # token 0 and the stopped token 3; 0 (not NaN) on the padding
    close(logprobs.grad, [[0.0, -0.125, 0.125, 0.0], [0.0] * 4])
    # clip_cov_frac 1/4; covariance mean(4, 1, 1, 4) = 2.5; approx_kl mean(old - new) = (-0.5 + 0 + 0 + 0)/4
    assert stats == pytest.approx({"clip_cov_frac": 0.25, "covariance": 2.5, "approx_kl": -0.125})


# --- KL-Cov ---------------------------------------------------------------------------------------------------------
# paper-index: entropy.kl_cov_mask
def test_kl_cov_mask_by_hand():
    # log-probs [0, -1, -3, -4] (mean -2, centred [2, 1, -1, -2]), advantages [1, 3, -1, -3] (mean 0):
    # covariances [2, 3, 1, 6]
    logprobs = torch.tensor([[0.0, -1.0, -3.0, -4.0, -math.inf]], dtype=D)
    advantages = torch.tensor([[1.0, 3.0, -1.0, -3.0, math.nan]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    close(entropy.token_covariance(logprobs, advantages, mask), [[2.0, 3.0, 1.0, 6.0, 0.0]])
    assert entropy.kl_cov_mask(logprobs, advantages, mask, fraction=0.5)[0].tolist() == [False, True, False, True,
                                                                                         False]  # top 2 of 4
    assert entropy.kl_cov_mask(logprobs, advantages, mask, fraction=1e-4)[0].tolist() == [False, False, False, True,
                                                                                          False]  # at least 1
    assert not entropy.kl_cov_mask(logprobs, advantages, torch.zeros_like(mask), fraction=0.5).any()
    # every covariance 0 (all advantages equal): KL-Cov still penalises its max(1, floor(0.5 * 4)) = 2 tokens
    tied = entropy.kl_cov_mask(logprobs, torch.ones_like(advantages), mask, fraction=0.5)
    assert int(tied.sum()) == 2 and not tied[0, 4]
    with pytest.raises(ValueError, match="fraction"):
        entropy.kl_cov_mask(logprobs, advantages, mask, fraction=0.0)


# paper-index: entropy.kl_cov_token_loss
def test_kl_cov_token_loss_by_hand():
    # log-probs [0, -1, -5] (mean -2, centred [2, 1, -3]), advantages [1, -1, 0] (mean 0): covariances [2, -1, 0],
    # so with fraction 0.4 (floor(1.2) = 1 token) token 0 is penalised. Its log-ratio is 0.1 (old -0.1).
    logprobs = torch.tensor([[0.0, -1.0, -5.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[-0.1, -1.0, -5.0]], dtype=D)
    advantages = torch.tensor([1.0, -1.0, 0.0], dtype=D)[None]
    mask = torch.ones(1, 3)
    per_token, stats = entropy.kl_cov_token_loss(logprobs, old, advantages, mask, fraction=0.4, kl_coef=1.0)
    # token 0: -1 * e^0.1 + 1 * |0.1| = -1.105171 + 0.1 = -1.005171; token 1: -(-1) * 1 = 1; token 2: 0
    close(per_token, [[-1.005171, 1.0, 0.0]])
    losses.aggregate(per_token, mask, "token-mean").backward()
    # gradients / 3 tokens: token 0 (-e^0.1 + 1)/3 = -0.035057; token 1 +1/3; token 2 0 (no clip anywhere)
    close(logprobs.grad, [[(-math.exp(0.1) + 1) / 3, 1 / 3, 0.0]])
    assert stats == pytest.approx({"kl_cov_frac": 1 / 3, "covariance": (2 - 1 + 0) / 3, "abs_kl": 0.1 / 3})
    with pytest.raises(ValueError, match="kl_coef"):
        entropy.kl_cov_token_loss(logprobs, old, advantages, mask, kl_coef=-1.0)


# --- equality with verl 0.9.1 (its functions, from the wheel) ------------------------------------------------------
@pytest.fixture(scope="module")
def verl():
    """verl 0.9.1's functions, read from its wheel (tests/extract_verl.py) and executed with torch and stand-ins."""
    import extract_verl

    namespace = extract_verl.functions()
    return SimpleNamespace(clip_cov=namespace["compute_policy_loss_clip_cov"],
                           kl_cov=namespace["compute_policy_loss_kl_cov"], agg_loss=namespace["agg_loss"])


def _verl_config(eps_low=0.2, eps_high=0.28, **policy_loss):
    fields = dict(clip_cov_ratio=None, clip_cov_lb=None, clip_cov_ub=None, kl_cov_ratio=None, ppo_kl_coef=None)
    return SimpleNamespace(clip_ratio=eps_low, clip_ratio_low=eps_low, clip_ratio_high=eps_high,
                           policy_loss=SimpleNamespace(**{**fields, **policy_loss}), global_batch_info={})


def _shared_inputs(seed, tied_advantages=False):
    """Random (B=5, T=7) float32 inputs with ragged prefix masks and one fully masked row; old log-probs off by up
    to +-0.4 nats, so PPO's clip holds some tokens; covariances of order 1, so the bands hold several."""
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(5, 7, generator=g) * 4
    old = logprobs + (torch.rand(5, 7, generator=g) - 0.5) * 0.8
    lengths = torch.tensor([7, 5, 3, 0, 6])
    mask = (torch.arange(7)[None] < lengths[:, None]).float()
    adv = torch.full((5,), 0.7) if tied_advantages else torch.randn(5, generator=g) * 1.5
    return logprobs, old, adv[:, None].expand(5, 7).contiguous(), mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("band", [(1.0, 5.0, 0.2), (0.05, 2.0, 0.3), (0.0, 50.0, 1e-4)])
def test_clip_cov_loss_and_gradient_match_verl_091(verl, seed, agg, band):
    cov_low, cov_high, fraction = band
    logprobs, old, adv, mask = _shared_inputs(seed)
    lp_verl, lp_ours = logprobs.clone().requires_grad_(True), logprobs.clone().requires_grad_(True)
    torch.manual_seed(100 + seed)  # verl draws with torch's global generator
    loss_v, metrics = verl.clip_cov(old, lp_verl, adv, mask, loss_agg_mode=agg, config=_verl_config(
        clip_cov_ratio=fraction, clip_cov_lb=cov_low, clip_cov_ub=cov_high))
    per_token, stats = entropy.clip_cov_token_loss(lp_ours, old, adv, mask, fraction=fraction, cov_low=cov_low,
                                                   cov_high=cov_high, eps_low=0.2, eps_high=0.28,
                                                   generator=torch.Generator().manual_seed(100 + seed))
    loss_m = losses.aggregate(per_token, mask, agg)
    close(loss_m, loss_v, atol=1e-6)
    loss_v.backward(), loss_m.backward()
    close(lp_ours.grad, lp_verl.grad, atol=1e-6)  # the same tokens stopped (their gradient is 0 in both)
    assert stats["clip_cov_frac"] == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-6)
    assert stats["approx_kl"] == pytest.approx(metrics["actor/ppo_kl"], abs=1e-6)
    assert stats["clip_cov_frac"] > 0  # each band stops at least one token of these inputs


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fraction,tied", [(0.2, False), (1e-4, False), (0.5, False), (0.2, True)])
def test_kl_cov_loss_and_gradient_match_verl_091(verl, seed, agg, fraction, tied):
    logprobs, old, adv, mask = _shared_inputs(seed, tied_advantages=tied)  # tied: every covariance 0
    lp_verl, lp_ours = logprobs.clone().requires_grad_(True), logprobs.clone().requires_grad_(True)
    loss_v, metrics = verl.kl_cov(old, lp_verl, adv, mask, loss_agg_mode=agg,
                                  config=_verl_config(kl_cov_ratio=fraction, ppo_kl_coef=0.5))
    per_token, stats = entropy.kl_cov_token_loss(lp_ours, old, adv, mask, fraction=fraction, kl_coef=0.5)
    loss_m = losses.aggregate(per_token, mask, agg)
    close(loss_m, loss_v, atol=1e-6)
    loss_v.backward(), loss_m.backward()
    close(lp_ours.grad, lp_verl.grad, atol=1e-6)
    assert stats["abs_kl"] == pytest.approx(metrics["actor/ppo_kl"], abs=1e-6)
    n = int(mask.sum())
    assert stats["kl_cov_frac"] == pytest.approx(max(1, int(n * fraction)) / n)


# --- high-entropy tokens --------------------------------------------------------------------------------------------
# paper-index: entropy.top_entropy_mask
def test_top_entropy_mask_by_hand():
    e = torch.tensor([[0.1, 0.5, 0.9, 7.0], [1.3, 1.7, math.nan, math.inf]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])  # valid entropies 0.1, 0.5, 0.9, 1.3, 1.7
    # top_fraction 0.5: the 0.5 quantile of 5 sorted values is the 3rd, 0.9: kept 0.9 (tie), 1.3, 1.7
    assert entropy.top_entropy_mask(e, mask, top_fraction=0.5).tolist() == [[False, False, True, False],
                                                                             [True, True, False, False]]
    # top_fraction 0.2: the 0.8 quantile is at position 0.8 * 4 = 3.2: 1.3 + 0.2 * (1.7 - 1.3) = 1.38: only 1.7
    assert entropy.top_entropy_mask(e, mask, top_fraction=0.2).tolist() == [[False] * 4, [False, True, False, False]]


def test_top_entropy_mask_ties_and_edges():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    equal = torch.full((2, 3), 0.7)
    for rho in (0.0, 0.2, 1.0):  # all-equal entropies: the quantile is 0.7 and every valid token ties with it
        assert torch.equal(entropy.top_entropy_mask(equal, mask, top_fraction=rho), mask.bool())
    e = torch.tensor([[0.2, 0.9, 0.9], [0.4, 0.1, 5.0]])
    assert entropy.top_entropy_mask(e, mask, top_fraction=0.0).tolist() == [[False, True, True],
                                                                            [False, False, False]]  # the max, tied
    assert torch.equal(entropy.top_entropy_mask(e, mask, top_fraction=1.0), mask.bool())  # the min is kept too
    assert not entropy.top_entropy_mask(e, torch.zeros(2, 3), top_fraction=0.2).any()  # fully masked: none, no NaN
    with pytest.raises(ValueError, match="top_fraction"):
        entropy.top_entropy_mask(e, mask, top_fraction=1.2)


def test_top_entropy_mask_in_float64_keeps_every_token_at_top_fraction_1():
    """Issue 47 item 6: the quantile was taken in float32 and compared in float64, so the lowest entropy, rounded up
    to its float32 neighbour, lay below the threshold and was dropped (4 of 5 kept)."""
    e = torch.tensor([[0.1, 0.5, 0.9, 1.3, 1.7]], dtype=torch.float64)  # 0.1 is not a float32 number
    assert torch.tensor(0.1, dtype=torch.float32).double() > 0.1  # the rounding that dropped it
    mask = torch.ones_like(e)
    assert entropy.top_entropy_mask(e, mask, top_fraction=1.0).sum().item() == 5
    assert entropy.top_entropy_mask(e, mask, top_fraction=0.0).tolist() == [[False] * 4 + [True]]
    assert entropy.top_entropy_mask(e, mask, top_fraction=0.5).tolist() == [[False, False, True, True, True]]


@pytest.fixture(scope="module")
def trl_high_entropy_mask():
    from accelerate import Accelerator
    from trl import GRPOTrainer

    trainer = SimpleNamespace(accelerator=Accelerator(cpu=True))  # the one attribute the method reads
    return lambda entropies, mask, threshold: GRPOTrainer.get_high_entropy_mask(trainer, entropies, mask, threshold)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_top_entropy_mask_equals_trl_116(trl_high_entropy_mask, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    e = (torch.rand(6, 9, generator=g) * 3).to(dtype)
    e[:, ::3] = e[:, 1:2]  # ties within rows
    if seed % 2:
        e = (e * 4).round() / 4  # coarse values: many ties across the batch
    mask = (torch.arange(9)[None] < torch.tensor([9, 4, 0, 7, 1, 8])[:, None]).float()
    for rho in (0.0, 0.2, 0.5, 0.9, 1.0):
        ours = entropy.top_entropy_mask(e, mask, top_fraction=rho)
        theirs = trl_high_entropy_mask(e, mask, 1 - rho)  # TRL passes 1 - top_entropy_quantile
        assert torch.equal(ours, theirs), (rho, ours, theirs)
    empty = torch.zeros_like(mask)
    assert torch.equal(entropy.top_entropy_mask(e, empty, top_fraction=0.2), trl_high_entropy_mask(e, empty, 0.8))


# --- the entropy bonus and its adaptive coefficient -----------------------------------------------------------------
# paper-index: entropy.entropy_bonus
def test_entropy_bonus_by_hand():
    h = torch.tensor([[1.0, 2.0, 3.0], [4.0, math.inf, math.nan]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    bonus = entropy.entropy_bonus(h, mask, coef=0.01)
    close(bonus, -0.01 * (1 + 2 + 3 + 4) / 4)  # token-mean 2.5 -> -0.025
    close(entropy.entropy_bonus(h, mask, coef=0.01, agg="seq-mean-token-mean"), -0.01 * (2 + 4) / 2)  # -0.03
    bonus.backward()
    close(h.grad, [[-0.0025, -0.0025, -0.0025], [-0.0025, 0.0, 0.0]])  # -coef / 4 tokens; padding 0, not NaN
    assert float(entropy.entropy_bonus(h.detach(), torch.zeros(2, 3), coef=0.01)) == 0.0  # fully masked: 0


@pytest.mark.parametrize("agg", entropy.AGGREGATIONS)
def test_entropy_bonus_is_minus_coef_times_losses_aggregate(agg):
    assert entropy.AGGREGATIONS == losses.AGGREGATIONS
    g = torch.Generator().manual_seed(0)
    h = torch.rand(4, 6, generator=g, dtype=D) * 2
    mask = (torch.arange(6)[None] < torch.tensor([6, 2, 0, 5])[:, None]).to(D)
    close(entropy.entropy_bonus(h, mask, coef=0.3, agg=agg, max_tokens=8),
          -0.3 * losses.aggregate(h, mask, agg, max_tokens=8), atol=1e-12)
    with pytest.raises(ValueError, match="aggregation"):
        entropy.entropy_bonus(h, mask, coef=0.3, agg="sum")


@pytest.mark.parametrize("agg", entropy.AGGREGATIONS)
def test_entropy_bonus_matches_verl_091(verl, agg):
    """verl subtracts entropy_coeff * agg_loss(entropy, mask, the loss's mode) (verl/workers/utils/losses.py);
    its seq-mean-token-sum-norm divides by T (loss_scale_factor None)."""
    g = torch.Generator().manual_seed(1)
    h = torch.rand(4, 6, generator=g) * 2
    mask = (torch.arange(6)[None] < torch.tensor([6, 2, 0, 5])[:, None]).float()
    close(entropy.entropy_bonus(h, mask, coef=0.3, agg=agg), -0.3 * verl.agg_loss(h, mask, agg), atol=1e-6)


# paper-index: entropy.adaptive_entropy_coef entropy.entropy_coef_in_use
def test_adaptive_entropy_coef_follows_trls_rule_by_hand():
    # target 0.5, delta 0.1, coef 0, as TRL's controller: the coefficient in use comes from the previous step's
    # entropy (inf before the first step), the update from this step's
    coef, last, applied, coefs = 0.0, math.inf, [], []
    for measured in (0.8, 0.4, 0.3, 0.6, 0.5):
        applied.append(entropy.entropy_coef_in_use(coef, last, target=0.5))
        coef = entropy.adaptive_entropy_coef(coef, measured, target=0.5, delta=0.1)
        coefs.append(coef)
        last = measured
    # 0.8 > 0.5: max(0 - 0.1, 0) = 0; 0.4: 0.1; 0.3: 0.2; 0.6: 0.1; 0.5 (at the target) increases: 0.2
    assert coefs == pytest.approx([0.0, 0.1, 0.2, 0.1, 0.2])
    # in use: inf -> 0; 0.8 -> 0; 0.4 -> 0.1; 0.3 -> 0.2; 0.6 -> 0
    assert applied == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.0])
    assert entropy.adaptive_entropy_coef(0.95, 0.1, target=0.5, delta=0.1) == 1.0  # capped at coef_max
    for bad, match in (({"delta": -0.1}, "delta"), ({"delta": 0.1, "coef_min": 2.0}, "coef_min")):
        with pytest.raises(ValueError, match=match):
            entropy.adaptive_entropy_coef(0.1, 0.3, target=0.5, **bad)
    with pytest.raises(ValueError, match="NaN"):
        entropy.adaptive_entropy_coef(0.1, math.nan, target=0.5, delta=0.1)


# --- pass@k ---------------------------------------------------------------------------------------------------------
# paper-index: entropy.pass_at_k entropy.mean_pass_at_k
def test_pass_at_k_by_hand():
    # n = 5, c = 2, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10 = 0.7; product form 1 - (1 - 2/4)(1 - 2/5) = 0.7
    assert float(entropy.pass_at_k(5, 2, 2)) == pytest.approx(0.7, abs=1e-15)
    # c = 0 -> 0; c = n -> 1; k = 1 -> c / n = 3/8; k = n with one correct -> 1; n - c < k -> exactly 1
    out = entropy.pass_at_k([5, 5, 8, 4, 6], [0, 5, 3, 1, 4], 1)
    assert out.dtype == torch.float64 and out.tolist() == pytest.approx([0.0, 1.0, 3 / 8, 1 / 4, 4 / 6], abs=1e-15)
    assert float(entropy.pass_at_k(4, 1, 4)) == 1.0 and float(entropy.pass_at_k(6, 4, 3)) == 1.0
    assert entropy.mean_pass_at_k([5, 5], [2, 0], 2) == pytest.approx((0.7 + 0.0) / 2, abs=1e-15)  # 0.35
    assert entropy.pass_at_k(torch.tensor([[5]]), torch.tensor([[2]]), 2).shape == (1, 1)


def test_pass_at_k_equals_the_exact_binomials_and_is_stable_at_large_n():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 60, (), generator=g))
        c, k = int(torch.randint(0, n + 1, (), generator=g)), int(torch.randint(1, n + 1, (), generator=g))
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert float(entropy.pass_at_k(n, c, k)) == pytest.approx(float(exact), abs=1e-12)
    # C(2000, 500) ~ 1e486 overflows float64; the product does not
    exact = 1 - Fraction(math.comb(1990, 500), math.comb(2000, 500))
    value = float(entropy.pass_at_k(2000, 10, 500))
    assert math.isfinite(value) and value == pytest.approx(float(exact), abs=1e-12)
    with pytest.raises(OverflowError):
        float(math.comb(2000, 500))


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="k = 6 exceeds num_samples"):
        entropy.pass_at_k([5, 8], [1, 1], 6)
    for args, match in (((5, 2, 0), "k must be"), ((5, 6, 2), "num_correct"), ((5, -1, 2), "num_correct"),
                        ((5.0, 2, 2), "integer"), (([5, 5], [1], 2), "shape")):
        with pytest.raises(ValueError, match=match):
            entropy.pass_at_k(*args)
    with pytest.raises(ValueError, match="empty"):
        entropy.mean_pass_at_k([], [], 1)


# --- the exact toy: one step on a softmax bandit --------------------------------------------------------------------
Z = torch.tensor([LN2, 0.0, 0.0], dtype=D)  # pi = [1/2, 1/4, 1/4]
LIKELY_GOOD = torch.tensor([1.0, 0.0, 0.0], dtype=D)  # the likely arm is rewarded
RARE_GOOD = torch.tensor([0.0, 1.0, 0.0], dtype=D)  # a rare arm is rewarded


def test_toy_entropy_advantages_and_steps_by_hand():
    close(entropy_toy.softmax_entropy(Z), 1.5 * LN2)  # 1/2 ln2 + 2 * 1/4 ln4 = 1.039721
    close(entropy_toy.bandit_advantages(Z, LIKELY_GOOD), [0.5, -0.5, -0.5])  # E r = 1/2
    close(entropy_toy.logit_step(Z, LIKELY_GOOD, step=0.1), [0.05, -0.05, -0.05])  # natural: 0.1 * A
    close(entropy_toy.logit_step(Z, LIKELY_GOOD, step=0.1, update="vanilla"), [0.025, -0.0125, -0.0125])  # 0.1 pi A
    # the vanilla step is gradient ascent on J = E_pi[r]: autograd of the exact objective
    z = Z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad((z.softmax(-1) * RARE_GOOD).sum(), z)
    close(entropy_toy.logit_step(Z, RARE_GOOD, step=0.3, update="vanilla"), 0.3 * grad, atol=1e-15)
    with pytest.raises(ValueError, match="update"):
        entropy_toy.logit_step(Z, RARE_GOOD, step=0.1, update="adam")


# paper-index: entropy_toy.predicted_entropy_change
def test_predicted_entropy_change_by_hand_and_as_the_directional_derivative():
    dz = entropy_toy.logit_step(Z, LIKELY_GOOD, step=0.1)
    # centred log pi [0.5 ln2, -0.5 ln2, -0.5 ln2], dz [0.05, -0.05, -0.05] (mean 0):
    # Cov = 1/2 (0.5 ln2)(0.05) + 2 * 1/4 (-0.5 ln2)(-0.05) = 0.025 ln2 -> predicted -0.017329
    close(entropy_toy.predicted_entropy_change(Z, dz), -0.025 * LN2)
    # exactly the derivative d/dt H(z + t dz) at t = 0, for any dz
    dz = torch.tensor([0.3, -1.1, 0.7], dtype=D)
    t = torch.zeros((), dtype=D, requires_grad=True)
    (slope,) = torch.autograd.grad(entropy_toy.softmax_entropy(Z + t * dz), t)
    close(entropy_toy.predicted_entropy_change(Z, dz), slope, atol=1e-14)
    # the LM-scale term: a batch drawn in proportion to pi (arms 0, 0, 1, 2) gives the same covariance as a mean of
    # entropy.token_covariance (0.25 ln2, the module's worked example); dH = -0.1 * that
    tokens = torch.tensor([0, 0, 1, 2])
    logprobs = Z.log_softmax(-1)[tokens][None]
    adv = entropy_toy.bandit_advantages(Z, LIKELY_GOOD)[tokens][None]
    batch_cov = entropy.token_covariance(logprobs, adv, torch.ones(1, 4)).mean()
    close(-0.1 * batch_cov, entropy_toy.predicted_entropy_change(Z, entropy_toy.logit_step(Z, LIKELY_GOOD, step=0.1)))


@pytest.mark.parametrize("update", entropy_toy.UPDATES)
@pytest.mark.parametrize("rewards", [LIKELY_GOOD, RARE_GOOD], ids=["likely-good", "rare-good"])
def test_entropy_change_error_shrinks_as_the_step_squared(update, rewards):
    rows = entropy_toy.entropy_change_table(Z, rewards, steps=(0.2, 0.1, 0.05), update=update)
    for row in rows[1:]:
        assert 3.5 < row["error_ratio"] < 4.5, rows  # halving the step quarters the error: O(step^2)
    assert abs(rows[-1]["error"]) < 0.05 * abs(rows[-1]["predicted"])  # small steps: the prediction is the change


def test_a_likely_good_action_lowers_entropy_and_a_rare_good_one_raises_it():
    for update in entropy_toy.UPDATES:
        likely = entropy_toy.logit_step(Z, LIKELY_GOOD, step=0.05, update=update)
        rare = entropy_toy.logit_step(Z, RARE_GOOD, step=0.05, update=update)
        predicted, measured = entropy_toy.predicted_entropy_change, entropy_toy.measured_entropy_change
        assert predicted(Z, likely) < 0 and measured(Z, likely) < 0
        assert predicted(Z, rare) > 0 and measured(Z, rare) > 0
    # natural step, rare arm rewarded: A = [-1/4, 3/4, -1/4]; Cov(log pi, A) = 1/2 (0.5 ln2)(-1/4)
    # + 1/4 (-0.5 ln2)(3/4) + 1/4 (-0.5 ln2)(-1/4) = -0.125 ln2, so dH = +0.05 * 0.125 ln2 = 0.004332
    close(entropy_toy.predicted_entropy_change(Z, entropy_toy.logit_step(Z, RARE_GOOD, step=0.05)), 0.00625 * LN2)
