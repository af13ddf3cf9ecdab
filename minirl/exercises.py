"""The course kit's checker: ``check("gae", my_gae)`` grades a student's function on hidden cases.

Each exercise of ``notebooks/exercises/`` asks for one function that minirl implements. The checker runs it on
cases worked out by hand (values and gradients), on edge cases the field got wrong (groups of equal rewards,
padding that holds garbage, empty rows, a fully masked batch, extreme log-ratios), and on random inputs compared
with minirl's own function. The first case that fails raises ``AssertionError`` naming the case and the most
likely mistake, recognised from the wrong value it produces ("this is the per-token mean over the whole batch:
DAPO's mode, not GRPO's"); the message never shows how to write the function. Every named mistake has a wrong
implementation in ``tests/test_exercises.py`` that the checker is shown to reject with that hint.

Usage in a notebook::

    from minirl import exercises
    exercises.check("gae", gae)          # prints "gae: all 5 cases passed", or raises AssertionError
    exercises.EXERCISES["gae"].case_names()   # what is checked (not how)

Cases are deterministic (fixed inputs, seeded generators, tolerances of about 1e-5), so a check gives the same
verdict on every machine and thread count.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch import Tensor

__all__ = ["EXERCISES", "Exercise", "check", "list_exercises"]


# ----------------------------------------------------------------------------------------------------------------
# the machinery: exercises, cases, comparisons


class _Mismatch(Exception):
    """Raised inside a case when the student's output is wrong. ``hint`` None means "use the case's own hint"."""

    def __init__(self, hint: str | None = None, detail: str = ""):
        super().__init__(hint or detail)
        self.hint, self.detail = hint, detail


@dataclass
class Exercise:
    """One graded function: its name, chapter, the signature the student writes, and its ordered cases.

    ``cases`` holds (case name, default hint, runner) triples; the runner takes the student's function and a
    seeded ``torch.Generator`` and raises ``_Mismatch`` when the function is wrong.
    """

    name: str
    chapter: str
    signature: str
    source: str
    cases: list[tuple[str, str, Callable]] = field(default_factory=list)

    def case_names(self) -> list[str]:
        """The names of the cases, in the order they run."""
        return [name for name, _, _ in self.cases]


#: Every exercise by name, in syllabus order.
EXERCISES: dict[str, Exercise] = {}


def _exercise(name: str, chapter: str, signature: str, source: str) -> Exercise:
    ex = Exercise(name, chapter, signature, source)
    EXERCISES[name] = ex
    return ex


def _case(ex: Exercise, name: str, hint: str):
    """Register the decorated function as the next case of ``ex``; ``hint`` is shown when no mistake is recognised."""

    def register(run: Callable) -> Callable:
        ex.cases.append((name, hint, run))
        return run

    return register


def list_exercises(chapter: str | None = None) -> list[str]:
    """Names of the exercises, in syllabus order, optionally only those of one chapter ("00" ... "06").

    Returns:
        A list of names accepted by ``check``.
    """
    return [n for n, ex in EXERCISES.items() if chapter is None or ex.chapter == chapter]


def check(name: str, fn: Callable, *, seed: int = 0, quiet: bool = False) -> int:
    """Grade ``fn`` against the hidden cases of exercise ``name``; raise AssertionError on the first failure.

    The message names the exercise, the case, and the most likely mistake (recognised from the wrong value the
    function produced when the case knows it), never the solution. On success it prints
    "<name>: all N cases passed" and returns N, so a notebook's check cell reads ``assert check(...) == N``.

    Args:
        name: an exercise name (see ``list_exercises()``), e.g. "gae", "aggregate", "dpo_loss".
        fn: the student's function, with the signature given in the exercise (``EXERCISES[name].signature``).
            Losses may return the loss alone or a tuple (loss, stats), as minirl's functions do.
        seed: seed of the random cases (the hand-worked cases do not depend on it). A teacher's hidden test can
            rerun the check with another seed, on inputs the student has not seen.
        quiet: do not print the success line.

    Returns:
        The number of cases passed (all of them).

    Raises:
        KeyError: if ``name`` is not an exercise.
        TypeError: if ``fn`` is not callable.
        AssertionError: on the first failing case (including a function that still raises NotImplementedError,
            or raises anything else: the original exception is chained).

    Source: the cases cite the equation they check in each exercise's markdown cell; the mistakes are the ones
    the field's public bug reports describe (see notebooks/exercises/README.md).
    """
    if name not in EXERCISES:
        raise KeyError(f"unknown exercise {name!r}; the exercises are {list_exercises()}")
    if not callable(fn):
        raise TypeError(f"check({name!r}, fn) needs a function, got {type(fn).__name__}")
    ex = EXERCISES[name]
    for i, (case_name, hint, run) in enumerate(ex.cases, start=1):
        where = f"{name}: case {i}/{len(ex.cases)} '{case_name}' failed"
        try:
            run(fn, torch.Generator().manual_seed(1000 * seed + i))
        except _Mismatch as m:
            detail = f"\n  ({m.detail})" if m.detail else ""
            raise AssertionError(f"{where}.\n  Likely mistake: {m.hint or hint}{detail}") from None
        except NotImplementedError:
            raise AssertionError(f"{name}: not implemented yet (the function raised NotImplementedError)") from None
        except Exception as e:  # the student's code crashed: show its error and the case's hint
            raise AssertionError(f"{where}: the function raised {type(e).__name__}: {e}\n  Hint: {hint}") from e
    if not quiet:
        print(f"{name}: all {len(ex.cases)} cases passed")
    return len(ex.cases)


def _fmt(t: Tensor) -> str:
    """A short rendering of a small tensor for a failure message (rounded; shape only when large)."""
    if t.numel() > 12:
        return f"a tensor of shape {tuple(t.shape)}"
    return str([round(v, 6) for v in t.double().flatten().tolist()]).replace("[", "(").replace("]", ")")


def _as_tensor(x, what: str) -> Tensor:
    if isinstance(x, bool | int | float):
        return torch.tensor(float(x))
    if not isinstance(x, Tensor):
        raise _Mismatch(f"{what} should be a torch.Tensor, got {type(x).__name__}")
    return x.detach()


def _close(a: Tensor, b: Tensor, atol: float, rtol: float) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol))


