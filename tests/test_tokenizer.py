"""Tests of minirl.tokenizer: the char-level tokenizer (special tokens, one token per character, left padding, save
and reload)."""

import pytest
from transformers import AutoTokenizer

from minirl.tokenizer import build_tokenizer


def test_special_tokens_are_distinct(tok):
    ids = {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id}
    assert len(ids) == 4
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert tok.padding_side == "left"


def test_one_token_per_character_with_bos_first(tok):
    text = "7+5=12;12+9=21#21"
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1  # <bos> + one id per character
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok(text, add_special_tokens=False).input_ids == ids[1:]


def test_left_padding_of_a_batch(tok):
    enc = tok(["1+2=", "1+2+3="], padding=True)
    # "1+2=" is 5 ids with <bos>, "1+2+3=" is 7: the short one gets 2 pads on the LEFT
    assert enc.input_ids[0][:3] == [0, 0, tok.bos_token_id]
    assert enc.attention_mask[0] == [0, 0, 1, 1, 1, 1, 1]
    assert enc.attention_mask[1] == [1] * 7


def test_repeated_characters_are_refused():
    with pytest.raises(ValueError, match="chars"):
        build_tokenizer("abca")


def test_save_and_reload_round_trips_ids(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    texts = ["7+5=12;12+9=21#21", "1+1=", "hello, world (x*y) <> -3"]
    assert again(texts, padding=True).input_ids == tok(texts, padding=True).input_ids
    assert (again.pad_token_id, again.eos_token_id, again.bos_token_id) == (0, 1, 2)
    assert again.padding_side == "left"
    assert again.decode(again(texts[0]).input_ids, skip_special_tokens=True) == texts[0]
