"""minirl configs -> TRL 1.16's config objects: GRPOConfig (and GMPOConfig), RLOOConfig, DPO / KTO / CPO configs.

TRL is imported inside the functions only (``from trl import ...`` is the TRL package: imports are absolute), so
``import minirl.interop`` works without it. Every GRPOConfig field that changes what a preset computes is pinned
(``_TRL_FIXED``); the fields reviewed and left to TRL's defaults are listed, with the reason, beside their only
reader, tests/test_interop.py (``TRL_UNPINNED``), which fails when an installed TRL adds a field neither list holds.
"""

from __future__ import annotations

from ..config import RLConfig
from ..preference_loop import PrefConfig
from . import real_model
from ._common import _distillation, _episodes, _layout, _missing, _simulated_sampler

#: The TRL version the mapping and the equivalence tests were checked against (pyproject's [trl] extra bounds it).
TRL_VERSION = "1.16"
#: minirl aggregation -> TRL GRPOConfig.loss_type with the same normaliser (see the module notes for "dapo").
_TRL_LOSS_TYPE = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo",
                  "seq-mean-token-sum": "luspo"}
#: The RLConfig switches ``to_trl`` may be told to leave out (``without=``), because the caller knows TRL lacks them.
DROPPABLE = ("dynamic_sampling", "overlong_shaping")
_TRL_ADV_EPS = 1e-4  # TRL 1.16 divides by (std + 1e-4), a constant
#: The outcome estimators GRPOTrainer cannot compute, and why (its baseline is always the group mean).
_TRL_GRPO_LACKS = {"rloo": "GRPOTrainer's group mean includes the sample itself; TRL's RLOOTrainer has the "
                           "leave-one-out baseline (to_trl maps advantage='rloo' there, see rloo_trl_kwargs)",
                   "reinforce_pp": "GRPOTrainer always subtracts the group mean: no batch-mean baseline",
                   "maxrl": "GRPOTrainer's scale_rewards divides by a std ('group', 'batch') or by nothing, never "
                            "by the group's mean (MaxRL)",
                   "reinforce_pp_baseline": "GRPOTrainer's scale_rewards='batch' divides by the std of the raw "
                                            "rewards, not of the group-centred ones"}


#: GRPOConfig fields (TRL 1.16) that change what a preset computes, pinned to what minirl's loop does.
_TRL_FIXED = dict(
    # the loss
    top_entropy_quantile=1.0, entropy_coef=0.0, use_adaptive_entropy=False,  # every token, no entropy bonus
    off_policy_mask_threshold=None, fp16=False,  # no off-policy sequence mask; float32 (see bf16)
    vllm_importance_sampling_correction=False,  # TRL's default True acts with vLLM; True for is_correction
    multi_objective_aggregation="sum_then_normalize",  # weighted sum of the reward functions, then the group
    reward_weights=None,  # 1 per function; pass reward_weights=... to to_trl for other weights
    sync_ref_model=False,  # the reference is the starting policy, never updated
    use_liger_kernel=False, label_smoothing_factor=0.0, neftune_noise_alpha=None,  # the loss is the one above
    cast_lm_head_to_fp32=False,  # the head in the weights' dtype; log-probs in float32 from its logits (minirl)
    disable_dropout=True,  # minirl's loop never turns dropout on (models load in eval mode); TRL trains in train mode
    # sampling
    use_vllm=False, min_p=None, repetition_penalty=1.0, generation_kwargs=None, vllm_structured_outputs_regex=None,
    shuffle_dataset=True, train_sampling_strategy="random",  # batch layout and optimiser below
    generation_batch_size=None,  # derived: per_device_train_batch_size x steps_per_generation x processes
    remove_unused_columns=False,  # the dataset's columns reach the reward functions
    auto_find_batch_size=False, dataloader_drop_last=False, pad_to_multiple_of=None, data_seed=None,
    adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, lr_scheduler_kwargs=None, optim_args=None,  # torch AdamW
)

#: The pinned fields RLOOConfig (TRL 1.16) does not have: its loss has no entropy masks or bonus, no off-policy mask,
#: no vLLM correction switch, one reward aggregation, and no lm-head cast.
_GRPO_ONLY = ("cast_lm_head_to_fp32", "entropy_coef", "multi_objective_aggregation", "off_policy_mask_threshold",
              "top_entropy_quantile", "use_adaptive_entropy", "vllm_importance_sampling_correction")


