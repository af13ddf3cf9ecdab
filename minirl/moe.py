"""Router statistics and Routing Replay for transformers Mixture-of-Experts models.

In an MoE model each token picks its top-k experts per layer. After an optimiser step some of those choices change,
so the "same" token is computed by different experts under the old and the new policy and the token-level
importance ratio pi/pi_old mixes a policy change with a routing change. Routing Replay records the experts chosen
when the old log-probs were computed and forces them when the new log-probs are computed, so the ratio compares
like with like. GRPO needed it to train MoE models stably; GSPO's sequence-level ratio is robust enough to do
without it (Zheng et al. 2025, section 5.3).

Both context managers work on any router that follows the transformers 5 contract
``router(hidden_states) -> (router_logits, router_scores, router_indices)`` (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE).
Where the routes are recorded, and why that is the right place: the ratio's denominator pi_old is NOT the
probability the sampler used during ``generate``'s incremental (KV-cache) decoding; it is recomputed by one
full-sequence forward (``rollout.token_logprobs``, see rollout.py). Routing Replay must make the training forward
reproduce exactly that forward, so the routes are recorded there: with unchanged weights, replaying them gives the
behaviour log-probs back to float round-off (tests/test_moe.py checks 1e-5). The incremental decoder computes
the same causal function of the same tokens, so its hidden states, and hence its expert choices, differ from the
full forward's only by round-off, which can flip a choice only where two experts' router scores tie to within
~1e-6; the tokens were therefore sampled from pi_old up to float noise. (Large systems sample with a separate
inference engine whose kernels differ more; recording routes in that engine and replaying them in the trainer is
the "rollout routing replay" (R3) of Ma et al. 2025: ``record_routing(along="sequence")`` around the decode loop,
``decoding.generate(record_sampler_routes=True)``. Here one process and one kernel make the two the same unless the
sampler is made to differ on purpose, ``inference_engine.make_sampler``.)
Recording a full forward also gives one (B, L) grid of routes, so minibatches select rows from it.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's router modules, in layer order (classes whose name ends in "TopKRouter")."""
    found = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    if not found:
        raise ValueError(f"{type(model).__name__} has no MoE router modules (classes named '*TopKRouter')")
    return found


@dataclass
class Routes:
    """Recorded routing: ``indices[l]`` is (B, L, k) long, the experts each token used in layer l;
    ``entropy[l]`` is (B, L), the entropy (nats) of the router's softmax per token."""

    indices: list[Tensor] = field(default_factory=list)
    entropy: list[Tensor] = field(default_factory=list)

    def select(self, rows: Tensor | list[int]) -> Routes:
        """The routes of a subset of the batch's rows (for a minibatch of the recorded batch).

        Raises:
            ValueError: if nothing was recorded.
        """
        if not self.indices:
            raise ValueError("these Routes are empty (was the record_routing block exited?)")
        rows = torch.as_tensor(rows, device=self.indices[0].device)
        return Routes([ix[rows] for ix in self.indices], [h[rows] for h in self.entropy])

    @property
    def nbytes(self) -> int:
        """Memory held by the recorded expert indices (the entropies are diagnostics, not needed to replay)."""
        return sum(ix.numel() * ix.element_size() for ix in self.indices)


def _input_shape(model: torch.nn.Module, args, kwargs) -> tuple[int, int]:
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        raise ValueError("routing record/replay needs the model to be called with input_ids")
    return tuple(ids.shape)


@contextmanager
def record_routing(model: torch.nn.Module, *, along: str = "batch"):
    """Record the top-k experts of every token in every MoE layer while the block runs.

    Usage::

        with record_routing(model) as routes:
            logprobs = token_logprobs(model, input_ids, attention_mask, P)
        routes.indices[0].shape  # (B, L, k)

    Several forwards inside the block are concatenated along the batch (``along="batch"``: micro-batches of equal
    length L), or along the sequence (``along="sequence"``: the prompt forward and then the one-token forwards of
    KV-cached decoding, all of B rows, for Rollout Routing Replay). The routes object is filled when the block exits.

    Raises:
        ValueError: if the model has no routers, ``along`` is unknown, or the forwards inside the block differ in
            length (batch) or in rows (sequence).
    """
    if along not in ("batch", "sequence"):
        raise ValueError(f"along must be 'batch' or 'sequence', got {along!r}")
    layers = routers(model)
    per_layer = [[] for _ in layers]
    ent_layer = [[] for _ in layers]
    shapes = []
    routes = Routes()

    def on_model(module, args, kwargs):
        shapes.append(_input_shape(module, args, kwargs))

    def make_hook(i):
        def hook(module, inputs, output):
            logits, _, indices = output
            B, L = shapes[-1]
            per_layer[i].append(indices.detach().reshape(B, L, -1))
            logp = torch.log_softmax(logits.detach().float(), dim=-1)
            ent_layer[i].append(-(logp.exp() * logp).sum(-1).reshape(B, L))
        return hook

    handles = [model.register_forward_pre_hook(on_model, with_kwargs=True)]
    handles += [r.register_forward_hook(make_hook(i)) for i, r in enumerate(layers)]
    try:
        yield routes
    finally:
        for h in handles:
            h.remove()
    dim = 0 if along == "batch" else 1
    if len({shape[1 - dim] for shape in shapes}) > 1:
        what = "lengths" if along == "batch" else "row counts"
        raise ValueError(f"record_routing(along={along!r}) saw forwards of different {what}: shapes "
                         f"{sorted(set(shapes))}")
    routes.indices = [torch.cat(x, dim=dim) for x in per_layer]
    routes.entropy = [torch.cat(x, dim=dim) for x in ent_layer]


