"""PPO in one file: a critic predicts each token's value, GAE turns rewards into advantages, the clip keeps steps small.

    python -m minirl.minimal.ppo                       # the toy, from minirl's shipped warm start
    python -m minirl.minimal.ppo --model PATH          # any Hugging Face causal LM (a folder or a hub name)
    python -m minirl.minimal.ppo --help                # every setting, with what it means

One PPO step in its RLHF form (Ziegler et al. 2019; Ouyang et al. 2022, eq. 2: the KL penalty in the reward):

    1. sample     G completions per prompt from the current policy pi_old            completion_ids_BT, B = N * G
    2. reward     per token: the 0/1 score on the answer's last token, minus beta * k1 on every token, with
                  k1 = log pi_old - log pi_ref (a KL estimate; the reference: the starting model)   rewards_BT
    3. advantage  the critic's V(s_t); GAE (Schulman et al. 2016, eq. 16): delta_t = r_t + gamma V_{t+1} - V_t,
                  A_t = delta_t + gamma lam A_{t+1}, whitened over the batch; the critic's target R_t = A_t + V_t
    4. loss       per token: -min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = pi / pi_old (Schulman et al. 2017,
                  eq. 7), averaged over the minibatch's tokens; plus the critic's 0.5 max((V - R)^2, (V_clip - R)^2)
    5. update     AdamW on each minibatch of groups, for the policy and the critic, each gradient norm clipped to 1

The file imports torch, transformers and the standard library only: copy it and it runs. Shapes are in the names:
N prompts per step, G completions each, B = N * G completions, T completion tokens, P prompt tokens (left-padded),
L = P + T, V vocabulary, H hidden size. tests/test_minimal_ppo.py runs it beside minirl's library loop
(``rl.train_rl`` with ``make_config("ppo")``) from the same model, data and seed, and checks that both compute the
same loss, gradient norm and weights (the policy's and the critic's) step by step.
"""

from __future__ import annotations

import argparse
import ast
import copy
import inspect
import json
import os
import random
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
    """a Hugging Face causal LM (a save_pretrained folder or a hub name); default: minirl's toy warm start"""
    train_data: str = str(DATA / "train.jsonl")
    """JSONL rows with a "prompt" and an integer "answer"; the default is the running-sums task ("7+5+9=")"""
    test_data: str = str(DATA / "test.jsonl")
    """held-out rows in the same form, scored before and after training"""
    seed: int = 0
    """seeds the prompts drawn, the critic's head, the sampling and the minibatch order"""
    steps: int = 150
    """PPO steps; each samples a fresh batch and makes epochs x num_minibatches optimiser steps"""
    prompts_per_step: int = 16
    """N: prompts drawn per step (with replacement)"""
    group_size: int = 8
    """G: answers sampled per prompt (PPO needs no group: the critic is the baseline; a batch is N x G answers)"""
    max_new_tokens: int = 40
    """the longest answer; one that has not ended by then is cut (and scored as it is)"""
    temperature: float = 1.0
    """sampling temperature; the log-probs are taken at the same temperature, so rho = 1 before the first update"""
    lr: float = 1e-4
    """AdamW's learning rate for the policy"""
    value_lr: float = 1e-3
    """AdamW's learning rate for the critic (its own parameter group: the two share no weight)"""
    eps: float = 0.2
    """PPO's clip range: rho is kept in [1 - eps, 1 + eps] where clipping lowers the objective"""
    value_clip: float = 0.2
    """the critic's prediction may move at most this far from its rollout-time value before its loss stops pulling"""
    beta: float = 0.05
    """weight of the KL penalty beta * k1 subtracted from every token's reward (the reference: the starting model)"""
    gamma: float = 1.0
    """discount of future rewards"""
    lam: float = 0.95
    """GAE's lambda: 0 trusts the critic's next value (low variance), 1 sums the real rewards (no bias)"""
    epochs: int = 1
    """passes over each batch (PPO's K epochs), each in a fresh random order of minibatches"""
    num_minibatches: int = 2
    """optimiser steps per epoch, each on a random share of the groups (a prompt's G answers stay together)"""
    max_grad_norm: float = 1.0
    """the policy's and the critic's gradient norms are each clipped to this before each optimiser step"""
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


