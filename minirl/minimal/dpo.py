"""DPO in one file: sample G answers per prompt, pair a right one with a wrong one, raise the pair's margin.

    python -m minirl.minimal.dpo                       # the toy, from minirl's shipped warm start
    python -m minirl.minimal.dpo --pairs PAIRS.jsonl   # your own pairs: rows with "prompt", "chosen", "rejected"
    python -m minirl.minimal.dpo --model PATH          # any Hugging Face causal LM (a folder or a hub name)
    python -m minirl.minimal.dpo --help                # every setting, with what it means

DPO (Rafailov et al. 2023, eq. 7) on pairs from the model's own samples, the paper's offline pipeline: sample from
the starting model, label, then optimise the policy against that model, frozen, as the reference:

    1. sample     G completions for each of N training prompts, once, from the starting model    completion_ids_BT
    2. pair       a 0/1 reward; in each group the k-th right answer is paired with the k-th wrong one  pairs
    3. log-probs  log pi(y | x), summed over the completion's tokens, under the policy and the reference   logps_2b
    4. loss       -log sigmoid(beta * ((log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)))), mean over pairs
    5. update     AdamW, one optimiser step per batch of pairs (epochs of seeded shuffles), grad norm clipped to 1

The file imports torch, transformers and the standard library only: copy it and it runs. Shapes are in the names:
B completions, b pairs, T completion tokens, P prompt tokens, V vocabulary. tests/test_minimal_dpo.py runs it beside
minirl's library (``preference_data.sample_preference_data``, then ``preference_loop.train_preference`` with
method "dpo") from the same model, data and seed, and checks the same pairs, loss, gradient norm and weights.
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
    """a Hugging Face causal LM (a save_pretrained folder or a hub name); default: minirl's toy warm start"""
    train_data: str = str(DATA / "train.jsonl")
    """JSONL rows with a "prompt" and an integer "answer"; the default is the running-sums task ("7+5+9=")"""
    test_data: str = str(DATA / "test.jsonl")
    """held-out rows in the same form, scored before and after training"""
    pairs: str = ""
    """JSONL rows with "prompt", "chosen" and "rejected" to train on instead of sampling pairs ("": sample them)"""
    seed: int = 0
    """seeds the prompts drawn, the sampling and the order of the pairs"""
    n_prompts: int = 256
    """N: training prompts drawn (without replacement) and sampled, once, to make the pairs"""
    group_size: int = 8
    """G: answers sampled per prompt; the pairs are made inside each group"""
    sample_batch: int = 64
    """prompts per sampling call (memory only; each call draws its own random numbers in turn)"""
    max_new_tokens: int = 40
    """the longest answer; one that has not ended by then is cut (and given an end token in its pair)"""
    temperature: float = 1.0
    """sampling temperature; the log-probs are taken at the same temperature"""
    steps: int = 20
    """optimiser steps, one per batch of pairs"""
    batch_size: int = 32
    """b: pairs per step, read in order from seeded shuffles of all the pairs (a new shuffle when they run out)"""
    lr: float = 1e-5
    """AdamW's learning rate"""
    beta: float = 0.1
    """inverse temperature of DPO's implicit reward beta * log(pi / ref): larger keeps the policy closer to ref"""
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


# ------------------------------------------------------------------------------------------ the data and the reward
def load_jsonl(path: str, n: int | None = None, columns: tuple[str, ...] = ("prompt", "answer")) -> list[dict]:
    """The rows of a JSONL file (the first ``n``); each must have ``columns``, the "prompt" a string."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for i, row in enumerate(rows, 1):
        if any(c not in row for c in columns) or not isinstance(row["prompt"], str):
            raise ValueError(f"{path}, line {i}: needs {', '.join(columns)}")
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
           greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """G completions per prompt by ancestral sampling from softmax(logits / temperature), reusing the KV cache.

    Returns (input_ids_BL, completion_mask_BT): prompt and completion side by side (L = P + T; prompts
    left-padded), and 1 on each completion's tokens up to and including its end token."""
    model.eval()
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    prompt_ids_BP = enc.input_ids.repeat_interleave(G, dim=0)  # rows laid out group by group
    eos = torch.tensor(end_tokens(model, tokenizer), device=device)
    # transformers 5.2x names the forward's cache argument `cache` (before: `past_key_values`)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids, mask = prompt_ids_BP, enc.attention_mask.repeat_interleave(G, dim=0)
    pos, cache = positions(mask), None
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
    return torch.cat([prompt_ids_BP, completion_ids_BT], dim=1), completion_mask_BT


