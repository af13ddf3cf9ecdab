"""The losses give the same values and gradients as before the refactor of issue 11 (to 1e-7, float64).

tests/data/loss_regression.json was written by tests/make_regression_fixture.py from the code before the split
of policy_loss into three functions; any change in a loss's value or gradient on ordinary inputs fails here.
"""

import json
from pathlib import Path

import pytest
import torch
from make_regression_fixture import compute

STORED = json.loads((Path(__file__).parent / "data" / "loss_regression.json").read_text())


@pytest.mark.parametrize("seed", ["0", "1", "2"])
def test_losses_match_the_stored_values_and_gradients(seed):
    now = compute(int(seed))
    assert set(now) == set(STORED[seed])
    for name, stored in STORED[seed].items():
        if isinstance(stored, dict):
            assert now[name]["value"] == pytest.approx(stored["value"], abs=1e-7), name
            torch.testing.assert_close(torch.tensor(now[name]["grad"]), torch.tensor(stored["grad"]), atol=1e-7,
                                       rtol=0, msg=name)
        else:
            torch.testing.assert_close(torch.tensor(now[name]), torch.tensor(stored), atol=1e-7, rtol=0, msg=name)
