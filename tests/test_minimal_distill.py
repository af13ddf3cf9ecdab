"""minirl/minimal/distill.py computes what the library's distillation loop computes.

The file and ``distill_loop.train_distill`` (``distill="reverse_kl"``, the library's default discount 0) start from the
same student, the same shipped teacher, data and seed. Both draw their random numbers in the same order (the prompts
from one seeded generator, the sampling from torch's global one), so each samples the same rollouts on its own:
nothing is handed from one side to the other.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_minimal import TOL, _largest_gaps, _load, _weights
from transformers import AutoModelForCausalLM

from minirl import config, distill_loop, tasks
from minirl.minimal import distill


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [0.0, 0.5], ids=["gamma0_default", "gamma0.5"])
def test_distill_file_equals_the_library_step_by_step(gamma):
    """3 steps of distill.py and of train_distill from the warm start and the shipped teacher: the same loss, gradient
    norm and weights after each optimiser step, within float32 round-off (TOL; measured: bit for bit, 0.0 on every
    quantity), at the library's default discount 0 and at 0.5, where the rewards to go mix the tokens' grades.
    lr 1e-3 moves the student far enough that steps 2 and 3 sample from weights that have moved (its KL to
    the teacher goes 0.10 -> 1.00 -> 1.30 nats per token), and every gradient norm (4.6 to 19.8) is clipped to 1.

    Both sides get the teacher loaded as the file loads it (``from_pretrained``, transformers' default attention),
    as ``_load`` gives both the student: ``distill_loop.load_teacher`` loads it with eager attention, whose log-probs
    differ from sdpa's by round-off (6.6e-6 nats measured), which 3 Adam steps at lr 1e-3 grow to 4e-5 in the
    weights. The teacher is the same file: ``load_teacher``'s folder is the file's default."""
    args = distill.Args(steps=3, prompts_per_step=8, group_size=4, max_new_tokens=24, lr=1e-3, gamma=gamma,
                        device="cpu")
    model, tokenizer = _load()
    ours = []
    distill.train(args, model, tokenizer, distill.load_jsonl(args.train_data),
                  on_update=lambda stats: ours.append((stats, _weights(model))))

    model, tokenizer = _load()
    assert Path(args.teacher) == distill_loop.SHIPPED_DIR / "teacher-dense-cpu-s0"  # what load_teacher("cpu") reads
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32)
    cfg = config.make_config("grpo", beta=0.0, num_minibatches=1, distill="reverse_kl", seed=args.seed,
                             steps=args.steps, prompts_per_step=args.prompts_per_step, group_size=args.group_size,
                             max_new_tokens=args.max_new_tokens, lr=args.lr, distill_gamma=gamma,
                             progress=False)
    assert (cfg.distill_gamma, cfg.distill_coef, cfg.task_coef, cfg.temperature, cfg.max_grad_norm,
            cfg.weight_decay, cfg.micro_batch_size, cfg.completion_only_head) == (
        args.gamma, 1.0, 0.0, args.temperature, args.max_grad_norm, 0.0, None, False)
    theirs = []
    distill_loop.train_distill(model, tokenizer, cfg, tasks.load_split("train"), teacher=teacher,
                               callback=lambda step, row: theirs.append((row, _weights(model))))
    assert len(ours) == 3
    gaps = _largest_gaps(ours, theirs)
    assert gaps["loss"] < TOL and gaps["grad_norm"] < TOL and gaps["weights"] < TOL, gaps
    assert max(abs(s["kl"] - row["kl_teacher"]) for (s, _), (row, _) in zip(ours, theirs, strict=True)) < TOL
    assert min(s["kl"] for s, _ in ours) > 0.01  # the student is not its teacher: the loss has something to do
    assert min(s["grad_norm"] for s, _ in ours) > args.max_grad_norm  # the clip acts on every step


def test_distill_loss_by_hand():
    # one answer of 3 tokens, the third is padding: log p = [-1, -2, (pad)], log q = [-1.5, -1, (pad)]
    # r = log q - log p = [-0.5, +1.0, 0]; gamma 0: A = r; 2 tokens
    # loss = -(A_1 log p_1 + A_2 log p_2) / 2 = -((-0.5)(-1) + (1)(-2)) / 2 = -(0.5 - 2) / 2 = 0.75
    # d loss / d log p_t = -A_t / 2 = [0.25, -0.5, 0]: the token the teacher likes more (2nd) is pushed up
    # kl = mean of log p - log q = (0.5 - 1) / 2 = -0.25 (an estimate from 2 tokens: it can be negative)
    lp = torch.tensor([[-1.0, -2.0, -float("inf")]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = distill.distill_loss(lp, torch.tensor([[-1.5, -1.0, 0.0]]), mask, gamma=0.0, n_tokens=2.0)
    loss.backward()
    assert loss.item() == 0.75 and stats["kl"] == -0.25
    assert lp.grad.tolist() == [[0.25, -0.5, 0.0]]  # padding holding -inf: finite loss, zero gradient


def test_distill_rewards_to_go_by_hand():
    # r = [1, 2, 3], gamma 0.5: [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3] = [2.75, 3.5, 3.0]; gamma 1: [6, 5, 3];
    # gamma 0: r itself; a masked last token is left out: gamma 1 over [1, 2] -> [3, 2, 0]
    r, ones = torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3)
    assert distill.rewards_to_go(r, ones, 0.5).tolist() == [[2.75, 3.5, 3.0]]
    assert distill.rewards_to_go(r, ones, 1.0).tolist() == [[6.0, 5.0, 3.0]]
    assert distill.rewards_to_go(r, ones, 0.0).tolist() == [[1.0, 2.0, 3.0]]
    assert distill.rewards_to_go(r, torch.tensor([[1.0, 1.0, 0.0]]), 1.0).tolist() == [[3.0, 2.0, 0.0]]


def test_distill_a_student_equal_to_its_teacher_gets_no_gradient():
    lp = torch.tensor([[-0.3, -2.0, -0.1]], requires_grad=True)
    loss, stats = distill.distill_loss(lp, lp.detach(), torch.ones(1, 3), gamma=1.0, n_tokens=3.0)
    loss.backward()
    assert loss.item() == 0.0 and stats["kl"] == 0.0 and lp.grad.abs().max() == 0.0  # every r_t = 0


def test_distill_help_shows_each_setting_with_its_docstring(capsys):
    with pytest.raises(SystemExit):
        distill.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--teacher" in out and "--gamma" in out and "discount of the reward to go" in out
