"""Tests of minirl.rollout: completion masks, token log-probs at the sampling temperature, generate, concat."""

from types import SimpleNamespace

import pytest
import torch

from minirl import models, rollout
from minirl.tokenizer import build_tokenizer


def close(actual, expected, atol=5e-7):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


# --- completion_mask -----------------------------------------------------------------------------------------------
def test_completion_mask_of_the_issue():
    # EOS 2, pad 0: row 0 ends at its EOS (kept), row 1 too (the 9s after it are junk), row 2 has no EOS: truncated
    ids = torch.tensor([[5, 7, 2, 0, 0], [5, 2, 9, 9, 9], [4, 4, 4, 4, 4]])
    m = rollout.completion_mask(ids, 2)
    assert torch.equal(m, torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float))


def test_completion_mask_with_several_eos_ids():
    # Llama-3-style end tokens {32000, 32007}: either ends the completion, the first one counts
    ids = torch.tensor([[5, 32007, 4, 4], [32000, 5, 32007, 4], [5, 5, 5, 5]])
    m = rollout.completion_mask(ids, [32000, 32007])
    assert torch.equal(m, torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float))
    assert torch.equal(rollout.completion_mask(ids[:1], {32000, 32007}), m[:1])  # a set works too


def test_completion_mask_never_uses_the_pad_id():
    # EOS 2, pad 0: a pad id sampled INSIDE the completion is an ordinary token, the mask runs to the EOS
    ids = torch.tensor([[5, 0, 7, 2, 0]])
    assert rollout.completion_mask(ids, 2).tolist() == [[1, 1, 1, 1, 0]]


def test_completion_mask_when_pad_equals_eos():
    # pad id == EOS id == 0 (common for tokenizers without a pad token): the first 0 is the EOS, kept; the
    # padding after it is dropped; a row with no 0 at all is truncated (all ones)
    ids = torch.tensor([[5, 6, 0, 0, 0], [0, 0, 0, 0, 0], [5, 6, 7, 8, 9]])
    m = rollout.completion_mask(ids, 0)
    assert m.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_completion_mask_bad_input():
    with pytest.raises(ValueError, match="completion_ids"):
        rollout.completion_mask(torch.tensor([5, 2, 0]), 2)
    with pytest.raises(ValueError, match="eos_token_id"):
        rollout.completion_mask(torch.tensor([[5, 2, 0]]), [])


