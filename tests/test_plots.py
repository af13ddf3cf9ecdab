"""Tests of minirl.plots: the source a notebook prints, one colour per arm, and a history with NaN steps drawn without a
warning."""

import json
import warnings

import pytest
from helpers import nan_history

from minirl import history, importance, plots


def test_source_drops_the_docstring_and_keeps_the_code():
    text = plots.source(importance.token_tis_weights)
    assert text.startswith("def token_tis_weights(") and '"""' not in text
    assert "_truncate(log_ratio, cap, cap_low)" in text  # the body is all there


def test_source_of_a_function_without_a_docstring():
    def plain(x):
        return x + 1

    assert plots.source(plain).strip() == "def plain(x):\n    return x + 1"


def test_an_arm_has_one_colour_whatever_the_order():
    assert plots.arm_color("GRPO") == plots.PALETTE["GRPO"]
    other = plots.arm_color("some new arm")
    assert other == plots.arm_color("some new arm") and other.startswith("C")



def test_no_two_arms_of_a_stored_sweep_share_a_colour():
    # the checksum alone gave e.g. "synced", "naive, k 8" and "mask 0.05, k 8" of stale_samplers the same C4
    from pathlib import Path

    from matplotlib.colors import to_hex

    summaries = sorted(Path(__file__).resolve().parents[1].glob("notebooks/results/**/summary.json"))
    assert len(summaries) >= 10
    for path in summaries:
        arms = list(json.loads(path.read_text())["arms"])
        colours = plots.arm_colors(arms)
        assert len({to_hex(c) for c in colours.values()}) == len(arms), path


def test_arm_colors_keep_the_palette_and_resolve_clashes():
    # "CISPO" and "+ clip-higher" are both tab:orange in PALETTE: the first keeps it, the second gets a spare
    colours = plots.arm_colors(["GRPO", "CISPO", "+ clip-higher", "some new arm"])
    assert colours["GRPO"] == "tab:blue" and colours["CISPO"] == "tab:orange"
    assert colours["+ clip-higher"] not in ("tab:orange", "C1", "tab:blue", "C0")
    assert plots.arm_colors(["some new arm"])["some new arm"] == plots.arm_color("some new arm")
    with pytest.raises(ValueError, match="arms: at most 30"):
        plots.arm_colors([f"arm {i}" for i in range(31)])

# --- plots: no warning from the undefined steps ---------------------------------------------------------------------
def test_plots_draw_a_history_with_nan_without_warnings():
    h = nan_history()
    all_nan = history.History([{"step": 1, "explained_variance": float("nan")},
                               {"step": 2, "explained_variance": float("nan")}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.plot_history(h, title="with NaN")
        ax = plots.compare_runs({"a": h, "all NaN": all_nan}, "explained_variance", "explained variance")
    grad_panel = fig.axes[5]  # "grad norm": steps 1 and 3 drawn, the NaN and inf steps left out
    assert grad_panel.lines[0].get_xdata().tolist() == [1, 3]
    assert ax.lines[0].get_ydata().tolist() == [0.3, -0.2] and len(ax.lines[1].get_xdata()) == 0
    plots.plt.close("all")


def test_excerpt_keeps_the_taught_lines_their_headers_and_marks_the_rest():
    def f(x, *, flag=False):
        """Doc."""
        y = x + 1
        z = 0
        for i in range(3):
            if flag:
                z += i
            y = y * 2
        return y + z

    # the kept statement's for-header stays; the left-out lines become one "..." at their indentation
    assert plots.excerpt(f, "y = y * 2", "return").splitlines() == [
        "def f(x, *, flag=False):", "    ...", "    for i in range(3):", "        ...", "        y = y * 2",
        "    return y + z"]
    with pytest.raises(ValueError, match="needles: \\['nowhere'\\] match no line"):
        plots.excerpt(f, "nowhere")


def test_excerpt_keeps_the_else_line_of_a_kept_branch():
    def g(x):
        if x > 0:
            y = 1
        else:
            y = 2
        return y

    assert plots.excerpt(g, "y = 2").splitlines() == ["def g(x):", "    if x > 0:", "        ...", "    else:",
                                                      "        y = 2", "    ..."]
