"""The real-model settings of RLConfig (issue 36) in TRL 1.16 and verl 0.9.1: precision, gradient checkpointing,
the generation / log-prob batch sizes, LoRA, GDPO's aggregation and TensorBoard.

``trl_kwargs`` and ``verl_overrides`` take what this module returns, so ``to_trl`` / ``to_verl`` carry them; the
few that are not settings of a config are returned by their own function (``trl_peft_config``: TRL takes LoRA as
the trainer's ``peft_config`` argument). ``NOT_MAPPED`` lists, per engine, the settings left out and why; each
changes memory or speed only, never what a step computes.
"""

from __future__ import annotations

from ..config import RLConfig
from ._common import _missing

#: minirl precision -> (TRL's bf16 switch, the dtype TRL loads a named model in). TRL's bf16=True is transformers'
#: bfloat16 autocast over the weights as loaded: float32 weights give minirl's "bf16-autocast", bfloat16 ones "bf16".
_TRL_PRECISION = {"fp32": (False, "float32"), "bf16-autocast": (True, "float32"), "bf16": (True, "bfloat16")}
#: minirl precision -> verl 0.9.1's FSDP (model_dtype: the weights AdamW updates; mixed_precision.param_dtype: the
#: dtype the forwards compute in).
_VERL_PRECISION = {"fp32": ("fp32", "fp32"), "bf16-autocast": ("fp32", "bf16"), "bf16": ("bf16", "bf16")}

#: RLConfig settings each engine does not take, with the reason; none changes what a step computes.
NOT_MAPPED = {
    "trl": {
        "generation_batch_size": "TRL 1.16 decodes a device's whole share of the rollout in one generate call (its "
                                 "own generation_batch_size is the rollout's row count, which trl_kwargs derives); "
                                 "with vLLM, vllm_gpu_memory_utilization bounds the KV cache instead",
        "logprob_batch_size": "TRL 1.16 computes pi_old's and the reference's log-probs per_device_train_batch_size "
                              "rows at a time: the micro-batch (micro_batch_size) bounds them",
        "completion_only_head": "TRL always applies the LM head to the completion positions only (logits_to_keep), "
                                "as completion_only_head=True; the same values either way",
        "report_to": "TRL's own report_to (a TrainingArguments field): pass report_to='tensorboard' to to_trl",
    },
    "verl": {
        "completion_only_head": "verl's forwards run on unpadded tokens (use_remove_padding) and keep every position's "
                                "logits; the same values",
    },
}


def trl_settings(cfg: RLConfig) -> dict:
    """GRPOConfig / RLOOConfig fields (TRL 1.16) for cfg's precision and gradient checkpointing: bf16, the dtype TRL
    loads a named model in (``model_init_kwargs``; a model passed as an object keeps its own dtype) and
    activation_checkpointing (transformers 5's name; gradient_checkpointing is its deprecated alias, which TRL
    defaults to True and minirl to False: stated either way), non-reentrant as minirl's."""
    bf16, dtype = _TRL_PRECISION[cfg.precision]
    return dict(bf16=bf16, model_init_kwargs={"dtype": dtype}, activation_checkpointing=cfg.gradient_checkpointing,
                activation_checkpointing_kwargs={"use_reentrant": False} if cfg.gradient_checkpointing else None)


def trl_grpo_settings(cfg: RLConfig) -> dict:
    """GRPOConfig fields (TRL 1.16) only GRPO has: multi_objective_aggregation, TRL's name for minirl's field, so
    GDPO ("normalize_then_sum", tested bit for bit against TRL's lines in tests/test_gdpo.py) carries over."""
    return dict(multi_objective_aggregation=cfg.multi_objective_aggregation)


