"""The RL loop: one function, ``train_rl``, serves every preset of ``config.ALGORITHMS``.

The presets: PPO (``ppo``), GRPO (``grpo``), Dr. GRPO (``dr_grpo``), DAPO (``dapo``), GSPO (``gspo``), GSPO-token
(``gspo_token``), CISPO (``cispo``), SAPO (``sapo``), GMPO (``gmpo``), RLOO (``rloo``), REINFORCE++
(``reinforce_pp``), REINFORCE++ with baseline (``reinforce_pp_baseline``) and GRPO without a reference
(``grpo_no_ref``).

Every step runs five stages, each a few lines that call a named function defined below in reading order:

  1. rollout     G completions per prompt and their behaviour log-probs (dynamic sampling repeats 1-2); with an
                 environment, G episodes of model and environment turns (``multiturn.generate_episodes``)
  2. reward      the reward functions' scores, or the environment's (+ DAPO's overlong shaping) (+ the KL penalty,
                 if it is a reward)
  3. advantages  group-relative (GRPO's mean/std, RLOO's leave-one-out, MaxRL's / mean, REINFORCE++'s batch
                 normalisation), or GAE with the critic
  4. optimise    epochs x minibatches of ``update_minibatch`` (rl_update.py): pg_loss + beta * kl_loss (+ value_loss);
                 the reference reset (``ref_reset_every``) copies the policy into the reference after every k-th step
  5. log         one row of metrics into History

What differs between the algorithms is a handful of ``RLConfig`` switches (``config.ALGORITHMS``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm  # plain text bars: no widget warnings in notebooks

from . import advantages as adv
from . import (checkpoint, decoding, entropy_control, group_filter, importance, kl, lora, models, multiturn, precision,
               rewards, rl_offpolicy, rollout, tasks, tracking)
from .checks import choice, zero_outside
from .config import PROGRESS_INTERVAL, RLConfig, set_seed
from .evaluation import eval_due, eval_metrics
from .history import History
from .moe import Routes, record_routing, replay_routing, routers
from .rl_update import (RLBatch, current_logprobs, kl_loss_term, loss_denominator, minibatches,  # noqa: F401
                        policy_logprobs, replaying, router_aux_term, router_logits_if, update_minibatch,
                        value_loss_term)  # stage 4, re-exported: rl.update_minibatch is what train_rl calls


def train_rl(model, tokenizer, cfg: RLConfig, train_data, eval_data=None, *, reward_fn=None,
             reward_weights=None, ref_model=None, critic=None, callback: Callable[[int, dict], None] | None = None,
             output_dir: str | Path | None = None, resume_from: str | Path | None = None,
             env_factory=None) -> History:
    """Train ``model`` in place with the algorithm that ``cfg`` describes; return the per-step History.

    Args:
        model: the policy (a causal LM), trained in place.
        tokenizer: its tokenizer.
        cfg: an RLConfig (``config.make_config(algo, ...)``).
        train_data: a ``datasets.Dataset`` with a ``prompt`` column (strings, or conversations that the tokenizer's
            chat template renders: ``chat.render``) and whatever columns the reward reads.
        eval_data: optional held-out Dataset; the mean reward (sampled at cfg.temperature, and greedy) is logged
            before training, every ``cfg.eval_every`` steps and at the end.
        reward_fn: ``reward_fn(prompts, completions, completion_ids, **columns) -> list[float | None]`` (TRL's
            form, see ``rewards.score_completions``: it also receives ``trainer_state`` and ``log_metric``), or a
            list of them; None is the running-sums task's 0/1 reward (``tasks.running_sums_reward``).
        reward_weights: one weight per reward function (default 1 each).
        ref_model: the frozen reference; default, when beta > 0, a copy of the policy (LoRA: ``lora.reference``).
        critic: PPO's value model; default ``models.ValueModel(model)`` when cfg.advantage == "gae".
        callback: ``callback(step, row)`` after each step, before the row is logged (what it adds is logged too).
        output_dir: where the policy is saved at the end (``policy/``, ``save_pretrained``; under LoRA the adapter),
            a checkpoint every ``cfg.checkpoint_every`` steps (``checkpoint-N/``), TensorBoard's events; None: none.
        resume_from: a ``checkpoint-N`` folder: continue its run from step N + 1 exactly (``checkpoint.resume``).
        env_factory: multi-turn episodes: a callable returning a fresh environment per episode; each rollout is
            ``multiturn.generate_episodes`` (up to ``cfg.max_turns`` turns), scored by the environment's rewards,
            evaluated as episodes. None: one turn, scored by ``reward_fn``.

    Returns:
        History with one row per step (and held-out metrics on the rows where they were measured).

    Raises:
        ValueError: for an invalid config, data without a ``prompt`` column, a reward function that returns a wrong
            count, a non-number, NaN or inf (``rewards.score_completions``); for PPO's critic, a completion that
            every reward function returned None for; right padding (``rollout.check_tokenizer``); weights not float32
            under "fp32" or "bf16-autocast" (``precision.prepare``); checkpoint_every or report_to without output_dir,
            a checkpoint of another run there or resumed (``checkpoint``); with ``env_factory``, a setting that
            episodes do not support (``multiturn_settings``). RuntimeError: dynamic sampling ran out.

    Source: PPO, Schulman et al. 2017, algorithm 1 (RLHF form: Ouyang et al. 2022); GRPO, Shao et al. 2024,
    algorithm 1; DAPO, Yu et al. 2025, algorithm 1.
    """
    cfg.validate(loop="rl")  # also refuses the distillation settings: distill_loop.train_distill runs them
    model = lora.attach_for(model, cfg)  # a LoRA adapter when cfg.lora_rank > 0, else the model itself
    precision.prepare(model, precision=cfg.precision, lr=cfg.lr, gradient_checkpointing=cfg.gradient_checkpointing)
    if cfg.router_aux_loss_coef > 0:
        routers(model)  # raises ValueError for a model without MoE routers: no load to balance
    if "prompt" not in train_data.column_names:
        raise ValueError(f"train_data needs a 'prompt' column, got columns {train_data.column_names}")
    multiturn_settings(cfg, env_factory, reward_fn)
    reward_fn = reward_fn or tasks.running_sums_reward
    run = checkpoint.prepare_run(output_dir, resume_from, checkpoint_every=cfg.checkpoint_every, model=model,
                                 train_data=train_data, reward_fn=reward_fn, reward_weights=reward_weights)
    set_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    ref_model = reference_model(model, ref_model, cfg)
    if critic is None and cfg.advantage == "gae":
        critic = models.ValueModel(model).to(next(model.parameters()).device)
    optimizer = make_optimizer(model, critic, cfg)
    sampler = rl_offpolicy.make_step_sampler(model, cfg)  # the trainer itself by default
    source = pi_old_source(cfg, sampler_is_trainer=sampler is model)  # which log-probs play pi_old, decided once
    beta, history, start, ent = cfg.beta, History(), 0, entropy_control.make_state(cfg, resuming=bool(resume_from))
    callback = tracking.reporting(callback, cfg.report_to, output_dir, last_step=cfg.steps)  # + TensorBoard
    if resume_from is not None:  # weights, optimiser, reference, critic, History, beta and every RNG of step N
        start, history, beta = checkpoint.resume(resume_from, cfg=cfg, model=model, optimizer=optimizer, gen=gen,
                                                 ref_model=ref_model, critic=critic, run=run)
        rl_offpolicy.resume_sampler(sampler, model, start, cfg)  # the trainer's weights: exact where it reloads
    elif eval_data is not None:
        history.log(step=0, **held_out_metrics(model, tokenizer, eval_data, cfg, 0, reward_fn, env_factory,
                                               reward_kwargs={"trainer_state": TrainerState(0, cfg.steps)}))
    for step in tqdm(range(start + 1, cfg.steps + 1), desc=cfg.algo, disable=not cfg.progress,
                     mininterval=PROGRESS_INTERVAL):
        t0 = time.time()
        # 1-2. rollout and reward: G completions per prompt, scored (dynamic sampling repeats both)
        logged = {}  # what the reward functions report through log_metric(name, value)
        reward_kwargs = {"trainer_state": TrainerState(global_step=step - 1, max_steps=cfg.steps),
                         "log_metric": metric_logger(logged)}
        batch, scores, gen_stats = collect(sampler, tokenizer, train_data, cfg, reward_fn=reward_fn,
                                           reward_weights=reward_weights, gen=gen, reward_kwargs=reward_kwargs,
                                           env_factory=env_factory)
        old_logprobs, ref_logprobs, routes = behaviour_logprobs(model, ref_model, batch, cfg, source=source)
        total_rewards = shape_rewards(scores, batch, cfg)  # (B,) + overlong shaping
        kl_tokens = reference_kl(batch, old_logprobs, ref_logprobs, cfg)  # (B, T) or None, once per step
        t_gen = time.time() - t0
        # 3. advantages: (B,) group-relative, or (B, T) per token (GAE, or a KL penalty in the reward)
        advantages, returns, old_values = compute_advantages(total_rewards, kl_tokens, batch, cfg, beta=beta,
                                                             critic=critic, reward_weights=reward_weights)
        rl_batch = RLBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           n_prompt_tokens=batch.n_prompt_tokens, completion_mask=batch.completion_mask,
                           loss_mask=loss_mask(batch, cfg), old_logprobs=old_logprobs, advantages=advantages,
                           ref_logprobs=ref_logprobs, old_values=old_values, returns=returns, routes=routes,
                           sampler_logprobs=batch.sampler_logprobs, kept=batch.kept)
        # 4. optimise: epochs x minibatches (split by groups), one optimiser step each
        t_opt = time.time()
        stats = [update_minibatch(model, optimizer, rl_batch[rows], cfg, beta=beta, critic=critic, ent=ent)
                 for _ in range(cfg.num_iterations) for rows in minibatches(len(rl_batch), cfg, gen)]
        after_updates(step, cfg, model=model, sampler=sampler, ref_model=ref_model)  # reloads, reference reset
        t_opt = time.time() - t_opt
        # 5. log
        row = step_metrics(step, stats, scores=scores, total_rewards=total_rewards, batch=batch, kl_tokens=kl_tokens,
                           gen_stats=gen_stats, beta=beta, old_values=old_values, returns=returns,
                           seconds=time.time() - t0, t_gen=t_gen, t_opt=t_opt)
        if env_factory is None:
            row.update(rewards.reward_metrics(reward_fn, batch.rewards_per_func, logged))  # rewards/<name>/mean, ...
        row.update(sampler_metrics(step, cfg, batch, old_logprobs, gap=source == "recomputed" and sampler is not model))
        if cfg.adaptive_kl and kl_tokens is not None:
            beta = kl.adaptive_kl_beta(beta, row["kl_ref_seq"], target_kl=cfg.target_kl, horizon=cfg.kl_horizon,
                                    n_samples=len(rl_batch))
        row.update(held_out_metrics(model, tokenizer, eval_data, cfg, step, reward_fn, env_factory,
                                    reward_kwargs={"trainer_state": reward_kwargs["trainer_state"]}))
        if callback is not None:
            callback(step, row)  # before logging: what the callback adds to the row is logged with it
        history.log(**row)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            checkpoint.save(Path(output_dir) / f"checkpoint-{step}", step=step, cfg=cfg, model=model,
                            tokenizer=tokenizer, optimizer=optimizer, gen=gen, history=history, beta=beta,
                            ref_model=ref_model, critic=critic, run=run)
    if output_dir is not None:
        checkpoint.save_policy(model, tokenizer, Path(output_dir) / checkpoint.POLICY)  # the adapter only under LoRA
    return history


# ------------------------------------------------------------------------------------------------ setup
def multiturn_settings(cfg: RLConfig, env_factory, reward_fn) -> None:
    """Raise ValueError for what multi-turn episodes (``env_factory``) do not support, naming it: a reward function
    beside the environment's rewards, GAE or a KL penalty in the reward (per-token advantages over an episode are
    ``multiturn.episode_gae``, not wired into the loop), a truncating sampler, routing replay from the sampler's
    routes, a generation batch size; and the multi-turn settings without an environment."""
    if env_factory is None:
        if cfg.max_turns != 1 or not cfg.mask_observations:
            raise ValueError(f"max_turns={cfg.max_turns} and mask_observations={cfg.mask_observations} are settings "
                             f"of multi-turn episodes: pass env_factory= (multiturn.py), or keep 1 and True")
        return
    refused = {"reward_fn (the environment's rewards are the scores)": reward_fn is not None,
               "advantage='gae' (multiturn.episode_gae is not wired into the loop)": cfg.advantage == "gae",
               "kl_placement='reward' with beta > 0": cfg.beta > 0 and cfg.kl_placement == "reward",
               "top_k / top_p": cfg.top_k > 0 or cfg.top_p < 1.0,
               "routing_replay with replay_source='sampler'": cfg.routing_replay and cfg.replay_source == "sampler",
               "generation_batch_size": cfg.generation_batch_size is not None}
    named = [name for name, on in refused.items() if on]
    if named:
        raise ValueError(f"multi-turn episodes (env_factory) do not support {named}")


def held_out_metrics(model, tokenizer, eval_data, cfg: RLConfig, step: int, reward_fn, env_factory, *,
                     reward_kwargs: dict) -> dict:
    """The held-out evaluation on its schedule (``evaluation.eval_due``): one turn scored by ``reward_fn``
    (``eval_metrics``), or with an environment its episodes (``multiturn.evaluate_episodes``, prefixed
    ``eval_episode_``: first-try and final accuracy, reward, turns, model tokens)."""
    if env_factory is None:
        return eval_metrics(model, tokenizer, eval_data, cfg, step, reward_fn, reward_kwargs=reward_kwargs)
    if eval_data is None or not eval_due(cfg, step):
        return {}
    m = multiturn.evaluate_episodes(model, tokenizer, eval_data, env_factory, cfg.max_new_tokens,
                                    max_turns=cfg.max_turns, samples_per_prompt=cfg.eval_samples_per_prompt,
                                    temperature=cfg.temperature, seed=cfg.seed)
    return {f"eval_episode_{k}": v for k, v in m.items()}


def reference_model(model, ref_model, cfg: RLConfig):
    """The frozen reference: the one given, or, when beta > 0 needs one, a copy of the policy as handed in (LoRA:
    ``lora.reference``, the adapter switched off or a caller's adapter copied, no second base); None otherwise."""
    if ref_model is None and cfg.beta > 0:
        ref_model = lora.reference(model) if lora.is_lora(model) else copy.deepcopy(model)
    if ref_model is not None:
        ref_model.eval().requires_grad_(False)
    return ref_model


def make_optimizer(model, critic, cfg: RLConfig) -> torch.optim.Optimizer:
    """One AdamW over the policy's trainable weights (lr; under LoRA the adapter's) and, for PPO, the critic
    (value_lr) as a second parameter group."""
    groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": cfg.lr}]
    if critic is not None:
        groups.append({"params": list(critic.parameters()), "lr": cfg.value_lr})
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)


