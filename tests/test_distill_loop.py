"""Tests of minirl.distill_loop, the distillation loop: a student equal to its teacher gets exactly zero gradient from
the on-policy objectives (and SFT's does not), micro-batches add up to the batch, the mix with the task reward is
GRPO's policy gradient plus the teacher's, the config's rules (train_rl refuses a distillation objective), verl's
names, and the shipped teacher."""

import copy
import hashlib
import json
import zipfile
from pathlib import Path

import datasets
import pytest
import torch
from helpers import tiny_model

from minirl import config, decoding, distill, distill_loop, interop, losses, rl, rollout
from minirl.warm_start import SHIPPED_DIR

ON_POLICY = [("reverse_kl", 0.0), ("reverse_kl", 1.0), ("reverse_kl", 0.5), ("full_reverse_kl", 0.0)]


def cfg_of(distill_="reverse_kl", **kw):
    base = dict(num_minibatches=1, beta=0.0, distill=distill_, max_grad_norm=1e9, prompts_per_step=2, group_size=4,
                max_new_tokens=6, progress=False)
    return config.make_config("grpo", **{**base, **kw})


def batch_of(model, tok, seed=0):
    """8 rows = 2 groups of 4 sampled from ``model``: an RLBatch with random task advantages (B,)."""
    torch.manual_seed(seed)
    r = decoding.generate(model, tok, ["1+2=", "3+4+5+6="], 4, 6, recompute_logprobs=False)
    adv = torch.randn(8, generator=torch.Generator().manual_seed(seed))
    return rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=r.n_prompt_tokens,
                      completion_mask=r.completion_mask, loss_mask=r.completion_mask, old_logprobs=None, advantages=adv)


def grads_after(model, teacher, data, cfg):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay put, the gradients stay readable
    out = distill_loop.distill_update(model, teacher, opt, data, cfg)
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()], out


# --- a student equal to its teacher ----------------------------------------------------------------------------------
@pytest.mark.parametrize("objective, gamma", ON_POLICY)
def test_student_equal_to_teacher_gets_exactly_zero_gradient(tok, objective, gamma):
    # every reward log q - log p and every per-position KL is exactly 0: the teacher's forward is the student's
    model = tiny_model(tok)
    teacher = copy.deepcopy(model)
    data = batch_of(model, tok)
    data.advantages = torch.zeros(8)  # no task reward: pure distillation
    grads, out = grads_after(model, teacher, data, cfg_of(objective, distill_gamma=gamma))
    assert all(bool((g == 0).all()) for g in grads)
    assert out["kl_teacher"] == 0.0 and out["grad_norm"] == 0.0 and out["loss"] == 0.0


def test_sft_moves_a_student_equal_to_its_teacher(tok):
    # SFT's expected gradient is 0 there, but a sample's is not: off-policy distillation keeps moving a perfect student
    model = tiny_model(tok)
    grads, out = grads_after(model, copy.deepcopy(model), batch_of(model, tok), cfg_of("sft"))
    assert out["grad_norm"] > 1e-3 and out["loss"] > 0


