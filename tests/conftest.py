"""Fixtures shared by the test modules."""

import pytest

from minirl.tokenizer import build_tokenizer


@pytest.fixture(scope="session")
def tok():
    """The char-level tokenizer every tiny model of the tests uses."""
    return build_tokenizer()
