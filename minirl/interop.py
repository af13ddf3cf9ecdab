"""The bridge to the engines: a minirl config -> TRL's config object, or verl's command-line overrides.

A reader who has understood an algorithm here and wants to train a real model on several GPUs moves to TRL
(accelerate / DeepSpeed / FSDP, vLLM generation) or verl (Ray, FSDP / Megatron). ``to_trl`` and ``to_verl`` say,
switch by switch, what the same run is in those engines; a switch the engine lacks raises ``NotImplementedError``
naming it, never a silent approximation. ``tests/test_interop.py`` feeds the same inputs to TRL's own loss code and
to minirl's and checks that the losses and gradients agree to 1e-6; notebook 07 trains with both.

Versions: TRL 1.16 (the optional extra ``pip install -e ".[trl]"``; TRL is imported inside the functions, so
``import minirl`` works without it); verl 0.9.1 (option names checked against ``verl/trainer/config/*.yaml`` of the
0.9.1 release on PyPI, whose main trainer holds DAPO's ``algorithm.filter_groups`` and the DAPO reward manager;
verl is not installed, ``to_verl`` only writes text).

Convention differences that remain where both engines run the same switches (each has a test):

- Rows with no valid token (all masked, e.g. by overlong filtering): TRL's "grpo" and "dr_grpo" losses divide by
  all B rows, minirl by the rows that have a token (the loss is scaled by B_valid / B in TRL).
- Log-ratios: above 20 nats minirl continues exp by its tangent (losses and k3, ``checks.exp_linear_above``), so
  a ratio stays finite and its gradient keeps its sign; TRL 1.16 takes exp as it is (inf past ~88 nats in float32).
- TRL's "dapo" loss divides every optimiser step by the generation batch's tokens / steps_per_generation (the mean
  token count per step); minirl's token-mean divides by the minibatch's own tokens. Equal with one optimiser step
  per rollout (``num_minibatches=1``), whatever ``num_iterations``.
- TRL 1.16's DPO "sigmoid" loss ignores ``label_smoothing`` (cDPO); ``to_trl`` raises for it.
- CISPO: TRL's ``epsilon_high`` is the absolute cap of the weight (its "cispo" is one-sided, min(r, epsilon_high)),
  so minirl's cap 1 + eps_high is written epsilon_high = 1 + eps_high; TRL has no two-sided CISPO (it raises).
  verl's "cispo" is two-sided; the one-sided form is written there as clip_ratio_low=1.0 (a lower bound of 0).
- GMPO: TRL 1.16's ``trl.experimental.gmpo.GMPOTrainer`` and verl's "geo_mean" average over all B rows; minirl
  leaves rows with no valid token out (TRL and verl still count such a row, with weight 1 and its advantage).
- Sampler corrections: a NaN sampler log-prob gets weight 1 in TRL 1.16 (``nan_to_num``), and a ValueError in
  minirl (``importance``); both weight only the policy-gradient term, not the KL; TRL's and verl's sequence
  weights are products of token ratios (minirl's ``is_seq_form="geomean"`` raises for both).
- TRL 1.16 multiplies the KL term by the importance ratio by default (``use_bias_correction_kl=True``), which
  changes the gradient even on-policy; ``to_trl`` sets it False, which is GRPO's (and minirl's) loss.
"""

from __future__ import annotations

from .config import ALGORITHMS, RLConfig, make_config
from .preference_loop import PrefConfig

#: The TRL version the mapping and the equivalence tests were checked against (pyproject's [trl] extra bounds it).
TRL_VERSION = "1.16"
#: The verl tag whose option names ``to_verl`` writes.
VERL_VERSION = "0.9.1"

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
                   "reinforce_pp_baseline": "GRPOTrainer's scale_rewards='batch' divides by the std of the raw "
                                            "rewards, not of the group-centred ones"}


def _missing(switch: str, why: str, hint: str = "") -> NotImplementedError:
    return NotImplementedError(f"{switch}: {why}" + (f"; {hint}" if hint else ""))