# ------------------------------------------------------------------------------------------ the data and the reward
def load_jsonl(path: str, n: int | None = None) -> list[dict]:
    """The rows of a JSONL file (the first ``n``), each with a "prompt" and an "answer"."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows, 1):
        if not isinstance(row.get("prompt"), str) or "answer" not in row:
            raise ValueError(f"{path}, line {i}: needs a string 'prompt' and an 'answer'")
    return rows[:n]


ANSWER = re.compile(r"^[0-9+=;]*#(-?[0-9]+)$")  # a scratchpad of sums, then '#' and the answer: "7+5=12;12+9=21#21"


def reward(completion: str, answer) -> float:
    """1.0 if the completion is well formed and its number after '#' equals the answer, else 0.0 (verifiable)."""
    m = ANSWER.match(completion.strip())
    return float(m is not None and int(m.group(1)) == int(answer))


# ------------------------------------------------------------------------------------------ 1. sample
def positions(mask_BL: torch.Tensor) -> torch.Tensor:
    """(B, L) position ids that skip the left padding: the first real token is position 0."""
    return (mask_BL.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], G: int, max_new_tokens: int, *, temperature: float = 1.0,
           greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """G completions per prompt by ancestral sampling from softmax(logits / temperature), reusing the KV cache.

    Returns (input_ids_BL, attention_mask_BL, completion_mask_BT): prompt and completion side by side
    (L = P + T; prompts left-padded), and 1 on each completion's tokens up to and including its end token.
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


# ------------------------------------------------------------------------------------------ log-probs
def token_logprobs(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, P: int,
                   temperature: float) -> torch.Tensor:
    """(B, T) log pi(y_t | prompt, y_<t) of each completion token, from logits / temperature, in float32.

    The logits at position t predict token t + 1, so the completion's come from positions P - 1 .. L - 2."""
    logits_BTV = model(input_ids=input_ids_BL, attention_mask=attention_mask_BL,
                       position_ids=positions(attention_mask_BL), use_cache=False).logits[:, P - 1:-1]
    logprobs_BTV = F.log_softmax(logits_BTV.float() / temperature, dim=-1)
    return logprobs_BTV.gather(-1, input_ids_BL[:, P:, None]).squeeze(-1)


# ------------------------------------------------------------------------------------------ the critic
class Critic(torch.nn.Module):
    """PPO's value model: a copy of the policy's transformer (without its LM head) and a scalar head, V(s_t) for
    every token. Copying the warm-started policy is the usual RLHF choice: the critic starts with features that
    already know the task. The head starts at V = 0, so no confident wrong values at the first step."""

    def __init__(self, policy):
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)  # the decoder without the LM head
        self.head = torch.nn.Linear(policy.config.hidden_size, 1)  # its random init draws from torch's RNG, then 0
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, P: int) -> torch.Tensor:
        """(B, T) V(s_t) of the state before each completion token: the value read at the position that predicts it."""
        h_BLH = self.backbone(input_ids=input_ids_BL, attention_mask=attention_mask_BL,
                              position_ids=positions(attention_mask_BL), use_cache=False).last_hidden_state
        return self.head(h_BLH).squeeze(-1).float()[:, P - 1:-1]


# ------------------------------------------------------------------------------------------ 2-3. rewards, advantages
def token_rewards(rewards_B: torch.Tensor, kl_BT: torch.Tensor, mask_BT: torch.Tensor, beta: float) -> torch.Tensor:
    """(B, T) the RLHF reward: each answer's score on its last token, minus beta * k1 on every token (detached: it
    reaches the policy through the advantages only, the unbiased gradient of KL(pi || ref) for k1)."""
    rewards_BT = torch.zeros_like(mask_BT)
    rewards_BT[torch.arange(len(mask_BT)), mask_BT.sum(-1).long() - 1] = rewards_B.to(mask_BT)  # the outcome at the end
    return rewards_BT - beta * kl_BT  # r_t = score [t = last] - beta (log pi_old - log ref)   (Ouyang et al. eq. 2)


