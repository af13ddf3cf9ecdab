"""CISPO, SAPO and GMPO: hand values, exact gradients on small categoricals, masking, extreme log-ratios,
non-finite padding and bad arguments. Each loss is reached through ``losses.policy_loss(..., loss_mode=...)``, the
way the RL loop calls it, and checked against its own function where that matters."""

from __future__ import annotations

import math

import pytest
import torch

from minirl import losses
from minirl.config import make_config

D = torch.float64


def t(x):
    return torch.tensor(x, dtype=D)


def run(lp, old, adv, mask=None, **kw):
    """(loss, d loss / d logprobs, stats) through policy_loss."""
    lp = t(lp).requires_grad_(True)
    old = t(old)
    mask = torch.ones_like(old) if mask is None else t(mask)
    loss, stats = losses.policy_loss(lp, old, t(adv), mask, **kw)
    loss.backward()
    return float(loss.detach()), lp.grad, stats


GMPO = dict(loss_mode="gmpo", eps_low=0.4, eps_high=0.4, agg="seq-mean-token-mean")


# ------------------------------------------------------------------------------------------------ hand values
def test_cispo_hand_values_both_forms():
    # on-policy: w = 1, loss = -1 * (+1) * (-1.0) = 1.0, d/d logprob = -w A = -1
    loss, grad, _ = run([[-1.0]], [[-1.0]], [1.0], loss_mode="cispo")
    assert loss == pytest.approx(1.0) and float(grad) == pytest.approx(-1.0)
    # r = e^0.5 = 1.648721 > 1.28: two-sided w = 1.28, loss = -1.28 * (-0.5) = 0.64, gradient -1.28 (PPO's: 0)
    loss, grad, st = run([[-0.5]], [[-1.0]], [1.0], loss_mode="cispo", eps_low=0.2, eps_high=0.28)
    assert loss == pytest.approx(0.64) and float(grad) == pytest.approx(-1.28)
    assert st["clip_frac_high"] == 1.0 and st["ppo_clip_frac"] == 1.0
    # one-sided, cap 1 + 4 = 5: w = r = 1.648721, loss = -1.648721 * (-0.5) = 0.824361
    loss, grad, st = run([[-0.5]], [[-1.0]], [1.0], loss_mode="cispo", eps_high=4.0, cispo_form="one-sided")
    assert loss == pytest.approx(0.5 * math.exp(0.5)) and float(grad) == pytest.approx(-math.exp(0.5))
    assert st["clip_frac"] == 0.0
    # below the band, A < 0: two-sided raises w to 0.8 (gradient +0.8); one-sided keeps w = r = e^-0.5 = 0.606531
    _, grad, _ = run([[-1.5]], [[-1.0]], [-1.0], loss_mode="cispo")
    assert float(grad) == pytest.approx(0.8)
    _, grad, _ = run([[-1.5]], [[-1.0]], [-1.0], loss_mode="cispo", cispo_form="one-sided")
    assert float(grad) == pytest.approx(math.exp(-0.5))


def test_cispo_token_mean_by_hand():
    # two rows, 3 + 1 valid tokens, on-policy (w = 1): per-token -A * logprob
    # row 0 (A = +1): 0.5 + 1.0 + 2.0 = 3.5; row 1 (A = -2): -2 * 1.0 = -2.0 (loss -(-2)(-1.0)); token-mean 1.5 / 4
    lp = [[-0.5, -1.0, -2.0], [-1.0, 0.0, 0.0]]
    loss, grad, _ = run(lp, lp, [1.0, -2.0], [[1, 1, 1], [1, 0, 0]], loss_mode="cispo")
    assert loss == pytest.approx(1.5 / 4)
    assert torch.allclose(grad, t([[-0.25, -0.25, -0.25], [0.5, 0.0, 0.0]]))  # -w A / 4 tokens


def test_sapo_hand_values():
    # r = 1, A = +1, tau 1: f = 4 * sigmoid(0) = 2, loss -2, gradient -4 * 1 * 0.5 * 0.5 = -1
    loss, grad, st = run([[-1.0]], [[-1.0]], [1.0], loss_mode="sapo")
    assert loss == pytest.approx(-2.0) and float(grad) == pytest.approx(-1.0) and st["gate_mean"] == 1.0
    # r = e^0.5: s = sigmoid(0.648721) = 0.656722, f = 2.626889, gradient -4 * 1.648721 * 0.656722 * 0.343278
    loss, grad, _ = run([[-0.5]], [[-1.0]], [1.0], loss_mode="sapo")
    r = math.exp(0.5)
    s = 1 / (1 + math.exp(-(r - 1)))
    assert loss == pytest.approx(-4 * s) and loss == pytest.approx(-2.626889, abs=1e-6)
    assert float(grad) == pytest.approx(-4 * r * s * (1 - s)) and float(grad) == pytest.approx(-1.486739, abs=1e-6)
    # A = -1 uses tau_neg = 1.05: at r = 1, f = 4 / 1.05 * 0.5 = 1.904762, loss +1.904762, gradient still +1
    loss, grad, _ = run([[-1.0]], [[-1.0]], [-1.0], loss_mode="sapo")
    assert loss == pytest.approx(2 / 1.05) and abs(float(grad) - 1.0) < 1e-15  # tau kept in float64, not float32


