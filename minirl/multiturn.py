"""Multi-turn episodes: the model writes a turn, an environment answers, until the environment is done or a turn limit.

An environment has two methods, in the spirit of TRL's ``environment_factory`` and SkyRL's gym:
``reset(prompt, **columns) -> str`` (text put after the prompt before the first turn, "" for none) and
``step(completion) -> StepResult(observation, reward, done)``. ``generate_episodes`` alternates them with the model:

    prompt | model turn 1 ... EOS | observation 1 | model turn 2 ... EOS | observation 2 | ... | model turn k ... EOS

Token in, token out: the context of each turn is exactly the tokens already in the episode plus the observation's
tokens (``tokenizer(observation, add_special_tokens=False)``); the model's own tokens are never decoded and encoded
again, which with a BPE tokenizer could give other tokens than the ones sampled (``tests/test_multiturn.py`` shows
one). Every completion token records who wrote it (``Rollout.author``: 1 the model, 0 the environment) and its turn
(``Rollout.turn``, 1-based).

The masks. ``Rollout.completion_mask`` is the model's tokens only, and the attention mask is every real token: the
observations are read by the model (they are its context) but carry no loss, no ratio, no KL, no entropy term and no
length in any denominator, because everything downstream (``rl.update_minibatch``, the importance weights, the
aggregations, the logged lengths) reads ``completion_mask``.

Rewards and advantages over an episode (written down here, tested by hand in ``tests/test_multiturn.py``):
- the episode's reward is the sum of its turns' rewards (``StepResult.reward``), the outcome of the episode;
  GRPO's group advantage compares the G episodes of one prompt and is put on every model token of the episode;
- per turn, ``turn_rewards_on_tokens`` puts turn k's reward on turn k's last model token, and ``episode_gae`` runs
  GAE over the model's tokens alone, in order: an observation is part of the transition from one model token to the
  next (the environment's dynamics), not a step of the policy, so it has no value and no advantage.

The environments of the toy: ``RetryEnv`` (running sums, retry with feedback, reward decayed per retry) and
``CalculatorEnv`` (the model may end a turn with an open sum ``a+b=``; the environment answers with the sum).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from . import tasks
from .advantages import gae
from .chat import encode_prompts
from .checks import ndim, same_shape
from .decoding import sample_tokens
from .rollout import Rollout, check_tokenizer, eos_token_ids


@dataclass
class StepResult:
    """What an environment returns after a model turn: the text it answers with, the turn's reward, and whether the
    episode is over (then ``observation`` is not read)."""

    observation: str
    reward: float
    done: bool


class Environment(Protocol):
    """The interface ``generate_episodes`` drives; one instance per episode (``env_factory()`` makes it)."""

    def reset(self, prompt: str, **columns) -> str: ...

    def step(self, completion: str) -> StepResult: ...


# ----------------------------------------------------------------------------------------------- the environments
def worked_steps(prompt: str) -> list[str]:
    """The partial sums of a running-sums prompt, as the task writes them: "7+5+9=" -> ["7+5=12", "12+9=21"]."""
    terms = [int(t) for t in prompt.rstrip("=").split("+")]
    steps, total = [], terms[0]
    for t in terms[1:]:
        steps.append(f"{total}+{t}={total + t}")
        total += t
    return steps


def first_wrong_hint(prompt: str, completion: str) -> str:
    """The correct partial sums up to and including the first one ``completion`` got wrong (or left out), ending with
    ";" (or "#" after the last one): what ``RetryEnv(hint=True)`` tells the model.

    Example: "7+5+9=", "7+5=13;13+9=22#22" -> "7+5=12;"; "7+5=12;12+9=22#22" -> "7+5=12;12+9=21#";
    "7+5=12;12+9=21#20" -> "7+5=12;12+9=21#" (every step right, the answer wrong).
    """
    steps = worked_steps(prompt)
    written = completion.split("#")[0].split(";")
    k = next((i for i, s in enumerate(steps) if i >= len(written) or written[i] != s), len(steps) - 1)
    return ";".join(steps[:k + 1]) + (";" if k + 1 < len(steps) else "#")


class RetryEnv:
    """Running sums with retries: a right answer ends the episode with reward ``decay ** (turn - 1)`` (1, 0.5, 0.25
    for decay 0.5); a wrong one gets the problem again, and the episode ends with 0 after ``max_turns`` tries.

    The problem comes back as a fresh document: "<bos>" + the prompt (``hint=False``, "wrong, try again"), followed
    with ``hint=True`` by the correct partial sums up to the first wrong one (``first_wrong_hint``), which the model
    continues. A turn is scored with the hint in front of it (the hint plus the turn make one completion).

    Example (hint): prompt "7+5+9=", turn 1 "7+5=13;13+9=22#22" -> observation "<bos>7+5+9=7+5=12;", reward 0;
    turn 2 "12+9=21#21" -> scored as "7+5=12;12+9=21#21": reward 0.5, done.
    """

    def __init__(self, *, max_turns: int = 2, decay: float = 0.5, hint: bool = True, bos: str = "<bos>"):
        if max_turns < 1 or not 0 < decay <= 1:
            raise ValueError(f"need max_turns >= 1 and 0 < decay <= 1, got {max_turns}, {decay}")
        self.max_turns, self.decay, self.hint, self.bos = max_turns, decay, hint, bos

    def reset(self, prompt: str, answer: str, **columns) -> str:
        self.prompt, self.answer, self.turn, self.partial = prompt, answer, 0, ""
        return ""

    def step(self, completion: str) -> StepResult:
        self.turn += 1
        written = self.partial + completion
        if tasks.score(written, self.answer).reward == 1.0:
            return StepResult("", self.decay ** (self.turn - 1), True)
        if self.turn >= self.max_turns:
            return StepResult("", 0.0, True)
        self.partial = first_wrong_hint(self.prompt, written) if self.hint else ""
        return StepResult(self.bos + self.prompt + self.partial, 0.0, False)


class CalculatorEnv:
    """Running sums with a calculator the model may call: a turn that ends with an open sum "a+b=" is a call, and the
    environment answers with the sum; any other turn is the final answer, scored on the whole transcript (the model's
    turns and the answers, in order). Reward 1 for a right final answer, 0 otherwise (and at the turn limit).

    Example: prompt "7+5+9=": "7+5=" -> "12"; ";12+9=" -> "21"; "#21" -> transcript "7+5=12;12+9=21#21", reward 1.
    """

    CALL = re.compile(r"(?:^|.*[;=+])?(\d+)\+(\d+)=$")

    def __init__(self, *, max_turns: int = 4):
        if max_turns < 1:
            raise ValueError(f"need max_turns >= 1, got {max_turns}")
        self.max_turns = max_turns

    def reset(self, prompt: str, answer: str, **columns) -> str:
        self.answer, self.turn, self.transcript = answer, 0, ""
        return ""

    def step(self, completion: str) -> StepResult:
        self.turn += 1
        call = self.CALL.fullmatch(completion)
        if call and self.turn < self.max_turns:
            result = str(int(call.group(1)) + int(call.group(2)))
            self.transcript += completion + result
            return StepResult(result, 0.0, False)
        self.transcript += completion
        return StepResult("", tasks.score(self.transcript, self.answer).reward, True)


# ----------------------------------------------------------------------------------------------- the rollout
@torch.no_grad()
def generate_episodes(model, tokenizer, rows, env_factory, group_size: int, max_new_tokens: int, *,
                      max_turns: int, temperature: float = 1.0, greedy: bool = False) -> Rollout:
    """Run ``group_size`` episodes of each prompt of ``rows``: model turns and environment turns, up to ``max_turns``
    model turns each.

    Each turn samples every unfinished episode at once (``decoding.sample_tokens`` on its whole context, left-padded)
    for at most ``max_new_tokens`` tokens; a turn without EOS ends its episode (truncated, no further reward). With
    one turn and an environment that adds nothing, the tokens drawn are ``decoding.generate``'s with the same seed,
    and the Rollout is the same (``tests/test_multiturn.py``).

    Args:
        model: a causal LM (eval mode while sampling, restored after).
        tokenizer: its tokenizer (left padding, EOS set).
        rows: a ``datasets.Dataset`` (or dict of lists) with a ``prompt`` column (strings) and what the environment
            reads (passed to ``reset`` as keyword arguments, e.g. ``answer``).
        env_factory: a callable returning a fresh environment (``Environment``) per episode.
        group_size: G episodes per prompt.
        max_new_tokens: the budget of one model turn.
        max_turns: the most model turns of an episode (>= 1).
        temperature, greedy: the sampler's (as in ``decoding.generate``).

    Returns:
        A ``Rollout`` of B = N x G episodes whose completion is every token after the prompt: ``completion_mask``
        the model's tokens, ``attention_mask`` every real token, ``author`` (B, T) 1 model / 0 environment,
        ``turn`` (B, T) the turn of each token (an observation counts in the turn it answers; 0 before the first
        turn and on padding), ``turn_rewards`` (B, max_turns) each turn's reward,
        ``episode_rewards`` (B,) their sum, ``sampler_logprobs`` the sampler's log-probs of the model's tokens (0
        elsewhere), ``logprobs`` the same, ``completions`` each episode's whole text after the prompt.

    Raises:
        ValueError: for max_turns < 1, a prompt that is not a string, or an invalid tokenizer
            (``rollout.check_tokenizer``).
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    check_tokenizer(tokenizer)
    prompts = list(rows["prompt"])
    if not all(isinstance(p, str) for p in prompts):
        raise ValueError("generate_episodes takes string prompts (an environment answers in text)")
    names = rows.column_names if hasattr(rows, "column_names") else list(rows)
    columns = {n: list(rows[n]) for n in names if n not in ("prompt", "completion")}
    eos, pad = eos_token_ids(tokenizer, model), tokenizer.pad_token_id
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    enc = encode_prompts(tokenizer, prompts)  # (N, P), the prompts as decoding.generate encodes them
    B = len(prompts) * group_size
    prompt_ids = enc.input_ids.repeat_interleave(group_size, 0).to(device)
    prompt_mask = enc.attention_mask.repeat_interleave(group_size, 0).to(device)
    envs = [env_factory() for _ in range(B)]
    # per episode, the completion so far: token ids, author (1 model / 0 env), turn, the sampler's log-probs
    ids, author, turn_of, logps = ([[] for _ in range(B)] for _ in range(4))
    for b, env in enumerate(envs):
        first = env.reset(prompts[b // group_size], **{n: v[b // group_size] for n, v in columns.items()})
        _append_observation(tokenizer, first, ids[b], author[b], turn_of[b], logps[b], turn=0)
    turn_rewards = torch.zeros(B, max_turns)
    done, truncated = [False] * B, [False] * B
    for t in range(1, max_turns + 1):
        active = [b for b in range(B) if not done[b]]
        if not active:
            break
        ctx_ids, ctx_mask = _left_padded([prompt_ids[b][prompt_mask[b] > 0].tolist() + ids[b] for b in active], pad,
                                         device)
        if t == 1 and all(not x for x in ids):  # nothing after the prompts: exactly generate's batch
            ctx_ids, ctx_mask = prompt_ids, prompt_mask
        new, new_lp = sample_tokens(model, ctx_ids, ctx_mask, max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                                    temperature=temperature, greedy=greedy)  # (b, T_t)
        for row, b in enumerate(active):
            ended = torch.isin(new[row], torch.tensor(eos, device=device))
            n = int(ended.float().argmax()) + 1 if bool(ended.any()) else new.shape[1]
            ids[b] += new[row, :n].tolist()
            author[b] += [1] * n
            turn_of[b] += [t] * n
            logps[b] += new_lp[row, :n].tolist()
            if not bool(ended.any()):  # the turn never ended: the episode stops here, the environment never answers
                done[b] = truncated[b] = True
                continue
            result = envs[b].step(tokenizer.decode(new[row, :n], skip_special_tokens=True))
            turn_rewards[b, t - 1] = float(result.reward)
            done[b] = bool(result.done) or t == max_turns
            if not done[b]:
                _append_observation(tokenizer, result.observation, ids[b], author[b], turn_of[b], logps[b], turn=t)
    model.train(was_training)
    T = max(len(x) for x in ids)
    completion_ids = torch.tensor([x + [pad] * (T - len(x)) for x in ids], device=device)
    author_t = torch.tensor([x + [0] * (T - len(x)) for x in author], device=device)
    valid = torch.tensor([[1] * len(x) + [0] * (T - len(x)) for x in ids], device=device)
    model_mask = (author_t * valid).float()
    sampler = torch.tensor([x + [0.0] * (T - len(x)) for x in logps], device=device, dtype=torch.float32)
    return Rollout(
        input_ids=torch.cat([prompt_ids, completion_ids], 1), attention_mask=torch.cat([prompt_mask, valid], 1),
        completion_ids=completion_ids, completion_mask=model_mask, truncated=torch.tensor(truncated, device=device),
        prompt_index=torch.arange(len(prompts), device=device).repeat_interleave(group_size),
        completions=tokenizer.batch_decode(completion_ids, skip_special_tokens=True), logprobs=sampler,
        group_size=group_size, prompts=[p for p in prompts for _ in range(group_size)], sampler_logprobs=sampler,
        author=author_t, turn=torch.tensor([x + [0] * (T - len(x)) for x in turn_of], device=device),
        turn_rewards=turn_rewards, episode_rewards=turn_rewards.sum(1))


def _append_observation(tokenizer, text: str, ids: list, author: list, turn_of: list, logps: list, *, turn: int):
    """The observation's tokens after the episode so far, written by the environment (no log-prob: not sampled)."""
    if not text:
        return
    obs = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids += obs
    author += [0] * len(obs)
    turn_of += [turn] * len(obs)
    logps += [0.0] * len(obs)


def _left_padded(rows: list[list[int]], pad: int, device) -> tuple[Tensor, Tensor]:
    """(b, L) ids and mask of token lists, left-padded to the longest."""
    L = max(len(r) for r in rows)
    return (torch.tensor([[pad] * (L - len(r)) + r for r in rows], device=device),
            torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows], device=device))


