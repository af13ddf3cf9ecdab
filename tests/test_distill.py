"""Tests of minirl.distill: hand values, the exact enumeration of a two-token toy, and equality with TRL 1.16.

The toy: sequences (y1, y2) over a vocabulary of K = 3 tokens. The student p and the teacher q are logits tables:
theta1 (K,) for the first token, theta2 (K, K) for the second (row y1 is the distribution after y1). All K * K = 9
sequences are one batch of B = 9 rows of T = 2 tokens, so every "expected gradient" is an exact sum over sequences,
weighted by their probability, with no sampling noise.
"""

import math
import os
from collections import defaultdict
from functools import partial
from types import SimpleNamespace

import helpers
import pytest
import torch

from minirl import distill, interop, kl_toy, losses

D = torch.float64
K = 3
close = partial(helpers.close, atol=5e-7)  # the 6 decimals the hand values are written with
exact = partial(helpers.close, atol=1e-12)  # float64 identities


def t(*rows):
    return torch.tensor(rows, dtype=D)


# --- hand values ------------------------------------------------------------------------------------------------------
# The two-token distributions of the hand values: student p = [0.5, 0.5] (logits [0, 0]), teacher q = [0.25, 0.75].
P_LOGITS = torch.zeros(1, 1, 2, dtype=D)
Q_LOGITS = torch.log(t([[0.25, 0.75]]))  # (1, 1, 2): t() adds the outer axis
ONE = torch.ones(1, 1)


# paper-index: distill.reverse_kl_reward
def test_reverse_kl_reward_hand_values():
    # r = -(log p - log q) = [-(-1 + 1.5), -(-2 + 1), masked] = [-0.5, 1.0, 0]; the masked -inf is never read
    logprobs = t([-1.0, -2.0, -math.inf]).requires_grad_(True)
    r = distill.reverse_kl_reward(logprobs, t([-1.5, -1.0, -0.5]), t([1, 1, 0]))
    close(r, [[-0.5, 1.0, 0.0]])
    assert not r.requires_grad  # a reward carries no gradient


# paper-index: distill.rewards_to_go
def test_rewards_to_go_hand_values():
    rewards, mask = t([1.0, 2.0, 3.0]), torch.ones(1, 3)
    close(distill.rewards_to_go(rewards, mask, gamma=0.5), [[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3]])  # 2.75, 3.5, 3
    close(distill.rewards_to_go(rewards, mask, gamma=1.0), [[6.0, 5.0, 3.0]])  # 1+2+3, 2+3, 3
    close(distill.rewards_to_go(rewards, mask, gamma=0.0), [[1.0, 2.0, 3.0]])  # Tinker's: each token its own
    # padding is never read: [1, 2, inf] under mask [1, 1, 0], gamma 0.5 -> [1 + 0.5 * 2, 2, 0] = [2, 2, 0]
    close(distill.rewards_to_go(t([1.0, 2.0, math.inf]), t([1, 1, 0]), gamma=0.5), [[2.0, 2.0, 0.0]])


# paper-index: distill.full_reverse_kl
def test_full_reverse_kl_hand_values():
    # KL(p || q) = 0.5 ln(0.5 / 0.25) + 0.5 ln(0.5 / 0.75) = 0.5 * 0.693147 + 0.5 * -0.405465 = 0.143841 nats
    # grad w.r.t. the student logits = p (l - KL), l = [0.693147, -0.405465]: 0.5 * [0.549306, -0.549306]
    logits = P_LOGITS.clone().requires_grad_(True)
    value = distill.full_reverse_kl(logits, Q_LOGITS, ONE)
    close(value, [[0.143841]])
    close(torch.autograd.grad(value.sum(), logits)[0][0, 0], [0.274653, -0.274653])