def test_gmpo_hand_values():
    # log-ratios [0.6, 0.0], A = +1: m = [min(0.6, 0.4), 0] = [0.4, 0], weight e^(0.4 / 2) = e^0.2 = 1.221403
    loss, grad, st = run([[-0.4, -1.0]], [[-1.0, -1.0]], [1.0], **GMPO)
    assert loss == pytest.approx(-math.exp(0.2))
    assert torch.allclose(grad, t([[0.0, -math.exp(0.2) / 2]]))  # the clipped token loses its gradient only
    assert st["clip_frac_high"] == 0.5
    # A = -1: max(0.6, 0.4) = 0.6 is kept, weight e^0.3 = 1.349859, loss +1.349859, gradient e^0.3 / 2 each
    loss, grad, st = run([[-0.4, -1.0]], [[-1.0, -1.0]], [-1.0], **GMPO)
    assert loss == pytest.approx(math.exp(0.3))
    assert torch.allclose(grad, t([[math.exp(0.3) / 2] * 2])) and st["clip_frac"] == 0.0
    # two sequences: mean over sequences (-e^0.2 + e^0.3) / 2
    loss, _, _ = run([[-0.4, -1.0], [-0.4, -1.0]], [[-1.0, -1.0]] * 2, [1.0, -1.0], **GMPO)
    assert loss == pytest.approx((-math.exp(0.2) + math.exp(0.3)) / 2)