# ------------------------------------------------------------------------------------------------ 1-2. rollout, reward
@dataclass
class TrainerState:
    """What a reward function reads as ``trainer_state`` (the two fields of TRL's TrainerState that mean the
    same here): ``global_step``, optimiser steps done before this rollout (0 at the first), and ``max_steps``."""

    global_step: int
    max_steps: int


def metric_logger(store: dict) -> Callable[[str, float], None]:
    """The ``log_metric(name, value)`` a reward function receives: values collected by name into ``store`` (the
    loop logs each name's mean over the step in its History row, as TRL averages them per logging step)."""
    return lambda name, value: store.setdefault(name, []).append(float(value))


def collect(model, tokenizer, train_data, cfg: RLConfig, *, reward_fn, reward_weights, gen: torch.Generator,
            reward_kwargs: dict | None = None, min_new_tokens: int = 0, env_factory=None
            ) -> tuple[rollout.Rollout, Tensor, dict]:
    """Stages 1-2: prompts_per_step groups of G completions and their (B,) scores, with dynamic sampling
    (DAPO) when switched on: rounds of sampling and scoring until prompts_per_step groups have signal.

    Each reward function receives prompts, completions, completion_ids, the dataset's other columns and
    ``reward_kwargs`` (``rewards.score_completions``). Scores are NaN on unscored rows (None from every
    function); they count as no signal for dynamic sampling (``group_filter.has_signal``). The rollout's ``logprobs``
    are the sampler's; pi_old is recomputed on the final batch by ``behaviour_logprobs``. ``min_new_tokens`` is
    for timing fixed work only (``bench``): it forbids EOS, so training on such a rollout would be wrong.

    Returns:
        (rollout, scores (B,), generation stats: rounds, samples, share of useful groups, unscored rows).
    """
    G = cfg.group_size

    def one_round(_round: int, n_prompts: int) -> tuple[Tensor, tuple[rollout.Rollout, Tensor]]:
        rows = train_data.select(torch.randint(len(train_data), (n_prompts,), generator=gen).tolist())
        if env_factory is not None:  # multi-turn episodes: the environment's rewards are the scores
            with precision.autocast(model, cfg.precision):
                r = multiturn.generate_episodes(model, tokenizer, rows, env_factory, G, cfg.max_new_tokens,
                                                max_turns=cfg.max_turns, temperature=cfg.temperature)
            if not cfg.mask_observations:  # the positive control's bug: the environment's tokens in the loss
                r.completion_mask = r.attention_mask[:, r.n_prompt_tokens:].float()
            r.columns = rollout.dataset_columns(rows, r.prompt_index)
            s = r.episode_rewards.clone()
            r.rewards_per_func = s.unsqueeze(1)
            return s, (r, s)
        with precision.autocast(model, cfg.precision):
            r = decoding.generate(model, tokenizer, rows["prompt"], G, cfg.max_new_tokens,
                                 temperature=cfg.temperature, recompute_logprobs=False,  # pi_old: behaviour_logprobs
                                 min_new_tokens=min_new_tokens, batch_size=cfg.generation_batch_size,
                                 record_sampler_routes=cfg.routing_replay and cfg.replay_source == "sampler",
                                 top_k=cfg.top_k, top_p=cfg.top_p)
        r.columns = rollout.dataset_columns(rows, r.prompt_index)
        s, r.rewards_per_func = rewards.score_completions(  # (B,) the weighted sum, (B, K) per function (GDPO)
            reward_fn, r.prompts, r.completions, completion_ids=completion_id_lists(r), columns=r.columns,
            weights=reward_weights, reward_kwargs=reward_kwargs, per_function=True)
        gdpo = cfg.multi_objective_aggregation == "normalize_then_sum"  # a group has signal when its advantages do
        return (adv.gdpo_group_sums(*gdpo_inputs(r, cfg, reward_weights), group_size=G, eps=cfg.adv_eps)
                if gdpo else s), (r, s)

    if not cfg.dynamic_sampling:
        signal_scores, (batch, scores) = one_round(0, cfg.prompts_per_step)
        signal = group_filter.has_signal(signal_scores, G)
        return batch, scores, {"gen_rounds": 1, "gen_samples": scores.numel(),
                               "useful_groups": float(signal.float().mean()),
                               "useful_groups_in_batch": int(signal.sum()),
                               "unscored": int(scores.isnan().sum())}
    per_round = cfg.gen_prompts_per_round or cfg.prompts_per_step
    ds = group_filter.dynamic_sampling(lambda i: one_round(i, per_round), cfg.prompts_per_step, G,
                                           cfg.max_gen_batches, cfg.allow_partial_batch)
    if not ds.picks:
        raise RuntimeError("dynamic sampling kept no group at all; nothing to train on")
    parts = [rollout.select_groups(r, groups) for (r, _), groups in ds.picks]
    scores = torch.cat([s.view(-1, G)[groups].flatten() for (_, s), groups in ds.picks])
    # useful_groups: share of GENERATED groups with signal (kept or not), as without dynamic sampling;
    # useful_groups_in_batch: groups with signal among those trained on (= prompts_per_step unless partial)
    return rollout.concat(parts, tokenizer.pad_token_id), scores, {
        "gen_rounds": ds.rounds, "gen_samples": ds.samples,
        "useful_groups": ds.groups_with_signal / max(ds.groups_seen, 1), "useful_groups_in_batch": ds.groups_kept,
        "unscored": int(scores.isnan().sum())}