# paper-index: distill.generalized_jsd
def test_generalized_jsd_hand_values():
    logits = P_LOGITS.clone().requires_grad_(True)
    jsd = partial(distill.generalized_jsd, logits, Q_LOGITS, ONE)
    # beta 0.5: m = [0.375, 0.625]
    # KL(q || m) = 0.25 ln(0.25 / 0.375) + 0.75 ln(0.75 / 0.625) = 0.25 * -0.405465 + 0.75 * 0.182322 = 0.035375
    # KL(p || m) = 0.5 ln(0.5 / 0.375) + 0.5 ln(0.5 / 0.625) = 0.5 * 0.287682 + 0.5 * -0.223144 = 0.032269
    # JSD = 0.5 * 0.035375 + 0.5 * 0.032269 = 0.033822
    # gradient (1 - beta) p (log p - log m - KL(p || m)) = 0.5 * 0.5 * ([0.287682, -0.223144] - 0.032269)
    #          = 0.25 * [0.255413, -0.255413] = [0.063853, -0.063853]
    value = jsd(beta=0.5)
    close(value, [[0.033822]])
    close(torch.autograd.grad(value.sum(), logits)[0][0, 0], [0.063853, -0.063853])
    # beta 0 (TRL: forward KL(q || p)): 0.25 ln(0.25 / 0.5) + 0.75 ln(0.75 / 0.5) = -0.173287 + 0.304099 = 0.130812,
    # gradient p - q = [0.25, -0.25]
    value = jsd(beta=0.0)
    close(value, [[0.130812]])
    close(torch.autograd.grad(value.sum(), logits)[0][0, 0], [0.25, -0.25])
    # beta 1 (TRL: reverse KL(p || q)) = the full reverse KL above
    close(jsd(beta=1.0), [[0.143841]])


# paper-index: distill.sft_nll
def test_sft_nll_hand_values():
    # -log p on the valid token: [0.5, masked] -> [0.5, 0]; token-mean over 1 valid token = 0.5
    nll = distill.sft_nll(t([-0.5, -math.inf]), t([1, 0]))
    close(nll, [[0.5, 0.0]])
    close(losses.aggregate(nll, t([1, 0]), "token-mean"), 0.5)


# paper-index: distill.mixed_reward
def test_mixed_reward_hand_values():
    # 0.5 * [-0.5, 1.0, 0] (the reverse-KL reward of the first test) + [0, 2, 0] (the score on the last valid token)
    #  = [-0.25, 2.5, 0]; the second row has no valid token: its NaN score is never read
    r = distill.mixed_reward(t([-1.0, -2.0, -0.5], [0.0, 0.0, 0.0]), t([-1.5, -1.0, -0.5], [0.0, 0.0, 0.0]),
                             t(2.0, math.nan), t([1, 1, 0], [0, 0, 0]), kl_coef=0.5)
    close(r, [[-0.25, 2.5, 0.0], [0.0, 0.0, 0.0]])


# --- the two-token toy, enumerated --------------------------------------------------------------------------------
Y1 = torch.arange(K).repeat_interleave(K)  # (B,) first token of sequence b = y1 * K + y2
Y2 = torch.arange(K).repeat(K)  # (B,)
Y = torch.stack([Y1, Y2], dim=1)  # (B, 2)
MASK = torch.ones(K * K, 2, dtype=D)


def toy(seed: int = 0):
    """Student (theta1, theta2) and teacher (phi1, phi2) logits tables, float64."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=D) for shape in [(K,), (K, K), (K,), (K, K)]]


def sequence_logits(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """(B, 2, K) next-token logits of every sequence: the first position's, then the row of the first token."""
    return torch.stack([first.expand(K * K, K), second[Y1]], dim=1)


def token_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """(B, 2) log-probs of the enumerated tokens."""
    return logits.log_softmax(-1).gather(-1, Y[..., None])[..., 0]


def grads(objective, theta1, theta2, phi1, phi2):
    """Gradient of objective(student logits (B, 2, K), teacher logits) w.r.t. theta1 and theta2."""
    t1, t2 = theta1.detach().requires_grad_(True), theta2.detach().requires_grad_(True)
    value = objective(sequence_logits(t1, t2), sequence_logits(phi1, phi2))
    return torch.autograd.grad(value, (t1, t2))


def sequence_kl(logits, teacher_logits):
    """The true KL(p || q) over the 9 sequences, by autograd through every probability."""
    lp, lq = token_logprobs(logits).sum(-1), token_logprobs(teacher_logits).sum(-1)  # (B,) log p(y), log q(y)
    return (lp.exp() * (lp - lq)).sum()


