"""The named mistakes of the course kit's exercises added by issue 40 (05's gmpo_loss, 10, 06 entropy,
09 distillation, 12 stale samplers) and after it (14 multi-turn, 15 learned rewards): each a wrong implementation the
checker must reject with the hint that names it, and minirl's own function in the exercise's signature (a submission
that calls through to minirl is refused).

tests/test_exercises.py runs them with the kit's other mistakes (MISTAKES, MINIRL there are extended with these).
Where the field made the mistake in public, it is that bug: the min / max clip whose side does not follow the
advantage's sign (GMPO's and decoupled PPO's "min for A < 0"), the biased pass@k 1 - (1 - c/n)^k, the forward KL
where on-policy distillation minimises the reverse one, a teacher that is not detached, a KL summed over the prompt,
naive PPO's clip around the stale sampler instead of the proximal policy. The public reports: verl PR #7240 (best@k
resampled with replacement), openai/human-eval issue #35 (1.0 for k > n with nothing correct), the review of
modelscope/twinkle PR #112 (forward and reverse KL swapped in F.kl_div), the review of TRL PR #6526 (a teacher that
tracks gradients), TRL PR #7120 (AsyncGRPO's ratio against the sampler) and radixark/miles PR #1829 (a clip anchored on
a recomputed policy with no behaviour-to-proximal weight).
"""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
import tempfile
from pathlib import Path

import torch

from minirl import distill, entropy, gsm8k, kl, losses, multiturn, reward_models, stale_corrections, trust_region
from minirl.exercises import _reference
from minirl.minimal import distill as minimal_distill


def _private_copy(module):
    """A copy of ``module`` from a copy of its file (the key's own file, loaded again, is refused inside a check)."""
    path = Path(tempfile.mkdtemp(prefix="minirl-key-copy-")) / "reference_copy_for_new_mistakes.py"
    shutil.copy(module.__file__, path)
    spec = importlib.util.spec_from_file_location("reference_copy_for_new_mistakes", path)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


R = _private_copy(_reference)  # the answer key refuses to run inside a check; its copy does not


# ------------------------------------------------------------------------------------------------ 05 · gmpo_loss


def _gmpo(lp, old, adv, mask, eps_low, eps_high, *, side="sign", space="log", mean="geometric", over="valid",
          empty="left out", detach_old=True):
    m = mask.float()
    log_r = (lp - (old.detach() if detach_old else old)) * m
    if space == "log":
        clipped = log_r.clamp(-eps_low, eps_high)
    else:  # the ratio clipped to [1 - eps_low, 1 + eps_high], then back to log space
        clipped = torch.log(torch.exp(log_r).clamp(1 - eps_low, 1 + eps_high))
    a = adv.unsqueeze(1)
    if side == "sign":
        chosen = torch.where(a > 0, torch.minimum(log_r, clipped), torch.maximum(log_r, clipped))
    elif side == "min":  # min for every sign: the sign error for negative advantages
        chosen = torch.minimum(log_r, clipped)
    elif side == "max":
        chosen = torch.maximum(log_r, clipped)
    else:  # the clipped log-ratio alone
        chosen = clipped
    n = m.sum(-1).clamp(min=1) if over == "valid" else torch.full_like(m[:, 0], m.shape[1])
    if mean == "geometric":
        weight = torch.exp((chosen * m).sum(-1) / n)
    else:
        weight = (torch.exp(chosen) * m).sum(-1) / n
    per_seq = -adv * weight
    if empty == "counted":
        return per_seq.mean()
    valid = (m.sum(-1) > 0).float()
    return (per_seq * valid).sum() / valid.sum().clamp(min=1)


def gmpo_min_for_every_sign(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, side="min")


def gmpo_max_for_every_sign(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, side="max")


def gmpo_clip_only(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, side="clip")


def gmpo_ratio_space_clip(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, space="ratio")


def gmpo_arithmetic_mean(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, mean="arithmetic")


def gmpo_mean_over_T(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, over="T")


def gmpo_empty_row_counted(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, empty="counted")


def gmpo_old_not_detached(lp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high, detach_old=False)


def gmpo_ppo_defaults(lp, old, adv, mask, eps_low=0.2, eps_high=0.2):
    return _gmpo(lp, old, adv, mask, eps_low, eps_high)


# ------------------------------------------------------------------------------------- 10 · ratio_weighted_k3


def _rwk3(lp, old, ref, mask, *, ratio="differentiated", upside_down=False, k3_upside_down=False):
    m = mask.float()
    log_ratio = (old.detach() - lp if upside_down else lp - old.detach()) * m
    r = torch.exp(log_ratio)
    r = r.detach() if ratio == "detached" else r
    log_r = ((lp - ref) if k3_upside_down else (ref - lp)) * m
    k3 = torch.exp(log_r) - 1 - log_r
    return (k3 if ratio == "none" else r * k3) * m


def rwk3_ratio_detached(lp, old, ref, mask):
    return _rwk3(lp, old, ref, mask, ratio="detached")


def rwk3_ratio_upside_down(lp, old, ref, mask):
    return _rwk3(lp, old, ref, mask, upside_down=True)


def rwk3_k3_upside_down(lp, old, ref, mask):
    return _rwk3(lp, old, ref, mask, k3_upside_down=True)


def rwk3_plain_k3(lp, old, ref, mask):
    return _rwk3(lp, old, ref, mask, ratio="none")


def rwk3_old_not_detached(lp, old, ref, mask):
    m = mask.float()
    log_r = (ref - lp) * m
    return torch.exp((lp - old) * m) * (torch.exp(log_r) - 1 - log_r) * m


def rwk3_mask_after_exp(lp, old, ref, mask):
    log_r = ref - lp  # padding's garbage goes through exp: inf there, and inf * 0 = NaN
    return torch.exp(lp - old.detach()) * (torch.exp(log_r) - 1 - log_r) * mask


# ------------------------------------------------------------------------------------- 06 · token_covariance