def trl_kwargs(cfg: RLConfig, without: tuple[str, ...] | list[str] = (), *, num_processes: int = 1) -> dict:
    """The keyword arguments of ``trl.GRPOConfig`` (TRL 1.16) that run ``cfg``; TRL itself is not imported.

    Every GRPOConfig field that changes the loss, advantages, sampling or batch layout is stated, whatever TRL's
    default (``_TRL_FIXED``); every other field is in tests/test_interop.py's ``TRL_UNPINNED`` with the reason it
    does not matter.

    Switch by switch: group_size -> num_generations; eps_low / eps_high -> epsilon / epsilon_high; dual_clip c ->
    delta = c (TRL's two-sided clip caps the ratio at delta, which for c > 1 + eps_high is exactly dual-clip PPO);
    adv_scale -> scale_rewards; agg -> loss_type (``_TRL_LOSS_TYPE``); level "sequence" -> importance_sampling_level
    "sequence"; beta -> beta (k3 in the loss); kl_ratio_weighted -> use_bias_correction_kl (TRL's default True,
    minirl's False: GRPO's plain k3); off_policy_mask_threshold -> the same (DeepSeek-V3.2's sequence mask; TRL's
    mask reads the vLLM sampler's log-probs, else its pi_old); top_k / top_p -> the same (TRL's trainer scores
    the full vocabulary: keep_sampling_mask is refused); overlong_filter ->
    mask_truncated_completions; router_aux_loss_coef -> router_aux_loss_coef (the MoE load-balancing loss, 0 by
    default: TRL's own default None would take the model config's 0.001; TRL then asks the model for its router
    logits, whose ``aux_loss`` is ``moe.load_balancing_loss`` over the prompt and completion tokens, averaged
    over gradient accumulation, as minirl's ``rl.router_aux_term``). One rollout is
    ``prompts_per_step * group_size`` rows split into num_minibatches
    optimiser steps (steps_per_generation = num_minibatches x accumulation, per_device_train_batch_size = the
    micro-batch / num_processes: per_device_train_batch_size x num_processes x steps_per_generation is one rollout),
    repeated num_iterations times; max_steps counts optimiser steps. The lr is constant (TRL's default schedule
    decays linearly), the optimiser plain torch AdamW. The real-model settings (``interop.real_model``): precision ->
    bf16 and model_init_kwargs' dtype (TRL's default is bf16=True: "fp32" states False), gradient_checkpointing (TRL's
    default True: stated), multi_objective_aggregation (GDPO) as it is; LoRA is GRPOTrainer's peft_config
    (``real_model.trl_peft_config``); generation_batch_size and logprob_batch_size have no TRL setting
    (``real_model.NOT_MAPPED``: memory only).

    loss_mode "cispo" -> loss_type "cispo" with epsilon_high = 1 + eps_high (TRL's cap is absolute; one-sided form
    and token-mean only); "sapo" -> loss_type "sapo" with sapo_temperature_pos / _neg = tau_pos / tau_neg
    (seq-mean-token-mean only); "gmpo" -> the same arguments for ``trl.experimental.gmpo.GMPOConfig``, whose
    epsilon / epsilon_high are the log-space bounds eps_low / eps_high (``to_trl`` builds that class).

    The sampler correction (``minirl.importance``): is_correction token_tis / token_mis / seq_tis / seq_mis ->
    vllm_importance_sampling_correction=True, vllm_importance_sampling_mode token_truncate / token_mask /
    sequence_truncate / sequence_mask, clip_max = is_cap, clip_min = is_cap_low (the deprecated
    vllm_importance_sampling_cap is clip_max); "none" -> correction False. TRL computes the weights only with
    use_vllm=True (pass it to ``to_trl``), from its recomputed pi_old (pi_old="recomputed"). Refused: any correction
    with GMPO (``GMPOTrainer._compute_loss`` never applies the weights), a token-level one with GSPO-token (TRL's
    sequence level gives each token its row's mean weight).

    GSPO-token ("sequence-token") maps to TRL's "sequence" level: TRL 1.16 has no GSPO-token level (neither in
    GRPOConfig nor in trl.experimental), and with one advantage per sequence, which is all TRL computes, GSPO-token
    has GSPO's value and gradient (Zheng et al. 2025, eq. 13-14; tested). With another aggregation it raises.

    Args:
        cfg: an RLConfig (``make_config(algo, ...)``).
        without: switches of ``DROPPABLE`` to leave out knowingly: "dynamic_sampling" (TRL has none) and
            "overlong_shaping" (TRL puts it in the rewards: add ``trl_reward_funcs(cfg, reward_fn)``).
        num_processes: the launch's GPUs (``accelerate launch --num_processes``), as TRL's batch is per device: 64
            prompts x 16 in 2 minibatches on 8 GPUs -> 512 / 8 = 64 rows per device, 64 x 8 x 2 = 1024 = a rollout.

    Returns:
        dict of GRPOConfig keyword arguments.

    Raises:
        NotImplementedError: naming the first switch of ``cfg`` that TRL 1.16's GRPOTrainer lacks: advantage="gae"
            (a critic: TRL 1.16 has no PPO trainer, neither in trl nor in trl.experimental), KL in the reward, a
            KL estimator other than k3 in the loss, adaptive_kl, routing_replay, dynamic_sampling /
            overlong_shaping (unless in ``without``), adv_eps other than 1e-4, level="sequence-token" with an
            aggregation other than seq-mean-token-mean, GSPO with another aggregation, dual_clip <= 1 + eps_high,
            two-sided CISPO, CISPO other than token-mean, SAPO other than seq-mean-token-mean, advantage rloo /
            maxrl / reinforce_pp / reinforce_pp_baseline, DPPO's loss modes, sampler_kl_tau > 0, pi_old="naive",
            is_seq_form="geomean" with a sequence correction, is_correction with loss_mode="gmpo", token_tis /
            token_mis with level="sequence-token", cov_mode (Clip-Cov, KL-Cov: verl only). The entropy controls
            map to top_entropy_quantile, entropy_coef, use_adaptive_entropy (with entropy_target,
            entropy_coef_delta / _min / _max), TRL's own names; ref_reset_every to sync_ref_model (``_trl_ref_sync``).
        ValueError: for an invalid config (a token-level is_correction with level="sequence" or GMPO included),
            a name in ``without`` that is not droppable, a micro-batch that does not divide the minibatch, or
            num_processes that is not a positive int dividing the micro-batch.

    Source: TRL 1.16 ``trl/trainer/grpo_config.py`` and ``GRPOTrainer._compute_loss``.
    """
    cfg.validate()
    _distillation(cfg, "trl")
    _episodes(cfg, "trl")
    unknown = set(without) - set(DROPPABLE)
    if unknown:
        raise ValueError(f"without= may name only {DROPPABLE}, got {sorted(unknown)}")
    if cfg.advantage == "gae":
        raise _missing("advantage='gae'", "GRPOTrainer has no critic or GAE, and TRL 1.16 ships no PPO trainer",
                       "verl runs the critic: to_verl maps advantage='gae'")
    if cfg.advantage in _TRL_GRPO_LACKS:
        raise _missing(f"advantage={cfg.advantage!r}", _TRL_GRPO_LACKS[cfg.advantage])
    if cfg.beta > 0 and cfg.kl_placement == "reward":
        raise _missing("kl_placement='reward'", "GRPOTrainer puts the KL only in the loss")
    if cfg.beta > 0 and cfg.kl_estimator != "k3":
        raise _missing(f"kl_estimator={cfg.kl_estimator!r}", "GRPOTrainer's KL in the loss is k3 only")
    if cfg.adaptive_kl:
        raise _missing("adaptive_kl", "GRPOTrainer's beta is fixed")
    _simulated_sampler(cfg)
    if cfg.routing_replay:
        raise _missing("routing_replay", "GRPOTrainer does not record or replay MoE routing",
                       "GSPO (level='sequence') is the method that does without it")
    if cfg.dynamic_sampling and "dynamic_sampling" not in without:
        raise _missing("dynamic_sampling", "TRL 1.16 has no dynamic sampling (over-sampling groups with signal)",
                       "pass without=('dynamic_sampling',) to build the config without it")
    if cfg.overlong_shaping and "overlong_shaping" not in without:
        raise _missing("overlong_shaping", "in TRL the overlong penalty is a reward function, not a config switch",
                       "pass reward_funcs=trl_reward_funcs(cfg, reward_fn) and without=('overlong_shaping',)")
    if cfg.adv_eps != _TRL_ADV_EPS:
        raise _missing(f"adv_eps={cfg.adv_eps}", f"TRL 1.16 divides by (std + {_TRL_ADV_EPS}), a constant")
    if cfg.level != "token" and cfg.agg != "seq-mean-token-mean":
        raise _missing(f"level={cfg.level!r} with agg={cfg.agg!r}",
                       "TRL's sequence level is GSPO only with loss_type='grpo' (one term per sequence)")
    if cfg.dual_clip is not None and cfg.dual_clip <= 1 + cfg.eps_high:
        raise _missing(f"dual_clip={cfg.dual_clip}", "TRL's delta equals dual-clip only above 1 + eps_high")
    loss_type, epsilon_high, extra = _TRL_LOSS_TYPE[cfg.agg], cfg.eps_high, {}
    if cfg.loss_mode == "cispo":
        if cfg.cispo_form != "one-sided":
            raise _missing("cispo_form='two-sided'", "TRL 1.16's cispo caps the weight on one side only",
                           "use cispo_form='one-sided' (the paper's practice), or verl for the two-sided clip")
        if cfg.agg != "token-mean":
            raise _missing(f"loss_mode='cispo' with agg={cfg.agg!r}", "TRL 1.16's cispo aggregates token-mean")
        loss_type, epsilon_high = "cispo", 1 + cfg.eps_high  # TRL's cap is absolute: min(r, epsilon_high)
    elif cfg.loss_mode == "sapo":
        if cfg.agg != "seq-mean-token-mean":
            raise _missing(f"loss_mode='sapo' with agg={cfg.agg!r}", "TRL 1.16's sapo aggregates "
                           "seq-mean-token-mean")
        loss_type = "sapo"
        extra = dict(sapo_temperature_pos=cfg.tau_pos, sapo_temperature_neg=cfg.tau_neg)
    elif cfg.loss_mode == "gmpo":
        loss_type = "grpo"  # GMPOTrainer replaces the loss; epsilon / epsilon_high are its log-space bounds
    elif cfg.loss_mode != "clip":
        raise _missing(f"loss_mode={cfg.loss_mode!r}", "TRL 1.16 has no DPPO loss (a binary-TV / binary-KL trust "
                       "region on the sampled token)", "verl 0.9.1's policy_loss.loss_mode has it: to_verl maps it")
    if cfg.sampler_kl_tau > 0:
        raise _missing("sampler_kl_tau", "TRL 1.16's GRPOTrainer has no squared log-ratio to the sampler (Kimi "
                       "K2.5's term; prime-rl's kl_tau)")
    return dict(
        # the algorithm
        loss_type=loss_type, importance_sampling_level="token" if cfg.level == "token" else "sequence",
        epsilon=cfg.eps_low, epsilon_high=epsilon_high, delta=cfg.dual_clip, scale_rewards=cfg.adv_scale, **extra,
        beta=cfg.beta, use_bias_correction_kl=cfg.kl_ratio_weighted, mask_truncated_completions=cfg.overlong_filter,
        **_trl_common(cfg, num_processes), **{**_TRL_FIXED, **_trl_ref_sync(cfg), **_trl_importance(cfg),
                                              **real_model.trl_grpo_settings(cfg),
                                              "off_policy_mask_threshold": cfg.off_policy_mask_threshold,
                                              **_trl_entropy(cfg)})


