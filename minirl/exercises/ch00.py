"""Exercises of chapter 00: the task and the models.

Each case is worked out by hand, or compared on seeded random inputs with the checker's reference copy
(``_reference``), never with minirl's function, which refuses to run while its exercise is graded."""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from . import _reference as ref
from ._core import (
    _as_tensor,
    _case,
    _exercise,
    _expect,
    _grad,
    _leaf,
    _Mismatch,
    _t,
)

# ================================================================================================================
# 00 · the task and the models


ex = _exercise("completion_mask", "00", "completion_mask(completion_ids, eos_token_id) -> (B, T) mask",
               "minirl.rollout.completion_mask", ("minirl.rollout.completion_mask",))
EOS_INCLUDED = ("the EOS token itself must count: the model has to learn to stop, so the mask runs up to and "
                "INCLUDING the first EOS")
PAD_MASK = ("mask inferred from the pad id: the model can sample the pad token (and some tokenizers use pad = EOS); "
            "build the mask from the first EOS, never from the pad id")


@_case(ex, "one EOS per row, pad after it", EOS_INCLUDED)
def _(fn, gen):
    ids = torch.tensor([[5, 7, 1, 0, 0], [5, 1, 0, 0, 0]])  # EOS id 1, pad id 0 (minirl's tokenizer)
    _expect(fn(ids, 1), [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]],
            [([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], EOS_INCLUDED)])


@_case(ex, "no EOS: a truncated row", "a row without EOS was cut at max_new_tokens: every token was generated "
       "and counts (all ones)")
def _(fn, gen):
    _expect(fn(torch.tensor([[4, 4, 4, 4]]), 1), [[1, 1, 1, 1]])


@_case(ex, "the model sampled the pad token before EOS", PAD_MASK)
def _(fn, gen):
    ids = torch.tensor([[5, 0, 7, 1, 0]])  # a pad id (0) inside the completion
    _expect(fn(ids, 1), [[1, 1, 1, 1, 0]], [([[1, 0, 1, 1, 0]], PAD_MASK)])


@_case(ex, "tokens after the first EOS", "stop at the FIRST EOS: what follows it was sampled after the end")
def _(fn, gen):
    ids = torch.tensor([[5, 1, 7, 1, 9]])
    _expect(fn(ids, 1), [[1, 1, 0, 0, 0]], [([[1, 0, 1, 0, 1]], "only the EOS tokens were masked out: a completion "
                                             "ends at its first EOS")])


@_case(ex, "pad id equal to the EOS id", PAD_MASK)
def _(fn, gen):
    ids = torch.tensor([[5, 7, 1, 1, 1]])  # pad = EOS = 1 (e.g. tokenizers that reuse EOS as pad)
    _expect(fn(ids, 1), [[1, 1, 1, 0, 0]], [([[1, 1, 0, 0, 0]], PAD_MASK)])


@_case(ex, "several EOS ids", "eos_token_id may be a list (Llama 3 has several end tokens): any of them ends a "
       "completion")
def _(fn, gen):
    ids = torch.tensor([[5, 3, 7, 1], [5, 1, 3, 9]])
    _expect(fn(ids, [1, 3]), [[1, 1, 0, 0], [1, 1, 0, 0]])


@_case(ex, "random completions against the definition", "compare with the hand cases: ones up to and including "
       "the first EOS, zeros after it, all ones without EOS")
def _(fn, gen):
    ids = torch.randint(0, 6, (6, 9), generator=gen)  # EOS id 1, pad id 0 both appear anywhere
    ids[0] = 4  # one row without EOS
    _expect(fn(ids, 1), ref.completion_mask(ids, 1), [((ids != 0).float(), PAD_MASK)])


# ---------------------------------------------------------------------------------------------- token_logprobs

ex = _exercise("token_logprobs", "00",
               "token_logprobs(model, input_ids, attention_mask, n_prompt_tokens, *, temperature=1.0) -> (B, T)",
               "minirl.rollout.token_logprobs", ("minirl.rollout.token_logprobs",))
OFF_BY_ONE = ("off by one: the logits at position t predict token t+1, so the completion's log-probs come from the "
              "positions just BEFORE each completion token")
TEMPERATURE = ("the tokens were sampled from softmax(logits / temperature): the log-probs must use the same "
               "temperature, or every ratio is off before the first update")


@lru_cache(maxsize=1)
def _tiny_lm():
    """A tiny random Qwen3 (weights scaled up so its distributions are far from uniform) and a left-padded batch."""
    from ..models import tiny_dense
    from ..tokenizer import build_tokenizer

    tok = build_tokenizer()
    with torch.random.fork_rng():  # tiny_dense seeds the global RNG; leave the student's untouched
        model = tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    prompts = tok(["1+2=", "12+34+5="], return_tensors="pt", padding=True)  # left padding
    completion = torch.tensor([[7, 19, 7, 1, 0], [9, 5, 19, 9, 1]])  # "3#3<eos><pad>", "51#5<eos>"
    input_ids = torch.cat([prompts.input_ids, completion], 1)  # (2, 9 + 5)
    attention_mask = torch.cat([prompts.attention_mask, (completion != 0).long()], 1)
    return model, input_ids, attention_mask, prompts.input_ids.shape[1]


def _lm_reference(temperature: float, shift: int = 0, use_mask: bool = True, ids: Tensor | None = None):
    """The reference log-probs of the batch; shift=1 reads the logits one position late, use_mask=False drops the
    mask; ``ids`` replaces the completion tokens (same shape)."""
    model, _ids, am, P = _tiny_lm()
    ids = _ids if ids is None else ids
    with torch.no_grad():
        if shift == 0 and use_mask:
            return ref.token_logprobs(model, ids, am, P, temperature=temperature)
        logits = model(input_ids=ids, attention_mask=am if use_mask else None).logits.float() / temperature
        logits = logits[:, P - 1 + shift:logits.shape[1] - 1 + shift]  # (B, T, V)
        return torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)