def cov_row_means(lp, adv, mask):
    m = mask.float()
    a = adv.unsqueeze(1).expand_as(lp)
    n = m.sum(-1, keepdim=True).clamp(min=1)
    return ((lp - (lp * m).sum(-1, keepdim=True) / n) * (a - (a * m).sum(-1, keepdim=True) / n) * m).detach()


def _cov(lp, adv, mask, *, centre_lp=True, centre_adv=True, pad=False, adv_mean="tokens"):
    m = mask.float()
    lp = lp.detach()
    a = adv.unsqueeze(1).expand_as(lp)
    w = torch.ones_like(m) if pad else m
    n = w.sum().clamp(min=1)
    lp_c = lp - (lp * w).sum() / n if centre_lp else lp
    a_mean = (a * w).sum() / n if adv_mean == "tokens" else adv.mean()
    a_c = a - a_mean if centre_adv else a
    return lp_c * a_c * m


def cov_adv_not_centred(lp, adv, mask):
    return _cov(lp, adv, mask, centre_adv=False)


def cov_padding_in_means(lp, adv, mask):
    return _cov(lp, adv, mask, pad=True)


def cov_adv_mean_over_sequences(lp, adv, mask):
    return _cov(lp, adv, mask, adv_mean="sequences")


def cov_scalar(lp, adv, mask):
    return R.token_covariance(lp, adv, mask).sum() / mask.sum().clamp(min=1)


def cov_not_detached(lp, adv, mask):
    m = mask.float()
    a = adv.unsqueeze(1).expand_as(lp)
    n = m.sum().clamp(min=1)
    return (lp - (lp * m).sum() / n) * (a - (a * m).sum() / n) * m


def cov_nan_on_empty(lp, adv, mask):
    m, lp = mask > 0, lp.detach()
    a = adv.unsqueeze(1).expand_as(lp)
    out = torch.zeros_like(lp)
    out[m] = (lp[m] - lp[m].mean()) * (a[m] - a[m].mean())
    return out if m.any() else out + lp[m].mean()  # the mean of nothing: NaN


# ------------------------------------------------------------------------------------------------ 06 · pass_at_k


def pass_biased(n, c, k):
    return 1 - (1 - c.double() / n.double()) ** k


def pass_share(n, c, k):
    return c.double() / n.double()


def pass_union_bound(n, c, k):
    return (k * c.double() / n.double()).clamp(max=1)


def pass_complement(n, c, k):
    return torch.tensor([math.comb(a - b, k) / math.comb(a, k) for a, b in zip(n.tolist(), c.tolist(), strict=True)],
                        dtype=torch.float64)


def pass_mean_over_problems(n, c, k):
    """The benchmark's pass@k (the mean over problems), where each problem's is asked for."""
    return R.pass_at_k(n, c, k).mean()


def pass_float_binomials(n, c, k):
    """The binomials as float64 (scipy.special.comb's default, exact=False): inf / inf = NaN beyond 10^308."""
    if k > int(n.min()):
        raise ValueError("k > n")
    return torch.tensor([1 - float(math.comb(a - b, k)) / float(math.comb(a, k)) if math.comb(a, k) < 1e308
                         else math.nan for a, b in zip(n.tolist(), c.tolist(), strict=True)], dtype=torch.float64)


def pass_shortcut_without_check_of_k(n, c, k):
    """The stable product with its 'n - c < k: 1.0' shortcut and no check of k <= n: an unsolved problem (c = 0)
    with k > n scores 1 (openai/human-eval issue #35, PR #68)."""
    return torch.tensor([1.0 if a - b < k else 1.0 - math.prod(1.0 - k / i for i in range(a - b + 1, a + 1))
                         for a, b in zip(n.tolist(), c.tolist(), strict=True)], dtype=torch.float64)


def pass_no_check_of_k(n, c, k):
    return torch.tensor([1 - math.comb(a - b, k) / math.comb(a, k) for a, b in zip(n.tolist(), c.tolist(),
                                                                                   strict=True)])


# ---------------------------------------------------------------------------------------- 09 · reverse_kl_reward


def reward_sign_flipped(lp, teacher, mask):
    return ((lp - teacher) * mask).detach()


def reward_k3(lp, teacher, mask):
    log_r = (teacher - lp).detach()
    return -(torch.exp(log_r) - 1 - log_r) * mask


def reward_over_the_prompt(lp, teacher, mask):
    return (teacher - lp).detach()  # every position, whatever the mask says


def reward_not_detached(lp, teacher, mask):
    return (teacher.detach() - lp) * mask


def reward_teacher_not_detached(lp, teacher, mask):
    return (teacher - lp.detach()) * mask


# ------------------------------------------------------------------------------------------ 09 · full_reverse_kl


def _kl(logits, teacher, mask, temperature, *, forward=False, normalise=True, t_student=True, t_teacher=True,
        detach_teacher=True, masked=True):
    s = logits / (temperature if t_student else 1.0)
    q_logits = (teacher.detach() if detach_teacher else teacher) / (temperature if t_teacher else 1.0)
    log_p = s.log_softmax(-1) if normalise else s
    log_q = q_logits.log_softmax(-1) if normalise else q_logits
    if forward:
        kl_ = (log_q.exp() * (log_q - log_p)).sum(-1)
    else:
        p = log_p.exp() if normalise else s.softmax(-1)
        kl_ = (p * (log_p - log_q)).sum(-1)
    return kl_ * mask if masked else kl_


def kl_forward(logits, teacher, mask, temperature=1.0):
    return _kl(logits, teacher, mask, temperature, forward=True)


def kl_teacher_not_detached(logits, teacher, mask, temperature=1.0):
    return _kl(logits, teacher, mask, temperature, detach_teacher=False)


def kl_over_the_prompt(logits, teacher, mask, temperature=1.0):
    return _kl(logits, teacher, mask, temperature, masked=False)


def kl_logits_as_logprobs(logits, teacher, mask, temperature=1.0):
    return _kl(logits, teacher, mask, temperature, normalise=False)


