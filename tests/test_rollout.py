"""Tests of minirl.rollout: completion masks, token log-probs at the sampling temperature, generate, concat."""

import math
from functools import partial
from types import SimpleNamespace

import helpers
import pytest
import torch
from transformers import GenerationConfig

from minirl import decoding, models, rollout
from minirl.tokenizer import build_tokenizer

close = partial(helpers.close, atol=5e-7, dtype=torch.float64)


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


def test_completion_only_head_same_logprobs_gradient_within_round_off():
    # The LM head on the completion positions only (logits_to_keep) gives the very same log-probs; its gradient is
    # the same up to round-off (another shape of matrix product), which is why RLConfig.completion_only_head is a
    # setting, off by default: the toy's stored figures were made with the full head.
    torch.manual_seed(0)
    model = models.tiny_dense(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2)
    ids = torch.randint(3, 50, (3, 9))
    mask = torch.ones_like(ids)
    grads = {}
    for keep in (True, False):
        model.zero_grad()
        lp = rollout.token_logprobs(model, ids, mask, 4, completion_only=keep)
        lp.sum().backward()
        grads[keep] = (lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.equal(grads[True][0], grads[False][0])
    gap = (grads[True][1] - grads[False][1]).abs().max().item()
    assert gap <= 1e-5 * grads[False][1].abs().max().item()


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
    close(rollout.sequence_logprobs(lp, mask, reduction="sum"), [-6.0, -4.0])
    close(rollout.sequence_logprobs(lp, mask, reduction="mean"), [-2.0, -4.0])
    with pytest.raises(ValueError, match="no valid token"):
        rollout.sequence_logprobs(lp, torch.zeros(2, 4), reduction="mean")
    with pytest.raises(ValueError, match="reduction"):
        rollout.sequence_logprobs(lp, mask, reduction="max")


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
    # decoding.generate and a direct generate(output_scores=True) with the same seed draw the same tokens; the
    # rollout's behaviour log-probs must equal the sampler's, at the sampler's temperature
    model, tok = tiny
    T, G = 0.6, 3
    torch.manual_seed(5)
    r = decoding.generate(model, tok, PROMPTS, G, max_new_tokens=10, temperature=T)
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


# --- no sampler setting leaks from a checkpoint's generation_config.json ------------------------------------------
def checkpoint(tmp_path, tok, small=True, **generation_settings):
    """A sharp tiny model (final-norm weight x6, so the logits are far from uniform and every logits processor
    would matter) saved with the given generation_config.json and loaded back with models.load."""
    sizes = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64) if small else {}
    model = models.tiny_dense(tok, seed=0, **sizes)
    with torch.no_grad():
        model.model.norm.weight.mul_(6)
    model.generation_config = GenerationConfig(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                               bos_token_id=tok.bos_token_id, **generation_settings)
    model.save_pretrained(tmp_path)
    lm = models.load(str(tmp_path))
    assert all(getattr(lm.generation_config, k) is not None for k in generation_settings)  # really there
    return lm


def test_checkpoint_repetition_penalty_does_not_reach_the_sampler(tmp_path):
    # The classic case: generation_config.repetition_penalty = 1.05 in the checkpoint. transformers' repetition
    # penalty divides the logit z_i of every token already in the sequence by 1.05 if z_i > 0 (else multiplies
    # it), so generate() would draw from log_softmax(z~) while the behaviour log-prob is log_softmax(z)[token].
    # minirl's decode loop reads no generation config: it draws from plain softmax(z). Compute both by hand.
    tok = build_tokenizer()
    lm = checkpoint(tmp_path, tok, small=False, repetition_penalty=1.05)
    torch.manual_seed(0)
    r = decoding.generate(lm, tok, ["1+2="], 1, 1)
    ids = tok(["1+2="], return_tensors="pt").input_ids  # (1, P): <bos> 1 + 2 =
    with torch.no_grad():
        z = lm(input_ids=ids).logits[0, -1].float()  # (V,) the logits of the first completion token
    token = r.completion_ids[0, 0]
    plain = z.log_softmax(-1)[token]
    seen = torch.zeros_like(z, dtype=torch.bool)
    seen[ids[0]] = True
    penalised = torch.where(seen, torch.where(z > 0, z / 1.05, z * 1.05), z).log_softmax(-1)[token]
    assert abs(plain - penalised) > 1e-2  # the checkpoint's setting would have changed the distribution
    close(r.logprobs[0, 0], plain, atol=1e-5)
    close(r.sampler_logprobs[0, 0], plain, atol=1e-5)  # the sampler drew from plain softmax(z)
    assert lm.generation_config.repetition_penalty == 1.05  # the model's own config is untouched