def trl_peft_config(cfg: RLConfig):
    """The ``peft_config`` to pass to TRL's GRPOTrainer for cfg's LoRA (``peft.LoraConfig`` with rank, alpha, target
    modules and dropout 0, as ``lora.attach``), or None without LoRA. TRL then trains the adapter only and, with
    beta > 0, computes the reference with the adapter switched off: minirl's ``lora.AdapterOff``.

    Raises:
        ImportError: without peft (``pip install -e ".[lora]"``), when cfg asks for LoRA.
    """
    if not cfg.lora_rank:
        return None
    from ..lora import _peft, target_modules

    return _peft().LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, bias="none",
                              target_modules=target_modules(cfg.lora_target_modules), task_type="CAUSAL_LM")


def verl_settings(cfg: RLConfig) -> list[str]:
    """verl 0.9.1 overrides for cfg's real-model settings.

    precision -> actor_rollout_ref.{actor,ref}.fsdp_config.model_dtype (the weights' dtype) and
    +...mixed_precision.param_dtype (the forwards'; verl's default bf16, so fp32 is stated); gradient_checkpointing ->
    actor_rollout_ref.model.enable_gradient_checkpointing (verl's default True, so it is stated);
    generation_batch_size -> actor_rollout_ref.rollout.max_num_seqs (sequences its engine decodes at once);
    logprob_batch_size -> log_prob_micro_batch_size_per_gpu of the rollout (pi_old's recompute) and the reference;
    lora_rank / lora_alpha / lora_target_modules -> actor_rollout_ref.model.lora_rank / lora_alpha / target_modules
    (with lora_rank > 0 verl computes the reference in the actor, adapter off: ``ref_in_actor``);
    report_to="tensorboard" -> trainer.logger=[console,tensorboard]. The batch sizes are per device: they bound
    what one GPU holds, as minirl's bound what its one device holds.

    Raises:
        NotImplementedError: for multi_objective_aggregation="normalize_then_sum" (GDPO): verl 0.9.1's reward
            manager returns one summed score per completion before the advantage, so rewards are never normalised
            one by one.

    Source: verl 0.9.1 ``verl/trainer/config/_generated_ppo_trainer.yaml``, ``verl/workers/config/engine.py``
    (FSDPEngineConfig.model_dtype, mixed_precision), ``verl/trainer/main_ppo_v0.py`` (ref_in_actor).
    """
    if cfg.multi_objective_aggregation == "normalize_then_sum":
        raise _missing("multi_objective_aggregation='normalize_then_sum'", "verl 0.9.1's reward manager sums the "
                       "reward functions into one score per completion before the advantage (no GDPO)",
                       "TRL 1.16 has it: to_trl maps it")
    model_dtype, param_dtype = _VERL_PRECISION[cfg.precision]
    m, out = "actor_rollout_ref.model", []
    for role in ("actor", "ref"):
        out += [f"actor_rollout_ref.{role}.fsdp_config.model_dtype={model_dtype}",
                f"+actor_rollout_ref.{role}.fsdp_config.mixed_precision.param_dtype={param_dtype}"]
    out.append(f"{m}.enable_gradient_checkpointing={cfg.gradient_checkpointing}")
    if cfg.generation_batch_size is not None:
        out.append(f"actor_rollout_ref.rollout.max_num_seqs={cfg.generation_batch_size}")
    if cfg.logprob_batch_size is not None:
        out += [f"actor_rollout_ref.{role}.log_prob_micro_batch_size_per_gpu={cfg.logprob_batch_size}"
                for role in ("rollout", "ref")]
    if cfg.lora_rank:
        out += [f"{m}.lora_rank={cfg.lora_rank}", f"{m}.lora_alpha={cfg.lora_alpha}",
                f"{m}.target_modules={_verl_modules(cfg.lora_target_modules)}"]
    if cfg.report_to == "tensorboard":
        out.append("trainer.logger=[console,tensorboard]")
    return out


def _verl_modules(spec: str) -> str:
    """"all-linear" as it is, a list of names as Hydra's list syntax [q_proj,v_proj]."""
    from ..lora import target_modules

    names = target_modules(spec)
    return names if isinstance(names, str) else "[" + ",".join(names) + "]"
