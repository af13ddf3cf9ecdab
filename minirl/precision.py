"""How the update runs on a real model: the precision of weights and forwards, train mode, gradient checkpointing.

Three traps a toy never shows, each closed here and used by ``rl.train_rl``:

- Precision. bfloat16 keeps 8 significant bits, so a weight w moves only when an update exceeds about |w| * 2^-8
  (half its spacing). AdamW's first steps move every weight by about lr, so at lr 1e-6 almost nothing moves in
  bfloat16 (on the tests' stand-in 2.1% of the weights) while float32 moves all of them. ``"bf16-autocast"`` keeps
  float32 master weights and AdamW state and runs the forwards in bfloat16 (the usual mixed precision:
  ``torch.autocast``); ``"bf16"`` trains bfloat16 weights and warns.
- Train mode. transformers' gradient checkpointing recomputes a layer only when the model is in train mode, and a
  loaded checkpoint comes in eval mode: ``train_mode`` holds train mode while the update runs and restores the
  mode after.
- Gradient checkpointing recomputes each decoder layer's forward inside the backward. Forward hooks that change
  a layer's output (routing replay) must still be registered then, or the recompute routes differently from the
  forward (torch raises ``CheckpointError``): ``rl.update_minibatch`` holds the replay through the backward.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager, nullcontext

import torch

from .checks import choice

#: The precisions of ``RLConfig.precision``.
PRECISIONS = ("fp32", "bf16-autocast", "bf16")


def prepare(model: torch.nn.Module, *, precision: str, lr: float, gradient_checkpointing: bool = False) -> None:
    """Check (or set) the policy's weight dtype for ``precision`` and switch on gradient checkpointing if asked.

    - "fp32" and "bf16-autocast" need float32 trainable weights (the master copy AdamW updates); a bfloat16 model
      is refused rather than silently trained without one.
    - "bf16" casts the model to bfloat16 in place and warns: AdamW's state is then bfloat16 too, and updates
      smaller than about 2^-8 of a weight round to nothing.

    Args:
        model: the policy, changed in place ("bf16" cast, checkpointing switched on).
        precision: one of ``PRECISIONS``.
        lr: the learning rate, quoted in the "bf16" warning.
        gradient_checkpointing: call the model's own ``activation_checkpointing_enable`` (transformers >= 5;
            ``gradient_checkpointing_enable`` before), non-reentrant.

    Raises:
        ValueError: for an unknown precision, trainable weights that are not float32 under "fp32" /
            "bf16-autocast", or gradient checkpointing on a model without the switch.
    """
    choice("precision", precision, PRECISIONS)
    if precision == "bf16":
        warnings.warn(f"precision='bf16' trains bfloat16 weights with bfloat16 AdamW state and no float32 master "
                      f"copy: an update smaller than about 2^-8 of a weight rounds to nothing (an Adam step of about "
                      f"lr = {lr:g} moves only weights below about {lr * 2 ** 8:.1e}); precision='bf16-autocast' "
                      f"keeps float32 master weights", UserWarning, stacklevel=3)
        model.to(torch.bfloat16)
    else:
        dtypes = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad})
        if dtypes != ["torch.float32"]:
            raise ValueError(f"precision={precision!r} needs float32 trainable weights (the master copy AdamW "
                             f"updates), got {dtypes}: load the model in float32 and use precision='bf16-autocast' "
                             f"for bfloat16 forwards, or precision='bf16' to train bfloat16 weights (warns)")
    if gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        elif hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            raise ValueError(f"{type(model).__name__} has no gradient checkpointing switch")


def autocast(model: torch.nn.Module, precision: str):
    """The context every forward of the loop runs in: bfloat16 autocast on the model's device for
    "bf16-autocast" (matmuls in bfloat16, weights and their gradients float32), nothing otherwise.

    Memory: while the block is open, autocast keeps the bfloat16 copy of each trainable weight it has cast (2 bytes
    a weight, beside the float32 master), and a Qwen3's KV cache keeps float32 keys: ``memory.memory_plan`` counts
    both.

    Raises:
        ValueError: for an unknown precision.
    """
    choice("precision", precision, PRECISIONS)
    if precision != "bf16-autocast":
        return nullcontext()
    # a transformers model (and LoRA's reference, which holds no parameters of its own) names its device
    device = model.device if hasattr(model, "device") else next(model.parameters()).device
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@contextmanager
def train_mode(*modules: torch.nn.Module | None):
    """Hold ``modules`` (None entries skipped) in train mode while the block runs; restore each one's mode after.

    Train mode is what turns on dropout (0 in Qwen3, so the toy's numbers do not change) and transformers'
    gradient checkpointing, which a model in eval mode silently skips.
    """
    live = [m for m in modules if m is not None]
    was = [m.training for m in live]
    for m in live:
        m.train()
    try:
        yield
    finally:
        for m, mode in zip(live, was, strict=True):
            m.train(mode)