def _trl_ref_sync(cfg: RLConfig) -> dict:
    """GRPOConfig's reference sync for ``ref_reset_every``: a hard copy every k optimiser steps of a rollout's last
    (TRL syncs on its own steps, minirl after every k-th rollout: k x num_iterations x num_minibatches of TRL's);
    {} without one (``_TRL_FIXED`` keeps the reference fixed)."""
    if not cfg.ref_reset_every:
        return {}
    return dict(sync_ref_model=True, ref_model_mixup_alpha=1.0,
                ref_model_sync_steps=cfg.ref_reset_every * cfg.num_iterations * cfg.num_minibatches)


def _trl_entropy(cfg: RLConfig) -> dict:
    """TRL 1.16's names for the entropy controls (``minirl.entropy_control``): the same mask, bonus and controller
    (tests/test_entropy_loop.py). Clip-Cov and KL-Cov are verl's loss modes only."""
    if cfg.cov_mode != "none":
        raise _missing(f"cov_mode={cfg.cov_mode!r}", "TRL 1.16 has no Clip-Cov or KL-Cov loss",
                       "verl's policy_loss.loss_mode does: to_verl maps it")
    out = dict(top_entropy_quantile=cfg.top_entropy_quantile, entropy_coef=cfg.entropy_coef,
               use_adaptive_entropy=cfg.adaptive_entropy)
    if cfg.adaptive_entropy:
        out.update(entropy_target=cfg.entropy_target, entropy_coef_delta=cfg.entropy_coef_delta,
                   entropy_coef_min=cfg.entropy_coef_min, entropy_coef_max=cfg.entropy_coef_max)
    return out


