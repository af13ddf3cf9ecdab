"""The standard figures of a run: reward and accuracy, KL, clip fractions, entropy, completion length."""

from __future__ import annotations

import matplotlib

if matplotlib.get_backend().lower() not in ("module://matplotlib_inline.backend_inline", "inline"):
    matplotlib.use("Agg")  # headless by default (CLI, CI); notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("reward / accuracy", [("score", "train score (sampled)"), ("eval_accuracy", "held-out accuracy (sampled)"),
                           ("eval_greedy_accuracy", "held-out accuracy (greedy)")], "mean reward (share right)"),
    ("KL to reference", [("kl_ref", "k-estimate per token")], "nats / token"),
    ("clip fraction", [("clip_frac_low", "low side"), ("clip_frac_high", "high side")], "share of tokens"),
    ("entropy", [("entropy", "policy entropy")], "nats / token"),
    ("completion length", [("completion_length", "mean length")], "tokens"),
    ("grad norm", [("grad_norm", "policy grad norm (before clipping)")], "L2 norm"),
]


def plot_history(history, title: str = "", keys_missing_ok: bool = True):
    """A 2 x 3 grid of the standard learning curves of one ``History``; panels with no data say so.

    Returns:
        The matplotlib Figure.
    """
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (name, series, unit) in zip(axes.flat, PANELS, strict=True):
        drawn = False
        for key, label in series:
            steps, vals = history.series(key)
            if vals:
                ax.plot(steps, vals, marker="o" if len(vals) < 8 else None, label=label)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(name)
        ax.set_xlabel("RL step")
        ax.set_ylabel(unit)
        if drawn:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def compare_runs(histories: dict, key: str, ylabel: str, *, title: str = "", ax=None, smooth: int = 1):
    """Overlay one metric of several runs (``{label: History}``); ``smooth`` > 1 applies a trailing moving mean.

    Returns:
        The matplotlib Axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for label, h in histories.items():
        steps, vals = h.series(key)
        if smooth > 1 and len(vals) >= smooth:
            vals = [sum(vals[max(0, i - smooth + 1):i + 1]) / len(vals[max(0, i - smooth + 1):i + 1])
                    for i in range(len(vals))]
        ax.plot(steps, vals, label=label)
    ax.set_xlabel("RL step")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def source(fn) -> str:
    """A function's source without its docstring: the few lines a notebook shows of the code it teaches."""
    import ast
    import inspect
    import textwrap

    text = textwrap.dedent(inspect.getsource(fn))
    node = ast.parse(text).body[0]
    body = node.body
    if (body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)):
        lines = text.splitlines()
        start, end = body[0].lineno - 1, body[0].end_lineno  # the docstring's lines (1-based, inclusive)
        return "\n".join(lines[:start] + lines[end:])
    return text


def excerpt(fn, *needles: str) -> str:
    """The lines of a function a lesson teaches: its signature and each statement containing one of ``needles``.

    A statement is kept whole (all its lines); a ``for`` / ``with`` / ``if`` keeps only its header, and the headers
    around a kept statement are kept too, so the kept lines show where they sit. Each run of left-out lines becomes
    one ``...`` at its indentation.

    Raises:
        ValueError: if a needle matches no line (the function changed: the lesson's excerpt must change with it).
    """
    import ast

    text = source(fn)
    lines = text.splitlines()
    node = ast.parse(text).body[0]
    first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
    keep = set(range(first, node.body[0].lineno - 1))  # decorators and the signature, however many lines
    found = dict.fromkeys(needles, False)

    def header(stmt) -> range:  # a compound statement's header lines; a simple statement's lines
        body = getattr(stmt, "body", None)
        return range(stmt.lineno - 1, body[0].lineno - 1 if body else stmt.end_lineno)

    def visit(stmts, outer: list[range]) -> None:  # outer: the header lines around ``stmts``
        for stmt in stmts:
            span = header(stmt)
            for needle in needles:
                if any(needle in lines[i] for i in span):
                    found[needle] = True
                    keep.update(span, *outer)
            around = [*outer, span]
            visit(getattr(stmt, "body", []) or [], around)
            for field in ("orelse", "finalbody"):  # their "else:" / "finally:" line is kept with what they hold
                block = getattr(stmt, field, []) or []
                if block:
                    line = block[0].lineno - 2
                    own = [range(line, line + 1)] if lines[line].strip() in ("else:", "finally:") else []
                    visit(block, around + own)
            for handler in getattr(stmt, "handlers", []) or []:
                visit(handler.body, around)

    visit(node.body, [])
    missing = [n for n, hit in found.items() if not hit]
    if missing:
        raise ValueError(f"needles: {missing} match no line of {fn.__qualname__}")
    out, gap = [], None
    for i, line in enumerate(lines):
        if i in keep:
            if gap is not None:
                out.append(" " * gap + "...")
                gap = None
            out.append(line)
        elif line.strip() and gap is None:
            gap = len(line) - len(line.lstrip())
    if gap is not None:
        out.append(" " * gap + "...")
    return "\n".join(out)