# ----------------------------------------------------------------------------------------------- rewards over turns
def turn_rewards_on_tokens(turn_rewards: Tensor, turn: Tensor, model_mask: Tensor) -> Tensor:
    """(B, T) per-token rewards: turn k's reward on turn k's last model token, 0 elsewhere.

    Example: turns [1, 1, 0, 0, 2, 2] with authors [1, 1, 0, 0, 1, 1] (two observation tokens of turn 1 between),
    turn rewards [0.0, 0.5]: [0, 0, 0, 0, 0, 0.5]; with [0.2, 0.5]: [0, 0.2, 0, 0, 0, 0.5].

    Args:
        turn_rewards: (B, K) the reward of each model turn.
        turn: (B, T) the turn of each completion token (1-based; 0 on padding).
        model_mask: (B, T) 1 on the model's tokens.

    Raises:
        ValueError: on mismatched shapes.
    """
    same_shape(turn=turn, model_mask=model_mask)
    ndim("turn_rewards", turn_rewards, 2, "(B, K)")
    out = torch.zeros_like(model_mask, dtype=turn_rewards.dtype)
    for k in range(1, turn_rewards.shape[1] + 1):
        in_turn = (turn == k) & (model_mask > 0)  # (B, T)
        has = in_turn.any(-1)
        last = in_turn.shape[1] - 1 - in_turn.flip(-1).float().argmax(-1)  # (B,) the turn's last model token
        rows = has.nonzero().flatten()
        out[rows, last[rows]] += turn_rewards[rows, k - 1]
    return out


