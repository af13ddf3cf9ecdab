"""The checker's own reference solutions, in each exercise's signature: copies written with torch only.

The random cases compare a student's function with these, never with minirl's functions, so that while ``check``
runs minirl's implementation of the exercise can be refused (a submission that calls it is not graded), and so
that the checker is an independent second implementation of each equation. ``tests/test_exercises.py`` shows they
agree with minirl's functions on random inputs.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import Tensor

CAP = 20.0  # nats above which exp is continued by its tangent (minirl's checks.exp_linear_above)


def exp_lin(x: Tensor) -> Tensor:
    """exp(x), continued linearly above CAP nats: finite, increasing, with the exact gradient's sign."""
    return torch.where(x <= CAP, torch.exp(x.clamp(max=CAP)), math.exp(CAP) * (1 + (x - CAP)))


def completion_mask(completion_ids, eos_token_id):
    eos = torch.tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    is_eos = torch.isin(completion_ids, eos).long()
    return ((torch.cumsum(is_eos, 1) - is_eos) == 0).float()  # up to and including the first EOS


def token_logprobs(model, input_ids, attention_mask, n_prompt_tokens, *, temperature=1.0):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float() / temperature
    logits = logits[:, n_prompt_tokens - 1:-1]  # position t predicts token t + 1
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, n_prompt_tokens:, None]).squeeze(-1)


def sequence_logprobs(token_logprobs, mask, *, reduction="sum"):
    m = mask.to(token_logprobs.dtype)
    total = torch.where(m > 0, token_logprobs, 0.0).sum(-1)
    return total if reduction == "sum" else total / m.sum(-1).clamp(min=1)


def gae(rewards, values, mask, *, gamma=1.0, lam=0.95):
    m = mask.float()
    r, v = torch.where(m > 0, rewards.float(), 0.0), torch.where(m > 0, values.detach().float(), 0.0)
    adv = torch.zeros_like(r)
    next_v, next_a = torch.zeros(len(r)), torch.zeros(len(r))
    for t in reversed(range(r.shape[1])):
        adv[:, t] = (r[:, t] + gamma * next_v - v[:, t] + gamma * lam * next_a) * m[:, t]
        next_v, next_a = v[:, t] * m[:, t], adv[:, t]
    return adv, (adv + v) * m


def _token_mean(per_token, m):
    return torch.where(m > 0, per_token, 0.0).sum() / m.sum().clamp(min=1)


def _seq_mean_token_mean(per_token, m):
    n = m.sum(-1)
    per_seq = torch.where(m > 0, per_token, 0.0).sum(-1) / n.clamp(min=1)
    return (per_seq * (n > 0)).sum() / (n > 0).sum().clamp(min=1)


def clipped_surrogate(logprobs, old_logprobs, advantages, mask, *, eps_low=0.2, eps_high=None):
    eps_high = eps_low if eps_high is None else eps_high
    m = mask.to(logprobs.dtype)
    ratio = exp_lin(torch.where(m > 0, logprobs - old_logprobs.detach(), 0.0))
    a = advantages.unsqueeze(1)
    return _token_mean(torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps_low, 1 + eps_high)), m)


def value_loss(values, old_values, returns, mask, *, clip=0.2):
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    return _token_mean(0.5 * torch.maximum((values - returns) ** 2, (v_clip - returns) ** 2), mask.to(values.dtype))


def group_advantages(rewards, group_size, *, scale="group", eps=1e-4):
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards are not a whole number of groups of {group_size}")
    r = rewards.float().view(-1, group_size)
    equal = (r == r[:, :1]).all(1, keepdim=True)
    centred = torch.where(equal, 0.0, r - r.mean(1, keepdim=True))
    if scale == "group":
        centred = centred / torch.where(equal, 1.0, r.std(1, keepdim=True) + eps)
    return centred.view(-1)


def rloo_advantages(rewards, group_size, *, scale="none", eps=1e-4):
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards are not a whole number of groups of {group_size} >= 2")
    r = rewards.float().view(-1, group_size)
    others = (r.sum(1, keepdim=True) - r) / (group_size - 1)  # mean of the G - 1 other rewards
    adv = r - others
    equal = (r == r[:, :1]).all(1, keepdim=True)
    adv = torch.where(equal, 0.0, adv)
    if scale == "group":
        adv = adv / torch.where(equal, 1.0, r.std(1, keepdim=True) + eps)
    return adv.view(-1)