# --- token_logprobs with a fake model of fixed logits ---------------------------------------------------------------
class FixedLogits(torch.nn.Module):
    """A 'language model' whose next-token logits are the same vector at every position."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        B, L = input_ids.shape
        return SimpleNamespace(logits=self.logits.expand(B, L, -1))


def test_logprob_at_temperature_half_by_hand():
    # logits [2, 1, 0] / 0.5 = [4, 2, 0]; log p(0) = 4 - log(e^4 + e^2 + 1) = -log(1 + e^-2 + e^-4)
    #   = -log(1 + 0.135335 + 0.018316) = -log(1.153651) = -0.142932
    # log p(1) = -2 - 0.142932 = -2.142932; log p(2) = -4.142932
    model = FixedLogits([2.0, 1.0, 0.0])
    ids = torch.tensor([[2, 1, 0, 1, 2]])  # prompt = the first 2 ids, completion = tokens 0, 1, 2
    lp = rollout.token_logprobs(model, ids, torch.ones_like(ids), 2, temperature=0.5)
    close(lp, [[-0.142932, -2.142932, -4.142932]])
    # at temperature 1 the same token has log p(0) = -log(1 + e^-1 + e^-2) = -log(1.503215) = -0.407606:
    # computing the log-probs at the wrong temperature is visibly wrong
    lp1 = rollout.token_logprobs(model, ids[:, :3], torch.ones(1, 3, dtype=torch.long), 2, temperature=1.0)
    close(lp1, [[-0.407606]])


def test_entropy_at_temperature_half_by_hand():
    # p = (e^-0.142932, e^-2.142932, e^-4.142932) = (0.866813, 0.117310, 0.015876)
    # H = 0.866813 * 0.142932 + 0.117310 * 2.142932 + 0.015876 * 4.142932 = 0.123896 + 0.251388 + 0.065774
    #   = 0.441057 nats
    model = FixedLogits([2.0, 1.0, 0.0])
    ids = torch.tensor([[2, 1, 0]])
    lp, ent = rollout.token_logprobs(model, ids, torch.ones_like(ids), 2, temperature=0.5, return_entropy=True)
    close(ent, [[0.441057]], atol=2e-6)
    assert lp.dtype == torch.float32


def test_completion_logits_are_the_positions_that_predict_the_completion():
    class PositionLogits(torch.nn.Module):
        """Logits at position t are [t, 0]: the slice shows which positions were kept."""

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
            B, L = input_ids.shape
            t = torch.arange(L, dtype=torch.float32).expand(B, L)
            return SimpleNamespace(logits=torch.stack([t, torch.zeros_like(t)], -1))

    ids = torch.tensor([[2, 1, 0, 1, 1]])  # P = 2: the completion ids[:, 2:] is predicted by positions 1, 2, 3
    logits = rollout.completion_logits(PositionLogits(), ids, torch.ones_like(ids), 2)
    assert logits.shape == (1, 3, 2)
    assert logits[0, :, 0].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="n_prompt_tokens"):
        rollout.completion_logits(PositionLogits(), ids, torch.ones_like(ids), 5)


def test_token_logprobs_bad_input():
    model = FixedLogits([2.0, 1.0, 0.0])
    ids = torch.tensor([[2, 1, 0]])
    with pytest.raises(ValueError, match="temperature"):
        rollout.token_logprobs(model, ids, torch.ones_like(ids), 2, temperature=0.0)
    with pytest.raises(ValueError, match="n_prompt_tokens"):
        rollout.token_logprobs(model, ids, torch.ones_like(ids), 3)
    with pytest.raises(ValueError, match="n_prompt_tokens"):
        rollout.token_logprobs(model, ids, torch.ones_like(ids), 0)
    with pytest.raises(ValueError, match="attention_mask"):
        rollout.token_logprobs(model, ids, torch.ones(1, 4), 2)


def test_sequence_logprobs():
    lp = torch.tensor([[-1.0, -2.0, -3.0, 9.0], [-4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # sums: -1 - 2 - 3 = -6 and -4; means: -6 / 3 = -2 and -4 / 1 = -4 (the 9s are masked)
    close(rollout.sequence_logprobs(lp, mask, "sum"), [-6.0, -4.0])
    close(rollout.sequence_logprobs(lp, mask, "mean"), [-2.0, -4.0])
    with pytest.raises(ValueError, match="no valid token"):
        rollout.sequence_logprobs(lp, torch.zeros(2, 4), "mean")
    with pytest.raises(ValueError, match="reduction"):
        rollout.sequence_logprobs(lp, mask, "max")


# --- a real tiny model ---------------------------------------------------------------------------------------------
# A small vocabulary (18 ids) makes the random model emit EOS often enough (about 1 in 18 tokens) that a batch has
# completions ending early and completions cut at max_new_tokens.
@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer("0123456789+=;#")
    model = models.tiny_dense(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)
    return model, tok


PROMPTS = ["1+2=", "3+4+5+6+7=", "8+9+1="]  # different lengths, so the batch is left-padded


def test_recomputed_logprobs_match_the_samplers_scores(tiny):
    # transformers' generate(output_scores=True) returns the processed logits it sampled from (logits / T);
    # token_logprobs, one ordinary forward pass, must reproduce their log-softmax on every valid token
    model, tok = tiny
    T = 0.7
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, am = enc.input_ids.repeat_interleave(4, 0), enc.attention_mask.repeat_interleave(4, 0)
    torch.manual_seed(0)
    model.eval()
    out = model.generate(input_ids=ids, attention_mask=am, max_new_tokens=12, do_sample=True, temperature=T,
                         top_k=0, top_p=1.0, output_scores=True, return_dict_in_generate=True,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    P = ids.shape[1]
    completion = out.sequences[:, P:]
    mask = rollout.completion_mask(completion, tok.eos_token_id)
    assert 0 < mask.sum() < mask.numel()  # some rows end early: the test covers the padding after EOS
    sampler = torch.stack(out.scores, 1).float().log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    full_am = torch.cat([am, mask.long()], 1)
    with torch.no_grad():
        recomputed = rollout.token_logprobs(model, out.sequences, full_am, P, temperature=T)
        at_one = rollout.token_logprobs(model, out.sequences, full_am, P, temperature=1.0)
    torch.testing.assert_close(recomputed * mask, sampler * mask, atol=1e-5, rtol=0)
    # the classic bug: the same tokens scored at temperature 1 are off by far more than the tolerance
    assert ((at_one - sampler).abs() * mask).max() > 1e-2


def test_generate_behaviour_logprobs_are_the_samplers(tiny):
    # rollout.generate and a direct generate(output_scores=True) with the same seed draw the same tokens; the
    # rollout's behaviour log-probs must equal the sampler's, at the sampler's temperature
    model, tok = tiny
    T, G = 0.6, 3
    torch.manual_seed(5)
    r = rollout.generate(model, tok, PROMPTS, G, max_new_tokens=10, temperature=T)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    torch.manual_seed(5)
    out = model.generate(input_ids=enc.input_ids.repeat_interleave(G, 0),
                         attention_mask=enc.attention_mask.repeat_interleave(G, 0), max_new_tokens=10,
                         do_sample=True, temperature=T, top_k=0, top_p=1.0, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    assert torch.equal(out.sequences, r.input_ids)
    sampler = torch.stack(out.scores, 1).float().log_softmax(-1).gather(
        -1, r.completion_ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(r.logprobs, sampler * r.completion_mask, atol=1e-5, rtol=0)


def test_rollout_fields_are_consistent(tiny):
    model, tok = tiny
    model.train()
    torch.manual_seed(1)
    r = rollout.generate(model, tok, PROMPTS, 4, max_new_tokens=12, temperature=1.3)
    assert model.training  # the train/eval mode is restored
    B, T = r.completion_ids.shape
    assert B == 12 and r.n_prompt_tokens == r.input_ids.shape[1] - T
    assert r.prompt_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # laid out group by group
    assert torch.equal(r.completion_mask, rollout.completion_mask(r.completion_ids, tok.eos_token_id))
    has_eos = (r.completion_ids == tok.eos_token_id).any(-1)
    assert torch.equal(r.truncated, ~has_eos)
    assert r.truncated.any() and (~r.truncated).any()  # both kinds occur in this batch
    assert torch.equal(r.lengths[r.truncated], torch.full((int(r.truncated.sum()),), float(T)))
    assert torch.equal(r.logprobs * (1 - r.completion_mask), torch.zeros(B, T))  # 0 where masked
    assert (r.logprobs <= 0).all()
    assert torch.equal(r.attention_mask[:, r.n_prompt_tokens:], r.completion_mask.long())
    assert r.completions == tok.batch_decode(r.completion_ids, skip_special_tokens=True)
    # recomputed in train mode (no dropout in these models), the log-probs are the same
    with torch.no_grad():
        lp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens, 1.3)
    torch.testing.assert_close(lp * r.completion_mask, r.logprobs, atol=1e-5, rtol=0)


def test_logprobs_do_not_depend_on_left_padding(tiny):
    # the same prompt + completion alone, and left-padded next to a longer prompt, get the same log-probs: the
    # padding is masked out and the completion slice is taken at the padded prompt length. (Qwen3's RoPE only sees
    # relative positions, so this guards the masking and slicing more than the position ids.)
    model, tok = tiny
    eos = tok.eos_token_id
    short = tok("1+2=").input_ids + tok("3#3", add_special_tokens=False).input_ids + [eos]  # P = 5, T = 4
    long_p = tok("3+4+5+6+7=").input_ids  # 11 ids
    long = long_p + tok("25#2", add_special_tokens=False).input_ids
    P_short = 5
    alone = torch.tensor([short])
    pad = len(long_p) - P_short
    batch = torch.tensor([[tok.pad_token_id] * pad + short, long])
    am = torch.tensor([[0] * pad + [1] * len(short), [1] * len(long)])
    with torch.no_grad():
        lp_alone = rollout.token_logprobs(model, alone, torch.ones_like(alone), P_short, temperature=0.8)
        lp_batch = rollout.token_logprobs(model, batch, am, len(long_p), temperature=0.8)
    torch.testing.assert_close(lp_batch[0], lp_alone[0], atol=1e-5, rtol=0)


def test_select_groups_and_concat_keep_logprobs_valid(tiny):
    # two rollouts with different prompt and completion lengths, concatenated: the re-padded batch must still
    # give the stored behaviour log-probs when recomputed
    model, tok = tiny
    torch.manual_seed(2)
    a = rollout.generate(model, tok, ["1+2=", "7+7+7+7="], 2, max_new_tokens=5, temperature=0.9)
    b = rollout.generate(model, tok, ["3+4+5+6+7=", "1+1="], 2, max_new_tokens=9, temperature=0.9)
    sel = rollout.select_groups(b, [1])
    assert sel.prompt_index.tolist() == [1, 1] and torch.equal(sel.input_ids, b.input_ids[2:4])
    c = rollout.concat([a, sel], tok.pad_token_id)
    assert c.input_ids.shape == (6, b.n_prompt_tokens + 9)
    assert c.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    with torch.no_grad():
        lp = rollout.token_logprobs(model, c.input_ids, c.attention_mask, c.n_prompt_tokens, 0.9)
    torch.testing.assert_close(lp * c.completion_mask, c.logprobs, atol=1e-5, rtol=0)


def test_generate_bad_input(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="group_size"):
        rollout.generate(model, tok, PROMPTS, 0, 4)
    with pytest.raises(ValueError, match="temperature"):
        rollout.generate(model, tok, PROMPTS, 2, 4, temperature=0.0)
    with pytest.raises(ValueError, match="prompt"):
        rollout.generate(model, tok, [], 2, 4)
