"""``python -m minirl bench``: where the time of one RL step goes, for the tiny dense and the tiny MoE model.

Each step is the trainer's own stages (``rl.train_rl``'s functions, called in its order): generation
(``rl.collect``: the decode loop, decoding and scoring), the no-grad log-prob forwards (``rl.behaviour_logprobs``:
pi_old where the step needs it, and the reference), and the update (``rl.update_minibatch`` for every minibatch),
split into its training forward, its backward (with the loss and the gradient clipping) and its optimiser step.
Every completion has exactly ``max_new_tokens`` tokens (``min_new_tokens``), so every step does the same work.
Figures are medians over ``repeats`` steps after one warm-up step. Memory: on a GPU, the peak allocated CUDA memory
of each model's steps (``peak_memory_mb`` under each model); on CPU the operating system only gives the process's
peak resident set, which covers both models and the Python runtime, so it is reported once (``peak_rss_mb``).
The result is printed as JSON and not saved.
"""

from __future__ import annotations

import contextlib
import math
import platform
import resource
import statistics
import time
from collections.abc import Iterator

import torch

from . import decoding, models, rl, rl_update, tasks
from .config import make_config, resolve_profile, set_seed
from .tokenizer import build_tokenizer


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


@contextlib.contextmanager
def _timed(module, name: str, seconds: list[float], device: str) -> Iterator[None]:
    """For the block, ``module.name`` also adds its wall time to ``seconds`` (to split the update into parts)."""
    original = getattr(module, name)

    def timed(*args, **kwargs):
        _sync(device)
        t0 = time.perf_counter()
        result = original(*args, **kwargs)
        _sync(device)
        seconds.append(time.perf_counter() - t0)
        return result

    setattr(module, name, timed)
    try:
        yield
    finally:
        setattr(module, name, original)


