"""Settings: the machine profiles, RLConfig (every switch of the RL loop) and ALGORITHMS (the presets).

What differs between the presets of ``ALGORITHMS`` is a handful of switches in ``RLConfig``, collected there so the
differences can be read at a glance (``algorithms_table()`` prints them). The presets: PPO (``ppo``), GRPO
(``grpo``), Dr. GRPO (``dr_grpo``), DAPO (``dapo``), GSPO (``gspo``), GSPO-token (``gspo_token``), CISPO
(``cispo``), SAPO (``sapo``), GMPO (``gmpo``), RLOO (``rloo``), REINFORCE++ (``reinforce_pp``), REINFORCE++ with
baseline (``reinforce_pp_baseline``), and GRPO without a reference (``grpo_no_ref``: beta 0, no reference model held
in memory, as GLM-5 and Kimi K3 report training).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from . import advantages, entropy_control, importance, kl, losses, rl_offpolicy
from .checks import choice
from .lora import target_modules as lora_target_modules
from .precision import PRECISIONS

#: ``RLConfig.distill``: "none" (the RL loop), or the objective of ``distill_loop.train_distill``.
DISTILL_OBJECTIVES = ("none", "reverse_kl", "full_reverse_kl", "sft")
#: ``RLConfig.distill_teacher``: the given teacher model, or the student itself behind a demonstration or its best
#: sibling (self-distillation: ``distill_loop``).
DISTILL_TEACHERS = ("external", "self_demonstration", "self_best_sibling")
#: RLConfig fields the distillation loop does not read: with ``distill`` set they must keep their defaults.
DISTILL_UNREAD = ("dppo_cap", "sampler_kl_tau", "ref_reset_every", "max_turns", "mask_observations", "precision",
                  "gradient_checkpointing",
                  "sampler_dtype", "sampler_logit_noise", "sampler_router_noise",
                  "pi_old", "is_correction", "routing_replay", "overlong_shaping", "overlong_filter",
                  "router_aux_loss_coef", "checkpoint_every", "kl_placement", "adaptive_kl", "top_k", "top_p",
                  "keep_sampling_mask", "sampler_sync_every", "off_policy_mask_threshold", "kl_ratio_weighted",
                  "lora_rank", "report_to")
#: The values of ``RLConfig.report_to``: metrics only in History / metrics.jsonl, or also as TensorBoard scalars.
REPORT_TO = ("none", "tensorboard")
#: Seconds between progress-bar refreshes: a few lines per run in a stored notebook, not one per step.
PROGRESS_INTERVAL = 10.0


@dataclass(frozen=True)
class Profile:
    """Sizes for one kind of machine. ``cpu`` is what CI runs (a notebook in about 4 minutes on 2 cores);
    ``gpu`` uses a bigger model and more steps on one CUDA device."""

    name: str
    device: str
    dense: dict  # kwargs of models.tiny_dense
    moe: dict  # kwargs of models.tiny_moe
    sft_steps: int  # the warm start's schedule length and most steps (it stops earlier at its target)
    sft_target_accuracy: float  # sampled (T = 1) accuracy on the validation rows at which the warm start stops
    sft_batch_size: int
    sft_lr: float
    rl_steps: int  # default RL steps of the main job
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    eval_size: int  # held-out prompts used for evaluation


PROFILES = {
    "cpu": Profile(name="cpu", device="cpu", dense=dict(hidden_size=128, num_layers=4, num_heads=4),
                   moe=dict(hidden_size=128, num_layers=4, num_heads=4), sft_steps=500, sft_target_accuracy=0.35,
                   sft_batch_size=64,
                   sft_lr=2e-3, rl_steps=150, prompts_per_step=16, group_size=8, max_new_tokens=40, eval_size=256),
    "gpu": Profile(name="gpu", device="cuda", dense=dict(hidden_size=256, num_layers=6, num_heads=8),
                   moe=dict(hidden_size=256, num_layers=6, num_heads=8, num_experts=16), sft_steps=800,
                   sft_target_accuracy=0.35,
                   sft_batch_size=128, sft_lr=1e-3, rl_steps=200, prompts_per_step=32, group_size=16,
                   max_new_tokens=40, eval_size=256),
}


def resolve_profile(name: str | None = None) -> Profile:
    """The profile to use: ``name`` if given, else the MINIRL_PROFILE environment variable, else "gpu" when CUDA
    is available and "cpu" otherwise.

    Raises:
        ValueError: for an unknown profile name, or "gpu" without a CUDA device.
    """
    name = name or os.environ.get("MINIRL_PROFILE") or ("gpu" if torch.cuda.is_available() else "cpu")
    choice("profile", name, PROFILES)
    if name == "gpu" and not torch.cuda.is_available():
        raise ValueError("profile 'gpu' needs a CUDA device; use profile 'cpu'")
    return PROFILES[name]


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA): the same seed on the same machine gives the same numbers."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class RLConfig:
    """Every switch of the RL loop. Presets for each algorithm live in ``ALGORITHMS``; see ``make_config``."""

    algo: str = "grpo"  # name of the preset this config came from (informational)
    seed: int = 0  # seeds prompt order, sampling and initialisation of the critic
    steps: int = 60  # RL steps (one rollout each)
    prompts_per_step: int = 8  # prompts per rollout; the batch is prompts_per_step * group_size completions
    group_size: int = 8  # G, completions per prompt
    max_new_tokens: int = 40  # completion budget (L_max of DAPO's overlong shaping); with an environment, per turn
    max_turns: int = 1  # model turns of a multi-turn episode (train_rl's env_factory; multiturn.py); 1: one turn
    mask_observations: bool = True  # multi-turn: the environment's tokens carry no loss (False reproduces the bug
    # of training on them, for the positive control of lesson 14; no engine offers it)
    temperature: float = 1.0  # sampling temperature, also used for every log-prob
    lr: float = 1e-4  # policy learning rate (AdamW); the tiny models collapse from about 3e-4 up
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # gradient clipping of the policy (and critic)
    num_iterations: int = 1  # epochs over each rollout (GRPO's mu)
    num_minibatches: int = 2  # optimiser steps per epoch (split by groups); > 1 makes later ratios differ from 1
    micro_batch_size: int | None = None  # rows per forward/backward (gradient accumulation); None: the minibatch
    # --- advantages
    advantage: str = "group"  # "group" (GRPO family, scaled by adv_scale), "rloo" (leave-one-out), "reinforce_pp"
    # (batch normalisation), "reinforce_pp_baseline" (group mean, then batch normalisation), "maxrl" ((r - mean) /
    # mean, 0/1 rewards: MaxRL, Tajwar et al. 2026) or "gae" (PPO, critic)
    adv_scale: str = "group"  # for advantage="group": "group" std, "batch" std, or "none" (Dr. GRPO); the other
    # outcome estimators carry their own scaling and need "none"
    adv_eps: float = 1e-4
    multi_objective_aggregation: str = "sum_then_normalize"  # several reward functions: summed, then the advantage;
    # or "normalize_then_sum" (GDPO: each normalised in its group, weighted sum, batch-normalised; TRL's name)
    whiten_advantages: bool = True  # PPO: whiten GAE advantages over the batch
    gamma: float = 1.0  # PPO discount
    lam: float = 0.95  # GAE lambda
    # --- policy loss
    level: str = "token"  # "token", "sequence" (GSPO) or "sequence-token" (GSPO-token)
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    agg: str = "seq-mean-token-mean"  # see aggregation.AGGREGATIONS
    loss_mode: str = "clip"  # losses.LOSS_MODES: PPO's clip (at `level`), "cispo", "sapo" or "gmpo" (token level)
    cispo_form: str = "two-sided"  # CISPO: clip(r, 1 - eps_low, 1 + eps_high), or "one-sided" min(r, 1 + eps_high)
    tau_pos: float = 1.0  # SAPO's gate temperature for A > 0
    tau_neg: float = 1.05  # SAPO's gate temperature for A <= 0
    dppo_cap: float = 20.0  # DPPO (loss_mode "dppo_tv" / "dppo_kl", eps_low / eps_high its deltas): the cap C on the
    # detached ratio pi / pi_old (verl's clip_ratio_c; 20, the paper's advice of a large cap)
    sampler_kl_tau: float = 0.0  # Kimi K2.5's tau (log pi - log mu)^2 per token against the SAMPLER mu (prime-rl's
    # kl_tau, 1e-3), added to the policy loss and aggregated like it; 0: off
    # --- entropy controls (entropy_control.py; all off by default, TRL's / verl's names in interop/)
    entropy_coef: float = 0.0  # the bonus -coef * mean token entropy (TRL entropy_coef; the adaptive start value)
    adaptive_entropy: bool = False  # Skywork-OR1's controller toward entropy_target (TRL use_adaptive_entropy)
    entropy_target: float = 0.2  # nats per token, at or below which the adaptive bonus acts
    entropy_coef_delta: float = 0.005  # the controller's step per optimiser step
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    top_entropy_quantile: float = 1.0  # train only the top-rho entropy tokens (Wang et al. 2025; 1: every token)
    cov_mode: str = "none"  # "clip_cov" / "kl_cov" (Cui et al. 2025, verl's loss modes) replace the token clip
    cov_fraction: float = 2e-4  # share of tokens Clip-Cov stops / KL-Cov penalises (verl clip_cov_ratio, kl_cov_ratio)
    clip_cov_low: float = 1.0  # Clip-Cov's covariance band (verl clip_cov_lb, clip_cov_ub)
    clip_cov_high: float = 5.0
    kl_cov_coef: float = 1.0  # KL-Cov's penalty weight (the paper's 1; verl's ppo_kl_coef, default 0.1)
    log_covariance: bool = False  # log the batch Cov(log pi, A) ("covariance") even with every control off
    # --- KL to the reference
    beta: float = 0.0  # KL coefficient; 0 disables the reference model
    kl_estimator: str = "k3"  # "k1", "k2" or "k3"
    kl_placement: str = "loss"  # "loss" (differentiated) or "reward" (detached, reward-to-go)
    adaptive_kl: bool = False  # PPO's adaptive controller (Ziegler et al. 2019) instead of a fixed beta
    target_kl: float = 0.05  # nats per sequence, for the adaptive controller
    kl_horizon: int = 1000  # samples, for the adaptive controller
    ref_reset_every: int = 0  # copy the policy into the reference after every k-th step (TRL sync_ref_model with
    # ref_model_mixup_alpha 1, ref_model_sync_steps k); 0: the reference stays the starting policy
    # --- distillation (distill_loop.py): a teacher grades the student's tokens; "none" is the RL loop itself
    distill: str = "none"  # DISTILL_OBJECTIVES: "reverse_kl" (the sampled per-token reward), "full_reverse_kl" (the
    # exact KL over the vocabulary at each visited position) or "sft" (the NLL of the teacher's samples)
    distill_gamma: float = 0.0  # discount of the reverse-KL reward to go (0: Tinker's, each token its own reward)
    distill_coef: float = 1.0  # weight of the teacher's term
    task_coef: float = 0.0  # weight of the task score's group advantage beside the teacher (> 0: the mix)
    distill_teacher: str = "external"  # DISTILL_TEACHERS: the teacher model passed in, or self-distillation: the
    # student behind the dataset's completion ("self_demonstration", SDFT) or its best-scored sibling
    # ("self_best_sibling", SDPO), with distill "reverse_kl" or "full_reverse_kl"
    # --- DAPO
    dynamic_sampling: bool = False  # keep only groups with non-identical accuracy, over-sampling to fill the batch
    gen_prompts_per_round: int | None = None  # prompts per generation round when over-sampling (None: prompts_per_step)
    max_gen_batches: int = 4  # rounds before dynamic sampling gives up with an error
    allow_partial_batch: bool = False  # when rounds run out, train on the groups found instead of raising
    overlong_shaping: bool = False  # add rewards.overlong_penalty to the task reward
    overlong_cache_len: int = 8  # L_cache of the penalty ramp
    overlong_filter: bool = False  # mask the loss of truncated completions
    # --- PPO critic
    value_lr: float = 1e-3  # the critic's learning rate: its own parameter group in the one AdamW (no vf_coef:
    # the critic shares no parameter with the policy, so under Adam a loss coefficient would be nearly a no-op)
    value_clip: float | None = 0.2
    # --- MoE
    routing_replay: bool = False  # record the rollout's experts and force them in training forwards
    replay_source: str = "trainer"  # routing replay's routes: "trainer" (R2: pi_old's recomputing forward) or
    # "sampler" (R3: the experts the sampler used while decoding, Ma et al. 2025)
    # --- a sampler that is not the trainer (inference_engine.py, importance.py); the defaults change nothing
    sampler_dtype: str = "float32"  # "float32" (the trainer itself), "bfloat16" or "float16" (a copy, synced)
    sampler_logit_noise: float = 0.0  # std (nats) of noise on the sampler's next-token logits
    sampler_router_noise: float = 0.0  # std of noise on the sampler's MoE router logits
    pi_old: str = "recomputed"  # importance.PI_OLD: the trainer's recomputed pi_old, or "naive" (the sampler's)
    is_correction: str = "none"  # importance.CORRECTIONS: "none", "token_tis", "token_mis", "seq_tis", "seq_mis"
    is_cap: float = 2.0  # C of TIS / C_max of MIS, on the weight pi_old / sampler (Yao et al.: 2; TRL's default 3)
    is_cap_low: float | None = None  # optional C_min: TIS raises weights to it, MIS masks those below it
    is_seq_form: str = "product"  # the sequence weight: "product" of token ratios (TRL, verl) or "geomean"
    # --- stale and truncated samplers (truncation.py, stale_corrections.py, rl_offpolicy.py); the defaults change
    # nothing
    top_k: int = 0  # the rollouts' top-k (0: off); the kept sets are recorded per token (Rollout.kept)
    top_p: float = 1.0  # the rollouts' nucleus mass (1.0: off); evaluation always samples the full distribution
    keep_sampling_mask: bool = False  # renormalise the trainer's log-probs over the sampler's kept sets
    # (DeepSeek-V3.2); off, they are the full vocabulary's and pi_old / mu = S, the kept mass, before any update
    sampler_sync_every: int = 1  # the sampler reloads the weights every k steps: k > 1 is a stale copy, up to
    # (k - 1) x num_minibatches x num_iterations updates behind (asynchronous RL); 1: synced after every step
    off_policy_mask_threshold: float | None = None  # drop A < 0 sequences whose mean log(mu / pi) exceeds it
    kl_ratio_weighted: bool = False  # the KL in the loss is (pi / pi_old) k3 (TRL's use_bias_correction_kl)
    router_aux_loss_coef: float = 0.0  # weight of the router's load-balancing loss (moe.load_balancing_loss) in the
    # objective; 0 (default) leaves it out. TRL's router_aux_loss_coef; the MoE model's own config says 0.001
    # --- a real model (precision.py, memory.py); the defaults are the toy's exact float32 loop
    precision: str = "fp32"  # precision.PRECISIONS: "fp32"; "bf16-autocast" (float32 master weights and AdamW state,
    # forwards under bfloat16 autocast); "bf16" (bfloat16 weights and state, no master copy: small updates round away)
    gradient_checkpointing: bool = False  # recompute each decoder layer in the backward (less activation memory)
    generation_batch_size: int | None = None  # rows per decode loop (its KV cache holds this many); None: all rows
    logprob_batch_size: int | None = None  # rows per no-grad log-prob forward (pi_old, reference); None: all rows
    completion_only_head: bool = False  # the update's LM head on completion positions only (logits_to_keep): saves
    # (b, P, V) logits at real vocabularies; off by default because its gradient differs by round-off (the matmul's
    # shape), which would move the toy's stored figures. The no-grad forwards always keep only the completion's logits
    lora_rank: int = 0  # LoRA (lora.py, peft: the [lora] extra): the adapter's rank r; 0 trains every weight
    lora_alpha: float = 32.0  # the adapter's output is scaled by lora_alpha / lora_rank
    lora_target_modules: str = "all-linear"  # "all-linear" (attention and MLP, never the head) or "q_proj,v_proj"
    # --- logging and checkpoints
    checkpoint_every: int = 0  # save a checkpoint every N steps under train_rl's output_dir (0: none; checkpoint.py)
    report_to: str = "none"  # "tensorboard": every History row also as scalars under output_dir/tensorboard
    eval_every: int = 0  # evaluate on the held-out split every N steps (0: only before and after)
    eval_samples_per_prompt: int = 1
    eval_pass_at_k: tuple[int, ...] = ()  # log eval_pass_at_<k> for each k (<= eval_samples_per_prompt; 0/1 rewards)
    progress: bool = True  # tqdm bar

    def policy_loss_settings(self) -> dict:
        """This config's values of ``losses.SETTINGS``: the keyword arguments that pick and shape the policy loss."""
        return {name: getattr(self, name) for name in losses.SETTINGS}

    def policy_loss_kwargs(self) -> dict:
        """Every keyword argument ``losses.policy_loss`` takes from the config (the loop adds the minibatch's
        denominator and the importance weights): ``policy_loss_settings`` plus Dr. GRPO's constant normaliser,
        the generation budget. The one place a config becomes a loss, so a new loss mode never touches rl.py."""
        return {**self.policy_loss_settings(), "max_tokens": self.max_new_tokens}

    def validate(self, *, loop: str | None = None) -> None:
        """Raise ValueError naming the field for any invalid setting; ``loop="rl"`` (``rl.train_rl``) also refuses a
        distillation objective, which only ``distill_loop.train_distill`` (with its teacher) runs."""
        choice("advantage", self.advantage, ("group", "gae", *advantages.ESTIMATORS))
        self.validate_trust_region()
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns must be an int >= 1, got {self.max_turns!r}")
        choice("adv_scale", self.adv_scale, advantages.SCALES)
        if self.advantage in advantages.ESTIMATORS and self.adv_scale != "none":
            raise ValueError(f"adv_scale={self.adv_scale!r} applies to advantage='group' only; "
                             f"advantage={self.advantage!r} has its own scaling: set adv_scale='none'")
        if self.advantage in advantages.ESTIMATORS and self.beta > 0 and self.kl_placement == "reward":
            raise ValueError(f"kl_placement='reward' is implemented for advantage='group' and 'gae' (the KL "
                             f"penalty-to-go), not for {self.advantage!r}: use kl_placement='loss' or beta=0")
        choice("multi_objective_aggregation", self.multi_objective_aggregation, advantages.AGGREGATIONS)
        kl_in_reward = self.beta > 0 and self.kl_placement == "reward"
        if self.multi_objective_aggregation == "normalize_then_sum" and (
                self.advantage != "group" or self.adv_scale != "group" or kl_in_reward):
            raise ValueError("multi_objective_aggregation='normalize_then_sum' (GDPO) is its own group-then-batch "
                             "normalisation: it needs advantage='group', adv_scale='group' (not read, as TRL ignores "
                             "scale_rewards) and no KL penalty in the reward")
        choice("kl_estimator", self.kl_estimator, kl.ESTIMATORS)
        choice("kl_placement", self.kl_placement, kl.PLACEMENTS)
        choice("replay_source", self.replay_source, ("trainer", "sampler"))
        choice("sampler_dtype", self.sampler_dtype, ("float32", "bfloat16", "float16"))
        rl_offpolicy.check_settings(self)
        choice("precision", self.precision, PRECISIONS)
        choice("report_to", self.report_to, REPORT_TO)
        if self.lora_rank < 0 or not self.lora_alpha > 0:
            raise ValueError(f"need lora_rank >= 0 (0: no LoRA) and lora_alpha > 0, got {self.lora_rank}, "
                             f"{self.lora_alpha}")
        lora_target_modules(self.lora_target_modules)  # raises for an empty list
        if self.lora_rank and self.advantage == "gae":
            raise ValueError("lora_rank > 0 with advantage='gae': PPO's critic copies the policy's backbone, which "
                             "under LoRA carries the adapter; train PPO without LoRA, or use a critic-free preset")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 (0: no checkpoints), got {self.checkpoint_every}")
        for name in ("micro_batch_size", "generation_batch_size", "logprob_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {getattr(self, name)}")
        if self.sampler_logit_noise < 0 or self.sampler_router_noise < 0:
            raise ValueError(f"sampler_logit_noise and sampler_router_noise must be >= 0, got "
                             f"{self.sampler_logit_noise} and {self.sampler_router_noise}")
        if self.routing_replay and self.replay_source == "trainer" and self.pi_old == "naive":
            raise ValueError("routing_replay with replay_source='trainer' (R2) records the routes of pi_old's "
                             "recomputing forward, which pi_old='naive' skips: use replay_source='sampler' (R3)")
        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "num_iterations",
                     "num_minibatches", "max_gen_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.advantage in ("group", "rloo", "reinforce_pp_baseline") and self.group_size < 2:
            raise ValueError(f"advantage={self.advantage!r} needs group_size >= 2, got {self.group_size}")
        if self.prompts_per_step % self.num_minibatches:
            raise ValueError(f"prompts_per_step={self.prompts_per_step} must be divisible by "
                             f"num_minibatches={self.num_minibatches} (minibatches split the rollout by groups)")
        if self.beta < 0 or self.temperature <= 0 or self.lr <= 0:
            raise ValueError(f"need beta >= 0, temperature > 0, lr > 0; got {self.beta}, {self.temperature}, "
                             f"{self.lr}")
        losses.check_settings(**self.policy_loss_settings())  # the loss's own rules, in one place
        entropy_control.check_config(self)
        if any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.eval_samples_per_prompt
               for k in self.eval_pass_at_k):
            raise ValueError(f"eval_pass_at_k must hold ints in [1, eval_samples_per_prompt="
                             f"{self.eval_samples_per_prompt}], got {self.eval_pass_at_k}")
        choice("pi_old", self.pi_old, importance.PI_OLD)
        choice("is_correction", self.is_correction, importance.CORRECTIONS)
        choice("is_seq_form", self.is_seq_form, importance.SEQ_FORMS)
        if not 0 < self.is_cap <= importance.MAX_CAP:
            raise ValueError(f"is_cap must be in (0, e^20], got {self.is_cap}")
        if self.is_cap_low is not None and not 0 < self.is_cap_low < self.is_cap:
            raise ValueError(f"is_cap_low must be None or in (0, is_cap={self.is_cap}), got {self.is_cap_low}")
        if self.is_correction in importance.TOKEN_CORRECTIONS and losses.one_term_per_sequence(
                level=self.level, loss_mode=self.loss_mode):
            raise ValueError(f"is_correction={self.is_correction!r} weighs each token, but level={self.level!r} with "
                             f"loss_mode={self.loss_mode!r} has one term per sequence (GSPO, GMPO): use a sequence "
                             f"correction ('seq_tis' or 'seq_mis') or 'none'")
        if self.pi_old == "naive" and self.is_correction != "none":
            raise ValueError(f"is_correction={self.is_correction!r} with pi_old='naive': the weight pi_old / sampler "
                             f"would be exactly 1 (pi_old is the sampler's); use pi_old='recomputed'")
        if not (self.router_aux_loss_coef >= 0 and math.isfinite(self.router_aux_loss_coef)):
            raise ValueError(f"router_aux_loss_coef must be a finite number >= 0, got {self.router_aux_loss_coef}")
        if self.gen_prompts_per_round is not None and self.gen_prompts_per_round < 1:
            raise ValueError(f"gen_prompts_per_round must be >= 1 or None, got {self.gen_prompts_per_round}")
        self.validate_distill()
        if loop == "rl" and self.distill != "none":
            raise ValueError(f"distill={self.distill!r} needs a teacher: run distill_loop.train_distill(..., "
                             f"teacher=), not rl.train_rl")
        if self.overlong_shaping and not 0 < self.overlong_cache_len <= self.max_new_tokens:
            raise ValueError(f"overlong_cache_len must be in (0, max_new_tokens={self.max_new_tokens}], "
                             f"got {self.overlong_cache_len}")

    def validate_trust_region(self) -> None:
        """The rules of the 2026 trust-region switches: the Kimi term's tau, the reference reset (it needs a
        reference to reset: beta > 0, and no LoRA, whose reference is the base model with the adapter off)."""
        if not (math.isfinite(self.sampler_kl_tau) and self.sampler_kl_tau >= 0):
            raise ValueError(f"sampler_kl_tau must be a finite number >= 0 (0: off), got {self.sampler_kl_tau}")
        if isinstance(self.ref_reset_every, bool) or not isinstance(self.ref_reset_every, int) \
                or self.ref_reset_every < 0:
            raise ValueError(f"ref_reset_every must be an int >= 0 (0: never), got {self.ref_reset_every!r}")
        if self.ref_reset_every and (self.beta == 0 or self.lora_rank):
            raise ValueError(f"ref_reset_every={self.ref_reset_every} copies the policy into the reference: it needs "
                             f"beta > 0 (with beta 0 no reference is held) and lora_rank 0 (under LoRA the reference "
                             f"is the base with the adapter off, which a copy would overwrite); got beta={self.beta}, "
                             f"lora_rank={self.lora_rank}")

    def validate_distill(self) -> None:
        """The distillation fields' rules (``distill_loop.train_distill``): one optimiser step per rollout, no
        reference KL, no task reward for SFT on the teacher's samples, and no distillation field set without
        ``distill``."""
        choice("distill", self.distill, DISTILL_OBJECTIVES)
        choice("distill_teacher", self.distill_teacher, DISTILL_TEACHERS)
        if self.distill_teacher != "external" and self.distill not in ("reverse_kl", "full_reverse_kl"):
            raise ValueError(f"distill_teacher={self.distill_teacher!r} grades the student's own samples: it needs "
                             f"distill 'reverse_kl' or 'full_reverse_kl', got {self.distill!r}")
        if self.distill == "none":
            if (self.distill_gamma, self.distill_coef, self.task_coef) != (0.0, 1.0, 0.0):
                raise ValueError(f"distill_gamma, distill_coef and task_coef apply with a teacher (distill != 'none'); "
                                 f"got {self.distill_gamma}, {self.distill_coef}, {self.task_coef} with distill='none'")
            return
        if self.num_iterations != 1 or self.num_minibatches != 1:
            raise ValueError(f"distill={self.distill!r} takes one optimiser step per rollout (on-policy): set "
                             f"num_iterations=1 and num_minibatches=1, got {self.num_iterations} and "
                             f"{self.num_minibatches}")
        if self.beta > 0 or self.dynamic_sampling or self.advantage != "group":
            raise ValueError(f"distill={self.distill!r}: the teacher replaces the reference (beta must be 0), and the "
                             f"mix's task advantage is GRPO's (advantage='group', no dynamic sampling)")
        if not 0.0 <= self.distill_gamma <= 1.0 or self.distill_coef < 0 or self.task_coef < 0:
            raise ValueError(f"need distill_gamma in [0, 1], distill_coef >= 0, task_coef >= 0; got "
                             f"{self.distill_gamma}, {self.distill_coef}, {self.task_coef}")
        unread = [name for name in DISTILL_UNREAD if getattr(self, name) != RLConfig.__dataclass_fields__[name].default]
        if unread:
            raise ValueError(f"distill={self.distill!r}: the distillation loop does not read {unread}; leave them at "
                             f"their defaults")
        if self.distill == "sft" and self.task_coef > 0:
            raise ValueError("distill='sft' trains on the teacher's samples: a task reward on them is not the "
                             "student's (task_coef must be 0)")


