"""Optional experiment tracking beside metrics.jsonl: ``RLConfig.report_to="tensorboard"`` writes every History row
as TensorBoard scalars under ``output_dir/tensorboard`` (``tensorboard --logdir OUT/tensorboard`` plots them).

The library is imported only when asked, and a missing one is a clear error, not a silent no-op: the run's
metrics.jsonl is the record either way, TensorBoard a view of it. TRL's name for the setting is the same
(``report_to``); it writes to ``output_dir/runs/`` through transformers' callback.
"""

from __future__ import annotations

from pathlib import Path

from .checks import choice
from .config import REPORT_TO

#: The folder under the run's output_dir that holds the event files.
FOLDER = "tensorboard"


class _Nothing:
    def log(self, row: dict) -> None:
        pass



class _TensorBoard:
    def __init__(self, log_dir: Path, last_step: int | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # torch's writer needs the tensorboard package
            raise ImportError("report_to='tensorboard' needs the tensorboard package: "
                              "pip install -e '.[tensorboard]'") from err
        self.writer, self.last_step = SummaryWriter(log_dir=str(log_dir)), last_step

    def log(self, row: dict) -> None:
        step = int(row["step"])
        for name, value in row.items():
            if name != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(name, float(value), step)
        self.writer.flush()  # a run that crashes keeps what it logged
        if step == self.last_step:
            self.writer.close()  # ends its writer thread


def reporter(report_to: str, output_dir: str | Path | None, *, last_step: int | None = None):
    """An object whose ``log(row)`` sends one History row (a dict with ``step``; its numbers become scalars of
    that step) to ``report_to``, flushed at once, and closes the writer after the row of ``last_step``; for
    "none", one that does nothing.

    Raises:
        ValueError: for an unknown ``report_to`` or a tracker without an ``output_dir`` to write to.
        ImportError: when the tracker's library is not installed.
    """
    choice("report_to", report_to, REPORT_TO)
    if report_to == "none":
        return _Nothing()
    if output_dir is None:
        raise ValueError(f"report_to={report_to!r} needs an output_dir: the event files go to output_dir/{FOLDER}")
    return _TensorBoard(Path(output_dir) / FOLDER, last_step)


def reporting(callback, report_to: str, output_dir: str | Path | None, *, last_step: int | None = None):
    """``rl.train_rl``'s per-step callback, followed by sending the step's row to ``report_to`` (``reporter``):
    ``callback`` itself for "none", else a function that calls ``callback`` (if any), then logs the row, so
    what the callback adds is reported too.

    Raises:
        ValueError, ImportError: as ``reporter``, at once (not at the first step).
    """
    if report_to == "none":
        choice("report_to", report_to, REPORT_TO)
        return callback
    board = reporter(report_to, output_dir, last_step=last_step)

    def report(step: int, row: dict) -> None:
        if callback is not None:
            callback(step, row)
        board.log(row)

    return report
