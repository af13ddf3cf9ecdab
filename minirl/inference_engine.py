"""A sampler that is not the trainer: the inference engine's copy of the policy, on purpose.

Real RL systems sample with one engine (vLLM, SGLang) and train with another (FSDP, Megatron). The two hold the
same weights but compute slightly different probabilities for the same tokens (precision, kernels, batch-dependent
reductions), and on a Mixture-of-Experts they can pick different experts for the same token. minirl normally samples
with the trainer's own float32 model, so that gap is exactly zero and invisible. ``make_sampler`` builds the gap
back in, with a dial:

- ``dtype="bfloat16"``: the sampler is a bfloat16 copy of the policy (the commonest real mismatch); ``"float16"``
  keeps three more mantissa bits (10 against 7) in a narrower range;
- ``logit_noise``: Gaussian noise of that standard deviation (nats) on the sampler's final logits, fresh for every
  token, for a mismatch larger than bfloat16's;
- ``router_noise``: the same on the sampler's MoE router logits, so its experts differ from the trainer's.

The copy is synced with the trainer's weights after every update (``sync_sampler``), as engines reload weights;
an asynchronous engine reloads them only every k updates (``RLConfig.sampler_sync_every``: a stale sampler, which
needs a copy even when nothing else differs, ``separate=True``).
Everything the sampler reports (its log-probs, its routes) comes from its own forwards; pi_old is still the
trainer's, recomputed (``rl.behaviour_logprobs``), unless the loop is told to trust the sampler (``pi_old="naive"``).
"""

from __future__ import annotations

import copy

import torch

from .moe import routers

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_trainer(*, dtype: str = "float32", logit_noise: float = 0.0, router_noise: float = 0.0) -> bool:
    """Whether these sampler settings make no copy at all: the trainer samples for itself."""
    return dtype == "float32" and logit_noise == 0 and router_noise == 0


def make_sampler(model: torch.nn.Module, *, dtype: str = "float32", logit_noise: float = 0.0,
                 router_noise: float = 0.0, seed: int = 0, separate: bool = False) -> torch.nn.Module:
    """The model that samples: ``model`` itself when nothing differs, else a frozen copy in ``dtype`` with noise.

    Args:
        model: the trainer's policy.
        dtype: "float32", "bfloat16" or "float16", the sampler's weights and activations.
        logit_noise: standard deviation (nats, >= 0) of the noise added to every next-token logit the sampler
            computes.
        router_noise: standard deviation (>= 0) of the noise added to the sampler's router logits before its top-k
            (MoE models only).
        seed: seed of the noise (its own generator: the sampling's random numbers are not shifted by it).
        separate: a copy even when nothing differs (a sampler that lags the trainer, synced every k updates).

    Returns:
        ``model`` (dtype float32, no noise, not separate: the sampler is the trainer), or an eval-mode copy
        without gradients.

    Raises:
        ValueError: on an unknown dtype, negative noise, or router noise on a model without routers.

    Source: the sampler/trainer mismatch of Yao et al. 2025 ("Your efficient RL framework secretly brings you
    off-policy RL training") and, for routing, Ma et al. 2025 (arXiv 2510.11370, section 3); Qi et al. 2025
    ("Defeating the training-inference mismatch via FP16", arXiv 2510.26788) for float16 against bfloat16.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if logit_noise < 0 or router_noise < 0:
        raise ValueError(f"logit_noise and router_noise must be >= 0, got {logit_noise} and {router_noise}")
    if is_trainer(dtype=dtype, logit_noise=logit_noise, router_noise=router_noise) and not separate:
        return model
    sampler = copy.deepcopy(model).to(DTYPES[dtype]).eval().requires_grad_(False)
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)

    def noisy(x: torch.Tensor, std: float) -> torch.Tensor:
        return x + std * torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32).to(x.dtype)

    if logit_noise > 0:
        sampler.get_output_embeddings().register_forward_hook(lambda m, i, out: noisy(out, logit_noise))
    if router_noise > 0:
        for router in routers(sampler):
            router.register_forward_hook(_noisy_router(noisy, router_noise))
    return sampler


def _noisy_router(noisy, std: float):
    """A forward hook that re-picks a router's top-k from noisy logits (transformers' router contract:
    ``(router_logits, router_scores, router_indices)``), renormalising as the router does."""

    def hook(module, inputs, output):
        logits, scores, _ = output
        logits = noisy(logits, std)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)  # (N, E)
        top, indices = probs.topk(module.top_k, dim=-1)  # (N, k)
        if getattr(module, "norm_topk_prob", True):
            top = top / top.sum(-1, keepdim=True)
        return logits, top.to(scores.dtype), indices

    return hook


@torch.no_grad()
def sync_sampler(sampler: torch.nn.Module, model: torch.nn.Module) -> None:
    """Copy the trainer's weights into the sampler (cast to its dtype), as an engine reloads them after an update;
    nothing to do when the sampler is the trainer.

    Raises:
        ValueError: if the two models' parameter names differ.
    """
    if sampler is model:
        return
    source = dict(model.named_parameters())
    target = dict(sampler.named_parameters())
    if source.keys() != target.keys():
        raise ValueError("sampler and model have different parameters: build the sampler with make_sampler(model)")
    for name, p in target.items():
        p.copy_(source[name])
