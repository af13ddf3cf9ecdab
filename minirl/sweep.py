"""``python -m minirl sweep SPEC.json``: a grid of arms x seeds, each one ``rl.train_rl`` run, stored and resumable.

A finding is a claim that holds over seeds, so the notebooks plot sweeps, not single runs. A sweep spec is a small
JSON file::

    {"name": "kl_placements", "profile": "cpu", "seeds": [0, 1, 2],
     "base": {"steps": 40, "eval_every": 10},
     "arms": {"k3 in loss": {"algo": "grpo", "kl_estimator": "k3", "kl_placement": "loss"},
              "k1 in reward": {"algo": "grpo", "kl_estimator": "k1", "kl_placement": "reward"}}}

Every run starts from the same warm start (``warm_start(profile, seed=warm_start_seed, moe=moe)``; an arm's
``"model"`` key, e.g. ``{"num_layers": 8}``, changes the model's sizes and so the warm start), trains with
``make_config(**base, **arm, seed=seed)`` and evaluates on the first ``eval_prompts`` held-out prompts (the same
prompts for every run, sampled with the run's seed: the step-0 row of a seed is the same evaluation of the same
model in every arm). The results go beside the spec (or to ``--out``): ``runs/<arm slug>__s<seed>.jsonl`` (the run's
History, one row per step) with its wall time in ``.meta.json``, and ``summary.json`` (per arm and step: mean,
standard deviation, min and max over seeds of the logged metrics; the spec; the command, commit, wall time and
machine). A run whose file exists is not run again, so an interrupted sweep resumes where it stopped; each file is
written only when its run has finished.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from tqdm import tqdm

from . import decoding, models, moe, rl, rollout, tasks
from .config import PROGRESS_INTERVAL, Profile, make_config, resolve_profile
from .evaluation import fresh_sample_kl
from .history import History
from .plots import arm_colors
from .warm_start import warm_start


@dataclass
class SweepSpec:
    """What a sweep runs: ``arms`` (label -> make_config overrides, including ``algo``) x ``seeds``."""

    name: str
    arms: dict[str, dict]
    seeds: list[int]
    profile: str = "cpu"
    base: dict = field(default_factory=dict)  # overrides shared by every arm (an arm's own win)
    moe: bool = False  # warm-start the tiny MoE model instead of the dense one
    warm_start_seed: int = 0  # every run starts from this one warm start; the run seed varies
    eval_prompts: int = 256  # the first N held-out prompts
    kl_probe: dict | None = None  # {"prompts": N, "samples": k, "every": s}: the true KL to the warm start, measured
    #   on fresh samples of the first N held-out prompts every s steps (evaluation.fresh_sample_kl)
    update_probe: dict | None = None  # {"prompts": N, "samples": k}: after every optimiser step, how far it moved
    #   the policy (and an MoE's routing) on k fixed completions of the first N held-out prompts (_update_probe)

    def config(self, arm: str, seed: int):
        """The RLConfig of one run (raises ValueError for an unknown field, as make_config does)."""
        overrides = {**self.base, **self.arms[arm]}
        overrides.pop("moe", None)
        overrides.pop("model", None)
        algo = overrides.pop("algo", "grpo")
        return make_config(algo, **{**overrides, "seed": seed, "progress": False})

    def is_moe(self, arm: str) -> bool:
        """Whether the arm trains the MoE: the arm's own "moe" key, else the spec's (dense and MoE side by side)."""
        return bool(self.arms[arm].get("moe", self.moe))

    def profile_of(self, arm: str) -> Profile:
        """The profile of one arm: the spec's, with the arm's "model" key (e.g. ``{"num_layers": 8}`` or
        ``{"num_experts": 16}``) over the model sizes, so a sweep can vary depth or expert count. A changed size is
        a different warm start (its own SFT run and cache entry, made on first use).

        Raises:
            ValueError: when "model" is not a dict of sizes that ``models.tiny_moe`` (or ``tiny_dense``) takes.
        """
        profile = resolve_profile(self.profile)
        sizes = self.arms[arm].get("model", {})
        kind = "moe" if self.is_moe(arm) else "dense"
        builder = models.tiny_moe if kind == "moe" else models.tiny_dense
        accepted = inspect.signature(builder).parameters.keys() - {"tokenizer", "seed"}
        if not isinstance(sizes, dict) or set(sizes) - accepted:
            raise ValueError(f"arm {arm!r}: model must map sizes of models.tiny_{kind} ({sorted(accepted)}) to "
                             f"values, got {sizes!r}")
        return replace(profile, **{kind: {**getattr(profile, kind), **sizes}}) if sizes else profile


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep spec: every run's config is built once, so a typo fails here, not an hour in.

    Raises:
        ValueError: for a missing or unknown key, an empty ``arms`` or ``seeds``, or an invalid config.
    """
    raw = json.loads(Path(path).read_text())
    known = set(SweepSpec.__dataclass_fields__)
    if set(raw) - known or not {"name", "arms", "seeds"} <= set(raw):
        raise ValueError(f"{path}: a sweep spec needs name, arms and seeds and may have {sorted(known)}; "
                         f"got {sorted(raw)}")
    spec = SweepSpec(**raw)
    if not spec.arms or not spec.seeds:
        raise ValueError(f"{path}: arms and seeds must not be empty")
    slugs = [slug(arm) for arm in spec.arms]
    if len(set(slugs)) < len(slugs) or not all(slugs):
        raise ValueError(f"{path}: arm labels {list(spec.arms)} give file names {slugs}; they must differ")
    for arm in spec.arms:
        spec.config(arm, spec.seeds[0])
        spec.profile_of(arm)
    return spec


