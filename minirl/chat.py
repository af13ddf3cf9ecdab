"""Prompts in TRL's two formats: plain text, or a conversation rendered by the tokenizer's chat template.

A prompt is either a string (TRL's "standard" format: the text the model continues, tokenized as it is) or a
conversation (TRL's "conversational" format: a list of messages ``{"role": "system" | "user" | "assistant",
"content": str}``). A conversation is rendered by the tokenizer's chat template with the generation prompt (for a
chat model, the text that opens the assistant's turn), then tokenized without adding special tokens again, as
TRL's GRPOTrainer does (``apply_chat_template(..., add_generation_prompt=True, tokenize=True)``). A base model's
tokenizer has no template: its conversations become plain text, the contents one per line.

The reward side (TRL's contract): a reward function for conversational prompts receives each prompt as its
message list and each completion as ``[{"role": "assistant", "content": text}]`` (``rewards.score_completions``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .rewards import is_conversational

__all__ = ["is_conversational", "render", "encode_prompts", "with_system_prompt", "as_conversation"]


def render(tokenizer, prompts: Sequence) -> tuple[list[str], bool]:
    """The text of each prompt and whether the tokenizer should add its special tokens (BOS) to it.

    Args:
        tokenizer: a Hugging Face tokenizer; its ``chat_template`` (None for a base model) renders conversations.
        prompts: N prompts, all strings or all conversations.

    Returns:
        (N texts, add_special_tokens): strings unchanged with True (as ``tokenizer(prompts)`` treats them);
        conversations rendered by the chat template with the generation prompt, with False (the template writes
        its own special tokens); conversations without a template: the contents joined by newlines, with True.

    Raises:
        ValueError: if prompts mixes strings and conversations, or a prompt is neither.
    """
    kinds = {is_conversational(p) for p in prompts}
    if len(kinds) > 1:
        raise ValueError("prompts mixes plain strings and conversations; give one format for the whole dataset")
    if kinds != {True}:
        bad = next((p for p in prompts if not isinstance(p, str)), None)
        if bad is not None:
            raise ValueError(f"a prompt must be a string or a list of {{'role', 'content'}} messages, got {bad!r}")
        return list(prompts), True
    if getattr(tokenizer, "chat_template", None) is None:  # a base model: plain text
        return ["\n".join(m["content"] for m in conversation) for conversation in prompts], True
    texts = tokenizer.apply_chat_template([list(c) for c in prompts], tokenize=False, add_generation_prompt=True)
    return list(texts), False


def encode_prompts(tokenizer, prompts: Sequence):
    """Tokenize N prompts (``render``) into one left-padded batch.

    Returns:
        The tokenizer's BatchEncoding with ``input_ids`` and ``attention_mask``, (N, P) tensors, padded on the
        tokenizer's padding side (``rollout.check_tokenizer`` insists on the left).

    Raises:
        ValueError: from ``render``.
    """
    texts, add_special_tokens = render(tokenizer, prompts)
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)


def with_system_prompt(prompt, system_prompt: str | None):
    """``prompt`` with a system prompt: a system message first in a conversation (unless it already opens with
    one: the dataset's own wins), a first paragraph before a plain-text prompt; unchanged for None or ""."""
    if not system_prompt:
        return prompt
    if is_conversational(prompt):
        if prompt and prompt[0]["role"] == "system":
            return prompt
        return [{"role": "system", "content": system_prompt}, *prompt]
    return f"{system_prompt}\n\n{prompt}"


def as_conversation(text: str, system_prompt: str | None = None) -> list[dict]:
    """One user message (after an optional system message): how a question column becomes a chat prompt."""
    return with_system_prompt([{"role": "user", "content": text}], system_prompt)