@pytest.mark.parametrize("setting", [
    dict(repetition_penalty=1.5), dict(min_p=0.2), dict(typical_p=0.5), dict(no_repeat_ngram_size=1),
    dict(top_k=3), dict(top_p=0.5), dict(temperature=0.3), dict(epsilon_cutoff=0.05), dict(eta_cutoff=0.05),
    dict(bad_words_ids=[[7], [12]]), dict(suppress_tokens=[5, 6, 7]), dict(begin_suppress_tokens=[5, 6, 7]),
    dict(min_new_tokens=6), dict(sequence_bias={(9,): 4.0}), dict(exponential_decay_length_penalty=(1, 2.0)),
    dict(renormalize_logits=True, top_k=3), dict(num_beams=2), dict(do_sample=False),
], ids=lambda d: "+".join(d))
def test_behaviour_logprobs_are_the_samplers_whatever_the_checkpoint_sets(tmp_path, setting):
    # with the checkpoint's setting in force, generate() would draw from a processed distribution; minirl's
    # sampler draws exactly the tokens it draws from the same weights without the setting, and its log-probs are
    # plain log_softmax(z / T), recomputed by one forward to float precision
    tok = build_tokenizer("0123456789+=;#")
    lm = checkpoint(tmp_path / "set", tok, **{"do_sample": True, **setting})
    bare = checkpoint(tmp_path / "bare", tok)
    T = 0.8
    torch.manual_seed(3)
    r = decoding.generate(lm, tok, PROMPTS, 4, max_new_tokens=8, temperature=T)
    torch.manual_seed(3)
    r_bare = decoding.generate(bare, tok, PROMPTS, 4, max_new_tokens=8, temperature=T)
    assert torch.equal(r.input_ids, r_bare.input_ids)
    with torch.no_grad():
        plain = rollout.token_logprobs(lm, r.input_ids, r.attention_mask, r.n_prompt_tokens, temperature=T)
    torch.testing.assert_close(r.logprobs, plain * r.completion_mask, atol=1e-5, rtol=0)
    torch.testing.assert_close(r.sampler_logprobs, plain * r.completion_mask, atol=1e-5, rtol=0)
    assert all(getattr(lm.generation_config, k) is not None for k in setting)  # the model's config is untouched


def test_greedy_ignores_the_checkpoint_too(tmp_path):
    # greedy: each completion token is the argmax of the plain logits, even with a repetition penalty that
    # would change which token is the largest
    tok = build_tokenizer("0123456789+=;#")
    lm = checkpoint(tmp_path, tok, do_sample=True, repetition_penalty=3.0, no_repeat_ngram_size=1)
    r = decoding.generate(lm, tok, PROMPTS, 1, max_new_tokens=8, greedy=True)
    with torch.no_grad():
        logits = rollout.completion_logits(lm, r.input_ids, r.attention_mask, r.n_prompt_tokens)  # (B, T, V)
    valid = r.completion_mask > 0
    assert torch.equal(r.completion_ids[valid], logits.argmax(-1)[valid])


# --- the decode loop ------------------------------------------------------------------------------------------
class Scripted(torch.nn.Module):
    """A stand-in LM over V = 4 tokens (pad 0, EOS 2) whose next-token logits are scripted by step and row:
    row b puts probability 1 on EOS from step b on, and before that splits it evenly between tokens 1 and 3.
    With ``eos_logit`` set, from step b on EOS gets that logit and tokens 1 and 3 logit 0 (so EOS is not the only
    option). It records the tokens, mask length and positions each call was fed, like a KV-cached forward."""

    def __init__(self, eos_logit=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.fed, self.eos_logit = [], eos_logit

    def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep, cache=None):
        step = 0 if cache is None else cache + 1
        self.fed.append((input_ids.clone(), attention_mask.shape[1], position_ids.clone()))
        B = input_ids.shape[0]
        logits = torch.full((B, 1, 4), -torch.inf)
        for b in range(B):
            if step >= b and self.eos_logit is None:
                logits[b, 0, 2] = 0.0
            else:
                logits[b, 0, [1, 3]] = 0.0
                if step >= b:
                    logits[b, 0, 2] = self.eos_logit
        return {"logits": logits, "cache": step}


