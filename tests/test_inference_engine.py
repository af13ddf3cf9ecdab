"""Tests of minirl.inference_engine (a sampler that is not the trainer) and Rollout Routing Replay (R3) from its routes,
in the
loop too. (Its settings' validation: test_config.py.)"""

import pytest
import torch

from minirl import config, decoding, models, moe, rl, rollout, tasks
from minirl.inference_engine import make_sampler, sync_sampler
from minirl.tokenizer import build_tokenizer

PROMPTS = ["1+2=", "3+4+5+6+7=", "8+9+1="]  # different lengths: left padding


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer("0123456789+=;#")


def small_moe(tok, seed=0):
    return models.tiny_moe(tok, hidden_size=32, num_layers=2, num_heads=2, num_experts=8, experts_per_token=2,
                           expert_size=32, seed=seed)


def small_dense(tok, seed=0):
    return models.tiny_dense(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=seed)


def recomputed(model, r):
    with torch.no_grad():
        return rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens) * r.completion_mask


# paper-index: inference_engine.make_sampler
def test_the_default_sampler_is_the_trainer_and_a_bfloat16_copy_differs_by_rounding(tok):
    model = small_dense(tok)
    assert make_sampler(model) is model
    sampler = make_sampler(model, dtype="bfloat16")
    assert sampler is not model and next(sampler.parameters()).dtype == torch.bfloat16
    assert not any(p.requires_grad for p in sampler.parameters()) and not sampler.training
    torch.manual_seed(0)
    r = decoding.generate(sampler, tok, PROMPTS, 4, max_new_tokens=10, recompute_logprobs=False)
    gap = (r.sampler_logprobs - recomputed(model, r)).abs()[r.completion_mask > 0]
    # bfloat16 keeps 8 significant bits: relative rounding of about 2^-9 on every weight and activation; on this
    # model the log-probs of the same tokens move by a few thousandths of a nat, never by as much as 0.5
    assert 1e-4 < float(gap.mean()) < 0.05 and float(gap.max()) < 0.5


def test_sync_copies_the_trainers_weights(tok):
    model = small_dense(tok)
    sampler = make_sampler(model, dtype="bfloat16")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    before = next(sampler.parameters()).float().clone()
    sync_sampler(sampler, model)
    after, target = next(sampler.parameters()).float(), next(model.parameters())
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, target, atol=0, rtol=2**-8)  # bfloat16 rounding of the new weights
    sync_sampler(model, model)  # the trainer as its own sampler: nothing to do
    with pytest.raises(ValueError, match="different parameters"):
        sync_sampler(small_moe(tok), model)


def test_logit_noise_has_the_standard_deviation_asked_for(tok):
    # the sampler's next-token logits are the trainer's plus N(0, sigma^2) noise, fresh per token: compare the
    # output layer of the two models on the same input
    model = small_dense(tok)
    sampler = make_sampler(model, logit_noise=0.5, seed=1)
    ids = tok(["1+2+3+4+5="], return_tensors="pt").input_ids
    with torch.no_grad():
        diff = sampler(input_ids=ids).logits - model(input_ids=ids).logits  # (1, L, V)
    assert abs(float(diff.std()) - 0.5) < 0.05 and abs(float(diff.mean())) < 0.05


def test_make_sampler_bad_input(tok):
    model = small_dense(tok)
    with pytest.raises(ValueError, match="dtype"):
        make_sampler(model, dtype="float8")
    with pytest.raises(ValueError, match=">= 0"):
        make_sampler(model, logit_noise=-1.0)
    with pytest.raises(ValueError, match="router"):
        make_sampler(model, router_noise=0.1)  # a dense model has no router to perturb


