"""Profiles, the SFT warm start, RLConfig with the ALGORITHMS table, the one RL loop, evaluation and History.

Every RL algorithm of minirl runs through ``train_rl``'s five stages (rollout, reward, advantages, optimise, log);
what differs between PPO, GRPO, Dr. GRPO, DAPO, GSPO and GSPO-token is a handful of switches in ``RLConfig``,
collected in ``ALGORITHMS`` so the differences can be read at a glance.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm  # plain text bars: no widget warnings in notebooks

from . import advantages as adv
from . import kl as kl_mod
from . import losses, models, rewards, rollout, sampling, tasks
from . import preference as pref
from ._checks import choice
from .moe import record_routing, replay_routing
from .tokenizer import build_tokenizer

#: Seconds between progress-bar refreshes: a few lines per run in a stored notebook, not one per step.
PROGRESS_INTERVAL = 10.0

CACHE_DIR = Path(os.environ.get("MINIRL_CACHE", Path(__file__).resolve().parent.parent / ".cache"))


# --------------------------------------------------------------------------------------------------- profiles
@dataclass(frozen=True)
class Profile:
    """Sizes for one kind of machine. ``cpu`` is what CI runs (a notebook in about 4 minutes on 2 cores);
    ``gpu`` uses a bigger model and more steps on one CUDA device."""

    name: str
    device: str
    dense: dict  # kwargs of models.tiny_dense
    moe: dict  # kwargs of models.tiny_moe
    sft_steps: int  # warm-start optimiser steps
    sft_batch_size: int
    sft_lr: float
    rl_steps: int  # default RL steps of the main job
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    eval_size: int  # held-out prompts used for evaluation


PROFILES = {
    "cpu": Profile(name="cpu", device="cpu", dense=dict(hidden_size=128, num_layers=4, num_heads=4),
                   moe=dict(hidden_size=128, num_layers=4, num_heads=4), sft_steps=200, sft_batch_size=64,
                   sft_lr=2e-3, rl_steps=150, prompts_per_step=16, group_size=8, max_new_tokens=40, eval_size=256),
    "gpu": Profile(name="gpu", device="cuda", dense=dict(hidden_size=256, num_layers=6, num_heads=8),
                   moe=dict(hidden_size=256, num_layers=6, num_heads=8, num_experts=16), sft_steps=600,
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


# ------------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model, tokenizer, dataset, max_new_tokens: int, temperature: float = 1.0, greedy: bool = False,
             samples_per_prompt: int = 1, batch_size: int = 256, seed: int | None = 0) -> dict:
    """Accuracy of the model on a split, sampled at ``temperature`` or greedy.

    Args:
        dataset: rows with prompt and answer (e.g. ``tasks.load_split("test")``).
        max_new_tokens: the completion budget.
        temperature: sampling temperature (ignored when greedy).
        greedy: argmax decoding.
        samples_per_prompt: completions per prompt when sampling (more gives a less noisy estimate).
        batch_size: prompts per generate call.
        seed: seeds torch before sampling so evaluations are repeatable (None: leave the RNG alone). The global
            RNG state is restored afterwards, so evaluating does not change the course of training.

    Returns:
        dict with accuracy, format_rate, mean_length (tokens, EOS included), truncated_rate and n.
    """
    k = 1 if greedy else samples_per_prompt
    correct = formatted = 0
    lengths, truncated = [], []
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    with torch.random.fork_rng():  # CPU and CUDA generators are restored on exit
        if seed is not None:
            torch.manual_seed(seed)
        for i in range(0, len(prompts), batch_size):
            r = rollout.generate(model, tokenizer, prompts[i:i + batch_size], k, max_new_tokens, temperature, greedy)
            for j, text in enumerate(r.completions):
                s = tasks.score(text, answers[i + j // k])
                correct += s.correct
                formatted += s.formatted
            lengths.append(r.lengths)
            truncated.append(r.truncated)
    n = len(prompts) * k
    return {"accuracy": correct / n, "format_rate": formatted / n, "mean_length": float(torch.cat(lengths).mean()),
            "truncated_rate": float(torch.cat(truncated).float().mean()), "n": n}


def _eval_metrics(model, tokenizer, eval_data, cfg, step: int) -> dict:
    """Held-out metrics the training loops log before training (step 0), every cfg.eval_every steps and at the end:
    accuracy sampled at cfg.temperature and greedy. {} without eval data or when ``step`` is not on that schedule."""
    due = step == 0 or step == cfg.steps or (cfg.eval_every and step % cfg.eval_every == 0)
    if eval_data is None or not due:
        return {}
    sampled = evaluate(model, tokenizer, eval_data, cfg.max_new_tokens, cfg.temperature,
                       samples_per_prompt=cfg.eval_samples_per_prompt, seed=cfg.seed)
    greedy = evaluate(model, tokenizer, eval_data, cfg.max_new_tokens, greedy=True)
    return {"eval_accuracy": sampled["accuracy"], "eval_greedy_accuracy": greedy["accuracy"],
            "eval_length": sampled["mean_length"], "eval_format": sampled["format_rate"]}


# ------------------------------------------------------------------------------------------------ SFT warm start
def sft_batch(tokenizer, prompts: Sequence[str], completions: Sequence[str]) -> dict:
    """Tokenise prompt + completion + EOS for teacher forcing; labels are -100 on the prompt and the padding.

    Returns:
        dict of input_ids, attention_mask, labels, each (B, L), right-padded.
    """
    rows, labels = [], []
    for p, c in zip(prompts, completions, strict=True):
        p_ids = tokenizer(p).input_ids  # <bos> + prompt
        c_ids = tokenizer(c, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(p_ids + c_ids)
        labels.append([-100] * len(p_ids) + c_ids)
    L = max(map(len, rows))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (L - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows])
    label_ids = torch.tensor([lab + [-100] * (L - len(lab)) for lab in labels])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": label_ids}


def sft(model, tokenizer, dataset, steps: int, batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
        progress: bool = True) -> list[float]:
    """Supervised fine-tuning on the reference completions (cross-entropy on completion tokens only).

    A short run gives the tiny model partial accuracy: enough that some samples of a group are right, which
    group-relative RL needs, and far enough from perfect that RL has room to show gains.

    Returns:
        The loss (nats per completion token) of every step.
    """
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))  # short warm-up
    model.train()
    losses_ = []
    for _ in tqdm(range(steps), desc="sft", disable=not progress, mininterval=PROGRESS_INTERVAL):
        idx = torch.randint(len(dataset), (batch_size,), generator=gen).tolist()
        rows = dataset.select(idx)
        batch = {k: v.to(device) for k, v in sft_batch(tokenizer, rows["prompt"], rows["completion"]).items()}
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses_.append(loss.item())
    return losses_


def warm_start(profile: Profile | str | None = None, seed: int = 0, moe: bool = False, steps: int | None = None,
               cache: bool = True, progress: bool = True):
    """The warm-started tiny model of a profile: built from config, SFT'd on the train split, cached on disk.

    The first call trains (about a minute on the cpu profile) and saves the model and tokenizer with
    ``save_pretrained`` under ``.cache/warmstart/<key>`` (git-ignored); later calls, from any notebook or the CLI,
    load them back with ``models.load``, the same code path as any Hugging Face checkpoint.

    Args:
        profile: a Profile or its name (default: ``resolve_profile()``).
        seed: initialisation and data-order seed.
        moe: the tiny MoE model instead of the dense one.
        steps: SFT steps (default: the profile's).
        cache: read and write the cache.

    Returns:
        (model, tokenizer, info) with info holding the SFT loss curve, the parameter count and the cache path.
    """
    profile = profile if isinstance(profile, Profile) else resolve_profile(profile)
    steps = profile.sft_steps if steps is None else steps
    sizes = profile.moe if moe else profile.dense
    spec = dict(kind="moe" if moe else "dense", sizes=sizes, steps=steps, bs=profile.sft_batch_size,
                lr=profile.sft_lr, seed=seed, version=1)
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    path = CACHE_DIR / "warmstart" / f"{spec['kind']}-{profile.name}-s{seed}-{key}"
    if cache and (path / "info.json").exists():
        tokenizer = build_tokenizer()
        model = models.load(str(path)).to(profile.device)
        info = json.loads((path / "info.json").read_text())
        return model, tokenizer, info
    tokenizer = build_tokenizer()
    build = models.tiny_moe if moe else models.tiny_dense
    model = build(tokenizer, seed=seed, **sizes).to(profile.device)
    t0 = time.time()
    curve = sft(model, tokenizer, tasks.load_split("train"), steps, profile.sft_batch_size, profile.sft_lr, seed,
                progress)
    info = {"spec": spec, "sft_loss": curve, "sft_seconds": time.time() - t0,
            "parameters": models.count_parameters(model), "path": str(path.relative_to(CACHE_DIR.parent))
            if CACHE_DIR.parent in path.parents else str(path)}
    if cache:
        path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        (path / "info.json").write_text(json.dumps(info))
    return model, tokenizer, info


# ------------------------------------------------------------------------------------------------ config
@dataclass
class RLConfig:
    """Every switch of the RL loop. Presets for each algorithm live in ``ALGORITHMS``; see ``make_config``."""

    algo: str = "grpo"  # name of the preset this config came from (informational)
    seed: int = 0  # seeds prompt order, sampling and initialisation of the critic
    steps: int = 60  # RL steps (one rollout each)
    prompts_per_step: int = 8  # prompts per rollout; the batch is prompts_per_step * group_size completions
    group_size: int = 8  # G, completions per prompt
    max_new_tokens: int = 40  # completion budget (L_max of DAPO's overlong shaping)
    temperature: float = 1.0  # sampling temperature, also used for every log-prob
    lr: float = 1e-4  # policy learning rate (AdamW); the tiny models collapse from about 3e-4 up
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # gradient clipping of the policy (and critic)
    num_iterations: int = 1  # epochs over each rollout (GRPO's mu)
    num_minibatches: int = 2  # optimiser steps per epoch (split by groups); > 1 makes later ratios differ from 1
    micro_batch_size: int | None = None  # rows per forward/backward (gradient accumulation); None: the minibatch
    # --- advantages
    advantage: str = "group"  # "group" (GRPO family) or "gae" (PPO, needs the critic)
    adv_scale: str = "group"  # group advantages: "group" std, "batch" std, or "none" (Dr. GRPO)
    adv_eps: float = 1e-4
    whiten_advantages: bool = True  # PPO: whiten GAE advantages over the batch
    gamma: float = 1.0  # PPO discount
    lam: float = 0.95  # GAE lambda
    # --- policy loss
    level: str = "token"  # "token", "sequence" (GSPO) or "sequence-token" (GSPO-token)
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None
    agg: str = "seq-mean-token-mean"  # see losses.AGGREGATIONS
    # --- KL to the reference
    beta: float = 0.0  # KL coefficient; 0 disables the reference model
    kl_estimator: str = "k3"  # "k1", "k2" or "k3"
    kl_placement: str = "loss"  # "loss" (differentiated) or "reward" (detached, reward-to-go)
    adaptive_kl: bool = False  # PPO's adaptive controller (Ziegler et al. 2019) instead of a fixed beta
    target_kl: float = 0.05  # nats per sequence, for the adaptive controller
    kl_horizon: int = 1000  # samples, for the adaptive controller
    # --- DAPO
    dynamic_sampling: bool = False  # keep only groups with non-identical accuracy, over-sampling to fill the batch
    gen_prompts_per_round: int | None = None  # prompts per generation round when over-sampling (None: prompts_per_step)
    max_gen_batches: int = 4  # rounds before dynamic sampling gives up with an error
    allow_partial_batch: bool = False  # when rounds run out, train on the groups found instead of raising
    overlong_shaping: bool = False  # add rewards.overlong_penalty to the task reward
    overlong_cache_len: int = 8  # L_cache of the penalty ramp
    overlong_filter: bool = False  # mask the loss of truncated completions
    # --- PPO critic
    value_lr: float = 1e-3
    value_clip: float | None = 0.2
    vf_coef: float = 1.0  # scales the value loss (the critic has its own optimiser; kept for readability)
    # --- MoE
    routing_replay: bool = False  # record the rollout's experts and force them in training forwards
    # --- logging
    eval_every: int = 0  # evaluate on the held-out split every N steps (0: only before and after)
    eval_samples_per_prompt: int = 1
    progress: bool = True  # tqdm bar

    def validate(self) -> None:
        """Raise ValueError naming the field for any invalid setting."""
        choice("advantage", self.advantage, ("group", "gae"))
        choice("adv_scale", self.adv_scale, adv.SCALES)
        choice("level", self.level, losses.LEVELS)
        choice("agg", self.agg, losses.AGGREGATIONS)
        choice("kl_estimator", self.kl_estimator, kl_mod.ESTIMATORS)
        choice("kl_placement", self.kl_placement, kl_mod.PLACEMENTS)
        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "num_iterations",
                     "num_minibatches", "max_gen_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.advantage == "group" and self.group_size < 2:
            raise ValueError(f"group advantages need group_size >= 2, got {self.group_size}")
        if self.prompts_per_step % self.num_minibatches:
            raise ValueError(f"prompts_per_step={self.prompts_per_step} must be divisible by "
                             f"num_minibatches={self.num_minibatches} (minibatches split the rollout by groups)")
        if self.beta < 0 or self.temperature <= 0 or self.lr <= 0:
            raise ValueError(f"need beta >= 0, temperature > 0, lr > 0; got {self.beta}, {self.temperature}, "
                             f"{self.lr}")
        if self.level == "sequence" and self.agg != "seq-mean-token-mean":
            raise ValueError("level='sequence' (GSPO) has one term per sequence: agg must be 'seq-mean-token-mean'")
        if self.gen_prompts_per_round is not None and self.gen_prompts_per_round < 1:
            raise ValueError(f"gen_prompts_per_round must be >= 1 or None, got {self.gen_prompts_per_round}")
        if self.overlong_shaping and not 0 < self.overlong_cache_len <= self.max_new_tokens:
            raise ValueError(f"overlong_cache_len must be in (0, max_new_tokens={self.max_new_tokens}], "
                             f"got {self.overlong_cache_len}")


# One row per algorithm: what it changes relative to the RLConfig defaults. Values from the papers, scaled to the
# tiny task where noted (beta, lengths). "trl" / "verl" name the equivalent settings in those engines.
ALGORITHMS: dict[str, dict] = {
    # Schulman et al. 2017; RLHF form: Ouyang et al. 2022 (critic, GAE, k1 KL in the reward)
    "ppo": dict(advantage="gae", agg="token-mean", eps_low=0.2, eps_high=0.2, beta=0.05, kl_estimator="k1",
                kl_placement="reward", whiten_advantages=True,
                trl="PPOTrainer(kl_coef=0.05, cliprange=0.2, vf_coef, gamma=1, lam=0.95)",
                verl="algorithm.adv_estimator=gae, algorithm.use_kl_in_reward=True, kl_penalty=kl"),
    # Shao et al. 2024 (DeepSeekMath): group mean/std, k3 in the loss with beta 0.04, per-sequence token mean
    "grpo": dict(advantage="group", adv_scale="group", agg="seq-mean-token-mean", eps_low=0.2, eps_high=0.2,
                 beta=0.04, kl_estimator="k3", kl_placement="loss",
                 trl="GRPOTrainer(beta=0.04, epsilon=0.2, loss_type='grpo', scale_rewards='group')",
                 verl="algorithm.adv_estimator=grpo, actor.use_kl_loss=True, kl_loss_type=low_var_kl, "
                      "loss_agg_mode=seq-mean-token-mean"),
    # Liu et al. 2025 (Dr. GRPO): no std division AND a constant normaliser; no KL
    "dr_grpo": dict(advantage="group", adv_scale="none", agg="seq-mean-token-sum-norm", eps_low=0.2, eps_high=0.2,
                    beta=0.0, trl="GRPOTrainer(loss_type='dr_grpo', scale_rewards='none', beta=0)",
                    verl="algorithm.norm_adv_by_std_in_grpo=False, loss_agg_mode=seq-mean-token-sum-norm"),
    # Yu et al. 2025 (DAPO): clip-higher, dynamic sampling, token-level loss, overlong shaping + filtering, no KL
    "dapo": dict(advantage="group", adv_scale="group", agg="token-mean", eps_low=0.2, eps_high=0.28, beta=0.0,
                 dynamic_sampling=True, overlong_shaping=True, overlong_filter=False,
                 trl="GRPOTrainer(loss_type='dapo', epsilon_high=0.28, mask_truncated_completions, beta=0)",
                 verl="clip_ratio_high=0.28, loss_agg_mode=token-mean, filter_groups.enable=True, "
                      "overlong_buffer.enable=True"),
    # Zheng et al. 2025 (GSPO): sequence-level geometric-mean ratio, clip 3e-4 / 4e-4, no KL
    "gspo": dict(advantage="group", adv_scale="group", level="sequence", agg="seq-mean-token-mean", eps_low=3e-4,
                 eps_high=4e-4, beta=0.0,
                 trl="GRPOTrainer(importance_sampling_level='sequence', epsilon=3e-4, epsilon_high=4e-4, beta=0)",
                 verl="policy_loss.loss_mode=gspo, clip_ratio_low=3e-4, clip_ratio_high=4e-4"),
    # GSPO-token (Zheng et al. 2025, eq. 13): same value and gradient as GSPO for per-sequence advantages
    "gspo_token": dict(advantage="group", adv_scale="group", level="sequence-token", agg="seq-mean-token-mean",
                       eps_low=3e-4, eps_high=4e-4, beta=0.0,
                       trl="GRPOTrainer(importance_sampling_level='sequence_token', epsilon=3e-4, epsilon_high=4e-4)",
                       verl="policy_loss.loss_mode=gspo (token form)"),
}
_NOTES = ("trl", "verl")


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
    preset = {k: v for k, v in ALGORITHMS[algo].items() if k not in _NOTES}
    cfg = RLConfig(**{**preset, **overrides, "algo": algo})
    cfg.validate()
    return cfg


def algorithms_table() -> str:
    """The ALGORITHMS presets as a markdown table of the switches that differ."""
    keys = ["advantage", "adv_scale", "level", "eps_low", "eps_high", "agg", "beta", "kl_estimator",
            "kl_placement", "dynamic_sampling", "overlong_shaping"]
    rows = ["| algo | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name in ALGORITHMS:
        c = make_config(name)
        rows.append(f"| {name} | " + " | ".join(str(getattr(c, k)) for k in keys) + " |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------ history
@dataclass
class History:
    """Per-step metrics of a run: a list of dicts, one per step (plus evaluation rows)."""

    rows: list[dict] = field(default_factory=list)

    def log(self, **metrics) -> None:
        self.rows.append(metrics)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the rows that have ``key``."""
        pts = [(r["step"], r[key]) for r in self.rows if key in r and r[key] is not None]
        return [s for s, _ in pts], [v for _, v in pts]

    def last(self, key: str):
        """The most recent value of ``key``."""
        vals = self.series(key)[1]
        if not vals:
            raise KeyError(f"no logged value for {key!r}")
        return vals[-1]

    def to_jsonl(self, path: str | Path) -> None:
        with open(path, "w") as f:
            for r in self.rows:
                f.write(json.dumps(r) + "\n")

    def to_csv(self, path: str | Path) -> None:
        keys = sorted({k for r in self.rows for k in r})
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)


