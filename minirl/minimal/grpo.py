"""GRPO in one file: sample G answers per prompt, score them, push up the better-than-average ones.

    python -m minirl.minimal.grpo                      # the toy, from minirl's shipped warm start
    python -m minirl.minimal.grpo --model PATH         # any Hugging Face causal LM (a folder or a hub name)
    python -m minirl.minimal.grpo --help               # every setting, with what it means

One GRPO step, as in Shao et al. 2024 (DeepSeekMath), algorithm 1 and eq. 3:

    1. sample     G completions for each of N prompts from the current policy pi_old    input_ids_BL, mask_BT
    2. score      a 0/1 reward: is the number after '#' the prompt's answer?            rewards_B
    3. advantage  A_i = (r_i - mean(r_group)) / (std(r_group) + adv_eps), one per answer  advantages_B
    4. loss       per token: -min(rho A, clip(rho, 1 - eps, 1 + eps) A) + beta * k3, with rho = pi / pi_old,
                  averaged over each answer's tokens, then over answers
    5. update     AdamW on each minibatch of whole groups, the gradient norm clipped to 1

The file imports torch, transformers and the standard library only: copy it and it runs. Shapes are in the names:
N prompts (groups) per step, G answers per group, B = N * G rows, b the rows of one minibatch, P prompt tokens
(left-padded), T completion tokens, L = P + T, V vocabulary; _B1 is a (B, 1) column that broadcasts over tokens.
The sections below are numbered by these five steps. tests/test_minimal.py runs it beside minirl's
library loop (``rl.train_rl`` with ``make_config("grpo")``) from the same model, data and seed, and checks that
both compute the same loss, gradient norm and weights step by step.
"""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import json
import os
import re
import time
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils.logging import tqdm

# minirl's data folder: beside the package, or wherever MINIRL_DATA says (for a copy of this file on its own)
DATA = Path(os.environ.get("MINIRL_DATA") or Path(__file__).resolve().parents[2] / "data")


@dataclass
class Args:
    model: str = str(DATA / "warm_start" / "dense-cpu-s0")
    """a Hugging Face causal LM (a save_pretrained folder or a hub name); default: minirl's toy warm start. For
    another task, replace reward() below: it reads the toy's answers ('...#21')"""
    train_data: str = str(DATA / "train.jsonl")
    """JSONL rows with a "prompt" and an integer "answer"; the default is the running-sums task ("7+5+9=")"""
    test_data: str = str(DATA / "test.jsonl")
    """held-out rows in the same form, scored before and after training"""
    seed: int = 0
    """seeds the prompts drawn, the sampling and the minibatch order (torch's generators; Python's random is unused)"""
    steps: int = 150
    """GRPO steps; each samples a fresh batch and makes num_minibatches optimiser steps"""
    prompts_per_step: int = 16
    """N: prompts drawn per step (with replacement)"""
    group_size: int = 8
    """G: answers sampled per prompt; the group's mean reward is each answer's baseline"""
    max_new_tokens: int = 40
    """the longest answer; one that has not ended by then is cut (and scored as it is)"""
    temperature: float = 1.0
    """sampling temperature; the log-probs are taken at the same temperature, so pi_old is the very distribution
    the tokens were drawn from (and rho = 1 before the first update)"""
    lr: float = 1e-4
    """AdamW's learning rate"""
    eps: float = 0.2
    """PPO's clip range: a token whose rho has left [1 - eps, 1 + eps] on the side its advantage pushes towards
    gets no gradient"""
    beta: float = 0.04
    """weight of the k3 estimate of KL(policy || reference) in the loss (the reference: the starting model)"""
    adv_eps: float = 1e-4
    """added to each group's reward std before dividing"""
    num_minibatches: int = 2
    """optimiser steps per batch: the groups are shuffled and cut into this many parts, each one step (a group's G
    answers stay together; with N not a multiple the last part is smaller, with N < num_minibatches there are N)"""
    max_grad_norm: float = 1.0
    """the gradient's norm is clipped to this before each optimiser step"""
    eval_size: int = 256
    """held-out prompts scored before and after training"""
    eval_samples: int = 4
    """samples per held-out prompt for the sampled accuracy (greedy takes one)"""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    """where the model runs"""


def parse_args(argv: list[str] | None = None) -> Args:
    """Args from the command line; each field's docstring is its --help text (cleanrl's form)."""
    helps, source = {}, ast.parse(inspect.getsource(Args)).body[0].body
    for field_node, doc in zip(source, source[1:], strict=False):
        if isinstance(field_node, ast.AnnAssign) and isinstance(doc, ast.Expr):
            helps[field_node.target.id] = doc.value.value
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in fields(Args):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default,
                            help=helps[f.name])
    return Args(**vars(parser.parse_args(argv)))


