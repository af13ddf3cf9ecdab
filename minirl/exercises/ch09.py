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