def forward_sequence_kl(logits, teacher_logits):
    """KL(q || p) over the 9 sequences."""
    lp, lq = token_logprobs(logits).sum(-1), token_logprobs(teacher_logits).sum(-1)
    return (lq.exp() * (lq - lp)).sum()


def reinforce(reward, *, gamma: float):
    """E_p[loss] with loss = sum_t -sg[G_t] log p(y_t), G_t the reward-to-go of reward(lp, lq) (B, 2).

    The sequence probability is a weight, detached: the student's log-prob is differentiated as a score function.
    """
    def objective(logits, teacher_logits):
        lp, lq = token_logprobs(logits), token_logprobs(teacher_logits)  # (B, 2)
        returns = distill.rewards_to_go(reward(lp, lq), MASK, gamma=gamma)  # (B, 2)
        weight = lp.sum(-1).exp().detach()  # (B,) p(y), the exact expectation's weight
        return (weight[:, None] * -(returns * lp)).sum()
    return objective


def expected(divergence):
    """E over the student's sequences of sum_t divergence_t: the prefixes' weights detached."""
    def objective(logits, teacher_logits):
        weight = token_logprobs(logits).sum(-1).exp().detach()  # (B,)
        return (weight[:, None] * divergence(logits, teacher_logits, MASK)).sum()
    return objective


# paper-index: distill.reverse_kl_reward
def test_reward_to_go_of_the_reverse_kl_reward_is_the_sequence_kl_gradient():
    # sum over t of -sg[rewards_to_go(reverse_kl_reward, gamma = 1)_t] log p(y_t), in expectation: grad KL(p || q)
    theta1, theta2, phi1, phi2 = toy(0)
    true = grads(sequence_kl, theta1, theta2, phi1, phi2)
    reverse_kl = lambda lp, lq: distill.reverse_kl_reward(lp, lq, MASK)  # noqa: E731
    sampled = grads(reinforce(reverse_kl, gamma=1.0), theta1, theta2, phi1, phi2)
    exact(sampled[0], true[0])
    exact(sampled[1], true[1])
    assert true[0].abs().max() > 0.1 and true[1].abs().max() > 0.05  # a gradient worth comparing


# paper-index: distill.full_reverse_kl
def test_tinkers_discount_zero_is_the_full_vocabulary_gradient_and_not_the_sequence_kl_one():
    # gamma = 0: each token its own reward. Its expected gradient is the full-vocabulary KL's (b), exactly; both miss
    # how the first token steers the second's KL, so theta1's gradient differs from the sequence KL's, theta2's not.
    theta1, theta2, phi1, phi2 = toy(0)
    reverse_kl = lambda lp, lq: distill.reverse_kl_reward(lp, lq, MASK)  # noqa: E731
    own = grads(reinforce(reverse_kl, gamma=0.0), theta1, theta2, phi1, phi2)
    full = grads(expected(distill.full_reverse_kl), theta1, theta2, phi1, phi2)
    true = grads(sequence_kl, theta1, theta2, phi1, phi2)
    exact(own[0], full[0])
    exact(own[1], full[1])
    exact(full[1], true[1])
    assert (full[0] - true[0]).abs().max() > 0.01


# paper-index: distill.full_reverse_kl
def test_full_reverse_kl_gradient_is_the_exact_per_position_gradient():
    # position 1 of every first token, and position 0: kl_toy.true_kl differentiates the plain formula
    theta1, theta2, phi1, phi2 = toy(1)
    logits = torch.stack([theta1.expand(K, K), theta2], dim=1).requires_grad_(True)  # (K, 2, K): row y1
    teacher = torch.stack([phi1.expand(K, K), phi2], dim=1)
    value = distill.full_reverse_kl(logits, teacher, torch.ones(K, 2))
    g = torch.autograd.grad(value.sum(), logits)[0]  # (K, 2, K)
    for y1 in range(K):
        for pos, (theta, phi) in enumerate([(theta1, phi1), (theta2[y1], phi2[y1])]):
            th = theta.clone().requires_grad_(True)
            kl_value = kl_toy.true_kl(th, phi)
            exact(value[y1, pos], kl_value)
            exact(g[y1, pos], torch.autograd.grad(kl_value, th)[0])


