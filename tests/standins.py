"""Offline stand-ins for a real chat checkpoint (issue 36), built in about a second (imported as
``from standins import save_chat_standin``; pytest puts tests/ on the path).

``build_chat_tokenizer``: a byte-level BPE tokenizer trained here on a few sentences, with Qwen's special tokens
(<|endoftext|> pads, <|im_end|> ends a turn) and a ChatML chat template in Qwen's layout; it pads on the left.
``save_chat_standin``: a random tiny ``Qwen3ForCausalLM`` with that tokenizer, saved to a folder with a
``generation_config.json`` listing both EOS ids, as Qwen3's lists <|im_end|> and <|endoftext|>.
"""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: ChatML as Qwen writes it: each message between <|im_start|>role\n and <|im_end|>\n; the generation prompt
#: opens the assistant's turn
CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
          "{%- endif %}")
CORPUS = ["Tom has 3 apples and buys 4 more. How many apples does he have now? 3 + 4 = 7. #### 7",
          "A box holds 12 pens. Sam gives away 5 pens. 12 - 5 = 7 pens are left. The answer is \\boxed{7}.",
          "You are a helpful assistant. Solve the problem step by step and end with the final number.",
          "What is 2 times 6? 2 * 6 = 12, so the answer is 12. Each of the 4 friends gets 1,250 dollars."] * 4


def build_chat_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (every text encodes, any byte) with Qwen's special tokens and ChatML template."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                         show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   padding_side="left", chat_template=CHATML)


def save_chat_standin(path, *, seed: int = 0):
    """A random tiny Qwen3 and the chat tokenizer saved to ``path`` (``models.load(path)`` loads it); both EOS ids
    in its generation config. The final norm is scaled by 6 so its distributions are far from uniform."""
    import torch

    tok = build_chat_tokenizer()
    end_of_text = tok.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=None, max_position_embeddings=512, tie_word_embeddings=True))
    with torch.no_grad():
        model.model.norm.weight.mul_(6)
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id, end_of_text],
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
