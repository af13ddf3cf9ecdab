"""The machinery of the course kit's checker (``minirl.exercises``): ``check("gae", my_gae)`` grades a
student's function on hidden cases.

Each exercise of ``notebooks/exercises/`` asks for one function that minirl implements. The checker runs it on
cases worked out by hand (values and gradients), on edge cases the field got wrong (groups of equal rewards,
padding that holds garbage, empty rows, a fully masked batch, extreme log-ratios), and on seeded random inputs
compared with the checker's own reference copy (``_reference``; the seed makes a hidden rerun a new input). While
the submission runs, every function of a module that holds an exercise's answer refuses to run (``answer_modules``:
the answer key ``_reference`` and the minirl modules the exercises reimplement), so a submission that calls one is
not graded. In the student package ``_reference`` is a stand-in that raises ``_NoReference``: the cases that need
it are deferred to grading, the others run. The first case that fails raises ``AssertionError`` naming the case
and the most likely mistake, recognised from the wrong value it produces ("this is the per-token mean over the
whole batch: DAPO's mode, not GRPO's"); the message never shows how to write the function. Every named mistake
has a wrong implementation in ``tests/test_exercises.py`` that the checker is shown to reject with that hint.

Usage in a notebook::

    from minirl import exercises
    exercises.check("gae", gae)          # prints "gae: all 5 cases passed", or raises AssertionError
    exercises.EXERCISES["gae"].case_names()   # what is checked (not how)

Cases are deterministic (fixed inputs, seeded generators, tolerances of about 1e-5), so a check gives the same
verdict on every machine and thread count.
"""

from __future__ import annotations

import builtins
import importlib
import math
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

# ----------------------------------------------------------------------------------------------------------------
# the machinery: exercises, cases, comparisons


class _Mismatch(Exception):
    """Raised inside a case when the student's output is wrong. ``hint``: the known mistake the wrong value matches;
    None: not recognised (the message then says so, and shows the case's own hint as what the case is for)."""

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
    blocked: tuple[str, ...] = ()  # minirl functions (dotted names) a submission may not call while it is graded
    cases: list[tuple[str, str, Callable]] = field(default_factory=list)

    def case_names(self) -> list[str]:
        """The names of the cases, in the order they run."""
        return [name for name, _, _ in self.cases]


#: Every exercise by name, in syllabus order.
EXERCISES: dict[str, Exercise] = {}


def _exercise(name: str, chapter: str, signature: str, source: str, blocked: tuple[str, ...] = ()) -> Exercise:
    ex = Exercise(name, chapter, signature, source, blocked)
    EXERCISES[name] = ex
    return ex


def _case(ex: Exercise, name: str, hint: str):
    """Register the decorated function as the next case of ``ex``; ``hint`` is shown when no mistake is recognised."""

    def register(run: Callable) -> Callable:
        ex.cases.append((name, hint, run))
        return run

    return register


def list_exercises(chapter: str | None = None) -> list[str]:
    """Names of the exercises, in syllabus order, optionally only those of one chapter ("00" ... "15").

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
        The number of cases: all passed (in the student package, where the answer key is absent, the cases that
        compare with it are deferred to grading and counted, so a check cell's ``== N`` holds there too).

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
    _refuse_if_tampered(name, "before the check")
    guarded = _guarded(fn)
    deferred = 0
    for i, (case_name, hint, run) in enumerate(ex.cases, start=1):
        deferred += _run_case(ex, guarded, i, case_name, hint, run, seed)
    if not quiet:
        print(f"{name}: all {len(ex.cases)} cases passed" if not deferred else
              f"{name}: all {len(ex.cases) - deferred} cases that run here passed; {deferred} more (compared with the "
              "reference implementation, which is not in the student package) run when your work is graded")
    return len(ex.cases)


class _CallsMinirl(Exception):
    """Raised by a function of a module that holds an exercise's answer, called by the submission being graded."""