# paper-index: distill.sft_nll
def test_sft_on_teacher_samples_has_the_forward_sequence_kl_gradient():
    theta1, theta2, phi1, phi2 = toy(2)

    def sft(logits, teacher_logits):
        weight = token_logprobs(teacher_logits).sum(-1).exp()  # (B,) q(y): the TEACHER samples
        return (weight[:, None] * distill.sft_nll(token_logprobs(logits), MASK)).sum()

    sampled = grads(sft, theta1, theta2, phi1, phi2)
    true = grads(forward_sequence_kl, theta1, theta2, phi1, phi2)
    exact(sampled[0], true[0])
    exact(sampled[1], true[1])
    reverse = grads(sequence_kl, theta1, theta2, phi1, phi2)
    assert (true[0] - reverse[0]).abs().max() > 0.01  # forward, not reverse: a different direction


# paper-index: distill.mixed_reward
def test_mixed_reward_to_go_is_the_gradient_of_the_kl_regularised_task_objective():
    theta1, theta2, phi1, phi2 = toy(3)
    scores = (Y2 == 0).to(D) + 0.5 * (Y1 == 2).to(D)  # (B,) any task score of the whole sequence

    def regularised(logits, teacher_logits):  # kl_coef KL(p || q) - E_p[score], the loss to minimise
        weight = token_logprobs(logits).sum(-1).exp()  # (B,) p(y), differentiated
        return 0.3 * sequence_kl(logits, teacher_logits) - (weight * scores).sum()

    mixed = lambda lp, lq: distill.mixed_reward(lp, lq, scores, MASK, kl_coef=0.3)  # noqa: E731
    sampled = grads(reinforce(mixed, gamma=1.0), theta1, theta2, phi1, phi2)
    true = grads(regularised, theta1, theta2, phi1, phi2)
    exact(sampled[0], true[0])
    exact(sampled[1], true[1])


# --- a student equal to its teacher ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_student_equal_to_its_teacher_gets_exactly_zero_gradient(dtype):
    gen = torch.Generator().manual_seed(4)
    shared = (3 * torch.randn(4, 5, 11, generator=gen)).to(dtype)  # (B, T, V), the same logits for both
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    objectives = {f"jsd beta={b}": partial(distill.generalized_jsd, beta=b) for b in (0.0, 0.1, 0.5, 0.9, 1.0)}
    objectives["full_reverse_kl"] = distill.full_reverse_kl
    for name, fn in objectives.items():
        logits = shared.clone().requires_grad_(True)
        value = fn(logits, shared, mask)
        (g,) = torch.autograd.grad(losses.aggregate(value, mask, "token-mean"), logits)
        assert torch.equal(g, torch.zeros_like(g)), (name, g.abs().max())
        assert value.abs().max() <= 1e-6, name  # the value is 0 up to round-off (sums of exp of log-softmax)
    # the sampled rewards: r = 0 exactly, so every sample's REINFORCE gradient is exactly 0, discounted or not
    logits = shared.clone().requires_grad_(True)
    lp = logits.log_softmax(-1)[..., 0]  # (B, T) log-probs of token 0, say
    for r in (distill.reverse_kl_reward(lp, lp.detach(), mask),
              distill.mixed_reward(lp, lp.detach(), torch.zeros(4, dtype=dtype), mask, kl_coef=0.7)):
        for gamma in (0.0, 0.9, 1.0):
            loss = losses.aggregate(-distill.rewards_to_go(r, mask, gamma=gamma) * lp, mask, "token-mean")
            (g,) = torch.autograd.grad(loss, logits, retain_graph=True)
            assert torch.equal(g, torch.zeros_like(g))


# paper-index: distill.sft_nll
def test_sft_is_zero_only_in_expectation_when_the_student_equals_its_teacher():
    # SFT's expected gradient vanishes (up to round-off: a sum of +- terms), but each teacher sample still pulls:
    # the per-sample gradient of -log p(y) is onehot(y) - p, never 0. On-policy distillation's is exactly 0 (above).
    theta1, theta2, _, _ = toy(5)

    def sft(logits, teacher_logits):
        weight = token_logprobs(teacher_logits).sum(-1).exp()  # (B,) q(y)
        return (weight[:, None] * distill.sft_nll(token_logprobs(logits), MASK)).sum()

    expected = grads(sft, theta1, theta2, theta1, theta2)
    assert max(g.abs().max() for g in expected) < 1e-15
    one_sample = grads(lambda lg, _: distill.sft_nll(token_logprobs(lg), MASK)[0].sum(), theta1, theta2, theta1,
                       theta2)
    assert one_sample[0].abs().max() > 0.1