def kl_temperature_on_student_only(logits, teacher, mask, temperature=1.0):
    return _kl(logits, teacher, mask, temperature, t_teacher=False)


def kl_zero_log_zero_nan(logits, teacher, mask, temperature=1.0):
    return _kl(logits, teacher, mask, temperature)  # p * (log p - log q) with p = 0, log p = -inf: NaN


# ------------------------------------------------------------------------------------- 12 · decoupled_ppo_terms


def _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, cap=None, *, around="prox", weight="prox/mu", side="max",
          cap_rule="mask", detach_prox=True, masked_before_exp=True):
    eps_high = eps_low if eps_high is None else eps_high
    m = mask.float()
    prox_d = prox.detach() if detach_prox else prox
    log_w = (prox.detach() - mu) * m if masked_before_exp else prox.detach() - mu
    w = {"prox/mu": torch.exp(log_w), "mu/prox": torch.exp(-log_w), "none": torch.ones_like(log_w)}[weight]
    if cap is not None and cap_rule == "mask":
        w = torch.where(w > cap, 0.0, w)
    elif cap is not None and cap_rule == "truncate":
        w = w.clamp(max=cap)
    base = prox_d if around == "prox" else mu
    log_r = (lp - base) * m if masked_before_exp else lp - base
    r = torch.exp(log_r)
    a = adv.unsqueeze(1)
    pick = torch.maximum if side == "max" else torch.minimum
    return w * pick(-a * r, -a * r.clamp(1 - eps_low, 1 + eps_high)) * m


def dppo_clip_around_behaviour(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, weight_cap, around="mu", weight="none")


def dppo_no_weight(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, weight_cap, weight="none")


def dppo_weight_upside_down(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, weight_cap, weight="mu/prox")


def dppo_min_not_max(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, weight_cap, side="min")


def dppo_prox_not_detached(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, weight_cap, detach_prox=False)


def dppo_cap_truncates(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, weight_cap, cap_rule="truncate")


def dppo_cap_ignored(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, None)


def dppo_eps_high_none_unbounded(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, math.inf if eps_high is None else eps_high, weight_cap)


def dppo_mask_after_exp(lp, prox, mu, adv, mask, eps_low=0.2, eps_high=None, weight_cap=None):
    return _dppo(lp, prox, mu, adv, mask, eps_low, eps_high, weight_cap, masked_before_exp=False)


# -------------------------------------------------------------------------------- 12 · off_policy_sequence_mask


def _opm(lp, mu, adv, mask, threshold, *, direction="mu-pi", any_sign=False, reduce="mean", strict=True):
    m = mask.float()
    log_r = ((mu - lp) if direction == "mu-pi" else (lp - mu)) * m
    if reduce == "mean":
        stat = log_r.sum(-1) / m.sum(-1)  # an empty row: 0 / 0 = NaN, dropped when A < 0
        stat = torch.where(m.sum(-1) > 0, stat, 0.0)
    elif reduce == "sum":
        stat = log_r.sum(-1)
    elif reduce == "over T":
        stat = log_r.sum(-1) / m.shape[1]
    else:  # "nan": 0 / 0 for an empty row
        stat = log_r.sum(-1) / m.sum(-1)
    far = stat > threshold if strict else stat >= threshold
    drop = far if any_sign else far & (adv < 0)
    return (~drop).float()


def opm_upside_down(lp, mu, adv, mask, threshold):
    return _opm(lp, mu, adv, mask, threshold, direction="pi-mu")


def opm_drops_positive(lp, mu, adv, mask, threshold):
    return _opm(lp, mu, adv, mask, threshold, any_sign=True)


def opm_sum(lp, mu, adv, mask, threshold):
    return _opm(lp, mu, adv, mask, threshold, reduce="sum")


def opm_over_T(lp, mu, adv, mask, threshold):
    return _opm(lp, mu, adv, mask, threshold, reduce="over T")


def opm_inclusive(lp, mu, adv, mask, threshold):
    return _opm(lp, mu, adv, mask, threshold, strict=False)


def opm_nan_on_empty(lp, mu, adv, mask, threshold):
    m = mask.float()
    stat = ((mu - lp) * m).sum(-1) / m.sum(-1)
    return ((adv >= 0) | (stat <= threshold)).float()  # NaN <= threshold is False: the empty row is dropped


def _gae_rows(rewards, values, mask, *, gamma, lam, reset_at_holes):
    """GAE along each row's columns where ``mask`` is 1 ... the helper of the episode_gae mistakes below."""
    adv, ret = torch.zeros(rewards.shape), torch.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        next_v, next_a = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if mask[b, t] <= 0:
                if reset_at_holes:
                    next_v, next_a = 0.0, 0.0
                continue
            v = float(values[b, t].detach())
            a = float(rewards[b, t]) + gamma * next_v - v + gamma * lam * next_a
            adv[b, t], ret[b, t], next_v, next_a = a, a + v, v, a
    return adv, ret


def egae_observations_as_steps(rewards, values, model_mask, *, gamma=1.0, lam=0.95):
    """The recursion through every token up to the row's last model token: observations read as steps."""
    last = [int((model_mask[b] > 0).nonzero().max()) + 1 if (model_mask[b] > 0).any() else 0
            for b in range(len(model_mask))]
    span = torch.tensor([[1.0 if t < n else 0.0 for t in range(model_mask.shape[1])] for n in last])
    adv, ret = _gae_rows(rewards, values, span, gamma=gamma, lam=lam, reset_at_holes=True)
    return adv * model_mask, ret * model_mask


def egae_observation_ends_episode(rewards, values, model_mask, *, gamma=1.0, lam=0.95):
    """Plain GAE's loop with the mask's holes as episode ends (value and advantage 0 there)."""
    return _gae_rows(rewards, values, model_mask, gamma=gamma, lam=lam, reset_at_holes=True)


