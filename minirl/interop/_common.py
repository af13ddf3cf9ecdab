"""What both bridges check before they map a config: the simulated sampler and the layout of one rollout; and the
NotImplementedError every refusal raises. (A config the loss itself cannot take, such as a token-level correction on
a loss of one term per sequence, is refused by ``RLConfig.validate``, which every mapping calls first.)"""

from __future__ import annotations

from ..config import RLConfig


def _missing(switch: str, why: str, hint: str = "") -> NotImplementedError:
    return NotImplementedError(f"{switch}: {why}" + (f"; {hint}" if hint else ""))


def _simulated_sampler(cfg: RLConfig) -> None:
    """minirl's sampler dials simulate an inference engine; an engine's sampler is a real one (vLLM, SGLang). The
    same for a simulated lag (sampler_sync_every); and no engine keeps the sampling mask (keep_sampling_mask)."""
    if cfg.sampler_dtype != "float32" or cfg.sampler_logit_noise or cfg.sampler_router_noise:
        raise _missing("sampler_dtype / sampler_logit_noise / sampler_router_noise",
                       "they simulate an inference engine's mismatch; in an engine the sampler is the engine itself",
                       "keep the importance correction (is_correction) and drop the dials")
    if cfg.sampler_sync_every > 1:
        raise _missing(f"sampler_sync_every={cfg.sampler_sync_every}", "it simulates an asynchronous engine's "
                       "staleness; an engine's lag is its own scheduling (TRL's asynchronous GRPO, verl's fully "
                       "async trainer)", "keep the correction (is_correction, off_policy_mask_threshold)")
    if cfg.keep_sampling_mask:
        raise _missing("keep_sampling_mask", "TRL 1.16 and verl 0.9.1 score the full vocabulary: neither "
                       "renormalises the trainer's log-probs over the sampler's top-k / top-p set")


def _distillation(cfg: RLConfig, engine: str) -> None:
    """A distillation config is not an RL config to either bridge: its teacher replaces the reward (and a self-teacher
    is the student behind a demonstration, TRL 1.16's experimental SDFTTrainer / SDPOTrainer, not verified here)."""
    if cfg.distill != "none":
        where = "distill_trl_kwargs" if engine == "trl" else "distill_verl_overrides"
        raise _missing(f"distill={cfg.distill!r} (distill_teacher={cfg.distill_teacher!r})", "the RL trainer's "
                       "settings would train GRPO on the task reward and drop the teacher", f"{where} maps the "
                       "objective; a self-teacher is TRL's experimental SDFTTrainer / SDPOTrainer, not compared here")


def _episodes(cfg: RLConfig, engine: str) -> None:
    """Multi-turn episodes (``max_turns`` > 1, ``mask_observations``) have no mapped form in either engine."""
    if not cfg.mask_observations:
        raise _missing("mask_observations=False", "it trains on the environment's tokens, the bug lesson 14 measures; "
                       "TRL masks them with tool_mask and verl with its response mask, always")
    if cfg.max_turns > 1:
        why = {"trl": "TRL 1.16's environment_factory continues an episode only through tool calls that the chat "
                      "template parses (max_tool_calling_iterations); an environment that answers every turn (a retry "
                      "with feedback) has no TRL form. Its loss on the same episodes is minirl's (tool_mask: "
                      "tests/test_multiturn_trl.py)",
               "verl": "verl 0.9.1's agent loop (actor_rollout_ref.rollout.multi_turn) is configured by its own tool "
                       "and interaction YAML files, not mapped or compared here"}[engine]
        raise _missing(f"max_turns={cfg.max_turns}", why)


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