def k3(logprobs, ref_logprobs):
    log_r = ref_logprobs - logprobs
    return exp_lin(log_r) - 1 - log_r


def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, *, eps=0.2, beta=0.04):
    m = mask.to(logprobs.dtype)
    ratio = exp_lin(torch.where(m > 0, logprobs - old_logprobs.detach(), 0.0))
    a = advantages.unsqueeze(1)
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps, 1 + eps))
    kl = k3(logprobs, torch.where(m > 0, ref_logprobs.detach(), logprobs.detach()))
    return _seq_mean_token_mean(pg, m) + beta * _seq_mean_token_mean(kl, m)


def kl_reward(scores, logprobs, ref_logprobs, mask, *, beta):
    m = mask.float()
    n = m.sum(-1).long()
    out = -beta * (logprobs - ref_logprobs).detach() * m
    rows = torch.nonzero(n > 0).squeeze(1)
    out[rows, n[rows] - 1] += scores[rows]
    return out * m


def exact_kl(logits, ref_logits):
    logp, ref_logp = F.log_softmax(logits, -1), F.log_softmax(ref_logits, -1)
    p = logp.exp()
    return torch.where(p > 0, p * (logp - ref_logp), 0.0).sum(-1)


def aggregate(per_token, mask, mode, *, max_tokens=None):
    m = mask.to(per_token.dtype)
    if mode == "token-mean":
        return _token_mean(per_token, m)
    if mode == "seq-mean-token-mean":
        return _seq_mean_token_mean(per_token, m)
    n = m.sum(-1)
    per_seq = torch.where(m > 0, per_token, 0.0).sum(-1) / (max_tokens or per_token.shape[1])
    return (per_seq * (n > 0)).sum() / (n > 0).sum().clamp(min=1)


def overlong_penalty(lengths, *, max_len, cache_len):
    return ((max_len - cache_len - lengths.float()) / cache_len).clamp(-1, 0)


def has_signal(rewards, group_size):
    g = rewards.view(-1, group_size)
    return (g != g[:, :1]).any(1)


def sequence_ratio(logprobs, old_logprobs, mask):
    m = mask.to(logprobs.dtype)
    mean_lr = torch.where(m > 0, logprobs - old_logprobs.detach(), 0.0).sum(-1) / m.sum(-1).clamp(min=1)
    return exp_lin(mean_lr)


def gspo_loss(logprobs, old_logprobs, advantages, mask, *, eps_low=3e-4, eps_high=4e-4):
    s = sequence_ratio(logprobs, old_logprobs, mask)
    valid = mask.sum(-1) > 0
    per_seq = torch.maximum(-advantages * s, -advantages * s.clamp(1 - eps_low, 1 + eps_high))
    return (per_seq * valid).sum() / valid.sum().clamp(min=1)


def gspo_token_ratio(logprobs, old_logprobs, mask):
    s = sequence_ratio(logprobs.detach(), old_logprobs, mask)
    return s.unsqueeze(1) * torch.exp(logprobs - logprobs.detach())


def dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *, beta=0.1):
    h = (chosen_logps - ref_chosen_logps.detach()) - (rejected_logps - ref_rejected_logps.detach())
    return -F.logsigmoid(beta * h).mean()


def ipo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, *, tau=0.1):
    h = (chosen_logps - ref_chosen_logps.detach()) - (rejected_logps - ref_rejected_logps.detach())
    return ((h - 1 / (2 * tau)) ** 2).mean()


def simpo_loss_from_tokens(chosen_logprobs, chosen_mask, rejected_logprobs, rejected_mask, *, beta=2.0, gamma=1.0):
    c = sequence_logprobs(chosen_logprobs, chosen_mask, reduction="mean")
    r = sequence_logprobs(rejected_logprobs, rejected_mask, reduction="mean")
    return -F.logsigmoid(beta * (c - r) - gamma).mean()


def cispo_loss(logprobs, old_logprobs, advantages, mask, *, eps_low=0.2, eps_high=0.2):
    m = mask.to(logprobs.dtype)
    ratio = exp_lin(torch.where(m > 0, logprobs - old_logprobs, 0.0)).detach()
    weight = ratio.clamp(1 - eps_low, 1 + eps_high)  # sg(w), two-sided (the paper's eq. 5, verl)
    return _token_mean(-weight * advantages.unsqueeze(1) * torch.where(m > 0, logprobs, 0.0), m)