def gae(rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages_BT, returns_BT) by Generalised Advantage Estimation, backwards over the tokens (eq. 16):
    delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lam A_{t+1}. The value after an answer's last
    token is 0 (the episode ends there). returns = A + V, the critic's regression target. rewards_BT and values_BT
    must be 0 outside the mask."""
    advantages_BT = torch.zeros_like(rewards_BT)
    next_value_B = next_adv_B = torch.zeros_like(rewards_BT[:, 0])
    for t in reversed(range(rewards_BT.shape[1])):
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]  # the TD error
        advantages_BT[:, t] = (delta_B + gamma * lam * next_adv_B) * mask_BT[:, t]  # A_t = sum_l (gamma lam)^l delta
        next_value_B, next_adv_B = values_BT[:, t] * mask_BT[:, t], advantages_BT[:, t]
    return advantages_BT, (advantages_BT + values_BT) * mask_BT


def whiten(x_BT: torch.Tensor, mask_BT: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(B, T) x shifted and scaled to mean 0, variance 1 over the batch's valid tokens (std with n - 1); 0 outside."""
    n = mask_BT.sum()
    mean = (x_BT * mask_BT).sum() / n
    var = (((x_BT - mean) * mask_BT) ** 2).sum() / (n - 1)
    return (x_BT - mean) * torch.rsqrt(var + eps) * mask_BT


# ------------------------------------------------------------------------------------------ 4. the loss
def ppo_loss(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, *, eps: float, n_tokens: float
             ) -> tuple[torch.Tensor, dict]:
    """PPO's clipped surrogate (eq. 7), negated, per token, summed over valid tokens and divided by ``n_tokens``
    (the whole minibatch's count: every token weighs the same)."""
    A_BT = advantages_BT
    ratio_BT = torch.exp(torch.where(mask_BT > 0, logprobs_BT - old_logprobs_BT, 0.0))  # rho = pi / pi_old
    surrogate_BT = torch.maximum(-A_BT * ratio_BT, -A_BT * ratio_BT.clamp(1 - eps, 1 + eps))  # -min(rho A, clip A)
    loss = torch.where(mask_BT > 0, surrogate_BT, 0.0).sum() / n_tokens
    # tokens whose gradient the clip removed: rho left the band on the side A pushes it to
    clipped_BT = ((ratio_BT > 1 + eps) & (A_BT > 0) | (ratio_BT < 1 - eps) & (A_BT < 0)) & (mask_BT > 0)
    return loss, {"clip_frac": float(clipped_BT.sum() / mask_BT.sum())}


def value_loss(values_BT, old_values_BT, returns_BT, mask_BT, *, clip: float, n_tokens: float) -> torch.Tensor:
    """The critic's clipped regression: 0.5 max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -c, c),
    summed over valid tokens, divided by ``n_tokens`` (OpenAI's lm-human-preferences, Ziegler et al. 2019; the max
    makes the clip pessimistic)."""
    values_BT = torch.where(mask_BT > 0, values_BT, 0.0)
    clipped_BT = old_values_BT + torch.clamp(values_BT - old_values_BT, -clip, clip)
    per_token_BT = 0.5 * torch.maximum((values_BT - returns_BT) ** 2, (clipped_BT - returns_BT) ** 2)
    return torch.where(mask_BT > 0, per_token_BT, 0.0).sum() / n_tokens


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict], args: Args, *, greedy: bool) -> float:
    """Held-out accuracy: the share of answers that are right, sampled (eval_samples per prompt) or greedy.
    Seeded on its own, so evaluating does not move training's random numbers."""
    k = 1 if greedy else args.eval_samples
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        ids_BL, _, mask_BT = sample(model, tokenizer, [r["prompt"] for r in rows], k, args.max_new_tokens,
                                    temperature=args.temperature, greedy=greedy)
    texts = tokenizer.batch_decode(ids_BL[:, -mask_BT.shape[1]:], skip_special_tokens=True)
    answers = [r["answer"] for r in rows for _ in range(k)]  # k answers per prompt, laid out prompt by prompt
    return sum(reward(t, a) for t, a in zip(texts, answers, strict=True)) / len(texts)


