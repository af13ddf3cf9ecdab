"""The bridge to the engines: a minirl config -> TRL's config object, or verl's command-line overrides.

One module per engine: ``trl`` (``trl_kwargs``, ``to_trl``, and the RLOO and preference trainers), ``verl``
(``verl_overrides``, ``to_verl``); ``real_model`` maps the real-model settings (precision, checkpointing, batch
sizes, LoRA as TRL's ``peft_config``, GDPO, TensorBoard) for both; ``table`` prints each preset in both
(``python -m minirl.interop``); ``_common`` holds the checks both bridges share. Every name is re-exported here,
so ``interop.to_trl(cfg)`` is the way in.

A reader who has understood an algorithm here and wants to train a real model on several GPUs moves to TRL
(accelerate / DeepSpeed / FSDP, vLLM generation) or verl (Ray, FSDP / Megatron). ``to_trl`` and ``to_verl`` say,
switch by switch, what the same run is in those engines; a switch the engine lacks raises ``NotImplementedError``
naming it, never a silent approximation. ``tests/test_interop.py`` feeds the same inputs to TRL's own loss code and
to minirl's and checks that the losses and gradients agree to 1e-6; notebook 10 trains with both.

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

from .table import describe_trl, describe_verl, engine_equivalents
from .trl import (
    DROPPABLE,
    TRL_VERSION,
    distill_trl_kwargs,
    pref_trl_kwargs,
    rloo_trl_kwargs,
    to_trl,
    trl_kwargs,
    trl_reward_funcs,
)
from .verl import VERL_VERSION, distill_verl_overrides, to_verl, verl_overrides

__all__ = ["DROPPABLE", "TRL_VERSION", "VERL_VERSION", "describe_trl", "describe_verl", "distill_trl_kwargs",
           "engine_equivalents", "pref_trl_kwargs", "rloo_trl_kwargs", "to_trl", "to_verl", "trl_kwargs",
           "trl_reward_funcs", "verl_overrides", "distill_verl_overrides"]
