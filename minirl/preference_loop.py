"""The preference loop: DPO, IPO, KTO and SimPO on fixed data, with no rollout inside the loop.

Each step is 1. a batch of pairs (or labelled examples), 2. policy (and reference) log-probs of their
completions, 3. the method's loss from ``minirl.preference``, 4. one optimiser step, 5. a row of metrics. The loss
functions take one log-prob per completion; how token log-probs are reduced to it is part of each method
(``PREFERENCE_METHODS``). ``preference_data`` builds the pairs from the model's own samples.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm  # plain text bars: no widget warnings in notebooks

from . import preference as pref
from . import rollout
from .checks import choice
from .config import PROGRESS_INTERVAL, set_seed
from .evaluation import eval_metrics, memory_held
from .history import History

#: Per-method defaults: the reduction of token log-probs to one number per completion, beta (when the method has
#: one), whether a frozen reference model is needed, and the data the method reads.
PREFERENCE_METHODS: dict[str, dict] = {
    # Rafailov et al. 2023, eq. 7: sequence log-likelihood (sum over tokens), beta 0.1, reference model
    "dpo": dict(reduction="sum", beta=0.1, reference=True, data="pairs"),
    # Azar et al. 2023, eq. 17: the paper's sequence log-likelihood (sum); TRL averages per token (reduction="mean")
    "ipo": dict(reduction="sum", beta=None, reference=True, data="pairs"),
    # Ethayarajh et al. 2024, eq. 7-8: sum over tokens, beta 0.1, unpaired labelled completions, reference model
    "kto": dict(reduction="sum", beta=0.1, reference=True, data="examples"),
    # Meng et al. 2024, eq. 6: mean over tokens, beta 2.0, margin gamma 1.0, NO reference model
    "simpo": dict(reduction="mean", beta=2.0, reference=False, data="pairs"),
}
_PREF_COLUMNS = {"pairs": ("prompt", "chosen", "rejected"), "examples": ("prompt", "completion", "label")}


@dataclass
class PrefConfig:
    """Every setting of the preference loop ``train_preference``. Defaults follow the papers (PREFERENCE_METHODS)."""

    method: str = "dpo"  # "dpo", "ipo", "kto" or "simpo"
    beta: float | None = None  # DPO / KTO / SimPO reward scale; None: the method's default (0.1, 0.1, 2.0)
    tau: float = 0.1  # IPO regularisation; the target log-ratio margin is 1 / (2 tau) nats
    gamma: float = 1.0  # SimPO target margin (absolute, on beta * mean log-prob)
    label_smoothing: float = 0.0  # DPO only: > 0 is conservative DPO (cDPO), the assumed label-flip probability
    lambda_d: float = 1.0  # KTO weight of desirable examples
    lambda_u: float = 1.0  # KTO weight of undesirable examples
    reduction: str | None = None  # "sum" or "mean" over completion tokens; None: the method's default
    lr: float = 1e-4  # AdamW learning rate
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    steps: int = 50  # optimiser steps
    batch_size: int = 16  # pairs per step (DPO, IPO, SimPO) or examples per step (KTO, >= 2)
    seed: int = 0  # batch order and KTO's mismatched pairing
    temperature: float = 1.0  # log-probs from logits / temperature (1.0: the model's own distribution)
    max_new_tokens: int = 40  # completion budget of the held-out evaluation
    eval_every: int = 0  # evaluate every N steps (0: only before and after)
    eval_samples_per_prompt: int = 1
    progress: bool = True  # tqdm bar

    def resolved(self) -> dict:
        """The method's effective beta and reduction (the config's, or the method's defaults)."""
        defaults = PREFERENCE_METHODS[self.method]
        return {"beta": defaults["beta"] if self.beta is None else self.beta,
                "reduction": self.reduction or defaults["reduction"]}

    def validate(self) -> None:
        """Raise ValueError naming the field for any invalid setting."""
        choice("method", self.method, PREFERENCE_METHODS)
        if self.reduction is not None:
            choice("reduction", self.reduction, ("sum", "mean"))
        for name in ("steps", "batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.method == "kto" and self.batch_size < 2:
            raise ValueError(f"KTO pairs each example with another one of its batch: batch_size must be >= 2, "
                             f"got {self.batch_size}")
        for name in ("lr", "tau", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        beta = self.resolved()["beta"]
        if beta is not None and not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if self.label_smoothing and self.method != "dpo":
            raise ValueError(f"label_smoothing (cDPO) applies to method 'dpo' only, got method {self.method!r}")


def encode_completions(tokenizer, prompts: Sequence[str], completions: Sequence[str], device=None) -> dict:
    """Token ids of prompt + completion + EOS in the rollout layout that ``rollout.token_logprobs`` reads.

    Prompts (with BOS) are left-padded to a common length P and completions (with EOS appended) right-padded to
    T, exactly as ``decoding.generate`` lays out a batch; so the log-probs of a sampled completion that ended with
    EOS are reproduced to float precision. A truncated sample (no EOS) is encoded with an EOS appended.

    Args:
        tokenizer: the model's tokenizer (BOS added to the prompt, pad and EOS ids set).
        prompts: B prompt strings.
        completions: B completion strings (without EOS).
        device: where to put the tensors.

    Returns:
        dict with input_ids (B, P + T), attention_mask (B, P + T), completion_mask (B, T) float (1 up to and
        including EOS) and n_prompt_tokens = P.

    Raises:
        ValueError: if prompts and completions differ in length or are empty.
    """
    if len(prompts) != len(completions) or len(prompts) == 0:
        raise ValueError(f"need as many prompts as completions, at least one; got {len(prompts)} and "
                         f"{len(completions)}")
    p_ids = [tokenizer(p).input_ids for p in prompts]  # BOS + prompt
    c_ids = [tokenizer(c, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for c in completions]
    P, T, pad = max(map(len, p_ids)), max(map(len, c_ids)), tokenizer.pad_token_id
    ids, am, cm = [], [], []
    for p, c in zip(p_ids, c_ids, strict=True):
        ids.append([pad] * (P - len(p)) + p + c + [pad] * (T - len(c)))
        am.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (T - len(c)))
        cm.append([1.0] * len(c) + [0.0] * (T - len(c)))
    return {"input_ids": torch.tensor(ids, device=device), "attention_mask": torch.tensor(am, device=device),
            "completion_mask": torch.tensor(cm, device=device), "n_prompt_tokens": P}


def _completion_logps(model, enc: dict, temperature: float) -> torch.Tensor:
    """(B, T) token log-probs of the encoded completions, zero outside the completion mask."""
    tok = rollout.token_logprobs(model, enc["input_ids"], enc["attention_mask"], enc["n_prompt_tokens"],
                                 temperature=temperature)
    return tok * enc["completion_mask"]


@torch.no_grad()
def reference_logps(ref_model, enc: dict, temperature: float = 1.0, reduction: str = "sum") -> torch.Tensor:
    """(B,) per-sequence log-probs under the frozen reference: no_grad, and the model must be in eval mode.

    Raises:
        ValueError: if the reference is in train mode (dropout would make its log-probs random).
    """
    if ref_model.training:
        raise ValueError("ref_model must be in eval mode (call ref_model.eval())")
    return rollout.sequence_logprobs(_completion_logps(ref_model, enc, temperature), enc["completion_mask"],
                                     reduction=reduction)


def kto_reference_pairs(prompts: Sequence[str], completions: Sequence[str], generator=None):
    """The mismatched (prompt, completion) pairs of a KTO batch for the reference point z0.

    Prompt i is paired with the completion of example j = ``preference.kto_mismatched_indices(B)[i]`` != i.

    Returns:
        (prompts, mismatched completions, idx (B,) long).
    """
    idx = pref.kto_mismatched_indices(len(prompts), generator)
    return list(prompts), [completions[j] for j in idx.tolist()], idx


def preference_pair_loss(model, ref_model, tokenizer, batch: dict, cfg: PrefConfig) -> tuple[torch.Tensor, dict]:
    """DPO, IPO or SimPO loss of a batch of pairs: one forward of the 2B completions (chosen, then rejected).

    Args:
        batch: dict of lists ``prompt``, ``chosen``, ``rejected`` (B pairs).
        ref_model: the frozen reference in eval mode; ignored (may be None) for SimPO.

    Returns:
        (loss, stats): the method's stats (``accuracy`` renamed ``reward_accuracy``) plus ``chosen_logps`` and
        ``rejected_logps``: batch means of the policy's summed log-probs (nats per completion) whatever the
        reduction, so the curves of all methods share one unit.

    Source: DPO, Rafailov et al. 2023, eq. 7; IPO, Azar et al. 2023, eq. 17; SimPO, Meng et al. 2024, eq. 6
    (the losses themselves live in ``minirl.preference``).
    """
    n, opts = len(batch["prompt"]), cfg.resolved()
    device = next(model.parameters()).device
    enc = encode_completions(tokenizer, list(batch["prompt"]) * 2, list(batch["chosen"]) + list(batch["rejected"]),
                             device)
    tok = _completion_logps(model, enc, cfg.temperature)  # (2B, T)
    logps = rollout.sequence_logprobs(tok, enc["completion_mask"], reduction=opts["reduction"])  # (2B,)
    if cfg.method == "simpo":
        loss, stats = pref.simpo_loss(logps[:n], logps[n:], beta=opts["beta"], gamma=cfg.gamma)
    else:
        ref = reference_logps(ref_model, enc, cfg.temperature, opts["reduction"])  # (2B,), no grad
        if cfg.method == "dpo":
            loss, stats = pref.dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], beta=opts["beta"],
                                        label_smoothing=cfg.label_smoothing)
        else:
            loss, stats = pref.ipo_loss(logps[:n], logps[n:], ref[:n], ref[n:], tau=cfg.tau)
    sums = tok.detach().sum(-1)  # (2B,) nats per completion
    stats["reward_accuracy"] = stats.pop("accuracy")
    stats.update(chosen_logps=float(sums[:n].mean()), rejected_logps=float(sums[n:].mean()))
    return loss, stats