#: minirl RLConfig.is_correction -> TRL 1.16's vllm_importance_sampling_mode.
_TRL_IS_MODE = {"token_tis": "token_truncate", "token_mis": "token_mask", "seq_tis": "sequence_truncate",
                "seq_mis": "sequence_mask"}


def _trl_importance(cfg: RLConfig) -> dict:
    """GRPOConfig's vllm_importance_sampling_* for cfg's sampler correction; {} for none (_TRL_FIXED turns it off).
    TRL computes the weights only with use_vllm=True (without vLLM its sampler is its trainer: nothing to correct)."""
    if cfg.pi_old == "naive":
        raise _missing("pi_old='naive'", "GRPOTrainer never takes the sampler's log-probs as pi_old (it recomputes "
                       "them, or uses its own detached log-probs on-policy)")
    if cfg.is_correction == "none":
        return {}
    if cfg.loss_mode == "gmpo":  # GMPOTrainer._compute_loss replaces GRPOTrainer's, the one that applies the weights
        raise _missing(f"is_correction={cfg.is_correction!r} with loss_mode='gmpo'", "TRL 1.16's "
                       "GMPOTrainer._compute_loss never reads importance_sampling_ratio (GRPOTrainer._compute_loss "
                       "applies it): the run would train uncorrected", "use is_correction='none' with GMPO")
    if cfg.level == "sequence-token" and cfg.is_correction.startswith("token"):
        raise _missing(f"is_correction={cfg.is_correction!r} with level='sequence-token'", "TRL's sequence level, "
                       "where GSPO-token maps, multiplies its one term per sequence by the token weights, so a token's "
                       "gradient gets its row's mean weight, not its own", "seq_tis / seq_mis map (one weight a row)")
    if cfg.is_correction.startswith("seq") and cfg.is_seq_form != "product":
        raise _missing(f"is_seq_form={cfg.is_seq_form!r}", "TRL 1.16's sequence modes exponentiate the SUM of the "
                       "token log-ratios (a product of ratios; TRL issue #5814 asks for the geometric mean)")
    return dict(vllm_importance_sampling_correction=True,
                vllm_importance_sampling_mode=_TRL_IS_MODE[cfg.is_correction],
                vllm_importance_sampling_clip_max=cfg.is_cap, vllm_importance_sampling_clip_min=cfg.is_cap_low)