def slug(arm: str) -> str:
    """The file-name form of an arm label: lower case, every run of other characters one underscore."""
    return re.sub(r"[^a-z0-9]+", "_", arm.lower()).strip("_")


def run_file(out_dir: Path, arm: str, seed: int) -> Path:
    return out_dir / "runs" / f"{slug(arm)}__s{seed}.jsonl"


def start_weights(info: dict) -> str | None:
    """The sha256 of a warm start's weights, from the info ``warm_start`` returns (None where it names none)."""
    return (info.get("sha256") or {}).get("model.safetensors")


def same_start(summary: dict, info: dict) -> bool:
    """True when every run of a stored sweep started from the warm start ``info`` describes: only then may a
    notebook compare a live run's values with the sweep's (another start is another model)."""
    weights = start_weights(info)
    return weights is not None and summary.get("warm_start_sha256") == weights


def run_one(spec: SweepSpec, arm: str, seed: int, out_dir: Path) -> float:
    """Train one (arm, seed) run and write its History; returns its wall time in seconds."""
    t0 = time.time()
    profile = spec.profile_of(arm)
    model, tokenizer, info = warm_start(profile, seed=spec.warm_start_seed, moe=spec.is_moe(arm), progress=False)
    test = tasks.load_split("test")
    eval_data = test.select(range(min(spec.eval_prompts, len(test))))
    cfg = spec.config(arm, seed)
    probes = [_kl_probe(spec.kl_probe, model, tokenizer, eval_data, cfg)] if spec.kl_probe else []
    hooks = []
    if spec.update_probe:
        probe, hook = _update_probe(spec.update_probe, model, tokenizer, eval_data, cfg)
        probes.append(probe)
        hooks.append(hook)
    try:
        history = rl.train_rl(model, tokenizer, cfg, tasks.load_split("train"), eval_data,
                              callback=(lambda step, row: [p(step, row) for p in probes]) if probes else None)
    finally:
        for hook in hooks:
            hook.remove()
    path = run_file(out_dir, arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    history.to_jsonl(partial)
    seconds = round(time.time() - t0, 1)
    path.with_suffix(".meta.json").write_text(json.dumps({"seconds": seconds, "commit": _commit(),
                                                          "threads": torch.get_num_threads(),
                                                          "warm_start_sha256": start_weights(info)}) + "\n")
    partial.replace(path)  # only a finished run gets its final name: a resumed sweep skips it
    return seconds


def _kl_probe(probe: dict, model, tokenizer, eval_data, cfg):
    """A train_rl callback that adds the true KL(policy || warm start) on fresh samples to the logged row:
    ``true_kl`` (nats per sequence) with ``true_kl_stderr``, ``true_kl_per_token`` and ``fresh_entropy`` (nats per
    token)."""
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    rows = eval_data.select(range(probe["prompts"]))

    def measure(step: int, row: dict) -> None:
        if step % probe["every"] == 0 or step == cfg.steps:
            m = fresh_sample_kl(model, reference, tokenizer, rows["prompt"], samples_per_prompt=probe["samples"],
                                max_new_tokens=cfg.max_new_tokens,
                                temperature=cfg.temperature, seed=cfg.seed + 1)
            row.update(true_kl=m["kl"], true_kl_stderr=m["kl_stderr"], true_kl_per_token=m["kl_per_token"],
                       fresh_entropy=m["entropy"])
    return measure


def _update_probe(probe: dict, model, tokenizer, eval_data, cfg):
    """A train_rl callback, and the optimiser hook it feeds, that measure what each optimiser step does to the
    policy on a FIXED probe batch: k completions of the first N held-out prompts, sampled once from the starting
    model (the global RNG is restored, so the run trains as it would without the probe).

    After every optimiser step (a global ``torch.optim`` post-step hook) the probe's token log-probs, and an MoE's
    routes, are recomputed and compared with those before the step. Each step's row gets:

    - ``update_token_ratio_var``: the variance over the probe's completion tokens of pi_new / pi_before, averaged
      over the step's updates (the spread of a token ratio one update produces, for any arm: GSPO's logged
      ``ratio_std`` is of sequence ratios);
    - ``rollout_token_ratio_var``: the same between the policy that sampled the rollout and the one after all its
      updates (what the rollout's last minibatch sees, before its own update); ``update_abs_log_ratio`` and
      ``rollout_abs_log_ratio``: the mean |log ratio| (nats per token), which a few extreme tokens sway far less;
    - MoE only: ``update_routing_change`` (``moe.routing_change_fraction`` over the probe's real tokens, mean over
      layers and the step's updates), ``update_routing_change_l{i}`` per layer, ``rollout_routing_change``,
      ``router_entropy`` (nats, mean over layers and real tokens) and ``expert_load_max`` (the largest expert's
      share of the token-expert assignments, mean over layers; 1 / num_experts when balanced), after the step.

    Returns:
        (callback, hook handle): remove the handle when the run ends.
    """
    rows = eval_data.select(range(probe["prompts"]))
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed + 2)
        batch = decoding.generate(model, tokenizer, rows["prompt"], probe["samples"], cfg.max_new_tokens,
                                 temperature=cfg.temperature)
    is_moe = any(type(m).__name__.endswith("TopKRouter") for m in model.modules())
    mask, valid = batch.completion_mask > 0, batch.attention_mask

    @torch.no_grad()
    def measure_now() -> tuple[torch.Tensor, moe.Routes | None]:
        if not is_moe:
            return rollout.token_logprobs(model, batch.input_ids, valid, batch.n_prompt_tokens), None
        with moe.record_routing(model) as routes:
            logprobs = rollout.token_logprobs(model, batch.input_ids, valid, batch.n_prompt_tokens)
        return logprobs, routes

    def change(before, after) -> dict:
        log_ratio = (after[0] - before[0])[mask]  # (n_tokens,)
        out = {"token_ratio_var": float(log_ratio.exp().var()), "token_abs_log_ratio": float(log_ratio.abs().mean())}
        if is_moe:
            out["routing_change"] = moe.routing_change_fraction(before[1], after[1], valid, per_layer=True)
        return out

    state = {"now": measure_now(), "updates": []}
    state["rollout_start"] = state["now"]

    def after_update(optimizer, args, kwargs) -> None:
        new = measure_now()
        state["updates"].append(change(state["now"], new))
        state["now"] = new

    def log(step: int, row: dict) -> None:
        updates, state["updates"] = state["updates"], []
        row["update_token_ratio_var"] = statistics.fmean(u["token_ratio_var"] for u in updates)
        row["update_abs_log_ratio"] = statistics.fmean(u["token_abs_log_ratio"] for u in updates)
        whole = change(state["rollout_start"], state["now"])
        row["rollout_token_ratio_var"] = whole["token_ratio_var"]
        row["rollout_abs_log_ratio"] = whole["token_abs_log_ratio"]
        if is_moe:
            per_layer = [statistics.fmean(layer) for layer in zip(*(u["routing_change"] for u in updates), strict=True)]
            row["update_routing_change"] = statistics.fmean(per_layer)
            row.update({f"update_routing_change_l{i}": c for i, c in enumerate(per_layer)})
            row["rollout_routing_change"] = statistics.fmean(whole["routing_change"])
            routes = state["now"][1]
            row["router_entropy"] = statistics.fmean(float(h[valid > 0].mean()) for h in routes.entropy)
            load = moe.expert_load(routes, model.config.num_experts, valid)  # (layers, experts)
            row["expert_load_max"] = float(load.max(-1).values.mean())
        state["rollout_start"] = state["now"]

    return log, register_optimizer_step_post_hook(after_update)


