"""The short map: for each preset of ``ALGORITHMS``, the TRL arguments and verl overrides that define its
algorithm, or the reason an engine cannot run it (``python -m minirl.interop`` prints it)."""

from __future__ import annotations

from ..config import ALGORITHMS, RLConfig, make_config
from .trl import DROPPABLE, TRL_VERSION, rloo_trl_kwargs, trl_kwargs
from .verl import VERL_VERSION, verl_overrides

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
