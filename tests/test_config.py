"""config.py: the presets, the one check of the loss settings, the one place a config becomes a loss's arguments."""

import dataclasses
import inspect

import pytest

from minirl import config, losses
from minirl.config import ALGORITHMS, RLConfig, make_config


@pytest.mark.parametrize("algo", ["gspo", "gmpo"])
@pytest.mark.parametrize("correction", ["token_tis", "token_mis"])
def test_token_corrections_with_one_term_per_sequence_fail_at_the_config(algo, correction):
    """GSPO and GMPO have one loss term per sequence: a per-token weight cannot reach them. The config must say so,
    naming is_correction and the loss, before train_rl samples anything (issue 35, defect 2: it used to pass
    validate and fail inside the first update with "is_weights must have shape")."""
    with pytest.raises(ValueError, match=rf"is_correction='{correction}'.*one term per sequence"):
        make_config(algo, is_correction=correction)
    for ok in ("none", "seq_tis", "seq_mis"):  # the sequence corrections have one weight per sequence
        make_config(algo, is_correction=ok)
    make_config("gspo_token", is_correction=correction)  # GSPO-token's terms are per token


def test_the_loss_settings_are_checked_in_one_place():
    """validate runs losses.check_settings on exactly the config's values of losses.SETTINGS, so a rule of the loss
    is written once (it used to be written in validate and in policy_loss, tau > 0 three times)."""
    assert set(losses.SETTINGS) <= {f.name for f in dataclasses.fields(RLConfig)}
    assert list(inspect.signature(losses.check_settings).parameters) == list(losses.SETTINGS)
    for bad, match in ((dict(tau_pos=0.0), "tau_pos"), (dict(dual_clip=1.0), "dual_clip"),
                       (dict(eps_low=1.5), "eps_low"),
                       (dict(agg="token-mean", level="sequence"), "seq-mean-token-mean"),
                       (dict(loss_mode="sapo", level="sequence"), "loss_mode='sapo'")):
        with pytest.raises(ValueError, match=match):
            make_config("grpo", **bad)
        cfg = make_config("grpo")
        with pytest.raises(ValueError, match=match):  # the same rule, the same words, through the loss
            losses.check_settings(**{**cfg.policy_loss_settings(), **bad})


def test_policy_loss_kwargs_are_every_setting_the_loss_takes_from_a_config():
    cfg = make_config("sapo", tau_neg=2.0, max_new_tokens=17)
    kwargs = cfg.policy_loss_kwargs()
    assert kwargs == {**{name: getattr(cfg, name) for name in losses.SETTINGS}, "max_tokens": 17}
    assert kwargs["tau_neg"] == 2.0 and kwargs["loss_mode"] == "sapo"
    loss_params = set(inspect.signature(losses.policy_loss).parameters)
    # what the loop adds per minibatch: the tensors, the denominator and the importance weights
    assert loss_params - set(kwargs) == {"logprobs", "old_logprobs", "advantages", "mask", "denominator", "is_weights"}


def test_algorithms_table_shows_every_switch_a_preset_sets():
    """Notebook 02 prints this table: a switch left out (loss_mode, cispo_form, SAPO's temperatures) made sapo read
    as plain GRPO."""
    table = config.algorithms_table()
    header = table.splitlines()[0]
    for switches in ALGORITHMS.values():
        for key in switches:
            assert f" {key} " in header, key
    sapo = next(line for line in table.splitlines() if line.startswith("| sapo |"))
    grpo = next(line for line in table.splitlines() if line.startswith("| grpo |"))
    assert sapo != grpo.replace("| grpo |", "| sapo |")