def run_sweep(spec_path: str | Path, out_dir: str | Path | None = None, progress: bool = True) -> dict:
    """Run every (arm, seed) of the spec that has no stored run yet, then write and return the summary."""
    spec = load_spec(spec_path)
    out = Path(out_dir) if out_dir else Path(spec_path).parent
    todo = [(a, s) for a in spec.arms for s in spec.seeds if not run_file(out, a, s).exists()]
    bar = tqdm(todo, desc=f"sweep {spec.name}", disable=not progress, mininterval=PROGRESS_INTERVAL)
    for arm, seed in bar:
        bar.set_postfix_str(f"{arm}, seed {seed}")
        run_one(spec, arm, seed, out)
    metas = {f"{slug(a)}__s{s}": json.loads(run_file(out, a, s).with_suffix(".meta.json").read_text())
             for a in spec.arms for s in spec.seeds}
    seconds = {name: meta["seconds"] for name, meta in metas.items()}
    starts = {meta.get("warm_start_sha256") for meta in metas.values()}
    summary = summarize(spec, out)
    # One warm start for every run, or None (arms with their own model sizes, or runs stored before this was kept).
    summary["warm_start_sha256"] = starts.pop() if len(starts) == 1 else None
    summary.update(command=_command(spec_path, out_dir), commit=_commit(), dirty=_dirty(), run_seconds=seconds,
                   wall_seconds=round(sum(seconds.values()), 1), threads=torch.get_num_threads(),
                   machine=f"{platform.machine()}, {os.cpu_count()} cores", torch=torch.__version__)
    # one line: the curves are most of the stored results, and a device run carries the whole tracked tree (64 MiB)
    (out / "summary.json").write_text(json.dumps(summary, separators=(",", ":")) + "\n")
    return summary