# ------------------------------------------------------------------------------------------ the training loop
def train(args: Args, model, tokenizer, train_rows: list[dict], on_update=None) -> list[dict]:
    """``args.steps`` PPO steps on ``model``, in place; one log row per step. ``on_update(stats)`` is called after
    every optimiser step (tests compare those with the library's)."""
    random.seed(args.seed)
    torch.manual_seed(args.seed)  # the critic head's initial draw (then zeroed), then the sampling draws
    gen = torch.Generator().manual_seed(args.seed)  # the prompts drawn and the minibatch order
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # the reference: the starting policy, frozen
    critic = Critic(model).to(next(model.parameters()).device)
    optimizer = torch.optim.AdamW([{"params": model.parameters(), "lr": args.lr},
                                   {"params": critic.parameters(), "lr": args.value_lr}], weight_decay=0.0)
    N, G, log = args.prompts_per_step, args.group_size, []
    for step in tqdm(range(1, args.steps + 1), desc="ppo"):
        # 1. sample: N prompts (drawn with replacement), G completions each
        rows = [train_rows[i] for i in torch.randint(len(train_rows), (N,), generator=gen).tolist()]
        input_ids_BL, attention_mask_BL, mask_BT = sample(model, tokenizer, [r["prompt"] for r in rows], G,
                                                          args.max_new_tokens, temperature=args.temperature)
        n_prompt = input_ids_BL.shape[1] - mask_BT.shape[1]
        # 2. reward: the 0/1 score at each answer's end, the KL penalty on every token (no gradient)
        texts = tokenizer.batch_decode(input_ids_BL[:, n_prompt:], skip_special_tokens=True)
        answers = [r["answer"] for r in rows for _ in range(G)]
        rewards_B = torch.tensor([reward(t, a) for t, a in zip(texts, answers, strict=True)])
        with torch.no_grad():
            old_logprobs_BT = token_logprobs(model, input_ids_BL, attention_mask_BL, n_prompt, args.temperature)
            ref_logprobs_BT = token_logprobs(ref_model, input_ids_BL, attention_mask_BL, n_prompt, args.temperature)
            kl_BT = torch.where(mask_BT > 0, old_logprobs_BT - ref_logprobs_BT, 0.0)  # k1 = log pi_old - log ref
            rewards_BT = token_rewards(rewards_B, kl_BT, mask_BT, args.beta)
            # 3. advantages: the critic's values, GAE, whitened over the batch
            old_values_BT = torch.where(mask_BT > 0, critic(input_ids_BL, attention_mask_BL, n_prompt), 0.0)
            advantages_BT, returns_BT = gae(rewards_BT, old_values_BT, mask_BT, args.gamma, args.lam)
            advantages_BT = whiten(advantages_BT, mask_BT)
        # 4-5. loss and update, one optimiser step per minibatch of whole groups
        model.train()
        critic.train()
        for _ in range(args.epochs):
            for chunk in torch.randperm(N, generator=gen).chunk(args.num_minibatches):
                b = (chunk[:, None] * G + torch.arange(G)).flatten().to(mask_BT.device)  # the minibatch's rows
                logprobs_bT = token_logprobs(model, input_ids_BL[b], attention_mask_BL[b], n_prompt, args.temperature)
                values_bT = critic(input_ids_BL[b], attention_mask_BL[b], n_prompt)
                n_tokens = max(float(mask_BT[b].sum()), 1.0)
                loss, stats = ppo_loss(logprobs_bT, old_logprobs_BT[b], advantages_BT[b], mask_BT[b], eps=args.eps,
                                       n_tokens=n_tokens)
                v_loss = value_loss(values_bT, old_values_BT[b], returns_BT[b], mask_BT[b], clip=args.value_clip,
                                    n_tokens=n_tokens)
                optimizer.zero_grad(set_to_none=True)
                (loss + v_loss).backward()  # the critic shares no weight with the policy: one backward serves both
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                torch.nn.utils.clip_grad_norm_(critic.parameters(), args.max_grad_norm)
                optimizer.step()
                stats = {"loss": loss.item(), "value_loss": v_loss.item(), "grad_norm": float(grad_norm), **stats}
                if on_update is not None:
                    on_update(stats)
        log.append({"step": step, "reward": float(rewards_B.mean()), "kl": float(kl_BT.sum() / mask_BT.sum()),
                    **stats})
    return log


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.time()
    torch.manual_seed(args.seed)
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
    print(f"last step: reward {log[-1]['reward']:.3f}, kl {log[-1]['kl']:.4f}, value loss "
          f"{log[-1]['value_loss']:.4f}; {time.time() - t0:.0f} s")
    print(f"held-out accuracy on {len(test_rows)} prompts: sampled {before[0]:.3f} -> {after[0]:.3f}, "
          f"greedy {before[1]:.3f} -> {after[1]:.3f}")


if __name__ == "__main__":
    main()
