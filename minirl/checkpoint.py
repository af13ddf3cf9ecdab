"""Checkpoints of an RL run and the resume that continues it exactly, and the trained policy saved with the run.

A checkpoint of step N is a folder ``checkpoint-N`` holding:

- ``policy/``: the policy and its tokenizer, written by ``save_pretrained`` (so ``models.load`` reads it, and any
  Hugging Face tool does);
- ``trainer_state.pt``: everything else the next step reads: the step, the optimiser's state (AdamW's moments and
  step counts), the reference and the critic when the run has them, the History so far, the current KL
  coefficient (PPO's adaptive controller changes it), every random number generator (Python, NumPy, torch's CPU
  and CUDA ones, and the loop's own prompt-order generator), and the run's settings.

``resume`` puts all of it back into freshly built objects, so the steps after N draw the same prompts and samples
and make the same updates as the run that never stopped: its History rows are equal (``tests/test_resume.py``).
Not restored: the noise stream of a noisy mismatched sampler (``sampler_logit_noise`` / ``sampler_router_noise``),
which restarts from its seed.
"""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import numpy as np
import torch

from .history import History

POLICY, STATE = "policy", "trainer_state.pt"
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
         beta: float, ref_model=None, critic=None) -> Path:
    """Write the checkpoint of ``step`` to the folder ``path`` (the module docstring lists what); returns it."""
    path = Path(path)
    save_policy(model, tokenizer, path / POLICY)
    torch.save({"step": step, "optimizer": optimizer.state_dict(), "history": history.rows, "beta": beta,
                "rng": rng_states(gen), "config": dataclasses.asdict(cfg),
                "ref_model": None if ref_model is None else ref_model.state_dict(),
                "critic": None if critic is None else critic.state_dict()}, path / STATE)
    return path


def resume(path: str | Path, *, cfg, model, optimizer, gen: torch.Generator, ref_model=None, critic=None
           ) -> tuple[int, History, float]:
    """Load the checkpoint at ``path`` into the run's freshly built objects, in place.

    Call it last before the loop: it sets the random number generators to where the saved step left them.

    Args:
        path: a ``checkpoint-N`` folder written by ``save``.
        cfg: the resumed run's RLConfig; only the fields of ``MAY_DIFFER`` (steps, ...) may differ from the saved.
        model, optimizer, gen, ref_model, critic: built as ``train_rl`` builds them.

    Returns:
        (step N, the History of steps 0..N, the KL coefficient after step N).

    Raises:
        ValueError: if ``cfg`` differs from the saved run's in a setting outside ``MAY_DIFFER``, or the checkpoint
            has a reference or critic that the run lacks (or the other way round).
        FileNotFoundError: if ``path`` is not a checkpoint.
    """
    path = Path(path)
    if not (path / STATE).is_file():
        raise FileNotFoundError(f"{path} is not a checkpoint: no {STATE} in it")
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


def latest(output_dir: str | Path) -> Path | None:
    """The ``checkpoint-N`` folder of ``output_dir`` with the largest N, or None when there is none."""
    found = [(int(m.group(1)), p) for p in Path(output_dir).glob("checkpoint-*")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / STATE).is_file()]
    return max(found)[1] if found else None