# One row per algorithm: the switches it changes relative to the RLConfig defaults, with the paper each value comes
# from (beta and lengths scaled to the tiny task). The same algorithms in TRL and verl:
# ``interop.engine_equivalents()``, printed by ``python -m minirl.interop``.
ALGORITHMS: dict[str, dict] = {
    # PPO, Schulman et al. 2017; RLHF form: Ziegler et al. 2019, Ouyang et al. 2022 (critic, GAE, k1 in the reward)
    "ppo": dict(advantage="gae", agg="token-mean", eps_low=0.2, eps_high=0.2, beta=0.05, kl_estimator="k1",
                kl_placement="reward", whiten_advantages=True),
    # GRPO, Shao et al. 2024 (DeepSeekMath): group mean/std, k3 in the loss with beta 0.04, per-sequence token mean
    "grpo": dict(advantage="group", adv_scale="group", agg="seq-mean-token-mean", eps_low=0.2, eps_high=0.2,
                 beta=0.04, kl_estimator="k3", kl_placement="loss"),
    # Dr. GRPO, Liu et al. 2025: no std division AND a constant normaliser; no KL
    "dr_grpo": dict(advantage="group", adv_scale="none", agg="seq-mean-token-sum-norm", eps_low=0.2, eps_high=0.2,
                    beta=0.0),
    # DAPO, Yu et al. 2025: clip-higher, dynamic sampling, token-level loss, overlong shaping; no KL
    "dapo": dict(advantage="group", adv_scale="group", agg="token-mean", eps_low=0.2, eps_high=0.28, beta=0.0,
                 dynamic_sampling=True, overlong_shaping=True, overlong_filter=False),
    # GSPO, Zheng et al. 2025: sequence-level geometric-mean ratio, clip 3e-4 / 4e-4; no KL
    "gspo": dict(advantage="group", adv_scale="group", level="sequence", agg="seq-mean-token-mean", eps_low=3e-4,
                 eps_high=4e-4, beta=0.0),
    # GSPO-token, Zheng et al. 2025, eq. 13: GSPO's value and gradient for per-sequence advantages
    "gspo_token": dict(advantage="group", adv_scale="group", level="sequence-token", agg="seq-mean-token-mean",
                       eps_low=3e-4, eps_high=4e-4, beta=0.0),
    # CISPO, MiniMax 2025 (MiniMax-M1, arXiv 2506.13585, eq. 4-5): REINFORCE with a detached weight capped above,
    # no lower bound in practice (one-sided), token-mean; the cap 1 + 4 = 5 is ScaleRL's (arXiv 2510.13786) and
    # TRL's suggested epsilon_high; no KL
    "cispo": dict(advantage="group", adv_scale="group", loss_mode="cispo", cispo_form="one-sided", agg="token-mean",
                  eps_low=0.2, eps_high=4.0, beta=0.0),
    # SAPO, Gao et al. 2025 (arXiv 2511.20347, eq. 5-6): soft gate, tau_pos 1.0 / tau_neg 1.05, GRPO's aggregation
    "sapo": dict(advantage="group", adv_scale="group", loss_mode="sapo", tau_pos=1.0, tau_neg=1.05,
                 agg="seq-mean-token-mean", beta=0.0),
    # GMPO, Zhao et al. 2025 (arXiv 2507.20673, eq. 4): geometric mean of token ratios clipped in log space to
    # (e^-0.4, e^0.4), one term per sequence; no KL
    "gmpo": dict(advantage="group", adv_scale="group", loss_mode="gmpo", agg="seq-mean-token-mean", eps_low=0.4,
                 eps_high=0.4, beta=0.0),
    # RLOO, Ahmadian et al. 2024 (after Kool et al. 2019): leave-one-out baseline, no std; the completion is one
    # action (seq-mean-token-sum: -A_i * sum_t log pi), one optimiser step per rollout, so the ratio stays 1 and
    # the clip never acts: plain REINFORCE. The paper's KL penalty sits in the reward; here it is off (beta 0)
    "rloo": dict(advantage="rloo", adv_scale="none", agg="seq-mean-token-sum", num_minibatches=1, beta=0.0),
    # REINFORCE++, Hu et al. 2025: global batch normalisation of the rewards, no group baseline, PPO's token clip
    "reinforce_pp": dict(advantage="reinforce_pp", adv_scale="none", agg="token-mean", eps_low=0.2, eps_high=0.2,
                         beta=0.0),
    # REINFORCE++ w/ baseline, Hu et al. 2025: group mean subtracted, then batch normalisation
    "reinforce_pp_baseline": dict(advantage="reinforce_pp_baseline", adv_scale="none", agg="token-mean",
                                  eps_low=0.2, eps_high=0.2, beta=0.0),
    # GRPO without a reference, as GLM-5, Kimi K3 and TMax report training (2026): beta 0, so train_rl holds no
    # reference model (no second copy of the weights in memory) and logs no kl_ref
    "grpo_no_ref": dict(advantage="group", adv_scale="group", agg="seq-mean-token-mean", eps_low=0.2, eps_high=0.2,
                        beta=0.0),
}