def _trl_common(cfg: RLConfig, num_processes: int = 1) -> dict:
    """Sampling, batch layout and optimiser arguments, the same in GRPOConfig and RLOOConfig."""
    lay = _layout(cfg, num_processes)
    return dict(
        # sampling
        num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        top_k=cfg.top_k, top_p=cfg.top_p,
        # batch layout: one rollout = steps_per_generation forwards of per_device_train_batch_size rows per device
        per_device_train_batch_size=lay["per_device"], gradient_accumulation_steps=lay["accumulation"],
        steps_per_generation=cfg.num_minibatches * lay["accumulation"], num_iterations=cfg.num_iterations,
        max_steps=cfg.steps * cfg.num_iterations * cfg.num_minibatches,
        # optimiser
        learning_rate=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        # the MoE load-balancing loss, stated even when off: TRL's None takes the model config's (0.001 here)
        router_aux_loss_coef=cfg.router_aux_loss_coef,
        lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", seed=cfg.seed,
        **real_model.trl_settings(cfg),  # precision (bf16, the dtype a named model loads in), checkpointing
    )


def rloo_trl_kwargs(cfg: RLConfig, *, num_processes: int = 1) -> dict:
    """The keyword arguments of ``trl.RLOOConfig`` (TRL 1.16) for an RLConfig with advantage="rloo".

    RLOOTrainer computes the same leave-one-out advantages (normalize_advantages=False) but clips one ratio per
    sequence, exp(sum_t log-ratio_t), and averages over sequences. minirl has no such ratio; the gradients agree
    on-policy, where every ratio is 1: -1/B sum_i A_i grad sum_t log pi_t, minirl's agg="seq-mean-token-sum" at
    level "token" (the values differ: TRL's -mean A_i, minirl's -1/B sum_i A_i T_i; tested). Only this maps.
    ``num_processes`` splits each forward over the launch's devices, as in ``trl_kwargs``.

    Raises:
        NotImplementedError: naming what RLOOTrainer lacks or does differently: num_iterations or num_minibatches
            > 1, level other than "token", agg other than "seq-mean-token-sum", beta > 0 (its KL is beta * sum_t k1
            in the reward), dual_clip, adaptive_kl, routing_replay, dynamic_sampling, overlong_shaping.
        ValueError: for an invalid config or advantage other than "rloo".

    Source: TRL 1.16 ``trl/trainer/rloo_config.py`` and ``RLOOTrainer._compute_loss``.
    """
    cfg.validate()
    if cfg.advantage != "rloo":
        raise ValueError(f"rloo_trl_kwargs maps advantage='rloo' only, got {cfg.advantage!r}")
    if cfg.num_iterations > 1 or cfg.num_minibatches > 1:
        raise _missing(f"num_iterations={cfg.num_iterations}, num_minibatches={cfg.num_minibatches}", "RLOOTrainer's "
                       "sequence ratio exp(sum of token log-ratios) equals minirl's loss only on-policy")
    if cfg.level != "token" or cfg.agg != "seq-mean-token-sum":
        raise _missing(f"level={cfg.level!r} with agg={cfg.agg!r}", "RLOOTrainer's loss is the mean over "
                       "sequences of A_i times the summed log-ratio: level='token', agg='seq-mean-token-sum'")
    if cfg.beta > 0:
        raise _missing(f"beta={cfg.beta}", "RLOOTrainer puts beta * sum_t k1 in the reward; minirl's rloo takes "
                       "the KL in the loss only")
    for switch in ("dual_clip", "adaptive_kl", "routing_replay", "dynamic_sampling", "overlong_shaping",
                   "keep_sampling_mask"):
        if getattr(cfg, switch):
            raise _missing(switch, "not an RLOOTrainer option")
    if cfg.off_policy_mask_threshold is not None or cfg.sampler_sync_every > 1:
        raise _missing("off_policy_mask_threshold / sampler_sync_every", "not RLOOTrainer options")
    return dict(epsilon=cfg.eps_low, epsilon_high=cfg.eps_high, beta=0.0, normalize_advantages=False,
                mask_truncated_completions=cfg.overlong_filter, **_trl_common(cfg, num_processes),
                **{k: v for k, v in _TRL_FIXED.items() if k not in _GRPO_ONLY})


