"""minirl/minimal/ppo.py computes what the library's PPO computes (``rl.train_rl`` with ``make_config("ppo")``).

Both sides draw their random numbers in the same order: torch's global generator, seeded, first for the critic's
head (``nn.Linear``'s random init, which both then overwrite with zeros), then for the sampling; one seeded
``torch.Generator`` for the prompts drawn and the minibatch order. So the rollouts are the same and nothing is handed
from one side to the other. The shared checks (imports, line count, the copy that runs alone) are in
tests/test_minimal.py, which finds this file by itself.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_minimal import TOL, _largest_gaps, _library_updates, _load, _weights

from minirl import config, rl
from minirl.minimal import ppo


def _largest_gap(ours: list[list[torch.Tensor]], theirs: list[list[torch.Tensor]]) -> float:
    assert len(ours) == len(theirs) > 0
    return max(float((x - y).abs().max()) for a, b in zip(ours, theirs, strict=True) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_ppo_file_equals_the_library_step_by_step(monkeypatch):
    """3 PPO steps x 2 minibatches of ppo.py and of rl.train_rl(make_config("ppo")): the same policy loss, value
    loss, gradient norm, policy weights and critic weights after each of the 6 optimiser steps, within TOL; measured
    bit for bit (every gap 0.0) with torch 2.13 on CPU. The library's PPO samples group_size answers per prompt and
    splits minibatches by prompt, so the file does too (4 answers for each of 8 prompts here). lr 3e-4 and value_lr
    3e-3 (the preset's 1e-4 and 1e-3, tripled) move the weights far enough that both clips act on the second
    minibatch of each step: the policy's ratio clip and the critic's value clip are exercised."""
    args = ppo.Args(steps=3, prompts_per_step=8, group_size=4, max_new_tokens=24, lr=3e-4, value_lr=3e-3,
                    device="cpu")
    cfg = config.make_config("ppo", seed=args.seed, steps=args.steps, prompts_per_step=args.prompts_per_step,
                             group_size=args.group_size, max_new_tokens=args.max_new_tokens, lr=args.lr,
                             value_lr=args.value_lr)
    assert (cfg.advantage, cfg.agg, cfg.kl_estimator, cfg.kl_placement, cfg.whiten_advantages) == (
        "gae", "token-mean", "k1", "reward", True)
    assert (cfg.eps_low, cfg.eps_high, cfg.beta, cfg.value_clip, cfg.gamma, cfg.lam, cfg.num_iterations,
            cfg.num_minibatches, cfg.max_grad_norm, cfg.temperature) == (
        args.eps, args.eps, args.beta, args.value_clip, args.gamma, args.lam, args.epochs, args.num_minibatches,
        args.max_grad_norm, args.temperature)

    model, tokenizer = _load()
    critics, make_critic = [], ppo.Critic
    monkeypatch.setattr(ppo, "Critic", lambda policy: critics.append(make_critic(policy)) or critics[-1])
    ours, our_critic = [], []

    def record(stats):
        ours.append((stats, _weights(model)))
        our_critic.append(_weights(critics[0]))

    ppo.train(args, model, tokenizer, ppo.load_jsonl(args.train_data), on_update=record)

    their_critic, update = [], rl.update_minibatch

    def record_critic(*a, **kw):  # wrapped in turn by _library_updates, which records the policy's weights
        out = update(*a, **kw)
        their_critic.append(_weights(kw["critic"]))
        return out

    monkeypatch.setattr(rl, "update_minibatch", record_critic)
    theirs = _library_updates(monkeypatch, cfg)
    assert len(ours) == len(theirs) == 6 and len(critics) == 1
    gaps = _largest_gaps(ours, theirs)
    gaps["value_loss"] = max(abs(a["value_loss"] - b["value_loss"])
                             for (a, _), (b, _) in zip(ours, theirs, strict=True))
    gaps["critic_weights"] = _largest_gap(our_critic, their_critic)
    assert max(gaps.values()) < TOL, gaps
    assert max(s["clip_frac"] for s, _ in ours) > 0  # the ratio clip acted on some token
    assert max(s["value_clip_frac"] for s, _ in theirs) > 0  # and the value clip


def test_ppo_help_shows_each_setting_with_its_docstring(capsys):
    with pytest.raises(SystemExit):
        ppo.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--value-lr" in out and "GAE's lambda" in out and "--beta" in out and "--value-clip" in out


def test_ppo_token_rewards_by_hand():
    # scores [1, 0]; the first answer has 3 tokens, the second 1; k1 per token, beta 0.5:
    # row 0: [-0.5 * 0.1, -0.5 * 0.2, 1 - 0.5 * (-0.1)] = [-0.05, -0.1, 1.05]; row 1: [-0.5 * 0.3, 0, 0]
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, -0.1], [0.3, 0.0, 0.0]])
    r = ppo.token_rewards(torch.tensor([1.0, 0.0]), kl, mask, 0.5)
    assert torch.allclose(r, torch.tensor([[-0.05, -0.1, 1.05], [-0.15, 0.0, 0.0]]))


def test_ppo_gae_by_hand():
    # row 0: rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 1, lam 0.95: deltas [0.6 - 0.5, 0.7 - 0.6, 1 - 0.7]
    # = [0.1, 0.1, 0.3]; A_2 = 0.3, A_1 = 0.1 + 0.95 * 0.3 = 0.385, A_0 = 0.1 + 0.95 * 0.385 = 0.46575;
    # returns A + V = [0.96575, 0.985, 1.0].
    # row 1 (2 tokens, then padding): rewards [0, 1], values [0.5, 0.2]: the value after the last token is 0, so
    # delta_1 = 1 + 0 - 0.2 = 0.8 = A_1; delta_0 = 0 + 0.2 - 0.5 = -0.3, A_0 = -0.3 + 0.95 * 0.8 = 0.46;
    # returns [0.96, 1.0, 0]
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.2, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = ppo.gae(rewards, values, mask, 1.0, 0.95)
    assert torch.allclose(advantages, torch.tensor([[0.46575, 0.385, 0.3], [0.46, 0.8, 0.0]]))
    assert torch.allclose(returns, torch.tensor([[0.96575, 0.985, 1.0], [0.96, 1.0, 0.0]]))
    # gamma 0.9, lam 0.5, rewards [0, 1], values [0.5, 0.5]: A_1 = 1 - 0.5 = 0.5;
    # delta_0 = 0 + 0.9 * 0.5 - 0.5 = -0.05, A_0 = -0.05 + 0.9 * 0.5 * 0.5 = 0.175
    advantages, _ = ppo.gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), 0.9, 0.5)
    assert torch.allclose(advantages, torch.tensor([[0.175, 0.5]]))


def test_ppo_whiten_by_hand():
    # valid [1, 2, 3]: mean 2, variance (1 + 0 + 1) / (3 - 1) = 1 -> [-1, 0, 1]; the padding (99) comes back 0
    x = ppo.whiten(torch.tensor([[1.0, 2.0], [3.0, 99.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert torch.allclose(x, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))


def test_ppo_loss_by_hand():
    # 4 valid tokens, eps 0.2, and one padded position whose log-prob is -inf (never read):
    # token 0: rho = 1, A = +1: -1, gradient -A / 4 tokens = -0.25
    # token 1: rho = e^0.2 = 1.2214 > 1.2, A = +1: max(-1.2214, -1.2) = -1.2, clipped: gradient 0
    # token 2: rho = 0.7 < 0.8, A = -1: max(0.7, 0.8) = 0.8, clipped: gradient 0
    # token 3: rho = 0.9, A = -1: max(0.9, 0.9) = 0.9, inside the band: gradient rho * -A / 4 = 0.9 / 4 = 0.225
    # loss (-1 - 1.2 + 0.8 + 0.9) / 4 = -0.125; clip_frac 2 / 4 = 0.5
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0]])
    lp = (old + torch.tensor([[0.0, 0.2, math.log(0.7), math.log(0.9), 0.0]])).clone()
    lp[0, 4] = -math.inf
    lp.requires_grad_(True)
    A = torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, stats = ppo.ppo_loss(lp, old, A, mask, eps=0.2, n_tokens=4.0)
    loss.backward()
    assert math.isclose(loss.item(), -0.125, abs_tol=1e-6) and stats["clip_frac"] == 0.5
    assert torch.allclose(lp.grad, torch.tensor([[-0.25, 0.0, 0.0, 0.225, 0.0]]))


def test_ppo_value_loss_by_hand():
    # clip 0.2, V_old = 0 on both tokens, returns [1, 0]:
    # token 0: V = 0.5; unclipped (0.5 - 1)^2 = 0.25, clipped V 0.2: (0.2 - 1)^2 = 0.64 -> 0.5 * 0.64 = 0.32, and
    #   the clipped branch has no gradient (V left the band): 0
    # token 1: V = -0.1, inside the band: 0.5 * 0.01 = 0.005, gradient (V - R) / 2 tokens = -0.05
    # loss (0.32 + 0.005) / 2 = 0.1625
    v = torch.tensor([[0.5, -0.1]], requires_grad=True)
    loss = ppo.value_loss(v, torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), clip=0.2, n_tokens=2.0)
    loss.backward()
    assert math.isclose(loss.item(), 0.1625, abs_tol=1e-7)
    assert torch.allclose(v.grad, torch.tensor([[0.0, -0.05]]))