#: One colour per arm name, the same in every notebook and in ``sweep.plot_metric``; other names get a fixed colour
#: of their own (from a checksum of the name, so it never depends on the order arms are drawn in).
PALETTE = {"no mismatch": "tab:gray", "naive, noise 1.0": "tab:red", "recomputed, noise 1.0": "tab:orange",
           "token TIS, noise 1.0": "tab:blue", "token MIS, noise 1.0": "tab:green",
           "GRPO": "tab:blue", "GRPO + Routing Replay": "tab:purple", "GSPO": "tab:green", "GSPO-token": "tab:olive",
           "CISPO": "tab:orange", "SAPO": "tab:cyan", "GMPO": "tab:brown", "DAPO": "tab:red", "PPO": "tab:pink",
           # 04: the KL estimators and their placements (the checksum gave three of these the same colour)
           "k1": "tab:blue", "k2": "tab:orange", "k3": "tab:green",
           "k1 in reward": "tab:blue", "k1 in loss": "tab:orange", "k2 in reward": "tab:purple",
           "k2 in loss": "tab:olive", "k3 in reward": "tab:red", "k3 in loss": "tab:green", "no KL": "tab:gray",
           # 05: each DAPO switch alone on top of GRPO
           "+ clip-higher": "tab:orange", "GRPO + clip-higher": "tab:orange", "+ token-mean": "tab:olive",
           "+ overlong shaping": "tab:brown", "+ overlong filter": "tab:pink", "+ dynamic sampling": "tab:cyan",
           "Dr. GRPO": "tab:purple", "CISPO two-sided": "tab:olive",
           # 08 and 10
           "DPO": "tab:blue", "cDPO": "tab:cyan", "IPO": "tab:green", "KTO": "tab:orange", "SimPO": "tab:red",
           "minirl": "tab:blue", "TRL": "tab:orange",
           # 11's MoE arms: the dense arms' colours, and the replay arms' own
           "naive, router noise 0.3": "lightcoral", "naive, router noise 1.0": "tab:red",
           "recomputed, router noise 1.0": "tab:orange", "token TIS, router noise 1.0": "tab:blue",
           "token MIS, router noise 1.0": "tab:green", "R2, router noise 1.0": "tab:purple",
           "R3, router noise 1.0": "tab:brown", "GSPO, router noise 1.0": "tab:olive",
           # 09: distillation (GRPO keeps its blue)
           "on-policy distillation": "tab:red", "full-vocab distillation": "tab:purple",
           "SFT on teacher samples": "tab:orange", "GRPO (task reward)": "tab:blue", "mix": "tab:green",
           "teacher": "black",
           # 06: the entropy controls on top of GRPO ("+ clip-higher" as in 05)
           "+ entropy bonus": "tab:green", "+ adaptive entropy": "tab:cyan", "+ Clip-Cov": "tab:purple",
           "+ KL-Cov": "tab:red", "+ top-entropy tokens": "tab:brown"}


def arm_color(arm: str) -> str:
    """The colour of an arm: ``PALETTE``'s, else one of matplotlib's ten chosen by a checksum of the name.

    Two names can get the same colour this way; a figure with several arms uses ``arm_colors``, which never does."""
    import zlib

    return PALETTE.get(arm) or f"C{zlib.crc32(arm.encode()) % 10}"


#: Colours an arm takes when its own is already used in the same figure: matplotlib's ten, then darker and lighter
#: shades, so a figure of up to 30 arms has no two alike.
_SPARE = [f"C{i}" for i in range(10)] + ["navy", "darkred", "darkgreen", "indigo", "saddlebrown", "deeppink",
                                          "dimgray", "darkkhaki", "teal", "gold", "lightskyblue", "lightsalmon",
                                          "lightgreen", "plum", "tan", "hotpink", "silver", "khaki", "turquoise",
                                          "black"]


def arm_colors(arms) -> dict[str, str]:
    """One colour per arm of a figure, no two alike: each arm keeps ``arm_color`` unless an earlier arm has it.

    Arms named in ``PALETTE`` are served first (in the order given), so they keep their colour from notebook to
    notebook; the others take their checksum colour or, when a figure already uses it, the first unused spare.

    Raises:
        ValueError: if there are more arms than distinct colours (30).
    """
    arms = list(dict.fromkeys(arms))
    if len(arms) > len(_SPARE):
        raise ValueError(f"arms: at most {len(_SPARE)} arms in one figure, got {len(arms)}")
    from matplotlib.colors import to_hex

    out: dict[str, str] = {}
    used: set[str] = set()  # as hex: "C0" and "tab:blue" are the same colour
    for arm in sorted(arms, key=lambda a: a not in PALETTE):  # stable: palette arms first, order otherwise kept
        colour = arm_color(arm)
        if to_hex(colour) in used:
            colour = next(c for c in _SPARE if to_hex(c) not in used)
        out[arm] = colour
        used.add(to_hex(colour))
    return {arm: out[arm] for arm in arms}
