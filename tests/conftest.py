"""Fixtures shared by the test modules."""

import pytest
import torch

from minirl import decoding, models, tasks
from minirl.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def tok():
    """The char-level tokenizer every tiny model of the tests uses."""
    return build_tokenizer()


@pytest.fixture(scope="module")
def moe_rollout(tok):
    """A randomly initialised tiny MoE (default sizes: 4 layers, 8 experts, top-2) and 8 sampled completions."""
    torch.manual_seed(0)
    model = models.tiny_moe(tok, seed=0)
    prompts = list(tasks.load_split("train").select(range(4))["prompt"])
    r = decoding.generate(model, tok, prompts, group_size=2, max_new_tokens=12, record_routes=True)
    return model, r