# --- the generalised JSD: its ends, its limits, its gradient ------------------------------------------------------
def plain_jsd(logits, teacher_logits, beta):
    """JSD(beta) by the definition, every term differentiated (the reference for the detached version)."""
    log_p, log_q = logits.log_softmax(-1), teacher_logits.log_softmax(-1)
    if beta == 0:
        return (log_q.exp() * (log_q - log_p)).sum(-1)
    if beta == 1:
        return (log_p.exp() * (log_p - log_q)).sum(-1)
    m = beta * log_q.exp() + (1 - beta) * log_p.exp()
    return (beta * log_q.exp() * (log_q - m.log()) + (1 - beta) * log_p.exp() * (log_p - m.log())).sum(-1)


def random_logits(seed: int, shape=(3, 4, 7), scale: float = 2.0):
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*shape, generator=gen, dtype=D), scale * torch.randn(*shape, generator=gen, dtype=D)


# paper-index: distill.generalized_jsd
@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_generalized_jsd_value_and_gradient_equal_the_definition(beta):
    # the function holds m (and the log-ratios) fixed in the backward pass; the definition differentiates them all
    student, teacher = random_logits(6)
    mask = torch.ones(3, 4)
    a, b = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
    ours, ref = distill.generalized_jsd(a, teacher, mask, beta=beta), plain_jsd(b, teacher, beta)
    exact(ours, ref)
    exact(torch.autograd.grad(ours.sum(), a)[0], torch.autograd.grad(ref.sum(), b)[0])


# paper-index: distill.generalized_jsd
def test_jsd_ends_are_forward_and_reverse_kl_as_in_trl_and_the_limits_of_the_rescaled_jsd():
    # TRL's convention (and minirl's): beta = 0 -> KL(teacher || student), beta = 1 -> KL(student || teacher)
    theta, phi = toy(7)[0], toy(7)[2]
    student, teacher, one = theta[None, None], phi[None, None], torch.ones(1, 1)
    exact(distill.generalized_jsd(student, teacher, one, beta=0.0)[0, 0], kl_toy.forward_kl(theta, phi))
    exact(distill.generalized_jsd(student, teacher, one, beta=1.0)[0, 0], kl_toy.true_kl(theta, phi))
    # the ends are limits of JSD(beta) / beta and JSD(beta) / (1 - beta), not of JSD(beta), which goes to 0
    small = 1e-6
    near0 = distill.generalized_jsd(student, teacher, one, beta=small)[0, 0]
    near1 = distill.generalized_jsd(student, teacher, one, beta=1 - small)[0, 0]
    assert near0 / small == pytest.approx(kl_toy.forward_kl(theta, phi).item(), rel=1e-4)
    assert near1 / small == pytest.approx(kl_toy.true_kl(theta, phi).item(), rel=1e-4)
    assert near0 < 1e-5 and near1 < 1e-5


# --- masks, detached teachers, bad input ------------------------------------------------------------------------
def test_fully_masked_rows_give_zero_not_nan():
    student, teacher = random_logits(8, shape=(2, 3, 5))
    student[1], teacher[1] = math.nan, math.inf  # row 1 is padding: anything may be there
    mask = t([1, 1, 0], [0, 0, 0])
    for fn in (distill.full_reverse_kl, *(partial(distill.generalized_jsd, beta=b) for b in (0.0, 0.5, 1.0))):
        logits = student.clone().requires_grad_(True)
        value = fn(logits, teacher, mask)
        assert torch.equal(value[1], torch.zeros(3, dtype=D)) and torch.isfinite(value).all()
        (g,) = torch.autograd.grad(losses.aggregate(value, mask, "token-mean"), logits)
        assert torch.isfinite(g).all() and torch.equal(g[1], torch.zeros(3, 5, dtype=D))
        empty = fn(logits, teacher, torch.zeros(2, 3))  # a fully masked batch: the token-mean is 0, not 0 / 0
        assert losses.aggregate(empty, torch.zeros(2, 3), "token-mean").item() == 0.0
    lp, lq = t([-1.0, -2.0, -1.0], [-math.inf, math.nan, -math.inf]), t([-0.5, -1.0, -1.0], [math.inf] * 3)
    assert torch.equal(distill.reverse_kl_reward(lp, lq, mask)[1], torch.zeros(3, dtype=D))
    assert torch.equal(distill.rewards_to_go(lq, mask, gamma=1.0)[1], torch.zeros(3, dtype=D))
    assert torch.equal(distill.sft_nll(lp, mask)[1], torch.zeros(3, dtype=D))
    assert torch.equal(distill.mixed_reward(lp, lq, t(1.0, math.nan), mask)[1], torch.zeros(3, dtype=D))