def _expect(got, want, mistakes=(), *, what: str = "the output", atol: float = 1e-5, rtol: float = 1e-5) -> None:
    """Pass if ``got`` is close to ``want``; else raise the hint of the first known mistake it matches.

    ``mistakes`` is a sequence of (wrong value, hint): the value a known wrong implementation gives on this case.
    A NaN / inf where a finite value is expected, or a wrong shape, is reported as such.
    """
    got = _as_tensor(got, what)
    want = torch.as_tensor(want, dtype=torch.float64)
    mistakes = [(torch.as_tensor(w, dtype=torch.float64), h) for w, h in mistakes]
    if got.dtype == torch.bool:
        got = got.double()
    if got.shape != want.shape:
        for wrong, hint in mistakes:
            if _close(got, wrong, atol, rtol):
                raise _Mismatch(hint)
        raise _Mismatch(None, f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if _close(got, want, atol, rtol):
        return
    if torch.isfinite(want).all() and not torch.isfinite(got).all():
        raise _Mismatch(None, f"{what} holds NaN or inf: {_fmt(got)}")
    for wrong, hint in mistakes:
        if _close(got, wrong, atol, rtol):
            raise _Mismatch(hint, f"{what}: got {_fmt(got)}, expected {_fmt(want)}")
    raise _Mismatch(None, f"{what}: got {_fmt(got)}, expected {_fmt(want)}")


def _grad(out, wrt: Tensor | tuple[Tensor, ...], weights: Tensor | None = None, no_grad_hint: str | None = None):
    """d sum(weights * out) / d wrt (zeros for an input the output does not depend on)."""
    if not isinstance(out, Tensor) or not out.requires_grad:
        raise _Mismatch(no_grad_hint or "the output carries no gradient (computed under torch.no_grad, detached, or "
                        "through .item() / a new tensor): the loss must be differentiable in logprobs")
    objective = (out * weights).sum() if weights is not None else out.sum()
    single = isinstance(wrt, Tensor)
    inputs = (wrt,) if single else tuple(wrt)
    grads = torch.autograd.grad(objective, inputs, allow_unused=True)
    grads = tuple(torch.zeros_like(x) if g is None else g.detach() for g, x in zip(grads, inputs, strict=True))
    return grads[0] if single else grads


def _loss(out):
    """Accept a loss or a (loss, stats) tuple, as minirl's losses return."""
    return out[0] if isinstance(out, tuple | list) else out


def _leaf(values, dtype=torch.float32) -> Tensor:
    return torch.tensor(values, dtype=dtype, requires_grad=True)


def _t(values, dtype=torch.float32) -> Tensor:
    return torch.tensor(values, dtype=dtype)


def _prefix_mask(lengths, T: int) -> Tensor:
    """(B, T) float mask with ``lengths[i]`` leading ones in row i."""
    return (torch.arange(T).unsqueeze(0) < torch.as_tensor(lengths).unsqueeze(1)).float()


def _expect_raises(call: Callable, exc: type[Exception], hint: str) -> None:
    try:
        call()
    except exc:
        return
    except NotImplementedError:
        raise
    except Exception as e:  # wrong exception type
        raise _Mismatch(hint, f"raised {type(e).__name__}, expected {exc.__name__}") from None
    raise _Mismatch(hint, f"nothing was raised, expected {exc.__name__}")


NEEDS_FINITE = ("a {n}-nat log-ratio overflows exp() to inf (and inf * 0 = NaN at a masked position): clamp the "
                "log-ratio (e.g. to +-20 nats) before exp, and mask before exp, not after")
OLD_DETACHED = ("old_logprobs was not treated as a constant: when it is the very tensor logprobs (the first "
                "update on-policy) the ratio's gradient vanishes; detach the behaviour policy's log-probs")


# ================================================================================================================
# 00 · the task and the models


ex = _exercise("completion_mask", "00", "completion_mask(completion_ids, eos_token_id) -> (B, T) mask",
               "minirl.rollout.completion_mask")
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


# ---------------------------------------------------------------------------------------------- token_logprobs

ex = _exercise("token_logprobs", "00",
               "token_logprobs(model, input_ids, attention_mask, n_prompt_tokens, temperature=1.0) -> (B, T)",
               "minirl.rollout.token_logprobs")
OFF_BY_ONE = ("off by one: the logits at position t predict token t+1, so the completion's log-probs come from the "
              "positions just BEFORE each completion token")
TEMPERATURE = ("the tokens were sampled from softmax(logits / temperature): the log-probs must use the same "
               "temperature, or every ratio is off before the first update")


@lru_cache(maxsize=1)
def _tiny_lm():
    """A tiny random Qwen3 (weights scaled up so its distributions are far from uniform) and a left-padded batch."""
    from .models import tiny_dense
    from .tokenizer import build_tokenizer

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


def _lm_reference(temperature: float, shift: int = 0, use_mask: bool = True):
    """minirl's log-probs of the batch; shift=1 reads the logits one position late, use_mask=False drops the mask."""
    from .rollout import token_logprobs

    model, ids, am, P = _tiny_lm()
    with torch.no_grad():
        if shift == 0 and use_mask:
            return token_logprobs(model, ids, am, P, temperature)
        logits = model(input_ids=ids, attention_mask=am if use_mask else None).logits.float() / temperature
        logits = logits[:, P - 1 + shift:logits.shape[1] - 1 + shift]  # (B, T, V)
        return torch.log_softmax(logits, -1).gather(-1, ids[:, P:, None]).squeeze(-1)


def _lm_run(fn, temperature: float):
    model, ids, am, P = _tiny_lm()
    out = fn(model, ids, am, P, temperature)
    return out, _as_tensor(out, "the log-probs")


@_case(ex, "left-padded batch at temperature 1", OFF_BY_ONE)
def _(fn, gen):
    _, got = _lm_run(fn, 1.0)
    _expect(got, _lm_reference(1.0), [(_lm_reference(1.0, shift=1), OFF_BY_ONE),
                                      (_lm_reference(1.0, use_mask=False), "the attention mask was not passed: "
                                       "real tokens attended to the left padding")], atol=1e-4)


@_case(ex, "sampled at temperature 0.7", TEMPERATURE)
def _(fn, gen):
    _, got = _lm_run(fn, 0.7)
    _expect(got, _lm_reference(0.7), [(_lm_reference(1.0), TEMPERATURE)], atol=1e-4)


@_case(ex, "the log-probs carry the policy's gradient", "the log-probs must be differentiable in the model's "
       "weights (no torch.no_grad, no .detach()): the policy loss backpropagates through them")
def _(fn, gen):
    out, _ = _lm_run(fn, 1.0)
    if not isinstance(out, Tensor) or not out.requires_grad:
        raise _Mismatch()


# ------------------------------------------------------------------------------------------- sequence_logprobs

ex = _exercise("sequence_logprobs", "00", "sequence_logprobs(token_logprobs, mask, reduction='sum') -> (B,)",
               "minirl.rollout.sequence_logprobs")
UNMASKED = ("the positions after EOS hold the log-prob of the pad token (garbage): mask them before reducing")
MEAN_T = ("divides by the padded length T: the mean is over each row's own valid tokens")
_SEQ_LP = [[-1.0, -2.0, -3.0, -4.0], [-0.5, -0.5, -9.0, -9.0]]  # -4.0 and the -9.0s sit in padding
_SEQ_MASK = [[1, 1, 1, 0], [1, 1, 0, 0]]


@_case(ex, "sum, with garbage in the padding", UNMASKED)
def _(fn, gen):
    # (-1-2-3) = -6 and (-0.5-0.5) = -1; unmasked: -10 and -19
    _expect(fn(_t(_SEQ_LP), _t(_SEQ_MASK), "sum"), [-6.0, -1.0], [([-10.0, -19.0], UNMASKED)])


@_case(ex, "mean over the valid tokens", MEAN_T)
def _(fn, gen):
    # -6 / 3 = -2 and -1 / 2 = -0.5; over T = 4: -1.5 and -0.25; unmasked: -2.5 and -4.75
    _expect(fn(_t(_SEQ_LP), _t(_SEQ_MASK), "mean"), [-2.0, -0.5],
            [([-1.5, -0.25], MEAN_T), ([-2.5, -4.75], UNMASKED)])


@_case(ex, "gradient of the mean", "each valid token of row i should receive 1 / n_i of the gradient, padding none")
def _(fn, gen):
    lp = _leaf(_SEQ_LP)
    g = _grad(fn(lp, _t(_SEQ_MASK), "mean"), lp)
    _expect(g, [[1 / 3, 1 / 3, 1 / 3, 0], [0.5, 0.5, 0, 0]], [([[0.25] * 4, [0.25, 0.25, 0, 0]], MEAN_T)],
            what="the gradient")


@_case(ex, "a row with no valid token (mean)", "a row with no valid token must not give 0/0 = NaN: raise a "
       "ValueError that says so (or return a finite value)")
def _(fn, gen):
    try:
        out = fn(_t([[-1.0, -2.0], [-3.0, -4.0]]), _t([[1, 1], [0, 0]]), "mean")
    except ValueError:
        return
    if not torch.isfinite(_as_tensor(out, "the output")).all():
        raise _Mismatch()


# ================================================================================================================
# 01 · PPO


ex = _exercise("gae", "01", "gae(rewards, values, mask, gamma=1.0, lam=0.95) -> (advantages, returns)",
               "minirl.advantages.gae")
PAD_VALUE = ("the value after a row's last valid token is 0 (the episode ended there): GAE must not bootstrap "
             "from the critic's value of a padding position")
LAM_ONLY = "the recursion carries A_{t+1} back with gamma * lam, not lam alone (visible once gamma < 1)"
RETURNS_MC = ("returns are advantages + values (the critic's target), not the discounted reward-to-go; the two "
              "differ when lam < 1")


@_case(ex, "one row by hand, gamma 1, lam 0.95", "A_t = delta_t + gamma * lam * A_{t+1}, computed backwards from "
       "the last token, with delta_t = r_t + gamma * V_{t+1} - V_t")
def _(fn, gen):
    adv, ret = fn(_t([[0.0, 0.0, 1.0]]), _t([[0.5, 0.6, 0.7]]), _t([[1, 1, 1]]), 1.0, 0.95)
    # deltas (0.1, 0.1, 0.3); A_2 = 0.3, A_1 = 0.1 + 0.95 * 0.3 = 0.385, A_0 = 0.1 + 0.95 * 0.385 = 0.46575
    _expect(adv, [[0.46575, 0.385, 0.3]], what="advantages")
    _expect(ret, [[0.96575, 0.985, 1.0]], [([[1.0, 1.0, 1.0]], RETURNS_MC)], what="returns")  # A + V


@_case(ex, "one row by hand, gamma 0.9, lam 0.8", LAM_ONLY)
def _(fn, gen):
    adv, ret = fn(_t([[0.0, 0.0, 1.0]]), _t([[0.5, 0.6, 0.7]]), _t([[1, 1, 1]]), 0.9, 0.8)
    # deltas: 0 + 0.9*0.6 - 0.5 = 0.04, 0 + 0.9*0.7 - 0.6 = 0.03, 1 - 0.7 = 0.3
    # A_2 = 0.3, A_1 = 0.03 + 0.72 * 0.3 = 0.246, A_0 = 0.04 + 0.72 * 0.246 = 0.21712
    # lam alone: A_1 = 0.03 + 0.8 * 0.3 = 0.27, A_0 = 0.04 + 0.8 * 0.27 = 0.256
    _expect(adv, [[0.21712, 0.246, 0.3]], [([[0.256, 0.27, 0.3]], LAM_ONLY)], what="advantages")
    # returns A + V = (0.71712, 0.846, 1.0); reward-to-go: (0.81, 0.9, 1.0)
    _expect(ret, [[0.71712, 0.846, 1.0]], [([[0.81, 0.9, 1.0]], RETURNS_MC)], what="returns")


@_case(ex, "padded row: the critic's values of padding are garbage", PAD_VALUE)
def _(fn, gen):
    adv, ret = fn(_t([[0.0, 1.0, 0.0, 0.0]]), _t([[0.5, 0.6, 9.0, 9.0]]), _t([[1, 1, 0, 0]]), 1.0, 0.95)
    # A_1 = 1 - 0.6 = 0.4; A_0 = (0 + 0.6 - 0.5) + 0.95 * 0.4 = 0.48; returns 0.98, 1.0
    m = _t([[1, 1, 0, 0]])
    _expect(_as_tensor(adv, "advantages") * m, [[0.48, 0.4, 0, 0]], what="advantages on the valid tokens")
    _expect(_as_tensor(ret, "returns") * m, [[0.98, 1.0, 0, 0]], what="returns on the valid tokens")
    _expect(_as_tensor(adv, "advantages") * (1 - m), [[0, 0, 0, 0]], what="advantages at padding")


@_case(ex, "random batch with varied lengths and an empty row", "compare your loop with the hand cases above: "
       "each row must give the same numbers as alone, unpadded")
def _(fn, gen):
    from .advantages import gae

    r, v = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    m = _prefix_mask([6, 3, 0, 1], 6)
    want_a, want_r = gae(r, v, m, 0.99, 0.9)
    adv, ret = fn(r, v, m, 0.99, 0.9)
    _expect(_as_tensor(adv, "advantages") * m, want_a, what="advantages")
    _expect(_as_tensor(ret, "returns") * m, want_r, what="returns")


@_case(ex, "the critic's values are detached", "the critic's values must enter GAE as constants: advantages and "
       "returns are targets, and a gradient through them trains the critic towards itself")
def _(fn, gen):
    v = _leaf([[0.5, 0.6, 0.7]])
    adv, ret = fn(_t([[0.0, 0.0, 1.0]]), v, _t([[1, 1, 1]]), 1.0, 0.95)
    if any(isinstance(x, Tensor) and x.requires_grad for x in (adv, ret)):
        raise _Mismatch()


# ------------------------------------------------------------------------------------------ clipped surrogate

ex = _exercise("clipped_surrogate", "01",
               "clipped_surrogate(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=None) -> loss",
               "minirl.losses.policy_loss (level='token', agg='token-mean')")
UPSIDE_DOWN_RATIO = "the ratio is upside down: it is pi / pi_old, i.e. exp(logprobs - old_logprobs)"
OPTIMISTIC = ("takes the optimistic branch: the loss is the MAX of -A * r and -A * clip(r) (the min of the two "
              "objectives), so beyond the clip range the gradient is 0")
NO_EPS_HIGH = ("clip without eps_high: the upper bound is 1 + eps_high (DAPO's clip-higher), the lower bound "
               "1 - eps_low")
SEQ_MEAN_NOT_TOKEN = ("this averages per sequence first (GRPO's seq-mean-token-mean); this loss is the token-mean: "
                      "every valid token of the batch weighs the same")


def _surrogate(fn, lp, old, adv, mask, eps_low=0.2, eps_high=None):
    return _loss(fn(lp, old, adv, mask, eps_low, eps_high))


@_case(ex, "on-policy, by hand", UPSIDE_DOWN_RATIO)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    loss = _surrogate(fn, lp, _t([[-1.0, -2.0]]), _t([1.0]), _t([[1, 1]]))
    # ratio 1 on both tokens, A = +1: loss (-1 - 1) / 2 = -1; d loss / d logprobs = -A * ratio / 2 = -0.5
    _expect(loss, -1.0, what="the loss")
    _expect(_grad(loss, lp), [[-0.5, -0.5]], [([[0.5, 0.5]], UPSIDE_DOWN_RATIO)], what="the gradient")


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0]])
    loss = _surrogate(fn, lp, lp, _t([1.0]), _t([[1, 1]]))
    _expect(_grad(loss, lp, no_grad_hint=OLD_DETACHED), [[-0.5, -0.5]], [([[0.0, 0.0]], OLD_DETACHED)],
            what="the gradient")