def egae_not_zeroed(rewards, values, model_mask, *, gamma=1.0, lam=0.95):
    """The right advantages on the model's tokens, the values left standing elsewhere."""
    adv, ret = _gae_rows(rewards, values, model_mask, gamma=gamma, lam=lam, reset_at_holes=False)
    return adv, torch.where(model_mask > 0, ret, values.detach())


def egae_values_not_detached(rewards, values, model_mask, *, gamma=1.0, lam=0.95):
    adv, ret = _gae_rows(rewards, values, model_mask, gamma=gamma, lam=lam, reset_at_holes=False)
    return adv + 0 * values.sum(), ret  # a graph through the critic's values


# ------------------------------------------------------------------------------------------------ 15 · learned rewards


def _bt(chosen, rejected, margin=None, center_coef=None, *, sign=1.0, link="logsigmoid", margin_sign=-1.0,
        reduce="mean", center="sum", center_reduce="mean"):
    diff = sign * (chosen - rejected)
    if margin is not None:
        diff = diff + margin_sign * margin
    if link == "logsigmoid":
        per_pair = -torch.nn.functional.logsigmoid(diff)
    elif link == "log(sigmoid)":  # underflows to log 0 = -inf for a large negative difference
        per_pair = -torch.log(torch.sigmoid(diff))
    else:  # the likelihood itself
        per_pair = -torch.sigmoid(diff)
    loss = per_pair.mean() if reduce == "mean" else per_pair.sum()
    if center_coef:
        level = (chosen + rejected) if center == "sum" else (chosen - rejected)
        squares = level ** 2
        loss = loss + center_coef * (squares.mean() if center_reduce == "mean" else squares.sum())
    return loss


def bt_sign_flipped(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, center_coef, sign=-1.0)


def bt_no_log(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, center_coef, link="sigmoid")


def bt_naive_logsigmoid(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, center_coef, link="log(sigmoid)")


def bt_sum(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, center_coef, reduce="sum")


def bt_margin_added(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, center_coef, margin_sign=1.0)


def bt_center_on_difference(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, center_coef, center="difference")


def bt_center_summed(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, center_coef, center_reduce="sum")


