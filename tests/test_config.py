"""Tests of minirl.config: the presets carry their papers' switches, overrides win, and validate() names every
bad setting."""

import dataclasses
import inspect
from functools import partial

import helpers
import pytest
import torch

from minirl import advantages, config, interop, losses, models, rl, tasks
from minirl.config import ALGORITHMS, RLConfig, make_config

D = torch.float64


def t(*rows):
    return torch.tensor(rows, dtype=D)


close = partial(helpers.close, atol=1e-7, dtype=D)


# --- presets --------------------------------------------------------------------------------------------------------
def test_dr_grpo_preset_has_both_fixes():
    c = config.make_config("dr_grpo")
    assert c.adv_scale == "none" and c.agg == "seq-mean-token-sum-norm"
    assert c.beta == 0.0 and c.advantage == "group"
    # no std division: rewards [1, 0, 0, 0] -> minus the mean 0.25 only
    close(advantages.group_advantages(t(1, 0, 0, 0).flatten(), 4, scale=c.adv_scale), [0.75, -0.25, -0.25, -0.25])


def test_dapo_preset_has_its_four_changes():
    c = config.make_config("dapo")
    assert (c.eps_low, c.eps_high) == (0.2, 0.28)
    assert c.agg == "token-mean" and c.dynamic_sampling and c.overlong_shaping
    assert c.beta == 0.0 and c.adv_scale == "group"


def test_grpo_preset_is_the_baseline():
    c = config.make_config("grpo")
    assert (c.eps_low, c.eps_high, c.agg, c.adv_scale) == (0.2, 0.2, "seq-mean-token-mean", "group")
    assert not c.dynamic_sampling and not c.overlong_shaping and not c.overlong_filter


def test_config_rejects_bad_dapo_settings():
    with pytest.raises(ValueError, match="gen_prompts_per_round"):
        config.make_config("dapo", gen_prompts_per_round=0)
    with pytest.raises(ValueError, match="overlong_cache_len"):
        config.make_config("dapo", max_new_tokens=16, overlong_cache_len=20)
    with pytest.raises(ValueError, match="max_gen_batches"):
        config.make_config("dapo", max_gen_batches=0)


# --- CISPO, SAPO and GMPO's switches ----------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    (dict(loss_mode="spo"), "loss_mode"), (dict(cispo_form="x"), "cispo_form"), (dict(tau_neg=0.0), "tau_neg"),
    (dict(loss_mode="sapo", level="sequence"), "level='token'"), (dict(loss_mode="gmpo", agg="token-mean"), "gmpo"),
])
def test_config_validates_the_switches(overrides, match):
    with pytest.raises(ValueError, match=match):
        make_config("grpo", **overrides)


def test_presets_carry_the_papers_values():
    c, s, g = make_config("cispo"), make_config("sapo"), make_config("gmpo")
    assert (c.loss_mode, c.cispo_form, 1 + c.eps_high, c.agg) == ("cispo", "one-sided", 5.0, "token-mean")
    assert (s.loss_mode, s.tau_pos, s.tau_neg, s.agg) == ("sapo", 1.0, 1.05, "seq-mean-token-mean")
    assert (g.loss_mode, g.eps_low, g.eps_high, g.agg) == ("gmpo", 0.4, 0.4, "seq-mean-token-mean")


def test_presets_carry_the_paper_clip_ranges():
    for name, level in (("gspo", "sequence"), ("gspo_token", "sequence-token")):
        cfg = config.make_config(name)
        assert (cfg.level, cfg.eps_low, cfg.eps_high, cfg.agg) == (level, 3e-4, 4e-4, "seq-mean-token-mean")


def test_router_aux_loss_coef_is_validated_and_off_by_default(tok):
    assert config.make_config("grpo").router_aux_loss_coef == 0.0
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="router_aux_loss_coef"):
            config.make_config("grpo", router_aux_loss_coef=bad)
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4,
                             router_aux_loss_coef=0.01, progress=False)
    with pytest.raises(ValueError, match="TopKRouter"):  # a dense model has no router to balance
        rl.train_rl(models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2), tok, cfg,
                    tasks.load_split("train"))


# --- the sampler corrections' settings (minirl.importance) ------------------------------------------------------------
def test_config_defaults_change_nothing_and_validate():
    cfg = RLConfig()
    assert (cfg.pi_old, cfg.is_correction, cfg.is_seq_form, cfg.is_cap_low) == ("recomputed", "none", "product", None)
    kw = interop.trl_kwargs(make_config("grpo"))
    assert kw["vllm_importance_sampling_correction"] is False and "vllm_importance_sampling_mode" not in kw
    assert not any("rollout_correction" in o for o in interop.verl_overrides(make_config("grpo")))
    for bad, match in [(dict(is_correction="tis"), "is_correction"), (dict(pi_old="sampler"), "pi_old"),
                       (dict(is_seq_form="mean"), "is_seq_form"), (dict(is_cap=0.0), "is_cap must"),
                       (dict(is_cap=2.0, is_cap_low=2.5), "is_cap_low"), (dict(is_cap_low=-1.0), "is_cap_low"),
                       (dict(pi_old="naive", is_correction="token_tis"), "exactly 1")]:
        with pytest.raises(ValueError, match=match):
            make_config("grpo", **bad)