@_case(ex, "ratio above 1 + eps with A > 0 (clipped)", OPTIMISTIC)
def _(fn, gen):
    lp = _leaf([[-0.8]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), 0.2, 0.2)
    # ratio e^0.2 = 1.221403 > 1.2: loss -1.2, gradient 0; the optimistic min: -1.221403, gradient -1.221403
    _expect(loss, -1.2, [(-1.221403, OPTIMISTIC)], what="the loss")
    _expect(_grad(loss, lp), [[0.0]], what="the gradient")


@_case(ex, "clip-higher: eps_high 0.28", NO_EPS_HIGH)
def _(fn, gen):
    lp = _leaf([[-0.8]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([1.0]), _t([[1]]), 0.2, 0.28)
    # ratio 1.221403 < 1.28: unclipped, loss -1.221403, gradient -1.221403; with eps_high ignored: -1.2, gradient 0
    _expect(loss, -1.221403, [(-1.2, NO_EPS_HIGH)], what="the loss")
    _expect(_grad(loss, lp), [[-1.221403]], what="the gradient")


@_case(ex, "ratio below 1 - eps_low with A < 0", NO_EPS_HIGH)
def _(fn, gen):
    lp = _leaf([[-1.5]])
    loss = _surrogate(fn, lp, _t([[-1.0]]), _t([-1.0]), _t([[1]]), 0.2, 0.28)
    # ratio e^-0.5 = 0.606531 < 0.8: max(0.606531, 0.8) = 0.8, gradient 0; lower bound 1 - 0.28 = 0.72 gives 0.72
    _expect(loss, 0.8, [(0.72, NO_EPS_HIGH), (0.606531, OPTIMISTIC)], what="the loss")
    _expect(_grad(loss, lp), [[0.0]], what="the gradient")


@_case(ex, "token-mean over rows of different lengths, garbage in padding", "average over the valid tokens of the "
       "whole batch (token-mean), padding excluded")
def _(fn, gen):
    lp = _t([[-1.0, -1.0, -50.0], [-1.0, 0.0, 0.0]])
    old = _t([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    loss = _surrogate(fn, lp, old, _t([1.0, -1.0]), _t([[1, 1, 0], [1, 0, 0]]))
    # valid terms -1, -1 (A = +1) and +1 (A = -1): (-1 - 1 + 1) / 3 = -1/3; seq-mean: (-1 + 1) / 2 = 0
    _expect(loss, -1 / 3, [(0.0, SEQ_MEAN_NOT_TOKEN)], what="the loss")


@_case(ex, "extreme log-ratios (100 nats on a valid token and in padding)", NEEDS_FINITE.format(n=100))
def _(fn, gen):
    lp = _leaf([[99.0, -1.0, 99.0]])  # token 0: log-ratio +100 with A < 0; token 2: padding, log-ratio +100
    loss = _surrogate(fn, lp, _t([[-1.0, -1.0, -1.0]]), _t([-1.0]), _t([[1, 1, 0]]))
    loss_t = _as_tensor(loss, "the loss")
    g = _grad(loss, lp)
    if not (torch.isfinite(loss_t).all() and torch.isfinite(g).all()):
        raise _Mismatch(None, f"loss {_fmt(loss_t)}, gradient {_fmt(g)}")


# -------------------------------------------------------------------------------------------------- value_loss

ex = _exercise("value_loss", "01", "value_loss(values, old_values, returns, mask, clip=0.2) -> loss",
               "minirl.losses.value_loss (token-mean)")
VALUE_MIN = ("takes the optimistic branch: the clipped value loss is the MAX of the two squared errors "
             "(pessimistic), like the policy's clip")
VALUE_AROUND_RETURNS = ("the clip is around the rollout-time prediction old_values; a clip of (values - returns) "
                        "never binds, so this is the unclipped loss")


@_case(ex, "inside the clip range, by hand", "0.5 * (V - R)^2 per token, averaged over the valid tokens")
def _(fn, gen):
    loss = _loss(fn(_t([[1.0, 2.0]]), _t([[1.1, 2.1]]), _t([[1.5, 1.0]]), _t([[1, 1]]), 0.2))
    # 0.5 * (0.25, 1.0) -> mean 0.3125; without the 0.5: 0.625
    _expect(loss, 0.3125, [(0.625, "PPO's value loss is HALF the squared error: 0.5 * max(...)")], what="the loss")


@_case(ex, "beyond the clip, unclipped error larger", VALUE_MIN)
def _(fn, gen):
    loss = _loss(fn(_t([[2.0]]), _t([[1.0]]), _t([[1.5]]), _t([[1]]), 0.2))
    # unclipped (2 - 1.5)^2 = 0.25; clipped V = 1.2: (1.2 - 1.5)^2 = 0.09; max -> 0.5 * 0.25 = 0.125; min -> 0.045
    _expect(loss, 0.125, [(0.045, VALUE_MIN)], what="the loss")


@_case(ex, "beyond the clip, clipped error larger", VALUE_AROUND_RETURNS)
def _(fn, gen):
    v = _leaf([[2.0]])
    loss = _loss(fn(v, _t([[1.0]]), _t([[3.0]]), _t([[1]]), 0.2))
    # unclipped (2 - 3)^2 = 1; clipped V = 1.2: (1.2 - 3)^2 = 3.24; max -> 0.5 * 3.24 = 1.62, gradient 0 (clipped)
    _expect(loss, 1.62, [(0.5, VALUE_AROUND_RETURNS)], what="the loss")
    _expect(_grad(loss, v), [[0.0]], what="the gradient")


@_case(ex, "padding holds garbage", "average over the valid tokens only (padding excluded from sum and count)")
def _(fn, gen):
    loss = _loss(fn(_t([[1.0, 7.0], [2.0, 7.0]]), _t([[1.0, 0.0], [2.0, 0.0]]), _t([[2.0, 0.0], [2.0, 0.0]]),
                    _t([[1, 0], [1, 0]]), 0.2))
    # valid tokens: 0.5 * max(1, (1.2 - 2)^2 = 0.64) = 0.5 and 0; mean 0.25
    _expect(loss, 0.25, what="the loss")


# ================================================================================================================
# 02 · GRPO


ex = _exercise("group_advantages", "02",
               "group_advantages(rewards, group_size, scale='group', eps=1e-4) -> (B,)  (scales 'group' and 'none')",
               "minirl.advantages.group_advantages")
DDOF0 = "population std (ddof=0); GRPO divides by the unbiased sample std (ddof=1), plus eps"
EPS_INSIDE = "eps is inside the square root: GRPO adds it to the std, std + eps, not sqrt(var + eps)"
LAYOUT = ("the groups are laid out group by group: the G samples of a prompt are consecutive rows; these "
          "advantages mix samples of different prompts")
EQUAL_GROUP = ("a group whose rewards are all equal carries no signal and must give exactly 0, never NaN (0/0 at "
               "eps = 0) nor noise from float round-off")
DRGRPO_DIVIDES = "Dr. GRPO (scale='none') removes the std division: only the group mean is subtracted"


@_case(ex, "one group by hand", DDOF0)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0]), 4, "group", 1e-4)
    # mean 0.25; unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5; (0.75, -0.25) / 0.5001
    # ddof=0: std sqrt(0.75 / 4) = 0.4330127; (0.75, -0.25) / 0.4331127
    _expect(got, [0.75 / 0.5001] + [-0.25 / 0.5001] * 3, [([0.75 / 0.4331127] + [-0.25 / 0.4331127] * 3, DDOF0)])