def sapo_loss(logprobs, old_logprobs, advantages, mask, *, tau_pos=1.0, tau_neg=1.05):
    m = mask.to(logprobs.dtype)
    ratio = exp_lin(torch.where(m > 0, logprobs - old_logprobs.detach(), 0.0))
    a = advantages.unsqueeze(1).expand_as(ratio)
    tau = torch.full_like(ratio, tau_neg).masked_fill(a > 0, tau_pos)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    return _seq_mean_token_mean(-gate * a, m)


def seq_is_weight(old_logprobs, sampler_logprobs, mask, *, cap=2.0, form="product"):
    valid = mask > 0
    log_w = torch.where(valid, old_logprobs.detach() - sampler_logprobs.detach(), 0.0).sum(-1)
    if form == "geomean":
        log_w = log_w / valid.sum(-1).clamp(min=1)
    return torch.exp(log_w.clamp(max=math.log(cap)))  # a row with no valid token: e^0 = 1


def align_sampler_routes(step_indices, batch_size):
    layers = []
    for layer in range(len(step_indices[0])):
        steps = [step[layer].reshape(batch_size, -1, step[layer].shape[-1]) for step in step_indices]
        routes = torch.cat(steps, dim=1)  # (B, P + T - 1, k): the positions the decode loop fed
        layers.append(torch.cat([routes, routes[:, -1:]], dim=1))  # the last sampled token was never fed
    return layers


def gmpo_loss(logprobs, old_logprobs, advantages, mask, *, eps_low=0.4, eps_high=0.4):
    m = mask.to(logprobs.dtype)
    log_r = torch.where(m > 0, logprobs - old_logprobs.detach(), 0.0)
    clipped = log_r.clamp(-eps_low, eps_high)
    a = advantages.unsqueeze(1)
    pessimistic = torch.where(a > 0, torch.minimum(log_r, clipped), torch.maximum(log_r, clipped))  # by A's sign
    n = m.sum(-1)
    weight = exp_lin(torch.where(m > 0, pessimistic, 0.0).sum(-1) / n.clamp(min=1))  # geometric mean of the ratios
    valid = n > 0
    return (-advantages * weight * valid).sum() / valid.sum().clamp(min=1)


def ratio_weighted_k3(logprobs, old_logprobs, ref_logprobs, mask):
    m = mask > 0
    lp = torch.where(m, logprobs, 0.0)
    ratio = exp_lin(lp - torch.where(m, old_logprobs.detach(), 0.0))  # differentiated, 1 in padding
    return torch.where(m, ratio * k3(lp, torch.where(m, ref_logprobs.detach(), lp.detach())), 0.0)


def token_covariance(logprobs, advantages, mask):
    m = mask > 0
    lp = logprobs.detach()
    a = advantages.detach().to(lp.dtype).unsqueeze(1).expand_as(lp)
    n = m.sum().clamp(min=1)
    lp_mean, a_mean = torch.where(m, lp, 0.0).sum() / n, torch.where(m, a, 0.0).sum() / n  # over the valid tokens
    return torch.where(m, (lp - lp_mean) * (a - a_mean), 0.0)


def pass_at_k(num_samples, num_correct, k):
    if k > int(num_samples.min()):
        raise ValueError(f"k = {k} exceeds the number of samples")
    out = []
    for n, c in zip(num_samples.tolist(), num_correct.tolist(), strict=True):
        out.append(1.0 - math.comb(n - c, k) / math.comb(n, k))  # exact integers, then one division
    return torch.tensor(out, dtype=torch.float64)


def reverse_kl_reward(logprobs, teacher_logprobs, mask):
    return torch.where(mask > 0, teacher_logprobs.detach() - logprobs.detach(), 0.0)


def full_reverse_kl(logits, teacher_logits, mask, *, temperature=1.0):
    keep = mask[..., None] > 0
    log_p = (torch.where(keep, logits, 0.0) / temperature).log_softmax(-1)
    log_q = (torch.where(keep, teacher_logits.detach(), 0.0) / temperature).log_softmax(-1)
    p = log_p.exp()
    kl = (p * torch.where(p > 0, log_p - log_q, 0.0)).sum(-1)  # 0 log 0 = 0
    return torch.where(mask > 0, kl, 0.0)


