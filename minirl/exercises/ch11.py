"""Exercises of chapter 11: when the sampler is not the trainer (the sequence-level importance weight, R3's routes).

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while a submission is graded."""

from __future__ import annotations

import torch
from torch import Tensor

from . import _reference as ref
from ._core import _case, _exercise, _expect, _Mismatch, _prefix_mask, _t

# ================================================================================================================
# 11 · the sequence-level importance weight (truncated IS over a whole completion)

ex = _exercise("seq_is_weight", "11", "seq_is_weight(old_logprobs, sampler_logprobs, mask, *, cap=2.0, "
               "form='product') -> (B,) detached weights", "minirl.importance.seq_tis_weights",
               ("minirl.importance.seq_tis_weights", "minirl.importance.sequence_log_ratio",
                "minirl.importance.is_weights", "minirl.importance.seq_mis_weights"))
GEOMEAN = ("this is the geometric mean of the token ratios (form='geomean', GSPO's length-normalised ratio): the "
           "exact sequence weight pi_old(y) / mu(y) is their PRODUCT, the exp of the SUM of the log-ratios")
IS_UPSIDE_DOWN = "the weight is upside down: it is pi_old / mu (the trainer's log-probs minus the sampler's)"
ARITHMETIC = "the arithmetic mean of the token ratios is no sequence weight: sum the log-ratios, then exp"
MIS_NOT_TIS = ("a weight above the cap is truncated TO the cap (TIS); setting it to 0 is masked IS (MIS), another "
               "correction")
NO_CAP = "truncate the weight at cap: min(pi_old(y) / mu(y), cap)"
PAD_IS = "sum only the valid tokens' log-ratios: the padding holds garbage"
EMPTY_IS = "a row with no valid token gets weight 1 (an empty product; its geometric mean is not 0 / 0 = NaN)"
IS_GRAD = ("importance weights are constants: detach them (they reweight the loss of sampled tokens; a gradient "
           "through them would train the trainer toward the sampler)")
_OLD = [[-1.0, -1.3, -0.5]]
_SAMPLER = [[-1.1, -1.0, -1.0]]  # log-ratios 0.1, -0.3, 0.5


@_case(ex, "three tokens by hand, both forms", GEOMEAN)
def _(fn, gen):
    # product: e^(0.1 - 0.3 + 0.5) = e^0.3 = 1.349859 (below the cap 2); geometric mean e^0.1 = 1.105171;
    # upside down e^-0.3 = 0.740818; arithmetic mean of the ratios (e^0.1 + e^-0.3 + e^0.5) / 3 = 1.164903
    _expect(fn(_t(_OLD), _t(_SAMPLER), _t([[1, 1, 1]])), [1.349859],
            [([1.105171], GEOMEAN), ([0.740818], IS_UPSIDE_DOWN), ([1.164903], ARITHMETIC)], what="the product")
    _expect(fn(_t(_OLD), _t(_SAMPLER), _t([[1, 1, 1]]), form="geomean"), [1.105171],
            [([1.349859], "form='geomean' asks for the geometric mean: exp of the MEAN log-ratio")],
            what="the geometric mean")


@_case(ex, "a weight above the cap is truncated", MIS_NOT_TIS)
def _(fn, gen):
    old, sampler, m = _t([[-0.5, -0.5, -0.5]]), _t([[-1.0, -1.0, -1.0]]), _t([[1, 1, 1]])
    # product e^1.5 = 4.481689 > 2 -> 2; masked IS: 0; no cap: 4.481689; geomean e^0.5 = 1.648721 (below 3)
    _expect(fn(old, sampler, m), [2.0], [([0.0], MIS_NOT_TIS), ([4.481689], NO_CAP)], what="the product")
    _expect(fn(old, sampler, m, cap=3.0, form="geomean"), [1.648721], what="the geometric mean at cap 3")