@_case(ex, "eps = 0.1 is added to the std", EPS_INSIDE)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0]), 4, "group", 0.1)
    # std + eps = 0.6: (1.25, -0.416667); sqrt(0.25 + 0.1) = 0.591608: (1.267731, -0.422577)
    s = math.sqrt(0.35)
    _expect(got, [1.25] + [-0.25 / 0.6] * 3, [([0.75 / s] + [-0.25 / s] * 3, EPS_INSIDE)])


@_case(ex, "three groups of two, laid out group by group", LAYOUT)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), 2, "group", 1e-4)
    # groups (1, 0), (0, 0), (1, 1): the first has mean 0.5, std sqrt(0.5) = 0.707107 -> +-0.5 / 0.707207
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    _expect(got, [a, -a, 0, 0, 0, 0])


@_case(ex, "a group of equal rewards at eps = 0", EQUAL_GROUP)
def _(fn, gen):
    got = fn(_t([1.0, 1.0, 0.0, 1.0]), 2, "group", 0.0)
    # (1, 1) -> 0, 0; (0, 1) -> -+0.5 / sqrt(0.5) = -+0.707107
    _expect(got, [0, 0, -math.sqrt(0.5), math.sqrt(0.5)])


@_case(ex, "equal rewards that float32 cannot represent exactly", EQUAL_GROUP)
def _(fn, gen):
    got = fn(_t([0.7, 0.7, 0.7, 0.1, 0.1, 0.1]), 3, "group", 0.0)  # float32 means leave ~1e-8 of round-off
    _expect(got, [0.0] * 6, atol=1e-6)


@_case(ex, "scale='none' (Dr. GRPO), by hand", DRGRPO_DIVIDES)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0]), 4, "none", 1e-4)
    _expect(got, [0.75, -0.25, -0.25, -0.25], [([0.75 / 0.5001] + [-0.25 / 0.5001] * 3, DRGRPO_DIVIDES)])


@_case(ex, "random groups against the definition", "mean and unbiased std per group, eps added to the std")
def _(fn, gen):
    from .advantages import group_advantages

    r = torch.randint(0, 3, (24,), generator=gen).float() / 2
    _expect(fn(r, 6, "group", 1e-4), group_advantages(r, 6, "group", 1e-4))


@_case(ex, "B not a multiple of group_size", "raise ValueError when the batch is not a whole number of groups "
       "(reshaping anyway would mix prompts, or crash with an unclear message)")
def _(fn, gen):
    _expect_raises(lambda: fn(_t([1.0, 0.0, 0.0]), 2, "group", 1e-4), ValueError, None)


# --------------------------------------------------------------------------------------------------- grpo_loss

ex = _exercise("grpo_loss", "02",
               "grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, eps=0.2, beta=0.04) -> loss",
               "minirl.losses.policy_loss + beta * aggregate(kl.kl_in_loss(..., 'k3')), both seq-mean-token-mean")
TOKEN_MEAN_NOT_SEQ = ("this is the per-token mean over the whole batch: DAPO's mode, not GRPO's (GRPO averages "
                      "each sequence's tokens, then the sequences)")
K3_UPSIDE_DOWN = ("k3's ratio is upside down: r = ref / pi = exp(ref_logprobs - logprobs) for tokens sampled from "
                  "the policy")
KL_NO_GRAD = ("the KL term carries no gradient: in GRPO the k3 penalty sits in the LOSS and is differentiated "
              "through logprobs (only ref_logprobs is a constant)")
K1_IN_LOSS = ("this is k1 = log pi - log ref in the loss: its expected gradient is zero; GRPO puts k3 in the loss")
KL_SIGN = "the KL is a penalty: the loss ADDS beta * KL"


def _grpo(fn, lp, old, ref, adv, mask, eps=0.2, beta=0.04):
    return _loss(fn(lp, old, ref, adv, mask, eps, beta))


@_case(ex, "rows of different lengths, on-policy, policy = reference", TOKEN_MEAN_NOT_SEQ)
def _(fn, gen):
    lp = _leaf([[-1.0, -1.0, -1.0, -3.0], [-1.0, -3.0, -3.0, -3.0]])
    mask = _t([[1, 1, 1, 0], [1, 0, 0, 0]])
    loss = _grpo(fn, lp, lp.detach().clone(), lp.detach().clone(), _t([1.0, -1.0]), mask)
    # terms -1, -1, -1 | +1; seq-mean-token-mean (-1 + 1) / 2 = 0; token-mean (-3 + 1) / 4 = -0.5
    _expect(loss, 0.0, [(-0.5, TOKEN_MEAN_NOT_SEQ)], what="the loss")
    # row 0: -1 / 3 / 2 = -1/6 per token; row 1: +1 / 2; token-mean would give -1/4 and +1/4
    _expect(_grad(loss, lp), [[-1 / 6, -1 / 6, -1 / 6, 0], [0.5, 0, 0, 0]],
            [([[-0.25, -0.25, -0.25, 0], [0.25, 0, 0, 0]], TOKEN_MEAN_NOT_SEQ),
             # k1 in the loss adds beta / n_i / B per token: -1/6 + 0.04/6 = -0.16 and 0.5 + 0.04/2 = 0.52
             ([[-0.16, -0.16, -0.16, 0], [0.52, 0, 0, 0]], K1_IN_LOSS)], what="the gradient")


@_case(ex, "the KL term alone, by hand", K3_UPSIDE_DOWN)
def _(fn, gen):
    lp = _leaf([[-1.0]])
    loss = _grpo(fn, lp, _t([[-1.0]]), _t([[-2.0]]), _t([0.0]), _t([[1]]), beta=0.04)
    # log r = ref - lp = -1: k3 = e^-1 - 1 + 1 = 0.367879; times beta: 0.0147152
    # upside down (log r = +1): e - 2 = 0.718282 -> 0.0287313; k1 = lp - ref = 1 -> 0.04; subtracted: -0.0147152
    _expect(loss, 0.04 * math.exp(-1), [(0.04 * (math.e - 2), K3_UPSIDE_DOWN), (0.04, K1_IN_LOSS),
                                        (-0.04 * math.exp(-1), KL_SIGN)], what="the loss")
    # d k3 / d lp = 1 - e^(ref - lp) = 0.632121; times beta: 0.0252848
    _expect(_grad(loss, lp, no_grad_hint=KL_NO_GRAD), [[0.04 * (1 - math.exp(-1))]],
            [([[0.0]], KL_NO_GRAD), ([[0.04]], K1_IN_LOSS)], what="the gradient")


@_case(ex, "random batch with padding against the definition", "the clipped surrogate plus beta * k3, each "
       "aggregated seq-mean-token-mean over the valid tokens")
def _(fn, gen):
    from .kl import kl_in_loss
    from .losses import aggregate, policy_loss

    mask = _prefix_mask([5, 2, 4], 5)
    lp = (-torch.rand(3, 5, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    ref = lp.detach() + 0.5 * torch.randn(3, 5, generator=gen)
    adv = torch.randn(3, generator=gen)
    want = (policy_loss(lp, old, adv, mask, 0.2, agg="seq-mean-token-mean")[0]
            + 0.04 * aggregate(kl_in_loss(lp, ref, "k3"), mask, "seq-mean-token-mean"))
    want_g = torch.autograd.grad(want, lp)[0]
    loss = _grpo(fn, lp, old, ref, adv, mask)
    _expect(loss, want.detach(), what="the loss")
    _expect(_grad(loss, lp), want_g, what="the gradient")


# ================================================================================================================
# 03 · KL estimators


ex = _exercise("k3", "03", "k3(logprobs, ref_logprobs) -> (B, T)", "minirl.kl.k3")
K3_SIGN = "k3 = r - 1 - log r, with MINUS log r: that is what makes it never negative"


@_case(ex, "three tokens by hand", K3_UPSIDE_DOWN)
def _(fn, gen):
    got = fn(_t([[-1.0, -2.0, -0.5]]), _t([[-2.0, -1.0, -0.5]]))
    # log r = ref - lp = (-1, 1, 0): k3 = (e^-1 - 1 + 1, e - 1 - 1, 0) = (0.367879, 0.718282, 0)
    # upside down: (0.718282, 0.367879, 0); with + log r: (e^-1 - 2, e, 0)
    e = math.e
    _expect(got, [[1 / e, e - 2, 0.0]], [([[e - 2, 1 / e, 0.0]], K3_UPSIDE_DOWN), ([[1 / e - 2, e, 0.0]], K3_SIGN)])


@_case(ex, "gradient by hand", K3_UPSIDE_DOWN)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0, -0.5]])
    g = _grad(fn(lp, _t([[-2.0, -1.0, -0.5]])), lp)
    # d k3 / d lp = 1 - r: (1 - e^-1, 1 - e, 0); upside down: (e - 1, e^-1 - 1, 0)
    e = math.e
    _expect(g, [[1 - 1 / e, 1 - e, 0.0]], [([[e - 1, 1 / e - 1, 0.0]], K3_UPSIDE_DOWN)], what="the gradient")


