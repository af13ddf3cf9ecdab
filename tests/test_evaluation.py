"""Tests of minirl.evaluation: the true sequence KL (sequence_kl, fresh_sample_kl) on a bigram "language model" small
enough to enumerate and on the tiny Qwen3, and the held-out evaluation (evaluate, show_completions)."""

import itertools
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_model

from minirl import decoding, evaluation, kl, models, rollout, tasks
from minirl.tokenizer import build_tokenizer

D = torch.float64


# --- sequence_kl on a bigram "language model" small enough to enumerate ---------------------------------------------
# Vocabulary {0: EOS (also the pad), 1, 2}; the prompt is the single token 1; completions are at most T = 3 tokens:
# [0], [a, 0], [a, b, 0], [a, b, c] with a, b, c in {1, 2}: 1 + 2 + 4 + 8 = 15 sequences whose probabilities sum to 1.
class Bigram(torch.nn.Module):
    """logits of the next token depend only on the current token: a (V, V) table."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])  # (B, L, V)


def all_completions(T=3, eos=0, letters=(1, 2)):
    seqs = []
    for n in range(T):  # n letters then EOS
        seqs += [list(p) + [eos] for p in itertools.product(letters, repeat=n)]
    seqs += [list(p) for p in itertools.product(letters, repeat=T)]  # truncated, no EOS
    return seqs


def enumerated_rollout(T=3):
    seqs = all_completions(T)
    comp = torch.tensor([s + [0] * (T - len(s)) for s in seqs])  # (15, T), padded with 0 after EOS
    mask = rollout.completion_mask(comp, 0)  # (15, T)
    input_ids = torch.cat([torch.ones(len(seqs), 1, dtype=torch.long), comp], dim=1)  # prompt token 1
    attention_mask = torch.cat([torch.ones(len(seqs), 1), mask], dim=1).long()
    return rollout.Rollout(input_ids=input_ids, attention_mask=attention_mask, completion_ids=comp,
                           completion_mask=mask, truncated=mask.sum(-1) == T, prompt_index=torch.zeros(len(seqs)),
                           completions=[""] * len(seqs), logprobs=torch.zeros_like(mask), group_size=len(seqs))


def bigram_pair(seed=0):
    g = torch.Generator().manual_seed(seed)
    return Bigram(torch.randn(3, 3, generator=g)), Bigram(torch.randn(3, 3, generator=g))  # float32, as token_logprobs


def test_enumerated_completions_are_a_distribution():
    policy, _ = bigram_pair()
    r = enumerated_rollout()
    logp = rollout.token_logprobs(policy, r.input_ids, r.attention_mask, 1) * r.completion_mask
    assert len(r.completions) == 15
    torch.testing.assert_close(logp.sum(-1).exp().sum(), torch.tensor(1.0), atol=1e-6, rtol=0)


# paper-index: evaluation.sequence_kl
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sequence_kl_averages_to_the_enumerated_sequence_kl(temperature):
    # E_y[sequence_kl(y)] = sum_y pi(y) log(pi(y) / ref(y)) (chain rule), with pi(y) over the 15 sequences
    policy, ref = bigram_pair()
    r = enumerated_rollout()
    m = r.completion_mask
    logp = rollout.token_logprobs(policy, r.input_ids, r.attention_mask, 1, temperature=temperature) * m  # (15, T)
    ref_logp = rollout.token_logprobs(ref, r.input_ids, r.attention_mask, 1, temperature=temperature) * m
    p_seq = logp.sum(-1).exp().detach()  # (15,)
    true_kl = (p_seq * (logp - ref_logp).sum(-1)).sum()
    seq_kl, entropy = evaluation.sequence_kl(policy, ref, r, temperature=temperature)
    assert true_kl > 0.05  # a real difference between the two models
    torch.testing.assert_close((p_seq * seq_kl).sum(), true_kl.detach(), atol=1e-5, rtol=0)
    # k1 summed over the row has the same mean (unbiased) but a larger variance (Rao-Blackwell)
    k1_sum = kl.k1(logp, ref_logp).sum(-1).detach()
    torch.testing.assert_close((p_seq * k1_sum).sum(), true_kl.detach(), atol=1e-6, rtol=0)
    var = lambda x: (p_seq * (x - (p_seq * x).sum()) ** 2).sum()
    assert var(seq_kl) < var(k1_sum)
    # the entropy output is the enumerated sequence entropy in expectation as well
    torch.testing.assert_close((p_seq * entropy).sum(), -(p_seq * logp.sum(-1)).sum().detach(), atol=1e-5, rtol=0)


def test_sequence_kl_is_zero_against_itself():
    policy, _ = bigram_pair()
    seq_kl, _ = evaluation.sequence_kl(policy, policy, enumerated_rollout())
    assert seq_kl.abs().max() < 1e-6


def test_sequence_kl_ignores_positions_after_eos():
    policy, ref = bigram_pair()
    r = enumerated_rollout()
    before, _ = evaluation.sequence_kl(policy, ref, r)
    r.input_ids[:, 1:] = torch.where(r.completion_mask > 0, r.completion_ids, torch.full_like(r.completion_ids, 2))
    after, _ = evaluation.sequence_kl(policy, ref, r)  # different padding tokens, same valid prefixes
    torch.testing.assert_close(before, after)


# --- on the real tiny Qwen3: matches the mean of k1 sums within Monte-Carlo error --------------------------------
@pytest.fixture(scope="module")
def tiny_pair():
    tok = build_tokenizer()
    policy = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0).eval()
    ref = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1).eval()
    return policy, ref, tok


def test_sequence_kl_matches_k1_on_many_samples_of_a_real_model(tiny_pair):
    policy, ref, tok = tiny_pair
    torch.manual_seed(0)
    r = decoding.generate(policy, tok, ["1+2=", "3+4+5="], group_size=200, max_new_tokens=4)
    with torch.no_grad():
        ref_logp = rollout.token_logprobs(ref, r.input_ids, r.attention_mask, r.n_prompt_tokens)
    k1_sum = (kl.k1(r.logprobs, ref_logp) * r.completion_mask).sum(-1)  # (400,)
    seq_kl, _ = evaluation.sequence_kl(policy, ref, r)
    diff = k1_sum - seq_kl  # mean 0; its spread sets the tolerance
    assert abs(float(diff.mean())) < 4 * float(diff.std()) / len(diff) ** 0.5
    assert float(seq_kl.std()) < float(k1_sum.std())  # the exact per-position sum is the low-variance one
    assert float(seq_kl.mean()) > 0.02  # two random inits: ~0.012 nats per token over 4 tokens


def test_fresh_sample_kl_is_repeatable_and_leaves_the_rng_alone(tiny_pair):
    policy, ref, tok = tiny_pair
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a = evaluation.fresh_sample_kl(policy, ref, tok, ["1+2=", "4+4="], samples_per_prompt=8, max_new_tokens=4, seed=5)
    assert torch.equal(torch.rand(3), expected_next)  # the training RNG did not move
    b = evaluation.fresh_sample_kl(policy, ref, tok, ["1+2=", "4+4="], samples_per_prompt=8, max_new_tokens=4, seed=5)
    assert a == b and a["n"] == 16 and a["kl"] > 0
    same = evaluation.fresh_sample_kl(policy, policy, tok, ["1+2=", "4+4="], samples_per_prompt=8, max_new_tokens=4,
                                      seed=5)
    assert abs(same["kl"]) < 1e-5 and same["entropy"] > 0


def test_fresh_sample_kl_scores_the_same_samples_when_given_answers(tiny_pair):
    policy, ref, tok = tiny_pair
    out = evaluation.fresh_sample_kl(policy, ref, tok, ["1+2=", "4+4="], samples_per_prompt=4, max_new_tokens=4,
                                     seed=5, answers=["3", "8"])
    assert out["accuracy"] == 0.0  # a random model, 4 tokens: no "#answer" yet
    assert out["kl"] == evaluation.fresh_sample_kl(policy, ref, tok, ["1+2=", "4+4="], samples_per_prompt=4,
                                                   max_new_tokens=4, seed=5)["kl"]
    with pytest.raises(ValueError, match="answers"):
        evaluation.fresh_sample_kl(policy, ref, tok, ["1+2=", "4+4="], samples_per_prompt=4, max_new_tokens=4,
                                   answers=["3"])



def test_fresh_sample_kl_scores_the_same_samples_with_a_reward_function(tiny_pair):
    """``reward_fn`` sees exactly the fresh prompts and completions the KL was measured on (one entry per sample)."""
    policy, ref, tok = tiny_pair
    seen = []

    def length(prompts, completions, **kw):
        seen.append((list(prompts), list(completions)))
        return [float(len(c)) for c in completions]

    out = evaluation.fresh_sample_kl(policy, ref, tok, ["1+2=", "4+4="], samples_per_prompt=3, max_new_tokens=4,
                                     seed=5, reward_fn=length)
    (prompts, completions), = seen
    assert prompts == ["1+2="] * 3 + ["4+4="] * 3
    assert out["reward"] == pytest.approx(sum(len(c) for c in completions) / 6)
    plain = evaluation.fresh_sample_kl(policy, ref, tok, ["1+2=", "4+4="], samples_per_prompt=3, max_new_tokens=4,
                                       seed=5)
    assert "reward" not in plain and plain["kl"] == out["kl"]  # the same samples

# --- held-out evaluation: evaluate, show_completions ------------------------------------------------------------------
def test_evaluate_is_repeatable_and_leaves_the_rng_alone(tok):
    model = tiny_model(tok)
    data = tasks.load_split("test").select(range(6))
    state = torch.get_rng_state()
    a = evaluation.evaluate(model, tok, data, max_new_tokens=8, temperature=1.0, samples_per_prompt=2, batch_size=4)
    assert torch.equal(torch.get_rng_state(), state)  # evaluating does not change the course of training
    b = evaluation.evaluate(model, tok, data, max_new_tokens=8, temperature=1.0, samples_per_prompt=2, batch_size=4)
    assert a == b
    assert a["n"] == 12 and set(a) >= {"accuracy", "format_rate", "mean_length", "truncated_rate", "n"}
    assert 0 <= a["accuracy"] <= a["format_rate"] <= 1 and 1 <= a["mean_length"] <= 8
    g = evaluation.evaluate(model, tok, data, max_new_tokens=8, greedy=True, samples_per_prompt=5)
    assert g["n"] == 6  # greedy takes one completion per prompt


def test_evaluate_standard_error_over_prompts_by_hand(tok):
    """A reward that depends only on the prompt: prompt 0 always right, prompt 1 always wrong, 2 samples each.
    Over completions the scores are [1, 1, 0, 0]: std (n - 1) = sqrt(1/3) = 0.57735, SE = 0.57735 / 2 = 0.28868.
    Over prompts the means are [1, 0]: std = sqrt(1/2) = 0.70711, SE = 0.70711 / sqrt(2) = 0.5, the honest one,
    because a prompt's two completions carry one prompt's worth of information."""
    data = tasks.load_split("test").select(range(2))
    first = data["prompt"][0]

    def by_prompt(prompts, completions, **kw):
        return [1.0 if p == first else 0.0 for p in prompts]

    out = evaluation.evaluate(tiny_model(tok), tok, data, max_new_tokens=4, samples_per_prompt=2, reward_fn=by_prompt)
    assert out["accuracy"] == 0.5
    assert out["accuracy_stderr"] == pytest.approx(3 ** -0.5 / 2, abs=1e-6)
    assert out["accuracy_stderr_prompts"] == pytest.approx(0.5, abs=1e-6)


def test_show_completions_gives_each_model_the_same_prompts_and_scores_them(tok, capsys):
    rows = tasks.load_split("test").select(range(2))
    a, b = tiny_model(tok, seed=0), tiny_model(tok, seed=1)
    out = evaluation.show_completions({"a": a, "b": b}, tok, rows, max_new_tokens=6, samples_per_prompt=2)
    assert [r["model"] for r in out] == ["a"] * 4 + ["b"] * 4
    assert [r["prompt"] for r in out[:4]] == [rows[0]["prompt"]] * 2 + [rows[1]["prompt"]] * 2
    answer = {row["prompt"]: row["answer"] for row in rows}
    for r in out:  # the reward is the task's score of the completion shown
        assert r["reward"] == float(tasks.score(r["completion"], answer[r["prompt"]]).correct)
    assert len(capsys.readouterr().out.strip().splitlines()) == 8
    again = evaluation.show_completions({"a": a}, tok, rows, max_new_tokens=6, samples_per_prompt=2)
    assert [r["completion"] for r in again] == [r["completion"] for r in out[:4]]  # seeded: repeatable