# ------------------------------------------------------------------------------------------ the data
def load_jsonl(path: str, n: int | None = None) -> list[dict]:
    """The rows of a JSONL file (the first ``n``), each with a "prompt" and an "answer"."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows, 1):
        if not isinstance(row.get("prompt"), str) or "answer" not in row:
            raise ValueError(f"{path}, line {i}: needs a string 'prompt' and an 'answer'")
    return rows[:n]


# ------------------------------------------------------------------------------------------ 2. score
ANSWER = re.compile(r"^[0-9+=;]*#(-?[0-9]+)$")  # a scratchpad of sums, then '#' and the answer: "7+5=12;12+9=21#21"


def reward(completion: str, answer) -> float:
    """1.0 if the completion is well formed and its number after '#' equals the answer, else 0.0 (verifiable)."""
    m = ANSWER.match(completion.strip())
    return float(m is not None and int(m.group(1)) == int(answer))


# ------------------------------------------------------------------------------------------ 1. sample
def positions(mask_BL: torch.Tensor) -> torch.Tensor:
    """(B, L) position ids that skip the left padding: the first real token is position 0. (It sits in step 1, but
    the log-probs below use it too.)"""
    return (mask_BL.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], G: int, max_new_tokens: int, *, temperature: float = 1.0,
           greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """G completions per prompt by ancestral sampling from softmax(logits / temperature), reusing the KV cache.

    Returns (input_ids_BL, attention_mask_BL, completion_mask_BT): prompt and completion side by side
    (L = P + T; prompts left-padded; rows laid out group by group, B = N * G), and 1 on each completion's tokens
    up to and including its end token.
    """
    model.eval()
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    prompt_ids_BP = enc.input_ids.repeat_interleave(G, dim=0)  # rows laid out group by group
    prompt_mask_BP = enc.attention_mask.repeat_interleave(G, dim=0)
    eos = torch.tensor(end_tokens(model, tokenizer), device=device)
    # transformers 5.2x names the forward's cache argument `cache` (before: `past_key_values`)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids, mask, pos, cache = prompt_ids_BP, prompt_mask_BP, positions(prompt_mask_BP), None
    done_B = torch.zeros(len(ids), dtype=torch.bool, device=device)
    tokens = []
    for _ in range(max_new_tokens):
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                    **{cache_arg: cache})
        cache = out[cache_arg]
        logits_BV = out.logits[:, -1].float() / temperature
        token_B = logits_BV.argmax(-1) if greedy else torch.multinomial(F.softmax(logits_BV, -1), 1).squeeze(1)
        token_B = token_B.masked_fill(done_B, tokenizer.pad_token_id)  # a finished row only pads
        tokens.append(token_B)
        done_B |= torch.isin(token_B, eos)
        if done_B.all():
            break
        ids, pos = token_B[:, None], pos[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(len(ids), 1)], dim=1)
    completion_ids_BT = torch.stack(tokens, dim=1)
    is_eos_BT = torch.isin(completion_ids_BT, eos).long()
    completion_mask_BT = (is_eos_BT.cumsum(1) - is_eos_BT == 0).float()  # tokens up to and including the first end
    input_ids_BL = torch.cat([prompt_ids_BP, completion_ids_BT], dim=1)
    attention_mask_BL = torch.cat([prompt_mask_BP, completion_mask_BT.long()], dim=1)
    return input_ids_BL, attention_mask_BL, completion_mask_BT


def end_tokens(model, tokenizer) -> list[int]:
    """Every id that ends an answer: the tokenizer's end token and those of the checkpoint's generation config."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(extra if isinstance(extra, list) else [extra])
    return sorted(i for i in ids if i is not None)


# ------------------------------------------------------------------------------------------ log-probs (for steps 3-4)
def token_logprobs(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, P: int,
                   temperature: float) -> torch.Tensor:
    """(B, T) log pi(y_t | prompt, y_<t) of each completion token, from logits / temperature, in float32.

    The logits at position t predict token t + 1, so the completion's come from positions P - 1 .. L - 2."""
    logits_BTV = model(input_ids=input_ids_BL, attention_mask=attention_mask_BL,
                       position_ids=positions(attention_mask_BL), use_cache=False).logits[:, P - 1:-1]
    logprobs_BTV = F.log_softmax(logits_BTV.float() / temperature, dim=-1)
    return logprobs_BTV.gather(-1, input_ids_BL[:, P:, None]).squeeze(-1)