def trl_reward_funcs(cfg: RLConfig, reward_fn) -> list:
    """The ``reward_funcs`` list for TRL's GRPOTrainer: ``reward_fn`` (one function or a list, TRL's form, as
    minirl's), plus TRL's soft overlong punishment when ``cfg.overlong_shaping`` (DAPO eq. 13; the same ramp as
    ``rewards.overlong_penalty``, with L_max = max_new_tokens and L_cache = overlong_cache_len).

    Raises:
        ImportError: when TRL is not installed and the overlong penalty is asked for.
    """
    fns = [reward_fn] if callable(reward_fn) else list(reward_fn)
    if cfg.overlong_shaping:
        from trl.rewards import get_soft_overlong_punishment

        fns.append(get_soft_overlong_punishment(cfg.max_new_tokens, cfg.overlong_cache_len))
    return fns


def pref_trl_kwargs(cfg: PrefConfig) -> tuple[str, dict]:
    """The TRL trainer and config keyword arguments for a PrefConfig; TRL itself is not imported.

    dpo -> DPOConfig(loss_type=["sigmoid"], beta); ipo -> DPOConfig(loss_type=["ipo"], beta=tau), which averages
    log-probs per token (so only ``reduction="mean"`` maps); kto -> KTOConfig(beta, desirable_weight=lambda_d,
    undesirable_weight=lambda_u); simpo -> CPOConfig (trl.experimental.cpo) with loss_type="simpo",
    simpo_gamma = gamma (CPO's loss is -log sigmoid(beta * (c - r - simpo_gamma / beta)), so simpo_gamma is the
    absolute margin, as minirl's gamma) and cpo_alpha = 0 (no NLL term: pure SimPO). TRL 1.16's DPO has no SimPO
    loss; CPO's is the one it supports.

    Returns:
        (trainer name: "DPOTrainer" | "KTOTrainer" | "CPOTrainer", config keyword arguments).

    Raises:
        NotImplementedError: naming the setting TRL 1.16 lacks: label_smoothing > 0 for DPO (cDPO: TRL 1.16's
            "sigmoid" ignores it), a reduction other than TRL's for the method (dpo / kto sum, ipo / simpo mean),
            a temperature other than 1.
        ValueError: for an invalid config.

    Source: TRL 1.16 ``DPOTrainer._compute_loss``, ``KTOTrainer._compute_loss``, ``CPOTrainer.cpo_loss``.
    """
    cfg.validate()
    opts = cfg.resolved()
    trl_reduction = {"dpo": "sum", "ipo": "mean", "kto": "sum", "simpo": "mean"}[cfg.method]
    if opts["reduction"] != trl_reduction:
        raise _missing(f"reduction={opts['reduction']!r}", f"TRL 1.16's {cfg.method} uses the per-token "
                       f"{trl_reduction} of the completion's log-probs")
    if cfg.temperature != 1.0:
        raise _missing(f"temperature={cfg.temperature}", "TRL's preference trainers score at temperature 1")
    common = dict(learning_rate=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
                  max_steps=cfg.steps, per_device_train_batch_size=cfg.batch_size, lr_scheduler_type="constant",
                  warmup_steps=0, optim="adamw_torch", seed=cfg.seed, bf16=False)
    if cfg.method == "dpo":
        if cfg.label_smoothing:
            raise _missing(f"label_smoothing={cfg.label_smoothing}", "TRL 1.16's DPO 'sigmoid' loss ignores label "
                           "smoothing (cDPO); its 'robust' loss is a different (unbiased) estimator")
        return "DPOTrainer", dict(loss_type=["sigmoid"], beta=opts["beta"], **common)
    if cfg.method == "ipo":
        return "DPOTrainer", dict(loss_type=["ipo"], beta=cfg.tau, **common)
    if cfg.method == "kto":
        return "KTOTrainer", dict(loss_type="kto", beta=opts["beta"], desirable_weight=cfg.lambda_d,
                                  undesirable_weight=cfg.lambda_u, **common)
    return "CPOTrainer", dict(loss_type="simpo", beta=opts["beta"], simpo_gamma=cfg.gamma,
                              cpo_alpha=0.0, **common)


