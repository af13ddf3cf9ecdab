"""LoRA through the ``peft`` library (the optional ``lora`` extra): train a low-rank adapter, keep the base frozen,
and take the reference policy from the same base (no second copy of it).

LoRA (Hu et al. 2021, eq. 3) replaces a weight's update by a low-rank product: h = W x + (alpha / r) B A x, with
A (r x in) and B (out x r), B = 0 at the start, W frozen. Two things change for RL:

- Memory. Gradients and AdamW's two moments exist only for A and B (``memory.lora_parameter_count``): for
  Qwen3-0.6B at rank 16 on every linear layer, about 10 M parameters instead of 596 M.
- The reference. GRPO's KL is to the policy at the start. When the loop attaches a fresh adapter (B = 0) that is
  the base model with the adapter switched off: ``AdapterOff`` computes it so (peft's ``disable_adapter``), no
  second copy of the base held; TRL does the same (``GRPOTrainer`` with a ``peft_config`` and beta > 0). When the
  caller hands in a peft model whose adapter may be trained, the policy at the start is base + that adapter:
  ``AdapterCopy`` keeps a frozen copy of the adapter beside it and runs the forward with the copy (TRL 1.16's
  "ref" adapter). ``reference`` picks between the two.

Dropout on the adapter's input is fixed at 0: the update's forward runs in train mode, and a dropout there would
make the training forward differ from pi_old's no-grad forward, so the ratio pi / pi_old would not start at 1.
"""

from __future__ import annotations

import copy
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


#: The name of the frozen copy of the caller's adapter that ``AdapterCopy`` adds beside it.
REFERENCE_ADAPTER = "minirl_reference"


def _in_adapter(name: str, adapter: str) -> bool:
    """Whether the parameter ``name`` belongs to ``adapter`` (peft names them ``...lora_A.<adapter>.weight``)."""
    return adapter in name.split(".")


class AdapterCopy(AdapterOff):
    """The reference policy for a peft model handed in with its own adapter: the model as handed in, frozen.

    A copy of the active adapter is added beside it (peft's ``add_adapter`` with the same config, the weights
    copied: TRL 1.16's "ref" adapter) and the reference forward runs with the copy active. The base is shared, so
    the extra memory is one adapter. ``state_dict`` holds the copy's tensors (a checkpoint stores them);
    ``parameters`` yields them (``evaluation.memory_held`` counts them as the reference's bytes, though they sit
    inside the policy's module too). A model that already holds the copy (a second ``train_rl`` on it) gets it
    refreshed: the reference is the model as handed in to this run.

    Raises:
        ValueError: for a model that is not a peft model, a prompt-learning adapter (prompt or prefix tuning: no
            layer weights to copy), or one whose active adapter is the copy itself.
    """

    def __init__(self, model):
        super().__init__(model)
        active = self.active = model.active_adapter
        config = model.peft_config[active]
        if config.is_prompt_learning or active == REFERENCE_ADAPTER:
            raise ValueError(f"AdapterCopy copies a layer adapter into {REFERENCE_ADAPTER!r}; the model's active "
                             f"adapter {active!r} is {config.peft_type}")
        flags = {p: p.requires_grad for p in model.parameters()}  # add_adapter may switch some on: put them back
        if REFERENCE_ADAPTER not in model.peft_config:
            model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(config))
        params = dict(model.named_parameters())
        self.names = [n for n in params if _in_adapter(n, REFERENCE_ADAPTER)]
        with torch.no_grad():
            for name in self.names:
                params[name].copy_(params[".".join(active if s == REFERENCE_ADAPTER else s for s in name.split("."))])
        for p in params.values():
            p.requires_grad_(flags.get(p, False))

        def forward(*args, **kwargs):
            flags = [(p, p.requires_grad) for p in model.parameters()]  # set_adapter changes them: restore
            model.set_adapter(REFERENCE_ADAPTER, inference_mode=True)
            try:
                with torch.no_grad():
                    return model(*args, **kwargs)
            finally:
                model.set_adapter(active)
                for p, flag in flags:
                    p.requires_grad_(flag)

        self.forward = functools.wraps(model.forward)(forward)

    def parameters(self):
        params = dict(self.model.named_parameters())
        return iter([params[n] for n in self.names])

    def state_dict(self) -> dict:
        return dict(zip(self.names, (p.detach() for p in self.parameters())))

    def load_state_dict(self, state: dict) -> None:
        if set(state) != set(self.names):
            raise ValueError(f"the reference adapter's state does not fit: {sorted(set(state) ^ set(self.names))[:4]}")
        with torch.no_grad():
            for name, p in self.state_dict().items():
                p.copy_(state[name])


def reference(model) -> AdapterOff:
    """The frozen reference of a LoRA policy: the model as handed to the loop, without a second copy of the base.

    ``AdapterOff`` (the adapter switched off) when the active adapter adds nothing: a plain LoRA (no DoRA, no
    ``modules_to_save``) whose every B is 0, as ``attach`` makes it, so the base computes exactly what the model
    does. Otherwise, a caller's trained adapter, ``AdapterCopy``: switching it off would make the KL pull the policy
    to the bare base, a model the run never started from (at lr 1e-12 kl_ref was 0.0115 at step 1, not 0).

    Raises:
        ValueError: when the model has trainable weights outside its adapter (peft's ``bias="all"``, or weights the
            caller unfroze): they move in place, so no frozen reference shares them; pass ``ref_model`` (a frozen
            copy) to ``train_rl`` instead. ``AdapterCopy``'s errors.
    """
    active = model.active_adapter
    outside = [n for n, p in model.named_parameters() if p.requires_grad and not _in_adapter(n, active)]
    if outside:
        raise ValueError(f"the peft model trains weights outside its adapter {active!r} ({outside[:3]}, "
                         f"{len(outside)} in all): the LoRA reference shares them; pass ref_model= a frozen copy")
    config = model.peft_config[active]
    plain = (config.peft_type == "LORA" and not getattr(config, "use_dora", False)
             and not getattr(config, "modules_to_save", None))
    zero_b = all(not p.any() for n, p in model.named_parameters()
                 if _in_adapter(n, active) and ("lora_B" in n or "lora_embedding_B" in n))
    return AdapterOff(model) if plain and zero_b else AdapterCopy(model)


def save_adapter(model, path) -> None:
    """Write the active adapter only (peft's ``save_pretrained``: adapter_config.json and adapter_model.safetensors,
    a few MB; not ``AdapterCopy``'s reference); ``models.load(path)`` reads it back over its base when peft is
    installed. A base named by a relative folder (``--model ../qwen``) is written as its absolute path, since the
    config's ``base_model_name_or_path`` is read from wherever ``models.load`` runs; a relative name there is taken
    for a hub name."""
    from pathlib import Path

    config = model.peft_config[model.active_adapter]
    base = config.base_model_name_or_path
    if base and not Path(base).is_absolute() and Path(base).is_dir():
        config.base_model_name_or_path = str(Path(base).resolve())
    model.save_pretrained(path, selected_adapters=[model.active_adapter])


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