@_case(ex, "random log-probs: never negative, same as the definition", K3_SIGN)
def _(fn, gen):
    from .kl import k3

    lp, ref = -torch.rand(4, 7, generator=gen) * 5, -torch.rand(4, 7, generator=gen) * 5
    _expect(fn(lp, ref), k3(lp, ref), atol=1e-5)


@_case(ex, "an extreme log-ratio (100 nats)", NEEDS_FINITE.format(n=100))
def _(fn, gen):
    lp = _leaf([[-100.0, -1.0]])
    out = fn(lp, _t([[-0.01, -1.0]]))
    out_t = _as_tensor(out, "k3")
    g = _grad(out, lp)
    if not (torch.isfinite(out_t).all() and torch.isfinite(g).all()):
        raise _Mismatch(None, f"k3 {_fmt(out_t)}, gradient {_fmt(g)}")


# ---------------------------------------------------------------------------------------------- kl_in_reward

ex = _exercise("kl_reward", "03", "kl_reward(scores, logprobs, ref_logprobs, mask, beta) -> (B, T) token rewards",
               "minirl.rewards.token_level_rewards + minirl.kl.kl_in_reward(..., 'k1'), masked")
LAST_COLUMN = ("the score belongs on each row's LAST VALID token, not on the last column (padding for every row "
               "shorter than T)")
K3_IN_REWARD = ("KL from a k3 placed in the reward: in the reward the penalty is k1 = log pi - log ref, whose "
                "REINFORCE gradient is the unbiased gradient of KL(pi || ref); k3 there is biased (Tang & Munos 2025)")
REWARD_KL_SIGN = "the KL is a penalty: each token's reward is -beta * KL (plus the score on the last token)"
REWARD_GRAD = ("the shaped reward carries a gradient: a reward is a constant for the policy gradient, detach the "
               "KL before putting it in the reward")
_KLR_LP = [[-1.0, -1.0, -1.0], [-2.0, -3.0, -3.0]]
_KLR_REF = [[-1.5, -1.0, -0.5], [-2.0, -2.0, -2.0]]
_KLR_MASK = [[1, 1, 1], [1, 1, 0]]


@_case(ex, "two rows by hand, the second padded", LAST_COLUMN)
def _(fn, gen):
    got = fn(_t([1.0, 1.0]), _t(_KLR_LP), _t(_KLR_REF), _t(_KLR_MASK), 0.1)
    got = _as_tensor(got, "the rewards") * _t(_KLR_MASK)
    # k1 = lp - ref: (0.5, 0, -0.5) and (0, -1); -0.1 * k1, then + score 1 on the last valid token:
    # row 0 (-0.05, 0, 0.05 + 1) ; row 1 (0, 0.1 + 1, pad)
    # k3 = e^(ref-lp) - 1 - (ref-lp): (0.106531, 0, 0.148721) and (0, 0.718282)
    k3a, k3b, k3c = math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5, math.e - 2
    _expect(got, [[-0.05, 0.0, 1.05], [0.0, 1.1, 0.0]],
            [([[-0.05, 0.0, 1.05], [0.0, 0.1, 0.0]], LAST_COLUMN),
             ([[-0.1 * k3a, 0.0, 1 - 0.1 * k3b], [0.0, 1 - 0.1 * k3c, 0.0]], K3_IN_REWARD),
             ([[0.05, 0.0, 0.95], [0.0, 0.9, 0.0]], REWARD_KL_SIGN)], what="the rewards on the valid tokens")


