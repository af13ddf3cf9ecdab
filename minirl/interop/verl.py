"""minirl configs -> verl 0.9.1's command-line overrides (Hydra ``key=value``), for ``python -m verl.trainer.main_ppo``.

verl is not installed: ``to_verl`` only writes text, option names checked against ``verl/trainer/config/*.yaml``
of the 0.9.1 release on PyPI (tests/test_interop.py holds the names, copied from that release).
"""

from __future__ import annotations

from ..config import RLConfig
from . import real_model
from ._common import _distillation, _episodes, _layout, _missing, _simulated_sampler

#: The verl tag whose option names ``to_verl`` writes.
VERL_VERSION = "0.9.1"
#: minirl RLConfig.advantage -> verl's algorithm.adv_estimator.
_VERL_ESTIMATOR = {"gae": "gae", "group": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus",
                   "reinforce_pp_baseline": "reinforce_plus_plus_baseline"}


def verl_overrides(cfg: RLConfig, *, num_processes: int = 1) -> list[str]:
    """verl 0.9.1 command-line overrides (Hydra ``key=value``) for an RLConfig, one string each.

    Entry point: ``python -m verl.trainer.main_ppo`` for every preset (in 0.9 dynamic sampling is the main
    trainer's ``algorithm.filter_groups`` and the overlong buffer the DAPO reward manager's ``reward.reward_kwargs``,
    keys that the default config lacks, hence Hydra's ``+``). Batch sizes are in prompts, as verl counts them
    (``ppo_mini_batch_size`` x ``rollout.n`` rows per optimiser step); ``num_processes`` GPUs of one node share
    each micro-batch, as in ``trl_kwargs``: ``ppo_micro_batch_size_per_gpu`` = micro-batch / num_processes rows.

    Differences verl's options cannot express, left as they are (say so when comparing runs): the group std is
    divided with eps 1e-6 (minirl 1e-4); verl's k3 ("low_var_kl") output is clamped to [-10, 10]; its GSPO
    log-ratio is clamped above at 10 (minirl continues exp linearly above 20 nats,
    no clamp); verl's "gspo" loss is the GSPO-token form (s_i,t), equal to
    GSPO for per-sequence advantages; vanilla PPO always applies dual-clip, so "no dual clip" is written as
    clip_ratio_c=1e9. loss_mode cispo -> "cispo" (one-sided: clip_ratio_low=1.0), sapo -> "sapo" with
    actor.tau_pos / tau_neg, gmpo -> "geo_mean" (clip_ratio_low / high are then its log-space bounds; the loss
    averages over all rows); dppo_tv / dppo_kl -> the same loss modes (verl 0.9.1 only), clip_ratio_low / high
    their deltas and clip_ratio_c the ratio's cap, written always (the actor's default 3.0, not the loss's 20). These
    names are the same in verl 0.7.0 and 0.9.1 but for DPPO. The sampler correction
    (``algorithm.rollout_correction``, verl 0.9.1 only): pi_old="naive" -> bypass_mode=True (old_log_probs = the
    rollout's, verl's own PPO clip); token_tis / seq_tis -> rollout_is=token / sequence with rollout_is_threshold
    = is_cap (truncation from above); token_mis / seq_mis -> the same with "is_cap_low_is_cap" (IcePop: weights
    outside the bounds zeroed); the sequence weight is exp of the summed log-ratios (clamped at +-20 nats).
    advantage rloo is the same estimator; reinforce_plus_plus(_baseline) whiten over the batch's TOKENS
    (weighted by length, / sqrt(var + 1e-8), the variance over the B T tokens with Bessel's B T - 1), minirl over
    its B sequences (/ (std + adv_eps), std with B - 1): for one length T, verl's advantages are minirl's (adv_eps
    0) times sqrt((B T - 1) / (T (B - 1))), 1.027 at B = 16, T = 6 (tests/test_verl_presets.py).

    Raises:
        NotImplementedError: for switches not mapped: routing_replay (verl's router_replay R2/R3 records in other
            places), router_aux_loss_coef > 0, overlong_filter, adv_scale="batch", adaptive_kl with the KL in
            the loss, GSPO or SAPO with another aggregation, pi_old="naive" with a loss other than token PPO clip,
            is_seq_form="geomean", is_cap_low with TIS, MIS without is_cap_low, GDPO's normalize_then_sum, advantage
            "maxrl", sampler_kl_tau > 0 (Kimi's term), ref_reset_every > 0
            (``real_model.verl_settings``, which maps precision, checkpointing, batch sizes, LoRA and TensorBoard).
        ValueError: for an invalid config (a token-level is_correction with level="sequence" or GMPO included).

    Source: verl 0.9.1 ``verl/trainer/config/_generated_ppo_trainer.yaml``, ``algorithm.py`` (FilterGroupsConfig),
    ``verl/experimental/reward_loop/reward_manager/dapo.py``, ``verl/trainer/ppo/core_algos.py``,
    ``verl/trainer/config/algorithm/rollout_correction.yaml``, ``verl/trainer/ppo/rollout_corr_helper.py``.
    """
    cfg.validate()
    _distillation(cfg, "verl")
    _episodes(cfg, "verl")
    _simulated_sampler(cfg)
    if cfg.off_policy_mask_threshold is not None:  # verl's rejection masks both signs, on pi_old / mu, not pi / mu
        raise _missing("off_policy_mask_threshold", "verl 0.9.1's nearest, algorithm.rollout_correction.rollout_rs="
                       "seq_mean_k1, masks sequences of either advantage sign by mean log(pi_old / mu)")
    if cfg.kl_ratio_weighted:
        raise _missing("kl_ratio_weighted", "verl 0.9.1's kl loss (use_kl_loss) is not weighted by pi / pi_old")
    if cfg.routing_replay:
        raise _missing("routing_replay", f"verl 0.9.1 names it actor_rollout_ref.actor.megatron.router_replay.mode="
                       f"{'R3' if cfg.replay_source == 'sampler' else 'R2'} (Megatron and VeOmni engines only), "
                       "not verified here against minirl's")
    if cfg.router_aux_loss_coef > 0:
        raise _missing("router_aux_loss_coef", "verl's MoE auxiliary loss is configured per model backend, not "
                       "verified against minirl's moe.load_balancing_loss")
    if cfg.overlong_filter:
        raise _missing("overlong_filter", "verl 0.9 has no option that masks truncated completions in the loss")
    if cfg.advantage not in _VERL_ESTIMATOR:
        raise _missing(f"advantage={cfg.advantage!r}", "verl 0.9.1 has no MaxRL estimator ((r - mean) / mean); "
                       "prime-rl and SkyRL have one")
    if cfg.sampler_kl_tau > 0:
        raise _missing("sampler_kl_tau", "verl 0.9.1's policy losses have no squared log-ratio to the rollout's "
                       "log-probs (Kimi K2.5's term; prime-rl's kl_tau)")
    if cfg.ref_reset_every:
        raise _missing("ref_reset_every", "verl 0.9.1 keeps the reference fixed (no option copies the actor into it)")
    if cfg.advantage == "group" and cfg.adv_scale == "batch":
        raise _missing("adv_scale='batch'", "verl's GRPO divides by the group std or by nothing")
    if cfg.level == "sequence" and cfg.agg != "seq-mean-token-mean":
        raise _missing(f"level='sequence' with agg={cfg.agg!r}", "verl's gspo aggregates seq-mean-token-mean")
    if cfg.loss_mode == "sapo" and cfg.agg != "seq-mean-token-mean":
        raise _missing(f"loss_mode='sapo' with agg={cfg.agg!r}", "verl's sapo always aggregates seq-mean-token-mean")
    loss_mode = {"cispo": "cispo", "sapo": "sapo", "gmpo": "geo_mean", "dppo_tv": "dppo_tv", "dppo_kl": "dppo_kl",
                 "clip": "vanilla" if cfg.level == "token" else "gspo"}[cfg.loss_mode]
    loss_mode = cfg.cov_mode if cfg.cov_mode != "none" else loss_mode  # Clip-Cov / KL-Cov replace the token clip
    # verl's cispo is two-sided clip(r, 1 - low, 1 + high): the one-sided cap min(r, 1 + high) is low = 1 (r >= 0)
    clip_low = 1.0 if cfg.loss_mode == "cispo" and cfg.cispo_form == "one-sided" else cfg.eps_low
    lay = _layout(cfg, num_processes)  # verl's micro-batch is per GPU, like TRL's per-device batch
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    out = [f"algorithm.adv_estimator={_VERL_ESTIMATOR[cfg.advantage]}"]
    if cfg.advantage == "group":
        out.append(f"algorithm.norm_adv_by_std_in_grpo={cfg.adv_scale == 'group'}")
    elif cfg.advantage == "reinforce_pp":
        out.append("algorithm.gamma=1.0")  # verl's REINFORCE++ sums rewards to go with gamma: 1 is the outcome
    elif cfg.advantage == "gae":
        out += [f"algorithm.gamma={cfg.gamma}", f"algorithm.lam={cfg.lam}", f"critic.optim.lr={cfg.value_lr}",
                f"critic.cliprange_value={cfg.value_clip if cfg.value_clip is not None else 1e9}"]
    out += [f"data.train_batch_size={cfg.prompts_per_step}", f"{r}.n={cfg.group_size}",
            f"data.max_response_length={cfg.max_new_tokens}", f"{r}.temperature={cfg.temperature}",
            f"{r}.top_k={cfg.top_k or -1}", f"{r}.top_p={cfg.top_p}",
            f"{a}.ppo_mini_batch_size={cfg.prompts_per_step // cfg.num_minibatches}",
            f"{a}.ppo_micro_batch_size_per_gpu={lay['per_device']}", f"trainer.n_gpus_per_node={num_processes}",
            f"{a}.ppo_epochs={cfg.num_iterations}",
            f"{a}.optim.lr={cfg.lr}", f"{a}.optim.weight_decay={cfg.weight_decay}",
            f"{a}.optim.clip_grad={cfg.max_grad_norm}",
            f"{a}.policy_loss.loss_mode={loss_mode}",
            f"{a}.clip_ratio_low={clip_low}", f"{a}.clip_ratio_high={cfg.eps_high}"]
    if cfg.loss_mode == "clip" and cfg.cov_mode == "none":  # verl's vanilla loss reads clip_ratio_c as dual-clip
        out.append(f"{a}.clip_ratio_c={cfg.dual_clip if cfg.dual_clip is not None else 1e9}")
    elif cfg.loss_mode.startswith("dppo"):  # DPPO reads it as the cap of the detached ratio (verl's default 3.0)
        out.append(f"{a}.clip_ratio_c={cfg.dppo_cap}")
    if cfg.loss_mode == "sapo":
        out += [f"{a}.tau_pos={cfg.tau_pos}", f"{a}.tau_neg={cfg.tau_neg}"]
    out.append(f"{a}.loss_agg_mode={cfg.agg}")
    if cfg.agg == "seq-mean-token-sum-norm":
        out.append(f"{a}.loss_scale_factor={cfg.max_new_tokens}")
    verl_kl = {"k1": "k1", "k2": "k2", "k3": "low_var_kl"}[cfg.kl_estimator]
    if cfg.beta > 0 and cfg.kl_placement == "loss":
        if cfg.adaptive_kl:
            raise _missing("adaptive_kl with kl_placement='loss'", "verl's adaptive controller drives the KL "
                           "in the reward only")
        out += [f"{a}.use_kl_loss=True", f"{a}.kl_loss_coef={cfg.beta}", f"{a}.kl_loss_type={verl_kl}",
                "algorithm.use_kl_in_reward=False"]
    elif cfg.beta > 0:
        out += [f"{a}.use_kl_loss=False", "algorithm.use_kl_in_reward=True", f"algorithm.kl_penalty={verl_kl}",
                f"algorithm.kl_ctrl.kl_coef={cfg.beta}",
                f"algorithm.kl_ctrl.type={'adaptive' if cfg.adaptive_kl else 'fixed'}"]
        if cfg.adaptive_kl:
            out += [f"algorithm.kl_ctrl.target_kl={cfg.target_kl}", f"algorithm.kl_ctrl.horizon={cfg.kl_horizon}"]
    else:
        out += [f"{a}.use_kl_loss=False", "algorithm.use_kl_in_reward=False"]
    out += _verl_importance(cfg) + real_model.verl_settings(cfg)  # precision, checkpointing, batch sizes, LoRA
    out += _verl_entropy(cfg)
    if cfg.dynamic_sampling:
        out += ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
                f"algorithm.filter_groups.max_num_gen_batches={cfg.max_gen_batches}",
                f"data.gen_batch_size={cfg.gen_prompts_per_round or cfg.prompts_per_step}"]
    if cfg.overlong_shaping:
        buffer = "+reward.reward_kwargs.overlong_buffer_cfg"
        out += ["reward.reward_manager.name=dapo", f"{buffer}.enable=True", f"{buffer}.len={cfg.overlong_cache_len}",
                f"{buffer}.penalty_factor=1.0", f"+reward.reward_kwargs.max_resp_len={cfg.max_new_tokens}"]
    return out