# --- make_config / RLConfig -----------------------------------------------------------------------------------------
def test_presets_carry_the_papers_switches():
    grpo, dr = config.make_config("grpo"), config.make_config("dr_grpo")
    assert (grpo.adv_scale, grpo.agg, grpo.kl_estimator, grpo.kl_placement) == (
        "group", "seq-mean-token-mean", "k3", "loss")
    assert grpo.beta > 0 and grpo.eps_low == grpo.eps_high == 0.2
    # Dr. GRPO is both halves: no std division AND the constant normaliser, and no KL
    assert (dr.adv_scale, dr.agg, dr.beta) == ("none", "seq-mean-token-sum-norm", 0.0)
    for name in config.ALGORITHMS:
        cfg = config.make_config(name)
        assert cfg.algo == name
        cfg.validate()


def test_overrides_win_over_the_preset():
    cfg = config.make_config("grpo", beta=0.0, lr=1e-5, agg="token-mean")
    assert (cfg.beta, cfg.lr, cfg.agg, cfg.adv_scale) == (0.0, 1e-5, "token-mean", "group")


def test_unknown_algorithm_is_named():
    with pytest.raises(ValueError, match=r"algorithm 'foo'.*grpo"):
        config.make_config("foo")


def test_unknown_field_is_named():
    with pytest.raises(ValueError, match="unknown RLConfig field.*'learning_rate'"):
        config.make_config("grpo", learning_rate=1e-4)


@pytest.mark.parametrize("overrides, named", [
    (dict(agg="mean"), "agg"),
    (dict(adv_scale="std"), "adv_scale"),
    (dict(level="seq"), "level"),
    (dict(kl_estimator="k4"), "kl_estimator"),
    (dict(kl_placement="both"), "kl_placement"),
    (dict(steps=0), "steps"),
    (dict(group_size=1), "group_size"),
    (dict(prompts_per_step=6, num_minibatches=4), "num_minibatches"),
    (dict(temperature=0.0), "temperature"),
    (dict(level="sequence", agg="token-mean"), "agg"),
])
def test_invalid_settings_name_the_field(overrides, named):
    with pytest.raises(ValueError, match=named):
        config.make_config("grpo", **overrides)
    cfg = config.RLConfig(**overrides)  # a hand-built config is caught by validate()
    with pytest.raises(ValueError, match=named):
        cfg.validate()


@pytest.mark.parametrize("overrides, message", [
    (dict(advantage="rloo"), "adv_scale='group' applies to advantage='group' only"),  # RLConfig's default scale
    (dict(advantage="reinforce_pp_baseline", adv_scale="batch"), "set adv_scale='none'"),
    (dict(advantage="rloo", adv_scale="none", group_size=1), "needs group_size >= 2"),
    (dict(advantage="rloo", adv_scale="none", beta=0.1, kl_placement="reward"), "kl_placement='reward'"),
    (dict(advantage="reinforce_plus_plus"), "unknown advantage"),
])
def test_new_advantage_switches_are_validated(overrides, message):
    with pytest.raises(ValueError, match=message):
        config.RLConfig(**overrides).validate()


def test_reinforce_pp_needs_no_groups_and_the_presets_are_valid():
    config.RLConfig(advantage="reinforce_pp", adv_scale="none", group_size=1).validate()  # k >= 1 in the paper
    for algo, advantage in [("rloo", "rloo"), ("reinforce_pp", "reinforce_pp"),
                            ("reinforce_pp_baseline", "reinforce_pp_baseline")]:
        c = config.make_config(algo)
        assert (c.advantage, c.adv_scale, c.beta) == (advantage, "none", 0.0)
    assert (config.make_config("rloo").agg, config.make_config("rloo").num_minibatches) == ("seq-mean-token-sum", 1)


# --- the simulated sampler's settings (minirl.inference_engine)
# ----------------------------------------------------------------
def test_the_sampler_settings_are_validated():
    for bad, match in ((dict(sampler_dtype="fp8"), "sampler_dtype"), (dict(pi_old="engine"), "pi_old"),
                       (dict(replay_source="both"), "replay_source"), (dict(sampler_logit_noise=-0.1), ">= 0"),
                       (dict(routing_replay=True, pi_old="naive"), "R3")):
        with pytest.raises(ValueError, match=match):
            config.make_config("grpo", **bad).validate()


# --- the loss settings: one check, one place a config becomes the loss's arguments ---------------------------
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
    """Notebook 03 prints this table: a switch left out (loss_mode, cispo_form, SAPO's temperatures) made sapo read
    as plain GRPO."""
    table = config.algorithms_table()
    header = table.splitlines()[0]
    for switches in ALGORITHMS.values():
        for key in switches:
            assert f" {key} " in header, key
    sapo = next(line for line in table.splitlines() if line.startswith("| sapo |"))
    grpo = next(line for line in table.splitlines() if line.startswith("| grpo |"))
    assert sapo != grpo.replace("| grpo |", "| sapo |")


def test_algorithms_table_for_named_presets_shows_only_their_differences():
    # PPO and GRPO differ in the advantage (gae / group), the aggregation, beta and where the KL goes; both clip at 0.2
    table = config.algorithms_table(["ppo", "grpo"])
    lines = table.splitlines()
    assert lines[0] == "| switch | ppo | grpo |"
    rows = {line.split(" | ")[0][2:]: line for line in lines[2:]}
    assert "| advantage | gae | group |" in lines and "| kl_placement | reward | loss |" in lines
    assert "eps_low" not in rows and "eps_high" not in rows  # the same in both: left out
    with pytest.raises(ValueError, match="names: \\['ppo2'\\] are not presets"):
        config.algorithms_table(["ppo2"])