def test_the_teacher_gets_no_gradient():
    student, teacher = random_logits(9)
    mask = torch.ones(3, 4)
    for beta in (0.0, 0.5, 1.0):
        s, q = student.clone().requires_grad_(True), teacher.clone().requires_grad_(True)
        value = distill.generalized_jsd(s, q, mask, beta=beta)
        assert torch.autograd.grad(value.sum(), (s, q), allow_unused=True)[1] is None
    lq = teacher.log_softmax(-1)[..., 0].requires_grad_(True)  # (B, T) the teacher's token log-probs
    assert not distill.reverse_kl_reward(student[..., 0], lq, mask).requires_grad
    assert not distill.mixed_reward(student[..., 0], lq, torch.ones(3, dtype=D), mask).requires_grad


def test_bad_input_raises_naming_the_argument():
    lg, two, mask = torch.zeros(2, 3, 4), torch.zeros(2, 3), torch.ones(2, 3)
    cases = [
        ("logits", lambda: distill.full_reverse_kl(two, two, mask)),
        ("teacher_logits", lambda: distill.full_reverse_kl(lg, torch.zeros(2, 3, 5), mask)),
        ("mask", lambda: distill.generalized_jsd(lg, lg, torch.ones(2, 4), beta=0.5)),
        ("beta", lambda: distill.generalized_jsd(lg, lg, mask, beta=1.5)),
        ("temperature", lambda: distill.full_reverse_kl(lg, lg, mask, temperature=0.0)),
        ("teacher_logprobs", lambda: distill.reverse_kl_reward(two, torch.zeros(2, 4), mask)),
        ("logprobs", lambda: distill.reverse_kl_reward(lg, lg, mask)),
        ("mask", lambda: distill.sft_nll(two, torch.ones(3, 3))),
        ("gamma", lambda: distill.rewards_to_go(two, mask, gamma=1.5)),
        ("scores", lambda: distill.mixed_reward(two, two, torch.zeros(3), mask)),
        ("mask", lambda: distill.mixed_reward(two, two, torch.zeros(2), t([1, 0, 1], [1, 1, 1]))),
        ("kl_coef", lambda: distill.mixed_reward(two, two, torch.zeros(2), mask, kl_coef=-1.0)),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=name):
            call()


def test_the_trl_map_names_each_objective_or_refuses_it_with_the_reason():
    assert interop.distill_trl_kwargs("generalized_jsd", beta=0.5) == ("trl.DistillationTrainer",
                                                                  {"beta": 0.5, "temperature": 1.0})
    assert interop.distill_trl_kwargs("full_reverse_kl")[1]["beta"] == 1.0
    assert interop.distill_trl_kwargs("reverse_kl_reward")[1]["iw_opd_gamma"] == 0.0
    with pytest.raises(NotImplementedError, match="not a discount"):
        interop.distill_trl_kwargs("reverse_kl_reward", gamma=1.0)
    with pytest.raises(NotImplementedError, match="no reward function"):
        interop.distill_trl_kwargs("mixed_reward")
    with pytest.raises(ValueError, match="beta"):
        interop.distill_trl_kwargs("generalized_jsd")
    with pytest.raises(ValueError, match="unknown objective"):
        interop.distill_trl_kwargs("dpo")


# --- equality with TRL 1.16, on shared inputs ------------------------------------------------------------------------
# The student's logits, the teacher's, and a ragged mask with a fully masked row (TRL's labels: -100 outside it).
TRL_MASK = t([1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0])
TRL_LABELS = torch.where(TRL_MASK > 0, 0, -100)