# paper-index: decoding.sample_tokens
def test_sample_tokens_by_hand():
    # rows 0, 1, 2 end at steps 0, 1, 2: completion [[EOS, pad, pad], [x, EOS, pad], [x, y, EOS]], x, y in {1, 3};
    # log-probs: log 1 = 0 for EOS, log 1/2 = -0.6931 for each even split, 0 after EOS; three calls, then stop
    model = Scripted()
    ids = torch.tensor([[0, 5, 6], [5, 6, 7], [5, 6, 7]])
    am = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 1, 1]])
    torch.manual_seed(0)
    tokens, logp = decoding.sample_tokens(model, ids, am, 10, eos_token_id=2, pad_token_id=0)
    assert tokens.shape == (3, 3) and len(model.fed) == 3  # stopped when every row was done
    assert tokens[0].tolist() == [2, 0, 0] and tokens[1, 1] == 2 and tokens[2, 2] == 2
    assert {tokens[1, 0].item(), tokens[2, 0].item(), tokens[2, 1].item()} <= {1, 3}
    half = math.log(0.5)
    close(logp, torch.tensor([[0.0, 0.0, 0.0], [half, 0.0, 0.0], [half, half, 0.0]]))
    # the first call reads the prompts; later calls feed one token at the next position, the mask one longer
    assert torch.equal(model.fed[0][2], torch.tensor([[0, 0, 1], [0, 1, 2], [0, 1, 2]]))
    assert torch.equal(model.fed[1][0], tokens[:, :1]) and model.fed[1][1] == 4
    assert torch.equal(model.fed[1][2], torch.tensor([[2], [3], [3]]))


def test_sample_tokens_min_new_tokens_forbids_eos():
    # EOS logit 20 from step 0 (row 0): P(EOS) = e^20 / (e^20 + 2), so without min_new_tokens the row ends at once;
    # with min_new_tokens = 3, EOS is -inf for steps 0-2: an even split, log 1/2 each, then EOS at step 3 with
    # log-prob 20 - log(e^20 + 2) = -4.1e-9
    model = Scripted(eos_logit=20.0)
    ids, am = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    torch.manual_seed(0)
    tokens, logp = decoding.sample_tokens(model, ids, am, 8, eos_token_id=2, pad_token_id=0)
    assert tokens.tolist() == [[2]]
    torch.manual_seed(0)
    tokens, logp = decoding.sample_tokens(model, ids, am, 8, eos_token_id=2, pad_token_id=0, min_new_tokens=3)
    assert tokens.shape == (1, 4) and tokens[0, 3] == 2 and set(tokens[0, :3].tolist()) <= {1, 3}
    half = math.log(0.5)
    close(logp, torch.tensor([[half, half, half, 20 - math.log(math.exp(20) + 2)]]))


@pytest.mark.parametrize("temperature,greedy", [(1.0, False), (0.7, False), (1.0, True)])
def test_sample_tokens_draws_what_generate_draws(tiny, temperature, greedy):
    # the same torch seed gives the same tokens as transformers' generate with plain sampling (top_k 0, top_p 1),
    # and the loop's log-probs are generate's processed scores, log-softmaxed, to float precision
    model, tok = tiny
    model.eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, am = enc.input_ids.repeat_interleave(4, 0), enc.attention_mask.repeat_interleave(4, 0)
    for seed in range(3):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=am, max_new_tokens=12, do_sample=not greedy,
                             temperature=temperature if not greedy else None, top_k=0 if not greedy else None,
                             top_p=1.0 if not greedy else None, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        torch.manual_seed(seed)
        tokens, logp = decoding.sample_tokens(model, ids, am, 12, eos_token_id=tok.eos_token_id,
                                             pad_token_id=tok.pad_token_id, temperature=temperature, greedy=greedy)
        assert torch.equal(out.sequences[:, ids.shape[1]:], tokens)
        mask = rollout.completion_mask(tokens, tok.eos_token_id)
        scores = (torch.stack(out.scores, 1).float() / (temperature if greedy else 1.0)).log_softmax(-1)
        expected = scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * mask
        torch.testing.assert_close(logp, expected, atol=1e-5, rtol=0)