def _verl_entropy(cfg: RLConfig) -> list[str]:
    """verl 0.9.1's names for the entropy controls: actor.entropy_coeff (aggregated like the loss, so equal to
    minirl's token-mean bonus only under token-mean), policy_loss.loss_mode clip_cov / kl_cov with their settings."""
    a = "actor_rollout_ref.actor"
    if cfg.adaptive_entropy or cfg.top_entropy_quantile < 1:
        raise _missing("adaptive_entropy" if cfg.adaptive_entropy else "top_entropy_quantile < 1",
                       "verl 0.9.1 has no adaptive entropy coefficient or top-entropy token mask", "TRL 1.16 has both")
    if cfg.entropy_coef > 0 and cfg.agg != "token-mean":
        raise _missing(f"entropy_coef with agg={cfg.agg!r}", "verl aggregates the entropy like the loss; minirl's "
                       "bonus (TRL's) is a token mean whatever the loss's aggregation")
    out = [f"{a}.entropy_coeff={cfg.entropy_coef}"] if cfg.entropy_coef > 0 else []
    if cfg.cov_mode == "clip_cov":
        out += [f"{a}.policy_loss.clip_cov_ratio={cfg.cov_fraction}", f"{a}.policy_loss.clip_cov_lb={cfg.clip_cov_low}",
                f"{a}.policy_loss.clip_cov_ub={cfg.clip_cov_high}"]
    elif cfg.cov_mode == "kl_cov":
        out += [f"{a}.policy_loss.kl_cov_ratio={cfg.cov_fraction}", f"{a}.policy_loss.ppo_kl_coef={cfg.kl_cov_coef}"]
    return out