class _NoReference(Exception):
    """Raised by the student package's stand-in for ``_reference`` (the answer key is the teacher's): the case that
    needs it is deferred to grading."""


#: Besides the minirl modules named in the exercises' ``blocked`` lists, the checker's own answer key.
ANSWER_KEY = "minirl.exercises._reference"


def answer_modules() -> list[str]:
    """The modules that hold an exercise's answer: the checker's answer key (``_reference``) and every minirl module
    with a function some exercise reimplements (``Exercise.blocked``). While a submission runs inside ``check``,
    every function defined in them refuses to run."""
    return sorted({dotted.rsplit(".", 1)[0] for ex in EXERCISES.values() for dotted in ex.blocked} | {ANSWER_KEY})


_REFUSED: dict = {}  # function -> (its own code, the code that refuses), built once


def _refusable() -> dict:
    """{function: (code, refusing code)} for every function defined in an answer module (decorators unwrapped;
    a function with a closure cannot have its code swapped and is skipped: none of minirl's math has one)."""
    if _REFUSED:
        return _REFUSED
    import inspect

    for module_name in answer_modules():
        module = importlib.import_module(module_name)
        for attr, obj in vars(module).items():
            f = inspect.unwrap(obj) if callable(obj) else None
            if not inspect.isfunction(f) or f.__module__ != module_name or f.__code__.co_freevars:
                continue
            scope: dict = {}
            exec(f"def _refused(*args, **kwargs):\n    raise __import__('minirl.exercises._core', fromlist=['_'])"
                 f"._CallsMinirl({module_name + '.' + attr!r})\n", scope)
            _REFUSED[f] = (f.__code__, scope["_refused"].__code__)
    return _REFUSED


def _guarded(fn: Callable) -> Callable:
    """``fn``, made to run with every function of the answer modules refusing (their code swapped, so any reference
    to one, ``from minirl.exercises._reference import gae`` or ``from minirl.losses import policy_loss`` made before
    the check, is caught) and restored after each call. The checker's own references run between the calls."""
    refusable = _refusable()

    files = _answer_files()

    def guarded(*args, **kwargs):
        seen: list = []

        def watch(frame, event, arg):  # every Python call while the submission runs
            if event == "call" and not seen and frame.f_code.co_filename in files:
                seen.append(f"{files[frame.f_code.co_filename]}.{frame.f_code.co_name}")

        for f, (_, refusing) in refusable.items():
            f.__code__ = refusing
        previous = sys.getprofile()
        sys.setprofile(watch)
        try:
            out = fn(*args, **kwargs)
        except Exception:
            if seen:  # the answer code ran (and then failed): the refusal, not its error, is the verdict
                raise _CallsMinirl(seen[0]) from None
            raise
        finally:
            sys.setprofile(previous)
            for f, (code, _) in refusable.items():
                f.__code__ = code
        if seen:  # answer code run under another name: a copied __code__, a second copy of a module loaded by path
            raise _CallsMinirl(seen[0])
        _refuse_if_tampered(None, "while the submission ran")  # a patch made from inside the function
        return out

    return guarded


# ----------------------------------------------------------------------------------------------------------------
# tamper evidence (issue 53): what a verdict depends on, fingerprinted when the checker is imported

_SNAPSHOT: dict[str, dict] = {}  # namespace name -> {attribute: fingerprint}


class _Tampered(AssertionError):
    """The checker, an answer module or the parts of torch and Python the comparisons use were changed."""


def _fingerprint(value) -> tuple:
    # a function's code and defaults can be swapped without rebinding its name
    if isinstance(value, types.FunctionType):
        return id(value), id(value.__code__), id(value.__defaults__), id(value.__kwdefaults__)
    return (id(value),)


def watch(name: str, namespace) -> None:
    """Fingerprint ``namespace`` (a module's or a class's ``vars``) under ``name``: ``check`` later refuses to grade
    if any attribute it held then is rebound, deleted or has its code swapped. Dunder names are left out (Python
    itself updates some, e.g. ``__warningregistry__``), and attributes added later are not compared."""
    _SNAPSHOT[name] = {k: _fingerprint(v) for k, v in list(namespace.items()) if not k.startswith("__")}