def preference_kto_loss(model, ref_model, tokenizer, batch: dict, cfg: PrefConfig,
                        generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """KTO loss of a batch of labelled completions, z0 from mismatched pairs of the same batch.

    The mismatched log-probs only feed z0, which ``preference.kto_loss`` detaches, so both the policy's and the
    reference's are computed without gradient.

    Args:
        batch: dict of lists ``prompt``, ``completion``, ``label`` (bool: desirable), B >= 2 examples.
        generator: draws the mismatched pairing (None: shift by one).

    Returns:
        (loss, stats): ``preference.kto_loss``'s stats (``accuracy`` renamed ``reward_accuracy``) plus
        ``chosen_logps`` / ``rejected_logps``: mean summed log-probs of the desirable / undesirable completions
        (nats; NaN when the batch has none of that class).

    Source: Ethayarajh et al. 2024, "KTO", eq. 7-8 (z0 from mismatched pairs of the same microbatch).
    """
    opts, device = cfg.resolved(), next(model.parameters()).device
    prompts, completions = list(batch["prompt"]), list(batch["completion"])
    desirable = torch.tensor(batch["label"], dtype=torch.bool, device=device)  # (B,)
    enc = encode_completions(tokenizer, prompts, completions, device)
    tok = _completion_logps(model, enc, cfg.temperature)  # (B, T)
    logps = rollout.sequence_logprobs(tok, enc["completion_mask"], reduction=opts["reduction"])  # (B,)
    kl_enc = encode_completions(tokenizer, *kto_reference_pairs(prompts, completions, generator)[:2], device)
    with torch.no_grad():
        kl_logps = rollout.sequence_logprobs(_completion_logps(model, kl_enc, cfg.temperature),
                                             kl_enc["completion_mask"], reduction=opts["reduction"])  # (B,)
    ref = reference_logps(ref_model, enc, cfg.temperature, opts["reduction"])  # (B,)
    kl_ref = reference_logps(ref_model, kl_enc, cfg.temperature, opts["reduction"])  # (B,)
    loss, stats = pref.kto_loss(logps, ref, kl_logps, kl_ref, desirable, beta=opts["beta"], lambda_d=cfg.lambda_d,
                                lambda_u=cfg.lambda_u)
    sums = tok.detach().sum(-1)  # (B,)
    stats["reward_accuracy"] = stats.pop("accuracy")
    stats.update(chosen_logps=float(sums[desirable].mean()), rejected_logps=float(sums[~desirable].mean()))
    return loss, stats


def _batch_indices(n: int, batch_size: int, steps: int, gen: torch.Generator):
    """``steps`` lists of ``batch_size`` row indices: epochs of seeded permutations, read in order."""
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        while len(order) < batch_size:
            order = torch.cat([order, torch.randperm(n, generator=gen)])
        yield order[:batch_size].tolist()
        order = order[batch_size:]


def _check_preference_data(data, method: str) -> None:
    kind = PREFERENCE_METHODS[method]["data"]
    missing = [c for c in _PREF_COLUMNS[kind] if c not in data.column_names]
    if missing:
        raise ValueError(f"method {method!r} reads {kind} with columns {list(_PREF_COLUMNS[kind])}; the data lacks "
                         f"{missing}")
    if len(data) == 0:
        raise ValueError("the preference data is empty")


def train_preference(model, tokenizer, data, cfg: PrefConfig, ref_model=None, eval_data=None,
                     callback: Callable[[int, dict], None] | None = None) -> History:
    """Train ``model`` in place with DPO, IPO, KTO or SimPO on fixed preference data; return the per-step History.

    Each step: 1. the next ``batch_size`` rows (epochs of seeded permutations); 2. log-probs of their completions
    under the policy (``rollout.token_logprobs``, reduced by ``rollout.sequence_logprobs``) and, except for SimPO,
    under the frozen reference (no_grad, eval mode); 3. the method's loss from ``minirl.preference``; 4. one
    AdamW step with gradient clipping; 5. a row of metrics into History.

    Args:
        model: the policy (a causal LM), trained in place.
        tokenizer: its tokenizer.
        data: a Dataset of pairs (``prompt``, ``chosen``, ``rejected``) for DPO / IPO / SimPO, or of labelled
            examples (``prompt``, ``completion``, ``label``) for KTO.
        cfg: a PrefConfig.
        ref_model: the frozen reference; default a copy of the policy at the start. Never made (and ignored)
            for SimPO, which is reference-free.
        eval_data: optional held-out Dataset (prompt, answer): task accuracy sampled at T = 1 and greedy is
            logged before training (step 0), every ``cfg.eval_every`` steps and at the end.
        callback: called as ``callback(step, row)`` after each step, before the row is logged: metrics it adds to
            ``row`` are logged with it.

    Returns:
        History; each step logs loss, the method's stats (chosen_rewards / rejected_rewards / margins /
        reward_accuracy, or KTO's z0 and class rewards), chosen_logps / rejected_logps (summed, nats), grad_norm,
        time; the last row also the ``memory_held`` figures.

    Raises:
        ValueError: for an invalid config or data without the method's columns.

    Source: the offline pipeline of Rafailov et al. 2023 (sample completions from the SFT model, label them,
    then optimise the policy against the frozen SFT model as reference); section 3 of notebook 08 runs it.
    """
    cfg.validate()
    _check_preference_data(data, cfg.method)
    set_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    if not PREFERENCE_METHODS[cfg.method]["reference"]:
        ref_model = None
    elif ref_model is None:
        ref_model = copy.deepcopy(model)
    if ref_model is not None:
        ref_model.eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    history = History()

    metrics0 = eval_metrics(model, tokenizer, eval_data, cfg, step=0)
    if metrics0:
        history.log(step=0, **metrics0)
    was_training = model.training
    model.train()  # train mode while it trains (dropout, gradient checkpointing); the caller's mode restored at the end
    batches = _batch_indices(len(data), cfg.batch_size, cfg.steps, gen)
    for step, idx in enumerate(tqdm(batches, total=cfg.steps, desc=cfg.method, disable=not cfg.progress,
                                                 mininterval=PROGRESS_INTERVAL), start=1):
        t0 = time.time()
        batch = data[idx]  # 1. dict of lists
        if cfg.method == "kto":  # 2-3. log-probs and loss
            loss, stats = preference_kto_loss(model, ref_model, tokenizer, batch, cfg, gen)
        else:
            loss, stats = preference_pair_loss(model, ref_model, tokenizer, batch, cfg)
        opt.zero_grad(set_to_none=True)  # 4. optimise
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        row = dict(step=step, loss=loss.item(), **stats, grad_norm=float(grad_norm), time=time.time() - t0)  # 5.
        if step == cfg.steps:
            row.update(memory_held(model, opt, ref_model))
        row.update(eval_metrics(model, tokenizer, eval_data, cfg, step))
        if callback is not None:
            callback(step, row)  # before logging: what the callback adds to the row is logged with it
        history.log(**row)
    model.train(was_training)
    return history
