"""Tiny dense and Mixture-of-Experts causal LMs built from transformers configs, and a loader for any HF causal LM.

Nothing is downloaded: the tiny models are randomly initialised from a Qwen3 / Qwen3-MoE config and warm-started
here (``warm_start.warm_start``). ``load`` is the ordinary ``from_pretrained`` path, so a local directory written by
``save_pretrained`` works offline, and a hub name works for a user with internet.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

#: The MoE experts kernel. "eager" loops over the experts that received tokens; "grouped_mm" also works on CPU.
#: Never "batched_mm" on CPU: it is about 40x slower there.
EXPERTS_IMPLEMENTATION = "eager"


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> dict:
    return dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def tiny_dense(tokenizer: PreTrainedTokenizerBase, *, hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4,
               intermediate_size: int = 384, max_positions: int = 64, seed: int = 0) -> Qwen3ForCausalLM:
    """A small Qwen3 decoder, randomly initialised (about 0.8 M parameters with the defaults).

    Args:
        tokenizer: supplies the vocabulary size and the pad/bos/eos ids.
        hidden_size, num_layers, num_heads, intermediate_size: the usual transformer sizes.
        max_positions: the longest prompt + completion the model will see (RoPE table size).
        seed: initialisation seed (same seed -> same weights).

    Returns:
        A ``Qwen3ForCausalLM`` in float32, train mode, eager attention (fastest for tiny shapes on CPU).
    """
    config = Qwen3Config(
        hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_heads, head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True, **_special_ids(tokenizer),
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM._from_config(config, attn_implementation="eager", dtype=torch.float32)


def tiny_moe(tokenizer: PreTrainedTokenizerBase, *, hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4,
             num_experts: int = 8, experts_per_token: int = 2, expert_size: int = 128, max_positions: int = 64,
             seed: int = 0) -> Qwen3MoeForCausalLM:
    """A small Qwen3-MoE decoder: every layer's MLP is ``num_experts`` experts with top-``experts_per_token`` routing.

    With the defaults each token activates 2 of 8 experts of width 128 in every layer (about 1.9 M parameters,
    0.65 M active per token), close to the dense model's active size, so the two can be compared step for step.

    Returns:
        A ``Qwen3MoeForCausalLM`` in float32 with ``experts_implementation`` = ``EXPERTS_IMPLEMENTATION``
        and the top-k weights renormalised (``norm_topk_prob``), as in Qwen3-MoE.
    """
    config = Qwen3MoeConfig(
        hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_heads, head_dim=hidden_size // num_heads, max_position_embeddings=max_positions,
        num_experts=num_experts, num_experts_per_tok=experts_per_token, moe_intermediate_size=expert_size,
        intermediate_size=expert_size * experts_per_token, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], tie_word_embeddings=True, **_special_ids(tokenizer),
    )
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM._from_config(
        config, attn_implementation="eager", experts_implementation=EXPERTS_IMPLEMENTATION, dtype=torch.float32
    )


#: A tokenizer folder holds at least one of these: a fast tokenizer, a sentencepiece model, a BPE or WordPiece vocab.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")


def looks_local(name_or_path: str | Path) -> bool:
    """True when a model name is a local path, not a hub repository ("org/name" or "name"): it starts with ".",
    "/" or "~", holds a backslash or more than one "/", or its parent folder exists here ("runs/policy" where a
    runs/ folder is). Example: "./qwen3" and "runs/x/policy" -> True; "Qwen/Qwen3-0.6B" and "gpt2" -> False."""
    s = str(name_or_path).rstrip("/")
    return (s.startswith((".", "/", "~")) or "\\" in s or s.count("/") > 1
            or ("/" in s and Path(s).parent.is_dir()))


def check_model_path(name_or_path: str | Path, *, tokenizer: bool = False) -> str:
    """Fail fast on a local model folder that cannot load, before anything asks the hub: transformers takes any
    string that is not a folder for a hub name, and a mistyped path waits about a minute on the hub's retries, then
    fails without saying that the folder does not exist.

    Args:
        name_or_path: a hub name or a local folder.
        tokenizer: also require tokenizer files (one of ``TOKENIZER_FILES``) in a local folder: without them
            transformers 5 builds an empty tokenizer, and older versions ask to install sentencepiece.

    Returns:
        The name, with "~" expanded for a local path.

    Raises:
        FileNotFoundError: "no such folder: PATH" for a local path (``looks_local``) that is not a folder.
        ValueError: with ``tokenizer``, for a folder holding none of ``TOKENIZER_FILES``, naming them and the files
            it holds.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if tokenizer and not any((path / f).is_file() for f in TOKENIZER_FILES):
            held = sorted(p.name for p in path.iterdir())
            raise ValueError(f"{path} has no tokenizer files: none of {', '.join(TOKENIZER_FILES)} (it holds "
                             f"{', '.join(held) or 'nothing'}); save the tokenizer there too "
                             f"(tokenizer.save_pretrained)")
        return str(path)
    if looks_local(name_or_path):
        raise FileNotFoundError(f"no such folder: {name_or_path}" + (" (it is a file)" if path.exists() else ""))
    return str(name_or_path)