@_case(ex, "garbage in padding", PAD_IS)
def _(fn, gen):
    old, sampler = _t([[-1.0, -1.3, -9.0], [-2.0, 0.0, 0.0]]), _t([[-1.1, -1.0, -3.8], [-1.9, 7.0, 7.0]])
    # row 0: e^(0.1 - 0.3) = 0.818731 (padding: -5.2); row 1: e^-0.1 = 0.904837 (padding: -7, -7)
    _expect(fn(old, sampler, _t([[1, 1, 0], [1, 0, 0]])), [0.818731, 0.904837],
            [([0.004517, 0.0], PAD_IS)], what="the weights")


@_case(ex, "a row with no valid token", EMPTY_IS)
def _(fn, gen):
    old, sampler, m = _t([[-1.0, -1.0], [-1.0, -2.0]]), _t([[-1.0, -1.5], [-3.0, -3.0]]), _t([[1, 1], [0, 0]])
    # row 0: e^0.5 = 1.648721 (product and geomean e^0.25 = 1.284025); row 1: 1 in both forms
    _expect(fn(old, sampler, m), [1.648721, 1.0], what="the product")
    _expect(fn(old, sampler, m, form="geomean"), [1.284025, 1.0], what="the geometric mean")


@_case(ex, "the weights carry no gradient", IS_GRAD)
def _(fn, gen):
    old = torch.tensor(_OLD, requires_grad=True)  # the trainer's pi_old, computed with grad by mistake upstream
    w = fn(old, _t(_SAMPLER), _t([[1, 1, 1]]))
    if isinstance(w, Tensor) and w.requires_grad:
        raise _Mismatch(IS_GRAD, "the weights require grad")
    _expect(w, [1.349859], what="the product")


@_case(ex, "random rows, both forms and a random cap, against the definition", GEOMEAN)
def _(fn, gen):
    mask = _prefix_mask([7, 3, 0, 5, 1], 7)
    old = -torch.rand(5, 7, generator=gen) * 3
    sampler = old + 0.3 * torch.randn(5, 7, generator=gen)
    cap = 1.2 + torch.rand(1, generator=gen).item()
    for form in ("product", "geomean"):
        _expect(fn(old, sampler, mask, cap=cap, form=form), ref.seq_is_weight(old, sampler, mask, cap=cap, form=form),
                what=f"the weights ({form})")


# ================================================================================================================
# 11 · Rollout Routing Replay (R3): the sampler's routes, aligned with the trainer's forward

ex = _exercise("align_sampler_routes", "11", "align_sampler_routes(step_indices, batch_size) -> list over layers of "
               "(B, P + T, k) long", "minirl.decoding.generate (record_sampler_routes=True) with "
               "minirl.moe.record_routing(along='sequence')", ("minirl.decoding.generate", "minirl.moe.record_routing"))
LAST_MISSING = ("decoding never feeds the last sampled token, so the decode loop recorded P + T - 1 positions; the "
                "trainer's forward over prompt + completion has P + T: add one for the last position (repeat the "
                "one before it: its output predicts nothing the loss reads)")
SHIFTED = ("a position's experts are those used when that token was the INPUT of a forward (they compute its hidden "
           "state); the forward that SAMPLED token j had token j - 1 as its input: the routes are shifted by one")
ROW_ORDER = ("the router flattens a (B, L) forward row by row: token (b, l) is row b * L + l, so reshape to "
             "(B, L, k), not (L, B, k)")
NOT_LONG = "expert indices are integers (torch.long): the replayed router gathers with them"
PER_LAYER = "return one (B, P + T, k) tensor per LAYER (each forward of the decode loop gives one per layer)"


def _steps(B: int, P: int, T: int, k: int, layers: int, E: int, gen) -> list[list[Tensor]]:
    """What the decode loop's router hooks see: the prefill forward (B * P tokens), then T - 1 one-token forwards,
    each a list over layers of (tokens, k) expert indices."""
    lengths = [P] + [1] * (T - 1)
    return [[torch.randint(0, E, (B * n, k), generator=gen) for _ in range(layers)] for n in lengths]