def trl_module(name: str):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]' runs the bridge's tests")
    return pytest.importorskip(name)


def value_and_grad(loss_fn, logits):
    x = logits.clone().requires_grad_(True)
    loss = loss_fn(x)
    return loss.detach(), torch.autograd.grad(loss, x)[0]


def assert_same(ours, theirs, atol=1e-6):
    (v1, g1), (v2, g2) = ours, theirs
    assert abs(v1.item() - v2.item()) <= atol, (v1.item(), v2.item())
    assert (g1 - g2).abs().max().item() <= atol, (g1 - g2).abs().max().item()
    assert g1.abs().max() > 1e-3  # a gradient worth comparing


# paper-index: distill.generalized_jsd
@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_generalized_jsd_equals_trl_gkd_loss(beta, temperature):
    # GKDTrainer.generalized_jsd_loss is a staticmethod: called without a trainer, in float64, with TRL's default
    # reduction "batchmean" (the sum over the valid positions / their number) = minirl's token-mean
    GKDTrainer = trl_module("trl.experimental.gkd").GKDTrainer
    student, teacher = random_logits(10, shape=(3, 5, 7))

    def ours(x):
        jsd = distill.generalized_jsd(x, teacher, TRL_MASK, beta=beta, temperature=temperature)
        return losses.aggregate(jsd, TRL_MASK, "token-mean")

    def theirs(x):
        return GKDTrainer.generalized_jsd_loss(x, teacher, labels=TRL_LABELS, beta=beta, temperature=temperature)

    assert_same(value_and_grad(ours, student), value_and_grad(theirs, student), atol=1e-12)


# paper-index: distill.full_reverse_kl distill.generalized_jsd
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_generalized_jsd_equals_trl_distillation_trainer_loss(beta):
    # DistillationTrainer's loss, _chunked_divergence_loss, takes hidden states and lm_head weights: with the identity
    # as both lm_heads the hidden states are the logits. It computes in float32 (hence 1e-6, not float64's 1e-12).
    chunked = trl_module("trl.trainer.distillation_trainer")._chunked_divergence_loss
    student, teacher = random_logits(11, shape=(3, 5, 7))
    eye = torch.eye(7, dtype=D)
    kl = distill.full_reverse_kl if beta == 1.0 else partial(distill.generalized_jsd, beta=beta)
    ours = value_and_grad(lambda x: losses.aggregate(kl(x, teacher, TRL_MASK), TRL_MASK, "token-mean"), student)
    theirs = value_and_grad(lambda x: chunked(x, teacher, eye, eye, TRL_MASK, beta)[0], student)
    assert_same(ours, theirs, atol=1e-6)


# paper-index: distill.reverse_kl_reward distill.rewards_to_go
def test_reverse_kl_reward_with_discount_zero_equals_trl_iw_opd_loss():
    # IW-OPD with iw_opd_gamma = 0 weighs every token 1: its loss is the token-mean of -sg[log q - log p] log p, the
    # REINFORCE loss of the per-token reverse-KL reward with gamma = 0. The method reads five attributes of its
    # trainer; a namespace stands in for them, so no trainer (and no model) is built.
    IWOPDTrainer = trl_module("trl.experimental.iw_opd.iw_opd_trainer").IWOPDTrainer
    fake_trainer = SimpleNamespace(temperature=1.0, iw_opd_gamma=0.0, iw_opd_epsilon=1e-8,
                                   model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list)})
    student, teacher = random_logits(12, shape=(3, 5, 7))
    tokens = torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(12))  # the sampled completions
    teacher_lp = teacher.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]  # (B, T)

    def ours(x):
        lp = x.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]  # (B, T)
        returns = distill.rewards_to_go(distill.reverse_kl_reward(lp, teacher_lp, TRL_MASK), TRL_MASK, gamma=0.0)
        return losses.aggregate(-returns * lp, TRL_MASK, "token-mean")

    def theirs(x):
        return IWOPDTrainer._compute_iw_opd_loss(fake_trainer, x, tokens, TRL_LABELS, teacher_lp)

    assert_same(value_and_grad(ours, student), value_and_grad(theirs, student), atol=1e-12)
