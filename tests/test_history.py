"""An undefined metric stays honest end to end: explained_variance is NaN when the returns do not vary, History
leaves NaN out of its series and writes it as null, and the plots draw the rest without a warning."""

import json
import math
import warnings

import pytest
import torch
from helpers import nan_history

from minirl import advantages, history, plots

D = torch.float64


def ev(values, returns, mask=None):
    values, returns = torch.tensor([values], dtype=D), torch.tensor([returns], dtype=D)
    return advantages.explained_variance(values, returns, torch.ones_like(values) if mask is None
                                         else torch.tensor([mask], dtype=D))


# --- explained_variance by hand -------------------------------------------------------------------------------------
def test_explained_variance_by_hand():
    # 1 - Var(R - V) / Var(R), unbiased variances over the valid tokens
    # returns [1, 0, 1, 0], values 0.5: R - V = [0.5, -0.5, 0.5, -0.5], same variance as R (1/3) -> 1 - 1 = 0.0
    assert ev([0.5] * 4, [1.0, 0.0, 1.0, 0.0]) == pytest.approx(0.0, abs=1e-12)
    # values = returns: Var(0) = 0 -> 1 - 0 = 1.0
    assert ev([1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0]) == 1.0
    # returns [1, 2, 3, 4], values [1, 2, 3, 3]: R - V = [0, 0, 0, 1], mean 0.25,
    # Var = (3 * 0.0625 + 0.5625) / 3 = 0.25; Var(R) = (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3 -> 1 - 0.15 = 0.85
    assert ev([1.0, 2.0, 3.0, 3.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(0.85, abs=1e-12)
    # the padding is not read: the 4th token is masked, so R = [1, 2, 3], V = [1, 2, 3] -> 1.0
    assert ev([1.0, 2.0, 3.0, 99.0], [1.0, 2.0, 3.0, -7.0], mask=[1, 1, 1, 0]) == 1.0


def test_explained_variance_is_nan_when_undefined():
    # returns constant [2, 2, 2, 2]: Var(R) = 0, the ratio is 0 / 0 -> NaN (honest), whatever the values
    assert math.isnan(ev([2.0] * 4, [2.0] * 4))
    assert math.isnan(ev([0.0, 1.0, 2.0, 3.0], [2.0] * 4))
    # fewer than 2 valid tokens: no variance can be estimated -> NaN
    assert math.isnan(ev([1.0, 2.0], [3.0, 4.0], mask=[1, 0]))


# --- History: NaN left out of series, written as null ---------------------------------------------------------------
def test_history_series_leaves_nan_out():
    h = nan_history()
    assert h.series("explained_variance") == ([1, 3], [0.3, -0.2])
    assert h.series("grad_norm") == ([1, 3], [1.5, 2.0])  # inf is left out too
    assert h.last("explained_variance") == -0.2
    assert h.series("reward") == ([1, 2, 3, 4], [0.5, 0.5, 0.75, 1.0])


def test_history_to_jsonl_writes_null_and_reads_back(tmp_path):
    h = nan_history()
    h.to_jsonl(tmp_path / "m.jsonl")
    text = (tmp_path / "m.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # not valid JSON; null instead
    rows = [json.loads(line) for line in text.splitlines()]  # strict JSON parses every line
    assert rows[2] == {"step": 2, "reward": 0.5, "explained_variance": None, "grad_norm": None}
    assert rows[4]["grad_norm"] is None and rows[1] == h.rows[1]
    back = history.History.from_jsonl(tmp_path / "m.jsonl")
    assert back.series("explained_variance") == ([1, 3], [0.3, -0.2])


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
