"""``python -m minirl bench``: where the time of one RL step goes, for the tiny dense and the tiny MoE model.

Each step is the GRPO data path split into its parts: generation (``generate``), the no-grad log-prob forwards
(behaviour policy and reference), the training forward with the loss, the backward pass, and the optimiser step.
Figures are medians over ``repeats`` steps after one warm-up step. Memory: on a GPU, the peak allocated CUDA memory
of each model's steps (``peak_memory_mb`` under each model); on CPU the operating system only gives the process's
peak resident set, which covers both models and the Python runtime, so it is reported once (``peak_rss_mb``).
The result is printed as JSON and not saved.
"""

from __future__ import annotations

import copy
import platform
import resource
import statistics
import time

import torch

from . import advantages, losses, models, rollout, tasks
from .config import resolve_profile, set_seed
from .tokenizer import build_tokenizer


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def bench_model(model, tokenizer, prompts, answers, group_size: int, max_new_tokens: int, repeats: int,
                device: str) -> dict:
    """Time ``repeats`` GRPO steps of ``model`` (after one warm-up) and return the median of each part (seconds)."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    parts = {k: [] for k in ("generate", "logprob_forwards", "train_forward", "backward", "optimizer", "total")}
    tokens = []
    for i in range(repeats + 1):
        t = {}
        _sync(device)
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
            ids = enc.input_ids.repeat_interleave(group_size, 0)
            am = enc.attention_mask.repeat_interleave(group_size, 0)
            out = model.generate(input_ids=ids, attention_mask=am, max_new_tokens=max_new_tokens, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            _sync(device)
            t["generate"] = time.perf_counter() - t0
            P = ids.shape[1]
            mask = rollout.completion_mask(out[:, P:], tokenizer.eos_token_id)
            full_am = torch.cat([am, mask.long()], 1)
            t1 = time.perf_counter()
            old = rollout.token_logprobs(model, out, full_am, P)
            rollout.token_logprobs(ref, out, full_am, P)
            _sync(device)
            t["logprob_forwards"] = time.perf_counter() - t1
        model.train()
        texts = tokenizer.batch_decode(out[:, P:], skip_special_tokens=True)
        reward = torch.tensor([tasks.score(c, a).reward for c, a in
                               zip(texts, [a for a in answers for _ in range(group_size)], strict=True)])
        adv = advantages.group_advantages(reward, group_size).to(device)
        t2 = time.perf_counter()
        logprobs = rollout.token_logprobs(model, out, full_am, P)
        loss, _ = losses.policy_loss(logprobs, old, adv, mask, agg="seq-mean-token-mean")
        _sync(device)
        t3 = time.perf_counter()
        t["train_forward"] = t3 - t2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _sync(device)
        t4 = time.perf_counter()
        t["backward"] = t4 - t3
        opt.step()
        _sync(device)
        t["optimizer"] = time.perf_counter() - t4
        t["total"] = time.perf_counter() - t0
        if i > 0:  # the first step warms up kernels and allocators
            for k, v in t.items():
                parts[k].append(v)
            tokens.append((int(mask.sum()), out.numel()))
    med = {k: round(statistics.median(v), 6) for k, v in parts.items()}  # microseconds: a tiny optimiser step stays > 0
    gen_tokens = statistics.median(n for n, _ in tokens)
    all_tokens = statistics.median(n for _, n in tokens)
    return {
        "seconds": med,
        "completions_per_step": len(prompts) * group_size,
        "generated_tokens_per_step": gen_tokens,
        "generated_tokens_per_s": round(gen_tokens / med["generate"], 1),
        "step_tokens_per_s": round(all_tokens / med["total"], 1),
        "parameters": models.count_parameters(model),
    }


def run_bench(profile: str | None = None, seed: int = 0, repeats: int = 5) -> dict:
    """Bench one RL step on the profile's batch (prompts_per_step x group_size) for the dense and the MoE model.

    The models are randomly initialised (no warm start needed): random models rarely emit EOS, so every step
    generates the full ``max_new_tokens``, the worst case, and the figures are stable.
    """
    prof = resolve_profile(profile)
    set_seed(seed)
    tokenizer = build_tokenizer()
    data = tasks.load_split("train").select(range(prof.prompts_per_step))
    prompts, answers = list(data["prompt"]), list(data["answer"])
    result = {"profile": prof.name, "device": prof.device, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
              "batch": f"{prof.prompts_per_step} prompts x {prof.group_size} samples, "
                       f"max_new_tokens {prof.max_new_tokens}"}
    if prof.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    for kind in ("dense", "moe"):
        build = models.tiny_moe if kind == "moe" else models.tiny_dense
        model = build(tokenizer, seed=seed, **(prof.moe if kind == "moe" else prof.dense)).to(prof.device)
        if prof.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        result[kind] = bench_model(model, tokenizer, prompts, answers, prof.group_size, prof.max_new_tokens,
                                   repeats, prof.device)
        if prof.device == "cuda":
            result[kind]["peak_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        del model
    if prof.device != "cuda":
        result["peak_rss_mb"] = round(_peak_rss_mb(), 1)  # one figure for the whole process, both models
    return result