def watch_all() -> None:
    """Fingerprint the checker's modules, the answer modules and the parts of torch and Python that the comparisons
    use; ``minirl.exercises`` calls it once it has imported every chapter, before any student code can run."""
    for module_name in answer_modules():
        importlib.import_module(module_name)
    names = [n for n in list(sys.modules) if n.startswith("minirl.exercises") or n in answer_modules()]
    for n in sorted(names) + ["minirl.checks"]:
        watch(n, vars(importlib.import_module(n)))
    for n, space in _torch_and_python().items():
        watch(n, space)
    _SNAPSHOT["EXERCISES"] = _exercise_fingerprints()


def _torch_and_python() -> dict:
    """The namespaces of torch and Python that a comparison uses, as they are now. Of the builtins, Python's own
    functions and types only: IPython rebinds get_ipython, display, exit and quit around every cell."""
    return {"torch": vars(torch), "torch.autograd": vars(torch.autograd),
            "torch.nn.functional": vars(torch.nn.functional), "torch.Tensor": vars(torch.Tensor),
            "torch._C.TensorBase": vars(torch._C.TensorBase), "math": vars(math),
            "builtins": {k: v for k, v in vars(builtins).items()
                         if not k.startswith("_") and isinstance(v, types.BuiltinFunctionType | type)},
            "sys": {"setprofile": sys.setprofile, "getprofile": sys.getprofile, "modules": sys.modules}}


def _exercise_fingerprints() -> dict:
    return {n: (id(ex), id(ex.cases), tuple(_fingerprint(run) for _, _, run in ex.cases))
            for n, ex in EXERCISES.items()}


def tamper_report() -> str | None:
    """The first watched attribute that differs from its fingerprint ("torch.allclose was replaced"), or None."""
    live = {**_torch_and_python(), "EXERCISES": _exercise_fingerprints()}
    for name, prints in _SNAPSHOT.items():
        if name == "EXERCISES":
            now = live[name]
            changed = [k for k, v in prints.items() if now.get(k) != v]
            if changed:
                return f"the cases of exercise {changed[0]!r} were changed"
            continue
        space = live.get(name)
        if space is None:
            space = vars(sys.modules[name]) if name in sys.modules else {}
        for k, v in prints.items():
            if k not in space:
                return f"{name}.{k} was deleted"
            if _fingerprint(space[k]) != v:
                return f"{name}.{k} was replaced"
    return None


def _refuse_if_tampered(name: str | None, when: str) -> None:
    report = tamper_report() if _SNAPSHOT else None
    if report:
        raise _Tampered(f"{name + ': ' if name else ''}{report} {when}: the checker, minirl's answer modules and "
                        "the parts of torch and Python a comparison uses must be left as they are; not graded")


def _answer_files() -> dict[str, str]:
    """{source file: module} of the answer modules, as code objects name their file (the path Python loaded it by)."""
    files = {}
    for module_name in answer_modules():
        path = importlib.import_module(module_name).__file__
        for variant in (path, os.path.realpath(path), os.path.abspath(path)):
            files[variant] = module_name
    return files


def _refusal_message(ex: Exercise, dotted: str) -> str:
    module = dotted.rsplit(".", 1)[0]
    if dotted in ex.blocked:
        what = "the minirl function this exercise asks you to write"
    elif module == ANSWER_KEY:
        what = "a function of the checker's answer key (the teacher's reference implementations)"
    else:
        holders = [e.name for e in EXERCISES.values() if any(b.startswith(module + ".") for b in e.blocked)]
        what = f"a function of {module}, a module that holds the answer of exercise(s) {', '.join(holders)}"
    return f"{ex.name}: the submission calls {dotted}, {what}; it is not graded. Write it with torch only."