def _simulated_sampler(cfg: RLConfig) -> None:
    """minirl's sampler dials simulate an inference engine; an engine's sampler is a real one (vLLM, SGLang)."""
    if cfg.sampler_dtype != "float32" or cfg.sampler_logit_noise or cfg.sampler_router_noise:
        raise _missing("sampler_dtype / sampler_logit_noise / sampler_router_noise",
                       "they simulate an inference engine's mismatch; in an engine the sampler is the engine itself",
                       "keep the importance correction (is_correction) and drop the dials")


def _no_token_weights_on_sequence_terms(cfg: RLConfig) -> None:
    """ValueError for a token-level sampler correction with a loss of one term per sequence (GSPO, GMPO): there is
    no token term to weigh, and minirl's ``policy_loss`` takes only (B,) weights there. An invalid config, so it is
    refused before any mapping; once ``RLConfig.validate`` holds this rule, this check can go."""
    loss = "loss_mode='gmpo'" if cfg.loss_mode == "gmpo" else "level='sequence'" if cfg.level == "sequence" else ""
    if loss and cfg.is_correction in ("token_tis", "token_mis"):
        raise ValueError(f"is_correction={cfg.is_correction!r} weighs each token, but {loss} has one term per "
                         f"sequence: use is_correction='seq_tis' or 'seq_mis'")