def _lm_run(fn, temperature: float | None, ids: Tensor | None = None):
    model, _ids, am, P = _tiny_lm()
    ids = _ids if ids is None else ids
    out = fn(model, ids, am, P) if temperature is None else fn(model, ids, am, P, temperature=temperature)
    return out, _as_tensor(out, "the log-probs")


@_case(ex, "left-padded batch at the default temperature (1)", OFF_BY_ONE)
def _(fn, gen):
    _, got = _lm_run(fn, None)
    _expect(got, _lm_reference(1.0), [(_lm_reference(1.0, shift=1), OFF_BY_ONE),
                                      (_lm_reference(1.0, use_mask=False), "the attention mask was not passed: "
                                       "real tokens attended to the left padding")], atol=1e-4)


@_case(ex, "sampled at temperature 0.7", TEMPERATURE)
def _(fn, gen):
    _, got = _lm_run(fn, 0.7)
    _expect(got, _lm_reference(0.7), [(_lm_reference(1.0), TEMPERATURE)], atol=1e-4)


@_case(ex, "random completion tokens at temperature 1.3 against the definition", OFF_BY_ONE)
def _(fn, gen):
    _, ids, _, P = _tiny_lm()
    ids = ids.clone()
    ids[:, P:] = torch.randint(2, 20, (ids.shape[0], ids.shape[1] - P), generator=gen)
    _, got = _lm_run(fn, 1.3, ids)
    _expect(got, _lm_reference(1.3, ids=ids), [(_lm_reference(1.3, shift=1, ids=ids), OFF_BY_ONE),
                                               (_lm_reference(1.0, ids=ids), TEMPERATURE)], atol=1e-4)


@_case(ex, "the log-probs carry the policy's gradient", "the log-probs must be differentiable in the model's "
       "weights (no torch.no_grad, no .detach()): the policy loss backpropagates through them")
def _(fn, gen):
    out, _ = _lm_run(fn, 1.0)
    if not isinstance(out, Tensor) or not out.requires_grad:
        raise _Mismatch()


# ------------------------------------------------------------------------------------------- sequence_logprobs

ex = _exercise("sequence_logprobs", "00", "sequence_logprobs(token_logprobs, mask, *, reduction='sum') -> (B,)",
               "minirl.rollout.sequence_logprobs", ("minirl.rollout.sequence_logprobs",))
UNMASKED = ("the positions after EOS hold the log-prob of the pad token (garbage): mask them before reducing")
MEAN_T = ("divides by the padded length T: the mean is over each row's own valid tokens")
_SEQ_LP = [[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -9.0, -9.0]]  # -4.0 and the -9.0s sit in padding
_SEQ_MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]


@_case(ex, "sum (the default reduction), with garbage in the padding", UNMASKED)
def _(fn, gen):
    # (-1-2-3) = -6 and (-0.5-0.5) = -1; unmasked: -10 and -19; the mean instead: -2 and -0.5
    _expect(fn(_t(_SEQ_LP), _t(_SEQ_MASK)), [-6.0, -1.0], [([-10.0, -19.0], UNMASKED),
                                                          ([-2.0, -0.5], "the default reduction is the sum")])


@_case(ex, "mean over the valid tokens", MEAN_T)
def _(fn, gen):
    # -6 / 3 = -2 and -1 / 2 = -0.5; over T = 4: -1.5 and -0.25; unmasked: -2.5 and -4.75
    _expect(fn(_t(_SEQ_LP), _t(_SEQ_MASK), reduction="mean"), [-2.0, -0.5],
            [([-1.5, -0.25], MEAN_T), ([-2.5, -4.75], UNMASKED)])


@_case(ex, "gradient of the mean", "each valid token of row i should receive 1 / n_i of the gradient, padding none")
def _(fn, gen):
    lp = _leaf(_SEQ_LP)
    g = _grad(fn(lp, _t(_SEQ_MASK), reduction="mean"), lp)
    _expect(g, [[1 / 3, 1 / 3, 1 / 3, 0], [0.5, 0.5, 0, 0]], [([[0.25] * 4, [0.25, 0.25, 0, 0]], MEAN_T)],
            what="the gradient")


@_case(ex, "a row with no valid token (mean)", "a row with no valid token must not give 0/0 = NaN: raise a "
       "ValueError that says so (or return a finite value)")
def _(fn, gen):
    try:
        out = fn(_t([[-1.0, -2.0], [-3.0, -4.0]]), _t([[1, 1], [0, 0]]), reduction="mean")
    except ValueError:
        return
    if not torch.isfinite(_as_tensor(out, "the output")).all():
        raise _Mismatch()


@_case(ex, "random rows, both reductions, against the definition", MEAN_T)
def _(fn, gen):
    lp = -torch.rand(5, 7, generator=gen) * 4
    mask = (torch.arange(7) < torch.tensor([7, 3, 1, 5, 2]).unsqueeze(1)).float()
    for reduction in ("sum", "mean"):
        _expect(fn(lp, mask, reduction=reduction), ref.sequence_logprobs(lp, mask, reduction=reduction),
                [((lp * mask).sum(-1) / 7, MEAN_T), (lp.sum(-1) if reduction == "sum" else lp.mean(-1), UNMASKED)],
                what=f"reduction={reduction!r}")
