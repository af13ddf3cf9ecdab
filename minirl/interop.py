"""The bridge to the engines: a minirl config -> TRL's config object, or verl's command-line overrides.

A reader who has understood an algorithm here and wants to train a real model on several GPUs moves to TRL
(accelerate / DeepSpeed / FSDP, vLLM generation) or verl (Ray, FSDP / Megatron). ``to_trl`` and ``to_verl`` say,
switch by switch, what the same run is in those engines; a switch the engine lacks raises ``NotImplementedError``
naming it, never a silent approximation. ``tests/test_interop.py`` feeds the same inputs to TRL's own loss code and
to minirl's and checks that the losses and gradients agree to 1e-6; notebook 07 trains with both.

Versions: TRL 1.16 (the optional extra ``pip install -e ".[trl]"``; TRL is imported inside the functions, so
``import minirl`` works without it); verl 0.7.0 (option names checked against ``verl/trainer/config/*.yaml`` and
``recipe/dapo/config/dapo_trainer.yaml`` of tag v0.7.0; verl is not installed, ``to_verl`` only writes text).

Convention differences that remain where both engines run the same switches (each has a test):

- Rows with no valid token (all masked, e.g. by overlong filtering): TRL's "grpo" and "dr_grpo" losses divide by
  all B rows, minirl by the rows that have a token (the loss is scaled by B_valid / B in TRL).
- Log-ratios: minirl clamps them to +-20 nats before exp (losses and k3); TRL 1.16 does not clamp.
- TRL's "dapo" loss divides every optimiser step by the generation batch's tokens / steps_per_generation (the mean
  token count per step); minirl's token-mean divides by the minibatch's own tokens. Equal with one optimiser step
  per rollout (``num_minibatches=1``), whatever ``num_iterations``.
- TRL 1.16's DPO "sigmoid" loss ignores ``label_smoothing`` (cDPO); ``to_trl`` raises for it.
- TRL 1.16 multiplies the KL term by the importance ratio by default (``use_bias_correction_kl=True``), which
  changes the gradient even on-policy; ``to_trl`` sets it False, which is GRPO's (and minirl's) loss.
"""

from __future__ import annotations

from .config import ALGORITHMS, RLConfig, make_config
from .preference_loop import PrefConfig

#: The TRL version the mapping and the equivalence tests were checked against (pyproject's [trl] extra bounds it).
TRL_VERSION = "1.16"
#: The verl tag whose option names ``to_verl`` writes.
VERL_VERSION = "0.7.0"

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


