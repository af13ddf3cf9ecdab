"""A character-level tokenizer built with the `tokenizers` library and wrapped as ``PreTrainedTokenizerFast``.

One character is one token, so a reader can line up tokens, log-probs and masks with the text by eye. Pad, EOS
and BOS are distinct special tokens (pad id 0, EOS id 1, BOS id 2): masks are built from the EOS, never from the
pad id, and a model that wrongly did so would be caught by the tests.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
#: The characters of the task plus a little headroom (letters, space, punctuation) for user experiments.
CHARS = "0123456789+-*=;#:,.()<> abcdefghijklmnopqrstuvwxyz"


def build_tokenizer(chars: str = CHARS) -> PreTrainedTokenizerFast:
    """Build the char-level tokenizer: ids 0-3 are <pad>, <eos>, <bos>, <unk>, then one id per character.

    Returns:
        A ``PreTrainedTokenizerFast`` with pad/eos/bos/unk set, <bos> prepended to every text, left padding
        (prompts of a batch end at the same column, as ``generate`` expects for decoder-only models), and a
        decoder that joins characters without spaces. ``save_pretrained`` / ``from_pretrained`` round-trip it.

    Raises:
        ValueError: if ``chars`` repeats a character.
    """
    if len(set(chars)) != len(chars):
        raise ValueError("chars must not repeat a character")
    vocab = {tok: i for i, tok in enumerate([PAD, EOS, BOS, UNK, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    core.decoder = decoders.Fuse()  # join characters back without spaces
    # every encoded text starts with <bos>, so the first real character has a context to be predicted from
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK, padding_side="left"
    )
    return tok
