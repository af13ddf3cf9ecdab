"""Measurements of a model, kept apart from the math: held-out accuracy, the true KL to the reference on fresh
samples, and the memory a training state holds.

Each measurement forks the random number generators, so measuring during training does not change its course.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import tasks
from .checks import zero_outside
from .decoding import generate
from .entropy import mean_pass_at_k
from .kl import exact_token_kl
from .precision import autocast
from .rewards import score_completions
from .rollout import completion_logits, dataset_columns


@torch.no_grad()
def evaluate(model, tokenizer, dataset, max_new_tokens: int, *, temperature: float = 1.0, greedy: bool = False,
             samples_per_prompt: int = 1, batch_size: int = 256, seed: int | None = 0, reward_fn=None,
             reward_kwargs: dict | None = None, generation_batch_size: int | None = None,
             pass_at_k: tuple[int, ...] = ()) -> dict:
    """Held-out accuracy of the model on a split, sampled at ``temperature`` or greedy.

    Args:
        dataset: a Dataset with a ``prompt`` column and the columns ``reward_fn`` reads (e.g.
            ``tasks.load_split("test")``, with ``answer``).
        max_new_tokens: the completion budget.
        temperature: sampling temperature (ignored when greedy).
        greedy: argmax decoding.
        samples_per_prompt: completions per prompt when sampling (more gives a less noisy estimate).
        batch_size: prompts per generate call.
        seed: seeds torch before sampling so evaluations are repeatable (None: leave the RNG alone). The global
            RNG state is restored afterwards, so evaluating does not change the course of training.
        reward_fn: a reward function in TRL's form, or a list of them (see ``rewards.score_completions``); None is
            the running-sums task's 0/1 reward, ``tasks.running_sums_reward``.
        reward_kwargs: further keyword arguments for the reward functions (the RL loops pass ``trainer_state``).
        generation_batch_size: rows per decode loop within a call (``decoding.generate``'s batch_size); None: all.
        pass_at_k: the k of pass@k to estimate from the samples_per_prompt samples (``entropy.mean_pass_at_k``,
            Chen et al. 2021, eq. 1), each 1 <= k <= samples_per_prompt; needs a 0/1 reward (1 counts as correct,
            an unscored completion as wrong).

    Returns:
        dict with accuracy (the mean reward over the scored completions, those not None for every function: for a
        0/1 reward, the share that is right),
        accuracy_stderr (its standard error over completions, which treats them as independent),
        accuracy_stderr_prompts (the standard error over prompts of each prompt's mean reward: the honest one when
        samples_per_prompt > 1, because completions of one prompt are correlated), mean_length (tokens, EOS included),
        mean_length_wrong (the same over the completions with reward <= 0; NaN when there are none),
        truncated_rate, n (completions), for the running-sums task, format_rate, and pass_at_<k> for each k.

    Raises:
        ValueError: for a k outside [1, samples_per_prompt] or a reward other than 0/1 with pass_at_k.
    """
    k = 1 if greedy else samples_per_prompt
    scores, lengths, truncated, formatted = [], [], [], []
    prompts = list(dataset["prompt"])
    with torch.random.fork_rng():  # CPU and CUDA generators are restored on exit
        if seed is not None:
            torch.manual_seed(seed)
        for i in range(0, len(prompts), batch_size):
            rows = dataset.select(range(i, min(i + batch_size, len(prompts))))
            r = generate(model, tokenizer, rows["prompt"], k, max_new_tokens, temperature=temperature, greedy=greedy,
                         recompute_logprobs=False, batch_size=generation_batch_size)  # only the tokens are scored
            r.columns = dataset_columns(rows, r.prompt_index)
            ids = [c[m > 0].tolist() for c, m in zip(r.completion_ids, r.completion_mask, strict=True)]
            scores.append(score_completions(reward_fn or tasks.running_sums_reward, r.prompts, r.completions,
                                            completion_ids=ids, columns=r.columns, reward_kwargs=reward_kwargs))
            formatted += [tasks.parse_answer(c) is not None for c in r.completions]
            lengths.append(r.lengths)
            truncated.append(r.truncated)
    scores = torch.cat(scores)  # (n,), NaN on unscored completions
    n, valid = scores.numel(), scores[~scores.isnan()]
    per_prompt = scores.view(-1, k).nanmean(1)
    per_prompt = per_prompt[~per_prompt.isnan()]
    out = {"accuracy": float(valid.mean()) if valid.numel() else float("nan"),
           "accuracy_stderr": float(valid.std() / valid.numel() ** 0.5) if valid.numel() > 1 else float("nan"),
           "accuracy_stderr_prompts": float(per_prompt.std() / per_prompt.numel() ** 0.5) if per_prompt.numel() > 1
           else float("nan"),
           "mean_length": float(torch.cat(lengths).mean()),
           "mean_length_wrong": float(torch.cat(lengths).float()[scores <= 0].mean()) if (scores <= 0).any()
           else float("nan"),
           "truncated_rate": float(torch.cat(truncated).float().mean()), "n": n}
    if reward_fn is None:
        out["format_rate"] = sum(formatted) / n
    if pass_at_k:
        out.update(pass_at_k_metrics(scores.view(-1, k), pass_at_k))
    return out


def pass_at_k_metrics(scores: Tensor, ks) -> dict:
    """{"pass_at_<k>": mean pass@k} from (P, n) 0/1 rewards (n samples of each of P prompts; NaN: unscored, wrong).

    Raises:
        ValueError: for a reward other than 0, 1 or NaN, or a k outside [1, n] (``entropy.pass_at_k``).
    """
    scored = scores.nan_to_num(0.0)  # (P, n)
    if not ((scored == 0) | (scored == 1)).all():
        raise ValueError("pass@k needs 0/1 rewards (1 = correct); got other values")
    correct = scored.sum(1).long()  # (P,)
    n = torch.full_like(correct, scores.shape[1])
    return {f"pass_at_{k}": mean_pass_at_k(n, correct, k) for k in ks}


def show_completions(models: dict, tokenizer, dataset, max_new_tokens: int, *, samples_per_prompt: int = 2,
                     temperature: float = 1.0, seed: int = 0, reward_fn=None) -> list[dict]:
    """What each model writes: ``samples_per_prompt`` completions per prompt of ``dataset``, with their reward.

    Args:
        models: label -> model (e.g. {"warm start": base, "after GRPO": model}); every model answers the same
            prompts with the same seed.
        dataset: a few rows (prompt and the columns the reward reads).

    Returns:
        One dict per (model, prompt, sample): model, prompt, completion (text) and reward. They are also printed as
        a table, so a notebook cell shows them with one call.
    """
    rows = []
    for label, model in models.items():
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            r = generate(model, tokenizer, list(dataset["prompt"]), samples_per_prompt, max_new_tokens,
                         temperature=temperature, recompute_logprobs=False)
        r.columns = dataset_columns(dataset, r.prompt_index)
        scores = score_completions(reward_fn or tasks.running_sums_reward, r.prompts, r.completions,
                                   completion_ids=[c[m > 0].tolist() for c, m in zip(r.completion_ids,
                                                                                     r.completion_mask, strict=True)],
                                   columns=r.columns)
        rows += [dict(model=label, prompt=p, completion=c, reward=float(x))
                 for p, c, x in zip(r.prompts, r.completions, scores.tolist(), strict=True)]
    width = max(len(r["model"]) for r in rows)
    for r in rows:
        print(f"{r['model']:<{width}}  reward {r['reward']:.0f}  {r['prompt']}{r['completion']}")
    return rows


def eval_due(cfg, step: int) -> bool:
    """Whether the loops evaluate after ``step``: before training (0), every cfg.eval_every steps, and at the end."""
    return step == 0 or step == cfg.steps or bool(cfg.eval_every and step % cfg.eval_every == 0)


def eval_metrics(model, tokenizer, eval_data, cfg, step: int, reward_fn=None, *, reward_kwargs: dict | None = None
                 ) -> dict:
    """Held-out metrics the training loops log before training (step 0), every cfg.eval_every steps and at the end:
    accuracy sampled at cfg.temperature (with its standard error over completions and over prompts; the two are equal
    with one sample per prompt) and greedy. {} without eval data or when ``step`` is not on that schedule."""
    if eval_data is None or not eval_due(cfg, step):
        return {}
    rows = getattr(cfg, "generation_batch_size", None)  # RLConfig's run sizes and precision; PrefConfig has none
    with autocast(model, getattr(cfg, "precision", "fp32")):
        sampled = evaluate(model, tokenizer, eval_data, cfg.max_new_tokens, temperature=cfg.temperature,
                           samples_per_prompt=cfg.eval_samples_per_prompt, seed=cfg.seed, reward_fn=reward_fn,
                           reward_kwargs=reward_kwargs, generation_batch_size=rows,
                           pass_at_k=tuple(getattr(cfg, "eval_pass_at_k", ())))
        greedy = evaluate(model, tokenizer, eval_data, cfg.max_new_tokens, greedy=True, reward_fn=reward_fn,
                          reward_kwargs=reward_kwargs, generation_batch_size=rows)
    return {"eval_accuracy": sampled["accuracy"], "eval_accuracy_stderr": sampled["accuracy_stderr"],
            "eval_accuracy_stderr_prompts": sampled["accuracy_stderr_prompts"],
            "eval_greedy_accuracy": greedy["accuracy"], "eval_length": sampled["mean_length"],
            "eval_wrong_length": sampled["mean_length_wrong"],
            **({"eval_format": sampled["format_rate"]} if "format_rate" in sampled else {}),
            **{f"eval_{name}": v for name, v in sampled.items() if name.startswith("pass_at_")}}


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


@torch.no_grad()
def sequence_kl(model: torch.nn.Module, ref_model: torch.nn.Module, rollout, *, temperature: float = 1.0,
                batch_size: int | None = None) -> tuple[Tensor, Tensor]:
    """The TRUE KL(pi || ref) of each sampled completion: exact per-position KL summed over its valid tokens.

    For completions y sampled from pi, KL_seq(x) = E_y[sum_t KL(pi(. | x, y_<t) || ref(. | x, y_<t))] by the chain
    rule, so the per-row sum returned here is an unbiased estimate of the sequence KL of its prompt, with the same
    mean as the sum of ``k1`` over the row but a much smaller variance (no token is sampled at the position
    itself). Average it over rows (and prompts) for the policy's KL to the reference. This is a *measurement*,
    computed without gradient; it is not what any placement differentiates.

    Args:
        model: the policy pi (a causal LM).
        ref_model: the reference (same tokenizer).
        rollout: a ``rollout.Rollout`` sampled from ``model`` at ``temperature`` (fresh samples, not the training
            batch, to measure the policy as it is now).
        temperature: the sampling temperature (> 0); both models' distributions are taken at it.
        batch_size: rows per pair of forwards (None: all at once); two (b, T, V) logits exist at a time.

    Returns:
        (kl, entropy): kl (B,) nats per completion; entropy (B,) the policy's exact next-token entropy summed over
        the same positions (nats per completion). Divide by ``rollout.lengths`` for per-token figures.

    Raises:
        ValueError: if temperature <= 0 (via ``exact_token_kl``).

    Source: chain rule of the KL divergence (Cover & Thomas, Elements of Information Theory, thm. 2.5.3).
    """
    P, mask = rollout.n_prompt_tokens, rollout.completion_mask  # mask (B, T)
    kl_rows, entropy_rows = [], []
    for rows in torch.arange(len(mask), device=mask.device).split(batch_size or len(mask)):
        ids, am = rollout.input_ids[rows], rollout.attention_mask[rows]
        logits = completion_logits(model, ids, am, P)  # (b, T, V)
        kl_t = exact_token_kl(logits, completion_logits(ref_model, ids, am, P), temperature=temperature)  # (b, T)
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (b, T, V)
        entropy_t = -(logp.exp() * logp).sum(-1)  # (b, T)
        kl_rows.append(zero_outside(kl_t, mask[rows]).sum(-1))
        entropy_rows.append(zero_outside(entropy_t, mask[rows]).sum(-1))
    return torch.cat(kl_rows), torch.cat(entropy_rows)


def fresh_sample_kl(model: torch.nn.Module, ref_model: torch.nn.Module, tokenizer, prompts, *, samples_per_prompt: int,
                    max_new_tokens: int, temperature: float = 1.0, seed: int = 0, answers=None,
                    reward_fn=None) -> dict:
    """Sample fresh completions from ``model`` and measure its true KL to ``ref_model`` on them (``sequence_kl``).

    The global torch RNG is saved and restored around the sampling, so measuring during training (e.g. from a
    ``train_rl`` callback) does not change the course of training; with the same seed the same prompts are
    answered with the same random numbers at every measurement.

    Args:
        model: the policy.
        ref_model: the reference.
        tokenizer: their tokenizer.
        prompts: N prompt strings (e.g. held-out prompts).
        samples_per_prompt: completions per prompt (>= 1).
        max_new_tokens: completion budget.
        temperature: sampling temperature (> 0).
        seed: seed of the sampling.
        answers: optional N answers (``tasks`` records); when given, the same fresh completions are also scored
            and the dict holds their accuracy.
        reward_fn: optional reward function in TRL's form (e.g. a learned reward, ``reward_models.learned_reward``),
            called on the same fresh prompts and completions; the dict then holds their mean score, ``reward``.

    Returns:
        dict with kl (mean nats per completion), kl_stderr (its standard error over completions), kl_per_token
        (total KL / total valid tokens), entropy (the policy's mean next-token entropy, nats per token),
        length (mean tokens per completion, EOS included), n (completions) and, with answers, accuracy; with
        reward_fn, reward.

    Raises:
        ValueError: on an empty prompt list, samples_per_prompt < 1 or temperature <= 0 (from ``decoding.generate``).
    """
    prompts = list(prompts)
    was_training = model.training
    model.eval()
    with torch.random.fork_rng():  # CPU and CUDA generators are restored on exit
        torch.manual_seed(seed)
        batch = generate(model, tokenizer, prompts, samples_per_prompt, max_new_tokens, temperature=temperature,
                         recompute_logprobs=False)  # sequence_kl runs its own forwards
    kl, entropy = sequence_kl(model, ref_model, batch, temperature=temperature)  # (B,), (B,)
    model.train(was_training)
    n_tok = batch.lengths.sum().clamp(min=1)
    out = {"kl": float(kl.mean()), "kl_stderr": float(kl.std() / len(kl) ** 0.5) if len(kl) > 1 else float("nan"),
           "kl_per_token": float(kl.sum() / n_tok), "entropy": float(entropy.sum() / n_tok),
           "length": float(batch.lengths.float().mean()), "n": len(kl)}
    if answers is not None:
        answers = list(answers)
        if len(answers) != len(prompts):
            raise ValueError(f"answers must have one entry per prompt ({len(prompts)}), got {len(answers)}")
        hits = [tasks.score(c, answers[i // samples_per_prompt]).correct for i, c in enumerate(batch.completions)]
        out["accuracy"] = sum(hits) / len(hits)
    if reward_fn is not None:
        scores = reward_fn(list(batch.prompts), list(batch.completions))
        out["reward"] = sum(scores) / len(scores)
    return out
