"""Multi-turn episodes against TRL 1.16: the same episodes (model tokens and the environment's, TRL's ``tool_mask``)
through GRPOTrainer's own loss and through ``rl.update_minibatch`` give the same loss and gradient; what the bridges
refuse for episodes. Skipped without TRL, like tests/test_interop.py (whose trainer it builds)."""

from __future__ import annotations

import copy

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install -e '.[trl]' runs the bridge's tests")

from test_interop import PROMPTS, REWARDS, G, base_model, grpo_trainer  # noqa: E402, F401  (base_model: a fixture)

from minirl import config, rl, rollout  # noqa: E402
from minirl.advantages import group_advantages  # noqa: E402
from minirl.interop import trl as trl_bridge  # noqa: E402
from minirl.interop import verl as verl_bridge  # noqa: E402

# each episode: (text, author) segments; 1 the model, 0 the environment ("<bos>" + the prompt again: a retry)
EPISODES = [
    [("3#3", 1)], [("4#4", 1), ("<bos>1+2=", 0), ("1+2=3#3", 1)], [("1+2=3#3", 1)], [("9", 1)],
    [("12#12", 1)], [("3+4=8;8+5=13#13", 1), ("<bos>3+4+5=3+4=7;", 0), ("7+5=12#12", 1)],
    [("7#7", 1), ("<bos>3+4+5=", 0), ("3+4=7#7", 1)], [("3+4=7#7", 1)],
]


def episode_batch(tok):
    """The episodes as the trainer's tensors: (B, T) completion ids, valid tokens, and the model's tokens."""
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, author = [], []
    for segments in EPISODES:
        row, who = [], []
        for text, by in segments:
            piece = tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if by else [])
            row, who = row + piece, who + [by] * len(piece)
        ids.append(row)
        author.append(who)
    T = max(map(len, ids))
    completion_ids = torch.tensor([r + [tok.pad_token_id] * (T - len(r)) for r in ids])
    valid = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in ids])
    tool_mask = torch.tensor([w + [1] * (T - len(w)) for w in author])  # TRL pads its tool_mask with 1
    return dict(prompt_ids=enc.input_ids.repeat_interleave(G, 0),
                prompt_mask=enc.attention_mask.repeat_interleave(G, 0), completion_ids=completion_ids, valid=valid,
                tool_mask=tool_mask)


@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "dapo", "cispo"])
def test_episodes_loss_and_gradient_match_trls_tool_mask(algo, tok, base_model, tmp_path):  # noqa: F811
    extra = dict(dynamic_sampling=False, overlong_shaping=False) if algo == "dapo" else {}
    cfg = config.make_config(algo, num_minibatches=1, num_iterations=3, prompts_per_step=2, group_size=G,
                             max_new_tokens=24, max_grad_norm=1e9, **extra)  # no clipping: raw gradients
    b = episode_batch(tok)
    model_m, model_t = copy.deepcopy(base_model), copy.deepcopy(base_model)
    trainer = grpo_trainer(model_t, tok, cfg, tmp_path)
    P = b["prompt_ids"].shape[1]
    input_ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    attention = torch.cat([b["prompt_mask"], b["valid"]], 1)  # the model reads the observations
    model_tokens = (b["valid"] * b["tool_mask"]).float()  # and is trained on its own tokens only
    ref = copy.deepcopy(base_model).eval()
    with torch.no_grad():
        old = rollout.token_logprobs(model_m, input_ids, attention, P) * model_tokens
        ref_lp = rollout.token_logprobs(ref, input_ids, attention, P) * model_tokens
    advantages = group_advantages(REWARDS, G, scale=cfg.adv_scale)
    mb = rl.RLBatch(input_ids=input_ids, attention_mask=attention, n_prompt_tokens=P, completion_mask=model_tokens,
                    loss_mask=model_tokens, old_logprobs=old, advantages=advantages,
                    ref_logprobs=ref_lp if cfg.beta else None)
    inputs = dict(prompt_ids=b["prompt_ids"], prompt_mask=b["prompt_mask"], completion_ids=b["completion_ids"],
                  completion_mask=b["valid"], tool_mask=b["tool_mask"], advantages=advantages,
                  old_per_token_logps=old, num_items_in_batch=model_tokens.sum())
    if cfg.beta:
        inputs["ref_per_token_logps"] = ref_lp
    opt = torch.optim.AdamW(model_m.parameters(), lr=3e-2)
    worst = []
    for _ in range(3):  # three optimiser steps on the episodes: ratios move away from 1
        model_t.load_state_dict(model_m.state_dict())
        model_t.zero_grad(set_to_none=True)
        loss_t = trainer.compute_loss(model_t, inputs)
        loss_t.backward()
        stats = rl.update_minibatch(model_m, opt, mb, cfg, beta=cfg.beta)
        grad_gap = max(float((p.grad - q.grad).abs().max())
                       for p, q in zip(model_t.parameters(), model_m.parameters(), strict=True))
        worst.append((abs(float(loss_t.detach()) - stats["loss"]), grad_gap))
    assert max(w[0] for w in worst) < 1e-6 and max(w[1] for w in worst) < 1e-6, worst


def test_bridges_name_what_they_lack_for_episodes():
    cfg = config.make_config("grpo", max_turns=3)
    with pytest.raises(NotImplementedError, match="max_turns"):
        trl_bridge.trl_kwargs(cfg)
    with pytest.raises(NotImplementedError, match="max_turns"):
        verl_bridge.verl_overrides(cfg)
    with pytest.raises(NotImplementedError, match="mask_observations"):
        trl_bridge.trl_kwargs(config.make_config("grpo", mask_observations=False))
