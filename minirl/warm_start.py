"""The SFT warm start: a tiny model from a transformers config, fine-tuned on the task's reference completions,
cached on disk so every notebook and the CLI start from the same checkpoint.

RL needs a policy that is sometimes right: group-relative methods learn nothing from a group whose samples are all
wrong. A short supervised run gets the tiny model there, and leaves it far enough from perfect that RL has room to
show gains.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from filelock import FileLock
from tqdm import tqdm  # plain text bars: no widget warnings in notebooks

from . import models, tasks
from .config import PROGRESS_INTERVAL, Profile, resolve_profile, set_seed
from .evaluation import evaluate
from .tokenizer import build_tokenizer

CACHE_DIR = Path(os.environ.get("MINIRL_CACHE", Path(__file__).resolve().parent.parent / ".cache"))

#: The last distinct prompts of the train split are the warm start's validation set: never in an SFT batch, they
#: decide when the warm start stops (the test split stays untouched for the notebooks' evaluations).
VALIDATION_SIZE = 256
#: Every SFT_EVAL_EVERY steps the warm start samples one completion for each of the first SCREEN_PROMPTS
#: validation prompts (a cheap, noisy screen); once that accuracy is within SCREEN_MARGIN of the target, the check
#: samples SAMPLES_PER_PROMPT completions for every validation prompt, and the run stops at the first such check
#: that reaches the profile's target.
SFT_EVAL_EVERY = 5
SCREEN_PROMPTS = 64
SCREEN_MARGIN = 0.15
SAMPLES_PER_PROMPT = 4
#: The one evaluation of the warm start that every notebook quotes: all prompts of the test split, HELDOUT_SAMPLES
#: completions each at T = 1 (seed 0), and greedy. Computed once per cached checkpoint and stored in its info.json.
HELDOUT_SAMPLES = 16
#: Shipped warm starts (``save_pretrained`` directories named ``<kind>-<profile>-s<seed>``, made by
#: ``data/make_warm_start.py``): loaded instead of trained, so every machine starts from the same weights. Floating
#: point SFT on another CPU, or another thread count, is another model; a shipped checkpoint is the same bytes.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "warm_start"
#: Set to 1 to train (and cache) a warm start even where one is shipped: CI's second configuration does, to check
#: that the SFT path itself still works on another thread count.
TRAIN_ENV = "MINIRL_TRAIN_WARM_START"


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


def sft(model, tokenizer, dataset, steps: int, *, batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
        progress: bool = True, stop: Callable[[int], bool] | None = None) -> list[float]:
    """Supervised fine-tuning on the reference completions (cross-entropy on completion tokens only), with the
    learning rate of ``sft_lr_factor`` (warm-up, then a cosine decay to 0 at ``steps``).

    Args:
        dataset: rows with prompt and completion.
        steps: the schedule's length, and the most steps taken.
        stop: called as ``stop(n)`` after the n-th step; True ends the run there (``warm_start`` stops at a
            target accuracy).

    Returns:
        The loss (nats per completion token) of every step taken.
    """
    set_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: sft_lr_factor(s, steps))
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
        if stop is not None and stop(len(losses_)):
            break
    return losses_


def split_validation(train):
    """(rows to fine-tune on, validation rows): the last ``VALIDATION_SIZE`` distinct prompts of the train split
    are held out, and every row with one of those prompts leaves the fine-tuning rows (the split repeats some short
    prompts, so holding out rows alone would not hold out prompts)."""
    prompts, held, rows = list(train["prompt"]), set(), []
    for i in reversed(range(len(prompts))):
        if prompts[i] not in held and len(held) < VALIDATION_SIZE:
            held.add(prompts[i])
            rows.append(i)
    return train.select([i for i, p in enumerate(prompts) if p not in held]), train.select(sorted(rows))


def sft_lr_factor(step: int, steps: int, warmup: int = 20) -> float:
    """The SFT learning-rate multiplier: a linear warm-up over ``warmup`` steps, then a cosine decay to 0.

    Decaying to 0 is what makes the warm start land in the same place on every machine: with a constant rate the
    last steps still move the weights by a full step of noise, so the final accuracy depends on which batch came
    last and on the CPU's rounding; with the rate near 0 at the end, the run settles.

    Example: steps 100, warmup 20: step 0 -> 0.05, step 19 -> 1.0, step 60 -> 0.5 (halfway through the decay).
    """
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step + 1 - warmup) / max(steps - warmup, 1)))


def warm_start(profile: Profile | str | None = None, seed: int = 0, moe: bool = False, steps: int | None = None,
               *, cache: bool = True, progress: bool = True, train: bool | None = None):
    """The warm-started tiny model of a profile: the shipped checkpoint where there is one, else built from config,
    SFT'd on the train split and cached on disk.

    Shipped: the cpu profile's seed-0 dense warm start lives in ``data/warm_start/dense-cpu-s0`` (a
    ``save_pretrained`` directory; its ``info.json`` names the command, commit, machine and threads that made it,
    its shared held-out evaluation and the sha256 of its weights). It is loaded with ``models.load``, the ordinary
    checkpoint path, whenever its spec matches the one asked for, and never written to. ``train=True`` (or the
    environment variable ``MINIRL_TRAIN_WARM_START=1``) trains and caches instead, as for every other seed and
    profile.

    The run stops at the first check (every ``SFT_EVAL_EVERY`` steps) where the model's sampled accuracy at T = 1 on
    the validation rows (the last ``VALIDATION_SIZE`` prompts of the train split, never trained on;
    ``SAMPLES_PER_PROMPT`` samples each, seeded) reaches the profile's ``sft_target_accuracy``, or at the end of the
    schedule. Selecting the checkpoint by accuracy is what makes the warm start land in the same place for every
    seed and machine: how many steps a seed needs to learn to add varies a lot (175 to 255 over the seeds and thread
    counts of notebooks/results/warm_start_spread.json), but where the run stops varies much less. The full check
    (1,024 samples) costs seconds, so it runs only once a screen of ``SCREEN_PROMPTS`` single samples is within
    ``SCREEN_MARGIN`` of the target (2.5 standard errors of the screen: it almost never misses a model that is
    there). The check is on sampled accuracy, not greedy, because RL starts from what the model samples, and the
    relation between the two differs from seed to seed; every 5 steps, because accuracy rises fast near the target,
    so a coarser check overshoots. Even so, one SFT step can move the accuracy by 10 points near the target, so of
    the first check at or above the target and the last one below it, the run keeps the weights of the closer one.

    The first call trains (about two minutes on the cpu profile, 2 cores) and saves the model and tokenizer with
    ``save_pretrained`` under ``.cache/warmstart/<key>`` (git-ignored); later calls, from any notebook or the CLI,
    load them back with ``models.load``, the same code path as any Hugging Face checkpoint.

    Args:
        profile: a Profile or its name (default: ``resolve_profile()``).
        seed: initialisation and data-order seed.
        moe: the tiny MoE model instead of the dense one.
        steps: SFT steps (default: the profile's).
        cache: read and write the cache.
        progress: show the SFT progress bar.
        train: train (and cache) even where a shipped checkpoint matches; default: ``MINIRL_TRAIN_WARM_START``.

    Returns:
        (model, tokenizer, info) with info holding the SFT loss curve, the validation checks (step, screen
        accuracy, full sampled accuracy or None where the screen was too far below the target), ``kept_step``
        (the step whose weights were kept), the parameter count and the cache path.
    """
    profile = profile if isinstance(profile, Profile) else resolve_profile(profile)
    steps = profile.sft_steps if steps is None else steps
    sizes = profile.moe if moe else profile.dense
    spec = dict(kind="moe" if moe else "dense", sizes=sizes, steps=steps, bs=profile.sft_batch_size,
                lr=profile.sft_lr, target=profile.sft_target_accuracy, seed=seed, version=6)
    shipped = SHIPPED_DIR / f"{spec['kind']}-{profile.name}-s{seed}"
    train = os.environ.get(TRAIN_ENV, "0") == "1" if train is None else train
    if not train and (shipped / "info.json").exists():
        info = json.loads((shipped / "info.json").read_text())
        if info["spec"] == spec:  # a changed profile or SFT recipe trains afresh rather than load stale weights
            return models.load(str(shipped)).to(profile.device), build_tokenizer(), info
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    path = CACHE_DIR / "warmstart" / f"{spec['kind']}-{profile.name}-s{seed}-{key}"
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
    # one process trains, any other waits and then loads (notebooks run in parallel, e.g. pytest -n 2)
    with FileLock(str(path) + ".lock") if cache else contextlib.nullcontext():
        if cache and (path / "info.json").exists():
            tokenizer = build_tokenizer()
            model = models.load(str(path)).to(profile.device)
            info = json.loads((path / "info.json").read_text())
        else:
            model, tokenizer, info = _train(profile, spec, steps=steps, sizes=sizes, seed=seed, moe=moe,
                                            progress=progress, path=path, cache=cache)
        if "heldout" not in info:  # just trained, or cached before the shared evaluation existed
            info["heldout"] = heldout_evaluation(model, tokenizer, profile)
            if cache:
                (path / "info.json").write_text(json.dumps(info))
    return model, tokenizer, info


def _train(profile: Profile, spec: dict, *, steps: int, sizes: dict, seed: int, moe: bool, progress: bool, path: Path,
           cache: bool):
    """Build the tiny model, SFT it until the validation check stops the run, keep the closer checkpoint, save
    (with ``cache``). The caller adds the shared held-out evaluation."""
    tokenizer = build_tokenizer()
    build = models.tiny_moe if moe else models.tiny_dense
    model = build(tokenizer, seed=seed, **sizes).to(profile.device)
    train = tasks.load_split("train")
    sft_rows, validation = split_validation(train)
    checks = []  # (step, screen accuracy, full sampled accuracy or None) on the validation rows
    screen = validation.select(range(SCREEN_PROMPTS))
    target = profile.sft_target_accuracy
    below = {}  # the last full check below the target: its step, accuracy and weights

    def reached_target(n: int) -> bool:
        if n % SFT_EVAL_EVERY:
            return False
        quick = evaluate(model, tokenizer, screen, profile.max_new_tokens, temperature=1.0, seed=seed)["accuracy"]
        accuracy = None
        if quick >= target - SCREEN_MARGIN:
            accuracy = evaluate(model, tokenizer, validation, profile.max_new_tokens, temperature=1.0,
                                samples_per_prompt=SAMPLES_PER_PROMPT, seed=seed)["accuracy"]
        checks.append((n, quick, accuracy))
        if accuracy is not None and accuracy < target:
            below.update(step=n, accuracy=accuracy, weights=copy.deepcopy(model.state_dict()))
        return accuracy is not None and accuracy >= target

    t0 = time.time()
    curve = sft(model, tokenizer, sft_rows, steps, batch_size=profile.sft_batch_size, lr=profile.sft_lr, seed=seed,
                progress=progress, stop=reached_target)
    kept = len(curve)
    # a step can move the accuracy by 10 points: keep whichever of the two checks around the target is closer
    if (below and checks[-1][2] is not None and checks[-1][2] >= target
            and target - below["accuracy"] < checks[-1][2] - target):
        model.load_state_dict(below["weights"])
        kept = below["step"]
    if progress:  # the bar stops short of the schedule on purpose: say why
        reached = bool(checks) and checks[-1][2] is not None and checks[-1][2] >= target
        print(f"warm start: {'stopped' if reached else 'ran'} after {len(curve)} of {steps} SFT steps"
              + (f" (sampled accuracy on the validation prompts reached the target {target})" if reached else
                 f" without reaching the target {target}") + f"; kept the weights of step {kept}")
    model.eval()
    info = {"spec": spec, "sft_loss": curve, "sft_seconds": time.time() - t0, "validation_checks": checks,
            "kept_step": kept,
            "parameters": models.count_parameters(model), "path": str(path.relative_to(CACHE_DIR.parent))
            if CACHE_DIR.parent in path.parents else str(path)}
    if cache:
        path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        (path / "info.json").write_text(json.dumps(info))
    return model, tokenizer, info


def heldout_evaluation(model, tokenizer, profile: Profile) -> dict:
    """The warm start's shared held-out evaluation: every test prompt, ``HELDOUT_SAMPLES`` completions each at
    T = 1 (seed 0), and greedy; standard errors over prompts (a prompt's completions are correlated).

    Every notebook quotes this one evaluation of its starting point (``describe_heldout``), so the same model is never
    reported with five different accuracies. About 15 s on the cpu profile, once per cached checkpoint.

    Returns:
        dict: sampled, sampled_se, greedy, greedy_se (shares of completions that are right), prompts, samples.
    """
    test = tasks.load_split("test")
    sampled = evaluate(model, tokenizer, test, profile.max_new_tokens, temperature=1.0,
                       samples_per_prompt=HELDOUT_SAMPLES, seed=0)
    greedy = evaluate(model, tokenizer, test, profile.max_new_tokens, greedy=True)
    return {"sampled": sampled["accuracy"], "sampled_se": sampled["accuracy_stderr_prompts"],
            "greedy": greedy["accuracy"], "greedy_se": greedy["accuracy_stderr"], "prompts": len(test),
            "samples": HELDOUT_SAMPLES}


def describe_heldout(info: dict) -> str:
    """One line for a notebook: the warm start's shared held-out evaluation (``heldout_evaluation``) with its
    standard errors, e.g. ``warm start (256 test prompts): sampled at T = 1 0.355 +- 0.015 (16 samples each),
    greedy 0.551 +- 0.031``."""
    h = info["heldout"]
    return (f"warm start ({h['prompts']} test prompts): sampled at T = 1 {h['sampled']:.3f} +- {h['sampled_se']:.3f} "
            f"({h['samples']} samples each), greedy {h['greedy']:.3f} +- {h['greedy_se']:.3f}")