def _layout(cfg: RLConfig, num_processes: int = 1) -> dict:
    """Rows per generation, per optimiser step and per forward of one rollout, and per device of each forward."""
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be a positive int (the launch's GPU count), got {num_processes!r}")
    rows = cfg.prompts_per_step * cfg.group_size  # B of one rollout
    minibatch = rows // cfg.num_minibatches  # rows per optimiser step
    micro = cfg.micro_batch_size or minibatch
    if minibatch % micro:
        raise ValueError(f"micro_batch_size={micro} must divide the minibatch of {minibatch} rows for TRL's "
                         f"gradient accumulation")
    if micro % num_processes:
        raise ValueError(f"num_processes={num_processes} must divide the micro-batch of {micro} rows (one share each)")
    return {"rows": rows, "minibatch": minibatch, "micro": micro, "accumulation": minibatch // micro,
            "per_device": micro // num_processes}


def trl_kwargs(cfg: RLConfig, without: tuple[str, ...] | list[str] = (), *, num_processes: int = 1) -> dict:
    """The keyword arguments of ``trl.GRPOConfig`` (TRL 1.16) that run ``cfg``; TRL itself is not imported.

    Every GRPOConfig field that changes the loss, advantages, sampling or batch layout is stated, whatever TRL's
    default (``_TRL_FIXED``); every other field is in ``TRL_UNPINNED`` with the reason it does not matter.

    Switch by switch: group_size -> num_generations; eps_low / eps_high -> epsilon / epsilon_high; dual_clip c ->
    delta = c (TRL's two-sided clip caps the ratio at delta, which for c > 1 + eps_high is exactly dual-clip PPO);
    adv_scale -> scale_rewards; agg -> loss_type (``_TRL_LOSS_TYPE``); level "sequence" -> importance_sampling_level
    "sequence"; beta -> beta (k3 in the loss, ``use_bias_correction_kl=False``); overlong_filter ->
    mask_truncated_completions; router_aux_loss_coef -> router_aux_loss_coef (the MoE load-balancing loss, 0 by
    default: TRL's own default None would take the model config's 0.001; TRL then asks the model for its router
    logits, whose ``aux_loss`` is ``moe.load_balancing_loss`` over the prompt and completion tokens, averaged
    over gradient accumulation, as minirl's ``rl.router_aux_term``). One rollout is
    ``prompts_per_step * group_size`` rows split into num_minibatches
    optimiser steps (steps_per_generation = num_minibatches x accumulation, per_device_train_batch_size = the
    micro-batch / num_processes: per_device_train_batch_size x num_processes x steps_per_generation is one rollout),
    repeated num_iterations times; max_steps counts optimiser steps. The lr is constant (TRL's default schedule
    decays linearly), the optimiser plain torch AdamW, the weights float32 (bf16=False: TRL's default is bf16; pass
    bf16=True to ``to_trl`` for a real run on GPUs).

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
            reinforce_pp / reinforce_pp_baseline, pi_old="naive", is_seq_form="geomean" with a sequence
            correction, is_correction with loss_mode="gmpo", token_tis / token_mis with level="sequence-token".
        ValueError: for an invalid config (a token-level is_correction with level="sequence" or GMPO included),
            a name in ``without`` that is not droppable, a micro-batch that does not divide the minibatch, or
            num_processes that is not a positive int dividing the micro-batch.

    Source: TRL 1.16 ``trl/trainer/grpo_config.py`` and ``GRPOTrainer._compute_loss``.
    """
    cfg.validate()
    _no_token_weights_on_sequence_terms(cfg)
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
    return dict(
        # the algorithm
        loss_type=loss_type, importance_sampling_level="token" if cfg.level == "token" else "sequence",
        epsilon=cfg.eps_low, epsilon_high=epsilon_high, delta=cfg.dual_clip, scale_rewards=cfg.adv_scale, **extra,
        beta=cfg.beta, use_bias_correction_kl=False, mask_truncated_completions=cfg.overlong_filter,
        **_trl_common(cfg, num_processes), **{**_TRL_FIXED, **_trl_importance(cfg)})


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
        top_k=0, top_p=1.0,
        # batch layout: one rollout = steps_per_generation forwards of per_device_train_batch_size rows per device
        per_device_train_batch_size=lay["per_device"], gradient_accumulation_steps=lay["accumulation"],
        steps_per_generation=cfg.num_minibatches * lay["accumulation"], num_iterations=cfg.num_iterations,
        max_steps=cfg.steps * cfg.num_iterations * cfg.num_minibatches,
        # optimiser
        learning_rate=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        # the MoE load-balancing loss, stated even when off: TRL's None takes the model config's (0.001 here)
        router_aux_loss_coef=cfg.router_aux_loss_coef,
        lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", seed=cfg.seed,
        bf16=False,  # float32, as minirl; a real run on GPUs passes bf16=True
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
    for switch in ("dual_clip", "adaptive_kl", "routing_replay", "dynamic_sampling", "overlong_shaping"):
        if getattr(cfg, switch):
            raise _missing(switch, "not an RLOOTrainer option")
    return dict(epsilon=cfg.eps_low, epsilon_high=cfg.eps_high, beta=0.0, normalize_advantages=False,
                mask_truncated_completions=cfg.overlong_filter, **_trl_common(cfg, num_processes),
                **{k: v for k, v in _TRL_FIXED.items() if k not in _GRPO_ONLY})
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

#: Every other GRPOConfig field of TRL 1.16, reviewed: it does not change what ``to_trl(cfg)`` computes (why, in a
#: few words). tests/test_interop.py fails when the installed TRL has a field in neither this nor ``trl_kwargs``.
_UNPINNED_BY_REASON = {  # reason: the fields, space-separated
    "inert: only for loss_type sapo / vespo": "sapo_temperature_neg sapo_temperature_pos vespo_k_pos "
        "vespo_lambda_pos vespo_k_neg vespo_lambda_neg",
    "inert: use_adaptive_entropy=False": "entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target",
    "inert: sync_ref_model=False": "ref_model_mixup_alpha ref_model_sync_steps",
    "inert with vllm_importance_sampling_correction=False; set by trl_kwargs for is_correction": "vllm_importance_"
        "sampling_mode vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min",
    "deprecated alias of vllm_importance_sampling_clip_max (which trl_kwargs sets)": "vllm_importance_sampling_cap",
    "generation engine: where vLLM runs, not what it samples": "vllm_mode vllm_model_impl vllm_enable_sleep_mode "
        "vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port "
        "vllm_gpu_memory_utilization vllm_max_model_length vllm_tensor_parallel_size",
    "generation speed / memory": "use_transformers_continuous_batching transformers_continuous_batching_config "
        "use_transformers_paged cache_implementation ds3_gather_for_generation use_cache",
    "evaluation only": "num_generations_eval per_device_eval_batch_size eval_strategy eval_steps eval_delay "
        "prediction_loss_only eval_on_start eval_do_concat_batches eval_use_gather_object eval_accumulation_steps "
        "include_for_metrics batch_eval_metrics bf16_full_eval fp16_full_eval do_eval do_predict",
    "conversational prompts / tools, out of scope": "chat_template_kwargs max_tool_calling_iterations",
    "model loading: the caller passes the model": "model_init_kwargs trust_remote_code",
    "logging": "log_completions log_multimodal num_completions_to_print log_unique_prompts log_completions_hub_repo "
        "logging_strategy logging_steps logging_first_step log_on_each_node logging_nan_inf_filter "
        "include_num_input_tokens_seen log_level log_level_replica disable_tqdm report_to run_name project "
        "trackio_space_id trackio_bucket_id trackio_static_space_id skip_memory_metrics debug",
    "saving / resuming": "output_dir save_only_model save_strategy save_steps save_on_each_node save_total_limit "
        "enable_jit_checkpoint load_best_model_at_end metric_for_best_model greater_is_better ignore_data_skip "
        "restore_callback_states_from_checkpoint resume_from_checkpoint do_train",
    "hub": "push_to_hub hub_token hub_private_repo hub_model_id hub_strategy hub_always_push hub_revision",
    "devices and sharding: the caller's hardware, not the objective": "use_cpu accelerator_config "
        "parallelism_config fsdp fsdp_config deepspeed ddp_find_unused_parameters ddp_bucket_cap_mb "
        "ddp_broadcast_buffers ddp_static_graph ddp_backend ddp_timeout local_rank tf32",
    "memory / speed (same objective)": "activation_checkpointing activation_checkpointing_kwargs "
        "gradient_checkpointing gradient_checkpointing_kwargs torch_compile torch_compile_backend torch_compile_mode "
        "torch_empty_cache_steps optim_target_modules liger_kernel_config full_determinism",
    "data loading mechanics": "dataloader_num_workers dataloader_pin_memory dataloader_persistent_workers "
        "dataloader_prefetch_factor dataloader_multiprocessing_context dataloader_in_order label_names "
        "length_column_name",
    "overridden: max_steps is pinned": "num_train_epochs",
    "unused: GRPOTrainer's compute_loss makes its own normaliser": "average_tokens_across_devices",
}
TRL_UNPINNED = {name: why for why, names in _UNPINNED_BY_REASON.items() for name in names.split()}


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
        if cfg.loss_mode == "gmpo":
            from trl.experimental.gmpo import GMPOConfig as Config  # trainer: trl.experimental.gmpo.GMPOTrainer
        else:
            from trl import GRPOConfig as Config

        return Config(**{**trl_kwargs(cfg, without, num_processes=num_processes), **trl_args})
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


# ------------------------------------------------------------------------------------------------ verl
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
    averages over all rows). These names are the same in verl 0.7.0 and 0.9.1. The sampler correction
    (``algorithm.rollout_correction``, verl 0.9.1 only): pi_old="naive" -> bypass_mode=True (old_log_probs = the
    rollout's, verl's own PPO clip); token_tis / seq_tis -> rollout_is=token / sequence with rollout_is_threshold
    = is_cap (truncation from above); token_mis / seq_mis -> the same with "is_cap_low_is_cap" (IcePop: weights
    outside the bounds zeroed); the sequence weight is exp of the summed log-ratios (clamped at +-20 nats).
    advantage rloo is the same estimator; reinforce_plus_plus(_baseline) whiten over the batch's TOKENS
    (weighted by length, / sqrt(var + 1e-8)), minirl over its sequences (/ (std + adv_eps)): equal for one length.

    Raises:
        NotImplementedError: for switches not mapped: routing_replay (verl's router_replay R2/R3 records in other
            places), router_aux_loss_coef > 0, overlong_filter, adv_scale="batch", adaptive_kl with the KL in
            the loss, GSPO or SAPO with another aggregation, pi_old="naive" with a loss other than token PPO clip,
            is_seq_form="geomean", is_cap_low with TIS, MIS without is_cap_low.
        ValueError: for an invalid config (a token-level is_correction with level="sequence" or GMPO included).

    Source: verl 0.9.1 ``verl/trainer/config/_generated_ppo_trainer.yaml``, ``algorithm.py`` (FilterGroupsConfig),
    ``verl/experimental/reward_loop/reward_manager/dapo.py``, ``verl/trainer/ppo/core_algos.py``,
    ``verl/trainer/config/algorithm/rollout_correction.yaml``, ``verl/trainer/ppo/rollout_corr_helper.py``.
    """
    cfg.validate()
    _no_token_weights_on_sequence_terms(cfg)
    _simulated_sampler(cfg)
    if cfg.routing_replay:
        raise _missing("routing_replay", f"verl 0.9.1 names it actor_rollout_ref.actor.megatron.router_replay.mode="
                       f"{'R3' if cfg.replay_source == 'sampler' else 'R2'} (Megatron and VeOmni engines only), "
                       "not verified here against minirl's")
    if cfg.router_aux_loss_coef > 0:
        raise _missing("router_aux_loss_coef", "verl's MoE auxiliary loss is configured per model backend, not "
                       "verified against minirl's moe.load_balancing_loss")
    if cfg.overlong_filter:
        raise _missing("overlong_filter", "verl 0.9 has no option that masks truncated completions in the loss")
    if cfg.advantage == "group" and cfg.adv_scale == "batch":
        raise _missing("adv_scale='batch'", "verl's GRPO divides by the group std or by nothing")
    if cfg.level == "sequence" and cfg.agg != "seq-mean-token-mean":
        raise _missing(f"level='sequence' with agg={cfg.agg!r}", "verl's gspo aggregates seq-mean-token-mean")
    if cfg.loss_mode == "sapo" and cfg.agg != "seq-mean-token-mean":
        raise _missing(f"loss_mode='sapo' with agg={cfg.agg!r}", "verl's sapo always aggregates seq-mean-token-mean")
    loss_mode = {"cispo": "cispo", "sapo": "sapo", "gmpo": "geo_mean"}.get(
        cfg.loss_mode, "vanilla" if cfg.level == "token" else "gspo")
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
            f"data.max_response_length={cfg.max_new_tokens}", f"{r}.temperature={cfg.temperature}", f"{r}.top_k=-1",
            f"{r}.top_p=1.0", f"{a}.ppo_mini_batch_size={cfg.prompts_per_step // cfg.num_minibatches}",
            f"{a}.ppo_micro_batch_size_per_gpu={lay['per_device']}", f"trainer.n_gpus_per_node={num_processes}",
            f"{a}.ppo_epochs={cfg.num_iterations}",
            f"{a}.optim.lr={cfg.lr}", f"{a}.optim.weight_decay={cfg.weight_decay}",
            f"{a}.optim.clip_grad={cfg.max_grad_norm}",
            f"{a}.policy_loss.loss_mode={loss_mode}",
            f"{a}.clip_ratio_low={clip_low}", f"{a}.clip_ratio_high={cfg.eps_high}"]
    if cfg.loss_mode == "clip":  # only verl's vanilla loss reads clip_ratio_c
        out.append(f"{a}.clip_ratio_c={cfg.dual_clip if cfg.dual_clip is not None else 1e9}")
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
    out += _verl_importance(cfg)
    if cfg.dynamic_sampling:
        out += ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
                f"algorithm.filter_groups.max_num_gen_batches={cfg.max_gen_batches}",
                f"data.gen_batch_size={cfg.gen_prompts_per_round or cfg.prompts_per_step}"]
    if cfg.overlong_shaping:
        buffer = "+reward.reward_kwargs.overlong_buffer_cfg"
        out += ["reward.reward_manager.name=dapo", f"{buffer}.enable=True", f"{buffer}.len={cfg.overlong_cache_len}",
                f"{buffer}.penalty_factor=1.0", f"+reward.reward_kwargs.max_resp_len={cfg.max_new_tokens}"]
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


# ------------------------------------------------------------------------------------------------ the map
#: GRPOConfig arguments that define the algorithm (the rest is batch layout and optimiser), for the short map.
_TRL_ALGO_KEYS = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta", "scale_rewards",
                  "sapo_temperature_pos", "sapo_temperature_neg", "beta", "use_bias_correction_kl",
                  "mask_truncated_completions")
_TRL_RLOO_KEYS = ("epsilon", "epsilon_high", "beta", "normalize_advantages", "mask_truncated_completions")
_VERL_ALGO_PREFIXES = ("algorithm.", "actor_rollout_ref.actor.policy_loss", "actor_rollout_ref.actor.clip_ratio_",
                       "actor_rollout_ref.actor.tau_",
                       "actor_rollout_ref.actor.loss_", "actor_rollout_ref.actor.use_kl", "actor_rollout_ref.actor.kl_",
                       "reward.", "+reward.")


def describe_trl(cfg: RLConfig) -> str:
    """One line: the GRPOConfig (or RLOOConfig) arguments that define ``cfg``'s algorithm, or what TRL lacks."""
    if cfg.advantage == "rloo":
        try:
            kw = rloo_trl_kwargs(cfg)
        except NotImplementedError as e:
            return f"not in TRL {TRL_VERSION}'s RLOOTrainer: {e}"
        return "RLOOConfig(" + ", ".join(f"{k}={kw[k]!r}" for k in _TRL_RLOO_KEYS) + ")"
    try:
        kw = trl_kwargs(cfg)
        dropped = []
    except NotImplementedError as e:
        dropped = [s for s in DROPPABLE if getattr(cfg, s)]
        try:
            kw = trl_kwargs(cfg, without=dropped)
        except NotImplementedError:
            return f"not in TRL {TRL_VERSION}'s GRPOTrainer: {e}"
    keys = [k for k in _TRL_ALGO_KEYS if kw.get(k) is not None and not (cfg.loss_mode == "gmpo" and k == "loss_type")]
    name = "trl.experimental.gmpo.GMPOConfig" if cfg.loss_mode == "gmpo" else "GRPOConfig"
    text = name + "(" + ", ".join(f"{k}={kw[k]!r}" for k in keys) + ")"
    if cfg.overlong_shaping:
        text += (f" + reward_funcs [..., trl.rewards.get_soft_overlong_punishment({cfg.max_new_tokens}, "
                 f"{cfg.overlong_cache_len})]")
    if "dynamic_sampling" in dropped:
        text += "; no dynamic sampling in TRL"
    return text


def describe_verl(cfg: RLConfig) -> str:
    """One line: the verl overrides that define ``cfg``'s algorithm (batch layout and optimiser left out)."""
    try:
        return " ".join(o for o in verl_overrides(cfg) if o.startswith(_VERL_ALGO_PREFIXES))
    except NotImplementedError as e:
        return f"not mapped to verl {VERL_VERSION}: {e}"


def engine_equivalents() -> dict[str, dict[str, str]]:
    """Where a reader finds each preset of ``ALGORITHMS`` in the engines: the TRL GRPOConfig arguments and the
    verl overrides that define the algorithm (``to_trl`` / ``to_verl`` give the full, runnable settings), or the
    reason an engine cannot run it. ``python -m minirl.interop`` prints the table.
    """
    out = {}
    for name in ALGORITHMS:
        cfg = make_config(name)
        out[name] = {"trl": describe_trl(cfg), "verl": describe_verl(cfg)}
    return out


if __name__ == "__main__":  # python -m minirl.interop: each preset in TRL and verl
    import pprint

    pprint.pprint(engine_equivalents(), width=118, sort_dicts=False)