@contextmanager
def replay_routing(model: torch.nn.Module, routes: Routes):
    """Force the recorded experts in every MoE layer while the block runs; the weights stay live.

    For each token the experts are the recorded ones, but their mixing weights are recomputed from the CURRENT
    router: softmax(router_logits) gathered at the forced experts (renormalised over them when the router
    renormalises its top-k). The router therefore keeps its gradient, and only the discrete choice is frozen.

    Each forward inside the block must have the recorded shape (B, L): select rows first with
    ``routes.select(rows)`` for a minibatch.

    Raises:
        ValueError: if the number of routers or the token count of a forward differs from the recording.

    Source: Zheng et al. 2025 (GSPO), section 5.3, "Routing Replay"; the same idea as rollout routing replay in
    later MoE RL work.
    """
    layers = routers(model)
    if len(layers) != len(routes.indices):
        raise ValueError(f"routes hold {len(routes.indices)} layers but the model has {len(layers)} routers")

    def make_hook(i):
        def hook(module, inputs, output):
            logits, scores, _ = output
            forced = routes.indices[i].reshape(-1, routes.indices[i].shape[-1]).to(logits.device)  # (N, k)
            if forced.shape[0] != logits.shape[0]:
                raise ValueError(f"layer {i}: the forward has {logits.shape[0]} tokens but the routes hold "
                                 f"{forced.shape[0]}; select the matching rows with routes.select(rows)")
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)  # (N, E), live: keeps the router's gradient
            weights = probs.gather(-1, forced)  # (N, k)
            if getattr(module, "norm_topk_prob", True):
                weights = weights / weights.sum(-1, keepdim=True)
            return logits, weights.to(scores.dtype), forced
        return hook

    handles = [r.register_forward_hook(make_hook(i)) for i, r in enumerate(layers)]
    try:
        yield routes
    finally:
        for h in handles:
            h.remove()


def routing_change_fraction(routes_a: Routes, routes_b: Routes, mask: Tensor | None = None, *,
                            per_layer: bool = False) -> float | list[float]:
    """Share of token-expert choices that differ between two recordings of the same tokens.

    For each layer and token, the experts in a but not in b, divided by k (the order within the top-k is
    ignored). Averaged over valid tokens (``mask`` (B, L), default all) and layers.

    Raises:
        ValueError: if the recordings differ in layers or shapes.

    Source: the measurement behind GSPO's "about 10% of the activated experts change after each update"
    (Zheng et al. 2025, section 5.3).
    """
    if len(routes_a.indices) != len(routes_b.indices):
        raise ValueError("routes_a and routes_b have different numbers of layers")
    fractions = []
    for a, b in zip(routes_a.indices, routes_b.indices, strict=True):
        if a.shape != b.shape:
            raise ValueError(f"routes_a has shape {tuple(a.shape)} but routes_b has {tuple(b.shape)}")
        k = a.shape[-1]
        shared = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1)  # (B, L) experts of a also in b
        changed = (k - shared).float() / k
        m = torch.ones_like(changed) if mask is None else mask.float().to(changed.device)
        fractions.append(float((changed * m).sum() / m.sum().clamp(min=1)))
    return fractions if per_layer else sum(fractions) / len(fractions)


def expert_load(routes: Routes, num_experts: int, mask: Tensor) -> Tensor:
    """(n_layers, num_experts) share of the valid token-expert assignments each expert received (rows sum to 1).

    A balanced router gives 1 / num_experts everywhere; collapse shows as a few experts taking most tokens.
    The mask is required: the recorded forward routes every position, left padding of the prompts and padding after
    EOS included, and counting those would measure how the router treats pad tokens.

    Example: 4 experts, tokens routed to {0, 1}, {0, 2}, {0, 3}, all valid: expert 0 gets 3 of the 6 assignments,
    [0.5, 1/6, 1/6, 1/6]; with the third token masked, [0.5, 0.25, 0.25, 0].

    Args:
        routes: recorded routing (``record_routing``), ``indices[l]`` of shape (B, L, k).
        num_experts: the number of experts per layer.
        mask: (B, L) 1 on real tokens: the attention mask of the recorded forward (``Rollout.attention_mask``).

    Returns:
        (n_layers, num_experts) float shares; a layer with no valid token gives zeros.

    Raises:
        ValueError: if mask is not (B, L) for the recorded routes.
    """
    loads = []
    for ix in routes.indices:
        if tuple(mask.shape) != tuple(ix.shape[:2]):
            raise ValueError(f"mask must have shape (B, L) = {tuple(ix.shape[:2])}, the recorded routes' batch and "
                             f"length (the attention mask of the recorded forward), got {tuple(mask.shape)}")
        w = (mask > 0).float().to(ix.device).unsqueeze(-1).expand_as(ix).reshape(-1)
        counts = torch.zeros(num_experts, device=ix.device).index_add_(0, ix.reshape(-1), w)
        loads.append(counts / counts.sum().clamp(min=1))
    return torch.stack(loads)


