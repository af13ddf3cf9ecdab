"""Chat templates and TRL's conversational format (issue 36, item 3a), on the offline chat stand-in (``standins``:
a byte-level BPE tokenizer with Qwen's special tokens and ChatML template, a random tiny Qwen3 with two EOS ids)."""

import math
import warnings

import datasets
import pytest
import torch
from standins import build_chat_tokenizer, save_chat_standin

from minirl import chat, config, decoding, models, rewards, rl
from minirl.tokenizer import build_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tom has 12 pens and gives away 5. "
                                                                            "How many pens are left?"}],
    [{"role": "user", "content": "Hi"}],
]


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory):
    return save_chat_standin(tmp_path_factory.mktemp("qwen3chat"))


def load(path):
    from transformers import AutoTokenizer

    return models.load(str(path)), AutoTokenizer.from_pretrained(str(path))


def test_conversations_are_tokenized_as_trls_apply_chat_template_and_left_padded():
    tok = build_chat_tokenizer()
    enc = chat.encode_prompts(tok, CONVERSATIONS)
    for row, mask, conversation in zip(enc.input_ids, enc.attention_mask, CONVERSATIONS, strict=True):
        # TRL 1.16's _tokenize_prompts: apply_chat_template(add_generation_prompt=True, tokenize=True)
        trl_ids = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                          return_dict=True)["input_ids"]
        assert row[mask > 0].tolist() == trl_ids
        assert mask[-1] == 1 and mask.tolist() == sorted(mask.tolist())  # padding on the left only
    text = chat.render(tok, CONVERSATIONS[:1])[0][0]
    assert text == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"


def test_plain_text_prompts_are_tokenized_as_before_and_a_base_model_gets_plain_text():
    tok = build_tokenizer()  # minirl's char-level tokenizer: no chat template, adds <bos>
    assert tok.chat_template is None
    prompts = ["1+2=", "12+34="]
    assert torch.equal(chat.encode_prompts(tok, prompts).input_ids, tok(prompts, return_tensors="pt",
                                                                          padding=True).input_ids)
    conversation = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+2="}]
    assert chat.render(tok, [conversation]) == (["add\n1+2="], True)  # the contents one per line, <bos> added
    with pytest.raises(ValueError, match="mixes plain strings and conversations"):
        chat.render(tok, ["1+2=", conversation])
    with pytest.raises(ValueError, match="a prompt must be a string"):
        chat.render(tok, [3])


def test_system_prompt_and_question_to_conversation():
    assert chat.as_conversation("2+2?", "Think.") == [{"role": "system", "content": "Think."},
                                                      {"role": "user", "content": "2+2?"}]
    assert chat.with_system_prompt(CONVERSATIONS[1], "other") == CONVERSATIONS[1]  # the dataset's own system wins
    assert chat.with_system_prompt("2+2?", "Think.") == "Think.\n\n2+2?"
    assert chat.with_system_prompt("2+2?", None) == "2+2?"
    assert chat.is_conversational(CONVERSATIONS[0]) and not chat.is_conversational("hi")
    assert not chat.is_conversational([])


def test_batched_chat_prompts_give_the_same_logprobs_as_one_at_a_time(standin_dir):
    lm, tok = load(standin_dir)
    batched = decoding.generate(lm, tok, CONVERSATIONS, 2, 8, greedy=True, temperature=0.7)
    assert batched.prompts[0] == CONVERSATIONS[0] and len(batched.prompts) == 6  # the message lists, G times each
    for i, conversation in enumerate(CONVERSATIONS):
        alone = decoding.generate(lm, tok, [conversation], 2, 8, greedy=True, temperature=0.7)
        for g in range(2):
            row, n = 2 * i + g, int(alone.lengths[g])
            assert int(batched.lengths[row]) == n
            assert torch.equal(batched.completion_ids[row, :n], alone.completion_ids[g, :n])
            # the batched rows are left-padded (up to 24 pad tokens here); position ids from the mask undo it
            torch.testing.assert_close(batched.logprobs[row, :n], alone.logprobs[g, :n], atol=1e-6, rtol=0)
    assert (batched.attention_mask[:, 0] == 0).any()  # some row really was padded


def test_a_reward_function_receives_trls_conversational_shapes():
    seen = {}

    def answer_reward(prompts, completions, answer, **_):
        seen.update(prompts=prompts, completions=completions)
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer, strict=True)]

    scores = rewards.score_completions(answer_reward, [CONVERSATIONS[0]] * 2, ["5", "6"],
                                       columns={"answer": ["5", "5"]})
    assert scores.tolist() == [1.0, 0.0]
    # TRL 1.16's _generate_and_score_completions: [[{"role": "assistant", "content": text}] for each completion]
    assert seen["completions"] == [[{"role": "assistant", "content": "5"}], [{"role": "assistant", "content": "6"}]]
    assert seen["prompts"] == [CONVERSATIONS[0]] * 2
    assert rewards.score_completions(lambda completions, **_: [float(c == "5") for c in completions],
                                     ["2+3="], ["5"]).tolist() == [1.0]  # plain text stays text


def test_conversational_prompts_train_one_step(standin_dir):
    lm, tok = load(standin_dir)
    data = datasets.Dataset.from_dict({"prompt": CONVERSATIONS, "answer": ["5", "7", "hello"]})
    calls = []

    def length_reward(prompts, completions, completion_ids, answer, **_):  # a scripted reward: it always has signal
        calls.append((prompts[0], completions[0]))
        return [float(len(c[0]["content"])) + (i % 2) for i, c in enumerate(completions)]

    before = [p.detach().clone() for p in lm.parameters()]
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=6, lr=1e-3,
                             num_minibatches=1, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        history = rl.train_rl(lm, tok, cfg, data, reward_fn=length_reward)
    prompt, completion = calls[0]
    assert chat.is_conversational(prompt) and completion[0]["role"] == "assistant"
    assert len(history.rows) == 1 and math.isfinite(history.rows[0]["loss"])
    assert any(not torch.equal(p, q) for p, q in zip(lm.parameters(), before, strict=True))