def completion_id_lists(r: rollout.Rollout) -> list[list[int]]:
    """Each completion's token ids up to and including EOS, padding dropped: TRL's ``completion_ids``."""
    return [ids[m > 0].tolist() for ids, m in zip(r.completion_ids, r.completion_mask, strict=True)]


#: Which log-probs play pi_old in a step (``pi_old_source``).
PI_OLD_SOURCES = ("recomputed", "sampler", "current")


def pi_old_source(cfg: RLConfig, *, sampler_is_trainer: bool) -> str:
    """Which log-probs play pi_old in the ratio pi / pi_old: decided here, once, and read by the rollout stage
    (``behaviour_logprobs``), the metrics and the update.

    - "sampler" (``cfg.pi_old="naive"``): the sampler's own log-probs, the naive way that treats the sampler's
      numbers as the trainer's (``importance.choose_old_logprobs``).
    - "current": on-policy, one epoch of one minibatch, so the only update happens after the loss is computed.
      pi_old's log-probs are then the training forward's, detached (the ratio is exactly 1 and the clip never
      acts), and the no-grad forward that would recompute them is skipped, as TRL does. Not with routing replay
      (which records or replays pi_old's experts), a KL penalty in the reward (which reads pi_old's log-probs
      before the update) or a sampler that is not the trainer (whose gap to pi_old is measured every step).
    - "recomputed": one no-grad forward of the trainer on the sampled tokens.
    """
    if cfg.pi_old == "naive":
        return "sampler"
    if (cfg.num_iterations == 1 and cfg.num_minibatches == 1 and not cfg.routing_replay and sampler_is_trainer
            and not (cfg.beta > 0 and cfg.kl_placement == "reward")):
        return "current"
    return "recomputed"