def to_trl(cfg: RLConfig | PrefConfig, without: tuple[str, ...] | list[str] = (), *, num_processes: int = 1,
           **trl_args):
    """TRL's config object that runs ``cfg``: a ``trl.GRPOConfig`` for an RLConfig (grpo, dr_grpo, dapo, gspo,
    gspo_token, cispo, sapo and any config whose switches TRL supports; ``trl.experimental.gmpo.GMPOConfig`` for
    gmpo, run by its GMPOTrainer; a ``trl.RLOOConfig`` for advantage="rloo", ``rloo_trl_kwargs``), a
    ``trl.DPOConfig`` / ``trl.KTOConfig`` /
    ``trl.experimental.cpo.CPOConfig`` for a PrefConfig.

    Example: ``to_trl(make_config("grpo"), output_dir="runs/trl")`` -> GRPOConfig(loss_type="grpo", beta=0.04,
    epsilon=0.2, scale_rewards="group", use_bias_correction_kl=False, num_generations=8, ...).

    Args:
        cfg: an RLConfig or a PrefConfig.
        without: RLConfig switches to leave out knowingly (see ``trl_kwargs``); not for a PrefConfig.
        num_processes: the launch's processes (GPUs), which share each forward (see ``trl_kwargs``); RLConfig only.
        trl_args: further TRL arguments (output_dir, report_to, logging_steps, bf16, use_vllm, ...), which override
            the mapped ones.

    Returns:
        The TRL config object. Its trainer: GRPOTrainer / DPOTrainer / KTOTrainer / CPOTrainer
        (``pref_trl_kwargs`` names it for a PrefConfig).

    Raises:
        NotImplementedError: naming the switch TRL 1.16 lacks (see ``trl_kwargs`` and ``pref_trl_kwargs``).
        ImportError: when TRL is not installed (``pip install -e ".[trl]"``).
        TypeError: for a cfg of another type.
    """
    if isinstance(cfg, RLConfig) and cfg.advantage == "rloo":
        if without:
            raise ValueError("without= does not apply to RLOOConfig")
        from trl import RLOOConfig

        return RLOOConfig(**{**rloo_trl_kwargs(cfg, num_processes=num_processes), **trl_args})
    if isinstance(cfg, RLConfig):
        kwargs = trl_kwargs(cfg, without, num_processes=num_processes)  # refuses before TRL is imported
        if cfg.loss_mode == "gmpo":
            from trl.experimental.gmpo import GMPOConfig as Config  # trainer: trl.experimental.gmpo.GMPOTrainer
        else:
            from trl import GRPOConfig as Config

        return Config(**{**kwargs, **trl_args})
    if isinstance(cfg, PrefConfig):
        if without or num_processes != 1:
            raise ValueError("without= and num_processes= apply to an RLConfig only")
        trainer, kwargs = pref_trl_kwargs(cfg)
        if trainer == "CPOTrainer":
            from trl.experimental.cpo import CPOConfig as Config
        elif trainer == "KTOTrainer":
            from trl import KTOConfig as Config
        else:
            from trl import DPOConfig as Config
        return Config(**{**kwargs, **trl_args})
    raise TypeError(f"to_trl takes an RLConfig or a PrefConfig, got {type(cfg).__name__}")


