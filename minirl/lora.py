"""LoRA through the ``peft`` library (the optional ``lora`` extra): train a low-rank adapter, keep the base frozen,
and use the base itself as the reference policy.

LoRA (Hu et al. 2021, eq. 3) replaces a weight's update by a low-rank product: h = W x + (alpha / r) B A x, with
A (r x in) and B (out x r), B = 0 at the start, W frozen. Two things change for RL:

- Memory. Gradients and AdamW's two moments exist only for A and B (``memory.lora_parameter_count``): for
  Qwen3-0.6B at rank 16 on every linear layer, about 10 M parameters instead of 596 M.
- The reference. GRPO's KL is to the policy at the start, which under LoRA is the base model with the adapter
  switched off. ``AdapterOff`` computes the reference that way (peft's ``disable_adapter`` context), so no
  second copy of the base is held; TRL does the same (``GRPOTrainer`` with a ``peft_config`` and beta > 0).

Dropout on the adapter's input is fixed at 0: the update's forward runs in train mode, and a dropout there would
make the training forward differ from pi_old's no-grad forward, so the ratio pi / pi_old would not start at 1.
"""

from __future__ import annotations

import functools

import torch

#: What ``lora_target_modules="all-linear"`` adapts in a Qwen3 / Llama-style decoder: every linear layer of the
#: attention and the (dense) MLP, never the LM head. peft's own "all-linear" picks the same layers there.
QWEN3_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def target_modules(spec: str) -> str | list[str]:
    """``RLConfig.lora_target_modules`` as peft reads it: "all-linear", or a comma-separated list of module names.

    Raises:
        ValueError: for an empty spec or an empty name in the list.
    """
    if spec == "all-linear":
        return spec
    names = [n.strip() for n in spec.split(",")]
    if not spec.strip() or not all(names):
        raise ValueError(f"lora_target_modules must be 'all-linear' or comma-separated module names such as "
                         f"'q_proj,v_proj', got {spec!r}")
    return names


def _peft():
    try:
        import peft
    except ImportError as err:  # an optional extra: say how to get it
        raise ImportError("RLConfig.lora_rank > 0 needs the peft library: pip install -e '.[lora]'") from err
    return peft


def is_lora(model) -> bool:
    """True when ``model`` is a peft model (it has an adapter that ``disable_adapter`` can switch off)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def attach(model, *, rank: int, alpha: float, target: str, seed: int = 0):
    """Wrap ``model`` with a LoRA adapter (peft's ``get_peft_model``): the base weights frozen, A random, B = 0.

    The adapter layers are injected into ``model``'s own modules, so the caller's object computes with the adapter
    too (the policy is trained in place, as ``rl.train_rl`` promises). A model that already is a peft model is
    returned unchanged (the caller made its own adapter). ``rank`` 0 returns ``model`` unchanged.

    Args:
        model: a transformers causal LM.
        rank: r, the adapter's rank (0: no adapter).
        alpha: LoRA's alpha; the adapter's output is scaled by alpha / r.
        target: "all-linear" or comma-separated module names (``target_modules``).
        seed: seeds A's random initialisation (Kaiming uniform, peft's default) without touching the global
            random state, so the same seed gives the same adapter whatever ran before.

    Returns:
        The peft model (``peft.PeftModel``) or ``model`` itself.

    Raises:
        ImportError: without peft. ValueError: for a bad ``target``.

    Source: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3 and section 4.1.
    """
    if rank == 0 or is_lora(model):
        return model
    peft = _peft()
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules(target), lora_dropout=0.0,
                             bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)


def attach_for(model, cfg):
    """``attach`` with an RLConfig's settings: lora_rank, lora_alpha, lora_target_modules, and its seed."""
    return attach(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha, target=cfg.lora_target_modules, seed=cfg.seed)


class AdapterOff:
    """The reference policy under LoRA: the policy's own base weights with the adapter switched off.

    Called like a model (``rollout.token_logprobs`` and ``precision.autocast`` take it), it runs the policy's forward
    inside peft's ``disable_adapter`` context. It holds no weights of its own: ``state_dict`` is empty (a
    checkpoint stores nothing for it) and ``parameters`` yields nothing, so ``evaluation.memory_held`` counts no
    reference bytes; ``device`` is the policy's.
    """

    def __init__(self, model):
        if not is_lora(model):
            raise ValueError(f"AdapterOff needs a peft model with an adapter, got {type(model).__name__}")
        self.model = model
        # the policy's signature, so callers that look for a keyword (``logits_to_keep``) find it
        def forward(*args, **kwargs):
            with torch.no_grad(), model.disable_adapter():
                return model(*args, **kwargs)

        self.forward = functools.wraps(model.forward)(forward)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parameters(self):
        return iter(())

    def eval(self):
        return self

    def requires_grad_(self, _requires_grad: bool = True):
        return self

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"the LoRA reference holds no weights, got a state with {len(state)} tensors")


def save_adapter(model, path) -> None:
    """Write the adapter only (peft's ``save_pretrained``: adapter_config.json and adapter_model.safetensors, a few
    MB); ``models.load(path)`` reads it back over its base when peft is installed."""
    model.save_pretrained(path)


def load_adapter_weights(model, path) -> None:
    """Copy the adapter weights ``save_adapter`` wrote to ``path`` into ``model``'s adapter in place (resume).

    Raises:
        FileNotFoundError: without an adapter_model.safetensors. ValueError: if a saved tensor is not in the
            adapter or an adapter tensor is missing from the file.
    """
    from pathlib import Path

    from safetensors.torch import load_file

    peft = _peft()
    file = Path(path) / "adapter_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"no adapter_model.safetensors in {path}")
    result = peft.set_peft_model_state_dict(model, load_file(file))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"the adapter in {path} does not fit the model: unexpected {result.unexpected_keys}, "
                         f"missing {missing}")