def end_tokens(model, tokenizer) -> list[int]:
    """Every id that ends an answer: the tokenizer's end token and those of the checkpoint's generation config."""
    ids = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(extra if isinstance(extra, list) else [extra])
    return sorted(i for i in ids if i is not None)


# ------------------------------------------------------------------------------------------ 2. pair
def sample_pairs(model, tokenizer, train_rows: list[dict], args: Args) -> tuple[list[dict], float]:
    """Preference pairs from the model's own samples, and the share of samples that were right.

    ``n_prompts`` rows drawn without replacement, G samples each; in each group the k-th right completion is paired
    with the k-th wrong one, so a group gives min(#right, #wrong) pairs and no completion is used twice."""
    gen = torch.Generator().manual_seed(args.seed)
    rows = [train_rows[i] for i in torch.randperm(len(train_rows), generator=gen)[:args.n_prompts].tolist()]
    G, texts = args.group_size, []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        for i in range(0, len(rows), args.sample_batch):
            ids_BL, mask_BT = sample(model, tokenizer, [r["prompt"] for r in rows[i:i + args.sample_batch]], G,
                                     args.max_new_tokens, temperature=args.temperature)
            texts += tokenizer.batch_decode(ids_BL[:, -mask_BT.shape[1]:], skip_special_tokens=True)
    rewards_B = [reward(t, rows[j // G]["answer"]) for j, t in enumerate(texts)]
    pairs = []
    for g, row in enumerate(rows):
        group = range(g * G, (g + 1) * G)
        right = [texts[j] for j in group if rewards_B[j] > 0.5]
        wrong = [texts[j] for j in group if rewards_B[j] <= 0.5]
        pairs += [{"prompt": row["prompt"], "chosen": c, "rejected": r} for c, r in zip(right, wrong, strict=False)]
    return pairs, sum(rewards_B) / len(rewards_B)


# ------------------------------------------------------------------------------------------ 3. log-probs
def encode(tokenizer, prompts: list[str], completions: list[str], device) -> tuple[torch.Tensor, ...]:
    """(input_ids_BL, attention_mask_BL, completion_mask_BT, P): each prompt (with its start token) left-padded to P,
    each completion re-tokenized from its text with an end token appended, right-padded to T; as ``sample`` lays
    out a batch, so a sampled answer's log-probs are those it was sampled with (when its text tokenizes back to the
    tokens drawn, as the toy's always does)."""
    p_ids = [tokenizer(p).input_ids for p in prompts]
    c_ids = [tokenizer(c, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for c in completions]
    P, T, pad = max(map(len, p_ids)), max(map(len, c_ids)), tokenizer.pad_token_id
    ids, am, cm = [], [], []
    for p, c in zip(p_ids, c_ids, strict=True):
        ids.append([pad] * (P - len(p)) + p + c + [pad] * (T - len(c)))
        am.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)))
        cm.append([1.0] * len(c) + [0.0] * (T - len(c)))
    return torch.tensor(ids, device=device), torch.tensor(am, device=device), torch.tensor(cm, device=device), P


def sequence_logprobs(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                      completion_mask_BT: torch.Tensor, P: int, temperature: float) -> torch.Tensor:
    """(B,) log pi(y | x) = sum_t log pi(y_t | x, y_<t) over each completion's tokens (nats), in float32.

    The logits at position t predict token t + 1; the LM head runs on the last T + 1 positions only, and the
    completion's logits are positions P - 1 .. L - 2."""
    T = input_ids_BL.shape[1] - P
    logits_BTV = model(input_ids=input_ids_BL, attention_mask=attention_mask_BL, use_cache=False,
                       position_ids=positions(attention_mask_BL), logits_to_keep=T + 1).logits[:, :-1]
    logprobs_BTV = F.log_softmax(logits_BTV.float() / temperature, dim=-1)
    logprobs_BT = logprobs_BTV.gather(-1, input_ids_BL[:, P:, None]).squeeze(-1)
    return torch.where(completion_mask_BT > 0, logprobs_BT, 0.0).sum(-1)  # padding's log-probs never read


# ------------------------------------------------------------------------------------------ 4. the loss
def dpo_loss(chosen_b: torch.Tensor, rejected_b: torch.Tensor, ref_chosen_b: torch.Tensor,
             ref_rejected_b: torch.Tensor, *, beta: float) -> tuple[torch.Tensor, dict]:
    """DPO's loss (eq. 7), the mean over b pairs of -log sigmoid(beta * h), with the log-ratio margin
    h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l)) in nats; ln 2 when pi = ref."""
    h_b = (chosen_b - ref_chosen_b) - (rejected_b - ref_rejected_b)
    loss = -F.logsigmoid(beta * h_b).mean()  # eq. 7
    h_b = h_b.detach()
    return loss, {"margin": float(beta * h_b.mean()), "accuracy": float((h_b > 0).float().mean())}


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict], args: Args, *, greedy: bool) -> float:
    """Held-out accuracy: the share of answers that are right, sampled (eval_samples per prompt) or greedy.
    Seeded on its own, so evaluating does not move training's random numbers."""
    k = 1 if greedy else args.eval_samples
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        ids_BL, mask_BT = sample(model, tokenizer, [r["prompt"] for r in rows], k, args.max_new_tokens,
                                 temperature=args.temperature, greedy=greedy)
    texts = tokenizer.batch_decode(ids_BL[:, -mask_BT.shape[1]:], skip_special_tokens=True)
    answers = [r["answer"] for r in rows for _ in range(k)]  # k answers per prompt, laid out prompt by prompt
    return sum(reward(t, a) for t, a in zip(texts, answers, strict=True)) / len(texts)