def make_config(algo: str = "grpo", **overrides) -> RLConfig:
    """An ``RLConfig`` for a preset of ``ALGORITHMS``, with any field overridden.

    Raises:
        ValueError: for an unknown algorithm or field, or an invalid setting.
    """
    choice("algorithm", algo, ALGORITHMS)
    fields = {f.name for f in dataclasses.fields(RLConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown RLConfig field(s) {sorted(unknown)}")
    cfg = RLConfig(**{**ALGORITHMS[algo], **overrides, "algo": algo})
    cfg.validate()
    return cfg


def algorithms_table(names: list[str] | None = None) -> str:
    """The ALGORITHMS presets as a markdown table: one row per preset, one column for every switch that some preset
    sets, in RLConfig's field order, so no preset's difference is hidden (SAPO's temperatures, CISPO's form included).

    Args:
        names: presets to compare (default all). Given, the table is turned: one column per preset, one row per switch
            on which they differ, so a lesson shows only what separates the algorithms it teaches.

    Raises:
        ValueError: if a name is not a preset.
    """
    used = {key for switches in ALGORITHMS.values() for key in switches}
    keys = [f.name for f in dataclasses.fields(RLConfig) if f.name in used]
    if names is not None:
        unknown = [n for n in names if n not in ALGORITHMS]
        if unknown:
            raise ValueError(f"names: {unknown} are not presets; expected some of {list(ALGORITHMS)}")
        configs = {n: make_config(n) for n in names}
        rows = ["| switch | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for k in keys:
            values = [str(getattr(c, k)) for c in configs.values()]
            if len(set(values)) > 1:
                rows.append(f"| {k} | " + " | ".join(values) + " |")
        return "\n".join(rows)
    rows = ["| algo | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name in ALGORITHMS:
        c = make_config(name)
        rows.append(f"| {name} | " + " | ".join(str(getattr(c, k)) for k in keys) + " |")
    return "\n".join(rows)
