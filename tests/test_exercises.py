"""The course kit's checker (minirl.exercises): it accepts minirl's own functions, and rejects every named realistic
mistake with the hint that names it.

Each wrong implementation below is a bug the field has made in public (token-mean vs sequence mean, ddof, eps inside
the sqrt, k3 upside down, an old log-prob that is not detached, a mask from the pad id, k3 in the reward, GSPO's
sequence term broadcast over tokens, GAE reading the value of padding, clip without eps_high, ...). The hand
arithmetic of every case lives next to the case in minirl/exercises.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from minirl import advantages, exercises, kl, losses, preference, rewards, rollout, sampling

# ----------------------------------------------------------------------------------------------------------------
# minirl's own functions, in each exercise's signature


def ref_grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages_, mask, eps=0.2, beta=0.04):
    pg, _ = losses.policy_loss(logprobs, old_logprobs, advantages_, mask, eps_low=eps, agg="seq-mean-token-mean")
    return pg + beta * losses.aggregate(kl.kl_in_loss(logprobs, ref_logprobs, estimator="k3"), mask,
                                        "seq-mean-token-mean")


def ref_kl_reward(scores, logprobs, ref_logprobs, mask, beta):
    return kl.kl_in_reward(rewards.token_level_rewards(scores, mask), logprobs, ref_logprobs, beta=beta,
                           estimator="k1") * mask


def ref_sequence_ratio(logprobs, old_logprobs, mask):
    """GSPO's s_i read from minirl's policy_loss: its stats are per token, so take it from the loss instead."""
    # with A = -1 and a clip range that never binds, the sequence loss of a single row is s_i itself
    return torch.stack([losses.policy_loss(logprobs[i:i + 1], old_logprobs[i:i + 1], -torch.ones(1), mask[i:i + 1],
                                           eps_low=0.999, eps_high=1e9, level="sequence", agg="seq-mean-token-mean")[0]
                        if mask[i].sum() > 0
                        else logprobs.new_ones(()) for i in range(len(mask))])


def ref_gspo_loss(logprobs, old_logprobs, advantages_, mask, eps_low=3e-4, eps_high=4e-4):
    return losses.policy_loss(logprobs, old_logprobs, advantages_, mask, eps_low=eps_low, eps_high=eps_high,
                              level="sequence",
                              agg="seq-mean-token-mean")


def ref_gspo_token_ratio(logprobs, old_logprobs, mask):
    # sg[s_i] * pi / sg[pi], with s_i from the sequence level
    s = ref_sequence_ratio(logprobs.detach(), old_logprobs, mask)  # (B,)
    return s.unsqueeze(1) * torch.exp(logprobs - logprobs.detach())


def ref_simpo_from_tokens(chosen_logprobs, chosen_mask, rejected_logprobs, rejected_mask, beta=2.0, gamma=1.0):
    return preference.simpo_loss(rollout.sequence_logprobs(chosen_logprobs, chosen_mask, reduction="mean"),
                                 rollout.sequence_logprobs(rejected_logprobs, rejected_mask,
                                                           reduction="mean"), beta=beta, gamma=gamma)


# minirl takes its settings by keyword; the exercises' signatures take them positionally (a student's first
# version), so minirl's functions are passed in behind the exercise's own signature
REFERENCE = {
    "completion_mask": rollout.completion_mask,
    "token_logprobs": lambda model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0: rollout.token_logprobs(
        model, input_ids, attention_mask, n_prompt_tokens, temperature=temperature),
    "sequence_logprobs": lambda token_logprobs, mask, reduction="sum": rollout.sequence_logprobs(
        token_logprobs, mask, reduction=reduction),
    "gae": lambda rewards, values, mask, gamma=1.0, lam=0.95: advantages.gae(rewards, values, mask, gamma=gamma,
                                                                             lam=lam),
    "clipped_surrogate": lambda logprobs, old_logprobs, adv, mask, eps_low=0.2, eps_high=None: losses.policy_loss(
        logprobs, old_logprobs, adv, mask, eps_low=eps_low, eps_high=eps_high),
    "value_loss": lambda values, old_values, returns, mask, clip=0.2: losses.value_loss(
        values, old_values, returns, mask, clip=clip),
    "group_advantages": lambda rewards, group_size, scale="group", eps=1e-4: advantages.group_advantages(
        rewards, group_size, scale=scale, eps=eps),
    "grpo_loss": ref_grpo_loss,
    "k3": kl.k3,
    "kl_reward": ref_kl_reward,
    "exact_kl": kl.exact_token_kl,
    "aggregate": lambda per_token, mask, mode, max_tokens=None: losses.aggregate(per_token, mask, mode,
                                                                                max_tokens=max_tokens),
    "overlong_penalty": lambda lengths, max_len, cache_len: rewards.overlong_penalty(lengths, max_len=max_len,
                                                                                     cache_len=cache_len),
    "has_signal": sampling.has_signal,
    "sequence_ratio": ref_sequence_ratio,
    "gspo_loss": ref_gspo_loss,
    "gspo_token_ratio": ref_gspo_token_ratio,
    "dpo_loss": lambda c, r, ref_c, ref_r, beta=0.1: preference.dpo_loss(c, r, ref_c, ref_r, beta=beta),
    "ipo_loss": lambda c, r, ref_c, ref_r, tau=0.1: preference.ipo_loss(c, r, ref_c, ref_r, tau=tau),
    "simpo_loss_from_tokens": ref_simpo_from_tokens,
}


# ----------------------------------------------------------------------------------------------------------------
# the named mistakes

# 00 · completion_mask


def mask_from_pad_id(ids, eos):
    return (ids != 0).float()  # minirl's tokenizer pads with id 0


def mask_excludes_eos(ids, eos):
    is_eos = ids == eos
    return (torch.cumsum(is_eos.long(), 1) == 0).float()


def mask_single_eos_only(ids, eos):
    eos = eos if isinstance(eos, int) else eos[0]
    is_eos = (ids == eos).long()
    return ((torch.cumsum(is_eos, 1) - is_eos) == 0).float()


# 00 · token_logprobs


def logprobs_off_by_one(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, n_prompt_tokens:] / temperature
    return F.log_softmax(logits.float(), -1).gather(-1, input_ids[:, n_prompt_tokens:, None]).squeeze(-1)


def logprobs_ignore_temperature(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0):
    return rollout.token_logprobs(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0)


def logprobs_without_attention_mask(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0):
    logits = model(input_ids=input_ids).logits[:, n_prompt_tokens - 1:-1] / temperature
    return F.log_softmax(logits.float(), -1).gather(-1, input_ids[:, n_prompt_tokens:, None]).squeeze(-1)


def logprobs_no_grad(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0):
    with torch.no_grad():
        return rollout.token_logprobs(model, input_ids, attention_mask, n_prompt_tokens, temperature=temperature)


# 00 · sequence_logprobs


def seq_logprobs_unmasked(token_logprobs, mask, reduction="sum"):
    return token_logprobs.sum(-1) if reduction == "sum" else token_logprobs.mean(-1)


def seq_logprobs_mean_over_T(token_logprobs, mask, reduction="sum"):
    total = (token_logprobs * mask).sum(-1)
    return total if reduction == "sum" else total / mask.shape[1]


def seq_logprobs_nan_on_empty(token_logprobs, mask, reduction="sum"):
    total = (token_logprobs * mask).sum(-1)
    return total if reduction == "sum" else total / mask.sum(-1)


# 01 · gae


def gae_reads_padding_value(rewards_, values, mask, gamma=1.0, lam=0.95):
    """Bootstraps from values[:, t + 1] whatever the mask says (the classic padded-batch GAE)."""
    values = values.detach()
    B, T = rewards_.shape
    adv = torch.zeros_like(rewards_)
    last = torch.zeros(B)
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros(B)
        delta = rewards_[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv * mask, (adv + values) * mask


def gae_lam_without_gamma(rewards_, values, mask, gamma=1.0, lam=0.95):
    values, mask = values.detach(), mask.float()
    adv = torch.zeros_like(rewards_)
    next_v, next_a = torch.zeros(len(mask)), torch.zeros(len(mask))
    for t in reversed(range(rewards_.shape[1])):
        delta = rewards_[:, t] + gamma * next_v - values[:, t]
        adv[:, t] = (delta + lam * next_a) * mask[:, t]
        next_v, next_a = values[:, t] * mask[:, t], adv[:, t]
    return adv, (adv + values) * mask


def gae_returns_reward_to_go(rewards_, values, mask, gamma=1.0, lam=0.95):
    adv, _ = advantages.gae(rewards_, values, mask, gamma=gamma, lam=lam)
    ret = torch.zeros_like(rewards_)
    running = torch.zeros(len(mask))
    for t in reversed(range(rewards_.shape[1])):
        running = (rewards_[:, t] + gamma * running) * mask[:, t]
        ret[:, t] = running
    return adv, ret


def gae_values_not_detached(rewards_, values, mask, gamma=1.0, lam=0.95):
    adv, _ = advantages.gae(rewards_, values.detach(), mask, gamma=gamma, lam=lam)
    return adv + 0 * values, (adv + values) * mask


# 01 · clipped surrogate (token level, token-mean)


def _surrogate(logprobs, old_logprobs, adv, mask, eps_low, eps_high, *, upside_down=False, detach_old=True,
               optimistic=False, clamp=True, agg="token-mean"):
    eps_high = eps_low if eps_high is None else eps_high
    old = old_logprobs.detach() if detach_old else old_logprobs
    log_ratio = (old - logprobs if upside_down else logprobs - old) * mask
    ratio = torch.exp(log_ratio.clamp(-20, 20) if clamp else log_ratio)
    a = adv.unsqueeze(1)
    unclipped, clipped = -a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = torch.minimum(unclipped, clipped) if optimistic else torch.maximum(unclipped, clipped)
    return losses.aggregate(per_token, mask, agg)


def surrogate_ratio_upside_down(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return _surrogate(lp, old, adv, mask, eps_low, eps_high, upside_down=True)


def surrogate_old_not_detached(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return _surrogate(lp, old, adv, mask, eps_low, eps_high, detach_old=False)


def surrogate_min_not_max(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return _surrogate(lp, old, adv, mask, eps_low, eps_high, optimistic=True)


def surrogate_without_eps_high(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return _surrogate(lp, old, adv, mask, eps_low, None)


def surrogate_eps_high_both_sides(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    eps_high = eps_low if eps_high is None else eps_high
    return _surrogate(lp, old, adv, mask, eps_high, eps_high)


def surrogate_seq_mean(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return _surrogate(lp, old, adv, mask, eps_low, eps_high, agg="seq-mean-token-mean")


def surrogate_exp_before_mask(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    eps_high = eps_low if eps_high is None else eps_high
    ratio = torch.exp(lp - old.detach())  # no clamp, mask applied after exp: inf * 0 = NaN
    a = adv.unsqueeze(1)
    per_token = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    return (per_token * mask).sum() / mask.sum()


# 01 · value_loss


def value_loss_min(values, old_values, returns, mask, clip=0.2):
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    per_token = 0.5 * torch.minimum((values - returns) ** 2, (v_clip - returns) ** 2)
    return losses.aggregate(per_token, mask, "token-mean")


def value_loss_clip_around_returns(values, old_values, returns, mask, clip=0.2):
    v_clip = returns + torch.clamp(values - returns, -clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return losses.aggregate(per_token, mask, "token-mean")


def value_loss_without_half(values, old_values, returns, mask, clip=0.2):
    return 2 * losses.value_loss(values, old_values, returns, mask, clip=clip)[0]


# 02 · group_advantages


def group_adv_ddof0(r, group_size, scale="group", eps=1e-4):
    g = r.view(-1, group_size)
    centred = g - g.mean(1, keepdim=True)
    if scale == "group":
        centred = centred / (g.std(1, unbiased=False, keepdim=True) + eps)
    return centred.view(-1)


def group_adv_eps_inside_sqrt(r, group_size, scale="group", eps=1e-4):
    g = r.view(-1, group_size)
    centred = g - g.mean(1, keepdim=True)
    equal = (g == g[:, :1]).all(1, keepdim=True)
    if scale == "group":
        centred = torch.where(equal, 0.0, centred / torch.sqrt(g.var(1, keepdim=True) + eps))
    return centred.view(-1)


def group_adv_strided_groups(r, group_size, scale="group", eps=1e-4):
    """Reads group j as rows j, j + n, j + 2n, ... (a (G, n) view): wrong for minirl's group-by-group layout."""
    g = r.view(group_size, -1).t()  # (n, G)
    centred = g - g.mean(1, keepdim=True)
    equal = (g == g[:, :1]).all(1, keepdim=True)
    if scale == "group":
        centred = torch.where(equal, 0.0, centred / (g.std(1, keepdim=True) + eps))
    return centred.t().reshape(-1)