# paper-index: distill_loop.train_distill
def test_one_loop_step_leaves_a_student_equal_to_its_teacher_unchanged(tok):
    # the whole loop, AdamW included: zero gradient, zero update (weight decay 0), kl_teacher exactly 0
    model = tiny_model(tok)
    before = copy.deepcopy(model.state_dict())
    data = datasets.Dataset.from_list([{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+5=", "answer": "9"}])
    h = distill_loop.train_distill(model, tok, cfg_of("full_reverse_kl", steps=2), data,
                                   teacher=copy.deepcopy(model))
    assert [r["kl_teacher"] for r in h.rows] == [0.0, 0.0] and [r["grad_norm"] for r in h.rows] == [0.0, 0.0]
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


# --- the loss the loop differentiates -------------------------------------------------------------------------------
@pytest.mark.parametrize("objective, gamma", [*ON_POLICY, ("sft", 0.0)])
def test_micro_batches_add_up_to_the_batch(tok, objective, gamma):
    model, teacher = tiny_model(tok), tiny_model(tok, seed=1)
    data = batch_of(model, tok)
    task = 0.0 if objective == "sft" else 0.5
    g1, o1 = grads_after(model, teacher, data, cfg_of(objective, distill_gamma=gamma, task_coef=task))
    g2, o2 = grads_after(model, teacher, data, cfg_of(objective, distill_gamma=gamma, task_coef=task,
                                                      micro_batch_size=3))
    assert any(bool(g.abs().sum() > 0) for g in g1)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-5)
    assert o2["loss"] == pytest.approx(o1["loss"], rel=1e-5) and o2["kl_teacher"] == pytest.approx(o1["kl_teacher"])


def test_reverse_kl_loss_is_reinforce_with_the_teachers_reward_to_go(tok):
    # the loop's loss, rebuilt from distill.py by hand: token-mean of -(gamma-discounted sum of log q - log p) * log p
    model, teacher = tiny_model(tok), tiny_model(tok, seed=1)
    data = batch_of(model, tok)
    cfg = cfg_of("reverse_kl", distill_gamma=0.5, distill_coef=2.0)
    data.advantages = torch.zeros(8)
    mask = data.loss_mask
    lp = rollout.token_logprobs(model, data.input_ids, data.attention_mask, data.n_prompt_tokens)
    with torch.no_grad():
        tlp = rollout.token_logprobs(teacher, data.input_ids, data.attention_mask, data.n_prompt_tokens)
    to_go = distill.rewards_to_go(distill.reverse_kl_reward(lp, tlp, mask), mask, gamma=0.5)
    expected = losses.aggregate(-2.0 * to_go * lp, mask, "token-mean")
    expected.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got, out = grads_after(model, teacher, data, cfg)
    assert out["loss"] == pytest.approx(float(expected.detach()), rel=1e-6)
    assert out["kl_teacher"] == pytest.approx(float(((lp - tlp) * mask).sum().detach() / mask.sum()), rel=1e-6)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)


def test_mix_is_grpos_policy_gradient_when_the_teacher_agrees(tok):
    # student = teacher: the teacher's term is 0, so the mix is GRPO's one-step policy gradient (ratio 1, token-mean)
    model = tiny_model(tok)
    data = batch_of(model, tok)
    got, _ = grads_after(model, copy.deepcopy(model), data, cfg_of("reverse_kl", task_coef=1.0))
    grpo = config.make_config("grpo", beta=0.0, agg="token-mean", num_minibatches=1, max_grad_norm=1e9)
    model.zero_grad()
    rl.update_minibatch(model, torch.optim.SGD(model.parameters(), lr=0.0), data, grpo, beta=0.0)
    for a, p in zip(got, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, atol=1e-7, rtol=1e-5)


def test_sft_samples_come_from_the_teacher(tok, monkeypatch):
    student, teacher = tiny_model(tok), tiny_model(tok, seed=1)
    seen = []
    real = rl.collect

    def spy(sampler, *args, **kwargs):
        seen.append(sampler)
        return real(sampler, *args, **kwargs)

    monkeypatch.setattr(rl, "collect", spy)
    data = datasets.Dataset.from_list([{"prompt": "1+2=", "answer": "3"}])
    for objective, sampler in (("sft", teacher), ("reverse_kl", student)):
        distill_loop.train_distill(student, tok, cfg_of(objective, steps=1, prompts_per_step=1), data, teacher=teacher)
        assert seen.pop() is sampler


# --- settings and the hand-over from train_rl ------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    (dict(distill="forward_kl"), "distill"),
    (dict(distill="reverse_kl", num_minibatches=2), "num_minibatches=1"),
    (dict(distill="reverse_kl", num_minibatches=1, beta=0.04), "beta must be 0"),
    (dict(distill="reverse_kl", num_minibatches=1, beta=0.0, distill_gamma=1.5), "distill_gamma in"),
    (dict(distill="reverse_kl", num_minibatches=1, beta=0.0, task_coef=-1.0), "task_coef >= 0"),
    (dict(distill="sft", num_minibatches=1, beta=0.0, task_coef=1.0), "task_coef must be 0"),
    (dict(task_coef=1.0), "apply with a teacher"),
    (dict(distill="full_reverse_kl", num_minibatches=1, beta=0.0, precision="bf16-autocast"), "does not read"),
])
def test_config_rejects(overrides, match):
    with pytest.raises(ValueError, match=match):
        config.make_config("grpo", **overrides)


