"""Tests of minirl.history: History's series, last value and JSONL / CSV files, and an undefined metric kept honest
(NaN left out of the series and written as null; explained_variance's NaN: test_advantages.py, the plots that draw
such a history: test_plots.py)."""

import csv
import json

import pytest
from helpers import nan_history

from minirl import history


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


# --- History --------------------------------------------------------------------------------------------------------
def make_history():
    h = history.History()
    h.log(step=0, eval_accuracy=0.25)
    h.log(step=1, reward=0.5, loss=-0.1)
    h.log(step=2, reward=0.75, loss=None)
    h.log(step=3, reward=1.0, eval_accuracy=0.5)
    return h


def test_history_series_and_last():
    h = make_history()
    assert h.series("reward") == ([1, 2, 3], [0.5, 0.75, 1.0])
    assert h.series("eval_accuracy") == ([0, 3], [0.25, 0.5])
    assert h.series("loss") == ([1], [-0.1])  # None values are skipped
    assert h.last("reward") == 1.0 and h.last("loss") == -0.1
    with pytest.raises(KeyError, match="entropy"):
        h.last("entropy")
    assert h.series("entropy") == ([], [])


def test_history_to_jsonl_and_csv(tmp_path):
    h = make_history()
    h.to_jsonl(tmp_path / "m.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert rows == h.rows
    h.to_csv(tmp_path / "m.csv")
    with open(tmp_path / "m.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4
    assert set(table[0]) == {"step", "reward", "loss", "eval_accuracy"}  # the union of all keys
    assert table[1]["reward"] == "0.5" and table[0]["reward"] == ""  # missing values are empty cells
