"""TensorBoard beside metrics.jsonl (issue 36, item 3): ``RLConfig.report_to="tensorboard"`` writes every History
row's numbers as scalars under output_dir/tensorboard; the event file read back holds the History's values. The
library is imported only when asked; without it the error names the extra."""

import sys

import datasets
import pytest
import torch

from minirl import config, models, rl, tracking

pytest.importorskip("tensorboard")


def test_the_event_file_holds_every_rows_scalars(tok, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = config.make_config("grpo", steps=2, prompts_per_step=2, group_size=4, max_new_tokens=6,
                             num_minibatches=1, report_to="tensorboard", progress=False)
    data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="], "answer": ["3", "7"]})
    history = rl.train_rl(models.tiny_dense(tok), tok, cfg, data, output_dir=tmp_path)
    events = EventAccumulator(str(tmp_path / tracking.FOLDER))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    numbers = {k for r in history.rows for k, v in r.items() if k != "step" and isinstance(v, int | float)}
    assert numbers and tags == numbers
    for name in ("loss", "reward", "entropy", "kl_ref", "grad_norm"):
        logged = events.Scalars(name)
        assert [e.step for e in logged] == [1, 2]
        want = torch.tensor([r[name] for r in history.rows], dtype=torch.float32)  # TensorBoard stores float32
        assert torch.equal(torch.tensor([e.value for e in logged]), want)


def test_report_to_is_checked_and_needs_an_output_dir(tok):
    with pytest.raises(ValueError, match="report_to"):
        config.make_config("grpo", report_to="wandb")
    cfg = config.make_config("grpo", steps=1, report_to="tensorboard", progress=False)
    data = datasets.Dataset.from_dict({"prompt": ["1+2="], "answer": ["3"]})
    with pytest.raises(ValueError, match="needs an output_dir"):
        rl.train_rl(models.tiny_dense(tok), tok, cfg, data)
    tracking.reporter("none", None).log({"step": 1, "loss": 0.5})  # does nothing, needs nothing


def test_without_tensorboard_the_error_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"\[tensorboard\]"):
        tracking.reporter("tensorboard", tmp_path)