def _verl_importance(cfg: RLConfig) -> list[str]:
    """verl 0.9.1's algorithm.rollout_correction overrides for cfg's pi_old and sampler correction ([] for none)."""
    c = "algorithm.rollout_correction"
    if cfg.pi_old == "naive":  # bypass mode: old_log_probs = the rollout's, and verl's own PPO-clip loss
        if cfg.loss_mode != "clip" or cfg.level != "token":
            raise _missing(f"pi_old='naive' with loss_mode={cfg.loss_mode!r}, level={cfg.level!r}", "verl's "
                           "bypass_mode replaces the policy loss by its own token-level PPO clip")
        return [f"{c}.bypass_mode=True", f"{c}.loss_type=ppo_clip"]
    if cfg.is_correction == "none":
        return []
    if cfg.is_correction.startswith("seq") and cfg.is_seq_form != "product":
        raise _missing(f"is_seq_form={cfg.is_seq_form!r}", "verl's rollout_is=sequence weight is exp of the SUM of "
                       "the token log-ratios (its seq_mean_k1 rejection masks on the geometric mean, without weights)")
    if cfg.is_correction.endswith("tis") and cfg.is_cap_low is not None:
        raise _missing(f"is_cap_low={cfg.is_cap_low} with {cfg.is_correction}", "verl truncates from above only")
    if cfg.is_correction.endswith("mis") and cfg.is_cap_low is None:
        raise _missing(f"{cfg.is_correction} without is_cap_low", "verl's masked weights (a 'lower_upper' "
                       "threshold, IcePop) need both bounds")
    threshold = cfg.is_cap if cfg.is_correction.endswith("tis") else f"{cfg.is_cap_low}_{cfg.is_cap}"
    level = "token" if cfg.is_correction.startswith("token") else "sequence"
    return [f"{c}.rollout_is={level}", f"{c}.rollout_is_threshold={threshold}", f"{c}.bypass_mode=False"]


