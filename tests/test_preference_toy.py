"""Tests of minirl.preference_toy: the IPO bandit (DPO drives a never-winning action to 0, IPO keeps its regularised
optimum) and total-order preferences, by hand."""

import pytest
import torch

from minirl.preference_toy import ipo_bandit, total_order_preferences


def test_bandit_first_step_matches_hand_gradient():
    # uniform start, strict ranking 0 > 1 > 2, pairs {0,1}, {0,2}, {1,2} each with weight 1/3.
    # DPO: at h = 0 each pair's loss has d/dtheta_winner = -beta * sigma(0) = -beta/2 and +beta/2 on the loser.
    # theta_0 wins twice: (1/3)(-beta/2 - beta/2) = -beta/3; theta_1 wins once, loses once: 0; theta_2: +beta/3.
    # one step of size lr: theta = log(1/3) + lr * beta/3 * (1, 0, -1)
    beta, lr = 0.6, 0.5
    traj = ipo_bandit("dpo", beta=beta, steps=1, lr=lr)
    torch.testing.assert_close(traj[0], torch.full((3,), 1 / 3, dtype=torch.float64))
    step = lr * beta / 3 * torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(traj[1], torch.softmax(step, 0))
    # IPO, tau = 1, c = 1/(2 tau) = 0.5: d/dh (h - c)^2 = -2c = -1 at h = 0, so theta_0 gets (1/3)(-1 - 1) = -2/3
    traj = ipo_bandit("ipo", beta=1.0, steps=1, lr=lr)
    torch.testing.assert_close(traj[1], torch.softmax(lr * 2 / 3 * torch.tensor([1.0, 0.0, -1.0],
                                                                                   dtype=torch.float64), 0))


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.1, 0.5, 1.0])
def test_bandit_dpo_drives_the_never_winning_action_to_zero_for_any_beta(beta):
    traj = ipo_bandit("dpo", beta=beta, steps=2000, lr=0.5)
    p_last = traj[:, 2]
    assert p_last[-1] < 1e-4  # measured: 9e-14 (beta 0.1), 2e-8 (0.5), 9e-6 (1.0)
    assert (p_last[1:] < p_last[:-1]).all()  # still falling at every step: no finite optimum


# paper-index: preference_toy.ipo_bandit
@pytest.mark.slow
@pytest.mark.parametrize("tau", [0.1, 0.5, 1.0])
def test_bandit_ipo_converges_to_its_regularised_optimum(tau):
    # optimum: theta_0 - theta_1 = theta_1 - theta_2 = 1/(3 tau) (minimise (u-c)^2 + (v-c)^2 + (u+v-c)^2, c = 1/(2tau))
    # so pi = softmax(2g, g, 0) with g = 1/(3 tau); tau = 1: pi_2 = e^-1/3 / (e^1/3 + 1 + e^-1/3) = 0.230237
    g = 1 / (3 * tau)
    optimum = torch.softmax(torch.tensor([2 * g, g, 0.0], dtype=torch.float64), 0)
    traj = ipo_bandit("ipo", beta=tau, steps=2000, lr=0.5)
    torch.testing.assert_close(traj[-1], optimum, rtol=1e-9, atol=1e-12)
    if tau == 1.0:
        assert traj[-1, 2].item() == pytest.approx(0.230237, abs=1e-6)


@pytest.mark.slow
def test_bandit_ipo_with_a_tie_regularises_the_tied_pair_to_the_reference():
    # 0 and 1 tie (P = 0.5), both always beat 2. The tied pair's IPO terms 0.5 (x - c)^2 + 0.5 (-x - c)^2 are
    # smallest at x = 0; the other two fix theta_0 - theta_2 = theta_1 - theta_2 = c. tau = 1, c = 0.5:
    # pi_2 = 1 / (2 e^0.5 + 1) = 1 / 4.297443 = 0.232696
    prefs = torch.tensor([[0.5, 0.5, 1.0], [0.5, 0.5, 1.0], [0.0, 0.0, 0.5]])
    traj = ipo_bandit("ipo", beta=1.0, steps=2000, lr=0.5, preferences=prefs)
    assert traj[-1, 2].item() == pytest.approx(0.232696, abs=1e-6)
    assert traj[-1, 0].item() == pytest.approx(traj[-1, 1].item(), abs=1e-12)
    # DPO on the same data: the tie keeps pi_0 = pi_1, and pi_2 keeps falling (measured 5e-4 after 2000 steps)
    traj = ipo_bandit("dpo", beta=1.0, steps=2000, lr=0.5, preferences=prefs)
    assert traj[-1, 2] < 1e-3 and (traj[1:, 2] < traj[:-1, 2]).all()
    assert traj[-1, 0].item() == pytest.approx(traj[-1, 1].item(), abs=1e-12)


def test_bandit_is_deterministic():
    a = ipo_bandit("dpo", beta=0.3, steps=50)
    b = ipo_bandit("dpo", beta=0.3, steps=50)
    assert torch.equal(a, b) and a.shape == (51, 3) and a.dtype == torch.float64
    torch.testing.assert_close(a.sum(1), torch.ones(51, dtype=torch.float64))


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "ppo"}, "method"),
    ({"method": "ipo", "beta": 0.0}, "beta"),
    ({"method": "ipo", "lr": -1.0}, "lr"),
    ({"method": "ipo", "steps": -1}, "steps"),
    ({"method": "ipo", "preferences": torch.ones(3, 3)}, "preferences"),
    ({"method": "ipo", "preferences": torch.ones(3)}, "preferences"),
    ({"method": "ipo", "ref_probs": torch.tensor([0.5, 0.5, 0.5])}, "ref_probs"),
])
def test_bandit_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ipo_bandit(**kwargs)


def test_total_order_preferences():
    p = total_order_preferences(3)
    assert p.tolist() == [[0.5, 1.0, 1.0], [0.0, 0.5, 1.0], [0.0, 0.0, 0.5]]
