"""Tests of minirl.plots: the source a notebook prints, one colour per arm, and a history with NaN steps drawn without a
warning."""

import warnings

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