def bt_center_ignored(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    return _bt(chosen_rewards, rejected_rewards, margin, None)


def _bon(proxy, gold, ns, *, pick="proxy", prefix=True, report="gold", ties="first"):
    if min(ns) < 1 or max(ns) > proxy.shape[1]:
        raise ValueError("n out of range")
    out = []
    for n in ns:
        cols = slice(0, n) if prefix else slice(None)
        if pick == "none":
            out.append(gold[:, :n].double().mean())
            continue
        score = (proxy if pick == "proxy" else gold)[:, cols]
        if ties == "last":  # the last of equals: argmax over the reversed columns
            idx = score.shape[1] - 1 - score.flip(1).argmax(1, keepdim=True)
        else:
            idx = score.argmax(1, keepdim=True)
        out.append((gold if report == "gold" else proxy).gather(1, idx).double().mean())
    return torch.stack(out)


def bon_among_all(proxy, gold, ns):
    return _bon(proxy, gold, ns, prefix=False)


def bon_by_gold(proxy, gold, ns):
    return _bon(proxy, gold, ns, pick="gold")


def bon_reports_proxy(proxy, gold, ns):
    return _bon(proxy, gold, ns, report="proxy")


def bon_no_pick(proxy, gold, ns):
    return _bon(proxy, gold, ns, pick="none")


def bon_last_of_equals(proxy, gold, ns):
    return _bon(proxy, gold, ns, ties="last")


def bon_no_check(proxy, gold, ns):
    return torch.stack([gold.gather(1, proxy[:, :n].argmax(1, keepdim=True)).double().mean() for n in ns])



# --- 01 · reinforce_estimate (the policy gradient of a softmax bandit) -------------------------------------------
def _onehot(actions, k):
    return torch.nn.functional.one_hot(actions, k).double()


def re_no_pi(logits, actions, rewards, *, baseline=0.0):
    return ((rewards.double() - baseline)[:, None] * _onehot(actions, logits.shape[-1])).mean(0)


def re_log_pi(logits, actions, rewards, *, baseline=0.0):
    score = _onehot(actions, logits.shape[-1]) - torch.log_softmax(logits.double(), -1)
    return ((rewards.double() - baseline)[:, None] * score).mean(0)


def re_summed(logits, actions, rewards, *, baseline=0.0):
    score = _onehot(actions, logits.shape[-1]) - torch.softmax(logits.double(), -1)
    return ((rewards.double() - baseline)[:, None] * score).sum(0)


def re_sign(logits, actions, rewards, *, baseline=0.0):
    score = _onehot(actions, logits.shape[-1]) - torch.softmax(logits.double(), -1)
    return -((rewards.double() - baseline)[:, None] * score).mean(0)


def re_no_baseline(logits, actions, rewards, *, baseline=0.0):
    score = _onehot(actions, logits.shape[-1]) - torch.softmax(logits.double(), -1)
    return (rewards.double()[:, None] * score).mean(0)


def re_baseline_added(logits, actions, rewards, *, baseline=0.0):
    score = _onehot(actions, logits.shape[-1]) - torch.softmax(logits.double(), -1)
    return ((rewards.double() + baseline)[:, None] * score).mean(0)


def re_overflow(logits, actions, rewards, *, baseline=0.0):
    e = logits.exp()  # exp(1000) = inf
    score = _onehot(actions, logits.shape[-1]) - e / e.sum()
    return ((rewards.double() - baseline)[:, None] * score).mean(0)


# --- 09 · rewards_to_go (the one-file distillation's advantages) -------------------------------------------------
def _rtg(rewards, mask, gamma, *, forward=False, exclude_self=False, leak=False, joined=False):
    r = rewards if leak else torch.where(mask > 0, rewards, 0.0)
    if joined:  # one long row
        out = _rtg(r.reshape(1, -1), torch.ones(1, r.numel()), gamma).reshape(r.shape)
        return torch.where(mask > 0, out, 0.0)
    out, running = torch.zeros_like(r), torch.zeros_like(r[:, 0])
    steps = range(r.shape[1]) if forward else range(r.shape[1] - 1, -1, -1)
    for t in steps:
        if exclude_self:
            out[:, t] = gamma * running
            running = r[:, t] + gamma * running
        else:
            running = r[:, t] + gamma * running
            out[:, t] = running
    return torch.where(mask > 0, out, 0.0)


def rtg_forward(rewards, mask, gamma):
    return _rtg(rewards, mask, gamma, forward=True)


def rtg_excludes_self(rewards, mask, gamma):
    return _rtg(rewards, mask, gamma, exclude_self=True)  # sum over s > t


def rtg_gamma_from_start(rewards, mask, gamma):
    r = torch.where(mask > 0, rewards, 0.0) * gamma ** torch.arange(rewards.shape[1])
    return torch.where(mask > 0, r.flip(1).cumsum(1).flip(1), 0.0)


def rtg_no_discount(rewards, mask, gamma):
    return _rtg(rewards, mask, 1.0)


def rtg_padding_leaks(rewards, mask, gamma):
    return _rtg(rewards, mask, gamma, leak=True)


def rtg_rows_joined(rewards, mask, gamma):
    return _rtg(rewards, mask, gamma, joined=True)


# --- 12 · dppo_mask (the trust region anchored on the sampler) ---------------------------------------------------
def _pq(lp, old):
    return lp.detach().exp(), old.detach().exp()


def dmask_ratio_bound(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    r = (lp - old).detach().exp()  # PPO's ratio in place of the divergence
    return torch.where(adv > 0, r <= 1 + delta_high, r >= 1 - delta_low).float()


def dmask_both_sides(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    p, q = _pq(lp, old)
    return ((p - q).abs() <= delta_high).float()  # every token bounded both ways


def dmask_sides_swapped(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    p, q = _pq(lp, old)
    return torch.where(adv > 0, p - q >= -delta_low, p - q <= delta_high).float()


def dmask_zero_up(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    p, q = _pq(lp, old)
    return torch.where(adv >= 0, p - q <= delta_high, p - q >= -delta_low).float()  # A = 0 on the up side


def dmask_deltas_swapped(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    p, q = _pq(lp, old)
    return torch.where(adv > 0, p - q <= delta_low, p - q >= -delta_high).float()


def dmask_deltas_ignored(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    p, q = _pq(lp, old)
    return torch.where(adv > 0, p - q <= 0.2, p - q >= -0.2).float()


def dmask_kl_reversed(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    p, q = _pq(lp, old)
    if divergence == "tv":
        return torch.where(adv > 0, p - q <= delta_high, p - q >= -delta_low).float()
    kl = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()  # KL(pi || mu)
    return torch.where(adv > 0, (kl <= delta_high) | (p <= q), (kl <= delta_low) | (p >= q)).float()


def dmask_always_tv(lp, old, adv, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    p, q = _pq(lp, old)
    return torch.where(adv > 0, p - q <= delta_high, p - q >= -delta_low).float()  # divergence ignored


# --- 13 · final_answer (the real model's reward) ------------------------------------------------------------------
_NUM = r"(?:(?<![\w.])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"


def _answer(text, number=_NUM, strip=("$",), first_mark=False, marked_first=True, last=True, to=float):
    for c in strip:
        text = text.replace(c, " ")
    marks = re.findall(r"####([^\n]*)", text)
    if marks and marked_first:
        found = re.findall(number, marks[0] if first_mark else marks[-1])
        return to(found[0].replace(",", "")) if found and found[0].replace(",", "") else None
    found = re.findall(number, text)
    if not found:
        return None
    pick = found[-1] if last else found[0]
    return to(pick.replace(",", "")) if pick.replace(",", "") else None


def fa_split_comma(text):
    return _answer(text, number=r"(?:(?<![\w.])-)?\d+(?:\.\d+)?")  # "1,250" -> "1", "250"


def fa_comma_class(text):
    return _answer(text, number=r"-?[\d,]+(?:\.\d+)?")  # HELM #4337's "[\d,]+": a lone comma is a number


def fa_first_mark(text):
    return _answer(text, first_mark=True)


def fa_ignores_mark(text):
    return _answer(text, marked_first=False)  # the last number of the text, marked or not


def fa_first_number(text):
    return _answer(text, last=False)


def fa_no_sign(text):
    return _answer(text, number=r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def fa_dollar_ends(text):
    marks = re.findall(r"####\s*(-?[\d,]+(?:\.\d+)?)", text)  # "$" right after the mark: no match
    if "####" in text:
        return float(marks[-1].replace(",", "")) if marks else None
    return _answer(text)


def fa_tail_window(text):
    return _answer(text[-300:])  # verl PR #7274: only the last 300 characters are searched


def fa_string(text):
    return _answer(text, to=str)

MISTAKES = [
    # (exercise, mistake name, wrong implementation, substring of the expected hint)
    ("gmpo_loss", "min for every sign (the sign error for A < 0)", gmpo_min_for_every_sign,
     "sign error of a min / max"),
    ("gmpo_loss", "max for every sign", gmpo_max_for_every_sign, "optimistic branch"),
    ("gmpo_loss", "the clipped log-ratio alone", gmpo_clip_only, "clip(l) alone"),
    ("gmpo_loss", "ratio clipped to [1 - eps, 1 + eps]", gmpo_ratio_space_clip, "clips the LOG-ratio"),
    ("gmpo_loss", "arithmetic mean of the ratios", gmpo_arithmetic_mean, "GEOMETRIC mean"),
    ("gmpo_loss", "mean over the padded length", gmpo_mean_over_T, "padded length T"),
    ("gmpo_loss", "empty rows counted", gmpo_empty_row_counted, "left out of the mean over sequences"),
    ("gmpo_loss", "old log-prob not detached", gmpo_old_not_detached, "detach the behaviour"),
    ("gmpo_loss", "PPO's 0.2 as the default bounds", gmpo_ppo_defaults, "0.4 / 0.4"),
    ("ratio_weighted_k3", "ratio detached", rwk3_ratio_detached, "FORWARD KL's"),
    ("ratio_weighted_k3", "ratio upside down", rwk3_ratio_upside_down, "not pi_old / pi"),
    ("ratio_weighted_k3", "k3 upside down", rwk3_k3_upside_down, "k3's ratio is upside down"),
    ("ratio_weighted_k3", "plain k3 (no ratio)", rwk3_plain_k3, "this is plain k3"),
    ("ratio_weighted_k3", "old log-prob not detached", rwk3_old_not_detached, "detach the behaviour"),
    ("ratio_weighted_k3", "exp before the mask", rwk3_mask_after_exp, "0 outside the mask"),
    ("token_covariance", "means per row", cov_row_means, "not of each row"),
    ("token_covariance", "advantage not centred", cov_adv_not_centred, "centre BOTH"),
    ("token_covariance", "padding in the means", cov_padding_in_means, "valid tokens only"),
    ("token_covariance", "advantage's mean over sequences", cov_adv_mean_over_sequences, "not over the sequences"),
    ("token_covariance", "the batch covariance as a scalar", cov_scalar, "one term per token"),
    ("token_covariance", "terms not detached", cov_not_detached, "computed from detached values"),
    ("token_covariance", "NaN for a fully masked batch", cov_nan_on_empty, "mean over nothing"),
    ("pass_at_k", "biased 1 - (1 - c/n)^k", pass_biased, "WITH replacement"),
    ("pass_at_k", "c / n for every k", pass_share, "pass@1 whatever k"),
    ("pass_at_k", "the union bound k c / n", pass_union_bound, "union bound"),
    ("pass_at_k", "the chance all k fail", pass_complement, "one minus it"),
    ("pass_at_k", "the mean over problems", pass_mean_over_problems, "one value per problem"),
    ("pass_at_k", "binomials in float64", pass_float_binomials, "beyond float64"),
    ("pass_at_k", "no check of k <= n", pass_no_check_of_k, "raise ValueError"),
    ("pass_at_k", "the n - c < k shortcut without the check (human-eval #35)", pass_shortcut_without_check_of_k,
     "scores a problem with no correct sample as solved"),
    ("reverse_kl_reward", "sign flipped (the KL as a reward)", reward_sign_flipped, "MINUS the student's log-ratio"),
    ("reverse_kl_reward", "k3 in the reward", reward_k3, "k3 is an estimate of the KL to put in a LOSS"),
    ("reverse_kl_reward", "summed over the prompt (mask ignored)", reward_over_the_prompt, "KL summed over the prompt"),
    ("reverse_kl_reward", "reward not detached", reward_not_detached, "a reward carries no gradient"),
    ("reverse_kl_reward", "teacher log-probs not detached", reward_teacher_not_detached, "teacher's log-probs"),
    ("full_reverse_kl", "forward KL(q || p)", kl_forward, "FORWARD KL(q || p)"),
    ("full_reverse_kl", "teacher logits not detached", kl_teacher_not_detached, "teacher's log-probs"),
    ("full_reverse_kl", "KL over the prompt (mask ignored)", kl_over_the_prompt, "KL summed over the prompt"),
    ("full_reverse_kl", "logits used as log-probs", kl_logits_as_logprobs, "logits are not log-probabilities"),
    ("full_reverse_kl", "temperature on the student only", kl_temperature_on_student_only, "both distributions"),
    ("full_reverse_kl", "0 * log 0 = NaN", kl_zero_log_zero_nan, "0 * log 0 is 0"),
    ("decoupled_ppo_terms", "clip around the behaviour policy", dppo_clip_around_behaviour, "around the stale"),
    ("decoupled_ppo_terms", "no weight pi_prox / mu", dppo_no_weight, "is missing"),
    ("decoupled_ppo_terms", "weight upside down", dppo_weight_upside_down, "not mu / pi_prox"),
    ("decoupled_ppo_terms", "min instead of max (the sign error for A < 0)", dppo_min_not_max,
     "sign error of a min / max"),
    ("decoupled_ppo_terms", "proximal log-prob not detached", dppo_prox_not_detached, "detach the proximal"),
    ("decoupled_ppo_terms", "weight truncated at the cap", dppo_cap_truncates, "MASKS the token"),
    ("decoupled_ppo_terms", "weight_cap ignored", dppo_cap_ignored, "apply weight_cap"),
    ("decoupled_ppo_terms", "eps_high=None as no upper bound", dppo_eps_high_none_unbounded, "not 'no upper bound'"),
    ("decoupled_ppo_terms", "exp before the mask", dppo_mask_after_exp, "mask the log-ratios before exp"),
    ("off_policy_sequence_mask", "log-ratio upside down", opm_upside_down, "SAMPLER over the current policy"),
    ("off_policy_sequence_mask", "positive advantages dropped too", opm_drops_positive, "NEGATIVE advantage"),
    ("off_policy_sequence_mask", "sum instead of mean", opm_sum, "not their sum"),
    ("off_policy_sequence_mask", "mean over the padded length", opm_over_T, "padded length T"),
    ("off_policy_sequence_mask", "threshold inclusive", opm_inclusive, "exactly at the threshold is kept"),
    ("off_policy_sequence_mask", "NaN for an empty row", opm_nan_on_empty, "counts as on-policy"),
    ("episode_gae", "observations as the policy's steps", egae_observations_as_steps, "as if they were the policy's"),
    ("episode_gae", "an observation ends the episode", egae_observation_ends_episode, "across the observation"),
    ("episode_gae", "values left at the environment's tokens", egae_not_zeroed, "0 at the environment's tokens"),
    ("episode_gae", "values not detached", egae_values_not_detached, "constants"),
    ("reinforce_estimate", "the score without -pi", re_no_pi, "the gradient of the normaliser"),
    ("reinforce_estimate", "log pi in the score", re_log_pi, "not the log-probabilities"),
    ("reinforce_estimate", "summed over the samples", re_summed, "MEAN over the N samples"),
    ("reinforce_estimate", "the loss's gradient (sign flipped)", re_sign, "gradient of the loss -E[r]"),
    ("reinforce_estimate", "baseline ignored", re_no_baseline, "baseline was ignored"),
    ("reinforce_estimate", "baseline added", re_baseline_added, "SUBTRACTED"),
    ("reinforce_estimate", "exp overflows", re_overflow, "overflows to inf"),
    ("rewards_to_go", "a running sum from the start", rtg_forward, "BEFORE each token"),
    ("rewards_to_go", "the token's own reward left out", rtg_excludes_self, "not s > t"),
    ("rewards_to_go", "the discount from the start of the answer", rtg_gamma_from_start, "not from the start"),
    ("rewards_to_go", "gamma ignored", rtg_no_discount, "gamma was ignored"),
    ("rewards_to_go", "the padding's rewards summed", rtg_padding_leaks, "leaked into the sums"),
    ("rewards_to_go", "the rows run together", rtg_rows_joined, "its own answer"),
    ("dppo_mask", "PPO's ratio bound", dmask_ratio_bound, "bounds the RATIO"),
    ("dppo_mask", "both sides bounded for every token", dmask_both_sides, "side the advantage PUSHES"),
    ("dppo_mask", "sides swapped", dmask_sides_swapped, "pushes p UP"),
    ("dppo_mask", "A = 0 on the up side", dmask_zero_up, "A = 0 belongs to the A <= 0 side"),
    ("dppo_mask", "deltas swapped", dmask_deltas_swapped, "swapped here"),
    ("dppo_mask", "deltas ignored", dmask_deltas_ignored, "were ignored"),
    ("dppo_mask", "the binary KL the other way round", dmask_kl_reversed, "KL(mu || pi)"),
    ("dppo_mask", "the TV for every divergence", dmask_always_tv, "KL(mu || pi)"),
    ("final_answer", "a thousands separator splits the number (opencompass #2647)", fa_split_comma,
     "thousands separator"),
    ("final_answer", "a comma after the number read as one (HELM #4337)", fa_comma_class, "comma AFTER the number"),
    ("final_answer", "the first mark", fa_first_mark, "the LAST \"####\""),
    ("final_answer", "the mark ignored", fa_ignores_mark, "the first number after the mark"),
    ("final_answer", "the first number", fa_first_number, "LAST number of the text"),
    ("final_answer", "the sign dropped", fa_no_sign, "minus sign"),
    ("final_answer", "a dollar sign after the mark", fa_dollar_ends, "dollar sign"),
    ("final_answer", "only the last 300 characters (verl #7274)", fa_tail_window, "whole text is searched"),
    ("final_answer", "a string returned", fa_string, "return a float"),
    ("bradley_terry_loss", "the difference upside down", bt_sign_flipped, "must score HIGHER"),
    ("bradley_terry_loss", "the likelihood without its log", bt_no_log, "negative LOG-likelihood"),
    ("bradley_terry_loss", "log(sigmoid(x))", bt_naive_logsigmoid, "numerically stable log-sigmoid"),
    ("bradley_terry_loss", "summed over the pairs", bt_sum, "MEAN over the pairs"),
    ("bradley_terry_loss", "the margin added", bt_margin_added, "margin is SUBTRACTED"),
    ("bradley_terry_loss", "centring on the difference", bt_center_on_difference, "SUM of the two rewards"),
    ("bradley_terry_loss", "centring summed over the pairs", bt_center_summed, "is a MEAN over the pairs too"),
    ("bradley_terry_loss", "center_coef ignored", bt_center_ignored, "center_coef was ignored"),
    ("best_of_n_gold", "picked among all N", bon_among_all, "FIRST n samples"),
    ("best_of_n_gold", "picked by the gold score", bon_by_gold, "PROXY's favourite"),
    ("best_of_n_gold", "the proxy's score reported", bon_reports_proxy, "report the picks' GOLD"),
    ("best_of_n_gold", "no pick at all", bon_no_pick, "no pick was made"),
    ("best_of_n_gold", "the last of equals", bon_last_of_equals, "the FIRST sample is picked"),
    ("best_of_n_gold", "no check of n", bon_no_check, "raise ValueError for an n outside"),
]


# minirl's own functions in each exercise's signature: the submissions that call through to minirl
MINIRL = {
    "gmpo_loss": lambda lp, old, adv, mask, eps_low=0.4, eps_high=0.4: losses.gmpo_loss(
        lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high),
    "ratio_weighted_k3": lambda lp, old, ref, mask: kl.ratio_weighted_k3(lp, old, ref, mask=mask),
    "token_covariance": entropy.token_covariance,
    "pass_at_k": entropy.pass_at_k,
    "reverse_kl_reward": distill.reverse_kl_reward,
    "full_reverse_kl": distill.full_reverse_kl,
    "decoupled_ppo_terms": stale_corrections.decoupled_ppo_terms,
    "off_policy_sequence_mask": stale_corrections.off_policy_sequence_mask,
    "episode_gae": multiturn.episode_gae,
    "bradley_terry_loss": reward_models.bradley_terry_loss,
    "best_of_n_gold": reward_models.best_of_n_gold,
    "rewards_to_go": minimal_distill.rewards_to_go,
    "dppo_mask": trust_region.dppo_mask,
    "final_answer": lambda text: None if gsm8k.extract_answer(text) is None else float(gsm8k.extract_answer(text)),
}


#: One wrong submission per exercise of this edition, as a student would write it in the release notebook's solution
#: cell (self-contained: torch and exp_linear_above only): (mistake, a substring of its hint, the cell's source).
#: tests/test_exercise_notebooks.py runs them in the stored release and reads the check cells' messages.
WRONG_SUBMISSIONS = {
    "gmpo_loss": ("min for every sign (the sign error for A < 0)", "sign error of a min / max", '''
def gmpo_loss(logprobs, old_logprobs, advantages, mask, *, eps_low=0.4, eps_high=0.4):
    mask = mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs.detach()) * mask
    pessimistic = torch.minimum(log_ratio, log_ratio.clamp(-eps_low, eps_high))  # the same side for every sign
    n = mask.sum(-1)
    weight = exp_linear_above((pessimistic * mask).sum(-1) / n.clamp(min=1))
    valid = (n > 0).to(weight.dtype)
    return (-advantages * weight * valid).sum() / valid.sum().clamp(min=1)
'''),
    "ratio_weighted_k3": ("ratio detached", "FORWARD KL's", '''
def ratio_weighted_k3(logprobs, old_logprobs, ref_logprobs, mask):
    valid = mask > 0
    lp = torch.where(valid, logprobs, 0.0)
    ratio = exp_linear_above(lp - torch.where(valid, old_logprobs, 0.0)).detach()  # sg[ratio]
    log_r = torch.where(valid, ref_logprobs, lp.detach()) - lp
    return torch.where(valid, ratio * (exp_linear_above(log_r) - 1 - log_r), 0.0)
'''),
    "token_covariance": ("means per row", "not of each row", '''
def token_covariance(logprobs, advantages, mask):
    m = mask.float()
    lp = logprobs.detach()
    a = advantages.unsqueeze(1).expand_as(lp)
    n = m.sum(-1, keepdim=True).clamp(min=1)
    return (lp - (lp * m).sum(-1, keepdim=True) / n) * (a - (a * m).sum(-1, keepdim=True) / n) * m
'''),
    "pass_at_k": ("biased 1 - (1 - c/n)^k", "WITH replacement", '''
def pass_at_k(num_samples, num_correct, k):
    if k > int(num_samples.min()):
        raise ValueError("k > n")
    return 1 - (1 - num_correct.double() / num_samples.double()) ** k
'''),
    "reverse_kl_reward": ("summed over the prompt (mask ignored)", "KL summed over the prompt", '''
def reverse_kl_reward(logprobs, teacher_logprobs, mask):
    return (teacher_logprobs - logprobs).detach()
'''),
    "full_reverse_kl": ("forward KL(q || p)", "FORWARD KL(q || p)", '''
def full_reverse_kl(logits, teacher_logits, mask, *, temperature=1.0):
    log_p = (logits / temperature).log_softmax(-1)
    log_q = (teacher_logits.detach() / temperature).log_softmax(-1)
    return (log_q.exp() * (log_q - log_p)).sum(-1) * mask
'''),
    "decoupled_ppo_terms": ("clip around the behaviour policy", "around the stale", '''
def decoupled_ppo_terms(logprobs, prox_logprobs, behaviour_logprobs, advantages, mask, *, eps_low=0.2,
                        eps_high=None, weight_cap=None):
    eps_high = eps_low if eps_high is None else eps_high
    valid = mask > 0
    ratio = exp_linear_above(torch.where(valid, logprobs - behaviour_logprobs.detach(), 0.0))  # naive PPO: mu as pi_old
    a = torch.where(valid, advantages.unsqueeze(1), 0.0)
    return torch.where(valid, torch.maximum(-a * ratio, -a * ratio.clamp(1 - eps_low, 1 + eps_high)), 0.0)
'''),
    "off_policy_sequence_mask": ("positive advantages dropped too", "NEGATIVE advantage", '''
def off_policy_sequence_mask(logprobs, sampler_logprobs, advantages, mask, *, threshold):
    valid = mask > 0
    log_r = torch.where(valid, sampler_logprobs - logprobs, 0.0)
    mean = log_r.sum(-1) / valid.sum(-1).clamp(min=1)
    return (mean <= threshold).to(logprobs.dtype)  # the advantage's sign ignored
'''),
    "reinforce_estimate": ("the score without -pi", "the gradient of the normaliser", '''
def reinforce_estimate(logits, actions, rewards, *, baseline=0.0):
    onehot = torch.nn.functional.one_hot(actions, logits.shape[-1]).float()
    return ((rewards - baseline)[:, None] * onehot).mean(0)  # the score taken as onehot(a) alone
'''),
    "rewards_to_go": ("a running sum from the start", "BEFORE each token", '''
def rewards_to_go(rewards, mask, gamma):
    r = torch.where(mask > 0, rewards, 0.0)
    out, running = torch.zeros_like(r), torch.zeros_like(r[:, 0])
    for t in range(r.shape[1]):  # from the first token on
        running = r[:, t] + gamma * running
        out[:, t] = running
    return torch.where(mask > 0, out, 0.0)
'''),
    "dppo_mask": ("PPO's ratio bound", "bounds the RATIO", '''
def dppo_mask(logprobs, old_logprobs, advantages, *, divergence="tv", delta_low=0.2, delta_high=0.2):
    ratio = (logprobs - old_logprobs).detach().exp()  # the ratio, as PPO's clip bounds it
    return torch.where(advantages > 0, ratio <= 1 + delta_high, ratio >= 1 - delta_low).float()
'''),
    "final_answer": ("a comma after the number read as one (HELM #4337)", "comma AFTER the number", '''
def final_answer(text):
    import re
    marks = re.findall(r"####([^\\n]*)", text)
    found = re.findall(r"-?[\\d,]+(?:\\.\\d+)?", marks[-1] if marks else text)
    if not found:
        return None
    pick = (found[0] if marks else found[-1]).replace(",", "")
    return float(pick) if pick else None
'''),
    "bradley_terry_loss": ("the difference upside down", "must score HIGHER", '''
def bradley_terry_loss(chosen_rewards, rejected_rewards, *, margin=None, center_coef=None):
    diff = rejected_rewards - chosen_rewards  # the wrong way round
    if margin is not None:
        diff = diff - margin
    loss = torch.nn.functional.softplus(-diff).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss
'''),
}