def _layout(cfg: RLConfig) -> dict:
    """Rows per generation, per optimiser step and per forward of one rollout (single process)."""
    rows = cfg.prompts_per_step * cfg.group_size  # B of one rollout
    minibatch = rows // cfg.num_minibatches  # rows per optimiser step
    micro = cfg.micro_batch_size or minibatch
    if minibatch % micro:
        raise ValueError(f"micro_batch_size={micro} must divide the minibatch of {minibatch} rows for TRL's "
                         f"gradient accumulation")
    return {"rows": rows, "minibatch": minibatch, "micro": micro, "accumulation": minibatch // micro}


def trl_kwargs(cfg: RLConfig, without: tuple[str, ...] | list[str] = ()) -> dict:
    """The keyword arguments of ``trl.GRPOConfig`` (TRL 1.16) that run ``cfg``; TRL itself is not imported.

    Switch by switch: group_size -> num_generations; eps_low / eps_high -> epsilon / epsilon_high; dual_clip c ->
    delta = c (TRL's two-sided clip caps the ratio at delta, which for c > 1 + eps_high is exactly dual-clip PPO);
    adv_scale -> scale_rewards; agg -> loss_type (``_TRL_LOSS_TYPE``); level "sequence" -> importance_sampling_level
    "sequence"; beta -> beta (k3 in the loss, ``use_bias_correction_kl=False``); overlong_filter ->
    mask_truncated_completions. One rollout is ``prompts_per_step * group_size`` rows split into num_minibatches
    optimiser steps (steps_per_generation = num_minibatches x accumulation, per_device_train_batch_size = the
    micro-batch), repeated num_iterations times; max_steps counts optimiser steps. The lr is constant (TRL's
    default schedule decays linearly), the optimiser plain torch AdamW, the weights float32 (bf16=False: TRL's
    default is bf16; pass bf16=True to ``to_trl`` for a real run on GPUs).

    GSPO-token ("sequence-token") maps to TRL's "sequence" level: TRL 1.16 has no GSPO-token level (neither in
    GRPOConfig nor in trl.experimental), and with one advantage per sequence, which is all TRL computes, GSPO-token
    has GSPO's value and gradient (Zheng et al. 2025, eq. 13-14; tested). With another aggregation it raises.

    Args:
        cfg: an RLConfig (``make_config(algo, ...)``).
        without: switches of ``DROPPABLE`` to leave out knowingly: "dynamic_sampling" (TRL has none) and
            "overlong_shaping" (TRL puts it in the rewards: add ``trl_reward_funcs(cfg, reward_fn)``).

    Returns:
        dict of GRPOConfig keyword arguments.

    Raises:
        NotImplementedError: naming the first switch of ``cfg`` that TRL 1.16's GRPOTrainer lacks: advantage="gae"
            (critic), KL in the reward, a KL estimator other than k3 in the loss, adaptive_kl, routing_replay,
            dynamic_sampling / overlong_shaping (unless in ``without``), adv_eps other than 1e-4,
            level="sequence-token" with an aggregation other than seq-mean-token-mean, GSPO with another
            aggregation, dual_clip <= 1 + eps_high, advantage rloo / reinforce_pp / reinforce_pp_baseline.
        ValueError: for an invalid config, a name in ``without`` that is not droppable, or a micro-batch that does
            not divide the minibatch.

    Source: TRL 1.16 ``trl/trainer/grpo_config.py`` and ``GRPOTrainer._compute_loss``.
    """
    cfg.validate()
    unknown = set(without) - set(DROPPABLE)
    if unknown:
        raise ValueError(f"without= may name only {DROPPABLE}, got {sorted(unknown)}")
    if cfg.advantage == "gae":
        raise _missing("advantage='gae'", "GRPOTrainer has no critic or GAE",
                       "TRL's PPOTrainer (trl.experimental.ppo) is a different loop, not mapped here")
    if cfg.advantage in _TRL_GRPO_LACKS:
        raise _missing(f"advantage={cfg.advantage!r}", _TRL_GRPO_LACKS[cfg.advantage])
    if cfg.beta > 0 and cfg.kl_placement == "reward":
        raise _missing("kl_placement='reward'", "GRPOTrainer puts the KL only in the loss")
    if cfg.beta > 0 and cfg.kl_estimator != "k3":
        raise _missing(f"kl_estimator={cfg.kl_estimator!r}", "GRPOTrainer's KL in the loss is k3 only")
    if cfg.adaptive_kl:
        raise _missing("adaptive_kl", "GRPOTrainer's beta is fixed")
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
    return dict(
        # the algorithm
        loss_type=_TRL_LOSS_TYPE[cfg.agg], importance_sampling_level="token" if cfg.level == "token" else "sequence",
        epsilon=cfg.eps_low, epsilon_high=cfg.eps_high, delta=cfg.dual_clip, scale_rewards=cfg.adv_scale,
        beta=cfg.beta, use_bias_correction_kl=False, mask_truncated_completions=cfg.overlong_filter,
        **_trl_common(cfg))


def _trl_common(cfg: RLConfig) -> dict:
    """Sampling, batch layout and optimiser arguments, the same in GRPOConfig and RLOOConfig."""
    lay = _layout(cfg)
    return dict(
        # sampling
        num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
        top_k=0, top_p=1.0,
        # batch layout: one rollout = steps_per_generation forwards of per_device_train_batch_size rows
        per_device_train_batch_size=lay["micro"], gradient_accumulation_steps=lay["accumulation"],
        steps_per_generation=cfg.num_minibatches * lay["accumulation"], num_iterations=cfg.num_iterations,
        max_steps=cfg.steps * cfg.num_iterations * cfg.num_minibatches,
        # optimiser
        learning_rate=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm,
        lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", seed=cfg.seed,
        bf16=False,  # float32, as minirl; a real run on GPUs passes bf16=True
    )


def rloo_trl_kwargs(cfg: RLConfig) -> dict:
    """The keyword arguments of ``trl.RLOOConfig`` (TRL 1.16) for an RLConfig with advantage="rloo".

    RLOOTrainer computes the same leave-one-out advantages (normalize_advantages=False) but clips one ratio per
    sequence, exp(sum_t log-ratio_t), and averages over sequences. minirl has no such ratio; the gradients agree
    on-policy, where every ratio is 1: -1/B sum_i A_i grad sum_t log pi_t, minirl's agg="seq-mean-token-sum" at
    level "token" (the values differ: TRL's -mean A_i, minirl's -1/B sum_i A_i T_i; tested). Only this maps.

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
                mask_truncated_completions=cfg.overlong_filter, **_trl_common(cfg))


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


def to_trl(cfg: RLConfig | PrefConfig, without: tuple[str, ...] | list[str] = (), **trl_args):
    """TRL's config object that runs ``cfg``: a ``trl.GRPOConfig`` for an RLConfig (grpo, dr_grpo, dapo, gspo,
    gspo_token and any config whose switches TRL supports), a ``trl.RLOOConfig`` for advantage="rloo"
    (``rloo_trl_kwargs``), a ``trl.DPOConfig`` / ``trl.KTOConfig`` /
    ``trl.experimental.cpo.CPOConfig`` for a PrefConfig.

    Example: ``to_trl(make_config("grpo"), output_dir="runs/trl")`` -> GRPOConfig(loss_type="grpo", beta=0.04,
    epsilon=0.2, scale_rewards="group", use_bias_correction_kl=False, num_generations=8, ...).

    Args:
        cfg: an RLConfig or a PrefConfig.
        without: RLConfig switches to leave out knowingly (see ``trl_kwargs``); not for a PrefConfig.
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

        return RLOOConfig(**{**rloo_trl_kwargs(cfg), **trl_args})
    if isinstance(cfg, RLConfig):
        from trl import GRPOConfig

        return GRPOConfig(**{**trl_kwargs(cfg, without), **trl_args})
    if isinstance(cfg, PrefConfig):
        if without:
            raise ValueError("without= applies to an RLConfig only")
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