def test_defaults_are_off():
    cfg = config.RLConfig()
    assert (cfg.distill, cfg.distill_gamma, cfg.distill_coef, cfg.task_coef) == ("none", 0.0, 1.0, 0.0)


def test_train_rl_refuses_a_distillation_objective_and_train_distill_needs_a_teacher(tok):
    model = tiny_model(tok)
    data = datasets.Dataset.from_list([{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+5=", "answer": "9"}])
    with pytest.raises(ValueError, match="train_distill"):  # the RL loop never silently ignores the objective
        rl.train_rl(model, tok, cfg_of("reverse_kl", steps=1), data)
    with pytest.raises(ValueError, match="a teacher"):
        distill_loop.train_distill(model, tok, config.make_config("grpo", steps=1, progress=False), data,
                                   teacher=model)
    with pytest.raises(ValueError, match="a teacher"):
        distill_loop.train_distill(model, tok, cfg_of("reverse_kl", steps=1), data, teacher=None)
    with pytest.raises(ValueError, match="resume_from"):
        distill_loop.train_distill(model, tok, cfg_of("reverse_kl", steps=1), data, teacher=model, resume_from="x")


def test_teacher_with_another_vocabulary_is_refused(tok):
    student = tiny_model(tok)
    teacher = copy.deepcopy(student)
    teacher.resize_token_embeddings(len(tok) + 2)
    data = datasets.Dataset.from_list([{"prompt": "1+2=", "answer": "3"}])
    with pytest.raises(ValueError, match="vocabulary"):
        distill_loop.train_distill(student, tok, cfg_of("sft", steps=1), data, teacher=teacher)


# --- the shipped teacher ---------------------------------------------------------------------------------------------
def test_shipped_teacher_is_what_its_info_says():
    path = SHIPPED_DIR / "teacher-dense-cpu-s0"
    info = json.loads((path / "info.json").read_text())
    digest = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    assert digest == info["sha256"]["model.safetensors"]
    student = json.loads((SHIPPED_DIR / "dense-cpu-s0" / "info.json").read_text())
    assert info["student_sha256"] == student["sha256"]["model.safetensors"]  # distilled into the shipped warm start
    # a teacher worth distilling: well above the student on the shared held-out evaluation (standard errors ~0.015)
    assert info["heldout"]["sampled"] > student["heldout"]["sampled"] + 0.15
    teacher, _, loaded = distill_loop.load_teacher("cpu")
    assert loaded == info and not any(p.requires_grad for p in teacher.parameters())
    assert teacher.config.vocab_size == json.loads((SHIPPED_DIR / "dense-cpu-s0" / "config.json").read_text())[
        "vocab_size"]


# --- verl's names ---------------------------------------------------------------------------------------------------
VERL_WHEEL = Path(__file__).resolve().parent.parent / ".cache" / "verl" / "verl-0.9.1-py3-none-any.whl"


def test_distill_verl_overrides_name_verls_options():
    got = interop.distill_verl_overrides("mix", kl_coef=0.5)
    assert "distillation.distillation_loss.use_task_rewards=True" in got
    assert "distillation.distillation_loss.distillation_loss_coef=0.5" in got
    assert "distillation.distillation_loss.use_policy_gradient=True" in interop.distill_verl_overrides(
        "reverse_kl_reward")
    for objective in ("full_reverse_kl", "generalized_jsd", "sft_nll"):
        with pytest.raises(NotImplementedError, match="verl"):
            interop.distill_verl_overrides(objective)
    with pytest.raises(NotImplementedError, match="gamma = 0"):
        interop.distill_verl_overrides("reverse_kl_reward", gamma=1.0)
    with pytest.raises(ValueError, match="unknown objective"):
        interop.distill_verl_overrides("forward_kl")
    if not VERL_WHEEL.exists():
        pytest.skip("verl's wheel is not fetched: pip download verl==0.9.1 --no-deps -d .cache/verl")
    yaml = pytest.importorskip("yaml")
    with zipfile.ZipFile(VERL_WHEEL) as z:
        config_ = yaml.safe_load(z.read("verl/trainer/config/_generated_ppo_trainer.yaml"))
    for override in interop.distill_verl_overrides("mix"):  # every key exists in verl 0.9.1's main_ppo config
        node = config_
        for part in override.split("=")[0].split("."):
            assert part in node, override
            node = node[part]


# --- self-distillation: the student is its own teacher, behind a demonstration or its best sibling ------------------
def test_self_teacher_inputs_by_hand():
    # prompt [7, 8] left-padded to P = 3, completion [9, EOS=1]; context [4, 5, 1]: [4, 5, 1, 7, 8, 9, 1], P' = 5
    ids, mask = torch.tensor([[0, 7, 8, 9, 1]]), torch.tensor([[0, 1, 1, 1, 1]])
    t_ids, t_mask = distill_loop.self_teacher_inputs(ids, mask, 3, [[4, 5, 1]], pad_token_id=0)
    assert t_ids.tolist() == [[4, 5, 1, 7, 8, 9, 1]] and t_mask.tolist() == [[1] * 7]
    # two rows, one with an empty context: it keeps its own tokens, left-padded to the other's width
    ids, mask = torch.tensor([[0, 7, 8, 9, 1], [6, 7, 8, 2, 1]]), torch.tensor([[0, 1, 1, 1, 1], [1] * 5])
    t_ids, t_mask = distill_loop.self_teacher_inputs(ids, mask, 3, [[4], []], pad_token_id=0)
    assert t_ids.tolist() == [[4, 7, 8, 9, 1], [6, 7, 8, 2, 1]] and t_mask.tolist() == [[1] * 5] * 2
    # every context empty: the student's own rows, unchanged
    t_ids, t_mask = distill_loop.self_teacher_inputs(ids, mask, 3, [[], []], pad_token_id=0)
    assert torch.equal(t_ids, ids) and torch.equal(t_mask, mask)


def test_best_sibling_is_the_groups_best_scored_completion_or_nothing():
    from types import SimpleNamespace

    ids = torch.tensor([[0, 5, 6, 1], [0, 5, 7, 1], [3, 4, 8, 1], [3, 4, 9, 1]])  # P = 2, two groups of 2
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    batch = SimpleNamespace(input_ids=ids, attention_mask=mask, n_prompt_tokens=2)
    contexts = distill_loop.best_sibling_contexts(batch, torch.tensor([0.0, 1.0, 0.0, 0.0]), group_size=2)
    assert contexts == [[5, 7, 1], [5, 7, 1], [], []]  # group 1 has no success: no demonstration


@pytest.mark.parametrize("objective", ["reverse_kl", "full_reverse_kl"])
def test_self_distillation_with_an_empty_demonstration_gives_exactly_zero_gradient(tok, monkeypatch, objective):
    train = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4+5="], "completion": ["1+2=3#3", "3+4=7;7+5=12#12"],
                                        "answer": ["3", "12"]})
    runs = {}
    for empty in (True, False):
        if empty:
            monkeypatch.setattr(distill_loop, "demonstration_contexts", lambda prompts, *a: [[] for _ in prompts])
        else:
            monkeypatch.undo()
        model = tiny_model(tok)
        before = [p.detach().clone() for p in model.parameters()]
        cfg = cfg_of(objective, distill_teacher="self_demonstration", steps=1, lr=1e-2)
        row = distill_loop.train_distill(model, tok, cfg, train, teacher=None).rows[-1]
        moved = any(not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
        runs[empty] = (row["grad_norm"], row["kl_teacher"], moved)
    assert runs[True] == (0.0, 0.0, False)  # the teacher is the student itself, token for token
    assert runs[False][0] > 0 and runs[False][2]  # shown the worked answer, it is another distribution


def test_self_distillation_settings_are_checked(tok):
    with pytest.raises(ValueError, match="distill_teacher"):
        cfg_of("sft", distill_teacher="self_demonstration")
    with pytest.raises(ValueError, match="distill_teacher"):
        cfg_of("reverse_kl", distill_teacher="self")
    cfg = cfg_of("reverse_kl", distill_teacher="self_best_sibling", steps=1)
    model = tiny_model(tok)
    with pytest.raises(ValueError, match="teacher=None"):
        distill_loop.train_distill(model, tok, cfg, datasets.Dataset.from_dict({"prompt": ["1+2="]}), teacher=model)
    cfg = cfg_of("reverse_kl", distill_teacher="self_demonstration", steps=1)
    with pytest.raises(ValueError, match="'completion' column"):
        distill_loop.train_distill(model, tok, cfg, datasets.Dataset.from_dict({"prompt": ["1+2="]}), teacher=None)
