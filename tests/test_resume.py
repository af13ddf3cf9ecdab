"""Checkpoints, resume and the saved policy (issue 36, item 3b): a run resumed after 2 of 4 steps logs the rows
of the run that never stopped, and ``models.load`` of the saved policy gives its logits bit for bit."""

import warnings

import datasets
import pytest
import torch

from minirl import checkpoint, config, models, rl

DATA = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4=", "12+5=", "7+7+1="], "answer": ["3", "7", "17", "15"]})
TIMINGS = ("time", "time_generate", "time_optimise")


def length_reward(completions, **_):
    """A scripted reward with signal in (almost) every group: the completion's length mod 3."""
    return [float(len(c) % 3) for c in completions]


def run(tok, cfg, out, *, moe=False, **kwargs):
    sizes = dict(hidden_size=32, num_heads=2, seed=3)
    model = (models.tiny_moe(tok, num_layers=1, num_experts=4, expert_size=16, **sizes) if moe
             else models.tiny_dense(tok, num_layers=2, intermediate_size=64, **sizes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unscored rows, if a group happens to have none
        history = rl.train_rl(model, tok, cfg, DATA, eval_data=DATA.select(range(2)), reward_fn=length_reward,
                              output_dir=out, **kwargs)
    return model, [{k: v for k, v in row.items() if k not in TIMINGS} for row in history.rows]


@pytest.mark.parametrize("algo,settings", [
    ("grpo", dict(beta=0.04, num_minibatches=2)),  # a reference to restore, the loop's generator splits minibatches
    ("ppo", dict(adaptive_kl=True, num_iterations=2)),  # a critic and its optimiser group, an adaptive beta
])
def test_resume_after_2_of_4_steps_gives_the_rows_of_the_uninterrupted_run(tok, tmp_path, algo, settings):
    cfg = config.make_config(algo, steps=4, prompts_per_step=2, group_size=4, max_new_tokens=6, lr=3e-3,
                             checkpoint_every=2, eval_every=2, progress=False, **settings)
    _, whole = run(tok, cfg, tmp_path / "whole")
    assert checkpoint.latest(tmp_path / "whole").name == "checkpoint-4"
    _, resumed = run(tok, cfg, tmp_path / "resumed", resume_from=tmp_path / "whole" / "checkpoint-2")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4] and "eval_accuracy" in resumed[2]  # held-out at 0, 2, 4
    assert resumed == whole  # every logged figure, bit for bit (the timings left out)
    if algo == "ppo":
        assert len({r["beta"] for r in whole if "beta" in r}) > 1  # the controller really moved beta


def test_a_moe_run_resumed_after_2_of_4_steps_equals_the_uninterrupted_run(tok, tmp_path):
    """Issue 47 item 8: transformers holds an MoE's experts fused (``experts.gate_up_proj``) and writes them one
    tensor per expert; the resume read the files raw and refused them ("do not fit the model")."""
    cfg = config.make_config("grpo", steps=4, prompts_per_step=2, group_size=4, max_new_tokens=6, lr=3e-3,
                             beta=0.04, checkpoint_every=2, eval_every=2, progress=False)
    whole_model, whole = run(tok, cfg, tmp_path / "whole", moe=True)
    model, resumed = run(tok, cfg, tmp_path / "resumed", moe=True, resume_from=tmp_path / "whole" / "checkpoint-2")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4] and resumed == whole  # every logged figure
    want = whole_model.state_dict()
    assert any("experts.gate_up_proj" in k for k in want)
    assert max(float((p - want[k]).abs().max()) for k, p in model.state_dict().items()) == 0.0  # every weight


def test_the_saved_policy_loads_back_with_the_same_logits(tok, tmp_path):
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=6, lr=3e-3,
                             progress=False)
    model, _ = run(tok, cfg, tmp_path)
    loaded = models.load(str(tmp_path / checkpoint.POLICY))
    ids = tok(["1+2=", "12+5=3"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(loaded(**ids).logits, model.eval()(**ids).logits)
    assert (tmp_path / checkpoint.POLICY / "tokenizer.json").is_file()


def test_checkpoint_errors_name_the_problem(tok, tmp_path):
    cfg = config.make_config("grpo", steps=2, prompts_per_step=2, group_size=4, max_new_tokens=6,
                             checkpoint_every=1, progress=False)
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    with pytest.raises(ValueError, match="needs an output_dir"):
        rl.train_rl(model, tok, cfg, DATA, reward_fn=length_reward)
    with pytest.raises(ValueError, match="checkpoint_every"):
        config.make_config("grpo", checkpoint_every=-1)
    run(tok, cfg, tmp_path)
    other = config.make_config("grpo", steps=2, prompts_per_step=2, group_size=4, max_new_tokens=6, lr=1e-3,
                               checkpoint_every=1, progress=False)
    with pytest.raises(ValueError, match="'lr'"):
        run(tok, other, tmp_path / "again", resume_from=tmp_path / "checkpoint-1")
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        run(tok, cfg, tmp_path / "again", resume_from=tmp_path)
    assert checkpoint.latest(tmp_path / "nothing") is None