# ------------------------------------------------------------------------------------------ the training loop
def train(args: Args, model, tokenizer, train_rows: list[dict], on_update=None) -> list[dict]:
    """``args.steps`` DPO steps on ``model``, in place, on pairs sampled from it (or read from ``args.pairs``); one
    log row per step. ``on_update(stats)`` is called after every optimiser step (tests compare those with the
    library's)."""
    torch.manual_seed(args.seed)
    # 1-2. sample and pair, once, from the starting model
    if args.pairs:
        pairs, right = load_jsonl(args.pairs, columns=("prompt", "chosen", "rejected")), float("nan")
    else:
        pairs, right = sample_pairs(model, tokenizer, train_rows, args)
    if not pairs:
        raise ValueError("no pairs: no group held both a right and a wrong answer (sample more prompts or answers)")
    print(f"{len(pairs)} pairs" + (f" from {args.n_prompts} x {args.group_size} samples, {right:.1%} right"
                                   if not args.pairs else f" from {args.pairs}"))
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # the reference: the starting policy, frozen
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)  # the order of the pairs
    order, b, log = torch.empty(0, dtype=torch.long), args.batch_size, []
    model.train()
    for step in tqdm(range(1, args.steps + 1), desc="dpo"):
        while len(order) < b:  # epochs of seeded shuffles, read in order
            order = torch.cat([order, torch.randperm(len(pairs), generator=gen)])
        batch, order = [pairs[i] for i in order[:b].tolist()], order[b:]
        # 3. log-probs of the b chosen then the b rejected completions, one forward each for policy and reference
        ids_BL, attn_BL, mask_BT, P = encode(tokenizer, [p["prompt"] for p in batch] * 2,
                                             [p["chosen"] for p in batch] + [p["rejected"] for p in batch],
                                             next(model.parameters()).device)
        logps_2b = sequence_logprobs(model, ids_BL, attn_BL, mask_BT, P, args.temperature)
        with torch.no_grad():
            ref_logps_2b = sequence_logprobs(ref_model, ids_BL, attn_BL, mask_BT, P, args.temperature)
        # 4. the loss
        loss, stats = dpo_loss(logps_2b[:b], logps_2b[b:], ref_logps_2b[:b], ref_logps_2b[b:], beta=args.beta)
        # 5. the update
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        if on_update is not None:
            on_update({"loss": loss.item(), "grad_norm": float(grad_norm), **stats})
        log.append({"step": step, "loss": loss.item(), "grad_norm": float(grad_norm), **stats})
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
    print(f"last step: loss {log[-1]['loss']:.4f}, margin {log[-1]['margin']:.3f}, pairs ranked right "
          f"{log[-1]['accuracy']:.3f}; {time.time() - t0:.0f} s")
    print(f"held-out accuracy on {len(test_rows)} prompts: sampled {before[0]:.3f} -> {after[0]:.3f}, "
          f"greedy {before[1]:.3f} -> {after[1]:.3f}")


if __name__ == "__main__":
    main()
