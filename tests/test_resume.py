"""Checkpoints, resume and the saved policy (issue 36, item 3b): a run resumed after 2 of 4 steps logs the rows
of the run that never stopped (an MoE's too), and ``models.load`` of the saved policy gives its logits bit for bit.
Issue 47: a resume of another run, a new run into a folder with checkpoints and an incomplete checkpoint are
refused."""

import re
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


def run(tok, cfg, out, *, moe=False, seed=3, data=DATA, reward_fn=length_reward, **kwargs):
    sizes = dict(hidden_size=32, num_heads=2, seed=seed)
    model = (models.tiny_moe(tok, num_layers=1, num_experts=4, expert_size=16, **sizes) if moe
             else models.tiny_dense(tok, num_layers=2, intermediate_size=64, **sizes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unscored rows, if a group happens to have none
        history = rl.train_rl(model, tok, cfg, data, eval_data=DATA.select(range(2)), reward_fn=reward_fn,
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


def short_cfg():
    return config.make_config("grpo", steps=2, prompts_per_step=2, group_size=4, max_new_tokens=6, beta=0.04,
                              checkpoint_every=1, progress=False)


def test_a_new_run_into_a_folder_with_checkpoints_is_refused_until_cleared(tok, tmp_path):
    """Issue 47 item 9: a new run into an old run's folder overwrote checkpoint-1..k and left the old run's later
    ones, which ``latest`` picked (scored with another reward) without a word."""
    run(tok, config.make_config("grpo", steps=3, prompts_per_step=2, group_size=4, max_new_tokens=6,
                                checkpoint_every=1, progress=False), tmp_path)
    with pytest.raises(ValueError, match="already holds checkpoints of an earlier run"):
        run(tok, short_cfg(), tmp_path, reward_fn=lambda completions, **_: [1.0] * len(completions))
    assert checkpoint.clear(tmp_path) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    run(tok, short_cfg(), tmp_path)
    assert checkpoint.latest(tmp_path).name == "checkpoint-2" and (tmp_path / checkpoint.POLICY).is_dir()


def test_a_resume_with_another_model_data_system_prompt_or_reward_is_refused(tok, tmp_path):
    """Issue 47 item 9: only the RLConfig was compared, so a resume with another model of the same shapes, other
    rows, another system prompt or another reward ran silently."""
    run(tok, short_cfg(), tmp_path / "a")
    start = tmp_path / "a" / "checkpoint-1"
    with_system_prompt = DATA.map(lambda r: {"prompt": "Add the numbers. " + r["prompt"]})
    for change, what in ((dict(seed=4), "'weights'"), (dict(data=DATA.select(range(3))), "'data'"),
                         (dict(data=with_system_prompt), "'data'"), (dict(reward_fn=[length_reward]), None),
                         (dict(reward_fn=[length_reward, length_reward]), "'rewards'"),
                         (dict(reward_weights=[2.0]), "'reward_weights'")):
        if what is None:  # the same reward as a list of one, weight 1: the same run
            run(tok, short_cfg(), tmp_path / "b", resume_from=start, **change)
            continue
        with pytest.raises(ValueError, match=re.escape(f"checkpoint of another run: it differs in {{{what}")):
            run(tok, short_cfg(), tmp_path / "c", resume_from=start, **change)
    assert not (tmp_path / "c").exists()  # refused before anything was written
    run(tok, short_cfg(), tmp_path / "z", data=with_system_prompt)  # another run, resumed into a's folder
    with pytest.raises(ValueError, match="holds checkpoints of another run"):
        run(tok, short_cfg(), tmp_path / "a", data=with_system_prompt, resume_from=tmp_path / "z" / "checkpoint-1")


def test_latest_and_resume_take_only_complete_checkpoints(tok, tmp_path):
    """Issue 47 item 9: a truncated trainer_state.pt was still ``latest``; a checkpoint written policy first, then
    state, left a mixed folder when the run stopped in between."""
    run(tok, short_cfg(), tmp_path)
    state = tmp_path / "checkpoint-2" / checkpoint.STATE
    state.write_bytes(state.read_bytes()[:1000])  # truncated
    assert checkpoint.latest(tmp_path).name == "checkpoint-1"
    with pytest.raises(ValueError, match="incomplete"):
        run(tok, short_cfg(), tmp_path / "again", resume_from=tmp_path / "checkpoint-2")


def test_a_run_stopped_while_writing_a_checkpoint_leaves_no_partial_one(tok, tmp_path, monkeypatch):
    """Issue 47 item 9: the policy was written into checkpoint-N, then the state; a stop in between left a
    checkpoint-N holding the new policy and no state. Now both go to .checkpoint-N.tmp, renamed when complete."""
    real_save, calls = torch.save, []

    def stop_at_the_second_state(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2:
            raise KeyboardInterrupt("stopped after the policy was written")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", stop_at_the_second_state)
    with pytest.raises(KeyboardInterrupt):
        run(tok, short_cfg(), tmp_path)
    assert not (tmp_path / "checkpoint-2").exists() and (tmp_path / ".checkpoint-2.tmp" / checkpoint.POLICY).is_dir()
    assert checkpoint.latest(tmp_path).name == "checkpoint-1"
    assert checkpoint.clear(tmp_path) == ["checkpoint-1", ".checkpoint-2.tmp"]