def to_verl(cfg: RLConfig) -> str:
    """verl 0.9.1 command-line overrides for ``cfg`` as one line of text (``verl_overrides`` joined by spaces),
    to append to ``python -m verl.trainer.main_ppo``.

    Raises:
        NotImplementedError, ValueError: as ``verl_overrides``.
    """
    return " ".join(verl_overrides(cfg))


# ---------------------------------------------------------------------------------------------- distillation in verl
#: Each distillation objective of minirl (``distill.py``, ``RLConfig.distill``) in verl 0.9.1: the ``distillation.*``
#: overrides of ``python -m verl.trainer.main_ppo`` (verl/trainer/config/distillation/distillation.yaml) that compute
#: it, plus the teacher's path (``distillation.teacher_models.teacher_model.model_path=...``). verl's
#: ``use_policy_gradient=True`` feeds -k1 of each token as that token's advantage, gamma = 0 (as Tinker; verl's
#: distillation/losses.py cites Thinking Machines' post); with ``use_task_rewards=True`` the task's policy loss
#: (GRPO's advantage) is added, the distillation term weighted by ``distillation_loss_coef``: the loop's mix.
DISTILL_VERL = {
    "reverse_kl_reward": {"enabled": True, "distillation_loss.loss_mode": "k1",
                          "distillation_loss.use_policy_gradient": True,
                          "distillation_loss.policy_loss_mode": "vanilla",
                          "distillation_loss.use_task_rewards": False},
    "mix": {"enabled": True, "distillation_loss.loss_mode": "k1", "distillation_loss.use_policy_gradient": True,
            "distillation_loss.policy_loss_mode": "vanilla", "distillation_loss.use_task_rewards": True,
            "distillation_loss.distillation_loss_coef": None},  # None: the caller's kl_coef
}
#: What verl 0.9.1 cannot compute, and why; ``sft_nll`` is a separate trainer.
DISTILL_VERL_REFUSED = {
    "reward_to_go": "verl 0.9.1 gives each token its own -k1 as the advantage (gamma = 0); no option sums a token's "
                    "future teacher rewards into it",
    "full_reverse_kl": "verl 0.9.1's only loss over the distribution is forward_kl_topk, the FORWARD KL(q || p) over "
                       "the teacher's top-k tokens; it has no reverse KL over the vocabulary",
    "generalized_jsd": "verl 0.9.1 has no JSD; its forward_kl_topk is the forward KL (GKD's beta = 0) restricted to "
                       "the teacher's top-k tokens, not the same loss",
    "sft_nll": "SFT on the teacher's samples is verl's separate SFT trainer (python -m verl.trainer.sft_trainer) on a "
               "dataset of the teacher's completions, not an option of main_ppo",
}