@_case(ex, "padding gets no reward", "positions outside the mask must hold 0 (no KL, no score)")
def _(fn, gen):
    got = _as_tensor(fn(_t([1.0, 1.0]), _t(_KLR_LP), _t(_KLR_REF), _t(_KLR_MASK), 0.1), "the rewards")
    _expect(got * (1 - _t(_KLR_MASK)), [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [([[0, 0, 0], [0, 0, 1.0]], LAST_COLUMN)],
            what="the rewards at padding")


@_case(ex, "the reward is detached", REWARD_GRAD)
def _(fn, gen):
    out = fn(_t([1.0, 1.0]), _leaf(_KLR_LP), _t(_KLR_REF), _t(_KLR_MASK), 0.1)
    if isinstance(out, Tensor) and out.requires_grad:
        raise _Mismatch()


@_case(ex, "random batch with an empty row", "compare with the hand case: -beta * k1 on valid tokens, the score on "
       "the last valid token, nothing for a row with no valid token")
def _(fn, gen):
    from .kl import kl_in_reward
    from .rewards import token_level_rewards

    mask = _prefix_mask([4, 0, 2], 4)
    scores = torch.rand(3, generator=gen)
    lp, ref = -torch.rand(3, 4, generator=gen) * 3, -torch.rand(3, 4, generator=gen) * 3
    want = kl_in_reward(token_level_rewards(scores, mask), lp, ref, 0.05, "k1") * mask
    _expect(_as_tensor(fn(scores, lp, ref, mask, 0.05), "the rewards") * mask, want)


# ------------------------------------------------------------------------------------------------- exact_kl

ex = _exercise("exact_kl", "03", "exact_kl(logits, ref_logits) -> (B, T) KL(pi || ref) summed over the vocabulary",
               "minirl.kl.exact_token_kl")
REVERSED_KL = ("this is KL(ref || pi), the forward KL; the penalty is KL(pi || ref): weight the log-ratio by the "
               "POLICY's probabilities")
ZERO_PROB = ("a token with zero probability under the policy (logit -inf, e.g. a masked vocabulary) gave "
             "0 * log 0 = NaN: such a token contributes 0")
NOT_NORMALISED = "logits are unnormalised: turn them into log-probabilities (log_softmax) first"


@_case(ex, "two tokens by hand", REVERSED_KL)
def _(fn, gen):
    got = fn(torch.log(_t([[[0.5, 0.5]]])), torch.log(_t([[[0.25, 0.75]]])))
    # KL(pi || ref) = 0.5 ln 2 + 0.5 ln(2/3) = 0.143841; KL(ref || pi) = 0.25 ln 0.5 + 0.75 ln 1.5 = 0.130812
    _expect(got, [[0.5 * math.log(2) + 0.5 * math.log(2 / 3)]],
            [([[0.25 * math.log(0.5) + 0.75 * math.log(1.5)]], REVERSED_KL)])


@_case(ex, "unnormalised logits", NOT_NORMALISED)
def _(fn, gen):
    got = fn(torch.log(_t([[[0.5, 0.5]]])) + 3.0, torch.log(_t([[[0.25, 0.75]]])) - 1.0)
    _expect(got, [[0.5 * math.log(2) + 0.5 * math.log(2 / 3)]])


@_case(ex, "a token the policy never samples (logit -inf)", ZERO_PROB)
def _(fn, gen):
    got = fn(_t([[[0.0, -math.inf, 0.0]]]), _t([[[0.0, 0.0, 0.0]]]))
    # pi = (0.5, 0, 0.5), ref = (1/3, 1/3, 1/3): KL = ln(0.5 / (1/3)) = ln 1.5 = 0.405465
    _expect(got, [[math.log(1.5)]])


@_case(ex, "random (B, T, V) logits against the definition", REVERSED_KL)
def _(fn, gen):
    from .kl import exact_token_kl

    logits, ref = torch.randn(2, 3, 5, generator=gen) * 2, torch.randn(2, 3, 5, generator=gen) * 2
    _expect(fn(logits, ref), exact_token_kl(logits, ref))


# ================================================================================================================
# 04 · DAPO


ex = _exercise("aggregate", "04", "aggregate(per_token, mask, mode, max_tokens=None) -> scalar  (modes token-mean, "
               "seq-mean-token-mean, seq-mean-token-sum-norm)", "minirl.losses.aggregate")
PER_T = "divides each row by the padded length T instead of its number of valid tokens"
DRGRPO_LENGTH = ("Dr. GRPO's normaliser is the constant max_tokens, not each row's own length (that brings the "
                 "length bias back)")
DRGRPO_T = "use max_tokens (the generation budget) when it is given, not the padded width T of this batch"
EMPTY_ROW = ("a row with no valid token (e.g. an overlong completion filtered out) is left out of the mean over "
             "sequences, and must not produce NaN")
EMPTY_BATCH = "a fully masked batch must give 0 (with a gradient of 0), not 0/0 = NaN"
_AGG_X = [[2.0, 2.0, 2.0, 7.0], [10.0, 7.0, 7.0, 7.0]]  # the 7s sit in padding
_AGG_M = [[1, 1, 1, 0], [1, 0, 0, 0]]


@_case(ex, "token-mean by hand", SEQ_MEAN_NOT_TOKEN)
def _(fn, gen):
    # (2 + 2 + 2 + 10) / 4 tokens = 4.0; seq-mean: (2 + 10) / 2 = 6.0; unmasked over 8: 44 / 8 = 5.5
    _expect(fn(_t(_AGG_X), _t(_AGG_M), "token-mean", None), 4.0,
            [(6.0, SEQ_MEAN_NOT_TOKEN), (5.5, "padding was counted: sum and count only the valid tokens")])


@_case(ex, "seq-mean-token-mean by hand", TOKEN_MEAN_NOT_SEQ)
def _(fn, gen):
    # (6/3 + 10/1) / 2 = 6.0; token-mean 4.0; per-row over T = 4: (6/4 + 10/4) / 2 = 2.0
    _expect(fn(_t(_AGG_X), _t(_AGG_M), "seq-mean-token-mean", None), 6.0, [(4.0, TOKEN_MEAN_NOT_SEQ), (2.0, PER_T)])


@_case(ex, "seq-mean-token-sum-norm (Dr. GRPO) by hand, max_tokens 8", DRGRPO_LENGTH)
def _(fn, gen):
    # (6/8 + 10/8) / 2 = 1.0; by each row's length: 6.0; by T = 4: 2.0
    _expect(fn(_t(_AGG_X), _t(_AGG_M), "seq-mean-token-sum-norm", 8), 1.0, [(6.0, DRGRPO_LENGTH), (2.0, DRGRPO_T)])


@_case(ex, "gradient of seq-mean-token-mean", TOKEN_MEAN_NOT_SEQ)
def _(fn, gen):
    x = _leaf(_AGG_X)
    # each valid token of row i gets 1 / n_i / B: 1/6 (row 0) and 1/2 (row 1); token-mean: 1/4 everywhere
    _expect(_grad(fn(x, _t(_AGG_M), "seq-mean-token-mean", None), x), [[1 / 6] * 3 + [0], [0.5, 0, 0, 0]],
            [([[0.25] * 3 + [0], [0.25, 0, 0, 0]], TOKEN_MEAN_NOT_SEQ)], what="the gradient")


@_case(ex, "a row with no valid token", EMPTY_ROW)
def _(fn, gen):
    x, m = _t([[2.0, 2.0, 2.0, 0.0], [5.0, 5.0, 5.0, 5.0]]), _t([[1, 1, 1, 0], [0, 0, 0, 0]])
    # only row 0 counts: 6/3 = 2.0 and (6/4) / 1 = 1.5; counting the empty row: 1.0 and 0.75
    _expect(fn(x, m, "seq-mean-token-mean", None), 2.0, [(1.0, EMPTY_ROW)], what="seq-mean-token-mean")
    _expect(fn(x, m, "seq-mean-token-sum-norm", 4), 1.5, [(0.75, EMPTY_ROW)], what="seq-mean-token-sum-norm")


@_case(ex, "a fully masked batch", EMPTY_BATCH)
def _(fn, gen):
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        x = _leaf([[1.0, 2.0], [3.0, 4.0]])
        out = fn(x, _t([[0, 0], [0, 0]]), mode, 2)
        _expect(out, 0.0, what=mode)
        if isinstance(out, Tensor) and out.requires_grad:
            _expect(_grad(out, x), [[0.0, 0.0], [0.0, 0.0]], what=f"the gradient of {mode}")


@_case(ex, "random batches against the definition", "compare with the hand cases: which tokens are summed, and "
       "what each mode divides by")
def _(fn, gen):
    from .losses import aggregate

    x, m = torch.randn(5, 6, generator=gen), _prefix_mask([6, 1, 0, 4, 2], 6)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        _expect(fn(x, m, mode, 10), aggregate(x, m, mode, 10), what=mode)


# --------------------------------------------------------------------------------------------- overlong_penalty

ex = _exercise("overlong_penalty", "04", "overlong_penalty(lengths, max_len, cache_len) -> (B,) in [-1, 0]",
               "minirl.rewards.overlong_penalty")
RAMP_OFF = ("the ramp is off by one: the penalty is 0 up to AND INCLUDING max_len - cache_len and reaches -1 "
            "exactly at max_len")
PENALTY_SIGN = "it is a penalty in [-1, 0]: the sign is flipped"
BEYOND = "beyond max_len the penalty stays at -1 (clamp it)"


@_case(ex, "max_len 20, cache_len 4, by hand", RAMP_OFF)
def _(fn, gen):
    got = fn(torch.tensor([15, 16, 17, 18, 19, 20, 21]), 20, 4)
    # (16 - L) / 4 clamped to [-1, 0]: 0, 0, -0.25, -0.5, -0.75, -1, -1
    _expect(got, [0, 0, -0.25, -0.5, -0.75, -1, -1],
            [([0, 0, 0, -0.25, -0.5, -0.75, -1], RAMP_OFF), ([0, -0.25, -0.5, -0.75, -1, -1, -1], RAMP_OFF),
             ([0, 0, 0.25, 0.5, 0.75, 1, 1], PENALTY_SIGN), ([0, 0, -0.25, -0.5, -0.75, -1, -1.25], BEYOND)])


@_case(ex, "cache_len = max_len", "the ramp may start at length 0: (max_len - cache_len - L) / cache_len")
def _(fn, gen):
    _expect(fn(torch.tensor([0, 5, 10]), 10, 10), [0, -0.5, -1])


@_case(ex, "float lengths and a wide cache", RAMP_OFF)
def _(fn, gen):
    got = fn(torch.tensor([100.0, 101.0, 150.0, 199.0]), 200, 100)
    # (100 - L) / 100: 0, -0.01, -0.5, -0.99
    _expect(got, [0, -0.01, -0.5, -0.99], [([0, 0, -0.49, -0.98], RAMP_OFF)])


# ------------------------------------------------------------------------------------------------- has_signal

ex = _exercise("has_signal", "04", "has_signal(rewards, group_size) -> (num_groups,) bool",
               "minirl.sampling.has_signal")
ANY_CORRECT = ("a group that is ALL correct carries no signal either: keep the groups whose rewards are not all "
               "equal (DAPO eq. 11: 0 < #correct < G)")


@_case(ex, "three groups of two, by hand", ANY_CORRECT)
def _(fn, gen):
    got = fn(_t([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), 2)
    # any correct: (1, 0, 1); groups read with a stride (columns of a (G, B/G) view): (1, 1, 1)
    _expect(got, [1, 0, 0], [([1, 0, 1], ANY_CORRECT), ([1, 1, 1], LAYOUT)])


@_case(ex, "groups laid out group by group", LAYOUT)
def _(fn, gen):
    got = fn(_t([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), 2)  # groups (1, 1), (0, 0), (1, 0)
    _expect(got, [0, 0, 1], [([1, 0, 1], ANY_CORRECT)])


@_case(ex, "non-binary rewards", "compare the rewards within each group: any two that differ make a signal")
def _(fn, gen):
    _expect(fn(_t([0.5, 0.5, 0.5, 0.2, 0.7, 0.2]), 3), [0, 1], [([1, 1], ANY_CORRECT)])


# ================================================================================================================
# 05 · GSPO on a tiny MoE


ex = _exercise("sequence_ratio", "05", "sequence_ratio(logprobs, old_logprobs, mask) -> (B,) GSPO's s_i",
               "minirl.losses.policy_loss(level='sequence') (its ratio)")
PRODUCT = ("this is the product of the token ratios (sum of log-ratios): GSPO's ratio is their geometric mean, "
           "normalised by the length |y_i|")
ARITH = "arithmetic mean of the token ratios; GSPO's s_i is the geometric mean: exp of the mean log-ratio"
_SR_LP = [[-0.7, -1.1, -0.9], [-0.4, -5.0, -5.0]]  # minus old: (0.3, -0.1, 0.1) and (0.6, pad, pad)
_SR_OLD = [[-1.0, -1.0, -1.0], [-1.0, 0.0, 0.0]]
_SR_M = [[1, 1, 1], [1, 0, 0]]


@_case(ex, "two sequences by hand, garbage in padding", PRODUCT)
def _(fn, gen):
    got = fn(_t(_SR_LP), _t(_SR_OLD), _t(_SR_M))
    # mean log-ratios 0.1 and 0.6: s = (e^0.1, e^0.6) = (1.105171, 1.822119)
    # product: (e^0.3, e^0.6); over T = 3: (e^0.1, e^0.2); arithmetic: ((e^0.3 + e^-0.1 + e^0.1) / 3, e^0.6)
    e = math.exp
    _expect(got, [e(0.1), e(0.6)], [([e(0.3), e(0.6)], PRODUCT), ([e(0.1), e(0.2)], MEAN_T),
                                     ([(e(0.3) + e(-0.1) + e(0.1)) / 3, e(0.6)], ARITH)])


@_case(ex, "gradient by hand", PRODUCT)
def _(fn, gen):
    lp = _leaf(_SR_LP)
    g = _grad(fn(lp, _t(_SR_OLD), _t(_SR_M)), lp)
    # d s_i / d lp_t = s_i / |y_i| on valid tokens: e^0.1 / 3 = 0.368390 and e^0.6 = 1.822119
    s0, s1 = math.exp(0.1), math.exp(0.6)
    _expect(g, [[s0 / 3] * 3, [s1, 0, 0]], [([[math.exp(0.3)] * 3, [s1, 0, 0]], PRODUCT)], what="the gradient")


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf(_SR_LP)
    g = _grad(fn(lp, lp, _t(_SR_M)), lp, no_grad_hint=OLD_DETACHED)
    _expect(g, [[1 / 3] * 3, [1, 0, 0]], [([[0.0] * 3, [0, 0, 0]], OLD_DETACHED)], what="the gradient")


@_case(ex, "an empty row", "a row with no valid token has no log-ratio: its ratio is exp(0) = 1, not NaN")
def _(fn, gen):
    _expect(fn(_t([[-1.0, -2.0]]), _t([[-1.5, -1.0]]), _t([[0, 0]])), [1.0])


# ---------------------------------------------------------------------------------------------------- gspo_loss

ex = _exercise("gspo_loss", "05",
               "gspo_loss(logprobs, old_logprobs, advantages, mask, eps_low=3e-4, eps_high=4e-4) -> loss",
               "minirl.losses.policy_loss(level='sequence', agg='seq-mean-token-mean')")
BROADCAST = ("GSPO's sequence term was broadcast over the tokens and token-averaged: longer sequences then weigh "
             "more; GSPO has ONE clipped term per sequence, averaged over sequences")
TOKEN_RATIOS = ("these are token-level ratios (PPO / GRPO); GSPO clips one ratio per sequence, the geometric mean "
                "of its token ratios")


def _gspo(fn, lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4):
    return _loss(fn(lp, old, adv, mask, eps_low, eps_high))


@_case(ex, "token ratios clipped, the sequence ratio inside", TOKEN_RATIOS)
def _(fn, gen):
    d = torch.float64
    lp = _leaf([[-0.99, -1.01]], d)
    loss = _gspo(fn, lp, _t([[-1.0, -1.0]], d), _t([1.0], d), _t([[1, 1]], d))
    # log-ratios (+0.01, -0.01): s = e^0 = 1, inside: loss -1, gradient -s / 2 = -0.5 per token
    # token level: e^0.01 clipped to 1.0004 (gradient 0), e^-0.01 = 0.990050 unclipped -> mean -0.995225
    _expect(loss, -1.0, [(-(1.0004 + math.exp(-0.01)) / 2, TOKEN_RATIOS)], what="the loss", atol=1e-9, rtol=1e-9)
    _expect(_grad(loss, lp), [[-0.5, -0.5]], what="the gradient", atol=1e-9, rtol=1e-9)


@_case(ex, "the paper's scale, by hand (float64)", BROADCAST)
def _(fn, gen):
    d = torch.float64
    lp = _t([[3e-4, -1e-4, 1e-4], [6e-4, 0.0, 0.0]], d) - 1.0
    loss = _gspo(fn, lp, _t([[-1.0] * 3, [-1.0, 0.0, 0.0]], d), _t([1.0, -1.0], d), _t(_SR_M, d))
    # s = (e^1e-4, e^6e-4) = (1.00010001, 1.00060018); seq 0 inside [0.9997, 1.0004]: -1.00010001;
    # seq 1 above it but A < 0 keeps the unclipped branch: +1.00060018; mean (-1.00010001 + 1.00060018) / 2
    s0, s1 = math.exp(1e-4), math.exp(6e-4)
    # broadcast over tokens, token-mean: (-3 * 1.00010001 + 1.00060018) / 4
    _expect(loss, (s1 - s0) / 2, [((-3 * s0 + s1) / 4, BROADCAST)], what="the loss", atol=1e-9, rtol=1e-9)


@_case(ex, "the sequence ratio clipped", "beyond 1 + eps_high with A > 0 the sequence's term is clipped: value "
       "-(1 + eps_high) * A and gradient 0")
def _(fn, gen):
    d = torch.float64
    lp = _leaf([[-0.99, -0.99]], d)
    loss = _gspo(fn, lp, _t([[-1.0, -1.0]], d), _t([1.0], d), _t([[1, 1]], d))
    # s = e^0.01 = 1.010050 > 1.0004: loss -1.0004, gradient 0
    _expect(loss, -1.0004, [(-math.exp(0.01), OPTIMISTIC)], what="the loss", atol=1e-9, rtol=1e-9)
    _expect(_grad(loss, lp), [[0.0, 0.0]], what="the gradient", atol=1e-9)


@_case(ex, "old_logprobs is the same tensor as logprobs", OLD_DETACHED)
def _(fn, gen):
    lp = _leaf([[-1.0, -2.0, -0.5], [-1.0, -3.0, -3.0]])
    loss = _gspo(fn, lp, lp, _t([1.0, 1.0]), _t(_SR_M))
    # s = 1, loss -1; d loss / d lp_t = -A * s / |y_i| / B: -1/6 (row 0), -1/2 (row 1)
    _expect(_grad(loss, lp, no_grad_hint=OLD_DETACHED), [[-1 / 6] * 3, [-0.5, 0, 0]],
            [([[0.0] * 3, [0, 0, 0]], OLD_DETACHED)], what="the gradient")


@_case(ex, "random batch with padding against the definition", BROADCAST)
def _(fn, gen):
    from .losses import policy_loss

    mask = _prefix_mask([5, 1, 3, 4], 5)
    lp = (-torch.rand(4, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    old = lp.detach() + 4e-4 * torch.randn(4, 5, generator=gen, dtype=torch.float64)
    adv = torch.randn(4, generator=gen, dtype=torch.float64)
    want = policy_loss(lp, old, adv, mask.double(), 3e-4, 4e-4, level="sequence", agg="seq-mean-token-mean")[0]
    loss = _gspo(fn, lp, old, adv, mask.double())
    _expect(loss, want.detach(), what="the loss", atol=1e-9, rtol=1e-7)
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient", atol=1e-9, rtol=1e-7)


# ---------------------------------------------------------------------------------------------- gspo_token_ratio

ex = _exercise("gspo_token_ratio", "05", "gspo_token_ratio(logprobs, old_logprobs, mask) -> (B, T) GSPO-token's s_it",
               "minirl.losses.policy_loss(level='sequence-token') (its ratio)")
NO_SG = ("without the stop-gradient each token's gradient is spread over its whole sequence (that is GSPO's "
         "gradient): GSPO-token routes each token's gradient through its OWN log-prob, sg[s_i] * pi / sg[pi]")
FULLY_DETACHED = ("the ratio carries no gradient: the factor pi(y_t) / sg[pi(y_t)] has the value 1 but passes each "
                  "token's gradient")


@_case(ex, "values by hand: s_i on every valid token", PRODUCT)
def _(fn, gen):
    got = _as_tensor(fn(_t(_SR_LP), _t(_SR_OLD), _t(_SR_M)), "the ratio") * _t(_SR_M)
    e = math.exp
    _expect(got, [[e(0.1)] * 3, [e(0.6), 0, 0]], [([[e(0.3)] * 3, [e(0.6), 0, 0]], PRODUCT)],
            what="the ratio on the valid tokens")


@_case(ex, "gradient: each token through its own log-prob", NO_SG)
def _(fn, gen):
    lp = _leaf(_SR_LP)
    w = _t([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # weight only the first token of each row
    g = _grad(fn(lp, _t(_SR_OLD), _t(_SR_M)), lp, weights=w, no_grad_hint=FULLY_DETACHED)
    # d s_i0 / d lp_t = s_i if t = 0 else 0; without the stop-gradient: s_i / |y_i| on every valid token
    s0, s1 = math.exp(0.1), math.exp(0.6)
    _expect(g, [[s0, 0, 0], [s1, 0, 0]],
            [([[s0 / 3] * 3, [s1, 0, 0]], NO_SG), ([[0.0] * 3, [0, 0, 0]], FULLY_DETACHED)], what="the gradient")


@_case(ex, "random batch against the definition", NO_SG)
def _(fn, gen):
    from .losses import policy_loss

    mask = _prefix_mask([4, 2, 3], 4)
    lp = (-torch.rand(3, 4, generator=gen) * 2).requires_grad_(True)
    old = lp.detach() + 0.1 * torch.randn(3, 4, generator=gen)
    adv = torch.randn(3, 4, generator=gen)
    # GSPO-token's loss with a clip range wide enough never to bind is -mean_seq(mean_t A_it * s_it)
    want = policy_loss(lp, old, adv, mask, 0.99, 100.0, level="sequence-token", agg="seq-mean-token-mean")[0]
    ratio = fn(lp, old, mask)
    if not isinstance(ratio, Tensor):
        raise _Mismatch(f"the ratio should be a torch.Tensor, got {type(ratio).__name__}")
    loss = -((adv * ratio * mask) / mask.sum(-1, keepdim=True)).sum() / 3  # the same loss from your ratio
    _expect(loss, want.detach(), what="the loss it gives")
    _expect(_grad(loss, lp), torch.autograd.grad(want, lp)[0], what="the gradient")


# ================================================================================================================
# 06 · preference optimisation


ex = _exercise("dpo_loss", "06",
               "dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=0.1) -> loss",
               "minirl.preference.dpo_loss")
BETA_OUTSIDE = ("beta multiplies the margin INSIDE the log-sigmoid (the implicit reward is beta * log(pi / ref)), "
                "not the loss")
NO_REF = "the reference model is missing: DPO's margin is between log-RATIOS log pi - log ref"
REF_ADDED = "the reference log-probs were added: each log-ratio is log pi MINUS log ref"
BATCH_SUM = "the loss is the MEAN over the pairs of the batch, not the sum"
NAIVE_LOGSIG = ("log(sigmoid(x)) underflows to log(0) = -inf for a large negative margin: use a numerically stable "
                "log-sigmoid")
REF_GRAD = "the gradient reached the reference log-probs: the reference model is frozen, detach its log-probs"


def _softplus(x: float) -> float:
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


@_case(ex, "one pair by hand, beta 0.5", BETA_OUTSIDE)
def _(fn, gen):
    loss = _loss(fn(_t([-10.0]), _t([-12.0]), _t([-12.0]), _t([-11.0]), 0.5))
    # h = (-10 + 12) - (-12 + 11) = 3; -log sigmoid(1.5) = softplus(-1.5) = 0.201413
    # beta outside: 0.5 * softplus(-3) = 0.024294; no reference: softplus(-0.5 * 2) = 0.313262;
    # reference added: h = (-10 - 12) - (-12 - 11) = 1 -> softplus(-0.5) = 0.474077
    _expect(loss, _softplus(-1.5), [(0.5 * _softplus(-3.0), BETA_OUTSIDE), (_softplus(-1.0), NO_REF),
                                    (_softplus(-0.5), REF_ADDED)], what="the loss")


@_case(ex, "policy equals reference", BATCH_SUM)
def _(fn, gen):
    lp = _t([-5.0, -7.0, -9.0])
    # h = 0 for every pair: -log sigmoid(0) = ln 2 = 0.693147 per pair; the sum over 3 pairs: 2.079442
    _expect(_loss(fn(lp, lp - 1, lp.clone(), lp - 1, 0.1)), math.log(2), [(3 * math.log(2), BATCH_SUM)],
            what="the loss")


@_case(ex, "gradients by hand; the reference gets none", REF_GRAD)
def _(fn, gen):
    c, r, rc, rr = _leaf([-10.0]), _leaf([-12.0]), _leaf([-12.0]), _leaf([-11.0])
    loss = _loss(fn(c, r, rc, rr, 0.5))
    gc, gr, grc, grr = _grad(loss, (c, r, rc, rr))
    # d/dc = -beta * (1 - sigmoid(1.5)) = -0.5 * 0.182426 = -0.091213; d/dr = +0.091213
    g = 0.5 / (1 + math.exp(1.5))
    _expect(gc, [-g], what="the gradient in chosen_logps")
    _expect(gr, [g], what="the gradient in rejected_logps")
    _expect(torch.cat([grc, grr]), [0.0, 0.0], what="the gradient in the reference log-probs")


@_case(ex, "an extreme margin (beta * h = -200)", NAIVE_LOGSIG)
def _(fn, gen):
    loss = _loss(fn(_t([-1000.0]), _t([-10.0]), _t([-10.0]), _t([-10.0]), 0.2))
    # h = (-1000 + 10) - (-10 + 10) = -990, beta * h = -198: -log sigmoid(-198) = 198.0 (to float precision)
    _expect(loss, 198.0, what="the loss", rtol=1e-5)


# ------------------------------------------------------------------------------------------------------ ipo_loss

ex = _exercise("ipo_loss", "06",
               "ipo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, tau=0.1) -> loss",
               "minirl.preference.ipo_loss")
IPO_TARGET = "IPO's target margin is 1 / (2 tau), not 1 / tau"
IPO_SCALED = "IPO regresses the raw log-ratio margin h: no beta or tau multiplies h inside the square"


@_case(ex, "policy equals reference, tau 0.1", IPO_TARGET)
def _(fn, gen):
    lp = _t([-5.0, -7.0])
    # h = 0: (0 - 1 / (2 * 0.1))^2 = 25 per pair; target 1 / tau: 100
    _expect(_loss(fn(lp, lp.clone(), lp.clone(), lp.clone(), 0.1)), 25.0, [(100.0, IPO_TARGET)], what="the loss")


@_case(ex, "two pairs by hand, tau = 1/6", IPO_TARGET)
def _(fn, gen):
    loss = _loss(fn(_t([-10.0, -5.0]), _t([-12.0, -6.0]), _t([-12.0, -5.0]), _t([-11.0, -6.0]), 1 / 6))
    # h = (-10 + 12) - (-12 + 11) = 3 and (-5 + 5) - (-6 + 6) = 0; target 1 / (2 tau) = 3
    # loss ((3 - 3)^2 + (0 - 3)^2) / 2 = 4.5; target 1/tau = 6: (9 + 36) / 2 = 22.5
    # no reference: h = 2 and 1 -> (1 + 4) / 2 = 2.5; tau * h: ((0.5 - 3)^2 + 9) / 2 = 7.625; sum: 9
    _expect(loss, 4.5, [(22.5, IPO_TARGET), (2.5, NO_REF), (7.625, IPO_SCALED), (9.0, BATCH_SUM)], what="the loss")


@_case(ex, "gradients by hand; the reference gets none", REF_GRAD)
def _(fn, gen):
    c, r, rc, rr = _leaf([-10.0, -5.0]), _leaf([-12.0, -6.0]), _leaf([-12.0, -5.0]), _leaf([-11.0, -6.0])
    gc, gr, grc, grr = _grad(_loss(fn(c, r, rc, rr, 1 / 6)), (c, r, rc, rr))
    # d/dc_i = 2 (h_i - 3) / 2 = (0, -3); d/dr_i = (0, 3)
    _expect(gc, [0.0, -3.0], what="the gradient in chosen_logps")
    _expect(gr, [0.0, 3.0], what="the gradient in rejected_logps")
    _expect(torch.cat([grc, grr]), [0.0] * 4, what="the gradient in the reference log-probs")


# ------------------------------------------------------------------------------------------ simpo_loss (tokens)

ex = _exercise("simpo_loss_from_tokens", "06",
               "simpo_loss_from_tokens(chosen_logprobs, chosen_mask, rejected_logprobs, rejected_mask, beta=2.0, "
               "gamma=1.0) -> loss", "minirl.rollout.sequence_logprobs(..., 'mean') + minirl.preference.simpo_loss")
SIMPO_SUM = ("SimPO with sum instead of mean: its reward is the AVERAGE token log-prob (length-normalised); a sum "
             "favours short completions")
SIMPO_GAMMA = ("gamma is SimPO's absolute margin (paper eq. 6): beta * (c - r) - gamma; subtracting gamma inside "
               "the beta makes it gamma * beta (TRL's gamma_beta_ratio is gamma / beta)")
SIMPO_GAMMA_SIGN = "the margin gamma is SUBTRACTED: the reward gap has to exceed it"
_SC, _SCM = [[-1.0, -1.0, -1.0, -1.0]], [[1, 1, 1, 1]]
_SR, _SRM = [[-2.0, -2.0, -2.0, -7.0]], [[1, 1, 1, 0]]  # -7 sits in padding


@_case(ex, "one pair by hand, beta 2, gamma 0.5", SIMPO_SUM)
def _(fn, gen):
    loss = _loss(fn(_t(_SC), _t(_SCM), _t(_SR), _t(_SRM), 2.0, 0.5))
    # means -1 and -2: 2 * (-1 + 2) - 0.5 = 1.5 -> softplus(-1.5) = 0.201413
    # sums -4 and -6: 2 * 2 - 0.5 = 3.5 -> 0.029750; over T = 4: -1 and -1.5: 2 * 0.5 - 0.5 = 0.5 -> 0.474077
    # 2 * (1 - 0.5) = 1 -> 0.313262; gamma added: 2.5 -> 0.078889; padding counted: -13/4: 2 * 2.25 - 0.5 = 4
    _expect(loss, _softplus(-1.5), [(_softplus(-3.5), SIMPO_SUM), (_softplus(-0.5), MEAN_T),
                                    (_softplus(-1.0), SIMPO_GAMMA), (_softplus(-2.5), SIMPO_GAMMA_SIGN),
                                    (_softplus(-4.0), UNMASKED)], what="the loss")


@_case(ex, "gradients by hand", SIMPO_SUM)
def _(fn, gen):
    c, r = _leaf(_SC), _leaf(_SR)
    gc, gr = _grad(_loss(fn(c, _t(_SCM), r, _t(_SRM), 2.0, 0.5)), (c, r))
    # d/d chosen token = -beta * (1 - sigmoid(1.5)) / 4 = -0.091213; rejected: +2 * 0.182426 / 3 = 0.121617
    q = 1 / (1 + math.exp(1.5))
    _expect(gc, [[-2 * q / 4] * 4], what="the gradient in chosen_logprobs")
    _expect(gr, [[2 * q / 3] * 3 + [0.0]], what="the gradient in rejected_logprobs")


@_case(ex, "an extreme margin", NAIVE_LOGSIG)
def _(fn, gen):
    loss = _loss(fn(_t([[-100.0]]), _t([[1]]), _t([[-1.0]]), _t([[1]]), 2.0, 1.0))
    # 2 * (-100 + 1) - 1 = -199: -log sigmoid(-199) = 199.0
    _expect(loss, 199.0, what="the loss", rtol=1e-5)