# paper-index: losses.cispo_loss losses.sapo_loss losses.gmpo_loss
def test_each_function_directly_equals_policy_loss():
    lp, old, mask = t([[-0.4, -1.0]]), t([[-1.0, -1.0]]), t([[1.0, 1.0]])
    direct, _ = losses.gmpo_loss(lp, old, t([1.0]), mask, eps_low=0.4, eps_high=0.4)
    assert float(direct) == pytest.approx(-math.exp(0.2))  # as in test_gmpo_hand_values
    adv = t([[1.0, 1.0]])
    assert float(losses.cispo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)[0]) == pytest.approx(
        run([[-0.4, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="cispo", eps_high=0.28)[0])
    assert float(losses.sapo_loss(lp, old, adv, mask)[0]) == pytest.approx(
        run([[-0.4, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="sapo")[0])


def test_gmpo_is_the_geometric_mean_of_the_clipped_ratios():
    # inside the band the weight is (prod r_t)^(1/|o|): ratios 1.1, 0.9, 1.2 -> (1.188)^(1/3)
    ratios = [1.1, 0.9, 1.2]
    old = [[-1.0] * 3]
    lp = [[-1.0 + math.log(r) for r in ratios]]
    loss, _, _ = run(lp, old, [1.0], **GMPO)
    assert loss == pytest.approx(-(1.1 * 0.9 * 1.2) ** (1 / 3))


# ------------------------------------------------------------------------------------------------ vs PPO
def test_cispo_equals_ppo_gradient_inside_the_band_and_keeps_it_outside():
    """Inside [1 - eps, 1 + eps] the CISPO weight is r, so its gradient -r A equals PPO's; outside, PPO's is 0 on
    the clipped side and CISPO's is -w A with the capped w."""
    for lr_, a in ((0.1, 1.0), (-0.1, -1.0), (0.1, -1.0), (-0.1, 1.0)):
        _, g_ppo, _ = run([[-1.0 + lr_]], [[-1.0]], [a])
        _, g_cispo, _ = run([[-1.0 + lr_]], [[-1.0]], [a], loss_mode="cispo")
        assert float(g_cispo) == pytest.approx(float(g_ppo))
    _, g_ppo, _ = run([[-0.5]], [[-1.0]], [1.0])
    _, g_cispo, _ = run([[-0.5]], [[-1.0]], [1.0], loss_mode="cispo")
    assert float(g_ppo) == 0.0 and float(g_cispo) == pytest.approx(-1.2)


def test_sapo_gradient_is_smooth_and_never_zero_at_the_band_edge():
    grads = [float(run([[-1.0 + math.log(r)]], [[-1.0]], [1.0], loss_mode="sapo")[1]) for r in (1.19, 1.2, 1.21)]
    # -4 r s (1 - s) = -1.179, -1.188, -1.197: about -A r, moving by < 0.02 (PPO's jumps from -1.19 to 0 here)
    assert all(g < -1.1 for g in grads)
    assert max(grads) - min(grads) < 0.02


# ------------------------------------------------------------------------------------------------ exact gradients
def _categorical(V=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(V, generator=g, dtype=D).requires_grad_(True)
    old_logits = theta.detach() + 0.6 * torch.randn(V, generator=g, dtype=D)  # pi_old != pi: ratios spread
    adv = torch.randn(V, generator=g, dtype=D)  # A(y) for each token y
    return theta, old_logits, adv


def _expected_grad(theta, old_logits, adv, **kw):
    """Exact E_{y ~ pi_old}[d loss(y) / d theta] by enumerating the V tokens, each a one-token sequence."""
    V = theta.numel()
    p_old = old_logits.softmax(-1)
    total = torch.zeros_like(theta)
    for y in range(V):
        theta.grad = None
        lp = theta.log_softmax(-1)[y].reshape(1, 1)
        old = old_logits.log_softmax(-1)[y].reshape(1, 1)
        loss, _ = losses.policy_loss(lp, old, adv[y].reshape(1), torch.ones(1, 1, dtype=D), **kw)
        loss.backward()
        total = total + p_old[y] * theta.grad
    return total


def test_on_policy_all_three_give_the_exact_policy_gradient():
    """On-policy (pi_old = pi) every loss's expected gradient is -grad E_pi[A]: the true objective's, by autograd."""
    theta, _, adv = _categorical()
    true = torch.autograd.grad(-(theta.softmax(-1) * adv).sum(), theta)[0]
    for kw in (dict(loss_mode="cispo"), dict(loss_mode="cispo", cispo_form="one-sided"), dict(loss_mode="sapo"),
               GMPO):
        got = _expected_grad(theta, theta.detach().clone(), adv, **kw)
        assert torch.allclose(got, true, atol=1e-12), kw


def test_cispo_off_policy_expected_gradient_is_the_weighted_reinforce_gradient():
    """Off-policy: E_{pi_old}[-w A grad log pi] with w = clip(pi / pi_old), autograd of that surrogate."""
    theta, old_logits, adv = _categorical(seed=1)
    ratio = (theta.log_softmax(-1) - old_logits.log_softmax(-1)).exp().detach()
    for form, w in (("two-sided", ratio.clamp(0.8, 1.2)), ("one-sided", ratio.clamp(max=1.2))):
        surrogate = -(old_logits.softmax(-1) * w * adv * theta.log_softmax(-1)).sum()
        true = torch.autograd.grad(surrogate, theta)[0]
        got = _expected_grad(theta, old_logits, adv, loss_mode="cispo", cispo_form=form)
        assert torch.allclose(got, true, atol=1e-12), form
    assert ((ratio > 1.2) | (ratio < 0.8)).any()  # some weights are clipped, so the test is not vacuous


def test_sapo_off_policy_expected_gradient_is_that_of_the_gated_objective():
    """E_{pi_old}[-f(pi / pi_old) A] is SAPO's objective (eq. 5 with one token per sequence); autograd of it."""
    theta, old_logits, adv = _categorical(seed=2)
    ratio = (theta.log_softmax(-1) - old_logits.log_softmax(-1)).exp()
    tau = torch.where(adv > 0, 1.0, 1.05).to(D)
    objective = -(old_logits.softmax(-1) * torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv).sum()
    true = torch.autograd.grad(objective, theta)[0]
    assert torch.allclose(_expected_grad(theta, old_logits, adv, loss_mode="sapo"), true, atol=1e-12)


def test_gmpo_two_token_sequences_enumerated():
    """Sequences of two tokens from the same categorical: the expected GMPO loss over all V^2 sequences (under
    pi_old) against the paper's objective written as a product, E[sgn(A) |A| (prod_t clipped r_t)^(1/2)]."""
    theta, old_logits, _ = _categorical(seed=3)
    V = theta.numel()
    p_old, lp_all, old_all = old_logits.softmax(-1), theta.log_softmax(-1), old_logits.log_softmax(-1)
    seqs = [(a, b) for a in range(V) for b in range(V)]
    adv = torch.linspace(-1.5, 1.5, len(seqs), dtype=D)  # one advantage per sequence
    lp = torch.stack([lp_all[list(s)] for s in seqs])  # (V^2, 2)
    old = torch.stack([old_all[list(s)] for s in seqs])
    weight = torch.stack([p_old[a] * p_old[b] for a, b in seqs])  # probability of each sequence under pi_old
    lo, hi = math.exp(-0.4), math.exp(0.4)
    expected = 0
    for i in range(len(seqs)):
        loss_i, _ = losses.policy_loss(lp[i:i + 1], old[i:i + 1], adv[i:i + 1], torch.ones(1, 2, dtype=D), **GMPO)
        expected = expected + weight[i] * loss_i
        r = (lp[i] - old[i]).exp()
        clipped = torch.minimum(r, r.clamp(lo, hi)) if adv[i] > 0 else torch.maximum(r, r.clamp(lo, hi))
        paper = -adv[i] * clipped.prod() ** 0.5
        assert torch.allclose(loss_i, paper, atol=1e-12)
    g_loss = torch.autograd.grad(expected, theta, retain_graph=True)[0]
    paper_obj = sum(weight[i] * -adv[i] * ((torch.minimum if adv[i] > 0 else torch.maximum)(
        (lp[i] - old[i]).exp(), (lp[i] - old[i]).exp().clamp(lo, hi))).prod() ** 0.5 for i in range(len(seqs)))
    assert torch.allclose(g_loss, torch.autograd.grad(paper_obj, theta)[0], atol=1e-12)
    r_all = (lp - old).exp()
    assert ((r_all > hi) | (r_all < lo)).any()  # some token ratios are clipped


# ------------------------------------------------------------------------------------------------ masking
MODES = [dict(loss_mode="cispo"), dict(loss_mode="cispo", cispo_form="one-sided"), dict(loss_mode="sapo"), GMPO]


@pytest.mark.parametrize("kw", MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
def test_padding_is_never_read_inf_and_nan_included(kw):
    lp = [[-0.5, -1.0, 0.0], [-2.0, -0.3, -0.7]]
    old = [[-0.9, -1.1, 0.0], [-1.5, -0.3, -1.0]]
    mask = [[1, 1, 0], [1, 1, 1]]
    clean = run(lp, old, [1.0, -0.5], mask, **kw)
    lp_bad = [[-0.5, -1.0, float("-inf")], [-2.0, -0.3, -0.7]]
    old_bad = [[-0.9, -1.1, float("nan")], [-1.5, -0.3, -1.0]]
    dirty = run(lp_bad, old_bad, [1.0, -0.5], mask, **kw)
    assert clean[0] == pytest.approx(dirty[0])
    assert torch.equal(torch.isfinite(dirty[1]), torch.ones(2, 3, dtype=torch.bool))
    assert torch.allclose(clean[1], dirty[1]) and float(dirty[1][0, 2]) == 0.0


@pytest.mark.parametrize("kw", MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
def test_fully_masked_rows_are_left_out_and_an_empty_batch_is_zero(kw):
    lp, old = [[-0.5, -1.0], [-0.2, -0.4]], [[-0.9, -1.1], [-1.0, -1.0]]
    alone = run([lp[0]], [old[0]], [1.0], [[1, 1]], **kw)
    with_empty = run(lp, old, [1.0, 3.0], [[1, 1], [0, 0]], **kw)
    assert with_empty[0] == pytest.approx(alone[0])  # the empty row neither adds a term nor counts
    assert float(with_empty[1][1].abs().sum()) == 0.0
    empty = run(lp, old, [1.0, 3.0], [[0, 0], [0, 0]], **kw)
    assert empty[0] == 0.0 and float(empty[1].abs().sum()) == 0.0


@pytest.mark.parametrize("kw", MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
def test_micro_batches_add_up_with_the_full_denominator(kw):
    g = torch.Generator().manual_seed(0)
    lp, old = -torch.rand(4, 5, generator=g, dtype=D), -torch.rand(4, 5, generator=g, dtype=D)
    adv = torch.randn(4, generator=g, dtype=D)
    mask = (torch.rand(4, 5, generator=g) > 0.3).to(D)
    mask[:, 0] = 1
    full, _ = losses.policy_loss(lp, old, adv, mask, **kw)
    agg = kw.get("agg", "token-mean" if kw["loss_mode"] == "cispo" else "seq-mean-token-mean")
    kw = {**kw, "agg": agg}
    denom = float(mask.sum()) if agg == "token-mean" else 4.0
    parts = sum(losses.policy_loss(lp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], denominator=denom, **kw)[0]
                for i in (0, 2))
    full, _ = losses.policy_loss(lp, old, adv, mask, **kw)
    assert float(parts) == pytest.approx(float(full), abs=1e-12)


# ------------------------------------------------------------------------------------------------ extremes
@pytest.mark.parametrize("kw", MODES, ids=["cispo2", "cispo1", "sapo", "gmpo"])
@pytest.mark.parametrize("log_ratio", [1000.0, -1000.0])
def test_extreme_log_ratios_stay_finite(kw, log_ratio):
    for a in (1.0, -1.0):
        loss, grad, st = run([[-1.0 + log_ratio, -1.0]], [[-1.0, -1.0]], [a], **kw)
        assert math.isfinite(loss) and bool(torch.isfinite(grad).all()) and math.isfinite(st["ratio_max"])
        assert st["approx_kl"] >= 0


def test_extreme_ratio_gradients_have_the_right_sign():
    # CISPO: the weight is capped, the gradient stays -w A (one-sided cap 5 at A = +1 -> -5 / 2 tokens)
    _, g, _ = run([[999.0, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="cispo", eps_high=4.0, cispo_form="one-sided")
    assert float(g[0, 0]) == pytest.approx(-2.5)
    # SAPO: far past the band the gate closes (gradient -> 0), never flips sign
    _, g, _ = run([[999.0, -1.0]], [[-1.0, -1.0]], [1.0], loss_mode="sapo")
    assert -1e-12 <= -float(g[0, 0]) < 1e-6
    # GMPO with A < 0: the unclipped huge ratio keeps a positive gradient (pushes the token down), finite
    _, g, _ = run([[999.0, -1.0]], [[-1.0, -1.0]], [-1.0], **GMPO)
    assert float(g[0, 0]) > 0 and math.isfinite(float(g[0, 0]))


# ------------------------------------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize("kw, match", [
    (dict(loss_mode="ppo2"), "loss_mode"),
    (dict(loss_mode="cispo", cispo_form="both"), "cispo_form"),
    (dict(loss_mode="sapo", tau_pos=0.0), "tau_pos"),
    (dict(loss_mode="sapo", tau_neg=-1.0), "tau_neg"),
    (dict(loss_mode="cispo", level="sequence", agg="seq-mean-token-mean"), "level='token'"),
    (dict(loss_mode="sapo", dual_clip=3.0), "dual_clip"),
    (dict(loss_mode="gmpo", agg="token-mean"), "seq-mean-token-mean"),
    (dict(loss_mode="gmpo", eps_low=-0.1, agg="seq-mean-token-mean"), "eps_low"),
    (dict(loss_mode="cispo", eps_low=1.5), "eps_low"),
])
def test_bad_arguments_raise_naming_them(kw, match):
    x = torch.zeros(2, 3, dtype=D)
    with pytest.raises(ValueError, match=match):
        losses.policy_loss(x, x, torch.ones(2, dtype=D), torch.ones(2, 3, dtype=D), **kw)


def test_gmpo_needs_one_advantage_per_sequence():
    x = torch.zeros(2, 3, dtype=D)
    with pytest.raises(ValueError, match="advantages"):
        losses.policy_loss(x, x, torch.ones(2, 3, dtype=D), torch.ones(2, 3, dtype=D), **GMPO)
    with pytest.raises(ValueError, match="cispo form"):
        losses.cispo_loss(x, x, x, torch.ones(2, 3, dtype=D), form="three-sided")
    with pytest.raises(ValueError, match="tau_pos"):
        losses.sapo_loss(x, x, x, torch.ones(2, 3, dtype=D), tau_pos=0.0)


@pytest.mark.parametrize("overrides, match", [
    (dict(loss_mode="spo"), "loss_mode"), (dict(cispo_form="x"), "cispo_form"), (dict(tau_neg=0.0), "tau_neg"),
    (dict(loss_mode="sapo", level="sequence"), "level='token'"), (dict(loss_mode="gmpo", agg="token-mean"), "gmpo"),
])
def test_config_validates_the_switches(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_config("grpo", **overrides)


def test_presets_carry_the_papers_values():
    c, s, g = make_config("cispo"), make_config("sapo"), make_config("gmpo")
    assert (c.loss_mode, c.cispo_form, 1 + c.eps_high, c.agg) == ("cispo", "one-sided", 5.0, "token-mean")
    assert (s.loss_mode, s.tau_pos, s.tau_neg, s.agg) == ("sapo", 1.0, 1.05, "seq-mean-token-mean")
    assert (g.loss_mode, g.eps_low, g.eps_high, g.agg) == ("gmpo", 0.4, 0.4, "seq-mean-token-mean")
