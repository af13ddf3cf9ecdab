"""Tests of minirl.models: sizes of the tiny models, save/load round trip, the MoE experts kernel."""

from functools import partial

import helpers
import pytest
import torch

from minirl import models
from minirl.tokenizer import build_tokenizer

close = partial(helpers.close, atol=5e-7)


def test_default_sizes_are_in_the_advertised_range(tok):
    dense, moe = models.tiny_dense(tok), models.tiny_moe(tok)
    n_dense, n_moe = models.count_parameters(dense), models.count_parameters(moe)
    assert 0.5e6 <= n_dense <= 2.5e6, n_dense
    assert 0.5e6 <= n_moe <= 2.5e6, n_moe
    assert not models.is_moe(dense) and models.is_moe(moe)
    assert dense.config.vocab_size == len(tok) and dense.config.eos_token_id == tok.eos_token_id


def test_moe_experts_kernel_is_never_batched_mm(tok):
    moe = models.tiny_moe(tok, hidden_size=32, num_layers=1, num_heads=2, num_experts=4, expert_size=16)
    assert models.EXPERTS_IMPLEMENTATION != "batched_mm"
    assert moe.config._experts_implementation in ("eager", "grouped_mm")


def test_same_seed_same_weights(tok):
    a = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    b = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, seed=3)
    c = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_save_pretrained_then_load_gives_identical_logits(tok, tmp_path, kind):
    if kind == "dense":
        model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2)
    else:
        model = models.tiny_moe(tok, hidden_size=32, num_layers=1, num_heads=2, num_experts=4, expert_size=16)
    model.save_pretrained(tmp_path)
    loaded = models.load(str(tmp_path))
    assert type(loaded) is type(model)
    if kind == "moe":
        assert loaded.config._experts_implementation == models.EXPERTS_IMPLEMENTATION
    enc = tok(["1+2=", "3+4+5="], return_tensors="pt", padding=True)
    model.eval(), loaded.eval()
    with torch.no_grad():
        a = model(**enc).logits
        b = loaded(**enc).logits
    assert torch.equal(a, b)


def test_load_of_a_missing_directory_raises(tmp_path):
    with pytest.raises(OSError):
        models.load(str(tmp_path / "nothing-here"))


def test_a_local_path_that_does_not_exist_is_no_such_folder_without_asking_the_hub(tmp_path, monkeypatch):
    """Issue 47 item 12: a mistyped local path was taken for a hub name (about 60 s of retries online) and the
    error never said the folder does not exist."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    local = ["./qwen3", "../qwen3", "/no/such/folder", "~/qwen3-nowhere", "runs/policy", "a/b/c", "a\\b"]
    hub = ["Qwen/Qwen3-0.6B", "gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert [models.looks_local(s) for s in local + hub] == [True] * len(local) + [False] * len(hub)
    with pytest.raises(FileNotFoundError, match="no such folder: runs/policy$"):
        models.load("runs/policy")
    (tmp_path / "runs" / "weights.bin").write_text("")
    with pytest.raises(FileNotFoundError, match=r"no such folder: runs/weights.bin \(it is a file\)"):
        models.check_model_path("runs/weights.bin")
    assert models.check_model_path("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"  # a hub name is left to the hub
    assert models.check_model_path("runs") == "runs"  # a folder without tokenizer=True needs nothing more
    with pytest.raises(ValueError, match=r"runs has no tokenizer files: none of tokenizer.json, .*\(it holds "
                                         r"weights.bin\)"):
        models.check_model_path("runs", tokenizer=True)


# ------------------------------------------------------------------------------------------------------ critic
def test_value_model_is_a_separate_copy_that_starts_at_zero():
    tok = build_tokenizer()
    policy = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    critic = models.ValueModel(policy)
    assert all(p.data_ptr() != q.data_ptr() for p in critic.parameters() for q in policy.parameters())
    ids = torch.tensor([[0, 2, 5, 6, 7, 8], [2, 5, 5, 6, 9, 1]])
    am = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    v = models.token_values(critic, ids, am, n_prompt_tokens=3)  # completion = the last 3 positions
    assert v.shape == (2, 3) and v.dtype == torch.float32
    close(v.double(), torch.zeros(2, 3))  # zero head: no confident wrong values before training
    with torch.no_grad():
        critic.head.bias.fill_(1.0)
        critic.head.weight.normal_()
    full = critic(ids, am)  # (B, L): the value after each position
    close(models.token_values(critic, ids, am, 3), full[:, 2:5])  # V(s_t) is read where token t is predicted
    # the head is made on the policy's device (the first GPU run: a critic of a CUDA policy had a CPU head);
    # "meta" stands in for another device here
    assert {p.device.type for p in models.ValueModel(policy.to("meta")).parameters()} == {"meta"}