def group_adv_nan_on_equal(r, group_size, scale="group", eps=1e-4):
    g = r.view(-1, group_size)
    centred = g - g.mean(1, keepdim=True)
    if scale == "group":
        centred = centred / (g.std(1, keepdim=True) + eps)
    return centred.view(-1)


def group_adv_none_still_divides(r, group_size, scale="group", eps=1e-4):
    return advantages.group_advantages(r, group_size, scale="group", eps=eps)


# 02 · grpo_loss


def grpo_token_mean(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg, _ = losses.policy_loss(lp, old, adv, mask, eps_low=eps, agg="token-mean")
    return pg + beta * losses.aggregate(kl.k3(lp, ref.detach()), mask, "token-mean")


def grpo_k3_upside_down(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg, _ = losses.policy_loss(lp, old, adv, mask, eps_low=eps, agg="seq-mean-token-mean")
    log_r = lp - ref.detach()
    return pg + beta * losses.aggregate(log_r.exp() - 1 - log_r, mask, "seq-mean-token-mean")


def grpo_kl_detached(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg, _ = losses.policy_loss(lp, old, adv, mask, eps_low=eps, agg="seq-mean-token-mean")
    return pg + beta * losses.aggregate(kl.k3(lp, ref).detach(), mask, "seq-mean-token-mean")


def grpo_k1_in_loss(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg, _ = losses.policy_loss(lp, old, adv, mask, eps_low=eps, agg="seq-mean-token-mean")
    return pg + beta * losses.aggregate(kl.k1(lp, ref.detach()), mask, "seq-mean-token-mean")


# 03 · k3


def k3_upside_down(lp, ref):
    log_r = lp - ref
    return log_r.exp() - 1 - log_r


def k3_plus_log(lp, ref):
    log_r = ref - lp
    return log_r.exp() - 1 + log_r


def k3_no_clamp(lp, ref):
    log_r = ref - lp
    return log_r.exp() - 1 - log_r


# 03 · kl_reward


def kl_reward_score_on_last_column(scores, lp, ref, mask, beta):
    out = -beta * (lp - ref).detach() * mask
    out[:, -1] += scores
    return out


def kl_reward_with_k3(scores, lp, ref, mask, beta):
    return kl.kl_in_reward(rewards.token_level_rewards(scores, mask), lp, ref, beta=beta, estimator="k3") * mask


def kl_reward_not_detached(scores, lp, ref, mask, beta):
    return (rewards.token_level_rewards(scores, mask) - beta * (lp - ref)) * mask


def kl_reward_plus_kl(scores, lp, ref, mask, beta):
    return (rewards.token_level_rewards(scores, mask) + beta * (lp - ref).detach()) * mask


# 03 · exact_kl


def exact_kl_reversed(logits, ref_logits):
    return kl.exact_token_kl(ref_logits, logits)


def exact_kl_naive_zero_prob(logits, ref_logits):
    logp, ref_logp = F.log_softmax(logits, -1), F.log_softmax(ref_logits, -1)
    return (logp.exp() * (logp - ref_logp)).sum(-1)


def exact_kl_unnormalised(logits, ref_logits):
    return (F.softmax(logits, -1) * (logits - ref_logits)).sum(-1)


# 04 · aggregate


def agg_always_token_mean(x, mask, mode, max_tokens=None):
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_divides_by_T(x, mask, mode, max_tokens=None):
    if mode == "seq-mean-token-mean":
        return (x * mask).mean(-1).mean()
    return losses.aggregate(x, mask, mode, max_tokens=max_tokens)


def agg_drgrpo_by_length(x, mask, mode, max_tokens=None):
    if mode == "seq-mean-token-sum-norm":
        mode = "seq-mean-token-mean"
    return losses.aggregate(x, mask, mode, max_tokens=max_tokens)


def agg_drgrpo_ignores_max_tokens(x, mask, mode, max_tokens=None):
    return losses.aggregate(x, mask, mode, max_tokens=None)


def agg_counts_empty_rows(x, mask, mode, max_tokens=None):
    if mode == "token-mean":
        return losses.aggregate(x, mask, mode)
    n = mask.sum(-1)
    per_seq = (x * mask).sum(-1) / (n.clamp(min=1) if mode == "seq-mean-token-mean" else (max_tokens or x.shape[1]))
    return per_seq.mean()


def agg_nan_on_empty_batch(x, mask, mode, max_tokens=None):
    if mode == "token-mean":
        return (x * mask).sum() / mask.sum()
    valid = mask.sum(-1) > 0
    return losses.aggregate(x, mask, mode, max_tokens=max_tokens) * valid.sum() / valid.sum()


# 04 · overlong_penalty


def overlong_ramp_late(lengths, max_len, cache_len):
    return ((max_len - cache_len - lengths.float() + 1) / cache_len).clamp(-1, 0)


def overlong_sign_flipped(lengths, max_len, cache_len):
    return -rewards.overlong_penalty(lengths, max_len=max_len, cache_len=cache_len)


def overlong_not_clamped_beyond(lengths, max_len, cache_len):
    return ((max_len - cache_len - lengths.float()) / cache_len).clamp(max=0)


# 04 · has_signal


def signal_any_correct(r, group_size):
    return (r.view(-1, group_size) > 0).any(1)


def signal_strided_groups(r, group_size):
    g = r.view(group_size, -1)
    return (g != g[:1]).any(0)


# 05 · sequence_ratio


def seq_ratio_product(lp, old, mask):
    return torch.exp(((lp - old.detach()) * mask).sum(-1))


def seq_ratio_mean_over_T(lp, old, mask):
    return torch.exp(((lp - old.detach()) * mask).mean(-1))


def seq_ratio_arithmetic(lp, old, mask):
    return (torch.exp(lp - old.detach()) * mask).sum(-1) / mask.sum(-1).clamp(min=1) + (mask.sum(-1) == 0)


def seq_ratio_old_not_detached(lp, old, mask):
    return torch.exp(((lp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1))


# 05 · gspo_loss


def gspo_broadcast_over_tokens(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    s = torch.exp(((lp - old.detach()) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    a = adv.unsqueeze(1)
    s = s.unsqueeze(1).expand_as(lp)
    per_token = torch.maximum(-a * s, -a * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    return losses.aggregate(per_token, mask, "token-mean")


def gspo_token_level_ratio(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    return losses.policy_loss(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, agg="seq-mean-token-mean")


def gspo_old_not_detached(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    s = torch.exp(((lp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    per_seq = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    return per_seq.mean()


# 05 · gspo_token_ratio


def gspo_token_no_stop_gradient(lp, old, mask):
    s = torch.exp(((lp - old.detach()) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    return s.unsqueeze(1).expand_as(lp)


def gspo_token_fully_detached(lp, old, mask):
    return gspo_token_no_stop_gradient(lp, old, mask).detach()


# 06 · dpo_loss


def _h(c, r, rc, rr):
    return (c - rc.detach()) - (r - rr.detach())


def dpo_beta_outside(c, r, rc, rr, beta=0.1):
    return -(beta * F.logsigmoid(_h(c, r, rc, rr))).mean()


def dpo_no_reference(c, r, rc, rr, beta=0.1):
    return -F.logsigmoid(beta * (c - r)).mean()


def dpo_reference_added(c, r, rc, rr, beta=0.1):
    return -F.logsigmoid(beta * ((c + rc) - (r + rr))).mean()


def dpo_sum_over_batch(c, r, rc, rr, beta=0.1):
    return -F.logsigmoid(beta * _h(c, r, rc, rr)).sum()


def dpo_naive_log_sigmoid(c, r, rc, rr, beta=0.1):
    return -torch.log(torch.sigmoid(beta * _h(c, r, rc, rr))).mean()


def dpo_reference_not_detached(c, r, rc, rr, beta=0.1):
    return -F.logsigmoid(beta * ((c - rc) - (r - rr))).mean()


# 06 · ipo_loss


def ipo_target_one_over_tau(c, r, rc, rr, tau=0.1):
    return ((_h(c, r, rc, rr) - 1 / tau) ** 2).mean()


def ipo_tau_scales_margin(c, r, rc, rr, tau=0.1):
    return ((tau * _h(c, r, rc, rr) - 1 / (2 * tau)) ** 2).mean()


def ipo_no_reference(c, r, rc, rr, tau=0.1):
    return (((c - r) - 1 / (2 * tau)) ** 2).mean()


# 06 · simpo from tokens


def simpo_sum_not_mean(c, cm, r, rm, beta=2.0, gamma=1.0):
    return preference.simpo_loss((c * cm).sum(-1), (r * rm).sum(-1), beta=beta, gamma=gamma)


def simpo_mean_over_T(c, cm, r, rm, beta=2.0, gamma=1.0):
    return preference.simpo_loss((c * cm).mean(-1), (r * rm).mean(-1), beta=beta, gamma=gamma)


def simpo_gamma_inside_beta(c, cm, r, rm, beta=2.0, gamma=1.0):
    cs, rs = rollout.sequence_logprobs(c, cm, reduction="mean"), rollout.sequence_logprobs(r, rm, reduction="mean")
    return -F.logsigmoid(beta * (cs - rs - gamma)).mean()


def simpo_naive_log_sigmoid(c, cm, r, rm, beta=2.0, gamma=1.0):
    cs, rs = rollout.sequence_logprobs(c, cm, reduction="mean"), rollout.sequence_logprobs(r, rm, reduction="mean")
    return -torch.log(torch.sigmoid(beta * (cs - rs) - gamma)).mean()


MISTAKES = [
    # (exercise, mistake name, wrong implementation, substring of the expected hint)
    ("completion_mask", "mask from the pad id", mask_from_pad_id, "inferred from the pad id"),
    ("completion_mask", "EOS excluded", mask_excludes_eos, "INCLUDING the first EOS"),
    ("completion_mask", "a single EOS id only", mask_single_eos_only, "may be a list"),
    ("token_logprobs", "logits read one position late", logprobs_off_by_one, "off by one"),
    ("token_logprobs", "temperature ignored", logprobs_ignore_temperature, "same temperature"),
    ("token_logprobs", "no attention mask", logprobs_without_attention_mask, "attention mask was not passed"),
    ("token_logprobs", "computed under no_grad", logprobs_no_grad, "differentiable"),
    ("sequence_logprobs", "padding not masked", seq_logprobs_unmasked, "mask them before reducing"),
    ("sequence_logprobs", "mean over the padded length", seq_logprobs_mean_over_T, "padded length T"),
    ("sequence_logprobs", "NaN for an empty row", seq_logprobs_nan_on_empty, "0/0 = NaN"),
    ("gae", "bootstraps from the value of padding", gae_reads_padding_value, "value of a padding position"),
    ("gae", "lam without gamma", gae_lam_without_gamma, "gamma * lam, not lam alone"),
    ("gae", "returns as reward-to-go", gae_returns_reward_to_go, "not the discounted reward-to-go"),
    ("gae", "values not detached", gae_values_not_detached, "values must enter GAE as constants"),
    ("clipped_surrogate", "ratio upside down", surrogate_ratio_upside_down, "ratio is upside down"),
    ("clipped_surrogate", "old log-prob not detached", surrogate_old_not_detached, "detach the behaviour"),
    ("clipped_surrogate", "min instead of max", surrogate_min_not_max, "optimistic branch"),
    ("clipped_surrogate", "clip without eps_high", surrogate_without_eps_high, "clip without eps_high"),
    ("clipped_surrogate", "eps_high on both sides", surrogate_eps_high_both_sides, "lower bound 1 - eps_low"),
    ("clipped_surrogate", "seq-mean instead of token-mean", surrogate_seq_mean, "GRPO's seq-mean-token-mean"),
    ("clipped_surrogate", "exp before the mask, no clamp", surrogate_exp_before_mask, "overflows exp()"),
    ("value_loss", "min instead of max", value_loss_min, "MAX of the two squared errors"),
    ("value_loss", "clip around the returns", value_loss_clip_around_returns, "never binds"),
    ("value_loss", "without the 0.5", value_loss_without_half, "HALF the squared error"),
    ("group_advantages", "std with ddof=0", group_adv_ddof0, "ddof=0"),
    ("group_advantages", "eps inside the sqrt", group_adv_eps_inside_sqrt, "eps is inside the square root"),
    ("group_advantages", "groups read with a stride", group_adv_strided_groups, "laid out group by group"),
    ("group_advantages", "NaN for a group of equal rewards", group_adv_nan_on_equal, "never NaN"),
    ("group_advantages", "Dr. GRPO still divides by the std", group_adv_none_still_divides, "removes the std"),
    ("grpo_loss", "token-mean aggregation", grpo_token_mean, "DAPO's mode, not GRPO's"),
    ("grpo_loss", "k3 upside down", grpo_k3_upside_down, "k3's ratio is upside down"),
    ("grpo_loss", "KL detached in the loss", grpo_kl_detached, "carries no gradient"),
    ("grpo_loss", "k1 in the loss", grpo_k1_in_loss, "k1 = log pi - log ref in the loss"),
    ("k3", "ratio upside down", k3_upside_down, "k3's ratio is upside down"),
    ("k3", "plus log r", k3_plus_log, "MINUS log r"),
    ("k3", "no clamp before exp", k3_no_clamp, "overflows exp()"),
    ("kl_reward", "score on the last column", kl_reward_score_on_last_column, "LAST VALID token"),
    ("kl_reward", "k3 in the reward", kl_reward_with_k3, "KL from a k3 placed in the reward"),
    ("kl_reward", "KL not detached", kl_reward_not_detached, "detach the KL"),
    ("kl_reward", "KL added", kl_reward_plus_kl, "the KL is a penalty"),
    ("exact_kl", "KL(ref || pi)", exact_kl_reversed, "the forward KL"),
    ("exact_kl", "0 * log 0 = NaN", exact_kl_naive_zero_prob, "0 * log 0 = NaN"),
    ("exact_kl", "logits used as log-probs", exact_kl_unnormalised, "unnormalised"),
    ("aggregate", "token-mean for every mode", agg_always_token_mean, "DAPO's mode, not GRPO's"),
    ("aggregate", "divides each row by T", agg_divides_by_T, "padded length T"),
    ("aggregate", "Dr. GRPO divides by each row's length", agg_drgrpo_by_length, "constant max_tokens"),
    ("aggregate", "Dr. GRPO ignores max_tokens", agg_drgrpo_ignores_max_tokens, "use max_tokens"),
    ("aggregate", "empty rows counted", agg_counts_empty_rows, "left out of the mean over sequences"),
    ("aggregate", "NaN for a fully masked batch", agg_nan_on_empty_batch, "fully masked batch"),
    ("overlong_penalty", "ramp one token late", overlong_ramp_late, "off by one"),
    ("overlong_penalty", "sign flipped", overlong_sign_flipped, "sign is flipped"),
    ("overlong_penalty", "not clamped beyond max_len", overlong_not_clamped_beyond, "stays at -1"),
    ("has_signal", "any correct answer", signal_any_correct, "ALL correct"),
    ("has_signal", "groups read with a stride", signal_strided_groups, "laid out group by group"),
    ("sequence_ratio", "product of the ratios", seq_ratio_product, "product of the token ratios"),
    ("sequence_ratio", "mean over the padded length", seq_ratio_mean_over_T, "padded length T"),
    ("sequence_ratio", "arithmetic mean", seq_ratio_arithmetic, "arithmetic mean"),
    ("sequence_ratio", "old log-prob not detached", seq_ratio_old_not_detached, "detach the behaviour"),
    ("gspo_loss", "sequence term broadcast over tokens", gspo_broadcast_over_tokens, "broadcast over the tokens"),
    ("gspo_loss", "token-level ratios", gspo_token_level_ratio, "token-level ratios"),
    ("gspo_loss", "old log-prob not detached", gspo_old_not_detached, "detach the behaviour"),
    ("gspo_token_ratio", "no stop-gradient on s_i", gspo_token_no_stop_gradient, "without the stop-gradient"),
    ("gspo_token_ratio", "fully detached", gspo_token_fully_detached, "carries no gradient"),
    ("dpo_loss", "beta outside the log-sigmoid", dpo_beta_outside, "INSIDE the log-sigmoid"),
    ("dpo_loss", "no reference", dpo_no_reference, "reference model is missing"),
    ("dpo_loss", "reference added", dpo_reference_added, "MINUS log ref"),
    ("dpo_loss", "sum over the batch", dpo_sum_over_batch, "MEAN over the pairs"),
    ("dpo_loss", "naive log(sigmoid)", dpo_naive_log_sigmoid, "numerically stable log-sigmoid"),
    ("dpo_loss", "reference not detached", dpo_reference_not_detached, "reference model is frozen"),
    ("ipo_loss", "target 1 / tau", ipo_target_one_over_tau, "1 / (2 tau), not 1 / tau"),
    ("ipo_loss", "tau scales the margin", ipo_tau_scales_margin, "raw log-ratio margin"),
    ("ipo_loss", "no reference", ipo_no_reference, "reference model is missing"),
    ("simpo_loss_from_tokens", "sum instead of mean", simpo_sum_not_mean, "SimPO with sum instead of mean"),
    ("simpo_loss_from_tokens", "mean over the padded length", simpo_mean_over_T, "padded length T"),
    ("simpo_loss_from_tokens", "gamma inside beta", simpo_gamma_inside_beta, "absolute margin"),
    ("simpo_loss_from_tokens", "naive log(sigmoid)", simpo_naive_log_sigmoid, "numerically stable log-sigmoid"),
]


# ----------------------------------------------------------------------------------------------------------------
# the tests


def test_kit_size():
    """At least 15 exercises over the 7 chapters, 2-4 per chapter; every exercise has a reference here."""
    names = exercises.list_exercises()
    assert len(names) >= 15
    for chapter in ("00", "01", "02", "03", "04", "05", "06"):
        assert 2 <= len(exercises.list_exercises(chapter)) <= 4, chapter
    assert set(REFERENCE) == set(names)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_accepts_minirl(name, capsys):
    n = exercises.check(name, REFERENCE[name])
    assert n == len(exercises.EXERCISES[name].cases) and n >= 3
    assert f"{name}: all {n} cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(REFERENCE))
def test_every_checker_names_at_least_two_mistakes(name):
    assert len({m for ex, m, _, _ in MISTAKES if ex == name}) >= 2


@pytest.mark.parametrize(("name", "mistake", "wrong_fn", "hint"), MISTAKES,
                         ids=[f"{ex}-{m}" for ex, m, _, _ in MISTAKES])
def test_rejects_mistake_with_its_hint(name, mistake, wrong_fn, hint):
    with pytest.raises(AssertionError) as err:
        exercises.check(name, wrong_fn, quiet=True)
    message = str(err.value)
    assert hint in message, f"{mistake}: expected a hint containing {hint!r}, got:\n{message}"
    assert f"{name}: case " in message  # names the case


@pytest.mark.parametrize("name", list(REFERENCE))
def test_stub_fails_as_not_implemented(name):
    """What nbgrader's release leaves in a solution cell (raise NotImplementedError()) fails every check."""

    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(AssertionError, match="not implemented yet"):
        exercises.check(name, stub)


def test_other_seed_random_cases_still_accept_minirl():
    for name in ("gae", "aggregate", "gspo_loss", "group_advantages"):
        exercises.check(name, REFERENCE[name], seed=7, quiet=True)


def test_hints_never_contain_code():
    """The messages name mistakes; they never hand out a line of the solution."""
    for name, _, wrong_fn, _ in MISTAKES:
        with pytest.raises(AssertionError) as err:
            exercises.check(name, wrong_fn, quiet=True)
        for forbidden in ("def ", ".sum(", ".mean(", "cumsum", "logsigmoid(", "torch.exp", "torch.where",
                          "clamp(", "view("):
            assert forbidden not in str(err.value), (name, forbidden)


def test_crash_names_case_and_keeps_the_cause():
    def crashes(*args, **kwargs):
        raise RuntimeError("shape mismatch in my code")

    with pytest.raises(AssertionError, match="raised RuntimeError: shape mismatch in my code") as err:
        exercises.check("k3", crashes)
    assert isinstance(err.value.__cause__, RuntimeError)


def test_unknown_exercise_and_non_callable():
    with pytest.raises(KeyError, match="unknown exercise"):
        exercises.check("gea", kl.k3)
    with pytest.raises(TypeError):
        exercises.check("k3", 3.0)


def test_check_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    exercises.check("token_logprobs", REFERENCE["token_logprobs"], quiet=True)
    exercises.check("gae", REFERENCE["gae"], quiet=True)
    assert torch.equal(torch.rand(3), expected)


def test_dpo_extreme_margin_hand_value():
    # the checker's hand value: beta * h = 0.2 * ((-1000 + 10) - (-10 + 10)) = -198 -> -log sigmoid(-198) = 198
    loss, _ = preference.dpo_loss(torch.tensor([-1000.0]), torch.tensor([-10.0]), torch.tensor([-10.0]),
                                  torch.tensor([-10.0]), beta=0.2)
    assert math.isclose(loss.item(), 198.0, rel_tol=1e-6)