def _run_case(ex: Exercise, fn: Callable, i: int, case_name: str, hint: str, run: Callable, seed: int) -> int:
    """Run one case; return 1 when it was deferred to grading (no answer key here), else 0; raise AssertionError."""
    name = ex.name
    where = f"{name}: case {i}/{len(ex.cases)} '{case_name}' failed"
    try:
        run(fn, torch.Generator().manual_seed(1000 * seed + i))
    except _NoReference as e:
        if _deferred_by_the_stand_in(e):
            return 1
        raise AssertionError(f"{where}: the submission raised the checker's _NoReference itself; only the student "
                             "package's stand-in for the answer key defers a case to grading") from None
    except _CallsMinirl as c:
        raise AssertionError(_refusal_message(ex, c.args[0])) from None
    except _Tampered as t:
        raise _Tampered(f"{name}: {t}") from None
    except _Mismatch as m:
        detail = f"\n  ({m.detail})" if m.detail else ""
        if m.hint:  # the wrong value is one a known mistake gives: name it
            raise AssertionError(f"{where}.\n  Likely mistake: {m.hint}{detail}") from None
        # not recognised: say what is wrong and what the case is for, and guess no cause (issue 53)
        raise AssertionError(f"{where}: wrong on this case{detail}.\n  No known mistake gives this value; the case "
                             f"was written to catch this one (it may not be yours): {hint}") from None
    except NotImplementedError:
        raise AssertionError(f"{name}: not implemented yet (the function raised NotImplementedError)") from None
    except Exception as e:  # the student's code crashed: show its error and the case's hint
        raise AssertionError(f"{where}: the function raised {type(e).__name__}: {e}\n  Hint: {hint}") from e
    return 0


def _deferred_by_the_stand_in(e: _NoReference) -> bool:
    """Whether ``e`` is a genuine deferral: the installed answer key is the student package's stand-in (on a grading
    machine it is the real key, and nothing defers), and the exception was raised by the stand-in's own code, not by
    the submission (issue 53: a body that only raised _NoReference scored full marks)."""
    key = importlib.import_module(ANSWER_KEY)
    if not getattr(key, "STAND_IN", False):
        return False
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.path.realpath(tb.tb_frame.f_code.co_filename) == os.path.realpath(key.__file__)


def _fmt(t: Tensor) -> str:
    """A short rendering of a small tensor for a failure message (rounded; shape only when large)."""
    if t.numel() > 12:
        return f"a tensor of shape {tuple(t.shape)}"
    values = [round(v, 6) + 0.0 for v in t.double().flatten().tolist()]  # + 0.0: -0.0 prints as 0.0
    return str(values).replace("[", "(").replace("]", ")")


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


NEEDS_FINITE = ("a {n}-nat log-ratio overflows exp() to inf (and inf * 0 = NaN at a masked position): mask the "
                "log-ratio before exp, not after, and keep exp finite above about 20 nats by continuing it along its "
                "tangent, e^20 * (1 + x - 20) (minirl's checks.exp_linear_above)")
CLAMPED = ("the log-ratio was clamped before exp: that keeps the value finite but the gradient beyond the clamp is "
           "wrong (0 through the ratio, so the -log r term of k3 alone gives it the wrong sign, and a surrogate "
           "term that should pull the ratio back stops): continue exp along its tangent above about 20 nats, "
           "e^20 * (1 + x - 20), instead of clamping")
OLD_DETACHED = ("old_logprobs was not treated as a constant: when it is the very tensor logprobs (the first "
                "update on-policy) the ratio's gradient vanishes; detach the behaviour policy's log-probs")


def _expect_finite(out, wrt: Tensor, what: str) -> Tensor:
    """Raise ``_Mismatch`` (the case's own hint) unless ``out`` and its gradient with respect to ``wrt`` are finite;
    return the gradient."""
    out_t = _as_tensor(out, what)
    g = _grad(out, wrt)
    if not (torch.isfinite(out_t).all() and torch.isfinite(g).all()):
        raise _Mismatch(None, f"{what} {_fmt(out_t)}, gradient {_fmt(g)}")
    return g