def load(name_or_path: str, dtype: torch.dtype = torch.float32, **kwargs) -> torch.nn.Module:
    """Load any Hugging Face causal LM: a local directory from ``save_pretrained`` or, with internet, a hub name.

    MoE models are loaded with ``experts_implementation=EXPERTS_IMPLEMENTATION`` when they support the switch.
    Attention is "eager" unless ``attn_implementation`` is passed: the kernel ``tiny_dense`` / ``tiny_moe`` build
    with (it is not saved in the config), so a saved and reloaded model gives bit-identical logits and a cached warm
    start computes exactly what a fresh one does. Pass ``attn_implementation="sdpa"`` for large checkpoints.

    Raises:
        FileNotFoundError: "no such folder: PATH" for a local path that does not exist (``check_model_path``),
            without asking the hub.
        OSError: from transformers, when the directory or hub name cannot be resolved.
    """
    name_or_path = check_model_path(name_or_path)
    kwargs.setdefault("attn_implementation", "eager")
    try:
        return AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=dtype, experts_implementation=EXPERTS_IMPLEMENTATION, **kwargs
        )
    except (TypeError, ValueError):  # a dense model, which has no experts switch
        return AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters (each tied tensor counted once)."""
    return sum(p.numel() for p in model.parameters())


def is_moe(model: torch.nn.Module) -> bool:
    """True when the model has transformers MoE experts modules (anything with a ``num_experts`` config)."""
    return getattr(model.config, "num_experts", None) is not None


class ValueModel(torch.nn.Module):
    """PPO's critic: a copy of the policy's transformer backbone with a scalar head, V(s_t) for every position.

    Copying the policy's (warm-started) backbone is the usual RLHF choice: the critic starts with features that
    already understand the task. It is a second full model in memory, which is what GRPO saves by dropping it.
    """

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        import copy

        self.backbone = copy.deepcopy(policy.model)  # the decoder without the LM head
        # on the policy's device, so a critic built beside a GPU policy needs no .to() (the first GPU run, issue 53)
        self.head = torch.nn.Linear(policy.config.hidden_size, 1, device=next(policy.parameters()).device)
        torch.nn.init.zeros_(self.head.weight)  # start at V = bias = 0: no confident wrong values at step 0
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L) values; the value at position p is V of the state after token p."""
        from .rollout import position_ids_from_mask

        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids_from_mask(attention_mask), use_cache=False).last_hidden_state
        return self.head(h).squeeze(-1).float()


def token_values(value_model: ValueModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 n_prompt_tokens: int) -> torch.Tensor:
    """V(s_t) for each completion token t: the value read at the position that predicts token t.

    Args:
        value_model: a ``ValueModel``.
        input_ids, attention_mask: (B, P + T).
        n_prompt_tokens: P.

    Returns:
        (B, T) values (reward units), aligned with ``rollout.token_logprobs``.
    """
    return value_model(input_ids, attention_mask)[:, n_prompt_tokens - 1:-1]
