"""On-policy distillation in one file: the student samples, a teacher grades every token, the student moves to it.

    python -m minirl.minimal.distill                   # the toy: minirl's warm start learns from its shipped teacher
    python -m minirl.minimal.distill --model PATH --teacher PATH   # any two Hugging Face causal LMs, one tokenizer
    python -m minirl.minimal.distill --help            # every setting, with what it means

One step of on-policy distillation with the per-token reverse KL as the reward: Agarwal et al. 2024 (GKD, arXiv
2306.13649), algorithm 1 with lambda = 1 (always the student's own samples), and Thinking Machines, "On-Policy
Distillation" (2025), which grades each token by itself (discount 0). p is the student, q the teacher:

    1. sample     G completions per prompt from the student p                              completion_ids_BT, B = N * G
    2. grade      the teacher's log-prob of every sampled token, log q(y_t | x, y_<t)       teacher_logprobs_BT
    3. advantage  r_t = log q(y_t) - log p(y_t), minus the token's reverse KL (detached); A_t = sum_{s >= t}
                  gamma^(s - t) r_s, and gamma = 0 keeps each token's own reward                   advantages_BT
    4. loss       REINFORCE on the student's samples: -A_t log p(y_t), averaged over the batch's tokens. In
                  expectation, grad KL(p || q) of whole answers at gamma = 1; at gamma = 0 the KL of each position
    5. update     one AdamW step per batch (on-policy: pi / pi_old is exactly 1, so no clip), grad norm clipped to 1

The task's reward (the running sum after '#') is only logged: the teacher's grades are the whole signal. A student
equal to its teacher gets exactly zero gradient (every r_t is 0); a token the teacher finds likelier than the student
does is pushed up, one it finds less likely is pushed down.

The file imports torch, transformers and the standard library only: copy it and it runs. Shapes are in the names:
N prompts per step, G completions each, B = N * G completions, T completion tokens, P prompt tokens (left-padded),
L = P + T, V vocabulary. tests/test_minimal_distill.py runs it beside minirl's library loop
(``distill_loop.train_distill`` with ``distill="reverse_kl"``) from the same student, teacher, data and seed, and
checks that both compute the same loss, gradient norm and weights step by step.
"""

from __future__ import annotations

import argparse
import ast
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
    """the student: a Hugging Face causal LM (a folder or a hub name); default: minirl's toy warm start"""
    teacher: str = str(DATA / "warm_start" / "teacher-dense-cpu-s0")
    """the teacher, frozen, with the student's tokenizer; default: minirl's, the warm start after 150 GRPO steps"""
    train_data: str = str(DATA / "train.jsonl")
    """JSONL rows with a "prompt" and an integer "answer"; the default is the running-sums task ("7+5+9=")"""
    test_data: str = str(DATA / "test.jsonl")
    """held-out rows in the same form, scored before and after training"""
    seed: int = 0
    """seeds the prompts drawn and the sampling"""
    steps: int = 40
    """distillation steps; each samples a fresh batch from the student and makes one optimiser step"""
    prompts_per_step: int = 16
    """N: prompts drawn per step (with replacement)"""
    group_size: int = 8
    """G: answers sampled per prompt (each is graded on its own: no group baseline)"""
    max_new_tokens: int = 40
    """the longest answer; one that has not ended by then is cut (and graded as it is)"""
    temperature: float = 1.0
    """sampling temperature; both the student's and the teacher's log-probs are taken at it"""
    lr: float = 1e-4
    """AdamW's learning rate"""
    gamma: float = 0.0
    """discount of the reward to go: 0 grades each token by itself (Tinker's), 1 gives the sequence KL's gradient"""
    max_grad_norm: float = 1.0
    """the gradient's norm is clipped to this before each optimiser step"""
    eval_size: int = 256
    """held-out prompts scored before and after training"""
    eval_samples: int = 4
    """samples per held-out prompt for the sampled accuracy (greedy takes one)"""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    """where the student and the teacher run"""


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
    """1.0 if the completion is well formed and its number after '#' equals the answer, else 0.0 (logged and used
    for the held-out accuracy; distillation does not train on it)."""
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


# ------------------------------------------------------------------------------------------ 2. log-probs (both models)
def token_logprobs(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, P: int,
                   temperature: float) -> torch.Tensor:
    """(B, T) log p(y_t | prompt, y_<t) of each completion token, from logits / temperature, in float32.

    The logits at position t predict token t + 1, so the completion's come from positions P - 1 .. L - 2."""
    logits_BTV = model(input_ids=input_ids_BL, attention_mask=attention_mask_BL,
                       position_ids=positions(attention_mask_BL), use_cache=False).logits[:, P - 1:-1]
    logprobs_BTV = F.log_softmax(logits_BTV.float() / temperature, dim=-1)
    return logprobs_BTV.gather(-1, input_ids_BL[:, P:, None]).squeeze(-1)


