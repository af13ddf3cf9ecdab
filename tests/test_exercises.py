"""The course kit's checker (minirl.exercises): it accepts the exercise notebooks' solutions, refuses a submission
that calls the minirl function it reimplements, and rejects every named realistic mistake with the hint that names it.

Each wrong implementation below is a bug the field has made in public (token-mean vs sequence mean, ddof, eps inside
the sqrt, k3 upside down, an old log-prob that is not detached, a mask from the pad id, k3 in the reward, GSPO's
sequence term broadcast over tokens, GAE reading the value of padding, clip without eps_high, ...). The hand
arithmetic of every case lives next to the case in minirl/exercises/ch00.py .. ch12.py; the mistakes of
the exercises issue 40 added (05's gmpo_loss, 10, 06, 09, 12) are in tests/exercise_mistakes_new.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from exercise_mistakes_new import MINIRL as MINIRL_NEW
from exercise_mistakes_new import MISTAKES as MISTAKES_NEW

from minirl import (
    advantages,
    checks,
    decoding,
    distill,
    entropy,
    exercises,
    group_filter,
    importance,
    kl,
    losses,
    preference,
    rewards,
    rollout,
    stale_corrections,
)
from minirl.exercises import _reference


def _private_copy(module):
    """A copy of ``module`` under another name, from a copy of its file: the wrong implementations below build on the
    answer key, which refuses to run inside a check (a submission importing it is refused, and so is one that loads
    the key's own file a second time); the copy's functions, written at another path, are not refused (as a student
    who pasted the key's text would not be: the threat model of notebooks/exercises/README.md)."""
    import importlib.util
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="minirl-key-copy-")) / "reference_copy_for_the_tests.py"
    shutil.copy(module.__file__, path)
    spec = importlib.util.spec_from_file_location("reference_copy_for_the_tests", path)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


R = _private_copy(_reference)

# ----------------------------------------------------------------------------------------------------------------
# the reference solutions: the solution cells of the exercise notebooks (copies, not minirl's functions: while a
# check runs, minirl's implementation of the exercise refuses to run)

EXERCISE_DIR = Path(__file__).resolve().parent.parent / "notebooks" / "exercises"


def _notebook_solutions() -> dict:
    """Every function defined in a solution cell of notebooks/exercises/*.ipynb, by name."""
    found = {}
    for path in sorted(EXERCISE_DIR.glob("*.ipynb")):
        scope = {"torch": torch, "F": F, "math": math, "re": re, "exp_linear_above": checks.exp_linear_above}
        for cell in json.loads(path.read_text())["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            text = "".join(cell["source"])
            if meta.get("solution") and text.lstrip().startswith("def "):
                exec(text, scope)
                name = text.split("def ", 1)[1].split("(", 1)[0]
                found[name] = scope[name]
    return found


REFERENCE = _notebook_solutions()


# minirl's own functions in each exercise's signature: the submissions that call through to minirl


def minirl_grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages_, mask, *, eps=0.2, beta=0.04):
    pg, _ = losses.policy_loss(logprobs, old_logprobs, advantages_, mask, eps_low=eps, agg="seq-mean-token-mean")
    return pg + beta * losses.aggregate(kl.kl_in_loss(logprobs, ref_logprobs, estimator="k3"), mask,
                                        "seq-mean-token-mean")


def minirl_kl_reward(scores, logprobs, ref_logprobs, mask, *, beta):
    return kl.kl_in_reward(rewards.token_level_rewards(scores, mask), logprobs, ref_logprobs, beta=beta,
                           estimator="k1") * mask


def minirl_gspo_token_ratio(logprobs, old_logprobs, mask):
    # sg[s_i] * pi / sg[pi], with GSPO's sequence ratio s_i
    return losses.sequence_ratio(logprobs.detach(), old_logprobs, mask).unsqueeze(1) * torch.exp(
        logprobs - logprobs.detach())


def minirl_simpo_from_tokens(chosen_logprobs, chosen_mask, rejected_logprobs, rejected_mask, *, beta=2.0, gamma=1.0):
    return preference.simpo_loss(rollout.sequence_logprobs(chosen_logprobs, chosen_mask, reduction="mean"),
                                 rollout.sequence_logprobs(rejected_logprobs, rejected_mask, reduction="mean"),
                                 beta=beta, gamma=gamma)


def minirl_cispo(lp, old, adv, mask, *, eps_low=0.2, eps_high=0.2):
    return losses.cispo_loss(lp * mask, old, adv.unsqueeze(1).expand_as(lp), mask, eps_low=eps_low, eps_high=eps_high)


def minirl_sapo(lp, old, adv, mask, *, tau_pos=1.0, tau_neg=1.05):
    return losses.sapo_loss(lp, old, adv.unsqueeze(1).expand_as(lp), mask, tau_pos=tau_pos, tau_neg=tau_neg)


def minirl_seq_is_weight(old, sampler, mask, *, cap=2.0, form="product"):
    return importance.seq_tis_weights(old, sampler, mask, cap=cap, form=form)


def minirl_rloo(rewards_, group_size):
    return advantages.rloo_advantages(rewards_, group_size=group_size)  # r_i - mean of the other G - 1


MINIRL = {
    "completion_mask": rollout.completion_mask,
    "token_logprobs": rollout.token_logprobs,
    "sequence_logprobs": rollout.sequence_logprobs,
    "gae": advantages.gae,
    "clipped_surrogate": losses.policy_loss,
    "value_loss": losses.value_loss,
    "group_advantages": advantages.group_advantages,
    "grpo_loss": minirl_grpo_loss,
    "rloo_advantages": minirl_rloo,
    "k3": kl.k3,
    "kl_reward": minirl_kl_reward,
    "exact_kl": kl.exact_token_kl,
    "aggregate": lambda per_token, mask, mode, max_tokens=None: losses.aggregate(per_token, mask, mode,
                                                                                max_tokens=max_tokens),
    "overlong_penalty": lambda lengths, max_len, cache_len: rewards.overlong_penalty(lengths, max_len=max_len,
                                                                                     cache_len=cache_len),
    "has_signal": group_filter.has_signal,
    "sequence_ratio": losses.sequence_ratio,
    "gspo_loss": losses.gspo_loss,
    "gspo_token_ratio": minirl_gspo_token_ratio,
    "dpo_loss": preference.dpo_loss,
    "ipo_loss": preference.ipo_loss,
    "simpo_loss_from_tokens": minirl_simpo_from_tokens,
    "cispo_loss": minirl_cispo,
    "sapo_loss": minirl_sapo,
    "seq_is_weight": minirl_seq_is_weight,
    **MINIRL_NEW,  # 05's gmpo_loss, 10, 06, 09, 12 (tests/exercise_mistakes_new.py)
}


# ----------------------------------------------------------------------------------------------------------------
# the named mistakes

def _score_last(scores, mask):
    """Each row's score on its last valid token (the reward before any KL), from the checker's copy."""
    return R.kl_reward(scores, torch.zeros_like(mask), torch.zeros_like(mask), mask, beta=0.0)


def _simpo(chosen, rejected, beta, gamma):
    return -F.logsigmoid(beta * (chosen - rejected) - gamma).mean()


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
    return R.token_logprobs(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0)


