"""verl checked, not only printed (issue 54): for every preset ``to_verl`` maps, the overrides it writes, applied to
verl 0.9.1's own functions read from the wheel (``tests/extract_verl.py``), give minirl's advantages, loss and
gradient on the same batch.

The verl side is verl's advantage estimator (``algorithm.adv_estimator``), its policy loss
(``actor.policy_loss.loss_mode``, with ``clip_ratio_low / high / c``, ``tau_pos / tau_neg``, ``loss_agg_mode``,
``loss_scale_factor``) and, with ``use_kl_loss``, its ``kl_penalty`` aggregated by ``agg_loss`` and added times
``kl_loss_coef``: the four lines of ``verl/workers/utils/losses.py::ppo_loss`` that join them are written out here
(the function itself needs verl's TensorDict batch). The minirl side is the library's own stage 3
(``rl.compute_advantages``) and update loss (``entropy_control.policy_objective`` + ``rl_update.kl_loss_term``, the
terms ``rl_update.update_minibatch`` adds). Where verl differs by design (the group std's eps, REINFORCE++'s
whitening over tokens) the batch is one on which the two agree, and the test says so.
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from minirl import config, entropy_control, rl, rl_update
from minirl.interop import verl as verl_interop

B_GROUPS, G, T = 4, 4, 6


class VerlConfig(SimpleNamespace):
    def get(self, key, default=None):  # verl's config is a dict-like dataclass
        return getattr(self, key, default)


@pytest.fixture(scope="module")
def verl():
    import extract_verl

    return extract_verl.functions()


def presets() -> list[str]:
    """Every preset to_verl maps (PPO's critic and KL in the reward are checked in their own test)."""
    out = []
    for name in config.ALGORITHMS:
        try:
            verl_interop.verl_overrides(config.make_config(name))
        except NotImplementedError:
            continue
        if config.make_config(name).advantage != "gae":
            out.append(name)
    return out


def batch(seed: int, lengths=(6, 6, 6, 6, 3, 5, 6, 2, 6, 4, 6, 6, 5, 6, 1, 6)):
    """16 rows in 4 groups of 4: rewards 0/1 (one group all right: no signal), every row of one length when
    ``lengths`` is None, log-probs near the old ones (some tokens outside a 0.2 clip), a reference further off."""
    g = torch.Generator().manual_seed(seed)
    B = B_GROUPS * G
    lengths = torch.full((B,), T) if lengths is None else torch.tensor(lengths)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    logprobs = old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.6
    ref = old + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 1.0
    scores = (torch.rand(B, generator=g) < 0.5).double()
    scores[:G] = 1.0  # an all-right group
    return SimpleNamespace(mask=mask, old=old, logprobs=logprobs, ref=ref, scores=scores)


def overrides(cfg) -> dict:
    return dict(o.split("=", 1) for o in verl_interop.verl_overrides(cfg))


def verl_advantages(verl, ov: dict, b) -> torch.Tensor:
    """(B, T) verl's advantages: its estimator on the scores placed on each row's last valid token."""
    last = (b.mask.sum(-1) - 1).long()
    token_rewards = torch.zeros_like(b.mask, dtype=torch.float64)
    token_rewards[torch.arange(len(last)), last] = b.scores
    index = np.arange(len(last)) // G
    est = ov["algorithm.adv_estimator"]
    if est == "grpo":
        adv, _ = verl["compute_grpo_outcome_advantage"](
            token_rewards, b.mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=ov["algorithm.norm_adv_by_std_in_grpo"]
            == "True")
    elif est == "rloo":
        adv, _ = verl["compute_rloo_outcome_advantage"](token_rewards, b.mask, index)
    elif est == "reinforce_plus_plus":
        adv, _ = verl["compute_reinforce_plus_plus_outcome_advantage"](
            token_rewards, b.mask, config=SimpleNamespace(gamma=float(ov["algorithm.gamma"])))
    elif est == "reinforce_plus_plus_baseline":
        adv, _ = verl["compute_reinforce_plus_plus_baseline_outcome_advantage"](token_rewards, b.mask, index,
                                                                                epsilon=1e-6)
    else:
        raise AssertionError(f"no verl estimator wired for {est}")
    return adv


def verl_loss(verl, ov: dict, b, adv: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    a = "actor_rollout_ref.actor."
    low, high = float(ov[a + "clip_ratio_low"]), float(ov[a + "clip_ratio_high"])
    scale = int(ov[a + "loss_scale_factor"]) if a + "loss_scale_factor" in ov else None
    cfg = VerlConfig(clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
                     global_batch_info={"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None,
                                        "loss_scale_factor": scale})
    if a + "clip_ratio_c" in ov:
        cfg.clip_ratio_c = float(ov[a + "clip_ratio_c"])
    if a + "tau_pos" in ov:
        cfg.tau_pos, cfg.tau_neg = float(ov[a + "tau_pos"]), float(ov[a + "tau_neg"])
    agg = ov[a + "loss_agg_mode"]
    loss_fn = verl["compute_policy_loss_" + ov[a + "policy_loss.loss_mode"]]
    loss, _ = loss_fn(b.old, logprobs, adv, b.mask, loss_agg_mode=agg, config=cfg)
    if ov[a + "use_kl_loss"] == "True":  # verl/workers/utils/losses.py::ppo_loss
        kld = verl["kl_penalty"](logprobs, b.ref, ov[a + "kl_loss_type"])
        loss = loss + float(ov[a + "kl_loss_coef"]) * verl["agg_loss"](kld, b.mask, agg, **cfg.global_batch_info)
    return loss


def minirl_loss(cfg, b, logprobs: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The loss minirl's update (``rl_update.update_minibatch``) adds up for one minibatch: the policy objective, and
    beta times the KL term when the KL is in the loss."""
    B = len(b.scores)
    micro = rl_update.RLBatch(input_ids=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                              n_prompt_tokens=0, completion_mask=b.mask, loss_mask=b.mask, old_logprobs=b.old,
                              advantages=advantages, ref_logprobs=b.ref)
    denominator = rl_update.loss_denominator(b.mask, cfg)
    loss, _ = entropy_control.policy_objective(logprobs, None, b.old, micro, cfg, denominator=denominator,
                                               is_weights=None, state=None)
    if cfg.beta > 0 and cfg.kl_placement == "loss":
        loss = loss + cfg.beta * rl_update.kl_loss_term(logprobs, b.old, micro, cfg, denominator)
    return loss


def minirl_advantages_and_loss(cfg, b, logprobs: torch.Tensor, *, scale: float = 1.0):
    """minirl's advantages (stage 3) and its update's loss on them (times ``scale``, verl's whitening factor)."""
    adv, _, _ = rl.compute_advantages(b.scores, None, SimpleNamespace(completion_mask=b.mask), cfg, beta=cfg.beta)
    return adv, minirl_loss(cfg, b, logprobs, adv * scale)


@pytest.mark.parametrize("name", presets())
@pytest.mark.parametrize("seed", [0, 1])
def test_every_preset_computes_what_verl_computes_with_its_overrides(verl, name, seed):
    extra = {"overlong_cache_len": 2} if config.make_config(name).overlong_shaping else {}  # fits T = 6 tokens
    cfg = config.make_config(name, group_size=G, max_new_tokens=T, **extra)
    ov = overrides(cfg)
    whitened = cfg.advantage.startswith("reinforce_pp")
    # verl's group std has eps 1e-6 (minirl's adv_eps, 1e-4 by default); REINFORCE++ whitens over the batch's
    # tokens in verl (variance over B T - 1), over its sequences in minirl (std over B - 1): one length, adv_eps 0
    cfg = config.make_config(name, group_size=G, max_new_tokens=T, adv_eps=0.0 if whitened else 1e-6, **extra)
    b = batch(seed, lengths=None if whitened else batch.__defaults__[0])
    B = len(b.scores)
    scale = ((B * T - 1) / (T * (B - 1))) ** 0.5 if whitened else 1.0
    lp_m, lp_v = b.logprobs.clone().requires_grad_(), b.logprobs.clone().requires_grad_()
    adv_m, loss_m = minirl_advantages_and_loss(cfg, b, lp_m, scale=scale)
    adv_v = verl_advantages(verl, ov, b)
    adv_m_tokens = adv_m[:, None].expand_as(b.mask) * b.mask if adv_m.dim() == 1 else adv_m * b.mask
    torch.testing.assert_close(scale * adv_m_tokens.double(), (adv_v * b.mask).double(), atol=1e-6, rtol=1e-6)
    loss_v = verl_loss(verl, ov, b, adv_v, lp_v)
    assert float(loss_m) == pytest.approx(float(loss_v), abs=1e-7, rel=1e-6), (name, float(loss_m), float(loss_v))
    loss_m.backward(), loss_v.backward()
    torch.testing.assert_close(lp_m.grad, lp_v.grad, atol=1e-8, rtol=1e-6)
    assert lp_m.grad.abs().sum() > 0  # the batch gives every preset a gradient


def test_the_presets_checked_cover_every_loss_mode_and_estimator(verl):
    modes = {overrides(config.make_config(n))["actor_rollout_ref.actor.policy_loss.loss_mode"] for n in presets()}
    estimators = {overrides(config.make_config(n))["algorithm.adv_estimator"] for n in presets()} - {"gae"}
    assert modes == {"vanilla", "gspo", "sapo", "geo_mean", "cispo"}, modes
    assert estimators == {"grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}, estimators


@pytest.mark.parametrize("seed", [0, 1])
def test_the_ppo_preset_computes_what_verl_computes_with_its_overrides(verl, seed):
    """PPO: k1 in the reward (verl's ray_trainer.apply_kl_penalty: token rewards = scores on the last token minus
    kl_coef times kl_penalty(old, ref)), GAE with whitening (compute_gae_advantage_return), then the vanilla loss;
    the critic's values are a fixed random tensor (both sides read the same)."""
    cfg = config.make_config("ppo", max_new_tokens=T)
    ov = overrides(cfg)
    assert ov["algorithm.adv_estimator"] == "gae" and ov["algorithm.use_kl_in_reward"] == "True"
    b = batch(seed)
    values = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    # minirl: the library's stage 3 (rl.compute_advantages), with a critic that reads the fixed values
    B = len(b.scores)
    rollout = SimpleNamespace(completion_mask=b.mask, sampler_logprobs=None, n_prompt_tokens=1,
                              input_ids=torch.zeros(B, 1 + T, dtype=torch.long), attention_mask=torch.ones(B, 1 + T))

    def critic(input_ids, attention_mask):  # V after each position; token t's value is read at position t
        return torch.cat([values, torch.zeros(B, 1, dtype=values.dtype)], 1)

    kl_tokens = rl.reference_kl(rollout, b.old, b.ref, cfg)
    adv_m, ret_m, _ = rl.compute_advantages(b.scores, kl_tokens, rollout, cfg, beta=cfg.beta, critic=critic)
    # verl
    last = (b.mask.sum(-1) - 1).long()
    scores_tokens = torch.zeros_like(b.old)
    scores_tokens[torch.arange(len(last)), last] = b.scores
    kld = verl["kl_penalty"](b.old, b.ref, ov["algorithm.kl_penalty"]) * b.mask
    rewards_v = scores_tokens - float(ov["algorithm.kl_ctrl.kl_coef"]) * kld
    adv_v, ret_v = verl["compute_gae_advantage_return"](rewards_v, values, b.mask, float(ov["algorithm.gamma"]),
                                                         float(ov["algorithm.lam"]))
    torch.testing.assert_close(zero(adv_m, b.mask), zero(adv_v, b.mask), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(zero(ret_m, b.mask), zero(ret_v, b.mask), atol=1e-6, rtol=1e-5)  # float32 in minirl
    lp_m, lp_v = b.logprobs.clone().requires_grad_(), b.logprobs.clone().requires_grad_()
    loss_m = minirl_loss(cfg, b, lp_m, adv_m)
    loss_v = verl_loss(verl, ov, b, adv_v, lp_v)
    assert float(loss_m) == pytest.approx(float(loss_v), abs=1e-7, rel=1e-6)
    loss_m.backward(), loss_v.backward()
    torch.testing.assert_close(lp_m.grad, lp_v.grad, atol=1e-8, rtol=1e-6)


def zero(x, mask):
    return torch.where(mask > 0, x, torch.zeros_like(x)).double()