def verl_overrides(cfg: RLConfig) -> list[str]:
    """verl 0.7.0 command-line overrides (Hydra ``key=value``) for an RLConfig, one string each.

    Entry point: ``python -m verl.trainer.main_ppo`` (``python -m recipe.dapo.main_dapo`` when dynamic sampling or
    overlong shaping is on: those keys live in the DAPO recipe's config). Batch sizes are in prompts, as verl
    counts them (``ppo_mini_batch_size`` x ``rollout.n`` rows per optimiser step).

    Differences verl's options cannot express, left as they are (say so when comparing runs): the group std is
    divided with eps 1e-6 (minirl 1e-4); verl's k3 ("low_var_kl") output is clamped to [-10, 10]; its GSPO
    log-ratio is clamped above at 10 (minirl +-20); verl's "gspo" loss is the GSPO-token form (s_i,t), equal to
    GSPO for per-sequence advantages; vanilla PPO always applies dual-clip, so "no dual clip" is written as
    clip_ratio_c=1e9. rloo is the same estimator; reinforce_plus_plus(_baseline) whiten over the batch's TOKENS
    (weighted by length, / sqrt(var + 1e-8)), minirl over its sequences (/ (std + adv_eps)): equal for one length.

    Raises:
        NotImplementedError: for switches not mapped: routing_replay (verl's router_replay R2/R3 records in other
            places), overlong_filter, adv_scale="batch", adaptive_kl with the KL in the loss, GSPO with another
            aggregation.
        ValueError: for an invalid config.

    Source: verl v0.7.0 ``verl/trainer/config/_generated_ppo_trainer.yaml``, ``actor/actor.yaml``,
    ``recipe/dapo/config/dapo_trainer.yaml``, ``verl/trainer/ppo/core_algos.py``.
    """
    cfg.validate()
    if cfg.routing_replay:
        raise _missing("routing_replay", "verl 0.7's router_replay (R2 / R3 modes) is not verified against "
                       "minirl's (record pi_old's forward, replay it in training)")
    if cfg.overlong_filter:
        raise _missing("overlong_filter", "verl 0.7 has no option that masks truncated completions in the loss")
    if cfg.advantage == "group" and cfg.adv_scale == "batch":
        raise _missing("adv_scale='batch'", "verl's GRPO divides by the group std or by nothing")
    if cfg.level == "sequence" and cfg.agg != "seq-mean-token-mean":
        raise _missing(f"level='sequence' with agg={cfg.agg!r}", "verl's gspo aggregates seq-mean-token-mean")
    lay = _layout(cfg)
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
            f"{a}.ppo_micro_batch_size_per_gpu={lay['micro']}", f"{a}.ppo_epochs={cfg.num_iterations}",
            f"{a}.optim.lr={cfg.lr}", f"{a}.optim.weight_decay={cfg.weight_decay}",
            f"{a}.optim.clip_grad={cfg.max_grad_norm}",
            f"{a}.policy_loss.loss_mode={'vanilla' if cfg.level == 'token' else 'gspo'}",
            f"{a}.clip_ratio_low={cfg.eps_low}", f"{a}.clip_ratio_high={cfg.eps_high}",
            f"{a}.clip_ratio_c={cfg.dual_clip if cfg.dual_clip is not None else 1e9}",
            f"{a}.loss_agg_mode={cfg.agg}"]
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
    if cfg.dynamic_sampling:
        out += ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
                f"algorithm.filter_groups.max_num_gen_batches={cfg.max_gen_batches}",
                f"data.gen_batch_size={cfg.gen_prompts_per_round or cfg.prompts_per_step}"]
    if cfg.overlong_shaping:
        out += ["reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=True",
                f"reward_model.overlong_buffer.len={cfg.overlong_cache_len}",
                "reward_model.overlong_buffer.penalty_factor=1.0"]
    return out