@torch.no_grad()
def reference_kl(batch: rollout.Rollout, old_logprobs: Tensor | None, ref_logprobs: Tensor | None, cfg: RLConfig
                 ) -> Tensor | None:
    """(B, T) the step's KL estimate to the reference (0 on padding), None without a reference; with pi_old source
    "current" (no pi_old forward) it reads the sampler's log-probs."""
    if ref_logprobs is None:
        return None
    return kl.kl_estimate(batch.sampler_logprobs if old_logprobs is None else old_logprobs, ref_logprobs,
                          estimator=cfg.kl_estimator, mask=batch.completion_mask)


def after_updates(step: int, cfg: RLConfig, *, model, sampler, ref_model) -> None:
    """After a step's updates: the sampler reloads the weights when due (``rl_offpolicy.sync_if_due``, as an engine
    does), and the reference is reset to the policy every ``cfg.ref_reset_every`` steps (the next step's KL is
    measured from here: 0 at its start)."""
    rl_offpolicy.sync_if_due(sampler, model, step, cfg)
    if cfg.ref_reset_every and step % cfg.ref_reset_every == 0:
        reset_reference(ref_model, model)


def sampler_metrics(step: int, cfg: RLConfig, batch: rollout.Rollout, old_logprobs: Tensor | None, *, gap: bool
                    ) -> dict:
    """The sampler's metrics: its staleness (``sampler_sync_every`` > 1) and, with ``gap`` (a recomputed pi_old and
    a sampler that is not the trainer), its gap to pi_old as the engines log it (``mismatch_*``)."""
    row = rl_offpolicy.staleness_metrics(step, cfg, batch, old_logprobs)
    if gap:
        row.update({f"mismatch_{k}": v for k, v in importance.mismatch_metrics(
            old_logprobs, batch.sampler_logprobs, batch.completion_mask, correction=cfg.is_correction,
            cap=cfg.is_cap, cap_low=cfg.is_cap_low, form=cfg.is_seq_form).items()})
    return row