def distill_verl_overrides(objective: str, *, gamma: float = 0.0, kl_coef: float = 1.0) -> list[str]:
    """verl 0.9.1 overrides (Hydra ``key=value``, under ``distillation.``) for a distillation objective of minirl.

    - ``reverse_kl_reward`` (the loop's ``distill="reverse_kl"``) with gamma = 0: -k1 per token as the advantage.
    - ``mix`` (the loop's ``task_coef > 0``, gamma = 0): the task's policy loss + ``kl_coef`` x the same term. minirl
      weighs the task advantage by ``task_coef`` instead; with task_coef = 1 the two are the same objective.

    Example: ``distill_verl_overrides("reverse_kl_reward")`` -> ["distillation.enabled=True",
    "distillation.distillation_loss.loss_mode=k1", ...].

    Raises:
        NotImplementedError: for gamma > 0, ``full_reverse_kl``, ``generalized_jsd`` and ``sft_nll``, with the reason.
        ValueError: for an unknown objective or kl_coef < 0.
    """
    if objective in DISTILL_VERL_REFUSED:
        raise NotImplementedError(f"{objective}: {DISTILL_VERL_REFUSED[objective]}")
    if objective not in DISTILL_VERL:
        raise ValueError(f"unknown objective {objective!r}; expected one of {sorted(DISTILL_VERL)} "
                         f"(refused: {sorted(DISTILL_VERL_REFUSED)})")
    if gamma > 0:
        raise NotImplementedError(f"{objective} with gamma={gamma}: {DISTILL_VERL_REFUSED['reward_to_go']}")
    if kl_coef < 0:
        raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
    settings = {k: (kl_coef if v is None else v) for k, v in DISTILL_VERL[objective].items()}
    return [f"distillation.{k}={v}" for k, v in settings.items()]
