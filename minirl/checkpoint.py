"""Checkpoints of an RL run and the resume that continues it exactly, and the trained policy saved with the run.

A checkpoint of step N is a folder ``checkpoint-N`` holding:

- ``policy/``: the policy and its tokenizer, written by ``save_pretrained`` (so ``models.load`` reads it, and any
  Hugging Face tool does);
- ``trainer_state.pt``: everything else the next step reads: the step, the optimiser's state (AdamW's moments and
  step counts), the reference and the critic when the run has them, the History so far, the current KL
  coefficient (PPO's adaptive controller changes it), every random number generator (Python, NumPy, torch's CPU
  and CUDA ones, and the loop's own prompt-order generator), and the run's settings;
- ``checkpoint.json``, written last: the run's identity (``run_identity``: the model, its config and initial
  weights, the training rows, the reward functions and weights) and the size of every file above.

A checkpoint is written under a temporary name (``.checkpoint-N.tmp``) and renamed into place when complete, so a
stop while writing leaves no ``checkpoint-N``; ``latest`` takes only folders whose ``checkpoint.json`` lists files
of the sizes on disk (a truncated ``trainer_state.pt`` is passed over). ``check_output_dir`` refuses a new run
into a folder that holds checkpoints (``clear`` removes them), and a resume into one that holds another run's.

``resume`` puts all of it back into freshly built objects, so the steps after N draw the same prompts and samples
and make the same updates as the run that never stopped: its History rows are equal (``tests/test_resume.py``).
It refuses a checkpoint of another run: other settings, or another identity (model, data, rewards). Not restored:
the noise stream of a noisy mismatched sampler (``sampler_logit_noise`` / ``sampler_router_noise``), which restarts
from its seed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from .history import History

POLICY, STATE, MANIFEST = "policy", "trainer_state.pt", "checkpoint.json"
#: Settings that may change between a run and its resume: they do not change what a step computes.
MAY_DIFFER = ("steps", "progress", "checkpoint_every", "eval_every", "report_to")


def save_policy(model, tokenizer, path: str | Path) -> Path:
    """Write the policy and its tokenizer to ``path`` with ``save_pretrained`` (safetensors weights, config,
    generation config, tokenizer files; a LoRA policy's adapter only, ``lora.save_adapter``); ``models.load(path)``
    reads it back. Returns ``path``."""
    from . import lora

    path = Path(path)
    if lora.is_lora(model):
        lora.save_adapter(model, path)
    else:
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_weights(model, path: str | Path) -> None:
    """Copy the weights that ``save_pretrained`` wrote to ``path`` into ``model`` in place; for a LoRA policy, the
    adapter's (``lora.load_adapter_weights``).

    The files are read as they are when their names are ``model``'s own. transformers writes some layouts otherwise
    than it holds them (an MoE's experts: fused ``experts.gate_up_proj`` in memory, one ``experts.E.up_proj``
    tensor per expert on disk); then its own loading path reads them (``from_pretrained`` of ``model``'s class,
    which converts them back, exactly: a concatenation) into a second model on the CPU, whose weights are copied.

    Raises:
        ValueError: if a saved tensor is not a parameter or buffer of ``model``, or a tensor of ``model`` is
            missing from the files without sharing its storage with one that was loaded (tied embeddings are
            saved once).
        FileNotFoundError: if ``path`` holds no ``*.safetensors`` file.
    """
    from safetensors.torch import load_file

    from . import lora

    if lora.is_lora(model):  # a LoRA run saved its adapter only; the frozen base is already in place
        return lora.load_adapter_weights(model, path)
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state = {k: v for f in files for k, v in load_file(f).items()}
    own = model.state_dict()
    if not state.keys() <= own.keys() and hasattr(type(model), "from_pretrained"):  # converted on save: convert back
        state = type(model).from_pretrained(path, dtype="auto").state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    loaded = {own[k].data_ptr() for k in state if k in own}
    untied = [k for k in missing if own[k].data_ptr() not in loaded]
    if unexpected or untied:
        raise ValueError(f"the weights in {path} do not fit the model: unexpected {unexpected}, missing {untied}")


def rng_states(gen: torch.Generator) -> dict:
    """Every random number generator a step draws from: Python's, NumPy's, torch's (CPU, and CUDA when present)
    and the loop's generator ``gen`` (prompt order, minibatch splits)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None, "loop": gen.get_state()}


def set_rng_states(states: dict, gen: torch.Generator) -> None:
    """Put back what ``rng_states`` returned."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    gen.set_state(states["loop"])


def save(path: str | Path, *, step: int, cfg, model, tokenizer, optimizer, gen: torch.Generator, history: History,
         beta: float, ref_model=None, critic=None, run: dict | None = None) -> Path:
    """Write the checkpoint of ``step`` to the folder ``path`` (the module docstring lists what); returns it.

    Written to ``.<name>.tmp`` beside ``path`` first, ``checkpoint.json`` last, then renamed to ``path`` (an older
    folder of that name is moved aside and removed after): a stop at any moment leaves either the whole checkpoint
    or none. ``run``: the run's identity (``run_identity``) that a resume must match.
    """
    path = Path(path)
    tmp, old = path.with_name(f".{path.name}.tmp"), path.with_name(f".{path.name}.old")
    for leftover in (tmp, old):
        shutil.rmtree(leftover, ignore_errors=True)
    save_policy(model, tokenizer, tmp / POLICY)
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "history": history.rows, "beta": beta,
                "rng": rng_states(gen), "config": dataclasses.asdict(cfg),
                "ref_model": None if ref_model is None else ref_model.state_dict(),
                "critic": None if critic is None else critic.state_dict()}, tmp / STATE)
    files = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, "run": run, "files": files}, indent=1))
    if path.exists():
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def manifest(path: str | Path) -> dict | None:
    """The ``checkpoint.json`` of the checkpoint folder ``path`` when the checkpoint is complete (every file it
    lists has the size it lists), else None: no manifest (a stop while writing, or an older minirl's checkpoint),
    an unreadable one, or a missing or truncated file."""
    path = Path(path)
    try:
        found = json.loads((path / MANIFEST).read_text())
        sizes_fit = all((path / name).stat().st_size == size for name, size in found["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return found if sizes_fit and STATE in found["files"] else None


#: Model config entries that are runtime switches, not the model: left out of ``run_identity``'s config hash.
RUNTIME_CONFIG = ("architectures", "transformers_version", "dtype", "torch_dtype", "use_cache", "output_attentions",
                  "output_hidden_states", "output_router_logits", "return_dict")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def weights_fingerprint(model, per_tensor: int = 4096) -> str:
    """A hash of ``model``'s weights: each tensor's name, shape, dtype and up to ``per_tensor`` of its values taken
    at an even stride (copied to the CPU), so a model of the same shapes with other weights hashes otherwise, at
    the cost of a few thousand values per tensor, not the whole model. 16 hex digits."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        flat = t.detach().reshape(-1)
        sample = flat[::max(1, flat.numel() // per_tensor)][:per_tensor].float().cpu().numpy()
        h.update(f"{name} {tuple(t.shape)} {t.dtype}".encode() + sample.tobytes())
    return h.hexdigest()[:16]


def data_fingerprint(data) -> str:
    """A hash of every row of ``data`` (a ``datasets.Dataset``: its columns and values, in order), read in batches
    of 1,000 rows. A system prompt, rendered into the prompts, is part of it. 16 hex digits."""
    h = hashlib.sha256(json.dumps([len(data), list(data.column_names)]).encode())
    for batch in data.iter(batch_size=1000):
        h.update(json.dumps(batch, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _reward_name(fn) -> str:
    fn = getattr(fn, "func", fn)  # functools.partial: its function
    return f"{getattr(fn, '__module__', None) or ''}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def run_identity(model, train_data, reward_fn, reward_weights=None) -> dict:
    """What defines a run besides its RLConfig, for a resume to match (``resume``) and ``checkpoint.json`` to name.

    Args:
        model: the policy as the loop starts it (before the first step; LoRA: with its adapter).
        train_data: the training rows (``datasets.Dataset``).
        reward_fn: one reward function or a list; reward_weights: one weight each (None: 1 each).

    Returns:
        dict of ``model`` (its name or path, for the messages; not compared: a moved folder is the same model),
        ``model_config`` (a hash of its config without the runtime switches of ``RUNTIME_CONFIG``), ``weights``
        (``weights_fingerprint``), ``data`` (``data_fingerprint``), ``rewards`` (each function's module and name)
        and ``reward_weights``.
    """
    fns = list(reward_fn) if isinstance(reward_fn, (list, tuple)) else [reward_fn]
    config = getattr(model, "config", None)
    entries = {k: v for k, v in (config.to_dict() if config is not None else {}).items()
               if not k.startswith("_") and k not in RUNTIME_CONFIG}
    return {"model": str(getattr(config, "name_or_path", "") or type(model).__name__),
            "model_config": _sha(json.dumps(entries, sort_keys=True, default=str)),
            "weights": weights_fingerprint(model), "data": data_fingerprint(train_data),
            "rewards": [_reward_name(f) for f in fns],
            "reward_weights": [float(w) for w in (reward_weights if reward_weights is not None else [1.0] * len(fns))]}


def run_differences(saved: dict, run: dict) -> dict:
    """The entries of two ``run_identity`` dicts that differ, as {name: (saved, now)}; ``model`` (a name) is not
    compared."""
    return {k: (saved.get(k), v) for k, v in run.items() if k != "model" and saved.get(k) != v}


def resume(path: str | Path, *, cfg, model, optimizer, gen: torch.Generator, ref_model=None, critic=None,
           run: dict | None = None) -> tuple[int, History, float]:
    """Load the checkpoint at ``path`` into the run's freshly built objects, in place.

    Call it last before the loop: it sets the random number generators to where the saved step left them.

    Args:
        path: a ``checkpoint-N`` folder written by ``save``.
        cfg: the resumed run's RLConfig; only the fields of ``MAY_DIFFER`` (steps, ...) may differ from the saved.
        model, optimizer, gen, ref_model, critic: built as ``train_rl`` builds them.
        run: the resumed run's ``run_identity``; it must equal the saved one (the model's name aside). None: not
            checked.

    Returns:
        (step N, the History of steps 0..N, the KL coefficient after step N).

    Raises:
        ValueError: if the checkpoint is incomplete (``manifest``), its run differs from ``run`` (another model,
            model config, data, reward or weight), ``cfg`` differs from the saved run's in a setting outside
            ``MAY_DIFFER``, or the checkpoint has a reference or critic that the run lacks (or the other way round).
        FileNotFoundError: if ``path`` is not a checkpoint.
    """
    path = Path(path)
    if not (path / STATE).is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: no {STATE} in it")
    saved = manifest(path)
    if saved is None:
        raise ValueError(f"{path} is incomplete: no {MANIFEST}, or a file of another size than it lists (a stop "
                         f"while writing, or a checkpoint of an older minirl); resume from a complete one")
    if run is not None and saved["run"] is not None and (differ := run_differences(saved["run"], run)):
        raise ValueError(f"{path} is a checkpoint of another run: it differs in {differ} (saved, now; the run "
                         f"started from {saved['run']['model']}); resume with the model, data, rewards and reward "
                         f"weights it started with")
    state = torch.load(path / STATE, weights_only=False)  # our own file: RNG states are Python objects
    changed = {k: (v, getattr(cfg, k)) for k, v in state["config"].items()
               if k not in MAY_DIFFER and getattr(cfg, k, v) != v}
    if changed:
        raise ValueError(f"cfg differs from the checkpoint's run in {changed} (saved, now); resume with the same "
                         f"settings (only {MAY_DIFFER} may change)")
    for name, module in (("ref_model", ref_model), ("critic", critic)):
        if (state[name] is None) != (module is None):
            raise ValueError(f"the checkpoint {'has no' if state[name] is None else 'has a'} {name} but the resumed "
                             f"run {'has one' if state[name] is None else 'does not'}")
        if module is not None:
            module.load_state_dict(state[name])
    load_weights(model, path / POLICY)
    optimizer.load_state_dict(state["optimizer"])
    set_rng_states(state["rng"], gen)
    return state["step"], History(list(state["history"])), state["beta"]


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Every ``checkpoint-N`` folder of ``output_dir``, complete or not, by N."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest(output_dir: str | Path) -> Path | None:
    """The complete (``manifest``) ``checkpoint-N`` folder of ``output_dir`` with the largest N, or None when there
    is none."""
    found = [p for p in checkpoints(output_dir) if manifest(p) is not None]
    return found[-1] if found else None


def check_output_dir(output_dir: str | Path | None, run: dict | None, *, resuming: bool) -> None:
    """Refuse to mix two runs' checkpoints in ``output_dir``, before anything is written.

    A new run into a folder with checkpoints would overwrite ``checkpoint-1..k`` and leave the earlier run's later
    ones, which ``latest`` then picks. A resume may write beside checkpoints of its own run (``run`` equal), not
    beside another's. None: nothing to check.

    Raises:
        ValueError: for a new run (``resuming`` False) into a folder that holds ``checkpoint-N`` folders (resume it,
            take another folder, or ``clear`` it: the CLI's ``--overwrite``), or a resume into one that holds a
            complete checkpoint of another run.
    """
    if output_dir is None or not (found := checkpoints(output_dir)):
        return
    if not resuming:
        raise ValueError(f"output_dir {output_dir} already holds checkpoints of an earlier run "
                         f"({', '.join(p.name for p in found)}): a new run would overwrite some and leave the others "
                         f"for a resume to pick up; resume it (resume_from, --resume latest), choose another output "
                         f"folder, or remove them (checkpoint.clear, --overwrite)")
    other = [p.name for p in found if run is not None and (m := manifest(p)) is not None and m["run"] is not None
             and run_differences(m["run"], run)]
    if other:
        raise ValueError(f"output_dir {output_dir} holds checkpoints of another run ({', '.join(other)}); resume "
                         f"into another folder, or remove them (checkpoint.clear, --overwrite)")


def prepare_run(output_dir: str | Path | None, resume_from: str | Path | None, *, checkpoint_every: int, model,
                train_data, reward_fn, reward_weights=None) -> dict | None:
    """What ``rl.train_rl`` checks before it writes anything, and the identity its checkpoints carry.

    Returns:
        The run's ``run_identity`` when it writes to ``output_dir`` or resumes, else None (nothing to match).

    Raises:
        ValueError: for ``checkpoint_every`` > 0 without an ``output_dir`` to write to, and
            ``check_output_dir``'s refusals.
    """
    if checkpoint_every and output_dir is None:
        raise ValueError(f"cfg.checkpoint_every={checkpoint_every} needs an output_dir to write checkpoints to")
    if output_dir is None and resume_from is None:
        return None
    run = run_identity(model, train_data, reward_fn, reward_weights)
    check_output_dir(output_dir, run, resuming=resume_from is not None)
    return run


def clear(output_dir: str | Path) -> list[str]:
    """Remove the ``checkpoint-N`` folders of ``output_dir`` and the temporary ones a stopped ``save`` left; the rest
    (metrics, policy/) stays. Returns the names removed."""
    found = checkpoints(output_dir) + [p for p in Path(output_dir).glob(".checkpoint-*") if p.is_dir()]
    for p in found:
        shutil.rmtree(p)
    return [p.name for p in found]
