"""The distillation loop: the student samples, a teacher grades every token, one optimiser step per rollout.

``train_distill`` is ``rl.train_rl``'s loop with the reward stage swapped for a teacher: the same RLConfig (with
``distill`` set, which ``train_rl`` refuses), the same rollout stage and RLBatch. Each step:

  1. rollout     G completions per prompt from the STUDENT (``rl.collect``; the teacher's for ``distill="sft"``),
                 scored by the task reward (logged; the mix also trains on it)
  2. teacher     a no-grad forward of the teacher on the same tokens: the log-prob of each sampled token
                 ("reverse_kl"), or its whole next-token distribution ("full_reverse_kl")
  3. loss        the objective of ``minirl.distill``, token-mean over the batch (TRL's reduction)
  4. optimise    one AdamW step (on-policy: the samples come from the weights being updated)
  5. log         one History row: the task score, the KL to the teacher on the rollout, held-out accuracy

The objectives (``RLConfig.distill``):

- "reverse_kl": REINFORCE with the per-token reward r_t = -(log p - log q) (``distill.reverse_kl_reward``), summed to
  go with ``cfg.distill_gamma`` (``distill.rewards_to_go``; 0 is Tinker's choice, 1 the sequence KL's gradient).
- "full_reverse_kl": the exact KL(p || q) over the vocabulary at every visited position (``distill.full_reverse_kl``;
  GKD, TRL's DistillationTrainer with beta=1).
- "sft": the negative log-likelihood of the TEACHER's samples (``distill.sft_nll``): off-policy distillation.
- the mix: ``cfg.task_coef > 0`` adds GRPO's group-normalised advantage of the task score to the on-policy
  objectives (a baseline that leaves the expected gradient of E[score] unchanged and lowers its variance).

A student equal to its teacher gets exactly zero gradient from the on-policy objectives (tests/test_distill_loop.py):
the teacher's forward is the student's on the same rows, so every reward and every KL is exactly 0.

Self-distillation (``RLConfig.distill_teacher``; SDFT, Shenfeld et al. 2026, arXiv 2601.19897; SDPO, Hübotter et al.
2026, arXiv 2601.20802): the teacher is the student itself, shown something the student was not, in front of the same
prompt and the same sampled tokens: a demonstration (``"self_demonstration"``: the dataset's ``completion`` for the
prompt, a worked answer) or the best-scored completion of the row's own group (``"self_best_sibling"``, when one
scored above 0). Its context is the demonstration's tokens and EOS, then the row's prompt and completion, token for
token (``self_teacher_inputs``: nothing is re-tokenised), so an empty demonstration makes the teacher the student
exactly: zero gradient.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from . import advantages as adv
from . import checkpoint, distill, losses, models, precision, rl, rollout, tasks
from .checks import zero_outside
from .config import DISTILL_OBJECTIVES, PROGRESS_INTERVAL, RLConfig, resolve_profile, set_seed
from .evaluation import eval_metrics
from .history import History
from .tokenizer import build_tokenizer
from .warm_start import SHIPPED_DIR


def load_teacher(profile: str = "cpu"):
    """The shipped teacher of the distillation lesson: the main job's model (the cpu profile's seed-0 dense warm start
    after 150 GRPO steps, ``data/make_teacher.py``), frozen, with its ``info.json`` (command, commit, held-out
    accuracy). It shares the warm start's architecture and tokenizer, so the student is the warm start itself.

    Returns:
        (teacher, tokenizer, info).

    Raises:
        FileNotFoundError: when ``data/warm_start/teacher-dense-<profile>-s0`` is missing (only the cpu profile's ships;
            ``OMP_NUM_THREADS=1 python data/make_teacher.py`` makes it).
    """
    path = SHIPPED_DIR / f"teacher-dense-{resolve_profile(profile).name}-s0"
    if not (path / "info.json").exists():
        raise FileNotFoundError(f"no teacher at {path}: make it with OMP_NUM_THREADS=1 python data/make_teacher.py")
    teacher = models.load(str(path)).to(resolve_profile(profile).device).eval().requires_grad_(False)
    return teacher, build_tokenizer(), json.loads((path / "info.json").read_text())


def demonstration_contexts(prompts: list[str], demonstrations: dict[str, str], tokenizer, eos_token_id: int
                           ) -> list[list[int]]:
    """Self-distillation's demonstration for each row: the tokens of the prompt's worked example (prompt + the dataset's
    completion for it) and EOS, as one document before the row's own prompt.

    Raises:
        ValueError: for a prompt the dataset has no completion for.
    """
    missing = [p for p in prompts if p not in demonstrations]
    if missing:
        raise ValueError(f"distill_teacher='self_demonstration' needs a 'completion' for every prompt; none for "
                         f"{missing[:2]}")
    return [tokenizer(p + demonstrations[p], add_special_tokens=True)["input_ids"] + [eos_token_id] for p in prompts]


def best_sibling_contexts(batch, scores: Tensor, group_size: int) -> list[list[int]]:
    """Self-distillation's best sibling for each row: the prompt and completion tokens (as sampled, padding dropped)
    of the highest-scored completion of the row's group (the first of equals), when it scored above 0; else an empty
    context (no success to learn from: the teacher is then the student, and the row gets no gradient)."""
    out = []
    s = torch.nan_to_num(scores.cpu(), nan=float("-inf")).view(-1, group_size)  # (N, G)
    for g, row in enumerate(s):
        best = g * group_size + int(row.argmax())
        ids = batch.input_ids[best][batch.attention_mask[best] > 0].tolist()  # prompt + completion, unpadded
        context = ids if float(row.max()) > 0 else []
        out += [context] * group_size
    return out


def self_teacher_inputs(input_ids: Tensor, attention_mask: Tensor, n_prompt_tokens: int, contexts: list[list[int]],
                        pad_token_id: int) -> tuple[Tensor, Tensor]:
    """(B, P' + T) ids and attention mask of the self-teacher: each row's context tokens, then its own prompt tokens
    and its completion, token for token, left-padded to one prompt width P'. A row with an empty context is the
    student's row itself (when every context is empty, the tensors are the inputs unchanged).

    Example: prompt [p1, p2] (P = 3, one pad), completion [c1, EOS], context [d1, d2, EOS]: the teacher's row is
    [d1, d2, EOS, p1, p2, c1, EOS], P' = 5.
    """
    P = n_prompt_tokens
    heads = [ctx + ids[:P][m[:P] > 0].tolist() for ctx, ids, m in zip(contexts, input_ids, attention_mask,
                                                                         strict=True)]
    width = max(len(h) for h in heads)
    device = input_ids.device
    head_ids = torch.tensor([[pad_token_id] * (width - len(h)) + h for h in heads], device=device)
    head_mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in heads], device=device)
    return (torch.cat([head_ids.to(input_ids.dtype), input_ids[:, P:]], 1),
            torch.cat([head_mask.to(attention_mask.dtype), attention_mask[:, P:]], 1))


def train_distill(model, tokenizer, cfg: RLConfig, train_data, eval_data=None, *, teacher, reward_fn=None,
                  reward_weights=None, callback=None, output_dir: str | Path | None = None,
                  resume_from: str | Path | None = None) -> History:
    """Distil ``teacher`` into ``model`` (trained in place) with the objective ``cfg.distill``; return the History.

    Args:
        model: the student (a causal LM with the teacher's tokenizer).
        tokenizer: their tokenizer.
        cfg: an RLConfig with ``distill`` set; read: steps, prompts_per_step, group_size, max_new_tokens, temperature
            (sampling and both distributions), lr, weight_decay, max_grad_norm, micro_batch_size, adv_scale and
            adv_eps (the mix's task advantage), distill_gamma, distill_coef, task_coef, distill_teacher, eval_every,
            seed, progress.
        train_data: a Dataset with a ``prompt`` column and what the reward reads.
        eval_data: optional held-out Dataset, evaluated before training, every ``eval_every`` steps and at the end.
        teacher: the frozen teacher (``load_teacher``); never trained. None with a self-teacher
            (``cfg.distill_teacher`` "self_demonstration" or "self_best_sibling": the student is its own teacher).
        reward_fn: the task reward in TRL's form (default the running-sums task's), or a list of them; logged, trained
            on by the mix.
        reward_weights: one weight per reward function (default 1 each).
        callback: ``callback(step, row)`` after each step, before the row is logged (as in ``train_rl``).
        output_dir: where the student is saved at the end (``policy/``); None saves nothing.
        resume_from: not supported here (a ValueError): distillation runs are short; rerun them.

    Returns:
        History: per step the task score of the rollout (``score``; the teacher's samples for "sft"), ``kl_teacher``
        (nats per token: the mean of log p - log q over the rollout's tokens, an estimate of the reverse KL on the
        student's own samples), ``loss``, ``grad_norm``, ``entropy``, ``gen_samples``, timings, held-out metrics.

    Raises:
        ValueError: for an invalid config (``RLConfig.validate``), ``cfg.distill == "none"``, no teacher (or one
            given with a self-teacher), a teacher whose vocabulary differs from the student's, ``resume_from``, or,
            for "self_demonstration", training data without a ``completion`` column or with non-string prompts.

    Source: Agarwal et al. 2024 (GKD, arXiv 2306.13649), algorithm 1 with lambda = 1 (always the student's samples);
    Thinking Machines, "On-Policy Distillation" (2025); Kim & Rush 2016 (SFT on teacher samples).
    """
    cfg.validate()
    self_teacher = cfg.distill_teacher != "external"
    if self_teacher and teacher is not None:
        raise ValueError(f"distill_teacher={cfg.distill_teacher!r}: the student is its own teacher; pass teacher=None")
    teacher = model if self_teacher else teacher
    if cfg.distill == "none" or teacher is None:
        raise ValueError(f"train_distill needs cfg.distill in {DISTILL_OBJECTIVES[1:]} and a teacher, got "
                         f"distill={cfg.distill!r}, teacher={type(teacher).__name__}")
    demonstrations = {}
    if cfg.distill_teacher == "self_demonstration":
        if "completion" not in train_data.column_names or not all(isinstance(p, str) for p in train_data["prompt"]):
            raise ValueError("distill_teacher='self_demonstration' reads a 'completion' column (the demonstration) "
                             "beside string prompts")
        demonstrations = dict(zip(train_data["prompt"], train_data["completion"], strict=True))
    if teacher.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"the teacher's vocabulary ({teacher.config.vocab_size}) must be the student's "
                         f"({model.config.vocab_size}): distillation compares their next-token distributions")
    if resume_from is not None:
        raise ValueError("train_distill does not resume from checkpoints (resume_from must be None)")
    if not self_teacher:
        teacher.eval().requires_grad_(False)
    reward_fn = reward_fn or tasks.running_sums_reward
    set_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    optimizer = rl.make_optimizer(model, None, cfg)
    history = History()
    if eval_data is not None:
        history.log(step=0, **eval_metrics(model, tokenizer, eval_data, cfg, 0, reward_fn))
    for step in tqdm(range(1, cfg.steps + 1), desc=f"distill {cfg.distill}", disable=not cfg.progress,
                     mininterval=PROGRESS_INTERVAL):
        t0 = time.time()
        # 1. rollout: the student's own samples (on-policy), or the teacher's (SFT on teacher samples)
        sampler = teacher if cfg.distill == "sft" else model
        kwargs = {"trainer_state": rl.TrainerState(global_step=step - 1, max_steps=cfg.steps),
                  "log_metric": rl.metric_logger({})}
        batch, scores, gen_stats = rl.collect(sampler, tokenizer, train_data, cfg, reward_fn=reward_fn,
                                              reward_weights=reward_weights, gen=gen, reward_kwargs=kwargs)
        task_advantages = torch.zeros_like(scores)  # (B,) the mix's share of the task reward: GRPO's advantage
        if cfg.task_coef > 0:
            task_advantages = cfg.task_coef * adv.group_advantages(scores, cfg.group_size, scale=cfg.adv_scale,
                                                                   eps=cfg.adv_eps)
        task_advantages = task_advantages.to(batch.completion_mask.device)
        data = rl.RLBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                          n_prompt_tokens=batch.n_prompt_tokens, completion_mask=batch.completion_mask,
                          loss_mask=batch.completion_mask, old_logprobs=None, advantages=task_advantages)
        if self_teacher:  # the student, shown a demonstration or its best sibling, grades its own tokens
            eos = rollout.eos_token_ids(tokenizer, model)[0]
            contexts = (demonstration_contexts(batch.prompts, demonstrations, tokenizer, eos)
                        if cfg.distill_teacher == "self_demonstration"
                        else best_sibling_contexts(batch, scores, cfg.group_size))
            data.teacher_input_ids, data.teacher_attention_mask = self_teacher_inputs(
                batch.input_ids, batch.attention_mask, batch.n_prompt_tokens, contexts, tokenizer.pad_token_id)
        t_gen = time.time() - t0
        # 2-4. the teacher's grade and the loss, micro-batch by micro-batch; one optimiser step
        stats = distill_update(model, teacher, optimizer, data, cfg)
        # 5. log
        row = dict(step=step, score=float(scores.nanmean()), completion_length=float(batch.lengths.float().mean()),
                   **stats, gen_samples=gen_stats["gen_samples"], time=time.time() - t0, time_generate=t_gen)
        row.update(eval_metrics(model, tokenizer, eval_data, cfg, step, reward_fn))
        if callback is not None:
            callback(step, row)
        history.log(**row)
    if output_dir is not None:
        checkpoint.save_policy(model, tokenizer, Path(output_dir) / checkpoint.POLICY)
    return history


def distill_update(model, teacher, optimizer, data: rl.RLBatch, cfg: RLConfig) -> dict:
    """One optimiser step on the whole rollout ``data``: the per-token objective of ``cfg.distill`` (``token_loss``),
    token-mean over the batch, gradients accumulated over micro-batches of ``cfg.micro_batch_size`` rows (each
    divided by the whole batch's token count, so they add up to the batch's loss).

    Returns:
        dict of floats: loss, kl_teacher (nats per token, mean of log p - log q over the tokens), grad_norm (before
        clipping), entropy (the student's, nats per token).
    """
    n_tokens = max(float(data.loss_mask.sum()), 1.0)
    optimizer.zero_grad(set_to_none=True)
    loss_sum, kl_sum, entropy_sum = 0.0, 0.0, 0.0
    for micro in data.split(cfg.micro_batch_size or len(data)):
        with precision.train_mode(model):
            per_token, logprobs, teacher_logprobs, logits = token_loss(model, teacher, micro, cfg)  # (b, T) each
            loss = losses.aggregate(per_token, micro.loss_mask, "token-mean", denominator=n_tokens)
            loss.backward()
        loss_sum += float(loss.detach())
        kl_sum += float(zero_outside(logprobs.detach() - teacher_logprobs, micro.loss_mask).sum())
        entropy_sum += float((rollout.entropy_from_logits(logits.detach()) * micro.loss_mask).sum())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return {"loss": loss_sum, "kl_teacher": kl_sum / n_tokens, "grad_norm": float(grad_norm),
            "entropy": entropy_sum / n_tokens}


def token_loss(model, teacher, micro: rl.RLBatch, cfg: RLConfig) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The per-token loss of one micro-batch (b rows, T completion tokens) under ``cfg.distill``.

    - "reverse_kl": -A_t log p(y_t), A_t = distill_coef * sum_{s >= t} gamma^(s - t) r_s + the task advantage, with
      r_s = log q(y_s) - log p(y_s) detached: REINFORCE on the student's samples (one step per rollout, so the ratio
      to pi_old is exactly 1 and no clip is needed).
    - "full_reverse_kl": distill_coef * KL(p || q) over the vocabulary at each position - task advantage * log p.
    - "sft": distill_coef * (-log p(y_t)) on the teacher's samples.

    Returns:
        (per_token (b, T) with grad, the student's log-probs (b, T) with grad, the teacher's (b, T) detached,
        the student's logits (b, T, V) at the temperature).
    """
    P, mask, ids = micro.n_prompt_tokens, micro.loss_mask, micro.input_ids
    logits = rollout.completion_logits(model, ids, micro.attention_mask, P,
                                       completion_only=cfg.completion_only_head).float() / cfg.temperature  # (b, T, V)
    logprobs = rollout.selective_log_softmax(logits, ids[:, P:])  # (b, T), with grad
    # the teacher reads the same completion tokens; a self-teacher behind its own context (self_teacher_inputs)
    t_ids, t_mask = ids, micro.attention_mask
    if micro.teacher_input_ids is not None:
        t_ids, t_mask = micro.teacher_input_ids, micro.teacher_attention_mask
    t_P = t_ids.shape[1] - (ids.shape[1] - P)
    with torch.no_grad():  # the teacher on the same rows: the student's twin gives the same numbers bit for bit
        teacher_logits = rollout.completion_logits(teacher, t_ids, t_mask, t_P,
                                                   completion_only=cfg.completion_only_head).float() / cfg.temperature
        teacher_logprobs = rollout.selective_log_softmax(teacher_logits, t_ids[:, t_P:])  # (b, T)
    task = micro.advantages[:, None] * mask  # (b, T) the mix's task advantage (zero without the mix)
    if cfg.distill == "sft":
        per_token = cfg.distill_coef * distill.sft_nll(logprobs, mask)
    elif cfg.distill == "full_reverse_kl":  # logits already divided by the temperature
        per_token = cfg.distill_coef * distill.full_reverse_kl(logits, teacher_logits, mask) - task * logprobs
    else:
        reward = distill.reverse_kl_reward(logprobs, teacher_logprobs, mask)  # (b, T), detached
        advantages = cfg.distill_coef * distill.rewards_to_go(reward, mask, gamma=cfg.distill_gamma) + task
        per_token = -zero_outside(advantages * logprobs, mask)
    return per_token, logprobs, teacher_logprobs, logits