@contextmanager
def capture_router_logits(model: torch.nn.Module):
    """Collect every router's logits, WITH their gradient, while the block runs: a list with one (N, E) tensor per
    layer and forward (N = B * L tokens), in call order, for ``load_balancing_loss``.

    The logits are the model's own (the router's output, before softmax), so the auxiliary loss differentiates
    through the same router weights the policy uses; with ``replay_routing`` active they are unchanged (replay
    changes only the chosen experts and their weights). Use one forward per block.

    Raises:
        ValueError: if the model has no routers.
    """
    logits: list[Tensor] = []
    handles = [r.register_forward_hook(lambda module, inputs, output: logits.append(output[0]))
               for r in routers(model)]
    try:
        yield logits
    finally:
        for h in handles:
            h.remove()


def load_balancing_loss(router_logits: list[Tensor], mask: Tensor, *, top_k: int) -> Tensor:
    """The router's load-balancing auxiliary loss, E * sum_e f_e * P_e, pooled over the layers.

    f_e is the share of (token, layer) rows that put expert e among their top-k (so the f_e sum to k), P_e the mean
    router probability of expert e over the same rows; both count valid tokens only. The loss is k for a perfectly
    balanced router (f_e = k / E, P_e = 1 / E) and grows as the load concentrates; only P_e carries a gradient (the
    top-k choice is discrete). Pooling the layers before the product, instead of averaging per-layer losses, is what
    transformers' Qwen3-MoE / Mixtral ``load_balancing_loss_func`` does, and hence what TRL's
    ``router_aux_loss_coef`` weights; this function gives its value (tested).

    Example: one layer, E = 2 experts, top-1, two valid tokens with probabilities [0.75, 0.25] and [0.25, 0.75]:
    f = [0.5, 0.5], P = [0.5, 0.5], loss = 2 * (0.25 + 0.25) = 1.0 (balanced); with both tokens [0.75, 0.25],
    f = [1, 0], P = [0.75, 0.25], loss = 2 * 0.75 = 1.5.

    Args:
        router_logits: one (N, E) tensor per layer (``capture_router_logits``), N = B * L tokens of one forward.
        mask: (B, L) 1 on real tokens (the forward's attention mask): padding is not routed load.
        top_k: experts per token (the model's ``num_experts_per_tok``).

    Returns:
        Scalar tensor (dimensionless), differentiable through the router logits.

    Raises:
        ValueError: for no layers, a mask that does not match N, or top_k outside [1, E]. A mask with no valid
            token gives 0 (no load to balance), not NaN.

    Source: Switch Transformer, Fedus et al. 2022, eq. 4-6. Top-k and pooled layers as in transformers'
    ``load_balancing_loss_func`` (models/qwen3_moe/modeling_qwen3_moe.py, Mixtral's form).
    """
    if not router_logits:
        raise ValueError("router_logits is empty: no MoE layer was run inside capture_router_logits")
    n_tokens, num_experts = router_logits[0].shape
    if mask.numel() != n_tokens:
        raise ValueError(f"mask has {mask.numel()} positions but the router saw {n_tokens} tokens: pass the "
                         f"(B, L) attention mask of the same forward")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, {num_experts}], got {top_k}")
    dtype = torch.promote_types(router_logits[0].dtype, torch.float32)  # at least float32, float64 kept
    w = (mask.reshape(-1) > 0).to(dtype=dtype, device=router_logits[0].device)  # (N,)
    chosen = torch.zeros(num_experts, dtype=dtype, device=w.device)
    prob = torch.zeros(num_experts, dtype=dtype, device=w.device)
    for logits in router_logits:
        probs = torch.softmax(logits.to(dtype), dim=-1)  # (N, E)
        top = probs.topk(top_k, dim=-1).indices  # (N, k)
        chosen = chosen + torch.zeros_like(chosen).index_add_(0, top.reshape(-1), w.repeat_interleave(top_k))
        prob = prob + (probs * w.unsqueeze(-1)).sum(0)
    rows = (w.sum() * len(router_logits)).clamp(min=1)  # valid (token, layer) rows; none: the loss is 0
    return num_experts * ((chosen / rows) * (prob / rows)).sum()