def decoupled_ppo_terms(logprobs, prox_logprobs, behaviour_logprobs, advantages, mask, *, eps_low=0.2,
                        eps_high=None, weight_cap=None):
    eps_high = eps_low if eps_high is None else eps_high
    m = mask > 0
    log_w = torch.where(m, prox_logprobs.detach() - behaviour_logprobs.detach(), 0.0)
    weight = exp_lin(log_w)  # pi_prox / mu, a constant
    if weight_cap is not None:
        weight = torch.where(log_w <= math.log(weight_cap), weight, 0.0)  # masked above the cap (AReaL)
    ratio = exp_lin(torch.where(m, logprobs - prox_logprobs.detach(), 0.0))  # the trust region: around pi_prox
    a = torch.where(m, advantages.detach().unsqueeze(1), 0.0)
    surrogate = torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps_low, 1 + eps_high))
    return torch.where(m, weight * surrogate, 0.0)


def off_policy_sequence_mask(logprobs, sampler_logprobs, advantages, mask, *, threshold):
    m = mask > 0
    log_r = torch.where(m, sampler_logprobs.detach() - logprobs.detach(), 0.0)  # log mu - log pi
    mean_log_r = log_r.sum(-1) / m.sum(-1).clamp(min=1)
    return ((advantages >= 0) | (mean_log_r <= threshold)).to(logprobs.dtype)


def episode_gae(rewards, values, model_mask, *, gamma=1.0, lam=0.95):
    # row by row: the model's tokens taken out in order, plain GAE on them, put back; 0 everywhere else
    adv, ret = torch.zeros(rewards.shape), torch.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        cols = (model_mask[b] > 0).nonzero().flatten()
        if len(cols):
            a, r = gae(rewards[b, cols][None], values[b, cols].detach()[None], torch.ones(1, len(cols)), gamma=gamma,
                       lam=lam)
            adv[b, cols], ret[b, cols] = a[0], r[0]
    return adv, ret


def bradley_terry_loss(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    # -log sigmoid of the difference (less the margin) by softplus, then the centring term on the sum
    diff = chosen_rewards - rejected_rewards - (margin if margin is not None else 0.0)
    loss = F.softplus(-diff).mean()
    return loss + center_coef * ((chosen_rewards + rejected_rewards) ** 2).mean() if center_coef else loss



def best_of_n_gold(proxy, gold, ns):
    # for each n: each prompt's proxy favourite among its first n samples (argmax keeps the first of equals)
    if min(ns) < 1 or max(ns) > proxy.shape[1]:
        raise ValueError("every n must be in [1, N]")
    return torch.stack([gold.gather(1, proxy[:, :n].argmax(1, keepdim=True)).double().mean() for n in ns])


def dppo_mask(logprobs, old_logprobs, advantages, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    # p = pi(y), q = mu(y); the bound is checked only on the side the advantage pushes p (up for A > 0)
    p, q = logprobs.detach().exp(), old_logprobs.detach().exp()
    if divergence == "tv":
        up_ok, down_ok = p - q <= delta_high, p - q >= -delta_low
    else:
        kl = q * (q.log() - p.log()) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        up_ok, down_ok = (kl <= delta_high) | (p <= q), (kl <= delta_low) | (p >= q)
    return torch.where(advantages > 0, up_ok, down_ok).to(logprobs.dtype)


def final_answer(text):
    # the first number after the last "####" when there is one, else the last number; "1,250" is one number
    number = re.compile(r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")  # a sign only after a space
    marked = re.findall(r"####([^\n]*)", text)
    found = number.findall(marked[-1].replace("$", " ")) if marked else number.findall(text.replace("$", " "))
    if not found:
        return None
    return float((found[0] if marked else found[-1]).replace(",", ""))


def rewards_to_go(rewards, mask, gamma):
    # each row backwards: A_t = r_t + gamma A_{t+1}, the padding's rewards read as 0, 0 outside the mask
    r = torch.where(mask > 0, rewards, 0.0)
    out, running = torch.zeros_like(r), torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running
        out[:, t] = running
    return torch.where(mask > 0, out, 0.0)


def reinforce_estimate(logits, actions, rewards, *, baseline=0.0):
    # mean over the samples of (r - b) times the score of a softmax policy, onehot(a) - pi
    pi = torch.softmax(logits.double(), -1)
    score = F.one_hot(actions, logits.shape[-1]).double() - pi  # (N, K)
    return ((rewards.double() - baseline)[:, None] * score).mean(0)