# ------------------------------------------------------------------------------------------ 3. advantages
def group_advantages(rewards_B: torch.Tensor, G: int, eps: float) -> torch.Tensor:
    """(B,) A_i = (r_i - mean) / (std + eps) within each group of G (std with G - 1, as GRPO). A group whose
    rewards are all equal gets exactly 0: no policy-gradient signal (its answers still count in the loss's
    denominator and in its KL term). DeepSeekMath, section 4.1.2."""
    r_NG = rewards_B.view(-1, G)
    centred_NG = r_NG - r_NG.mean(dim=1, keepdim=True)
    equal_N1 = (r_NG.amax(dim=1, keepdim=True) == r_NG.amin(dim=1, keepdim=True))
    std_N1 = (centred_NG.pow(2).sum(dim=1, keepdim=True) / (G - 1)).sqrt()
    return torch.where(equal_N1, 0.0, centred_NG / (std_N1 + eps)).view(-1)


# ------------------------------------------------------------------------------------------ 4. the loss
def seq_mean_token_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor, n_seqs: int) -> torch.Tensor:
    """GRPO's aggregation (eq. 3's 1/G sum_i 1/|o_i| sum_t): each answer's mean over its own tokens, so a long
    answer weighs as much as a short one, summed over answers and divided by n_seqs, the minibatch's answers that
    have at least one token."""
    return ((x_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)).sum() / n_seqs


def k3(log_r_BT: torch.Tensor) -> torch.Tensor:
    """k3 = r - 1 - log r from x = log r (Schulman 2020): never negative, its mean over pi's samples is the KL.
    In float32, exp(x) - 1 - x cancels near r = 1 (3x the true value at x = 1e-4) and even expm1(x) - x loses
    digits, so small |x| take the series x^2/2 + x^3/6 + ... + x^6/720 (as minirl's checks.k3_of_log_ratio)."""
    x_BT = log_r_BT.clamp(-0.1, 0.1)  # the clamp keeps the unused branch's gradient finite
    series_BT = x_BT * x_BT * (1 / 2 + x_BT * (1 / 6 + x_BT * (1 / 24 + x_BT * (1 / 120 + x_BT / 720))))
    return torch.where(log_r_BT.abs() < 0.1, series_BT, torch.expm1(log_r_BT) - log_r_BT)


def grpo_loss(logprobs_BT, old_logprobs_BT, ref_logprobs_BT, advantages_B, mask_BT, *, eps: float, beta: float,
              n_seqs: int) -> tuple[torch.Tensor, dict]:
    """GRPO's objective (eq. 3), negated: the clipped surrogate plus beta times k3, an estimate of
    KL(policy || reference), both per token and aggregated by ``seq_mean_token_mean``."""
    A_B1 = advantages_B[:, None]
    # padding may hold any log-prob (even -inf): its log-ratio is set to 0 before exp, so nothing there is inf or
    # NaN, not even in the gradient (a mask multiplied in afterwards would give 0 * inf = NaN)
    ratio_BT = torch.exp(torch.where(mask_BT > 0, logprobs_BT - old_logprobs_BT, 0.0))  # rho = pi / pi_old
    surrogate_BT = torch.maximum(-A_B1 * ratio_BT, -A_B1 * ratio_BT.clamp(1 - eps, 1 + eps))  # PPO's clip, eq. 3
    log_r_BT = torch.where(mask_BT > 0, ref_logprobs_BT - logprobs_BT, 0.0)  # k3 = r - 1 - log r, r = ref / pi (eq. 4)
    k3_BT = k3(log_r_BT)
    pg_loss = seq_mean_token_mean(surrogate_BT, mask_BT, n_seqs)
    kl_loss = seq_mean_token_mean(k3_BT, mask_BT, n_seqs)
    # tokens whose gradient the clip removed: rho left the band on the side A pushes it to
    clipped_BT = ((ratio_BT > 1 + eps) & (A_B1 > 0) | (ratio_BT < 1 - eps) & (A_B1 < 0)) & (mask_BT > 0)
    return pg_loss + beta * kl_loss, {"kl": kl_loss.item(), "clip_frac": float(clipped_BT.sum() / mask_BT.sum())}


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict], args: Args, *, greedy: bool) -> float:
    """Held-out accuracy: the share of answers that are right, sampled (eval_samples per prompt) or greedy.
    Seeded on its own, so evaluating does not move training's random numbers."""
    k = 1 if greedy else args.eval_samples
    on_gpu = next(model.parameters()).is_cuda  # fork the generator the sampling draws from: CPU's, or the GPU's
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if on_gpu else []):
        torch.manual_seed(args.seed)
        ids_BL, _, mask_BT = sample(model, tokenizer, [r["prompt"] for r in rows], k, args.max_new_tokens,
                                    temperature=args.temperature, greedy=greedy)
    texts = tokenizer.batch_decode(ids_BL[:, -mask_BT.shape[1]:], skip_special_tokens=True)
    answers = [r["answer"] for r in rows for _ in range(k)]  # k answers per prompt, laid out prompt by prompt
    return sum(reward(t, a) for t, a in zip(texts, answers, strict=True)) / len(texts)