# ---------------------------------------------------------------------------------------------- the map to TRL 1.16
#: Each objective of ``minirl.distill`` in TRL 1.16: the trainer and settings that compute the same loss. Read by
#: ``distill_trl_kwargs``; ``tests/test_distill.py`` checks the loss equalities on shared inputs.
DISTILL_TRL = {
    "full_reverse_kl": ("trl.DistillationTrainer", {"beta": 1.0, "temperature": 1.0}),
    "generalized_jsd": ("trl.DistillationTrainer", {"beta": None, "temperature": 1.0}),  # beta: the caller's
    "reverse_kl_reward": ("trl.experimental.iw_opd.IWOPDTrainer",
                          {"distillation_objective": "iw_opd", "iw_opd_gamma": 0.0, "lmbda": 1.0, "temperature": 1.0}),
    "sft_nll": ("trl.SFTTrainer", {"completion_only_loss": True}),  # on a dataset of the teacher's completions
}
#: What TRL 1.16 cannot compute, and why.
DISTILL_TRL_REFUSED = {
    "reward_to_go": "no TRL 1.16 distillation trainer adds a token's future teacher rewards to its own (gamma > 0): "
                    "IW-OPD, like Tinker, grades each token by its own reward (gamma = 0); IWOPDConfig.iw_opd_gamma is "
                    "a weight on the token's position, not a discount",
    "mixed_reward": "no TRL 1.16 trainer takes a teacher and a task reward together: DistillationTrainer, GKDTrainer "
                    "and IWOPDTrainer take no reward function, and GRPOTrainer's KL (beta) is to a reference it builds "
                    "from the student's own weights, as k3 in the loss (the forward KL's gradient), not to a teacher",
}


def distill_trl_kwargs(objective: str, *, beta: float | None = None, gamma: float = 0.0) -> tuple[str, dict]:
    """The TRL 1.16 trainer and settings that compute the loss of ``objective`` (a function of ``minirl.distill``), or
    NotImplementedError with the reason.

    - ``full_reverse_kl`` / ``generalized_jsd``: ``DistillationTrainer`` with ``beta`` (1.0 for the reverse KL) and
      the temperature it samples at; its loss is the token-mean of the per-position divergence
      (``losses.aggregate(..., "token-mean")``). ``GKDTrainer`` (experimental) computes the same loss with
      ``lmbda=1.0`` (always on-policy), but at temperature 1.0 whatever ``GKDConfig.temperature`` samples at.
    - ``reverse_kl_reward`` with gamma = 0 (``rewards_to_go``'s discount; each token its own reward): ``IWOPDTrainer``
      (experimental) with ``iw_opd_gamma=0.0``: its loss is the token-mean of -sg[log q - log p] log p, the REINFORCE
      loss of this reward. Refused for gamma > 0.
    - ``sft_nll``: ``SFTTrainer`` on the teacher's completions, sampled beforehand. ``GKDTrainer(seq_kd=True,
      lmbda=0.0, beta=0.0)`` is its full-vocabulary relative: the forward KL on teacher samples, the same expected
      gradient, a different loss value (it lacks the teacher's entropy) and less variance.

    Example: ``distill_trl_kwargs("generalized_jsd", beta=0.5)`` -> ("trl.DistillationTrainer", {"beta": 0.5,
    "temperature": 1.0}).

    Raises:
        NotImplementedError: for ``mixed_reward``, and ``reverse_kl_reward`` with gamma > 0, with the reason.
        ValueError: for an unknown objective, or ``generalized_jsd`` without beta in [0, 1].
    """
    if objective == "mixed_reward":
        raise NotImplementedError(f"mixed_reward: {DISTILL_TRL_REFUSED['mixed_reward']}")
    if objective == "reverse_kl_reward" and gamma > 0:
        raise NotImplementedError(f"reverse_kl_reward with gamma={gamma}: {DISTILL_TRL_REFUSED['reward_to_go']}")
    if objective not in DISTILL_TRL:
        raise ValueError(f"unknown objective {objective!r}; expected one of {sorted(DISTILL_TRL) + ['mixed_reward']}")
    trainer, settings = DISTILL_TRL[objective]
    if objective == "generalized_jsd":
        if beta is None or not 0.0 <= beta <= 1.0:
            raise ValueError(f"generalized_jsd needs beta in [0, 1], got {beta}")
        settings = {**settings, "beta": beta}
    return trainer, dict(settings)