def bench_model(model, tokenizer, data, cfg, *, repeats: int, device: str) -> dict:
    """Time ``repeats`` RL steps of ``model`` under ``cfg`` (after one warm-up) with the trainer's own stages, and
    return the median of each part (seconds). ``data`` is a dataset slice with ``prompt`` and ``answer``."""
    ref = rl.reference_model(model, None, cfg)
    optimizer = rl.make_optimizer(model, None, cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    parts = {k: [] for k in ("generate", "logprob_forwards", "train_forward", "backward", "optimizer", "total")}
    tokens = []
    for i in range(repeats + 1):
        t = {}
        _sync(device)
        t0 = time.perf_counter()
        batch, scores, _ = rl.collect(model, tokenizer, data, cfg, reward_fn=tasks.running_sums_reward,
                                      reward_weights=None, gen=gen, min_new_tokens=cfg.max_new_tokens)
        _sync(device)
        t["generate"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        old, ref_lp, routes = rl.behaviour_logprobs(model, ref, batch, cfg)
        _sync(device)
        t["logprob_forwards"] = time.perf_counter() - t1
        advantages_, _, _ = rl.compute_advantages(rl.shape_rewards(scores, batch, cfg), None, batch, cfg,
                                                  beta=cfg.beta)
        rl_batch = rl.RLBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                              n_prompt_tokens=batch.n_prompt_tokens, completion_mask=batch.completion_mask,
                              loss_mask=rl.loss_mask(batch, cfg), old_logprobs=old, advantages=advantages_,
                              ref_logprobs=ref_lp, routes=routes)
        forward_s, step_s = [], []
        t2 = time.perf_counter()
        with _timed(rl_update, "policy_logprobs", forward_s, device), _timed(optimizer, "step", step_s, device):
            for rows in rl.minibatches(len(rl_batch), cfg, gen):
                rl.update_minibatch(model, optimizer, rl_batch[rows], cfg, beta=cfg.beta)
        _sync(device)
        update = time.perf_counter() - t2
        t.update(train_forward=sum(forward_s), optimizer=sum(step_s), backward=update - sum(forward_s) - sum(step_s))
        t["total"] = time.perf_counter() - t0
        if i > 0:  # the first step warms up kernels and allocators
            for k, v in t.items():
                parts[k].append(v)
            tokens.append((int(batch.completion_mask.sum()), batch.input_ids.numel()))
    med = {k: round(statistics.median(v), 6) for k, v in parts.items()}  # microseconds: a tiny optimiser step stays > 0
    gen_tokens = statistics.median(n for n, _ in tokens)
    all_tokens = statistics.median(n for _, n in tokens)
    return {
        "seconds": med,
        "completions_per_step": len(batch.completions),
        "generated_tokens_per_step": gen_tokens,
        "generated_tokens_per_s": round(gen_tokens / med["generate"], 1),
        "step_tokens_per_s": round(all_tokens / med["total"], 1),
        "parameters": models.count_parameters(model),
    }


def run_bench(profile: str | None = None, seed: int = 0, repeats: int = 5) -> dict:
    """Bench one RL step of the main job's config (``make_config("grpo")`` on the profile's batch: prompts_per_step
    x group_size completions of exactly max_new_tokens tokens) for the dense and the MoE model.

    The models are randomly initialised (no warm start needed): the step's work does not depend on the weights.
    """
    prof = resolve_profile(profile)
    set_seed(seed)
    tokenizer = build_tokenizer()
    data = tasks.load_split("train").select(range(prof.prompts_per_step))
    cfg = make_config("grpo", seed=seed, prompts_per_step=prof.prompts_per_step, group_size=prof.group_size,
                      max_new_tokens=prof.max_new_tokens, progress=False)
    result = {"profile": prof.name, "device": prof.device, "torch": torch.__version__,
              "threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
              "batch": f"{prof.prompts_per_step} prompts x {prof.group_size} samples of exactly "
                       f"{prof.max_new_tokens} tokens, the grpo preset (beta {cfg.beta}, "
                       f"{cfg.num_minibatches} minibatches)"}
    if prof.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    for kind in ("dense", "moe"):
        build = models.tiny_moe if kind == "moe" else models.tiny_dense
        model = build(tokenizer, seed=seed, **(prof.moe if kind == "moe" else prof.dense)).to(prof.device)
        if prof.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        result[kind] = bench_model(model, tokenizer, data, cfg, repeats=repeats, device=prof.device)
        if prof.device == "cuda":
            result[kind]["peak_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        del model
    if prof.device != "cuda":
        result["peak_rss_mb"] = round(_peak_rss_mb(), 1)  # one figure for the whole process, both models
    return result


# ------------------------------------------------------------------------------------------------ --vs-trl
def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unavailable"


def run_vs_trl(seed: int = 0, repeats: int = 5, prompts_per_step: int = 16, group_size: int = 8,
               completion_tokens: int = 40) -> dict:
    """One GRPO step of minirl and of TRL's GRPOTrainer on identical work, alternating the two; the ratio of their
    times with its spread.

    Identical work: the same local checkpoint (the cpu profile's tiny dense model, random weights, written with
    ``save_pretrained`` and read back with ``models.load`` for each side), the same prompts (the first
    ``prompts_per_step`` of the train split), the same reward (``tasks.running_sums_reward``), ``group_size``
    completions each of exactly ``completion_tokens`` tokens (EOS suppressed by ``min_new_tokens`` on both sides),
    the GRPO preset (beta 0.04, so a reference forward on both sides), one optimiser step per rollout (on-policy:
    neither side runs a forward for pi_old), float32, the same process and threads. TRL runs its real training loop
    (``trainer.train()``); a callback times each of its steps from ``on_step_begin`` (before generation) to
    ``on_step_end`` (after the optimiser step) and runs one minirl step in between, so the two alternate and share
    whatever load the machine has. The first step of each is a warm-up.

    Returns:
        dict: seconds per step (median, min, max) for each, ``ratio_trl_over_minirl`` (median and min-max over the
        repeats, pairing each TRL step with the minirl step after it), the load average before and after, versions.

    Raises:
        ImportError: when TRL is not installed (``pip install -e ".[trl]"``).
    """
    import io
    import os
    import tempfile

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import TrainerCallback
    from trl import GRPOTrainer
    from trl import __version__ as trl_version

    from . import interop
    from .config import PROFILES, make_config

    prof = PROFILES["cpu"]
    set_seed(seed)
    tokenizer = build_tokenizer()
    data = tasks.load_split("train").select(range(prompts_per_step))
    cfg = make_config("grpo", seed=seed, steps=repeats + 1, prompts_per_step=prompts_per_step,
                      group_size=group_size, max_new_tokens=completion_tokens, num_minibatches=1, progress=False)
    load_before = _loadavg()
    with tempfile.TemporaryDirectory() as ckpt:
        models.tiny_dense(tokenizer, seed=seed, **prof.dense).save_pretrained(ckpt)
        tokenizer.save_pretrained(ckpt)
        # --- minirl: the stages of rl.train_rl, one step per call
        policy = models.load(ckpt)
        ref = rl.reference_model(policy, None, cfg)
        optimizer = rl.make_optimizer(policy, None, cfg)
        gen = torch.Generator().manual_seed(seed)

        def minirl_step() -> float:
            t0 = time.perf_counter()
            batch, scores, _ = rl.collect(policy, tokenizer, data, cfg, reward_fn=tasks.running_sums_reward,
                                          reward_weights=None, gen=gen, min_new_tokens=completion_tokens)
            old, ref_lp, routes = rl.behaviour_logprobs(policy, ref, batch, cfg)
            adv, _, _ = rl.compute_advantages(rl.shape_rewards(scores, batch, cfg), None, batch, cfg, beta=cfg.beta)
            mb = rl.RLBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            n_prompt_tokens=batch.n_prompt_tokens, completion_mask=batch.completion_mask,
                            loss_mask=batch.completion_mask, old_logprobs=old, advantages=adv, ref_logprobs=ref_lp,
                            routes=routes)
            rl.update_minibatch(policy, optimizer, mb, cfg, beta=cfg.beta)
            assert int(batch.completion_mask.sum()) == prompts_per_step * group_size * completion_tokens
            return time.perf_counter() - t0

        # --- TRL: its own loop, timed by a callback that runs a minirl step between two TRL steps
        times = {"minirl": [], "trl": []}

        class Alternate(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                times["trl"].append(time.perf_counter() - self.t0)
                times["minirl"].append(minirl_step())

        with tempfile.TemporaryDirectory() as out:
            args = interop.to_trl(cfg, output_dir=out, report_to="none", use_cpu=True, logging_steps=10**6,
                                  save_strategy="no", disable_tqdm=True, max_steps=repeats + 1,
                                  generation_kwargs={"min_new_tokens": completion_tokens})
            trainer = GRPOTrainer(model=models.load(ckpt), reward_funcs=tasks.running_sums_reward, args=args,
                                  train_dataset=data, processing_class=tokenizer, callbacks=[Alternate()])
            with contextlib.redirect_stdout(io.StringIO()):  # TRL prints its run summary; keep stdout JSON
                trainer.train()
    trl_t, mini_t = times["trl"][1:], times["minirl"][1:]  # drop the warm-up step of each
    ratios = [a / b for a, b in zip(trl_t, mini_t, strict=True)]

    def summary(xs):
        return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}

    return {
        "work": f"{prompts_per_step} prompts x {group_size} completions of exactly {completion_tokens} tokens, "
                f"GRPO preset (beta {cfg.beta}, k3 in the loss), one optimiser step per rollout, float32",
        "model_parameters": models.count_parameters(policy), "repeats": len(ratios),
        "minirl_seconds": summary(mini_t), "trl_seconds": summary(trl_t),
        "ratio_trl_over_minirl": summary(ratios), "trl_gradient_checkpointing": args.gradient_checkpointing,
        "threads": torch.get_num_threads(), "torch": torch.__version__, "trl": trl_version,
        "loadavg_before": load_before, "loadavg_after": _loadavg(),
        "machine": platform.processor() or platform.machine(),
    }


# ------------------------------------------------------------------------------------------------ --real-sizes
def _stage_peak_reset(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return
    try:  # Linux: reset the process's peak resident memory (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _stage_peak_gb(device: str) -> float | None:
    """CUDA: the peak allocated memory since the reset; CPU (Linux): the process's peak resident memory since the
    reset, the Python runtime and libraries included (the CPU has no allocator statistics); else None."""
    if device == "cuda":
        torch.cuda.synchronize()
        return round(torch.cuda.max_memory_allocated() / 1e9, 2)
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        return round(kb * 1024 / 1e9, 2)
    except (OSError, StopIteration):
        return None


def real_sizes_step(model, tokenizer, data, cfg, *, ref, optimizer, gen, device: str) -> dict:
    """One RL step of ``cfg`` in its three stages (``rl.collect``, ``rl.behaviour_logprobs``, the update), each
    timed (s) and with its peak memory (GB = 1e9 bytes; ``_stage_peak_gb``). Every completion is max_new_tokens long
    (``min_new_tokens``), so every step does the same work; the reward (the ids' sum modulo 2) only gives the
    advantages a spread."""
    def reward(prompts, completions, completion_ids, **_):
        return [float(sum(ids) % 2) for ids in completion_ids]

    out = {}
    _stage_peak_reset(device)
    t0 = time.perf_counter()
    batch, scores, _ = rl.collect(model, tokenizer, data, cfg, reward_fn=reward, reward_weights=None, gen=gen,
                                  min_new_tokens=cfg.max_new_tokens)
    _sync(device)
    out["generation"] = (time.perf_counter() - t0, _stage_peak_gb(device))
    _stage_peak_reset(device)
    t0 = time.perf_counter()
    old, ref_lp, routes = rl.behaviour_logprobs(model, ref, batch, cfg)
    _sync(device)
    out["logprob_forward"] = (time.perf_counter() - t0, _stage_peak_gb(device))
    _stage_peak_reset(device)
    t0 = time.perf_counter()
    advantages_, _, _ = rl.compute_advantages(rl.shape_rewards(scores, batch, cfg), None, batch, cfg, beta=cfg.beta)
    rl_batch = rl.RLBatch(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                          n_prompt_tokens=batch.n_prompt_tokens, completion_mask=batch.completion_mask,
                          loss_mask=batch.completion_mask, old_logprobs=old, advantages=advantages_,
                          ref_logprobs=ref_lp, routes=routes)
    for rows in rl.minibatches(len(rl_batch), cfg, gen):
        rl.update_minibatch(model, optimizer, rl_batch[rows], cfg, beta=cfg.beta)
    _sync(device)
    out["update"] = (time.perf_counter() - t0, _stage_peak_gb(device))
    assert int(batch.completion_mask.sum()) == len(batch.completions) * cfg.max_new_tokens  # the fixed work
    return out


#: The row of ``memory.FIT_SETTINGS`` the GPU check runs: it fits 80 GB by the plan, and its larger chunks keep the
#: decode loops and forwards few enough for the check's time budget.
REAL_SIZES_SETTINGS = "checkpointing with larger chunks: generation 256 / log-prob 32 / micro-batch 16 rows"


def run_real_sizes(*, batches=((32, 16), (8, 8)), max_new_tokens: int = 512, prompt_tokens: int = 128,
                   steps: int = 3, layers: int | None = None, hidden_size: int | None = None,
                   settings: str = REAL_SIZES_SETTINGS, seed: int = 0, on_step=None) -> dict:
    """``steps`` RL steps of a random Qwen3-0.6B-shaped model at each batch (prompts x samples), every completion
    ``max_new_tokens`` long, with ``memory.FIT_SETTINGS[settings]``: seconds and peak memory per stage, beside
    ``memory_plan``'s prediction of each stage's peak (the static terms plus that stage's).

    The model is built from Qwen3-0.6B's config (``memory.qwen3_0_6b_config``) with random weights (they change
    neither memory nor time), in float32 on the device; ``layers`` / ``hidden_size`` shrink it for a CPU dry run
    (the vocabulary stays 151,936). Prompts are ``prompt_tokens`` tokens of minirl's tokenizer. On CPU a stage's
    peak is the process's peak resident memory (Linux; the runtime included: no allocator statistics there).

    ``on_step(result, key)``, if given, is called after each step with the result so far (the GPU check prints a
    line and saves the partial result: a part stopped at its time limit still leaves the steps it finished).

    Returns:
        dict: the model's and run's sizes, ``plan`` (GB per stage), and per batch the list of steps' stages
        ``{"generation": [seconds, peak GB], ...}``.
    """
    import datasets
    from transformers import Qwen3ForCausalLM

    from . import memory, precision

    device = "cuda" if torch.cuda.is_available() else "cpu"
    qcfg = memory.qwen3_0_6b_config()
    if layers is not None:
        qcfg.num_hidden_layers = layers
    if hidden_size is not None:
        qcfg.hidden_size, qcfg.intermediate_size = hidden_size, 3 * hidden_size
    tokenizer = build_tokenizer()
    qcfg.pad_token_id, qcfg.eos_token_id, qcfg.bos_token_id = (tokenizer.pad_token_id, tokenizer.eos_token_id,
                                                               tokenizer.bos_token_id)
    prompt = "1" * (prompt_tokens - 1)  # one token per character, after the BOS
    assert len(tokenizer(prompt).input_ids) == prompt_tokens
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "settings": settings, "max_new_tokens": max_new_tokens,
              "prompt_tokens": prompt_tokens, "steps": steps, "batches": {}, "plan": {}}
    for prompts, group in batches:
        set_seed(seed)
        with torch.device(device):
            model = Qwen3ForCausalLM._from_config(qcfg, attn_implementation="sdpa", dtype=torch.float32)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        result["parameters"] = models.count_parameters(model)
        cfg = make_config("grpo", seed=seed, prompts_per_step=prompts, group_size=group, max_new_tokens=max_new_tokens,
                          num_minibatches=1, lr=1e-6, progress=False, **memory.FIT_SETTINGS[settings])
        precision.prepare(model, precision=cfg.precision, lr=cfg.lr, gradient_checkpointing=cfg.gradient_checkpointing)
        ref = rl.reference_model(model, None, cfg)
        optimizer = rl.make_optimizer(model, None, cfg)
        gen = torch.Generator().manual_seed(seed)
        data = datasets.Dataset.from_dict({"prompt": [prompt] * prompts})
        key = f"{prompts}x{group}x{max_new_tokens}"
        plan = memory.memory_plan(qcfg, cfg, prompt_tokens=prompt_tokens)
        static = plan["weights"] + plan["grads"] + plan["optimizer"] + plan["reference"]
        result["plan"][key] = {stage: round((static + held) / 1e9, 2) for stage, held in plan["stages"].items()}
        result["batches"][key] = []
        for _ in range(steps):
            stages = real_sizes_step(model, tokenizer, data, cfg, ref=ref, optimizer=optimizer, gen=gen, device=device)
            result["batches"][key].append({k: [round(s, 3), gb] for k, (s, gb) in stages.items()})
            if on_step is not None:
                on_step(result, key)
        del model, ref, optimizer
        if device == "cuda":
            torch.cuda.empty_cache()
    if device != "cuda":  # the stages' peaks (each stage resets the kernel's, so ru_maxrss holds the last one only)
        peaks = [gb for steps in result["batches"].values() for stages in steps for _, gb in stages.values()]
        result["peak_rss_gb"] = max((gb for gb in peaks if gb is not None), default=None)
    return result


def real_sizes_table(result: dict) -> str:
    """``run_real_sizes``'s result as text: per batch and step, each stage's seconds and measured peak against the
    plan's."""
    lines = [f"random Qwen3-0.6B-shaped model ({result['parameters'] / 1e6:.0f} M parameters) on {result['device']}, "
             f"prompts of {result['prompt_tokens']} tokens, {result['settings']}"]
    for key, steps in result["batches"].items():
        plan = result["plan"][key]
        lines.append(f"{key}:  stage            seconds   peak GB   planned GB")
        for i, stages in enumerate(steps, 1):
            for stage, (seconds, peak) in stages.items():
                shown = "-" if peak is None else f"{peak:.2f}"
                lines.append(f"  step {i}  {stage:<16} {seconds:8.2f} {shown:>9} {plan[stage]:>12.2f}")
    if result.get("peak_rss_gb") is not None:
        lines.append(f"process peak resident memory {result['peak_rss_gb']:.2f} GB; on CPU a stage's peak is the "
                     f"process's resident memory, the Python runtime and libraries included")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ --smollm2
def generation_throughput(model, tokenizer, prompt, *, batch: int, max_new_tokens: int = 64, repeats: int = 2) -> float:
    """Generated tokens per second of ``decoding.sample_tokens`` (minirl's decode loop) on ``batch`` copies of one
    chat ``prompt``, every row exactly ``max_new_tokens`` long (``min_new_tokens``): the fastest of ``repeats``
    runs after a short warm-up."""
    from .chat import encode_prompts
    from .rollout import eos_token_ids

    enc = encode_prompts(tokenizer, [prompt] * batch)
    eos = eos_token_ids(tokenizer, model)
    kw = dict(eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, min_new_tokens=max_new_tokens)
    with torch.no_grad():
        decoding.sample_tokens(model, enc.input_ids, enc.attention_mask, 4, **{**kw, "min_new_tokens": 4})
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            ids, _ = decoding.sample_tokens(model, enc.input_ids, enc.attention_mask, max_new_tokens, **kw)
            best = min(best, time.perf_counter() - t0)
    assert ids.shape == (batch, max_new_tokens)
    return batch * max_new_tokens / best


def run_smollm2(*, batches=(1, 8, 32), threads=(1, 2), attentions=("eager", "sdpa"), max_new_tokens: int = 64,
                steps: int = 2, seed: int = 0) -> dict:
    """The real model on this machine (issue 49): SmolLM2-135M-Instruct's load time, generation throughput by
    batch, thread count and attention kernel, and one GRPO step split by stage with each stage's peak memory beside
    ``memory_plan``'s, at two shapes: the issue's (2 prompts x 4 samples x 96 tokens, the grpo preset with its
    reference copy, beta 0.04) and the stored run's (4 x 8 x 64, beta 0; ``notebooks/results/smollm2_grpo.py``).
    Needs the converted folder (``python -m minirl fetch-smollm2``).

    Returns:
        dict: load_seconds, throughput (``"<attention>/<threads>t/b<batch>"`` -> generated tokens per second),
        hf_generate_b8_tokens_per_s (transformers' ``generate`` at batch 8, sdpa, the process's threads, the same
        fixed work, warm-up and best of two as for minirl's loop),
        and per shape the steps' stages ``{"generation": [seconds, peak GB], ...}`` and the plan's GB per stage.
    """
    from transformers import AutoConfig, AutoTokenizer

    from . import chat, memory, smollm2, word_problems

    folder = smollm2.path()
    if not smollm2.available():
        raise FileNotFoundError(f"{folder} is not there: run python -m minirl fetch-smollm2 first")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    threads_before = torch.get_num_threads()
    result = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "max_new_tokens": max_new_tokens, "throughput": {}, "shapes": {}}
    t0 = time.perf_counter()
    models.load(str(folder), attn_implementation="sdpa")
    result["load_seconds"] = round(time.perf_counter() - t0, 2)
    prompt = chat.as_conversation(word_problems.make(1, seed=seed)[0]["question"])
    result["prompt_tokens"] = len(chat.encode_prompts(tokenizer, [prompt]).input_ids[0])
    for attention in attentions:
        model = models.load(str(folder), attn_implementation=attention)
        for n in threads:
            torch.set_num_threads(n)
            for b in batches:
                tps = generation_throughput(model, tokenizer, prompt, batch=b, max_new_tokens=max_new_tokens)
                result["throughput"][f"{attention}/{n}t/b{b}"] = round(tps, 1)
    torch.set_num_threads(threads_before)
    model = models.load(str(folder), attn_implementation="sdpa")
    enc = chat.encode_prompts(tokenizer, [prompt] * 8)
    kw = dict(do_sample=True, top_k=0, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():  # as generation_throughput: a short warm-up, then the fastest of two runs
        model.generate(**enc, max_new_tokens=4, min_new_tokens=4, **kw)
        best = math.inf
        for _ in range(2):
            t0 = time.perf_counter()
            model.generate(**enc, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, **kw)
            best = min(best, time.perf_counter() - t0)
    result["hf_generate_b8_tokens_per_s"] = round(8 * max_new_tokens / best, 1)
    rows = word_problems.make(8, seed=seed)
    data = word_problems.as_dataset(rows)
    qcfg = AutoConfig.from_pretrained(folder)
    del model
    _release_freed_memory()
    for key, (prompts, group, tokens, beta) in {"2x4x96 grpo preset": (2, 4, 96, 0.04),
                                                "4x8x64 beta 0 (the stored run)": (4, 8, 64, 0.0)}.items():
        set_seed(seed)
        model = models.load(str(folder), attn_implementation="sdpa")
        cfg = make_config("grpo", seed=seed, prompts_per_step=prompts, group_size=group, max_new_tokens=tokens,
                          beta=beta, num_minibatches=1, lr=1e-6, completion_only_head=True, progress=False)
        ref = rl.reference_model(model, None, cfg)
        optimizer = rl.make_optimizer(model, None, cfg)
        gen = torch.Generator().manual_seed(seed)
        plan = memory.memory_plan(qcfg, cfg, prompt_tokens=result["prompt_tokens"])
        static = plan["weights"] + plan["grads"] + plan["optimizer"] + plan["reference"]
        result["shapes"][key] = {
            "plan_gb": {stage: round((static + held) / 1e9, 2) for stage, held in plan["stages"].items()},
            "steps": [{k: [round(s, 2), gb] for k, (s, gb) in real_sizes_step(
                model, tokenizer, data.select(range(prompts)), cfg, ref=ref, optimizer=optimizer, gen=gen,
                device="cpu").items()} for _ in range(steps)]}
        del model, ref, optimizer
        _release_freed_memory()  # so the next shape's peaks do not start from this one's freed pages
    return result


def _release_freed_memory() -> None:
    """Hand memory that Python and torch have freed back to the operating system (glibc keeps it otherwise, and
    the process's resident set, which is what a CPU peak measures, would still count it)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


def smollm2_table(result: dict) -> str:
    """``run_smollm2``'s result as text."""
    lines = [f"SmolLM2-135M-Instruct on {result['machine']}, torch {result['torch']}: load {result['load_seconds']} s; "
             f"prompt {result['prompt_tokens']} tokens, {result['max_new_tokens']} generated tokens per row",
             "generated tokens/s (minirl's decode loop)   batch: " + "  ".join(
                 f"{b:>6}" for b in sorted({int(k.split('/b')[1]) for k in result['throughput']}))]
    for prefix in dict.fromkeys(k.rsplit("/b", 1)[0] for k in result["throughput"]):
        values = [v for k, v in result["throughput"].items() if k.startswith(prefix + "/b")]
        lines.append(f"  {prefix:<42}" + "  ".join(f"{v:6.1f}" for v in values))
    lines.append(f"  transformers' generate, sdpa, batch 8:     {result['hf_generate_b8_tokens_per_s']:.1f}")
    for key, shape in result["shapes"].items():
        lines.append(f"one GRPO step, {key}:  stage  seconds  peak GB (process)  planned GB")
        for i, stages in enumerate(shape["steps"], 1):
            for stage, (seconds, peak) in stages.items():
                lines.append(f"  step {i}  {stage:<16} {seconds:7.2f} {peak:>9} {shape['plan_gb'][stage]:>12}")
    return "\n".join(lines)