# ------------------------------------------------------------------------------------------ 3. advantages
def rewards_to_go(rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B, T) A_t = sum_{s >= t} gamma^(s - t) r_s along each answer, 0 outside its tokens. gamma = 0: A_t = r_t
    (each token graded by itself, Tinker's choice); gamma = 1: REINFORCE's exact gradient of the sequence KL."""
    r_BT = torch.where(mask_BT > 0, rewards_BT, 0.0)
    running_B, out = torch.zeros_like(r_BT[:, 0]), []
    for t in reversed(range(r_BT.shape[1])):
        running_B = r_BT[:, t] + gamma * running_B  # A_t = r_t + gamma A_{t+1}
        out.append(running_B)
    return torch.where(mask_BT > 0, torch.stack(out[::-1], dim=1), 0.0)


# ------------------------------------------------------------------------------------------ 4. the loss
def distill_loss(logprobs_BT, teacher_logprobs_BT, mask_BT, *, gamma: float, n_tokens: float
                 ) -> tuple[torch.Tensor, dict]:
    """On-policy distillation's loss: REINFORCE with the teacher's per-token grade as the reward, summed over the
    tokens and divided by ``n_tokens`` (the batch's count of completion tokens: every token weighs the same).

    Its gradient is -sum_t A_t grad log p(y_t) / n_tokens; on the student's own samples that is, in expectation,
    the gradient of the reverse KL(p || q) (of whole answers at gamma = 1, of each position at gamma = 0)."""
    on_BT = mask_BT > 0
    rewards_BT = torch.where(on_BT, teacher_logprobs_BT - logprobs_BT, 0.0).detach()  # r_t = log q - log p
    advantages_BT = rewards_to_go(rewards_BT, mask_BT, gamma)  # A_t = sum_{s >= t} gamma^(s - t) r_s
    loss = -torch.where(on_BT, advantages_BT * logprobs_BT, 0.0).sum() / n_tokens  # -(1/N) sum_t A_t log p(y_t)
    kl = -rewards_BT.sum() / n_tokens  # mean of log p - log q over the tokens: the reverse KL on these samples
    return loss, {"kl": float(kl)}


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
    """``args.steps`` distillation steps of ``model`` (the student, in place) towards ``args.teacher``; one log row
    per step. ``on_update(stats)`` is called after every optimiser step (tests compare those with the library's)."""
    torch.manual_seed(args.seed)  # the sampling draws
    gen = torch.Generator().manual_seed(args.seed)  # the prompts drawn
    device = next(model.parameters()).device
    teacher = AutoModelForCausalLM.from_pretrained(args.teacher, dtype=torch.float32).to(device)
    teacher.eval().requires_grad_(False)  # graded against, never trained
    if teacher.config.vocab_size != model.config.vocab_size:
        raise ValueError(f"the teacher's vocabulary ({teacher.config.vocab_size}) must be the student's "
                         f"({model.config.vocab_size}): their log-probs are compared token by token")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    N, G, log = args.prompts_per_step, args.group_size, []
    for step in tqdm(range(1, args.steps + 1), desc="distill"):
        # 1. sample: N prompts (drawn with replacement), G completions each, from the student
        rows = [train_rows[i] for i in torch.randint(len(train_rows), (N,), generator=gen).tolist()]
        input_ids_BL, attention_mask_BL, mask_BT = sample(model, tokenizer, [r["prompt"] for r in rows], G,
                                                          args.max_new_tokens, temperature=args.temperature)
        n_prompt = input_ids_BL.shape[1] - mask_BT.shape[1]
        texts = tokenizer.batch_decode(input_ids_BL[:, n_prompt:], skip_special_tokens=True)
        answers = [r["answer"] for r in rows for _ in range(G)]
        task_rewards_B = torch.tensor([reward(t, a) for t, a in zip(texts, answers, strict=True)])  # logged only
        # 2. grade: the teacher's log-prob of every token the student sampled (no gradient)
        with torch.no_grad():
            teacher_logprobs_BT = token_logprobs(teacher, input_ids_BL, attention_mask_BL, n_prompt, args.temperature)
        # 3-4. the student's log-probs (with gradient), the per-token rewards to go and the loss
        model.train()
        logprobs_BT = token_logprobs(model, input_ids_BL, attention_mask_BL, n_prompt, args.temperature)
        n_tokens = max(float(mask_BT.sum()), 1.0)
        loss, stats = distill_loss(logprobs_BT, teacher_logprobs_BT, mask_BT, gamma=args.gamma, n_tokens=n_tokens)
        # 5. update: one optimiser step per batch, so the next batch is sampled from the weights just updated
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        if on_update is not None:
            on_update({"loss": loss.item(), "grad_norm": float(grad_norm), **stats})
        log.append({"step": step, "reward": float(task_rewards_B.mean()), "loss": loss.item(), **stats})
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
    print(f"last step: task reward {log[-1]['reward']:.3f}, kl to the teacher {log[-1]['kl']:.4f} nats per token; "
          f"{time.time() - t0:.0f} s")
    print(f"held-out accuracy on {len(test_rows)} prompts: sampled {before[0]:.3f} -> {after[0]:.3f}, "
          f"greedy {before[1]:.3f} -> {after[1]:.3f}")


if __name__ == "__main__":
    main()
