"""TRL's GRPOTrainer from a minirl preset on two processes (gloo ranks on CPU), checked against minirl.

Run with torchrun, one process per rank (``use_cpu=True``: two gloo ranks; ``accelerate launch --cpu`` would start
only one):

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 --master_port PORT notebooks/scripts/trl_two_process.py \
        --preset grpo --out result.json

What each run does, on a tiny Qwen3 saved with save_pretrained (``--model DIR``, else a random one built here):

1. Fixed completions, no generation: the scripted rollout of tests/test_interop.py (2 prompts x 4 completions
   of different lengths, rewards [1, 1, 0, 0] per group) is split across the ranks, one group each. Each rank
   calls the trainer's own ``compute_loss`` on its half (the inputs dict its ``_generate_and_score_completions``
   would make, with TRL's global ``num_items_in_batch``), backward, then the gradients are all-reduced and averaged
   as DDP does. Rank 0 compares that with minirl's ``rl.update_minibatch`` gradient on the whole global batch.
2. A real run: ``trainer.train()`` for ``--steps`` optimiser steps (generation; rewards from
   ``tasks.running_sums_reward`` plus a length reward, and DAPO's overlong punishment for dapo; DDP gradients),
   asserting world size 2 inside it; rank 0 reports whether every rank's parameters changed and stayed equal.

Rank 0 writes a JSON summary to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from minirl import interop, models, rl, rollout, tasks  # noqa: E402
from minirl.advantages import group_advantages  # noqa: E402
from minirl.config import make_config  # noqa: E402
from minirl.tokenizer import build_tokenizer  # noqa: E402

G = 4
PROMPTS = ["1+2=", "3+4+5="]
COMPLETIONS = ["3#3", "1+2=3#3", "1+2=3;3+3=6#6", "9", "12#12", "3+4=7;7+5=12#12", "7#7", "3+4=7#7"]
REWARDS = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])


def preset(name: str):
    """(RLConfig, without=...) of a preset at this script's sizes: 2 prompts x 4 per rank, one optimiser step per
    rollout, no gradient clipping (compute_loss does not clip; train() would)."""
    cfg = make_config(name, prompts_per_step=2, group_size=G, num_minibatches=1, num_iterations=1, max_new_tokens=16,
                      max_grad_norm=1e9, lr=1e-2, progress=False)
    return cfg, (("dynamic_sampling", "overlong_shaping") if name == "dapo" else ())


def length_reward(completions, **kwargs):
    """Characters / 16, TRL's documentation example 1.1 scaled: a random model never answers the task right, so this
    reward is what gives its groups a signal and makes the parameters move."""
    return [len(c) / 16 for c in completions]


def fixed_batch(tok):
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    prompt_ids, prompt_mask = enc.input_ids.repeat_interleave(G, 0), enc.attention_mask.repeat_interleave(G, 0)
    ids = [tok(c, add_special_tokens=False).input_ids + [tok.eos_token_id] for c in COMPLETIONS]
    T = max(map(len, ids))
    completion_ids = torch.tensor([c + [tok.pad_token_id] * (T - len(c)) for c in ids])
    mask = rollout.completion_mask(completion_ids, tok.eos_token_id)
    return prompt_ids, prompt_mask, completion_ids, mask


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="grpo", choices=["grpo", "dapo"])
    ap.add_argument("--model", default=None, help="a save_pretrained directory (default: a tiny random Qwen3)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    t0 = time.time()
    import trl

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tok = build_tokenizer()
    path = a.model
    if path is None:  # rank 0 writes a tiny random model; the others wait for it
        path = os.path.join(tempfile.gettempdir(), f"minirl_two_process_{os.environ['MASTER_PORT']}")
        if rank == 0:
            m = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
            m.save_pretrained(path)
            tok.save_pretrained(path)
    cfg, without = preset(a.preset)
    args = interop.to_trl(cfg, without=without, output_dir=tempfile.mkdtemp(), report_to="none", use_cpu=True,
                          logging_steps=1, save_strategy="no", max_steps=a.steps, ddp_backend="gloo")
    data = tasks.load_split("train").select(range(32))
    # the model directory must exist before every rank loads it: GRPOConfig's construction initialised the
    # process group (accelerate's PartialState), so a barrier is available now
    dist.barrier()
    base = models.load(path)
    trainer = trl.GRPOTrainer(model=copy.deepcopy(base), args=args, train_dataset=data, processing_class=tok,
                              reward_funcs=interop.trl_reward_funcs(cfg, [tasks.running_sums_reward, length_reward]))
    assert dist.get_world_size() == world == trainer.accelerator.num_processes == 2, "expected two ranks"

    # 1. fixed completions: each rank's half through TRL's compute_loss, gradients averaged as DDP averages them
    prompt_ids, prompt_mask, completion_ids, mask = fixed_batch(tok)
    P = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, mask.long()], 1)
    ref = copy.deepcopy(base).eval().requires_grad_(False)
    with torch.no_grad():
        old = rollout.token_logprobs(base, input_ids, attention_mask, P) * mask
        ref_lp = rollout.token_logprobs(ref, input_ids, attention_mask, P) * mask
    advantages = group_advantages(REWARDS, G, scale=cfg.adv_scale)
    rows = torch.arange(rank * G, (rank + 1) * G)  # one group per rank
    inputs = dict(prompt_ids=prompt_ids[rows], prompt_mask=prompt_mask[rows], completion_ids=completion_ids[rows],
                  completion_mask=mask[rows].long(), advantages=advantages[rows], old_per_token_logps=old[rows],
                  num_items_in_batch=mask.sum())  # TRL gathers the token count over the processes
    if cfg.beta:
        inputs["ref_per_token_logps"] = ref_lp[rows]
    model_t = trainer.model
    model_t.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    model_t.zero_grad(set_to_none=True)
    loss_local = trainer.compute_loss(model_t, inputs)
    loss_local.backward()
    grads_t = []
    for p in model_t.parameters():
        g = p.grad.detach().clone()
        dist.all_reduce(g)  # sum over ranks ...
        grads_t.append(g / world)  # ... and the mean, as DDP
    loss_t = loss_local.detach().clone()
    dist.all_reduce(loss_t)
    loss_t = float(loss_t) / world
    model_t.zero_grad(set_to_none=True)
    result = {"preset": a.preset, "world_size": world, "num_processes": trainer.accelerator.num_processes,
              "backend": dist.get_backend()}
    if rank == 0:
        model_m = copy.deepcopy(base)
        mb = rl.RLBatch(input_ids=input_ids, attention_mask=attention_mask, completion_mask=mask, loss_mask=mask,
                        old_logprobs=old, advantages=advantages, ref_logprobs=ref_lp if cfg.beta else None,
                        old_values=None, returns=None, routes=None, n_prompt_tokens=P)
        stats = rl.update_minibatch(model_m, torch.optim.SGD(model_m.parameters(), lr=0.0), mb, cfg, beta=cfg.beta)
        grads_m = [p.grad for p in model_m.parameters()]
        result.update(loss_trl=loss_t, loss_minirl=stats["loss"], loss_diff=abs(loss_t - stats["loss"]),
                      grad_max_abs_diff=max(float((x - y).abs().max()) for x, y in zip(grads_t, grads_m, strict=True)),
                      grad_max_abs=max(float(y.abs().max()) for y in grads_m))

    # 2. a real run: generation, rewards, DDP
    before = [p.detach().clone() for p in trainer.model.parameters()]
    t1 = time.time()
    trainer.train()
    train_seconds = time.time() - t1
    assert trainer.accelerator.num_processes == 2 and dist.get_world_size() == 2
    after = [p.detach().clone() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()]
    changed = torch.tensor(float(sum(int(not torch.equal(x, y)) for x, y in zip(before, after, strict=True))))
    flat = torch.cat([p.flatten() for p in after])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        result.update(params_changed=int(changed), n_params=len(after),
                      ranks_equal_after=all(torch.equal(gathered[0], g) for g in gathered[1:]),
                      train_steps=trainer.state.global_step, train_seconds=train_seconds,
                      rewards=[h["reward"] for h in trainer.state.log_history if "reward" in h],
                      seconds=time.time() - t0)
        print(json.dumps(result))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