def to_verl(cfg: RLConfig) -> str:
    """verl 0.7.0 command-line overrides for ``cfg`` as one line of text (``verl_overrides`` joined by spaces),
    to append to ``python -m verl.trainer.main_ppo`` (or ``recipe.dapo.main_dapo`` for DAPO's switches).

    Raises:
        NotImplementedError, ValueError: as ``verl_overrides``.
    """
    return " ".join(verl_overrides(cfg))


# ------------------------------------------------------------------------------------------------ the map
#: GRPOConfig arguments that define the algorithm (the rest is batch layout and optimiser), for the short map.
_TRL_ALGO_KEYS = ("loss_type", "importance_sampling_level", "epsilon", "epsilon_high", "delta", "scale_rewards",
                  "beta", "use_bias_correction_kl", "mask_truncated_completions")
_TRL_RLOO_KEYS = ("epsilon", "epsilon_high", "beta", "normalize_advantages", "mask_truncated_completions")
_VERL_ALGO_PREFIXES = ("algorithm.", "actor_rollout_ref.actor.policy_loss", "actor_rollout_ref.actor.clip_ratio_",
                       "actor_rollout_ref.actor.loss_", "actor_rollout_ref.actor.use_kl", "actor_rollout_ref.actor.kl_",
                       "reward_model.")


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
    text = "GRPOConfig(" + ", ".join(f"{k}={kw[k]!r}" for k in _TRL_ALGO_KEYS if kw[k] is not None) + ")"
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
    """``config.ENGINE_EQUIVALENTS`` as these functions generate it, for every preset of ``ALGORITHMS``.

    config.py holds the generated literal (config must not import this module); ``python -m minirl.interop``
    prints it, and a test checks that the two are the same.
    """
    out = {}
    for name in ALGORITHMS:
        cfg = make_config(name)
        out[name] = {"trl": describe_trl(cfg), "verl": describe_verl(cfg)}
    return out


if __name__ == "__main__":  # python -m minirl.interop: the literal for config.ENGINE_EQUIVALENTS
    import pprint

    pprint.pprint(engine_equivalents(), width=118, sort_dicts=False)