def _check_routes(got, want: list[Tensor], shifted: list[Tensor], transposed: list[Tensor]) -> None:
    if not isinstance(got, list | tuple):
        raise _Mismatch(PER_LAYER, f"got a {type(got).__name__}, expected a list of {len(want)} tensors")
    if len(got) != len(want):
        raise _Mismatch(PER_LAYER, f"got {len(got)} tensors, expected {len(want)} (one per layer)")
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(g, Tensor):
            raise _Mismatch(PER_LAYER, f"layer {layer}: got a {type(g).__name__}")
        if g.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise _Mismatch(NOT_LONG, f"layer {layer}: dtype {g.dtype}")
        if g.shape[:1] + g.shape[2:] == w.shape[:1] + w.shape[2:] and g.shape[1] == w.shape[1] - 1:
            raise _Mismatch(LAST_MISSING, f"layer {layer}: shape {tuple(g.shape)}, expected {tuple(w.shape)}")
        if g.shape != w.shape:
            raise _Mismatch(None, f"layer {layer}: shape {tuple(g.shape)}, expected {tuple(w.shape)}")
        body = g[:, :-1]  # every position the decode loop fed; the last one may hold any valid experts
        if torch.equal(body, w[:, :-1]):
            continue
        if torch.equal(body, shifted[layer][:, :-1]):
            raise _Mismatch(SHIFTED, f"layer {layer}")
        if torch.equal(body, transposed[layer][:, :-1]):
            raise _Mismatch(ROW_ORDER, f"layer {layer}")
        raise _Mismatch(None, f"layer {layer}: the experts differ from the sampler's at some fed position")


def _variants(steps, B):
    """The right alignment, the one shifted by one position, and the one that reads tokens as (L, B)."""
    want = ref.align_sampler_routes(steps, B)
    shifted = [torch.cat([w[:, :1], w[:, :-1]], dim=1) for w in want]
    transposed = []
    for layer in range(len(steps[0])):
        parts = [s[layer].reshape(-1, B, s[layer].shape[-1]).transpose(0, 1) for s in steps]
        r = torch.cat(parts, dim=1)
        transposed.append(torch.cat([r, r[:, -1:]], dim=1))
    return want, shifted, transposed


@_case(ex, "one layer, k = 1, by hand", LAST_MISSING)
def _(fn, gen):
    # B = 2, P = 2, T = 3: the prefill routes 4 tokens (row 0: experts 5, 6; row 1: 7, 8), then two decode steps
    steps = [[_t([[5], [6], [7], [8]]).long()], [_t([[1], [2]]).long()], [_t([[3], [4]]).long()]]
    got = fn(steps, 2)
    # positions 0..3 fed: row 0 -> 5, 6, 1, 3 and row 1 -> 7, 8, 2, 4; position 4 (never fed) repeats position 3
    want = [_t([[[5], [6], [1], [3], [3]], [[7], [8], [2], [4], [4]]]).long()]
    shifted = [_t([[[5], [5], [6], [1], [3]], [[7], [7], [8], [2], [4]]]).long()]
    transposed = [_t([[[5], [7], [1], [3], [3]], [[6], [8], [2], [4], [4]]]).long()]
    _check_routes(got, want, shifted, transposed)


@_case(ex, "two layers, k = 2, a longer prompt", ROW_ORDER)
def _(fn, gen):
    steps = _steps(3, 4, 5, 2, 2, 8, gen)
    _check_routes(fn(steps, 3), *_variants(steps, 3))


@_case(ex, "one token sampled: only the prefill", LAST_MISSING)
def _(fn, gen):
    steps = _steps(2, 3, 1, 2, 1, 6, gen)
    _check_routes(fn(steps, 2), *_variants(steps, 2))


@_case(ex, "random shapes against the definition", SHIFTED)
def _(fn, gen):
    B, P, T, k, layers = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in
                          ((1, 5), (2, 7), (2, 9), (1, 3), (1, 4)))
    steps = _steps(B, P, T, k, layers, 8, gen)
    _check_routes(fn(steps, B), *_variants(steps, B))