# ------------------------------------------------------------------------------------------ 5. update: the loop
def train(args: Args, model, tokenizer, train_rows: list[dict], on_update=None) -> list[dict]:
    """``args.steps`` GRPO steps on ``model``, in place; one log row per step. ``on_update(stats)`` is called after
    every optimiser step (tests compare those with the library's)."""
    torch.manual_seed(args.seed)  # the sampling draws
    gen = torch.Generator().manual_seed(args.seed)  # the prompts drawn and the minibatch order
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # the reference: the starting policy, frozen
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    N, G, log = args.prompts_per_step, args.group_size, []
    for step in tqdm(range(1, args.steps + 1), desc="grpo"):
        # 1. sample: N prompts (drawn with replacement), G completions each
        rows = [train_rows[i] for i in torch.randint(len(train_rows), (N,), generator=gen).tolist()]
        input_ids_BL, attention_mask_BL, mask_BT = sample(model, tokenizer, [r["prompt"] for r in rows], G,
                                                          args.max_new_tokens, temperature=args.temperature)
        n_prompt = input_ids_BL.shape[1] - mask_BT.shape[1]
        # 2. score
        texts = tokenizer.batch_decode(input_ids_BL[:, n_prompt:], skip_special_tokens=True)
        answers = [r["answer"] for r in rows for _ in range(G)]
        rewards_B = torch.tensor([reward(t, a) for t, a in zip(texts, answers, strict=True)])
        # 3. advantages, and the log-probs of pi_old and of the reference (no gradient)
        advantages_B = group_advantages(rewards_B, G, args.adv_eps).to(mask_BT.device)
        with torch.no_grad():
            old_logprobs_BT = token_logprobs(model, input_ids_BL, attention_mask_BL, n_prompt, args.temperature)
            ref_logprobs_BT = token_logprobs(ref_model, input_ids_BL, attention_mask_BL, n_prompt, args.temperature)
        # 4-5. loss and update, one optimiser step per minibatch of whole groups. pi_old's log-probs above came in
        # eval mode and these in train mode: the same numbers only because these models have no dropout (with
        # dropout, switch it off, or rho != 1 before any update)
        model.train()
        groups = torch.randperm(N, generator=gen)
        for chunk in groups.chunk(args.num_minibatches):
            rows_b = (chunk[:, None] * G + torch.arange(G)).flatten().to(mask_BT.device)
            logprobs_bT = token_logprobs(model, input_ids_BL[rows_b], attention_mask_BL[rows_b], n_prompt,
                                         args.temperature)
            n_seqs = int((mask_BT[rows_b].sum(-1) > 0).sum())
            loss, stats = grpo_loss(logprobs_bT, old_logprobs_BT[rows_b], ref_logprobs_BT[rows_b],
                                    advantages_B[rows_b], mask_BT[rows_b], eps=args.eps, beta=args.beta,
                                    n_seqs=n_seqs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            if on_update is not None:
                on_update({"loss": loss.item(), "grad_norm": float(grad_norm), **stats})
        # the step's row: the batch's mean reward; loss, kl and clip_frac of its last minibatch
        log.append({"step": step, "reward": float(rewards_B.mean()), "loss": loss.item(), **stats})
    return log


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")  # prompts end where answers start
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(args.device)
    train_rows, test_rows = load_jsonl(args.train_data), load_jsonl(args.test_data, args.eval_size)
    before = evaluate(model, tokenizer, test_rows, args, greedy=False), evaluate(model, tokenizer, test_rows, args,
                                                                                 greedy=True)
    log = train(args, model, tokenizer, train_rows)
    after = evaluate(model, tokenizer, test_rows, args, greedy=False), evaluate(model, tokenizer, test_rows, args,
                                                                                greedy=True)
    print(f"last step: reward {log[-1]['reward']:.3f}, kl {log[-1]['kl']:.4f}; {time.time() - t0:.0f} s")
    print(f"held-out accuracy on {len(test_rows)} prompts: sampled {before[0]:.3f} -> {after[0]:.3f}, "
          f"greedy {before[1]:.3f} -> {after[1]:.3f}")


if __name__ == "__main__":
    main()
