"""Exercises of chapter 09: on-policy distillation (the sampled reverse-KL reward, the full-vocabulary reverse KL).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import _reference as ref
from ._core import _case, _exercise, _expect, _expect_finite, _grad, _leaf, _Mismatch, _prefix_mask, _t

# ================================================================================================================
# 09 · the sampled token's reward: r_t = log q(y_t) - log p(y_t)

ex = _exercise("reverse_kl_reward", "09", "reverse_kl_reward(logprobs, teacher_logprobs, mask) -> (B, T) detached",
               "minirl.distill.reverse_kl_reward", ("minirl.distill.reverse_kl_reward", "minirl.distill.mixed_reward"))
KL_SIGN = ("the reward is MINUS the student's log-ratio, log q(y_t) - log p(y_t): log p - log q is the KL estimate "
           "itself, a penalty; as a reward it would push the student AWAY from the teacher")
K3_REWARD = ("k3 is an estimate of the KL to put in a LOSS; per sampled token, the reward whose sum is -KL(p || q) "
             "over the sequence is k1's negative, log q - log p (notebook 04: k3 in the reward gives the wrong KL)")
PROMPT = ("only the completion's tokens were sampled by the student: positions outside the mask (the prompt, and "
          "padding) get no reward; a KL summed over the prompt grades tokens the student never chose")
REWARD_GRAD = ("a reward carries no gradient: detach it (the student's log-prob is differentiated only in the "
               "policy-gradient loss that uses the reward)")
TEACHER_GRAD = ("the teacher's log-probs were not detached: the teacher is graded against, never trained (a gradient "
                "into it would move the teacher toward the student)")


@_case(ex, "three tokens by hand, garbage in padding", KL_SIGN)
def _(fn, gen):
    got = fn(_t([[-1.0, -2.0, 3.0]]), _t([[-1.5, -1.0, -7.0]]), _t([[1, 1, 0]]))
    # log q - log p = (-0.5, 1.0) and 0 in padding. Sign flipped: (0.5, -1.0, 0). -k3 of log(q / p):
    # -(e^-0.5 - 1 + 0.5, e - 1 - 1) = (-0.106531, -0.718282); padding not masked: -10 there
    _expect(got, [[-0.5, 1.0, 0.0]], [([[0.5, -1.0, 0.0]], KL_SIGN), ([[-0.106531, -0.718282, 0.0]], K3_REWARD),
                                      ([[0.106531, 0.718282, 0.0]], K3_REWARD), ([[-0.5, 1.0, -10.0]], PROMPT)],
            what="the rewards")


@_case(ex, "the prompt's positions (mask 0) get no reward", PROMPT)
def _(fn, gen):
    # positions of prompt + completion, as one forward over the whole sequence gives them; the mask marks the
    # completion. Completion: (-1.5 + 1, -1 + 2) = (-0.5, 1.0); graded over the prompt too: 0.1 and 0.4 there
    got = fn(_t([[-0.2, -0.7, -1.0, -2.0]]), _t([[-0.1, -0.3, -1.5, -1.0]]), _t([[0, 0, 1, 1]]))
    _expect(got, [[0.0, 0.0, -0.5, 1.0]], [([[0.1, 0.4, -0.5, 1.0]], PROMPT)], what="the rewards")


@_case(ex, "the rewards carry no gradient, into the student or the teacher", REWARD_GRAD)
def _(fn, gen):
    lp, teacher = _leaf([[-1.0, -2.0]]), _leaf([[-1.5, -1.0]])  # both computed with grad upstream, by mistake
    out = fn(lp, teacher, _t([[1, 1]]))
    if isinstance(out, Tensor) and out.requires_grad:
        g_student, g_teacher = _grad(out, (lp, teacher))
        raise _Mismatch(TEACHER_GRAD if g_student.abs().sum() == 0 else REWARD_GRAD, "the rewards require grad")
    _expect(out, [[-0.5, 1.0]], what="the rewards")


@_case(ex, "random batch with padding against the definition", PROMPT)
def _(fn, gen):
    mask = _prefix_mask([6, 2, 0, 4], 6)
    lp, teacher = -torch.rand(4, 6, generator=gen) * 4, -torch.rand(4, 6, generator=gen) * 4
    _expect(fn(lp, teacher, mask), ref.reverse_kl_reward(lp, teacher, mask), what="the rewards")


# ================================================================================================================
# 09 · the whole next-token distribution: KL(p(.|prefix) || q(.|prefix)) at every position

ex = _exercise("full_reverse_kl", "09", "full_reverse_kl(logits, teacher_logits, mask, *, temperature=1.0) -> (B, T)",
               "minirl.distill.full_reverse_kl",
               ("minirl.distill.full_reverse_kl", "minirl.distill.generalized_jsd", "minirl.kl.exact_token_kl"))
FORWARD = ("this is the FORWARD KL(q || p), sum_v q (log q - log p): GKD's beta = 0, mass-covering; on-policy "
           "distillation minimises the REVERSE KL(p || q) = sum_v p (log p - log q), weighted by the student")
LOGITS_AS_LOGPROBS = ("logits are not log-probabilities: normalise both with log_softmax over the vocabulary before "
                      "the KL")
TEMPERATURE = ("both distributions are softmax(logits / temperature): the student's and the teacher's (TRL's "
               "DistillationTrainer does so; scaling only one compares distributions at different temperatures)")
ZERO_LOG_ZERO = ("a token the student gives probability 0 (logit -inf) adds 0 to the KL: 0 * log 0 is 0, not "
                 "0 * (-inf) = NaN (and its gradient must stay finite too)")
_S, _Q = [0.0, 0.0], [0.0, math.log(3)]  # p = (0.5, 0.5), q = (0.25, 0.75)


@_case(ex, "two tokens by hand", FORWARD)
def _(fn, gen):
    logits = _leaf([[_S]])
    out = fn(logits, _t([[_Q]]), _t([[1]]))
    # 0.5 ln(0.5 / 0.25) + 0.5 ln(0.5 / 0.75) = 0.143841; forward 0.25 ln 0.5 + 0.75 ln 1.5 = 0.130812;
    # logits as log-probs: 0.5 (0 - 0) + 0.5 (0 - ln 3) = -0.549306
    _expect(out, [[0.143841]], [([[0.130812]], FORWARD), ([[-0.549306]], LOGITS_AS_LOGPROBS)], what="the KL")
    # d/d logits = p (log p - log q - KL) = 0.5 * (0.693147 - 0.143841, -0.405465 - 0.143841); forward: p - q
    _expect(_grad(out, logits), [[[0.274653, -0.274653]]], [([[[0.25, -0.25]]], FORWARD)], what="the gradient")


@_case(ex, "the teacher gets no gradient", TEACHER_GRAD)
def _(fn, gen):
    logits, teacher = _leaf([[_S]]), _leaf([[_Q]])
    g_student, g_teacher = _grad(fn(logits, teacher, _t([[1]])), (logits, teacher))
    if g_teacher.abs().sum() > 0:
        raise _Mismatch(TEACHER_GRAD, f"the teacher's logits got a gradient {g_teacher.flatten().tolist()}")
    _expect(g_student, [[[0.274653, -0.274653]]], what="the student's gradient")


@_case(ex, "prompt and padding positions (mask 0) hold logits", PROMPT)
def _(fn, gen):
    logits = _t([[[1.0, -1.0], _S, [50.0, -50.0]]])  # a prompt position, the completion's token, padding
    teacher = _t([[[0.0, 0.0], _Q, [-50.0, 50.0]]])
    # the completion position only: 0.143841; over the prompt too: KL(softmax(1, -1) || (0.5, 0.5)) = 0.327813,
    # and about 100 nats in padding
    _expect(fn(logits, teacher, _t([[0, 1, 0]])), [[0.0, 0.143841, 0.0]],
            [(ref.full_reverse_kl(logits, teacher, _t([[1, 1, 1]])), PROMPT),
             ([[0.327813, 0.143841, 0.0]], PROMPT)], what="the KL")


@_case(ex, "temperature 2: both distributions", TEMPERATURE)
def _(fn, gen):
    logits, teacher = _t([[[0.0, 2 * math.log(2)]]]), _t([[[0.0, 2 * math.log(3)]]])
    # at T = 2: p = (1/3, 2/3), q = (0.25, 0.75): 1/3 ln(4/3) + 2/3 ln(8/9) = 0.017372. Temperature ignored
    # (p = (0.2, 0.8), q = (0.1, 0.9)): 0.044403; on the student only: 0.201255; on the teacher only: 0.007002
    _expect(fn(logits, teacher, _t([[1]]), temperature=2.0), [[0.017372]],
            [([[0.044403]], TEMPERATURE), ([[0.201255]], TEMPERATURE), ([[0.007002]], TEMPERATURE)], what="the KL")


@_case(ex, "a token the student never samples (logit -inf)", ZERO_LOG_ZERO)
def _(fn, gen):
    logits = _leaf([[[0.0, -math.inf, 0.0]]])
    out = fn(logits, _t([[[0.0, 0.0, math.log(2)]]]), _t([[1]]))
    # p = (0.5, 0, 0.5), q = (0.25, 0.25, 0.5): 0.5 ln 2 + 0 + 0.5 ln 1 = 0.346574
    _expect_finite(out, logits, "the KL")
    _expect(out, [[0.346574]], what="the KL")


@_case(ex, "random (B, T, V) logits with padding, a random temperature, against the definition", FORWARD)
def _(fn, gen):
    mask = _prefix_mask([4, 1, 0], 4)
    logits = (torch.randn(3, 4, 7, generator=gen) * 2).requires_grad_(True)
    teacher = torch.randn(3, 4, 7, generator=gen) * 2
    temperature = 0.5 + float(torch.rand(1, generator=gen))
    want = ref.full_reverse_kl(logits, teacher, mask, temperature=temperature)
    out = fn(logits, teacher, mask, temperature=temperature)
    _expect(out, want.detach(), what="the KL")
    w = torch.rand(3, 4, generator=gen)
    _expect(_grad(out, logits, w), torch.autograd.grad((want * w).sum(), logits)[0], what="the gradient")


# ================================================================================================================
# 09 · the one-file distillation's advantages: each token's reward-to-go (minirl/minimal/distill.py)

ex = _exercise("rewards_to_go", "09", "rewards_to_go(rewards, mask, gamma) -> (B, T)",
               "minirl.minimal.distill.rewards_to_go", ("minirl.minimal.distill.rewards_to_go",))
RTG_FORWARD = ("this sums the rewards BEFORE each token (a running sum from the start): a token's action only "
               "affects what comes after it, so A_t = sum over s >= t of gamma^(s - t) r_s, computed backwards")
RTG_EXCLUDES_SELF = "the token's own reward is part of its reward-to-go: A_t = r_t + gamma A_{t+1}, s >= t, not s > t"
RTG_GAMMA_FROM_START = ("the discount counts from the token itself, gamma^(s - t), not from the start of the "
                        "answer, gamma^s")
RTG_NO_DISCOUNT = "gamma was ignored: A_t = r_t + gamma A_{t+1}"
RTG_PADDING_LEAKS = ("the padding's rewards leaked into the sums: read the rewards as 0 outside the mask before "
                     "summing (the recursion runs through the padding)")
RTG_ROWS_JOINED = "each row is its own answer: the sum stops at the row's end, it never runs on into the next row"


@_case(ex, "three tokens by hand, gamma 0.5", RTG_FORWARD)
def _(fn, gen):
    # A_2 = 3; A_1 = 2 + 0.5 * 3 = 3.5; A_0 = 1 + 0.5 * 3.5 = 2.75
    # running from the start: (1, 2.5, 4.25); s > t: (1.75, 1.5, 0); gamma^s: (2.75, 1.75, 0.75);
    # no discount: (6, 5, 3)
    _expect(fn(_t([[1.0, 2.0, 3.0]]), torch.ones(1, 3), 0.5), [[2.75, 3.5, 3.0]],
            [([[1.0, 2.5, 4.25]], RTG_FORWARD), ([[1.75, 1.5, 0.0]], RTG_EXCLUDES_SELF),
             ([[2.75, 1.75, 0.75]], RTG_GAMMA_FROM_START), ([[6.0, 5.0, 3.0]], RTG_NO_DISCOUNT)],
            what="the rewards-to-go")


@_case(ex, "gamma 0 (each token by itself) and gamma 1 (the whole rest)", RTG_NO_DISCOUNT)
def _(fn, gen):
    _expect(fn(_t([[1.0, 2.0, 3.0]]), torch.ones(1, 3), 0.0), [[1.0, 2.0, 3.0]], [([[6.0, 5.0, 3.0]], RTG_NO_DISCOUNT)],
            what="the rewards-to-go at gamma 0")
    _expect(fn(_t([[1.0, 2.0, 3.0]]), torch.ones(1, 3), 1.0), [[6.0, 5.0, 3.0]], what="the rewards-to-go at gamma 1")


@_case(ex, "garbage in the padding, an empty row", RTG_PADDING_LEAKS)
def _(fn, gen):
    r = _t([[1.0, 2.0, 99.0, 99.0], [4.0, 99.0, 99.0, 99.0], [99.0, 99.0, 99.0, 99.0]])
    mask = _prefix_mask([2, 1, 0], 4)
    # (3, 2 | 0, 0), (4 | 0, 0, 0), nothing; with the padding summed in: 201, 200 and 301; the rows run together
    # (row 0 on into row 1): 7, 6
    _expect(fn(r, mask, 1.0), [[3.0, 2.0, 0, 0], [4.0, 0, 0, 0], [0.0, 0, 0, 0]],
            [([[201.0, 200.0, 0, 0], [301.0, 0, 0, 0], [0.0, 0, 0, 0]], RTG_PADDING_LEAKS),
             ([[7.0, 6.0, 0, 0], [4.0, 0, 0, 0], [0.0, 0, 0, 0]], RTG_ROWS_JOINED)], what="the rewards-to-go")


@_case(ex, "two rows: each its own answer", RTG_ROWS_JOINED)
def _(fn, gen):
    # (2, 1) in each row; run on across the rows (flattened): (4, 3), (2, 1)
    _expect(fn(_t([[1.0, 1.0], [1.0, 1.0]]), torch.ones(2, 2), 1.0), [[2.0, 1.0], [2.0, 1.0]],
            [([[4.0, 3.0], [2.0, 1.0]], RTG_ROWS_JOINED)], what="the rewards-to-go")


@_case(ex, "random rewards, lengths and gamma, against the definition", RTG_FORWARD)
def _(fn, gen):
    r = torch.randn(5, 7, generator=gen)
    mask = _prefix_mask(torch.randint(0, 8, (5,), generator=gen).tolist(), 7)
    gamma = float(torch.rand(1, generator=gen))
    _expect(fn(r, mask, gamma), ref.rewards_to_go(r, mask, gamma), what="the rewards-to-go")