def test_r3_the_trainer_uses_exactly_the_samplers_experts(tok):
    # the sampler's routes, recorded while decoding with noisy routers, differ from the trainer's own choices;
    # replayed in the trainer's full forward, every token of every layer uses exactly the sampler's experts
    model = small_moe(tok)
    sampler = make_sampler(model, router_noise=1.0, seed=2)
    torch.manual_seed(0)
    r = decoding.generate(sampler, tok, PROMPTS, 4, max_new_tokens=10, recompute_logprobs=False,
                         record_sampler_routes=True)
    L = r.input_ids.shape[1]
    assert all(ix.shape[:2] == (len(r.completions), L) for ix in r.sampler_routes.indices)
    with torch.no_grad(), moe.record_routing(model) as own:
        model(input_ids=r.input_ids, attention_mask=r.attention_mask,
              position_ids=rollout.position_ids_from_mask(r.attention_mask))
    fed = r.attention_mask.clone()
    fed[:, -1] = 0  # the last position was never fed to the sampler (its route is a copy)
    assert moe.routing_change_fraction(own, r.sampler_routes, fed) > 0.05  # the noise changed many choices
    with torch.no_grad(), moe.replay_routing(model, r.sampler_routes), moe.record_routing(model) as replayed:
        model(input_ids=r.input_ids, attention_mask=r.attention_mask,
              position_ids=rollout.position_ids_from_mask(r.attention_mask))
    for a, b in zip(replayed.indices, r.sampler_routes.indices, strict=True):
        assert torch.equal(a.sort(-1).values, b.sort(-1).values)


def test_decoding_routes_match_the_full_forward_without_noise(tok):
    # the decode loop computes the same causal function as the full forward, so with no noise its expert choices
    # are the recomputing forward's up to round-off ties: at most a fraction of a percent differ
    model = small_moe(tok)
    torch.manual_seed(1)
    r = decoding.generate(model, tok, PROMPTS, 4, max_new_tokens=10, record_routes=True, record_sampler_routes=True)
    fed = r.attention_mask.clone()
    fed[:, -1] = 0
    assert moe.routing_change_fraction(r.routes, r.sampler_routes, fed) < 0.01
    torch.testing.assert_close(r.sampler_logprobs, r.logprobs, atol=1e-5, rtol=0)


def test_record_routing_along_the_sequence_checks_rows(tok):
    model = small_moe(tok)
    ids = tok(PROMPTS[:1], return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="along"):
        with moe.record_routing(model, along="tokens"):
            pass
    with pytest.raises(ValueError, match="shapes"):
        with torch.no_grad(), moe.record_routing(model, along="sequence"):
            model(input_ids=ids)
            model(input_ids=ids.repeat(2, 1))


@pytest.mark.slow
@pytest.mark.parametrize("settings", [
    dict(sampler_dtype="bfloat16"),
    dict(sampler_dtype="bfloat16", pi_old="naive"),
    dict(sampler_logit_noise=0.3, num_minibatches=1),
    dict(sampler_router_noise=0.5, routing_replay=True, replay_source="sampler"),
    dict(sampler_router_noise=0.5, routing_replay=True, replay_source="sampler", pi_old="naive"),
    dict(sampler_router_noise=0.5, routing_replay=True),
    dict(sampler_dtype="bfloat16", is_correction="token_tis"),
    dict(sampler_logit_noise=0.3, num_minibatches=1, is_correction="seq_mis", is_cap_low=0.5),
], ids=lambda d: "+".join(f"{k}={v}" for k, v in d.items()))
def test_the_loop_trains_with_a_mismatched_sampler(tok, settings):
    model = small_moe(tok)
    cfg = config.make_config("grpo", steps=2, prompts_per_step=2, group_size=2, max_new_tokens=6, beta=0.0,
                             progress=False, **{"num_minibatches": 2, **settings})
    history = rl.train_rl(model, tok, cfg, tasks.load_split("train").select(range(8)))
    assert len(history.rows) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in history.rows)
    if cfg.pi_old == "recomputed":  # the gap is logged every step, and it is not zero
        assert all(r["mismatch_logp_diff_max"] > 0 for r in history.rows)


def test_naive_pi_old_is_the_samplers_log_probs(tok):
    # pi_old="naive": behaviour_logprobs returns the sampler's own log-probs; "recompute": the trainer's
    model = small_dense(tok)
    sampler = make_sampler(model, logit_noise=0.5, seed=0)
    torch.manual_seed(0)
    r = decoding.generate(sampler, tok, PROMPTS, 2, max_new_tokens=8, recompute_logprobs=False)
    naive = config.make_config("grpo", pi_old="naive")  # the sampler's numbers as pi_old
    old, _, _ = rl.behaviour_logprobs(model, None, r, naive)
    torch.testing.assert_close(old, r.sampler_logprobs * r.completion_mask)
    old, _, _ = rl.behaviour_logprobs(model, None, r, config.make_config("grpo"))  # 2 minibatches: recomputed
    torch.testing.assert_close(old, recomputed(model, r), atol=1e-5, rtol=0)
    assert float((old - r.sampler_logprobs).abs().max()) > 0.1  # the noise made the two differ