def reset_reference(ref_model, model) -> None:
    """Copy the policy's weights into the reference (``RLConfig.ref_reset_every``): the KL penalty then anchors on
    where the policy is now, not where it started. TRL's ``sync_ref_model`` with ``ref_model_mixup_alpha`` 1.

    Raises:
        RuntimeError: from ``load_state_dict`` when the reference is not the policy's architecture.
    """
    ref_model.load_state_dict(model.state_dict())


@torch.no_grad()
def behaviour_logprobs(model, ref_model, batch: rollout.Rollout, cfg: RLConfig, *, source: str | None = None
                       ) -> tuple[Tensor | None, Tensor | None, Routes | None]:
    """(B, T) log-probs of the sampled tokens under pi_old (None when ``source`` is "current": the update then
    detaches its own) and the reference (None without one), masked, and the routes the training forwards replay
    (None without routing replay). ``source`` is ``pi_old_source``'s answer (None: its answer for a model that
    samples its own rollouts, as in ``train_rl`` with the default sampler).

    A recomputed pi_old is one forward of the trainer's model on the final batch, ``cfg.logprob_batch_size`` rows
    at a time: with R2 routing replay while its experts are recorded, with R3 while the sampler's experts are
    forced. Every forward runs in ``cfg.precision``'s autocast."""
    source = source or pi_old_source(cfg, sampler_is_trainer=True)
    choice("source", source, PI_OLD_SOURCES)
    mask, P = batch.completion_mask, batch.n_prompt_tokens
    r3 = cfg.routing_replay and cfg.replay_source == "sampler"
    routes = batch.sampler_routes if r3 else None
    old_logprobs, autocast = None, precision.autocast(model, cfg.precision)
    kept = rl_offpolicy.kept_sets(batch.kept, cfg)  # (B, T, V) with keep_sampling_mask, else None
    if source == "recomputed":
        chunks = torch.arange(len(mask), device=mask.device).split(cfg.logprob_batch_size or len(mask))
        with autocast, record_routing(model) if cfg.routing_replay and not r3 else nullcontext() as recorded:
            parts = []
            for rows in chunks:  # R3 forces each chunk's rows of the sampler's routes
                with replay_routing(model, routes.select(rows)) if r3 else nullcontext():
                    parts.append(rollout.token_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows], P,
                                                        temperature=cfg.temperature,
                                                        kept=None if kept is None else kept[rows]))
        old_logprobs = torch.cat(parts)  # (B, T)
        routes = routes if r3 else recorded
    if source != "current":
        old_logprobs = zero_outside(importance.choose_old_logprobs(old_logprobs, batch.sampler_logprobs,
                                                                   pi_old=cfg.pi_old), mask)
    ref_logprobs = None
    if ref_model is not None:
        with precision.autocast(ref_model, cfg.precision):
            ref_logprobs = zero_outside(rollout.token_logprobs(ref_model, batch.input_ids, batch.attention_mask, P,
                                                               temperature=cfg.temperature,
                                                               batch_size=cfg.logprob_batch_size), mask)
    return old_logprobs, ref_logprobs, routes