def test_sample_tokens_bad_input(tiny):
    model, tok = tiny
    ids, am = torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long)
    for kwargs in (dict(max_new_tokens=0), dict(temperature=0.0), dict(min_new_tokens=-1)):
        args = {"max_new_tokens": 4, **kwargs}
        with pytest.raises(ValueError, match="max_new_tokens >= 1"):
            decoding.sample_tokens(model, ids, am, args.pop("max_new_tokens"), eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id, **args)


def test_generate_min_new_tokens_and_skipped_recompute(tiny):
    # min_new_tokens (timing only) forbids EOS early; recompute_logprobs=False returns the sampler's log-probs,
    # which equal the recomputed ones to float precision when the sampler is the trainer
    model, tok = tiny
    torch.manual_seed(2)
    r = decoding.generate(model, tok, PROMPTS, 2, max_new_tokens=9, min_new_tokens=9)
    assert r.completion_ids.shape[1] == 9 and bool(r.truncated.all())  # no EOS anywhere
    torch.manual_seed(2)
    a = decoding.generate(model, tok, PROMPTS, 2, max_new_tokens=9)
    torch.manual_seed(2)
    b = decoding.generate(model, tok, PROMPTS, 2, max_new_tokens=9, recompute_logprobs=False)
    assert torch.equal(a.input_ids, b.input_ids) and b.logprobs is b.sampler_logprobs
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="record_routes"):
        decoding.generate(model, tok, PROMPTS, 2, max_new_tokens=4, record_routes=True, recompute_logprobs=False)


def test_rollout_fields_are_consistent(tiny):
    model, tok = tiny
    model.train()
    torch.manual_seed(1)
    r = decoding.generate(model, tok, PROMPTS, 4, max_new_tokens=12, temperature=1.3)
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
        lp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens, temperature=1.3)
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
    a = decoding.generate(model, tok, ["1+2=", "7+7+7+7="], 2, max_new_tokens=5, temperature=0.9)
    b = decoding.generate(model, tok, ["3+4+5+6+7=", "1+1="], 2, max_new_tokens=9, temperature=0.9)
    sel = rollout.select_groups(b, [1])
    assert sel.prompt_index.tolist() == [1, 1] and torch.equal(sel.input_ids, b.input_ids[2:4])
    c = rollout.concat([a, sel], tok.pad_token_id)
    assert c.input_ids.shape == (6, b.n_prompt_tokens + 9)
    assert c.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    with torch.no_grad():
        lp = rollout.token_logprobs(model, c.input_ids, c.attention_mask, c.n_prompt_tokens, temperature=0.9)
    torch.testing.assert_close(lp * c.completion_mask, c.logprobs, atol=1e-5, rtol=0)


def test_generate_bad_input(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="group_size"):
        decoding.generate(model, tok, PROMPTS, 0, 4)
    with pytest.raises(ValueError, match="temperature"):
        decoding.generate(model, tok, PROMPTS, 2, 4, temperature=0.0)
    with pytest.raises(ValueError, match="prompt"):
        decoding.generate(model, tok, [], 2, 4)


def test_sequence_logprobs_of_an_empty_completion_is_never_nan():
    # a completion with 0 valid tokens: "sum" is the empty sum 0; "mean" is undefined -> a clear error, never NaN
    from minirl.rollout import sequence_logprobs

    lp = torch.tensor([[-1.0, -2.0], [-5.0, -5.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    s = sequence_logprobs(lp, mask, reduction="sum")
    assert s.tolist() == [-3.0, 0.0]
    try:
        m = sequence_logprobs(lp, mask, reduction="mean")
    except ValueError as err:
        assert "mask" in str(err)
    else:
        assert not torch.isnan(m).any() and m[1].item() == 0.0