def episode_gae(rewards: Tensor, values: Tensor, model_mask: Tensor, *, gamma: float = 1.0, lam: float = 0.95
                ) -> tuple[Tensor, Tensor]:
    """GAE over the model's tokens of a multi-turn episode: ``advantages.gae`` on the model tokens taken in order,
    observations left out (they are the environment's dynamics between two model tokens, not the policy's steps).

    Example: authors [1, 1, 0, 1], rewards [0, 0.5, 0, 1], values [0.5, 0.6, 9.9, 0.7], gamma 1, lam 0.95: the
    model tokens' sequence is rewards [0, 0.5, 1], values [0.5, 0.6, 0.7]: deltas [0.1, 0.6, 0.3], A = [0.1 + 0.95 *
    (0.6 + 0.95 * 0.3), 0.6 + 0.95 * 0.3, 0.3] = [0.94075, 0.885, 0.3], put back at columns 0, 1, 3 (the observation's
    9.9 is never read).

    Args:
        rewards: (B, T) per-token rewards (``turn_rewards_on_tokens``).
        values: (B, T) the critic's values.
        model_mask: (B, T) 1 on the model's tokens (any pattern: observations make holes).
        gamma, lam: as in ``advantages.gae``.

    Returns:
        (advantages, returns), (B, T), 0 off the model's tokens.

    Source: Schulman et al. 2016, eq. 16, over the policy's own steps (the turn structure as in multi-turn RLHF
    trainers: verl's agent loop and TRL's tool mask leave the observations out of every term).
    """
    same_shape(rewards=rewards, values=values, model_mask=model_mask)
    keep = model_mask > 0
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices  # the model tokens first, in order
    packed_mask = torch.gather(keep, 1, order).float()
    packed = [torch.gather(x, 1, order) for x in (rewards, values)]
    adv, ret = gae(packed[0], packed[1], packed_mask, gamma=gamma, lam=lam)
    out_adv, out_ret = torch.zeros_like(adv), torch.zeros_like(ret)
    out_adv.scatter_(1, order, adv)
    out_ret.scatter_(1, order, ret)
    return out_adv * keep, out_ret * keep


# ----------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_episodes(model, tokenizer, rows, env_factory, max_new_tokens: int, *, max_turns: int,
                      samples_per_prompt: int = 1, temperature: float = 1.0, seed: int | None = 0) -> dict:
    """Held-out episodes with an environment: the share solved on the first turn and within ``max_turns`` (an
    episode counts as solved on the first turn with a reward above 0), the mean reward and the mean number of turns.
    The global RNG is restored afterwards (as ``evaluation.evaluate`` does)."""
    with torch.random.fork_rng():
        if seed is not None:
            torch.manual_seed(seed)
        r = generate_episodes(model, tokenizer, rows, env_factory, samples_per_prompt, max_new_tokens,
                              max_turns=max_turns, temperature=temperature)
    solved = r.turn_rewards > 0  # (B, K)
    return {"first_try_accuracy": float(solved[:, 0].float().mean()),
            "final_accuracy": float(solved.any(1).float().mean()),
            "reward": float(r.episode_rewards.mean()),
            "turns": float(r.turn.max(1).values.float().mean()),
            "model_tokens": float(r.completion_mask.sum(1).mean())}