# ------------------------------------------------------------------------------------------------ the RL loop
def adaptive_kl_beta(beta: float, observed_kl: float, target_kl: float, horizon: int, n_samples: int) -> float:
    """One update of PPO's adaptive KL controller: beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon.

    Source: Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences"), section 2.2, eq. 2.
    """
    error = max(-0.2, min(0.2, observed_kl / target_kl - 1))
    return beta * (1 + error * n_samples / horizon)


def _score(completions: Sequence[str], answers: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    scores = [tasks.score(c, a) for c, a in zip(completions, answers, strict=True)]
    return (torch.tensor([s.reward for s in scores]), torch.tensor([float(s.formatted) for s in scores]))


def _sample_prompts(train_data, n: int, gen: torch.Generator) -> tuple[list[str], list[str]]:
    idx = torch.randint(len(train_data), (n,), generator=gen).tolist()
    rows = train_data.select(idx)
    return list(rows["prompt"]), list(rows["answer"])


def _collect(model, tokenizer, cfg: RLConfig, train_data, gen: torch.Generator) -> tuple[rollout.Rollout, dict]:
    """Stage 1: a rollout of prompts_per_step groups, with dynamic sampling when switched on.
    Returns the rollout (with .answers attached) and generation metrics."""
    G = cfg.group_size

    def one_round(_i, n_prompts):
        prompts, answers = _sample_prompts(train_data, n_prompts, gen)
        r = rollout.generate(model, tokenizer, prompts, G, cfg.max_new_tokens, cfg.temperature)
        r.answers = [answers[i] for i in r.prompt_index.tolist()]
        acc, _ = _score(r.completions, r.answers)
        return acc, r

    if not cfg.dynamic_sampling:
        acc, r = one_round(0, cfg.prompts_per_step)
        signal = sampling.has_signal(acc, G)
        return r, {"gen_rounds": 1, "gen_samples": acc.numel(), "useful_groups": float(signal.float().mean()),
                   "useful_groups_in_batch": int(signal.sum())}
    per_round = cfg.gen_prompts_per_round or cfg.prompts_per_step
    ds = sampling.dynamic_sampling(lambda i: one_round(i, per_round), cfg.prompts_per_step, G, cfg.max_gen_batches,
                                   cfg.allow_partial_batch)
    if not ds.picks:
        raise RuntimeError("dynamic sampling kept no group at all; nothing to train on")
    parts = []
    for r, groups in ds.picks:
        sel = rollout.select_groups(r, groups)
        sel.answers = [r.answers[g * G + j] for g in groups for j in range(G)]
        parts.append(sel)
    batch = rollout.concat(parts, tokenizer.pad_token_id)
    batch.answers = [a for p in parts for a in p.answers]
    # useful_groups: share of GENERATED groups with signal (kept or not), as without dynamic sampling;
    # useful_groups_in_batch: groups with signal among those trained on (= prompts_per_step unless partial)
    return batch, {"gen_rounds": ds.rounds, "gen_samples": ds.samples,
                   "useful_groups": ds.groups_with_signal / max(ds.groups_seen, 1),
                   "useful_groups_in_batch": ds.groups_kept}


def train_rl(model, tokenizer, cfg: RLConfig, train_data, eval_data=None, ref_model=None, value_model=None,
             callback: Callable[[int, dict], None] | None = None) -> History:
    """Train ``model`` in place with the algorithm that ``cfg`` describes; return the per-step History.

    The five stages of every step:
      1. rollout: G completions per prompt, behaviour log-probs at the sampling temperature
      2. reward: task score (+ overlong shaping) (+ KL penalty when it lives in the reward)
      3. advantages: group-relative, or GAE with the critic
      4. optimise: epochs x minibatches of policy_loss (+ KL in the loss) (+ value loss) -> aggregate -> step
      5. log: one dict of metrics per step into History

    Args:
        model: the policy (a causal LM), trained in place.
        tokenizer: its tokenizer.
        cfg: an RLConfig (``make_config(algo, ...)``).
        train_data: a Dataset with prompt and answer columns.
        eval_data: optional held-out Dataset; accuracy (sampled at cfg.temperature, and greedy) is logged before
            training, every ``cfg.eval_every`` steps and at the end.
        ref_model: the frozen reference; default a copy of the policy at the start, made only when beta > 0.
        value_model: PPO's critic; default ``models.ValueModel(model)`` when cfg.advantage == "gae".
        callback: called as ``callback(step, metrics)`` after each step.

    Returns:
        History with one row per step (and the evaluation metrics on the rows where they were measured).

    Raises:
        ValueError: for an invalid config; RuntimeError when dynamic sampling runs out of rounds.
    """
    cfg.validate()
    set_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    device = next(model.parameters()).device
    G = cfg.group_size
    if cfg.routing_replay and not models.is_moe(model):
        raise ValueError("routing_replay=True needs an MoE model")
    if ref_model is None and cfg.beta > 0:
        ref_model = copy.deepcopy(model)
    if ref_model is not None:
        ref_model.eval().requires_grad_(False)
    if cfg.advantage == "gae" and value_model is None:
        value_model = models.ValueModel(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    value_opt = torch.optim.AdamW(value_model.parameters(), lr=cfg.value_lr) if value_model is not None else None
    beta = cfg.beta
    history = History()

    metrics0 = _eval_metrics(model, tokenizer, eval_data, cfg, step=0)
    if metrics0:
        history.log(step=0, **metrics0)
    for step in tqdm(range(1, cfg.steps + 1), desc=cfg.algo, disable=not cfg.progress,
                     mininterval=PROGRESS_INTERVAL):
        t_start = time.time()
        # 1. rollout ---------------------------------------------------------------------------------------------
        batch, gen_metrics = _collect(model, tokenizer, cfg, train_data, gen)
        P, mask = batch.n_prompt_tokens, batch.completion_mask  # mask (B, T)
        B = mask.shape[0]
        old_logprobs = batch.logprobs  # (B, T) behaviour log-probs at cfg.temperature
        routes = None
        with torch.no_grad():
            if cfg.routing_replay:  # record the experts of the behaviour forward on the final batch
                with record_routing(model) as routes:
                    old_logprobs = rollout.token_logprobs(model, batch.input_ids, batch.attention_mask, P,
                                                          cfg.temperature) * mask
            ref_logprobs = None
            if ref_model is not None:
                ref_logprobs = rollout.token_logprobs(ref_model, batch.input_ids, batch.attention_mask, P,
                                                      cfg.temperature) * mask
        t_gen = time.time() - t_start

        # 2. reward ----------------------------------------------------------------------------------------------
        accuracy, formatted = _score(batch.completions, batch.answers)  # (B,), (B,)
        scores = accuracy.clone()
        if cfg.overlong_shaping:
            scores = scores + rewards.overlong_penalty(batch.lengths, cfg.max_new_tokens, cfg.overlong_cache_len)
        scores = scores.to(device)
        token_rewards = rewards.token_level_rewards(scores, mask)  # (B, T) score on the last token
        kl_ref_tokens = None
        if ref_logprobs is not None:
            kl_ref_tokens = kl_mod.kl_estimate(old_logprobs, ref_logprobs, cfg.kl_estimator) * mask
            if beta > 0 and cfg.kl_placement == "reward":
                token_rewards = kl_mod.kl_in_reward(token_rewards, old_logprobs, ref_logprobs, beta,
                                                    cfg.kl_estimator) * mask

        # 3. advantages ------------------------------------------------------------------------------------------
        old_values = returns = None
        if cfg.advantage == "gae":
            with torch.no_grad():
                old_values = models.token_values(value_model, batch.input_ids, batch.attention_mask, P) * mask
            advantages, returns = adv.gae(token_rewards, old_values, mask, cfg.gamma, cfg.lam)
            if cfg.whiten_advantages:
                advantages = adv.whiten(advantages, mask)
        elif beta > 0 and cfg.kl_placement == "reward":
            penalties = beta * kl_mod.kl_estimate(old_logprobs, ref_logprobs, cfg.kl_estimator)  # (B, T), no grad
            advantages = adv.group_advantages_to_go(scores, penalties, mask, G, cfg.adv_scale, cfg.adv_eps)
        else:
            advantages = adv.group_advantages(scores, G, cfg.adv_scale, cfg.adv_eps)  # (B,)
        loss_mask = mask
        if cfg.overlong_filter:
            loss_mask = mask * (~batch.truncated).float().unsqueeze(1).to(device)  # truncated rows leave the loss

        # 4. optimise --------------------------------------------------------------------------------------------
        t_opt = time.time()
        opt_stats = []
        n_groups = B // G
        for _epoch in range(cfg.num_iterations):
            group_order = torch.randperm(n_groups, generator=gen)
            for mb_groups in group_order.chunk(cfg.num_minibatches):
                rows = (mb_groups.unsqueeze(1) * G + torch.arange(G)).flatten().to(device)
                opt_stats.append(_optimise_minibatch(
                    model, opt, value_model, value_opt, cfg, beta, batch, rows, P, old_logprobs, ref_logprobs,
                    advantages, loss_mask, old_values, returns, routes))
        t_opt = time.time() - t_opt

        # 5. log -------------------------------------------------------------------------------------------------
        m = {k: float(np.mean([s[k] for s in opt_stats if k in s])) for k in opt_stats[0]}
        n_tok = mask.sum().clamp(min=1)
        row = dict(step=step, reward=float(scores.mean()), accuracy=float(accuracy.mean()),
                   format_rate=float(formatted.mean()), completion_length=float(batch.lengths.float().mean()),
                   truncated_rate=float(batch.truncated.float().mean()), **gen_metrics, **m,
                   time=time.time() - t_start, time_generate=t_gen, time_optimise=t_opt, beta=beta)
        if kl_ref_tokens is not None:
            row["kl_ref"] = float(kl_ref_tokens.sum() / n_tok)  # per token, nats
            row["kl_ref_seq"] = float(kl_ref_tokens.sum() / B)  # per sequence, nats
        if cfg.advantage == "gae":
            row["explained_variance"] = _explained_variance(old_values, returns, mask)
        if cfg.adaptive_kl and ref_logprobs is not None:
            beta = adaptive_kl_beta(beta, row["kl_ref_seq"], cfg.target_kl, cfg.kl_horizon, B)
        row.update(_eval_metrics(model, tokenizer, eval_data, cfg, step))
        history.log(**row)
        if callback is not None:
            callback(step, row)
    return history


def _explained_variance(values, returns, mask) -> float:
    """1 - Var(returns - values) / Var(returns) over valid tokens: 1 is a perfect critic, <= 0 a useless one."""
    m = mask > 0
    r, v = returns[m], values[m]
    var = r.var()
    return float(1 - (r - v).var() / var) if var > 0 else float("nan")


def _optimise_minibatch(model, opt, value_model, value_opt, cfg, beta, batch, rows, P, old_logprobs, ref_logprobs,
                        advantages, loss_mask, old_values, returns, routes) -> dict:
    """One optimiser step on the given rows, accumulating gradients over micro-batches.

    The aggregation's denominator is the whole minibatch's count (tokens for token-mean, sequences otherwise),
    so the micro-batch losses add up to exactly the minibatch's loss whatever the micro-batch size.
    """
    mb_mask = loss_mask[rows]
    if cfg.agg == "token-mean" and cfg.level != "sequence":
        denominator = float(mb_mask.sum())
    else:
        denominator = float((mb_mask.sum(-1) > 0).sum())
    denominator = max(denominator, 1.0)  # an all-masked minibatch has loss 0
    micro = cfg.micro_batch_size or len(rows)
    opt.zero_grad(set_to_none=True)
    if value_opt is not None:
        value_opt.zero_grad(set_to_none=True)
    stats, entropies, n_tokens = [], 0.0, 0.0
    for mrows in rows.split(micro):
        ids, am = batch.input_ids[mrows], batch.attention_mask[mrows]
        m = loss_mask[mrows]
        if routes is not None:
            with replay_routing(model, routes.select(mrows)):
                logprobs, entropy = rollout.token_logprobs(model, ids, am, P, cfg.temperature, return_entropy=True)
        else:
            logprobs, entropy = rollout.token_logprobs(model, ids, am, P, cfg.temperature, return_entropy=True)
        loss, st = losses.policy_loss(logprobs, old_logprobs[mrows], advantages[mrows], m, cfg.eps_low,
                                      cfg.eps_high, cfg.level, cfg.agg, cfg.dual_clip, cfg.max_new_tokens,
                                      denominator)
        if ref_logprobs is not None and beta > 0 and cfg.kl_placement == "loss":
            kl_tok = kl_mod.kl_in_loss(logprobs, ref_logprobs[mrows], cfg.kl_estimator)
            kl_agg = "seq-mean-token-mean" if cfg.level == "sequence" else cfg.agg
            loss = loss + beta * losses.aggregate(kl_tok, m, kl_agg, cfg.max_new_tokens, denominator)
        loss.backward()
        if value_model is not None:
            values = models.token_values(value_model, ids, am, P)
            vloss, vst = losses.value_loss(values, old_values[mrows], returns[mrows], m, cfg.value_clip,
                                           "token-mean", float(loss_mask[rows].sum().clamp(min=1)))
            (cfg.vf_coef * vloss).backward()
            # vloss is already divided by the whole minibatch's token count: the micro-batch parts add up
            st = {**st, **vst, "value_loss": float(vloss.detach())}
        st["loss"] = float(loss.detach())
        stats.append(st)
        with torch.no_grad():
            entropies += float((entropy * batch.completion_mask[mrows]).sum())
            n_tokens += float(batch.completion_mask[mrows].sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    opt.step()
    if value_opt is not None:
        torch.nn.utils.clip_grad_norm_(value_model.parameters(), cfg.max_grad_norm)
        value_opt.step()
    out = {k: float(np.mean([s[k] for s in stats])) for k in stats[0] if k not in ("loss", "value_loss")}
    out["loss"] = sum(s["loss"] for s in stats)
    if value_model is not None:
        out["value_loss"] = sum(s["value_loss"] for s in stats)
    out["entropy"] = entropies / max(n_tokens, 1.0)
    out["grad_norm"] = float(grad_norm)
    return out


# ------------------------------------------------------------------------------------------------ preference loop
# DPO, IPO, KTO and SimPO train on fixed data (pairs, or labelled single completions) with no rollout inside the
# loop: each step is 1. a batch of pairs / examples, 2. policy (and reference) log-probs of their completions,
# 3. the method's loss from minirl.preference, 4. one optimiser step, 5. log. The loss functions take one
# log-prob per completion; how token log-probs are reduced to it is part of each method (PREFERENCE_METHODS).

#: Per-method defaults: the reduction of token log-probs to one number per completion, beta (when the method has
#: one), whether a frozen reference model is needed, and the data the method reads.
PREFERENCE_METHODS: dict[str, dict] = {
    # Rafailov et al. 2023, eq. 7: sequence log-likelihood (sum over tokens), beta 0.1, reference model
    "dpo": dict(reduction="sum", beta=0.1, reference=True, data="pairs"),
    # Azar et al. 2023, eq. 17: the paper's sequence log-likelihood (sum); TRL averages per token (reduction="mean")
    "ipo": dict(reduction="sum", beta=None, reference=True, data="pairs"),
    # Ethayarajh et al. 2024, eq. 7-8: sum over tokens, beta 0.1, unpaired labelled completions, reference model
    "kto": dict(reduction="sum", beta=0.1, reference=True, data="examples"),
    # Meng et al. 2024, eq. 6: mean over tokens, beta 2.0, margin gamma 1.0, NO reference model
    "simpo": dict(reduction="mean", beta=2.0, reference=False, data="pairs"),
}
_PREF_COLUMNS = {"pairs": ("prompt", "chosen", "rejected"), "examples": ("prompt", "completion", "label")}


@dataclass
class PrefConfig:
    """Every setting of the preference loop ``train_preference``. Defaults follow the papers (PREFERENCE_METHODS)."""

    method: str = "dpo"  # "dpo", "ipo", "kto" or "simpo"
    beta: float | None = None  # DPO / KTO / SimPO reward scale; None: the method's default (0.1, 0.1, 2.0)
    tau: float = 0.1  # IPO regularisation; the target log-ratio margin is 1 / (2 tau) nats
    gamma: float = 1.0  # SimPO target margin (absolute, on beta * mean log-prob)
    label_smoothing: float = 0.0  # DPO only: > 0 is conservative DPO (cDPO), the assumed label-flip probability
    lambda_d: float = 1.0  # KTO weight of desirable examples
    lambda_u: float = 1.0  # KTO weight of undesirable examples
    reduction: str | None = None  # "sum" or "mean" over completion tokens; None: the method's default
    lr: float = 1e-4  # AdamW learning rate
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    steps: int = 50  # optimiser steps
    batch_size: int = 16  # pairs per step (DPO, IPO, SimPO) or examples per step (KTO, >= 2)
    seed: int = 0  # batch order and KTO's mismatched pairing
    temperature: float = 1.0  # log-probs from logits / temperature (1.0: the model's own distribution)
    max_new_tokens: int = 40  # completion budget of the held-out evaluation
    eval_every: int = 0  # evaluate every N steps (0: only before and after)
    eval_samples_per_prompt: int = 1
    progress: bool = True  # tqdm bar

    def resolved(self) -> dict:
        """The method's effective beta and reduction (the config's, or the method's defaults)."""
        defaults = PREFERENCE_METHODS[self.method]
        return {"beta": defaults["beta"] if self.beta is None else self.beta,
                "reduction": self.reduction or defaults["reduction"]}

    def validate(self) -> None:
        """Raise ValueError naming the field for any invalid setting."""
        choice("method", self.method, PREFERENCE_METHODS)
        if self.reduction is not None:
            choice("reduction", self.reduction, ("sum", "mean"))
        for name in ("steps", "batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.method == "kto" and self.batch_size < 2:
            raise ValueError(f"KTO pairs each example with another one of its batch: batch_size must be >= 2, "
                             f"got {self.batch_size}")
        for name in ("lr", "tau", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        beta = self.resolved()["beta"]
        if beta is not None and not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if self.label_smoothing and self.method != "dpo":
            raise ValueError(f"label_smoothing (cDPO) applies to method 'dpo' only, got method {self.method!r}")


def encode_completions(tokenizer, prompts: Sequence[str], completions: Sequence[str], device=None) -> dict:
    """Token ids of prompt + completion + EOS in the rollout layout that ``rollout.token_logprobs`` reads.

    Prompts (with BOS) are left-padded to a common length P and completions (with EOS appended) right-padded to
    T, exactly as ``rollout.generate`` lays out a batch; so the log-probs of a sampled completion that ended with
    EOS are reproduced to float precision. A truncated sample (no EOS) is encoded with an EOS appended.

    Args:
        tokenizer: the model's tokenizer (BOS added to the prompt, pad and EOS ids set).
        prompts: B prompt strings.
        completions: B completion strings (without EOS).
        device: where to put the tensors.

    Returns:
        dict with input_ids (B, P + T), attention_mask (B, P + T), completion_mask (B, T) float (1 up to and
        including EOS) and n_prompt_tokens = P.

    Raises:
        ValueError: if prompts and completions differ in length or are empty.
    """
    if len(prompts) != len(completions) or len(prompts) == 0:
        raise ValueError(f"need as many prompts as completions, at least one; got {len(prompts)} and "
                         f"{len(completions)}")
    p_ids = [tokenizer(p).input_ids for p in prompts]  # BOS + prompt
    c_ids = [tokenizer(c, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for c in completions]
    P, T, pad = max(map(len, p_ids)), max(map(len, c_ids)), tokenizer.pad_token_id
    ids, am, cm = [], [], []
    for p, c in zip(p_ids, c_ids, strict=True):
        ids.append([pad] * (P - len(p)) + p + c + [pad] * (T - len(c)))
        am.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)))
        cm.append([1.0] * len(c) + [0.0] * (T - len(c)))
    return {"input_ids": torch.tensor(ids, device=device), "attention_mask": torch.tensor(am, device=device),
            "completion_mask": torch.tensor(cm, device=device), "n_prompt_tokens": P}


def _completion_logps(model, enc: dict, temperature: float) -> torch.Tensor:
    """(B, T) token log-probs of the encoded completions, zero outside the completion mask."""
    tok = rollout.token_logprobs(model, enc["input_ids"], enc["attention_mask"], enc["n_prompt_tokens"], temperature)
    return tok * enc["completion_mask"]


@torch.no_grad()
def reference_logps(ref_model, enc: dict, temperature: float = 1.0, reduction: str = "sum") -> torch.Tensor:
    """(B,) per-sequence log-probs under the frozen reference: no_grad, and the model must be in eval mode.

    Raises:
        ValueError: if the reference is in train mode (dropout would make its log-probs random).
    """
    if ref_model.training:
        raise ValueError("ref_model must be in eval mode (call ref_model.eval())")
    return rollout.sequence_logprobs(_completion_logps(ref_model, enc, temperature), enc["completion_mask"], reduction)


def kto_reference_pairs(prompts: Sequence[str], completions: Sequence[str], generator=None):
    """The mismatched (prompt, completion) pairs of a KTO batch for the reference point z0.

    Prompt i is paired with the completion of example j = ``preference.kto_mismatched_indices(B)[i]`` != i.

    Returns:
        (prompts, mismatched completions, idx (B,) long).
    """
    idx = pref.kto_mismatched_indices(len(prompts), generator)
    return list(prompts), [completions[j] for j in idx.tolist()], idx


def preference_pair_loss(model, ref_model, tokenizer, batch: dict, cfg: PrefConfig) -> tuple[torch.Tensor, dict]:
    """DPO, IPO or SimPO loss of a batch of pairs: one forward of the 2B completions (chosen, then rejected).

    Args:
        batch: dict of lists ``prompt``, ``chosen``, ``rejected`` (B pairs).
        ref_model: the frozen reference in eval mode; ignored (may be None) for SimPO.

    Returns:
        (loss, stats): the method's stats (``accuracy`` renamed ``reward_accuracy``) plus ``chosen_logps`` and
        ``rejected_logps``: batch means of the policy's summed log-probs (nats per completion) whatever the
        reduction, so the curves of all methods share one unit.

    Source: DPO, Rafailov et al. 2023, eq. 7; IPO, Azar et al. 2023, eq. 17; SimPO, Meng et al. 2024, eq. 6
    (the losses themselves live in ``minirl.preference``).
    """
    n, opts = len(batch["prompt"]), cfg.resolved()
    device = next(model.parameters()).device
    enc = encode_completions(tokenizer, list(batch["prompt"]) * 2, list(batch["chosen"]) + list(batch["rejected"]),
                             device)
    tok = _completion_logps(model, enc, cfg.temperature)  # (2B, T)
    logps = rollout.sequence_logprobs(tok, enc["completion_mask"], opts["reduction"])  # (2B,)
    if cfg.method == "simpo":
        loss, stats = pref.simpo_loss(logps[:n], logps[n:], opts["beta"], cfg.gamma)
    else:
        ref = reference_logps(ref_model, enc, cfg.temperature, opts["reduction"])  # (2B,), no grad
        if cfg.method == "dpo":
            loss, stats = pref.dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], opts["beta"], cfg.label_smoothing)
        else:
            loss, stats = pref.ipo_loss(logps[:n], logps[n:], ref[:n], ref[n:], cfg.tau)
    sums = tok.detach().sum(-1)  # (2B,) nats per completion
    stats["reward_accuracy"] = stats.pop("accuracy")
    stats.update(chosen_logps=float(sums[:n].mean()), rejected_logps=float(sums[n:].mean()))
    return loss, stats


def preference_kto_loss(model, ref_model, tokenizer, batch: dict, cfg: PrefConfig,
                        generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """KTO loss of a batch of labelled completions, z0 from mismatched pairs of the same batch.

    The mismatched log-probs only feed z0, which ``preference.kto_loss`` detaches, so both the policy's and the
    reference's are computed without gradient.

    Args:
        batch: dict of lists ``prompt``, ``completion``, ``label`` (bool: desirable), B >= 2 examples.
        generator: draws the mismatched pairing (None: shift by one).

    Returns:
        (loss, stats): ``preference.kto_loss``'s stats (``accuracy`` renamed ``reward_accuracy``) plus
        ``chosen_logps`` / ``rejected_logps``: mean summed log-probs of the desirable / undesirable completions
        (nats; NaN when the batch has none of that class).

    Source: Ethayarajh et al. 2024, "KTO", eq. 7-8 (z0 from mismatched pairs of the same microbatch).
    """
    opts, device = cfg.resolved(), next(model.parameters()).device
    prompts, completions = list(batch["prompt"]), list(batch["completion"])
    desirable = torch.tensor(batch["label"], dtype=torch.bool, device=device)  # (B,)
    enc = encode_completions(tokenizer, prompts, completions, device)
    tok = _completion_logps(model, enc, cfg.temperature)  # (B, T)
    logps = rollout.sequence_logprobs(tok, enc["completion_mask"], opts["reduction"])  # (B,)
    kl_enc = encode_completions(tokenizer, *kto_reference_pairs(prompts, completions, generator)[:2], device)
    with torch.no_grad():
        kl_logps = rollout.sequence_logprobs(_completion_logps(model, kl_enc, cfg.temperature),
                                             kl_enc["completion_mask"], opts["reduction"])  # (B,)
    ref = reference_logps(ref_model, enc, cfg.temperature, opts["reduction"])  # (B,)
    kl_ref = reference_logps(ref_model, kl_enc, cfg.temperature, opts["reduction"])  # (B,)
    loss, stats = pref.kto_loss(logps, ref, kl_logps, kl_ref, desirable, opts["beta"], cfg.lambda_d, cfg.lambda_u)
    sums = tok.detach().sum(-1)  # (B,)
    stats["reward_accuracy"] = stats.pop("accuracy")
    stats.update(chosen_logps=float(sums[desirable].mean()), rejected_logps=float(sums[~desirable].mean()))
    return loss, stats


def memory_held(model, optimizer=None, ref_model=None) -> dict:
    """Bytes held by the training state, counted from the live tensors (each storage once; tied weights once).

    Returns:
        dict of memory_policy_bytes (parameters), memory_grad_bytes, memory_optimizer_bytes (e.g. AdamW's two
        moments), memory_reference_bytes (0 without a reference model) and memory_total_bytes. Activations are
        not included: they come and go within a step.
    """
    def nbytes(tensors) -> int:
        seen, total = set(), 0
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.untyped_storage().nbytes()
        return total

    params = list(model.parameters())
    out = {"memory_policy_bytes": nbytes(params),
           "memory_grad_bytes": nbytes(p.grad for p in params if p.grad is not None),
           "memory_optimizer_bytes": nbytes(v for s in (optimizer.state.values() if optimizer else [])
                                            for v in s.values()),
           "memory_reference_bytes": nbytes(ref_model.parameters()) if ref_model is not None else 0}
    out["memory_total_bytes"] = sum(out.values())
    return out


def _batch_indices(n: int, batch_size: int, steps: int, gen: torch.Generator):
    """``steps`` lists of ``batch_size`` row indices: epochs of seeded permutations, read in order."""
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        while len(order) < batch_size:
            order = torch.cat([order, torch.randperm(n, generator=gen)])
        yield order[:batch_size].tolist()
        order = order[batch_size:]


def _check_preference_data(data, method: str) -> None:
    kind = PREFERENCE_METHODS[method]["data"]
    missing = [c for c in _PREF_COLUMNS[kind] if c not in data.column_names]
    if missing:
        raise ValueError(f"method {method!r} reads {kind} with columns {list(_PREF_COLUMNS[kind])}; the data lacks "
                         f"{missing}")
    if len(data) == 0:
        raise ValueError("the preference data is empty")


def train_preference(model, tokenizer, data, cfg: PrefConfig, ref_model=None, eval_data=None,
                     callback: Callable[[int, dict], None] | None = None) -> History:
    """Train ``model`` in place with DPO, IPO, KTO or SimPO on fixed preference data; return the per-step History.

    Each step: 1. the next ``batch_size`` rows (epochs of seeded permutations); 2. log-probs of their completions
    under the policy (``rollout.token_logprobs``, reduced by ``rollout.sequence_logprobs``) and, except for SimPO,
    under the frozen reference (no_grad, eval mode); 3. the method's loss from ``minirl.preference``; 4. one
    AdamW step with gradient clipping; 5. a row of metrics into History.

    Args:
        model: the policy (a causal LM), trained in place.
        tokenizer: its tokenizer.
        data: a Dataset of pairs (``prompt``, ``chosen``, ``rejected``) for DPO / IPO / SimPO, or of labelled
            examples (``prompt``, ``completion``, ``label``) for KTO.
        cfg: a PrefConfig.
        ref_model: the frozen reference; default a copy of the policy at the start. Never made (and ignored)
            for SimPO, which is reference-free.
        eval_data: optional held-out Dataset (prompt, answer): task accuracy sampled at T = 1 and greedy is
            logged before training (step 0), every ``cfg.eval_every`` steps and at the end.
        callback: called as ``callback(step, row)`` after each step.

    Returns:
        History; each step logs loss, the method's stats (chosen_rewards / rejected_rewards / margins /
        reward_accuracy, or KTO's z0 and class rewards), chosen_logps / rejected_logps (summed, nats), grad_norm,
        time; the last row also the ``memory_held`` figures.

    Raises:
        ValueError: for an invalid config or data without the method's columns.

    Source: the offline pipeline of Rafailov et al. 2023 (sample completions from the SFT model, label them,
    then optimise the policy against the frozen SFT model as reference); section 3 of notebook 06 runs it.
    """
    cfg.validate()
    _check_preference_data(data, cfg.method)
    set_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    if not PREFERENCE_METHODS[cfg.method]["reference"]:
        ref_model = None
    elif ref_model is None:
        ref_model = copy.deepcopy(model)
    if ref_model is not None:
        ref_model.eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    history = History()

    metrics0 = _eval_metrics(model, tokenizer, eval_data, cfg, step=0)
    if metrics0:
        history.log(step=0, **metrics0)
    model.train()
    batches = _batch_indices(len(data), cfg.batch_size, cfg.steps, gen)
    for step, idx in enumerate(tqdm(batches, total=cfg.steps, desc=cfg.method, disable=not cfg.progress,
                                                 mininterval=PROGRESS_INTERVAL), start=1):
        t0 = time.time()
        batch = data[idx]  # 1. dict of lists
        if cfg.method == "kto":  # 2-3. log-probs and loss
            loss, stats = preference_kto_loss(model, ref_model, tokenizer, batch, cfg, gen)
        else:
            loss, stats = preference_pair_loss(model, ref_model, tokenizer, batch, cfg)
        opt.zero_grad(set_to_none=True)  # 4. optimise
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        row = dict(step=step, loss=loss.item(), **stats, grad_norm=float(grad_norm), time=time.time() - t0)  # 5.
        if step == cfg.steps:
            row.update(memory_held(model, opt, ref_model))
        row.update(_eval_metrics(model, tokenizer, eval_data, cfg, step))
        history.log(**row)
        if callback is not None:
            callback(step, row)
    return history


@torch.no_grad()
def sample_preference_data(model, tokenizer, prompts_data, n_prompts: int, group_size: int, max_new_tokens: int,
                           temperature: float = 1.0, seed: int = 0, prompts_per_batch: int = 64):
    """Preference data from the model's own samples: G completions per prompt, scored by the task's checker.

    ``n_prompts`` prompts are drawn without replacement (seeded), each sampled ``group_size`` times with
    ``rollout.generate``, scored with ``tasks.score``; then ``preference.build_preference_pairs`` makes
    (correct, wrong) pairs inside each group and ``preference.build_kto_examples`` labels every completion
    (all groups: KTO can use the groups that are all correct or all wrong, which give no pair).

    Args:
        prompts_data: Dataset with prompt and answer columns (e.g. the train split).
        n_prompts, group_size, max_new_tokens, temperature: what to sample.
        seed: the prompt choice and the sampling (the global RNG is restored afterwards).
        prompts_per_batch: prompts per generate call.

    Returns:
        (pairs Dataset, kto examples Dataset, info dict with samples, sample_accuracy, mixed_groups (share of
        groups with both a correct and a wrong completion), truncated_rate and pairs).
    """
    gen = torch.Generator().manual_seed(seed)
    rows = prompts_data.select(torch.randperm(len(prompts_data), generator=gen)[:n_prompts].tolist())
    prompts, answers = list(rows["prompt"]), list(rows["answer"])
    completions, rewards, truncated = [], [], []
    with torch.random.fork_rng():  # CPU and CUDA generators are restored on exit
        torch.manual_seed(seed)
        for i in range(0, len(prompts), prompts_per_batch):
            r = rollout.generate(model, tokenizer, prompts[i:i + prompts_per_batch], group_size, max_new_tokens,
                                 temperature)
            completions += r.completions
            truncated += r.truncated.tolist()
            rewards += [tasks.score(c, answers[i + j // group_size]).reward for j, c in enumerate(r.completions)]
    pairs = pref.build_preference_pairs(prompts, completions, rewards, group_size)
    examples = pref.build_kto_examples(prompts, completions, rewards, group_size)
    per_group = torch.tensor(rewards).view(-1, group_size)
    mixed = ((per_group > 0.5).any(1) & (per_group <= 0.5).any(1)).float().mean()
    info = {"samples": len(completions), "sample_accuracy": float(np.mean(rewards)), "mixed_groups": float(mixed),
            "truncated_rate": float(np.mean(truncated)), "pairs": len(pairs)}
    return pairs, examples, info


# ------------------------------------------------------------------------------------------------ main job
def main_job(algo: str = "grpo", profile: str | None = None, seed: int = 0, steps: int | None = None,
             out: str | Path = "runs/grpo", **overrides) -> dict:
    """Warm start (or load it), evaluate, train with ``algo``, evaluate again, and write metrics and a plot.

    Writes under ``out``: metrics.jsonl (one row per step), summary.json (before/after figures) and
    curves.png (the standard learning curves).

    Returns:
        The summary dict.
    """
    from .plots import plot_history

    t0 = time.time()
    prof = resolve_profile(profile)
    model, tokenizer, info = warm_start(prof, seed=seed)
    t_warm = time.time() - t0
    test = tasks.load_split("test")
    test = test.select(range(min(prof.eval_size, len(test))))
    cfg = make_config(algo, seed=seed, steps=steps or prof.rl_steps, prompts_per_step=prof.prompts_per_step,
                      group_size=prof.group_size, max_new_tokens=prof.max_new_tokens,
                      **{"eval_samples_per_prompt": 4, "eval_every": 50, **overrides})  # 4 samples: less eval noise
    history = train_rl(model, tokenizer, cfg, tasks.load_split("train"), eval_data=test)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    history.to_jsonl(out / "metrics.jsonl")
    first, last = history.rows[0], history.rows[-1]
    summary = {
        "algo": algo, "profile": prof.name, "seed": seed, "steps": cfg.steps,
        "before": {"sampled_accuracy": first["eval_accuracy"], "greedy_accuracy": first["eval_greedy_accuracy"]},
        "after": {"sampled_accuracy": last["eval_accuracy"], "greedy_accuracy": last["eval_greedy_accuracy"]},
        "warm_start_seconds": round(t_warm, 1), "total_seconds": round(time.time() - t0, 1),
        "parameters": info["parameters"], "temperature": cfg.temperature,
        "eval": f"{len(test)} held-out prompts, {cfg.eval_samples_per_prompt} samples each at T={cfg.temperature}; "
                f"greedy: 1 each",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    fig = plot_history(history, title=f"{algo} on the running-sums task ({prof.name} profile, seed {seed})")
    fig.savefig(out / "curves.png", dpi=110, bbox_inches="tight")
    return summary


__all__ = ["PROFILES", "Profile", "resolve_profile", "set_seed", "evaluate", "sft", "sft_batch", "warm_start",
           "RLConfig", "ALGORITHMS", "make_config", "algorithms_table", "History", "train_rl", "adaptive_kl_beta",
           "main_job", "PREFERENCE_METHODS", "PrefConfig", "encode_completions",
           "reference_logps", "kto_reference_pairs", "preference_pair_loss", "preference_kto_loss", "memory_held",
           "train_preference", "sample_preference_data"]
