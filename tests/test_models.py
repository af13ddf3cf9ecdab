"""Tests of minirl.models: sizes of the tiny models, save/load round trip, the MoE experts kernel."""

import pytest
import torch

from minirl import models


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
