"""Decoding: G sampled completions per prompt, from the model's own forward and KV cache.

Sampling is a short decode loop (``sample_tokens``): plain ancestral sampling from softmax(logits / temperature),
nothing else, so the tokens come from exactly the distribution the loss assumes (optionally truncated to a top-k /
top-p kept set, which is then recorded). ``generate`` lays the completions out group by group in a ``Rollout``,
records the decode loop's own log-probs (``Rollout.sampler_logprobs``: what an inference engine would report, equal
to the trainer's to round-off when the sampler is the trainer) and recomputes the behaviour log-probs with
``rollout.token_logprobs`` at the same temperature.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor

from .chat import encode_prompts
from .checks import zero_outside
from .moe import Routes, record_routing
from .rollout import Rollout, check_tokenizer, completion_mask, eos_token_ids, position_ids_from_mask, token_logprobs
from .truncation import kept_mask


@torch.no_grad()
def sample_tokens(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, max_new_tokens: int, *,
                  eos_token_id: int | Sequence[int], pad_token_id: int, temperature: float = 1.0,
                  greedy: bool = False, min_new_tokens: int = 0, top_k: int | None = None,
                  top_p: float | None = None, return_kept: bool = False) -> tuple[Tensor, ...]:
    """Ancestral sampling: one token per step from softmax(logits / temperature), reusing the KV cache.

    The loop is what ``transformers``' ``generate`` does for plain sampling, without the machinery around it
    (logits processors, stopping criteria, output dictionaries): the first forward reads the left-padded prompts,
    each later one feeds the token just drawn, and a row that has drawn EOS gets ``pad_token_id`` from then on. It
    draws the same tokens as ``model.generate(do_sample=True, top_k=0, top_p=1.0)`` with the same torch seed (one
    ``torch.multinomial`` per step over float32 probabilities; tests check it), and stops when every row is done.

    Example: with a model that always puts probability 1 on token 7 and then on EOS (2), pad 0, max_new_tokens 4:
    completion_ids [[7, 2, ...]] stops after 2 steps, logprobs [[0., 0.]].

    Args:
        model: a causal LM whose forward takes ``past_key_values`` and ``logits_to_keep`` (any transformers LM).
        prompt_ids: (B, P) left-padded prompt ids.
        prompt_mask: (B, P) 1 on real prompt tokens.
        max_new_tokens: at most this many tokens per row.
        eos_token_id: one id or a list of ids; any of them ends a row.
        pad_token_id: written after a row's EOS.
        temperature: > 0; the logits are divided by it before the softmax.
        greedy: take the argmax instead of sampling.
        min_new_tokens: EOS is forbidden (its logit set to -inf) for the first this many tokens. For timing fixed
            work only: the tokens then no longer come from the distribution ``token_logprobs`` describes.
        top_k, top_p: truncate each step's distribution to ``truncation.kept_mask``'s kept set (after the
            temperature, as transformers does) and renormalise; None / 0 / 1.0: off, the plain sampler, same tokens.
        return_kept: also return the (B, T, V) bool kept sets (all True when off; after EOS they are never read).

    Returns:
        (completion_ids (B, T) long, logprobs (B, T) float32: the log-probs at ``temperature`` of the tokens drawn,
        under the truncated distribution when truncating, 0 after EOS), T <= max_new_tokens the number of steps
        taken; with ``return_kept``, the kept sets third.

    Raises:
        ValueError: if max_new_tokens < 1, temperature <= 0, min_new_tokens < 0, or top_k / top_p are invalid.

    Source: ancestral sampling from an autoregressive model (e.g. Holtzman et al. 2020, section 2, "pure sampling").
    """
    if max_new_tokens < 1 or temperature <= 0 or min_new_tokens < 0:
        raise ValueError(f"need max_new_tokens >= 1, temperature > 0 and min_new_tokens >= 0, got {max_new_tokens}, "
                         f"{temperature} and {min_new_tokens}")
    eos = torch.as_tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id),
                          device=prompt_ids.device)
    B = prompt_ids.shape[0]
    # transformers 5.2x renamed the forward's past_key_values to cache (the old name warns until 5.40)
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids, mask, positions, cache = prompt_ids, prompt_mask, position_ids_from_mask(prompt_mask), None
    done = torch.zeros(B, dtype=torch.bool, device=prompt_ids.device)
    tokens, logprobs, kept_sets = [], [], []
    truncating = bool(top_k) or (top_p is not None and top_p < 1.0)
    kept_mask(torch.zeros(1), top_k=top_k, top_p=top_p)  # checks the settings before any forward
    for t in range(max_new_tokens):
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                    **{cache_name: cache})
        cache = out[cache_name]  # the keys and values of every position so far
        logits = out["logits"][:, -1].float() / temperature  # (B, V)
        if t < min_new_tokens:
            logits[:, eos] = -torch.inf
        kept = kept_mask(logits, top_k=top_k, top_p=top_p) if truncating or return_kept else None  # (B, V)
        if truncating:  # mu: the kept set's distribution, renormalised (what a top-k / top-p engine samples)
            logits = logits.masked_fill(~kept, -torch.inf)
        kept_sets.append(kept)
        logp = F.log_softmax(logits, dim=-1)  # (B, V)
        if greedy:
            token = logits.argmax(-1)  # (B,)
        else:
            token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1).squeeze(1)  # (B,)
        token = token.masked_fill(done, pad_token_id)
        tokens.append(token)
        logprobs.append(logp.gather(-1, token.unsqueeze(-1)).squeeze(-1).masked_fill(done, 0.0))
        done |= torch.isin(token, eos)
        if done.all():
            break
        ids, positions = token.unsqueeze(1), positions[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
    out = torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1)
    return (*out, torch.stack(kept_sets, dim=1)) if return_kept else out


@torch.no_grad()
def generate(model: torch.nn.Module, tokenizer, prompts: Sequence[str], group_size: int, max_new_tokens: int,
             *, temperature: float = 1.0, greedy: bool = False, record_routes: bool = False,
             recompute_logprobs: bool = True, min_new_tokens: int = 0, record_sampler_routes: bool = False,
             batch_size: int | None = None, logprob_batch_size: int | None = None, top_k: int | None = None,
             top_p: float | None = None) -> Rollout:
    """Sample ``group_size`` completions for each prompt and compute their behaviour log-probs.

    Sampling is plain ancestral sampling from softmax(logits / temperature) (``sample_tokens``): by default no top-k,
    top-p or any other logits processor, because the loss assumes the tokens came from exactly the distribution
    ``token_logprobs`` computes; with ``top_k`` / ``top_p`` the kept sets are returned (``Rollout.kept``), so the
    trainer can renormalise over them (``token_logprobs(kept=...)``). No setting of the model's own generation
    config (generation_config.json) reaches the sampler, except its EOS ids: every id of ``eos_token_ids`` ends a row.

    Args:
        model: a causal LM (put in eval mode for sampling, restored afterwards).
        tokenizer: the model's tokenizer: left padding and a pad token (``check_tokenizer``), EOS set.
        prompts: N prompts: strings, or conversations (lists of {"role", "content"} messages) that the tokenizer's
            chat template renders with the generation prompt (``chat.render``; plain text without a template).
        group_size: G >= 1 completions per prompt.
        max_new_tokens: the completion budget; completions without EOS by then are ``truncated``.
        temperature: sampling temperature (> 0). The behaviour log-probs use the same value.
        greedy: take the argmax instead of sampling (for evaluation); log-probs are still at ``temperature``.
        record_routes: for an MoE model, record the experts each token used in the behaviour forward
            (``moe.record_routing``), for Routing Replay during training. They are recorded in the full-sequence
            forward that computes ``logprobs``, not during incremental decoding: that forward defines pi_old, so
            replaying its routes reproduces pi_old exactly (moe.py explains why the two agree to round-off).
        recompute_logprobs: recompute ``logprobs`` with one full forward (the default, exact pi_old). False skips
            that forward and uses the sampler's own log-probs: for callers that never read them (evaluation) or
            that recompute pi_old themselves (``rl.behaviour_logprobs``).
        min_new_tokens: forbid EOS for the first this many tokens; for timing fixed work only (``bench``): the
            tokens then do not come from the distribution the behaviour log-probs describe.
        record_sampler_routes: for an MoE model, record the experts the decode loop itself used
            (``Rollout.sampler_routes``, for R3). Decoding never feeds the last sampled token, so the last position
            repeats the one before it: its output predicts nothing the loss reads.
        batch_size: rows per decode loop (the generation batch size; None: all N * G at once). The KV cache then
            holds ``batch_size`` rows; each chunk draws its own random numbers, so the tokens differ from one loop's.
        logprob_batch_size: rows per forward of the recomputed log-probs (``token_logprobs``' batch_size).
        top_k, top_p: the sampler's truncation (``sample_tokens``); off by default. The recomputed ``logprobs`` stay
            the full vocabulary's (the naive trainer's), the sampler's own are the truncated distribution's.

    Returns:
        A ``Rollout`` with B = N * G rows, grouped by prompt.

    Raises:
        ValueError: if group_size < 1, max_new_tokens < 1, temperature <= 0, min_new_tokens < 0, prompts is empty,
            batch_size < 1, record_routes without recompute_logprobs, the tokenizer pads on the right or has no
            pad token (``check_tokenizer``), or prompts mixes strings and conversations (``chat.render``).
    """
    if group_size < 1 or max_new_tokens < 1 or temperature <= 0 or len(prompts) == 0:
        raise ValueError(f"need group_size >= 1 (got {group_size}), max_new_tokens >= 1 (got {max_new_tokens}), "
                         f"temperature > 0 (got {temperature}) and at least one prompt (got {len(prompts)})")
    if record_routes and not recompute_logprobs:
        raise ValueError("record_routes=True records the routes of the recomputing forward: it needs "
                         "recompute_logprobs=True")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    check_tokenizer(tokenizer)
    eos = eos_token_ids(tokenizer, model)  # the tokenizer's and the checkpoint's: any of them ends a row
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    enc = encode_prompts(tokenizer, prompts).to(device)  # (N, P): text as is, conversations by the chat template
    prompt_ids = enc.input_ids.repeat_interleave(group_size, dim=0)  # (B, P)
    prompt_mask = enc.attention_mask.repeat_interleave(group_size, dim=0)  # (B, P)
    chunks, rows = [], batch_size or len(prompt_ids)  # (completion_ids, sampler_logprobs, routes, kept) per batch
    truncating = bool(top_k) or (top_p is not None and top_p < 1.0)
    for ids, pmask in zip(prompt_ids.split(rows), prompt_mask.split(rows), strict=True):
        with record_routing(model, along="sequence") if record_sampler_routes else nullcontext() as chunk_routes:
            out = sample_tokens(model, ids, pmask, max_new_tokens, eos_token_id=eos, top_k=top_k, top_p=top_p,
                                pad_token_id=tokenizer.pad_token_id, temperature=temperature, greedy=greedy,
                                min_new_tokens=min_new_tokens, return_kept=truncating)  # (b, T) (, (b, T, V))
            chunks.append((*out[:2], chunk_routes, out[2] if truncating else None))
    T = max(c[0].shape[1] for c in chunks)  # the longest chunk; shorter ones are padded after their EOS
    completion_ids = torch.cat([F.pad(c[0], (0, T - c[0].shape[1]), value=tokenizer.pad_token_id) for c in chunks])
    sampler_logprobs = torch.cat([F.pad(c[1], (0, T - c[1].shape[1]), value=0.0) for c in chunks])  # (B, T)
    kept = torch.cat([F.pad(c[3], (0, 0, 0, T - c[3].shape[1]), value=True) for c in chunks]) if truncating else None
    sampler_routes = None
    if record_sampler_routes:  # positions 0 .. P+t-2 were fed; repeat the last for positions P+t-1 .. P+T-1
        def widen(x):
            return torch.cat([x, x[:, -1:].expand(-1, prompt_ids.shape[1] + T - x.shape[1], *x.shape[2:])], dim=1)
        sampler_routes = Routes([torch.cat([widen(ix) for ix in layer]) for layer in
                                 zip(*[c[2].indices for c in chunks], strict=True)],
                                [torch.cat([widen(h) for h in layer]) for layer in
                                 zip(*[c[2].entropy for c in chunks], strict=True)])
    P = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
    mask = completion_mask(completion_ids, eos)  # (B, T)
    truncated = ~torch.isin(completion_ids, torch.tensor(eos, device=device)).any(-1)  # (B,)
    attention_mask = torch.cat([prompt_mask, mask.long()], dim=1)  # (B, P + T)
    routes, logprobs = None, sampler_logprobs
    if record_routes or recompute_logprobs:
        with record_routing(model) if record_routes else nullcontext() as routes:
            logprobs = zero_outside(token_logprobs(model, input_ids, attention_mask, P, temperature=temperature,
                                                   batch_size=logprob_batch_size), mask)  # (B, T)
    model.train(was_training)
    return Rollout(
        input_ids=input_ids, attention_mask=attention_mask, completion_ids=completion_ids, completion_mask=mask,
        truncated=truncated, prompt_index=torch.arange(len(prompts), device=device).repeat_interleave(group_size),
        completions=tokenizer.batch_decode(completion_ids, skip_special_tokens=True), logprobs=logprobs,
        group_size=group_size, routes=routes, prompts=[p for p in prompts for _ in range(group_size)],
        sampler_logprobs=sampler_logprobs, sampler_routes=sampler_routes, kept=kept,
    )