def logprobs_without_attention_mask(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0):
    logits = model(input_ids=input_ids).logits[:, n_prompt_tokens - 1:-1] / temperature
    return F.log_softmax(logits.float(), -1).gather(-1, input_ids[:, n_prompt_tokens:, None]).squeeze(-1)


def logprobs_no_grad(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0):
    with torch.no_grad():
        return R.token_logprobs(model, input_ids, attention_mask, n_prompt_tokens, temperature=temperature)


# 00 · sequence_logprobs


def seq_logprobs_unmasked(token_logprobs, mask, reduction="sum"):
    return token_logprobs.sum(-1) if reduction == "sum" else token_logprobs.mean(-1)


def seq_logprobs_mean_over_T(token_logprobs, mask, reduction="sum"):
    total = (token_logprobs * mask).sum(-1)
    return total if reduction == "sum" else total / mask.shape[1]


def seq_logprobs_nan_on_empty(token_logprobs, mask, reduction="sum"):
    total = (token_logprobs * mask).sum(-1)
    return total if reduction == "sum" else total / mask.sum(-1)


def seq_logprobs_default_mean(token_logprobs, mask, reduction="mean"):
    return R.sequence_logprobs(token_logprobs, mask, reduction=reduction)


# 02 · gae


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
    adv, _ = R.gae(rewards_, values, mask, gamma=gamma, lam=lam)
    ret = torch.zeros_like(rewards_)
    running = torch.zeros(len(mask))
    for t in reversed(range(rewards_.shape[1])):
        running = (rewards_[:, t] + gamma * running) * mask[:, t]
        ret[:, t] = running
    return adv, ret


def gae_values_not_detached(rewards_, values, mask, gamma=1.0, lam=0.95):
    adv, _ = R.gae(rewards_, values.detach(), mask, gamma=gamma, lam=lam)
    return adv + 0 * values, (adv + values) * mask


# 02 · clipped surrogate (token level, token-mean)


def _surrogate(logprobs, old_logprobs, adv, mask, eps_low, eps_high, *, upside_down=False, detach_old=True,
               optimistic=False, clamp=True, agg="token-mean"):
    eps_high = eps_low if eps_high is None else eps_high
    old = old_logprobs.detach() if detach_old else old_logprobs
    log_ratio = (old - logprobs if upside_down else logprobs - old) * mask
    ratio = torch.exp(log_ratio.clamp(-20, 20) if clamp else log_ratio)
    a = adv.unsqueeze(1)
    unclipped, clipped = -a * ratio, -a * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = torch.minimum(unclipped, clipped) if optimistic else torch.maximum(unclipped, clipped)
    return R.aggregate(per_token, mask, agg)


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