def shape_rewards(scores: Tensor, batch: rollout.Rollout, cfg: RLConfig) -> Tensor:
    """(B,) the reward the advantages see: the scores, plus DAPO's overlong penalty when switched on.

    The penalty is one more reward function that always applies (as in TRL, where it is one of the
    reward_funcs): an unscored row (NaN) gets the penalty alone, the nansum of TRL."""
    if cfg.overlong_shaping:
        penalty = rewards.overlong_penalty(batch.lengths, max_len=cfg.max_new_tokens,
                                             cache_len=cfg.overlong_cache_len)
        scores = torch.nan_to_num(scores, nan=0.0) + penalty
    return scores.to(batch.completion_mask.device)


# ------------------------------------------------------------------------------------------------ 3. advantages
@torch.no_grad()
def compute_advantages(total_rewards: Tensor, kl_tokens: Tensor | None, batch: rollout.Rollout, cfg: RLConfig,
                       *, beta: float, critic=None, reward_weights=None
                       ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Stage 3: (advantages, returns, old_values). Advantages are (B,) for an outcome reward, (B, T) when the
    reward has per-token parts (PPO's GAE, or a KL penalty in the reward); returns and old_values (B, T) for
    PPO's critic, else None.

    Source: GAE, Schulman et al. 2016, eq. 16; GRPO, Shao et al. 2024, section 4.1.2; Dr. GRPO, Liu et al. 2025;
    RLOO, Ahmadian et al. 2024; MaxRL, Tajwar et al. 2026; REINFORCE++, Hu et al. 2025; GDPO, Liu et al. 2026
    (``gdpo_advantages``, with ``reward_weights`` and ``batch.rewards_per_func``).
    """
    mask = batch.completion_mask
    kl_in_reward = kl_tokens is not None and beta > 0 and cfg.kl_placement == "reward"
    if cfg.advantage == "gae":
        if total_rewards.isnan().any():
            raise ValueError(f"PPO's critic needs a reward for every completion; {int(total_rewards.isnan().sum())} "
                             f"completions got None from every reward function (group advantages leave them out)")
        token_rewards = rewards.token_level_rewards(total_rewards, mask)  # (B, T) score on the last token
        if kl_in_reward:
            token_rewards = token_rewards - beta * kl_tokens  # r_t - beta * k(t), detached
        old_values = zero_outside(models.token_values(critic, batch.input_ids, batch.attention_mask,
                                                      batch.n_prompt_tokens), mask)
        advantages, returns = adv.gae(token_rewards, old_values, mask, gamma=cfg.gamma, lam=cfg.lam)
        return (adv.whiten(advantages, mask) if cfg.whiten_advantages else advantages), returns, old_values
    if kl_in_reward:  # group baseline of the outcome, KL penalties summed to go
        return adv.group_advantages_to_go(total_rewards, beta * kl_tokens, mask, cfg.group_size,
                                          scale=cfg.adv_scale, eps=cfg.adv_eps), None, None
    if cfg.multi_objective_aggregation == "normalize_then_sum":  # GDPO: each reward function normalised first
        return gdpo_advantages(batch, cfg, reward_weights), None, None
    if cfg.advantage == "rloo":
        return adv.rloo_advantages(total_rewards, group_size=cfg.group_size), None, None
    if cfg.advantage == "maxrl":
        return adv.maxrl_advantages(total_rewards, group_size=cfg.group_size), None, None
    if cfg.advantage == "reinforce_pp":
        return adv.reinforce_pp_advantages(total_rewards, eps=cfg.adv_eps), None, None
    if cfg.advantage == "reinforce_pp_baseline":
        return (adv.reinforce_pp_baseline_advantages(total_rewards, group_size=cfg.group_size, eps=cfg.adv_eps),
                None, None)
    return adv.group_advantages(total_rewards, cfg.group_size, scale=cfg.adv_scale, eps=cfg.adv_eps), None, None


def gdpo_advantages(batch: rollout.Rollout, cfg: RLConfig, reward_weights=None) -> Tensor:
    """(B,) GDPO's advantages of the batch's per-function scores (``adv.gdpo_advantages``)."""
    return adv.gdpo_advantages(*gdpo_inputs(batch, cfg, reward_weights), group_size=cfg.group_size,
                               eps=cfg.adv_eps).to(batch.completion_mask.device)


def gdpo_inputs(batch: rollout.Rollout, cfg: RLConfig, reward_weights=None) -> tuple[Tensor, Tensor]:
    """GDPO's (B, K) per-function scores and (K,) weights; DAPO's overlong penalty, when on, is one more function
    of weight 1, as in TRL where it is one of the reward functions."""
    per_func = batch.rewards_per_func
    weights = torch.tensor([1.0] * per_func.shape[1] if reward_weights is None else list(reward_weights))
    if cfg.overlong_shaping:
        penalty = rewards.overlong_penalty(batch.lengths.cpu(), max_len=cfg.max_new_tokens,
                                           cache_len=cfg.overlong_cache_len)
        per_func, weights = torch.cat([per_func, penalty.unsqueeze(1)], dim=1), torch.cat([weights, torch.ones(1)])
    return per_func, weights


def loss_mask(batch: rollout.Rollout, cfg: RLConfig) -> Tensor:
    """(B, T) the tokens that count in the loss: the completion mask, minus truncated rows under DAPO's
    overlong filtering."""
    if not cfg.overlong_filter:
        return batch.completion_mask
    return batch.completion_mask * (~batch.truncated).float().unsqueeze(1).to(batch.completion_mask.device)


# ---------------------------------------------------------------------------------- 4. optimise: in rl_update.py


# ------------------------------------------------------------------------------------------------ 5. log
def step_metrics(step: int, stats: list[dict], *, scores: Tensor, total_rewards: Tensor, batch: rollout.Rollout,
                 kl_tokens: Tensor | None, gen_stats: dict, beta: float, old_values: Tensor | None,
                 returns: Tensor | None, seconds: float, t_gen: float, t_opt: float) -> dict:
    """One History row: the minibatch stats averaged, the rollout's rewards and lengths, KL to the reference
    per token and per sequence (nats), the critic's explained variance (PPO), and the step's timings (s)."""
    mask = batch.completion_mask
    row = dict(step=step, reward=float(total_rewards.nanmean()), score=float(scores.nanmean()),
               completion_length=float(batch.lengths.float().mean()),
               truncated_rate=float(batch.truncated.float().mean()), **gen_stats,
               **{k: float(np.mean([s[k] for s in stats if k in s])) for k in stats[0]},
               time=seconds, time_generate=t_gen, time_optimise=t_opt, beta=beta)
    if kl_tokens is not None:
        row["kl_ref"] = float(kl_tokens.sum() / mask.sum().clamp(min=1))  # nats per token
        row["kl_ref_seq"] = float(kl_tokens.sum() / mask.shape[0])  # nats per sequence
    if returns is not None:
        row["explained_variance"] = adv.explained_variance(old_values, returns, mask)
    return row