def summarize(spec: SweepSpec, out_dir: str | Path) -> dict:
    """Per arm, per logged metric: the step axis, the mean, standard deviation, min and max over seeds at each
    step where every seed logged it, and ``gen_samples_cum`` (generated samples so far, for arms that differ in
    samples per step). ``final`` holds each seed's last value of each metric."""
    arms = {}
    for arm in spec.arms:
        runs = [History.from_jsonl(run_file(Path(out_dir), arm, s)) for s in spec.seeds]
        metrics = sorted({k for h in runs for r in h.rows for k in r if k != "step"})
        arm_out = {"seeds": spec.seeds, "metrics": {}, "final": {}}
        for key in metrics:
            series = [dict(zip(*h.series(key), strict=True)) for h in runs]
            steps = sorted(set.intersection(*(set(s) for s in series)))
            if not steps:
                continue
            values = [[s[t] for s in series] for t in steps]  # (steps, seeds)
            arm_out["metrics"][key] = {
                "step": steps, "mean": [statistics.fmean(v) for v in values],
                "std": [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values],
                "min": [min(v) for v in values], "max": [max(v) for v in values]}
            arm_out["final"][key] = [s[steps[-1]] for s in series]
        samples = [h.series("gen_samples") for h in runs]  # (steps, samples of each step) per seed
        if all(steps for steps, _ in samples):
            per_step = zip(*(itertools.accumulate(v) for _, v in samples), strict=True)  # samples so far, per seed
            arm_out["gen_samples_cum"] = {"step": samples[0][0], "mean": [statistics.fmean(v) for v in per_step]}
        arms[arm] = arm_out
    stored_spec = asdict(spec)
    if stored_spec["update_probe"] is None:  # added after most sweeps were stored: left out of theirs when unused
        del stored_spec["update_probe"]
    return {"name": spec.name, "spec": stored_spec, "arms": arms}


def load_summary(path: str | Path) -> dict:
    """A stored summary.json (what a notebook plots)."""
    return json.loads(Path(path).read_text())


def plot_metric(ax, summary: dict, key: str, arms=None, x: str = "step", **style) -> None:
    """Draw ``key`` for each arm of a summary: the mean over seeds as a line, min to max as a band.

    Args:
        x: "step" (RL steps) or "samples" (generated samples so far: the fair axis when arms differ in samples per
            step, as dynamic sampling does).
    """
    arms = list(arms or summary["arms"])
    colours = arm_colors(arms)  # no two arms of one figure alike
    for arm in arms:
        s = summary["arms"][arm]
        if key not in s["metrics"]:
            continue
        m = s["metrics"][key]
        xs = m["step"]
        if x == "samples":
            cum = dict(zip(s["gen_samples_cum"]["step"], s["gen_samples_cum"]["mean"], strict=True))
            xs = [cum.get(t, 0.0) for t in m["step"]]  # step 0 (before training): no sample generated yet
        (line,) = ax.plot(xs, m["mean"], label=f"{arm} (n={len(s['seeds'])})", **{"color": colours[arm], **style})
        ax.fill_between(xs, m["min"], m["max"], color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel("generated samples" if x == "samples" else "RL step")
    ax.grid(alpha=0.3)


def _command(spec_path, out_dir) -> str:
    return f"python -m minirl sweep {spec_path}" + (f" --out {out_dir}" if out_dir else "")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _dirty() -> bool:
    """True when the code differs from the commit (uncommitted changes under minirl/)."""
    try:
        return bool(subprocess.run(["git", "status", "--porcelain", "--", "."], capture_output=True, text=True,
                                   cwd=Path(__file__).resolve().parent, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return False