def surrogate_clip_only(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    """-A * clip(r, 1 - eps_low, 1 + eps_high) with no max against the unclipped term."""
    eps_high = eps_low if eps_high is None else eps_high
    ratio = R.exp_lin((lp - old.detach()) * mask)
    return R.aggregate(-adv.unsqueeze(1) * ratio.clamp(1 - eps_low, 1 + eps_high), mask, "token-mean")


def surrogate_eps_high_none_unbounded(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return R.clipped_surrogate(lp, old, adv, mask, eps_low=eps_low, eps_high=math.inf if eps_high is None else eps_high)


def surrogate_clamped_log_ratio(lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return _surrogate(lp, old, adv, mask, eps_low, eps_high)  # exact, except exp(clamp(log-ratio, -20, 20))


# 02 · value_loss


def value_loss_min(values, old_values, returns, mask, clip=0.2):
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    per_token = 0.5 * torch.minimum((values - returns) ** 2, (v_clip - returns) ** 2)
    return R.aggregate(per_token, mask, "token-mean")


def value_loss_clip_around_returns(values, old_values, returns, mask, clip=0.2):
    v_clip = returns + torch.clamp(values - returns, -clip, clip)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (v_clip - returns) ** 2)
    return R.aggregate(per_token, mask, "token-mean")


def value_loss_without_half(values, old_values, returns, mask, clip=0.2):
    return 2 * R.value_loss(values, old_values, returns, mask, clip=clip)


# 03 · group_advantages


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
    return R.group_advantages(r, group_size, scale="group", eps=eps)


# 03 · grpo_loss


def grpo_token_mean(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg = _surrogate(lp, old, adv, mask, eps, eps)
    return pg + beta * R.aggregate(R.k3(lp, ref.detach()), mask, "token-mean")


def grpo_k3_upside_down(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg = _surrogate(lp, old, adv, mask, eps, eps, agg="seq-mean-token-mean")
    log_r = lp - ref.detach()
    return pg + beta * R.aggregate(log_r.exp() - 1 - log_r, mask, "seq-mean-token-mean")


def grpo_kl_detached(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg = _surrogate(lp, old, adv, mask, eps, eps, agg="seq-mean-token-mean")
    return pg + beta * R.aggregate(R.k3(lp, ref).detach(), mask, "seq-mean-token-mean")


def grpo_k1_in_loss(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg = _surrogate(lp, old, adv, mask, eps, eps, agg="seq-mean-token-mean")
    return pg + beta * R.aggregate((lp - ref.detach()), mask, "seq-mean-token-mean")


def grpo_k3_clamped(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    pg = _surrogate(lp, old, adv, mask, eps, eps, agg="seq-mean-token-mean")
    log_r = (ref.detach() - lp) * mask
    return pg + beta * R.aggregate(log_r.clamp(-20, 20).exp() - 1 - log_r, mask, "seq-mean-token-mean")


def grpo_settings_ignored(lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    return R.grpo_loss(lp, old, ref, adv, mask)  # always eps 0.2, beta 0.04


# 03 · rloo_advantages


def rloo_self_in_baseline(r, group_size):
    return R.group_advantages(r, group_size, scale="none")  # r_i - the group mean, r_i included


def rloo_divided_by_G(r, group_size):
    g = r.view(-1, group_size)
    return (g - (g.sum(1, keepdim=True) - g) / group_size).view(-1)


def rloo_no_group_check(r, group_size):
    g = r.view(-1, group_size)  # a RuntimeError from view, not a ValueError that names the problem
    return (g - (g.sum(1, keepdim=True) - g) / (group_size - 1)).view(-1)


# 04 · k3


def k3_upside_down(lp, ref):
    log_r = lp - ref
    return log_r.exp() - 1 - log_r


def k3_plus_log(lp, ref):
    log_r = ref - lp
    return log_r.exp() - 1 + log_r


def k3_no_clamp(lp, ref):
    log_r = ref - lp
    return log_r.exp() - 1 - log_r


def k3_clamped(lp, ref):
    log_r = ref - lp
    return log_r.clamp(-20, 20).exp() - 1 - log_r


# 04 · kl_reward


def kl_reward_score_on_last_column(scores, lp, ref, mask, beta):
    out = -beta * (lp - ref).detach() * mask
    out[:, -1] += scores
    return out


def kl_reward_with_k3(scores, lp, ref, mask, beta):
    return (_score_last(scores, mask) - beta * R.k3(lp, ref).detach()) * mask


def kl_reward_not_detached(scores, lp, ref, mask, beta):
    return (_score_last(scores, mask) - beta * (lp - ref)) * mask


def kl_reward_plus_kl(scores, lp, ref, mask, beta):
    return (_score_last(scores, mask) + beta * (lp - ref).detach()) * mask


# 04 · exact_kl


def exact_kl_reversed(logits, ref_logits):
    return R.exact_kl(ref_logits, logits)


def exact_kl_naive_zero_prob(logits, ref_logits):
    logp, ref_logp = F.log_softmax(logits, -1), F.log_softmax(ref_logits, -1)
    return (logp.exp() * (logp - ref_logp)).sum(-1)


def exact_kl_unnormalised(logits, ref_logits):
    return (F.softmax(logits, -1) * (logits - ref_logits)).sum(-1)


# 05 · aggregate


def agg_always_token_mean(x, mask, mode, max_tokens=None):
    return (x * mask).sum() / mask.sum().clamp(min=1)


def agg_divides_by_T(x, mask, mode, max_tokens=None):
    if mode == "seq-mean-token-mean":
        return (x * mask).mean(-1).mean()
    return R.aggregate(x, mask, mode, max_tokens=max_tokens)


def agg_drgrpo_by_length(x, mask, mode, max_tokens=None):
    if mode == "seq-mean-token-sum-norm":
        mode = "seq-mean-token-mean"
    return R.aggregate(x, mask, mode, max_tokens=max_tokens)


def agg_drgrpo_ignores_max_tokens(x, mask, mode, max_tokens=None):
    return R.aggregate(x, mask, mode, max_tokens=None)


def agg_counts_empty_rows(x, mask, mode, max_tokens=None):
    if mode == "token-mean":
        return R.aggregate(x, mask, mode)
    n = mask.sum(-1)
    per_seq = (x * mask).sum(-1) / (n.clamp(min=1) if mode == "seq-mean-token-mean" else (max_tokens or x.shape[1]))
    return per_seq.mean()


def agg_nan_on_empty_batch(x, mask, mode, max_tokens=None):
    if mode == "token-mean":
        return (x * mask).sum() / mask.sum()
    valid = mask.sum(-1) > 0
    return R.aggregate(x, mask, mode, max_tokens=max_tokens) * valid.sum() / valid.sum()


# 05 · overlong_penalty


def overlong_ramp_late(lengths, max_len, cache_len):
    return ((max_len - cache_len - lengths.float() + 1) / cache_len).clamp(-1, 0)


def overlong_sign_flipped(lengths, max_len, cache_len):
    return -R.overlong_penalty(lengths, max_len=max_len, cache_len=cache_len)


def overlong_not_clamped_beyond(lengths, max_len, cache_len):
    return ((max_len - cache_len - lengths.float()) / cache_len).clamp(max=0)


# 05 · has_signal


def signal_any_correct(r, group_size):
    return (r.view(-1, group_size) > 0).any(1)


def signal_strided_groups(r, group_size):
    g = r.view(group_size, -1)
    return (g != g[:1]).any(0)


# 07 · sequence_ratio


def seq_ratio_product(lp, old, mask):
    return torch.exp(((lp - old.detach()) * mask).sum(-1))


def seq_ratio_mean_over_T(lp, old, mask):
    return torch.exp(((lp - old.detach()) * mask).mean(-1))


def seq_ratio_arithmetic(lp, old, mask):
    return (torch.exp(lp - old.detach()) * mask).sum(-1) / mask.sum(-1).clamp(min=1) + (mask.sum(-1) == 0)


def seq_ratio_old_not_detached(lp, old, mask):
    return torch.exp(((lp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1))


# 07 · gspo_loss


def gspo_broadcast_over_tokens(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    s = torch.exp(((lp - old.detach()) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    a = adv.unsqueeze(1)
    s = s.unsqueeze(1).expand_as(lp)
    per_token = torch.maximum(-a * s, -a * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    return R.aggregate(per_token, mask, "token-mean")


def gspo_token_level_ratio(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    return _surrogate(lp, old, adv, mask, eps_low, eps_high, agg="seq-mean-token-mean")


def gspo_old_not_detached(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    s = torch.exp(((lp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    per_seq = torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - eps_low, 1 + eps_high))
    return per_seq.mean()


# 07 · gspo_token_ratio


def gspo_token_no_stop_gradient(lp, old, mask):
    s = torch.exp(((lp - old.detach()) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
    return s.unsqueeze(1).expand_as(lp)


def gspo_token_fully_detached(lp, old, mask):
    return gspo_token_no_stop_gradient(lp, old, mask).detach()


# 08 · dpo_loss


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


# 08 · ipo_loss


def ipo_target_one_over_tau(c, r, rc, rr, tau=0.1):
    return ((_h(c, r, rc, rr) - 1 / tau) ** 2).mean()


def ipo_tau_scales_margin(c, r, rc, rr, tau=0.1):
    return ((tau * _h(c, r, rc, rr) - 1 / (2 * tau)) ** 2).mean()


def ipo_no_reference(c, r, rc, rr, tau=0.1):
    return (((c - r) - 1 / (2 * tau)) ** 2).mean()


# 08 · simpo from tokens


def simpo_sum_not_mean(c, cm, r, rm, beta=2.0, gamma=1.0):
    return _simpo((c * cm).sum(-1), (r * rm).sum(-1), beta, gamma)


def simpo_mean_over_T(c, cm, r, rm, beta=2.0, gamma=1.0):
    return _simpo((c * cm).mean(-1), (r * rm).mean(-1), beta, gamma)


def simpo_gamma_inside_beta(c, cm, r, rm, beta=2.0, gamma=1.0):
    cs, rs = R.sequence_logprobs(c, cm, reduction="mean"), R.sequence_logprobs(r, rm, reduction="mean")
    return -F.logsigmoid(beta * (cs - rs - gamma)).mean()


def simpo_naive_log_sigmoid(c, cm, r, rm, beta=2.0, gamma=1.0):
    cs, rs = R.sequence_logprobs(c, cm, reduction="mean"), R.sequence_logprobs(r, rm, reduction="mean")
    return -torch.log(torch.sigmoid(beta * (cs - rs) - gamma)).mean()


# 05 · cispo_loss


def _cispo(lp, old, adv, mask, eps_low, eps_high, *, detach=True, low=True, times="logp", agg="token-mean"):
    ratio = torch.exp((lp - old.detach()) * mask)
    w = ratio.clamp(1 - eps_low if low else 0.0, 1 + eps_high)
    w = w.detach() if detach else w
    a = adv.unsqueeze(1)
    per_token = -w * a * (lp if times == "logp" else ratio)
    return R.aggregate(per_token, mask, agg)


def cispo_ppo_surrogate(lp, old, adv, mask, eps_low=0.2, eps_high=0.2):
    ratio = torch.exp((lp - old.detach()) * mask)
    a = adv.unsqueeze(1)
    return R.aggregate(-a * ratio.clamp(1 - eps_low, 1 + eps_high), mask, "token-mean")


def cispo_weight_not_detached(lp, old, adv, mask, eps_low=0.2, eps_high=0.2):
    return _cispo(lp, old, adv, mask, eps_low, eps_high, detach=False)


def cispo_one_sided(lp, old, adv, mask, eps_low=0.2, eps_high=0.2):
    return _cispo(lp, old, adv, mask, eps_low, eps_high, low=False)  # TRL's min(r, 1 + eps_high)


def cispo_times_ratio(lp, old, adv, mask, eps_low=0.2, eps_high=0.2):
    return _cispo(lp, old, adv, mask, eps_low, eps_high, times="ratio")


def cispo_seq_mean(lp, old, adv, mask, eps_low=0.2, eps_high=0.2):
    return _cispo(lp, old, adv, mask, eps_low, eps_high, agg="seq-mean-token-mean")


# 05 · sapo_loss


def _sapo(lp, old, adv, mask, tau_pos, tau_neg, *, tau_rule="advantage", scale=True, centred=True,
          agg="seq-mean-token-mean", detach_old=True):
    ratio = R.exp_lin((lp - (old.detach() if detach_old else old)) * mask)
    a = adv.unsqueeze(1).expand_as(ratio)
    if tau_rule == "advantage":
        tau = torch.where(a > 0, tau_pos, tau_neg)
    elif tau_rule == "swapped":
        tau = torch.where(a > 0, tau_neg, tau_pos)
    else:  # by the side of 1 the ratio is on (the min / max sign error, made with a gate)
        tau = torch.where(ratio > 1, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1 if centred else ratio)) * (4 / tau if scale else 1.0)
    return R.aggregate(-gate * a, mask, agg)


def sapo_tau_swapped(lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    return _sapo(lp, old, adv, mask, tau_pos, tau_neg, tau_rule="swapped")


def sapo_tau_by_ratio(lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    return _sapo(lp, old, adv, mask, tau_pos, tau_neg, tau_rule="ratio")


def sapo_without_scale(lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    return _sapo(lp, old, adv, mask, tau_pos, tau_neg, scale=False)


def sapo_not_centred(lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    return _sapo(lp, old, adv, mask, tau_pos, tau_neg, centred=False)


def sapo_token_mean(lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    return _sapo(lp, old, adv, mask, tau_pos, tau_neg, agg="token-mean")


def sapo_old_not_detached(lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    return _sapo(lp, old, adv, mask, tau_pos, tau_neg, detach_old=False)


# 11 · seq_is_weight


def _log_w(old, sampler, mask):
    return ((old - sampler) * mask).sum(-1)


def is_geomean_always(old, sampler, mask, cap=2.0, form="product"):
    return R.seq_is_weight(old, sampler, mask, cap=cap, form="geomean")


def is_upside_down(old, sampler, mask, cap=2.0, form="product"):
    return R.seq_is_weight(sampler, old, mask, cap=cap, form=form)


def is_arithmetic_mean(old, sampler, mask, cap=2.0, form="product"):
    r = (torch.exp(old - sampler) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return r.clamp(max=cap).detach()


def is_masked_not_truncated(old, sampler, mask, cap=2.0, form="product"):
    w = torch.exp(_log_w(old, sampler, mask) / (1 if form == "product" else mask.sum(-1).clamp(min=1)))
    return torch.where(w > cap, 0.0, w).detach()


def is_no_cap(old, sampler, mask, cap=2.0, form="product"):
    return torch.exp(_log_w(old, sampler, mask) / (1 if form == "product" else mask.sum(-1).clamp(min=1))).detach()


def is_padding_summed(old, sampler, mask, cap=2.0, form="product"):
    return R.seq_is_weight(old, sampler, torch.ones_like(mask), cap=cap, form=form)


def is_nan_on_empty(old, sampler, mask, cap=2.0, form="product"):
    log_w = _log_w(old, sampler, mask)
    if form == "geomean":
        log_w = log_w / mask.sum(-1)
    return torch.exp(log_w).clamp(max=cap).detach()


def is_not_detached(old, sampler, mask, cap=2.0, form="product"):
    log_w = _log_w(old, sampler, mask)
    if form == "geomean":
        log_w = log_w / mask.sum(-1).clamp(min=1)
    return torch.exp(log_w).clamp(max=cap)


# 11 · align_sampler_routes


def routes_last_missing(step_indices, batch_size):
    return [torch.cat([s[layer].reshape(batch_size, -1, s[layer].shape[-1]) for s in step_indices], dim=1)
            for layer in range(len(step_indices[0]))]


def routes_shifted(step_indices, batch_size):
    """Each sampled token given the experts of the forward that sampled it (whose input was the token before)."""
    out = []
    for r in routes_last_missing(step_indices, batch_size):
        out.append(torch.cat([r[:, :1], r], dim=1))
    return out


def routes_rows_as_length_first(step_indices, batch_size):
    out = []
    for layer in range(len(step_indices[0])):
        r = torch.cat([s[layer].reshape(-1, batch_size, s[layer].shape[-1]).transpose(0, 1) for s in step_indices],
                      dim=1)
        out.append(torch.cat([r, r[:, -1:]], dim=1))
    return out


def routes_as_float(step_indices, batch_size):
    return [r.float() for r in R.align_sampler_routes(step_indices, batch_size)]


def routes_per_step(step_indices, batch_size):
    """One tensor per decode step (all layers stacked), not one per layer."""
    return [torch.stack(step, 0) for step in step_indices]


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
    ("sequence_logprobs", "mean as the default reduction", seq_logprobs_default_mean, "default reduction is the sum"),
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
    ("clipped_surrogate", "the clipped term alone (no max)", surrogate_clip_only, "the clipped term alone"),
    ("clipped_surrogate", "eps_high=None as no upper bound", surrogate_eps_high_none_unbounded,
     "not 'no upper bound'"),
    ("clipped_surrogate", "log-ratio clamped to +-20", surrogate_clamped_log_ratio, "clamped before exp"),
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
    ("grpo_loss", "k3's log-ratio clamped to +-20", grpo_k3_clamped, "clamped before exp"),
    ("grpo_loss", "eps and beta ignored", grpo_settings_ignored, "use the values passed"),
    ("rloo_advantages", "a sample in its own baseline", rloo_self_in_baseline, "in its own baseline"),
    ("rloo_advantages", "divided by G instead of G - 1", rloo_divided_by_G, "divided by G"),
    ("rloo_advantages", "no check of the group layout", rloo_no_group_check, "whole number of groups"),
    ("k3", "ratio upside down", k3_upside_down, "k3's ratio is upside down"),
    ("k3", "plus log r", k3_plus_log, "MINUS log r"),
    ("k3", "no guard before exp", k3_no_clamp, "overflows exp()"),
    ("k3", "log-ratio clamped to +-20", k3_clamped, "clamped before exp"),
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
    ("cispo_loss", "PPO's clipped surrogate", cispo_ppo_surrogate, "this is PPO's clipped surrogate"),
    ("cispo_loss", "weight not detached", cispo_weight_not_detached, "the weight is not detached"),
    ("cispo_loss", "one-sided weight (TRL's form)", cispo_one_sided, "raised to 1 - eps_low from below"),
    ("cispo_loss", "the ratio in place of log pi", cispo_times_ratio, "multiplies the ratio, not log pi"),
    ("cispo_loss", "seq-mean instead of token-mean", cispo_seq_mean, "averages per sequence first"),
    ("sapo_loss", "temperatures swapped", sapo_tau_swapped, "temperatures are swapped"),
    ("sapo_loss", "temperature by the ratio's side", sapo_tau_by_ratio, "sign of the ADVANTAGE"),
    ("sapo_loss", "without 4 / tau", sapo_without_scale, "the 4 / tau makes"),
    ("sapo_loss", "gate not centred at r = 1", sapo_not_centred, "centred at r = 1"),
    ("sapo_loss", "token-mean aggregation", sapo_token_mean, "DAPO's mode, not GRPO's"),
    ("sapo_loss", "old log-prob not detached", sapo_old_not_detached, "detach the behaviour"),
    ("seq_is_weight", "geometric mean for the product", is_geomean_always, "geometric mean of the token ratios"),
    ("seq_is_weight", "ratio upside down", is_upside_down, "upside down"),
    ("seq_is_weight", "arithmetic mean of the ratios", is_arithmetic_mean, "arithmetic mean"),
    ("seq_is_weight", "masked instead of truncated", is_masked_not_truncated, "masked IS (MIS)"),
    ("seq_is_weight", "no cap", is_no_cap, "truncate the weight at cap"),
    ("seq_is_weight", "padding summed", is_padding_summed, "padding holds garbage"),
    ("seq_is_weight", "NaN for an empty row", is_nan_on_empty, "empty product"),
    ("seq_is_weight", "weights not detached", is_not_detached, "detach them"),
    ("align_sampler_routes", "no route for the last sampled token", routes_last_missing, "never feeds the last"),
    ("align_sampler_routes", "shifted by one (the sampling forward's experts)", routes_shifted, "shifted by one"),
    ("align_sampler_routes", "tokens read as (L, B)", routes_rows_as_length_first, "row by row"),
    ("align_sampler_routes", "float indices", routes_as_float, "integers (torch.long)"),
    ("align_sampler_routes", "one tensor per step, not per layer", routes_per_step, "tensor per LAYER"),
    *MISTAKES_NEW,  # 05's gmpo_loss, 10, 06, 09, 12 (tests/exercise_mistakes_new.py)
]


# ----------------------------------------------------------------------------------------------------------------
# the tests


def test_kit_size():
    """Every chapter 00-15 has exercises (01, the policy gradient, 10, the bridge to TRL, 13, the real model, and 14,
    multi-turn, one; the others 2-6); every exercise has a reference solution in a notebook here."""
    names = exercises.list_exercises()
    assert len(names) >= 38
    assert all(len(exercises.list_exercises(chapter)) >= 1 for chapter in ("01", "10", "13", "14"))
    for chapter in ("00", "02", "03", "04", "05", "06", "07", "08", "09", "11", "12", "15"):
        assert 2 <= len(exercises.list_exercises(chapter)) <= 6, chapter
    assert set(REFERENCE) == set(names)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_accepts_the_reference_solutions(name, capsys):
    n = exercises.check(name, REFERENCE[name])
    assert n == len(exercises.EXERCISES[name].cases) and n >= 3
    assert f"{name}: all {n} cases passed" in capsys.readouterr().out
    exercises.check(name, REFERENCE[name], seed=2024, quiet=True)  # the hidden rerun of the notebooks


@pytest.mark.parametrize("name", list(MINIRL))
def test_refuses_a_submission_that_calls_minirl(name):
    with pytest.raises(AssertionError, match=r"the submission calls minirl\.[a-z0-9_.]+, (the minirl function this "
                       r"exercise asks you to write|a function of minirl\.[a-z_]+, a module that holds the answer of "
                       r"exercise\(s\) [a-z0-9_, ]+); it is not graded"):
        exercises.check(name, MINIRL[name], quiet=True)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_refuses_the_answer_key(name):
    """Issue 40: ``from minirl.exercises._reference import gae`` passed every check (full marks under nbgrader)."""
    key = getattr(_reference, name)
    with pytest.raises(AssertionError, match=rf"the submission calls minirl\.exercises\._reference\.{name}, a "
                       "function of the checker's answer key .*; it is not graded"):
        exercises.check(name, key, quiet=True)

    def through_a_helper(*args, **kwargs):  # an answer-key helper inside an otherwise own function
        _reference.exp_lin(torch.zeros(1))
        return REFERENCE[name](*args, **kwargs)

    with pytest.raises(AssertionError, match=r"calls minirl\.exercises\._reference\.exp_lin"):
        exercises.check(name, through_a_helper, quiet=True)


def test_refuses_every_module_that_holds_an_answer():
    """Any function of an answer-holding module is refused while a submission runs, not only the exercise's own:
    here k3 through minirl.aggregation.aggregate (the answer of exercise aggregate)."""
    assert {"minirl.exercises._reference", "minirl.aggregation", "minirl.clip_alternatives", "minirl.losses",
            "minirl.kl", "minirl.advantages"} <= set(exercises._core.answer_modules())

    def k3_with_aggregate(lp, ref):
        losses.aggregate(lp, torch.ones_like(lp), "token-mean")
        return REFERENCE["k3"](lp, ref)

    with pytest.raises(AssertionError, match=r"calls minirl\.aggregation\.aggregate, a function of "
                       r"minirl\.aggregation, a module that holds the answer of exercise\(s\) .*aggregate"):
        exercises.check("k3", k3_with_aggregate, quiet=True)
    # checks.exp_linear_above, offered to students, stays usable (also through losses, which imports it)
    exercises.check("k3", lambda lp, ref: checks.exp_linear_above(ref - lp, 20.0) - 1 - (ref - lp), quiet=True)


def test_refusal_catches_an_alias_and_is_undone_afterwards():
    from minirl.losses import policy_loss  # a name bound before the check runs

    def through_alias(lp, old, adv, mask, *, eps_low=0.2, eps_high=None):
        return policy_loss(lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)

    with pytest.raises(AssertionError, match="calls minirl.losses.policy_loss"):
        exercises.check("clipped_surrogate", through_alias, quiet=True)
    lp = torch.tensor([[-1.0, -2.0]])  # after the check, minirl's function works again
    loss, _ = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.item() == -1.0  # ratio 1, A = 1: -(1 + 1) / 2


def _tensors(args) -> list:
    """The tensors among ``args``, nested lists included (align_sampler_routes takes a list of lists)."""
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, list | tuple):
            found += _tensors(a)
    return found


@pytest.mark.parametrize("name", list(REFERENCE))
def test_every_exercise_has_a_seeded_random_case(name):
    """The hidden rerun (another seed) feeds the function inputs it has not seen: some case depends on the seed."""

    def recording(seen):
        def fn(*args, **kwargs):
            seen.add(tuple(round(float(a.detach().double().sum()), 6) for a in _tensors(args))
                     + tuple(a for a in args if isinstance(a, str)))  # final_answer reads text
            return REFERENCE[name](*args, **kwargs)
        return fn

    seen_0, seen_1 = set(), set()
    exercises.check(name, recording(seen_0), seed=0, quiet=True)
    exercises.check(name, recording(seen_1), seed=1, quiet=True)
    assert seen_0 != seen_1 and seen_0 & seen_1  # the hand cases are shared, the random ones differ


def test_the_checkers_copies_agree_with_minirl():
    """The checker's references (minirl/exercises/_reference.py) are copies: they agree with minirl's functions."""
    g = torch.Generator().manual_seed(0)
    B, T = 4, 6
    mask = (torch.arange(T) < torch.tensor([6, 2, 0, 4]).unsqueeze(1)).float()
    lp, old, ref = (-torch.rand(B, T, generator=g) * 3 for _ in range(3))
    adv, r = torch.randn(B, generator=g), torch.randint(0, 2, (B * 2,), generator=g).float()
    close = torch.testing.assert_close
    close(R.clipped_surrogate(lp, old, adv, mask, eps_low=0.2, eps_high=0.28),
          losses.policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)[0])
    close(R.grpo_loss(lp, old, ref, adv, mask), minirl_grpo_loss(lp, old, ref, adv, mask))
    close(R.value_loss(lp, old, ref, mask, clip=0.2), losses.value_loss(lp, old, ref, mask, clip=0.2)[0])
    for a, b in zip(R.gae(lp, old, mask, gamma=0.9, lam=0.8), advantages.gae(lp, old, mask, gamma=0.9, lam=0.8),
                    strict=True):
        close(a, b)
    close(R.group_advantages(r, 4), advantages.group_advantages(r, 4))
    close(R.rloo_advantages(r, 4), minirl_rloo(r, 4))
    close(R.k3(lp, ref - 30), kl.k3(lp, ref - 30))  # beyond 20 nats: the same tangent
    close(R.kl_reward(adv, lp, ref, mask, beta=0.1), minirl_kl_reward(adv, lp, ref, mask, beta=0.1))
    logits, ref_logits = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    close(R.exact_kl(logits, ref_logits), kl.exact_token_kl(logits, ref_logits))
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        close(R.aggregate(lp, mask, mode, max_tokens=8), losses.aggregate(lp, mask, mode, max_tokens=8))
    close(R.sequence_ratio(lp, old, mask), losses.sequence_ratio(lp, old, mask))
    close(R.gspo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.3),
          losses.gspo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.3)[0])
    close(R.gspo_token_ratio(lp, old, mask), minirl_gspo_token_ratio(lp, old, mask))
    lengths = torch.arange(10, 30)
    close(R.overlong_penalty(lengths, max_len=25, cache_len=6), rewards.overlong_penalty(lengths, max_len=25,
                                                                                          cache_len=6))
    assert torch.equal(R.has_signal(r, 2), group_filter.has_signal(r, 2))
    ids = torch.randint(0, 4, (5, 7), generator=g)
    close(R.completion_mask(ids, [1, 3]), rollout.completion_mask(ids, [1, 3]).float())
    full = mask[[0, 1, 3]]  # minirl raises for the mean of an empty row
    close(R.sequence_logprobs(lp[[0, 1, 3]], full, reduction="mean"),
          rollout.sequence_logprobs(lp[[0, 1, 3]], full, reduction="mean"))
    close(R.sequence_logprobs(lp, mask), rollout.sequence_logprobs(lp, mask))
    c, rj, rc, rr = (-torch.rand(5, generator=g) * 10 for _ in range(4))
    close(R.dpo_loss(c, rj, rc, rr, beta=0.3), preference.dpo_loss(c, rj, rc, rr, beta=0.3)[0])
    close(R.ipo_loss(c, rj, rc, rr, tau=0.3), preference.ipo_loss(c, rj, rc, rr, tau=0.3)[0])
    m2 = mask[[0, 1, 3]]
    close(R.simpo_loss_from_tokens(lp[[0, 1, 3]], m2, old[[0, 1, 3]], m2, beta=1.5, gamma=0.3),
          minirl_simpo_from_tokens(lp[[0, 1, 3]], m2, old[[0, 1, 3]], m2, beta=1.5, gamma=0.3)[0])


def test_the_checkers_new_loss_and_weight_copies_agree_with_minirl():
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(6) < torch.tensor([6, 2, 0, 4]).unsqueeze(1)).float()
    lp, old = (-torch.rand(4, 6, generator=g) * 3 for _ in range(2))
    adv = torch.randn(4, generator=g)
    close = torch.testing.assert_close
    close(R.cispo_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28),
          minirl_cispo(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)[0])
    close(R.sapo_loss(lp, old, adv, mask, tau_pos=0.7, tau_neg=1.4),
          minirl_sapo(lp, old, adv, mask, tau_pos=0.7, tau_neg=1.4)[0])
    for form in ("product", "geomean"):
        close(R.seq_is_weight(lp, old, mask, cap=1.5, form=form), minirl_seq_is_weight(lp, old, mask, cap=1.5,
                                                                                       form=form))


def test_the_checkers_copies_for_chapters_05_06_09_10_12_agree_with_minirl():
    """The references of issue 40's exercises (gmpo_loss, ratio_weighted_k3, token_covariance, pass_at_k,
    reverse_kl_reward, full_reverse_kl, decoupled_ppo_terms, off_policy_sequence_mask) equal minirl's functions,
    value and gradient, on random inputs with padding and an empty row."""
    g = torch.Generator().manual_seed(2)
    mask = (torch.arange(6) < torch.tensor([6, 2, 0, 4]).unsqueeze(1)).float()
    lp = (-torch.rand(4, 6, generator=g) * 3).double().requires_grad_(True)
    old, ref, mu = (lp.detach() + 0.5 * torch.randn(4, 6, generator=g, dtype=torch.float64) for _ in range(3))
    adv = torch.randn(4, generator=g, dtype=torch.float64)
    mask = mask.double()

    def same(a, b):  # value and gradient w.r.t. lp
        torch.testing.assert_close(a, b)
        if a.requires_grad or b.requires_grad:
            w = torch.rand(a.shape, generator=g, dtype=torch.float64)
            torch.testing.assert_close(torch.autograd.grad((a * w).sum(), lp)[0],
                                       torch.autograd.grad((b * w).sum(), lp)[0])

    same(R.gmpo_loss(lp, old, adv, mask, eps_low=0.3, eps_high=0.2),
         losses.gmpo_loss(lp, old, adv, mask, eps_low=0.3, eps_high=0.2)[0])
    same(R.ratio_weighted_k3(lp, old, ref, mask), kl.ratio_weighted_k3(lp, old, ref, mask=mask))
    same(R.token_covariance(lp, adv, mask), entropy.token_covariance(lp, adv, mask))
    same(R.reverse_kl_reward(lp, ref, mask), distill.reverse_kl_reward(lp, ref, mask))
    for cap in (None, 1.5):
        same(R.decoupled_ppo_terms(lp, old, mu, adv, mask, eps_low=0.2, eps_high=0.28, weight_cap=cap),
             stale_corrections.decoupled_ppo_terms(lp, old, mu, adv, mask, eps_low=0.2, eps_high=0.28, weight_cap=cap))
    for threshold in (0.0, 0.2, 0.5):
        same(R.off_policy_sequence_mask(lp, mu, adv, mask, threshold=threshold),
             stale_corrections.off_policy_sequence_mask(lp, mu, adv, mask, threshold=threshold))
    logits = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    teacher, m3 = torch.randn(3, 4, 5, generator=g, dtype=torch.float64), mask[[0, 1, 2], :4]
    for temperature in (1.0, 0.7):
        a = R.full_reverse_kl(logits, teacher, m3, temperature=temperature)
        b = distill.full_reverse_kl(logits, teacher, m3, temperature=temperature)
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(torch.autograd.grad(a.sum(), logits)[0], torch.autograd.grad(b.sum(), logits)[0])
    n, c = torch.randint(5, 60, (20,), generator=g), torch.randint(0, 60, (20,), generator=g)
    c = torch.minimum(c, n)
    for k in (1, 3, 5):
        torch.testing.assert_close(R.pass_at_k(n, c, k), entropy.pass_at_k(n, c, k))
    n_big = torch.tensor([3000, 3000])
    torch.testing.assert_close(R.pass_at_k(n_big, torch.tensor([2, 5]), 400),
                               entropy.pass_at_k(n_big, torch.tensor([2, 5]), 400))


def test_the_checkers_learned_reward_copies_agree_with_minirl():
    """Chapter 15's references (bradley_terry_loss with and without margin and centring, best_of_n_gold) equal
    minirl's functions, value and gradient, on random inputs."""
    from minirl import reward_models

    g = torch.Generator().manual_seed(3)
    chosen = torch.randn(9, generator=g, dtype=torch.float64, requires_grad=True)
    rejected, margin = torch.randn(9, generator=g, dtype=torch.float64), torch.rand(9, generator=g, dtype=torch.float64)
    for kw in ({}, {"margin": margin}, {"center_coef": 0.05}, {"margin": margin, "center_coef": 0.05}):
        a, b = R.bradley_terry_loss(chosen, rejected, **kw), reward_models.bradley_terry_loss(chosen, rejected, **kw)
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(torch.autograd.grad(a, chosen)[0], torch.autograd.grad(b, chosen)[0])
    proxy = torch.randint(0, 4, (7, 16), generator=g).float()  # many ties
    gold = (torch.rand(7, 16, generator=g) < 0.5).float()
    ns = [1, 2, 3, 8, 16]
    torch.testing.assert_close(R.best_of_n_gold(proxy, gold, ns), reward_models.best_of_n_gold(proxy, gold, ns))


def test_the_checkers_trust_region_and_answer_copies_agree_with_minirl():
    """Chapter 12's dppo_mask (both divergences, random deltas, A = 0 included), chapter 13's final_answer (3,000
    of the random case's texts and the hand cases) and 09's rewards_to_go (padding holding garbage, an empty row)
    equal minirl's trust_region.dppo_mask, gsm8k.extract_answer and the one-file distillation's rewards_to_go;
    01's reinforce_estimate, averaged over the policy's arms, is pg_toy.true_gradient."""
    from minirl import gsm8k, trust_region
    from minirl.exercises.ch13 import random_text

    g = torch.Generator().manual_seed(5)
    for divergence in ("tv", "kl"):
        q, p = torch.rand(6, 11, generator=g) * 0.98 + 0.01, torch.rand(6, 11, generator=g) * 0.98 + 0.01
        adv = torch.randn(6, 11, generator=g).where(torch.rand(6, 11, generator=g) < 0.8, torch.zeros(()))
        for lo, hi in ((0.2, 0.2), (0.05, 0.3), (0.0, 0.0)):
            kw = dict(divergence=divergence, delta_low=lo, delta_high=hi)
            torch.testing.assert_close(R.dppo_mask(p.log(), q.log(), adv, **kw),
                                       trust_region.dppo_mask(p.log(), q.log(), adv, **kw))
    from minirl.minimal import distill as minimal_distill

    r, mask = torch.randn(6, 9, generator=g), (torch.arange(9) < torch.tensor([9, 4, 0, 1, 7, 9])[:, None]).float()
    r = torch.where(mask > 0, r, torch.full_like(r, 1e3))  # garbage in the padding
    for gamma in (0.0, 0.37, 1.0):
        torch.testing.assert_close(R.rewards_to_go(r, mask, gamma), minimal_distill.rewards_to_go(r, mask, gamma))
    from minirl import pg_toy

    logits, rewarded = torch.randn(1, 5, generator=g, dtype=torch.float64), torch.tensor([[1, 0, 1, 0, 0]])
    pi = logits.softmax(-1)[0]  # the estimate's mean, every arm weighted by its probability: the exact gradient
    mean = sum(pi[a] * R.reinforce_estimate(logits[0], torch.tensor([a]), rewarded[0, a:a + 1].double(), baseline=0.3)
               for a in range(5))
    torch.testing.assert_close(mean, pg_toy.true_gradient(logits, rewarded)[0])
    texts = [random_text(g) for _ in range(3000)] + [
        "#### 1,250", "72 clips, altogether.", "#### 5\n#### 6", "to -5 degrees.", "#### $15.20", "no idea", "3-5"]
    for text in texts:
        mine = gsm8k.extract_answer(text)
        assert R.final_answer(text) == (None if mine is None else float(mine)), text


def test_the_checkers_route_alignment_copy_agrees_with_minirls_rollout():
    """R.align_sampler_routes on what the routers return while decoding.generate decodes == the sampler_routes that
    generate(record_sampler_routes=True) stores (and R3 replays)."""
    from minirl import models, moe
    from minirl.tokenizer import build_tokenizer

    tok = build_tokenizer()
    model = models.tiny_moe(tok, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    layers = moe.routers(model)
    raw: list[list] = []

    def on_model(module, args, kwargs):
        raw.append([None] * len(layers))

    def make_hook(i):
        def hook(module, inputs, output):
            raw[-1][i] = output[2].detach().clone()  # (tokens, k), as the router returns them
        return hook

    handles = [model.register_forward_pre_hook(on_model, with_kwargs=True)]
    handles += [r.register_forward_hook(make_hook(i)) for i, r in enumerate(layers)]
    torch.manual_seed(0)
    try:
        r = decoding.generate(model, tok, ["1+2=", "12+3="], 2, 6, recompute_logprobs=False,
                             record_sampler_routes=True)
    finally:
        for h in handles:
            h.remove()
    aligned = R.align_sampler_routes(raw, r.input_ids.shape[0])
    assert len(aligned) == len(r.sampler_routes.indices)
    for a, b in zip(aligned, r.sampler_routes.indices, strict=True):
        assert a.shape == b.shape == (*r.input_ids.shape, b.shape[-1])
        assert torch.equal(a, b)


def test_the_checkers_token_logprobs_copy_agrees_with_minirl():
    from minirl.exercises.ch00 import _tiny_lm

    model, ids, am, P = _tiny_lm()
    with torch.no_grad():
        torch.testing.assert_close(R.token_logprobs(model, ids, am, P, temperature=0.7),
                                   rollout.token_logprobs(model, ids, am, P, temperature=0.7))


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


def test_other_seed_random_cases_still_accept_the_references():
    for name in REFERENCE:
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


def test_the_teachers_page_coverage_and_examples_are_what_the_kit_gives():
    """Issue 53: the teacher's page showed the old chapter numbers (gae under 01) and a ``list_exercises("08")``
    output of another chapter. Its coverage tables are generated (tests/teacher_tables.py) and must equal what the
    checker and the planted mistakes give now; each ``list_exercises`` example's comment is the call's output."""
    import re

    import teacher_tables

    page = teacher_tables.PAGE.read_text()
    assert teacher_tables.page_block(page) == teacher_tables.tables(MISTAKES), "run python tests/teacher_tables.py"
    examples = re.findall(r'exercises\.list_exercises\("(\d\d)"\)\s+# (\[.*\])', page)
    assert examples
    for chapter, shown in examples:
        assert shown == str(exercises.list_exercises(chapter)), (chapter, shown)
    assert f"**{len(MISTAKES)} in all**" in page  # the named mistakes' count in the prose
    checks = re.findall(r'exercises\.check\("(\w+)", my_\w+\)\s+# prints "\w+: all (\d+) cases passed"', page)
    assert checks
    for name, passed in checks:
        assert int(passed) == len(exercises.EXERCISES[name].cases), name


# --- issue 53: submissions that do no work ---------------------------------------------------------------------------
def test_a_submission_that_raises_the_checkers_no_reference_is_refused(monkeypatch):
    """Cheat 1 of issue 53: a body that only raised ``_NoReference`` scored 6/6 under nbgrader. A case is deferred
    only when the installed key is the student package's stand-in AND the stand-in itself raised; here neither."""
    from minirl.exercises._core import _NoReference

    def k3(logprobs, ref_logprobs):
        raise _NoReference()

    with pytest.raises(AssertionError, match="raised the checker's _NoReference itself"):
        exercises.check("k3", k3, quiet=True)
    monkeypatch.setattr(_reference, "STAND_IN", True, raising=False)  # as in the student package: still refused
    with pytest.raises(AssertionError, match="raised the checker's _NoReference itself"):
        exercises.check("k3", k3, quiet=True)


def test_a_submission_that_borrows_minirls_code_object_is_refused():
    """Cheat 3 of issue 53: minirl's ``__code__`` copied into the student's function before the check (6/6)."""

    def k3(logprobs, ref_logprobs):
        raise NotImplementedError

    k3.__code__ = kl.k3.__code__  # the library's code under the student's name
    with pytest.raises(AssertionError, match=r"calls minirl\.kl\.k3"):
        exercises.check("k3", k3, quiet=True)
    exercises.check("k3", REFERENCE["k3"], quiet=True)  # the guard is undone: an honest submission passes after it


def test_a_submission_from_a_second_copy_of_the_answer_key_is_refused():
    """Cheat 4 of issue 53: the answer key's own file loaded again under another module name (6/6 on the grader)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("not_the_key", _reference.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    with pytest.raises(AssertionError, match=r"calls minirl\.exercises\._reference\.gae"):
        exercises.check("gae", copy.gae, quiet=True)

    def gae(rewards, values, mask, *, gamma=1.0, lam=0.95):  # the copy called from inside the student's function
        return copy.gae(rewards, values, mask, gamma=gamma, lam=lam)

    with pytest.raises(AssertionError, match=r"calls minirl\.exercises\._reference\.gae"):
        exercises.check("gae", gae, quiet=True)


def test_a_mistake_no_case_knows_gets_no_guessed_cause():
    """Issue 53: ``exact_kl`` averaged over the vocabulary instead of summed was told "this is KL(ref || pi)". A
    value no known mistake gives is reported as wrong, with what was got and expected, and no "Likely mistake"."""

    def exact_kl(logits, ref_logits):
        logp, logq = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
        return (logp.exp() * (logp - logq)).mean(-1)  # averaged over the vocabulary

    with pytest.raises(AssertionError) as err:
        exercises.check("exact_kl", exact_kl, quiet=True)
    message = str(err.value)
    assert "Likely mistake" not in message and "No known mistake gives this value" in message
    assert "got (" in message and "expected (" in message
    # a recognised one is still named as the likely mistake
    with pytest.raises(AssertionError, match="Likely mistake: "):
        exercises.check("k3", lambda lp, ref: torch.exp(lp - ref) - 1 - (lp - ref), quiet=True)


def test_a_patched_comparison_is_refused_before_the_check(monkeypatch):
    """Monkeypatching (issue 53): torch.allclose made to say yes, and the checker's own comparison replaced, from a
    solution cell before the check cell runs. The checker fingerprints them when it is imported and refuses."""
    wrong = REFERENCE["k3"]

    def k3(logprobs, ref_logprobs):
        return wrong(logprobs, ref_logprobs) + 1.0  # wrong on every case

    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    with pytest.raises(AssertionError, match=r"torch\.allclose was replaced before the check.*not graded"):
        exercises.check("k3", k3, quiet=True)
    monkeypatch.undo()
    from minirl.exercises import _core

    monkeypatch.setattr(_core, "_close", lambda *a, **k: True)
    with pytest.raises(AssertionError, match=r"minirl\.exercises\._core\._close was replaced"):
        exercises.check("k3", k3, quiet=True)
    monkeypatch.undo()
    original = _core._expect.__code__
    try:
        _core._expect.__code__ = (lambda *a, **k: None).__code__  # the code swapped, the name kept
        with pytest.raises(AssertionError, match=r"_core\._expect was replaced"):
            exercises.check("k3", k3, quiet=True)
    finally:
        _core._expect.__code__ = original
    monkeypatch.setattr(exercises.EXERCISES["k3"], "cases", [])  # no cases: nothing to fail
    with pytest.raises(AssertionError, match=r"the cases of exercise 'k3' were changed"):
        exercises.check("k3", k3, quiet=True)
    monkeypatch.undo()
    assert exercises.check("k3", wrong, quiet=True) == 4  # all restored: an honest submission passes


def test_a_patch_made_from_inside_the_submission_is_refused():
    """The same patch made by the student's function while it runs (so no check before the call can see it)."""
    from minirl.exercises import _core

    original = _core._close

    def k3(logprobs, ref_logprobs):
        _core._close = lambda *a, **k: True
        return logprobs * 0.0

    try:
        with pytest.raises(AssertionError, match=r"_core\._close was replaced while the submission ran"):
            exercises.check("k3", k3, quiet=True)
    finally:
        _core._close = original


def test_a_replaced_experiment_runner_is_refused(monkeypatch):
    """Cheat 2's second half: ``experiments.run_arm`` replaced from a solution cell (8/8 with no training)."""
    from minirl.exercises import experiments

    def run_arm(name, arm, *, seed=0, steps=experiments.STEPS, progress=False):
        return {"experiment": name, "arm": arm, "steps": experiments.STEPS, "value": 0.5, "seed": seed}

    monkeypatch.setattr(experiments, "run_arm", run_arm)
    experiments.predict("beta", "beta=0")
    with pytest.raises(AssertionError, match=r"experiments\.run_arm was replaced before the runs"):
        experiments.run_experiment("beta", seed=0)
    runs = {arm: {**run_arm("beta", arm), "prediction": {"value": "beta=0"}} for arm in ("beta=0", "beta=0.5")}
    with pytest.raises(AssertionError, match=r"experiments\.run_arm was replaced before the experiment was graded"):
        experiments.check_experiment("beta", runs)
