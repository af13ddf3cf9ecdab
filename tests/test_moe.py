"""Tests of GSPO / GSPO-token (minirl.losses.policy_loss at the sequence levels) and of Routing Replay on a real
transformers MoE (minirl.moe), by hand where possible."""

import math
from functools import partial

import helpers
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl import config, models, moe, rl, rollout, tasks
from minirl.losses import policy_loss

D = torch.float64
EPS_LOW, EPS_HIGH = 3e-4, 4e-4  # GSPO's clip ranges (Zheng et al. 2025, section 5.1)


close = partial(helpers.close, atol=5e-9, dtype=D)


def gspo(lp, old, adv, mask, level, **kw):
    """Loss, gradient with respect to the log-probs, and stats of one GSPO(-token) evaluation."""
    lp = lp.detach().clone().requires_grad_(True)
    loss, stats = policy_loss(lp, old, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, level=level,
                              agg="seq-mean-token-mean", **kw)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, stats


# --- the acceptance example, by hand ----------------------------------------------------------------------------
# seq 0: log-ratios [3e-4, -1e-4, 1e-4], mean 3e-4 / 3 = 1e-4, s_0 = e^1e-4 = 1.000100005
# seq 1: log-ratio [6e-4] (+ 2 padded positions), s_1 = e^6e-4 = 1.000600180
# clip range [1 - 3e-4, 1 + 4e-4] = [0.9997, 1.0004].
# seq 0, A = +1: s_0 inside the range -> term -A s_0 = -1.000100005.
# seq 1, A = -1: s_1 > 1.0004, but for A < 0 the pessimistic max(-A s, -A clip(s)) = max(1.000600180, 1.0004)
#   keeps the UNclipped branch -> term +1.000600180 (the clip never protects a ratio that makes things worse).
# GSPO loss = mean over the 2 sequences = (-1.000100005 + 1.000600180) / 2 = 0.000500175 / 2 = 0.00025009.
# gradient: d s_i / d logp_t = s_i / |y_i|, so
#   seq 0, each of its 3 tokens: -A s_0 / 3 / 2 = -1.000100005 / 6 = -0.166683334
#   seq 1, its 1 token:          -A s_1 / 1 / 2 = +1.000600180 / 2 = +0.500300090;  padded positions: 0.
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -3.0, -3.0]], dtype=D)
LOG_RATIO = torch.tensor([[3e-4, -1e-4, 1e-4], [6e-4, 0.7, -0.9]], dtype=D)  # padding garbage must not count
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=D)
ADV = torch.tensor([1.0, -1.0], dtype=D)
S0, S1 = math.exp(1e-4), math.exp(6e-4)


def test_acceptance_sequence_ratios_are_the_hand_values():
    assert round(S0, 8) == 1.00010001 and round(S1, 8) == 1.00060018
    _, _, stats = gspo(OLD + LOG_RATIO, OLD, ADV, MASK, "sequence")
    close(stats["ratio_min"], S0, atol=1e-12)
    close(stats["ratio_max"], S1, atol=1e-12)


@pytest.mark.parametrize("level", ["sequence", "sequence-token"])
def test_acceptance_loss_and_gradient(level):
    loss, grad, stats = gspo(OLD + LOG_RATIO, OLD, ADV, MASK, level)
    close(loss, 0.00025009, atol=5e-9)
    close(loss, (-S0 + S1) / 2, atol=1e-12)
    close(grad, [[-0.166683, -0.166683, -0.166683], [0.500300, 0.0, 0.0]], atol=5e-7)
    close(grad, [[-S0 / 6] * 3, [S1 / 2, 0.0, 0.0]], atol=1e-12)
    # nothing clipped: seq 0 is inside the range; seq 1 is above it with A < 0, which keeps its gradient
    assert stats["clip_frac"] == 0.0


def test_gspo_clips_a_whole_sequence_and_counts_its_tokens():
    # flip the advantages to [-1, +1]: seq 0 (s_0 = 1.0001, inside the range) keeps its gradient;
    # seq 1 (s_1 = 1.0006 > 1.0004, A = +1) is clipped: term -1.0004, a constant -> gradient 0.
    # loss = (+1.000100005 - 1.0004) / 2 = -0.000149998; gradient seq 0: +1.000100005 / 6 = 0.166683334
    for level in ("sequence", "sequence-token"):
        loss, grad, stats = gspo(OLD + LOG_RATIO, OLD, -ADV, MASK, level)
        close(loss, (S0 - 1.0004) / 2, atol=1e-12)
        close(grad, [[S0 / 6] * 3, [0.0, 0.0, 0.0]], atol=1e-12)
        # clip fraction per TOKEN, as the GSPO paper counts it: 1 of the 4 valid tokens lost its gradient
        assert stats["clip_frac_high"] == 0.25 and stats["clip_frac_low"] == 0.0


def test_gspo_token_with_per_token_advantages():
    # GSPO-token's reason to exist: A may vary along the sequence. Seq 0 with A_t = [2, 0, -1], seq 1 A = [-1]:
    # every token of seq i carries the value s_i and the gradient s_i * d logp_t (clipping decided by s_i):
    # seq 0 terms: -2 s_0, 0, +s_0 -> mean (-s_0) / 3; seq 1: +s_1; loss = (-s_0 / 3 + s_1) / 2
    # gradient seq 0: -A_t s_0 / 3 / 2 = [-2 s_0 / 6, 0, +s_0 / 6]; seq 1: +s_1 / 2
    adv = torch.tensor([[2.0, 0.0, -1.0], [-1.0, 5.0, 5.0]], dtype=D)
    loss, grad, _ = gspo(OLD + LOG_RATIO, OLD, adv, MASK, "sequence-token")
    close(loss, (-S0 / 3 + S1) / 2, atol=1e-12)
    close(grad, [[-2 * S0 / 6, 0.0, S0 / 6], [S1 / 2, 0.0, 0.0]], atol=1e-12)


def test_sequence_level_refuses_a_token_aggregation_and_token_advantages():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="agg must be 'seq-mean-token-mean'"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), level="sequence", agg="token-mean")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, lp, torch.zeros(2, 3), torch.ones(2, 3), level="sequence")
    with pytest.raises(ValueError, match="level='sequence'"):
        config.make_config("gspo", agg="token-mean")


def test_presets_carry_the_paper_clip_ranges():
    for name, level in (("gspo", "sequence"), ("gspo_token", "sequence-token")):
        cfg = config.make_config(name)
        assert (cfg.level, cfg.eps_low, cfg.eps_high, cfg.agg) == (level, 3e-4, 4e-4, "seq-mean-token-mean")


# --- properties ----------------------------------------------------------------------------------------------------
@st.composite
def batches(draw, max_b=6, max_t=7):
    """Random (logprobs, old_logprobs, mask) with at least one valid token per row, and log-ratios in +-0.05."""
    B, T = draw(st.integers(1, max_b)), draw(st.integers(1, max_t))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    scale = draw(st.sampled_from([1e-4, 1e-3, 5e-2]))
    lp = old + (torch.rand(B, T, generator=g, dtype=D) * 2 - 1) * scale
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(D)
    adv = torch.randn(B, generator=g, dtype=D)
    return lp, old, mask, adv


@settings(max_examples=60, deadline=None)
@given(batches())
def test_gspo_token_equals_gspo_for_per_sequence_advantages(batch):
    lp, old, mask, adv = batch
    loss_s, grad_s, stats_s = gspo(lp, old, adv, mask, "sequence")
    loss_t, grad_t, stats_t = gspo(lp, old, adv, mask, "sequence-token")
    close(loss_t, loss_s, atol=1e-12)
    close(grad_t, grad_s, atol=1e-12)
    assert stats_s["clip_frac"] == stats_t["clip_frac"]


@settings(max_examples=40, deadline=None)
@given(batches(max_b=6), st.integers(1, 5), st.sampled_from(["sequence", "sequence-token"]))
def test_micro_batches_with_the_full_denominator_add_up_to_the_batch_loss(batch, micro, level):
    lp, old, mask, adv = batch
    full, grad_full, _ = gspo(lp, old, adv, mask, level)
    n_seq = float((mask.sum(-1) > 0).sum())  # the trainer passes the whole minibatch's sequence count
    total, grads = torch.zeros((), dtype=D), []
    for rows in torch.arange(lp.shape[0]).split(micro):
        part, g, _ = gspo(lp[rows], old[rows], adv[rows], mask[rows], level, denominator=n_seq)
        total, grads = total + part, grads + [g]
    close(total, full, atol=1e-12)
    close(torch.cat(grads), grad_full, atol=1e-12)


@pytest.mark.parametrize("level", ["sequence", "sequence-token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_stay_finite_with_gradients_of_the_right_sign(level, dtype):
    # mean log-ratios of +1e4 and -1e4 nats (exp would overflow). Above 20 nats the ratio is exp's tangent at 20:
    # s = e^20 * (1 + 1e4 - 20) = 4.846800e12, finite. Below, exp itself: s = e^-1e4 = 0 (underflow).
    # Loss = mean over 3 sequences of max(-A s, -A clip(s)); d s / d lp_t = (tangent slope e^20) / 2 tokens.
    #   row 0, A = +1: s > 1 + eps, clipped branch -> gradient 0 (exactly 0 too).
    #   row 0, A = -1: unclipped branch -A s -> gradient e^20 / 2 / 3 = 80860865.9 > 0 per token; the exact one,
    #     e^1e4 / 6, is not representable but positive too (a clamp used to give 0 here).
    #   row 1: A = +1 unclipped, gradient -e^-1e4 / 6 = -0 (underflow); A = -1 clipped at 1 - eps, 0.
    # GSPO-token has the same gradient: it scales each token's exponent by the tangent slope over s.
    old = torch.zeros(3, 2, dtype=dtype)
    lp = torch.tensor([[1e4, 1e4], [-1e4, -1e4], [1e-3, 0.0]], dtype=dtype)
    for adv, g0 in (([1.0, -1.0, 1.0], 0.0), ([-1.0, 1.0, -1.0], math.exp(20) / 6)):
        lp_ = lp.clone().requires_grad_(True)
        loss, stats = policy_loss(lp_, old, torch.tensor(adv, dtype=dtype), torch.ones(3, 2, dtype=dtype),
                                  eps_low=EPS_LOW,
                                  eps_high=EPS_HIGH, level=level, agg="seq-mean-token-mean")
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(lp_.grad).all()
        torch.testing.assert_close(lp_.grad[0].double(), torch.tensor([g0, g0], dtype=D), rtol=1e-6, atol=0)
        assert torch.all(lp_.grad[1] == 0)
        assert all(math.isfinite(v) for v in stats.values())
        close(stats["ratio_max"] / (math.exp(20) * (1 + 1e4 - 20)), 1.0, atol=1e-6)


def test_approx_kl_is_the_k3_estimate_of_kl_old_to_new():
    # one token, log-ratio log(pi/pi_old) = 0.5: k3 = (r - 1) - log r with r = e^0.5 = 1.648721 -> 0.148721
    # (the reversed r = e^-0.5 would give 0.106531)
    _, stats = policy_loss(torch.tensor([[-0.5]]), torch.tensor([[-1.0]]), torch.ones(1), torch.ones(1, 1))
    assert abs(stats["approx_kl"] - 0.148721) < 1e-6


# --- moe: routing_change_fraction, Routes, expert_load by hand ----------------------------------------------------
def routes(*layers):
    return moe.Routes([torch.tensor(x) for x in layers], [torch.zeros(torch.tensor(x).shape[:2]) for x in layers])


# paper-index: moe.routing_change_fraction
def test_routing_change_fraction_by_hand():
    # one layer, B = 1, L = 3 tokens, k = 2 experts each (order within the top-k does not matter):
    # token 0: {0, 1} vs {1, 0} -> 0 changed; token 1: {2, 3} vs {2, 5} -> 1 of 2; token 2: {4, 5} vs {6, 7} -> 2 of 2
    a = routes([[[0, 1], [2, 3], [4, 5]]])
    b = routes([[[1, 0], [2, 5], [6, 7]]])
    # mean over tokens (0 + 0.5 + 1) / 3 = 0.5; with token 2 masked out: (0 + 0.5) / 2 = 0.25
    assert moe.routing_change_fraction(a, b) == pytest.approx(0.5)
    assert moe.routing_change_fraction(a, b, mask=torch.tensor([[1, 1, 0]])) == pytest.approx(0.25)
    # two layers: the second identical -> per layer [0.5, 0.0], mean 0.25
    a2, b2 = routes(a.indices[0].tolist(), [[[0, 1]] * 3]), routes(b.indices[0].tolist(), [[[0, 1]] * 3])
    assert moe.routing_change_fraction(a2, b2, per_layer=True) == pytest.approx([0.5, 0.0])
    assert moe.routing_change_fraction(a2, b2) == pytest.approx(0.25)


def test_routes_select_and_nbytes():
    # B = 3 rows, L = 2, k = 1; rows [2, 0] in that order
    r = routes([[[1], [2]], [[3], [4]], [[5], [6]]])
    sel = r.select([2, 0])
    assert sel.indices[0].tolist() == [[[5], [6]], [[1], [2]]]
    assert sel.entropy[0].shape == (2, 2)
    assert r.nbytes == 3 * 2 * 1 * 8  # int64 indices
    with pytest.raises(ValueError, match="empty"):
        moe.Routes().select([0])


def test_expert_load_by_hand():
    # 4 experts, one layer, tokens use {0, 1}, {0, 2}, {0, 3}: expert 0 gets 3 of the 6 assignments
    r = routes([[[0, 1], [0, 2], [0, 3]]])
    load = moe.expert_load(r, num_experts=4, mask=torch.ones(1, 3))
    close(load, [[0.5, 1 / 6, 1 / 6, 1 / 6]], atol=1e-7)
    # the third token is padding: 4 valid assignments, expert 0 gets 2, experts 1 and 2 one each, expert 3 none
    close(moe.expert_load(r, 4, torch.tensor([[1, 1, 0]])), [[0.5, 0.25, 0.25, 0.0]], atol=1e-7)


def test_expert_load_needs_the_mask_of_the_recorded_forward():
    # without a mask the padding tokens' routes were counted as if they were text
    r = routes([[[0, 1], [0, 2], [0, 3]]])
    with pytest.raises(TypeError, match="mask"):
        moe.expert_load(r, 4)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, L\) = \(1, 3\).*got \(1, 2\)"):
        moe.expert_load(r, 4, torch.ones(1, 2))


def test_routing_change_fraction_refuses_mismatched_recordings():
    with pytest.raises(ValueError, match="shape"):
        moe.routing_change_fraction(routes([[[0, 1]]]), routes([[[0, 1], [2, 3]]]))
    with pytest.raises(ValueError, match="layers"):
        moe.routing_change_fraction(routes([[[0, 1]]]), routes([[[0, 1]]], [[[0, 1]]]))


# --- Routing Replay on the real tiny MoE (Qwen3-MoE from transformers) --------------------------------------------


class ExpertsSpy:
    """Records the expert indices and weights the experts modules actually received (a pre-hook on each)."""

    def __init__(self, model):
        self.modules = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
        self.indices, self.weights, self.handles = [], [], []

    def __enter__(self):
        def hook(module, args):
            self.indices.append(args[1].detach().clone())
            self.weights.append(args[2].detach().clone())

        self.handles = [m.register_forward_pre_hook(hook) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def test_rollout_records_one_grid_of_routes(moe_rollout):
    model, r = moe_rollout
    assert len(r.routes.indices) == model.config.num_hidden_layers == len(moe.routers(model))
    B, L = r.input_ids.shape
    for ix, h in zip(r.routes.indices, r.routes.entropy, strict=True):
        assert ix.shape == (B, L, model.config.num_experts_per_tok) and h.shape == (B, L)
        assert 0 <= int(ix.min()) and int(ix.max()) < model.config.num_experts
        assert torch.all(h >= 0) and torch.all(h <= math.log(model.config.num_experts) + 1e-5)


@pytest.mark.parametrize("replay", [False, True])
def test_unchanged_weights_reproduce_the_rollout_logprobs(moe_rollout, replay):
    # the training forward (train mode, with grad) gives the behaviour log-probs back to 1e-5, with or without replay
    model, r = moe_rollout
    model.train()
    if replay:
        with moe.replay_routing(model, r.routes):
            lp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens)
    else:
        lp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens)
    assert float(((lp.detach() - r.logprobs) * r.completion_mask).abs().max()) < 1e-5


# paper-index: moe.replay_routing
def test_replay_forces_the_recorded_experts_after_routing_changed(tok, moe_rollout):
    _, r = moe_rollout
    model = models.tiny_moe(tok, seed=0)  # a fresh copy of the same weights: the fixture's model stays unchanged
    P, mask = r.n_prompt_tokens, r.completion_mask
    valid = r.attention_mask.bool()  # every real token of prompt and completion
    # one large optimiser step so that some routing changes
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    lp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, P)
    (-(lp * mask).sum() / mask.sum()).backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad(), moe.record_routing(model) as new_routes:
        free_lp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, P)
    changed = moe.routing_change_fraction(r.routes, new_routes, mask=valid)
    assert changed > 0.01, f"the step changed only {changed:.4f} of the routing; the test needs a real change"

    # replay: the experts modules receive exactly the recorded indices on every valid token (100% agreement),
    # while the mixing weights come from the LIVE router: softmax of the current router logits at the forced
    # experts, renormalised over them (Qwen3-MoE's norm_topk_prob)
    logits = []
    handles = [m.register_forward_hook(lambda mod, a, out: logits.append(out[0].detach())) for m in moe.routers(model)]
    with ExpertsSpy(model) as spy, moe.replay_routing(model, r.routes):
        lp = rollout.token_logprobs(model, r.input_ids, r.attention_mask, P)
    for h in handles:
        h.remove()
    B, L = r.input_ids.shape
    for layer, (seen, recorded) in enumerate(zip(spy.indices, r.routes.indices, strict=True)):
        agree = (seen.reshape(B, L, -1) == recorded).all(-1)[valid].float().mean()
        assert float(agree) == 1.0, f"layer {layer}: replay agreed on {float(agree):.4f} of the tokens"
        probs = torch.softmax(logits[layer].float(), -1).gather(-1, recorded.reshape(B * L, -1))  # (B L, k)
        close(spy.weights[layer], probs / probs.sum(-1, keepdim=True), atol=1e-6)
    # replay changes the log-probs where routing changed, and the router keeps its gradient
    assert float(((lp.detach() - free_lp) * mask).abs().max()) > 1e-4
    (-(lp * mask).sum() / mask.sum()).backward()
    for i, router in enumerate(moe.routers(model)):
        assert router.weight.grad is not None and float(router.weight.grad.abs().sum()) > 0, f"router {i}"


def test_replay_in_micro_batches_with_select(moe_rollout):
    # two micro-batches of rows [0, 3, 5] and the rest, each with routes.select(rows), give the full batch's values
    model, r = moe_rollout
    P = r.n_prompt_tokens
    with torch.no_grad(), moe.replay_routing(model, r.routes):
        full = rollout.token_logprobs(model, r.input_ids, r.attention_mask, P)
    for rows in (torch.tensor([0, 3, 5]), torch.tensor([1, 2, 4, 6, 7])):
        with torch.no_grad(), moe.replay_routing(model, r.routes.select(rows)):
            part = rollout.token_logprobs(model, r.input_ids[rows], r.attention_mask[rows], P)
        assert float(((part - full[rows]) * r.completion_mask[rows]).abs().max()) < 1e-5


def test_replay_with_the_wrong_rows_raises_a_clear_error(moe_rollout):
    model, r = moe_rollout
    with pytest.raises(ValueError, match=r"routes.select\(rows\)"):
        with torch.no_grad(), moe.replay_routing(model, r.routes):
            rollout.token_logprobs(model, r.input_ids[:3], r.attention_mask[:3], r.n_prompt_tokens)
    with pytest.raises(ValueError, match="layers"):
        with moe.replay_routing(model, moe.Routes(r.routes.indices[:2], r.routes.entropy[:2])):
            pass
    # the hooks are gone after the error: an ordinary forward works again
    with torch.no_grad():
        rollout.token_logprobs(model, r.input_ids[:3], r.attention_mask[:3], r.n_prompt_tokens)


def test_record_refuses_forwards_of_different_lengths(moe_rollout):
    model, r = moe_rollout
    with pytest.raises(ValueError, match="different lengths"):
        with torch.no_grad(), moe.record_routing(model):
            model(input_ids=r.input_ids)
            model(input_ids=r.input_ids[:, :-1])


def test_dense_model_has_no_routers(tok):
    dense = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="TopKRouter"):
        moe.routers(dense)


def test_trainer_routing_replay_is_exactly_on_policy_at_the_first_update(tok):
    # one rollout, one epoch, one minibatch (in micro-batches of 3 rows): the only update is on-policy, so every
    # ratio is 1 to float precision when replay restores the behaviour forward's experts
    model = models.tiny_moe(tok, seed=1)
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=4, max_new_tokens=10,
                              num_iterations=1, num_minibatches=1, micro_batch_size=3, beta=0.0,
                              routing_replay=True, progress=False)
    h = rl.train_rl(model, tok, cfg, tasks.load_split("train"))
    assert abs(h.last("ratio_min") - 1) < 1e-5 and abs(h.last("ratio_max") - 1) < 1e-5
    with pytest.raises(ValueError, match="MoE"):
        rl.train_rl(models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2), tok, cfg,
                         tasks.load_split("train"))


# --- the router's load-balancing loss (off by default) -------------------------------------------------------------
def _logits_of(probs):
    """(N, E) logits whose softmax is ``probs``."""
    return torch.tensor(probs, dtype=torch.float64).log()


# paper-index: moe.load_balancing_loss
def test_load_balancing_loss_by_hand():
    # one layer, E = 2, top-1. Tokens [0.75, 0.25] and [0.25, 0.75]: f = [1/2, 1/2], P = [1/2, 1/2]
    # -> 2 * (1/2 * 1/2 + 1/2 * 1/2) = 1.0, the balanced value (= top_k)
    balanced = moe.load_balancing_loss([_logits_of([[0.75, 0.25], [0.25, 0.75]])], torch.ones(1, 2), top_k=1)
    assert abs(float(balanced) - 1.0) < 1e-12
    # both tokens [0.75, 0.25]: f = [1, 0], P = [0.75, 0.25] -> 2 * (1 * 0.75 + 0) = 1.5
    skewed = moe.load_balancing_loss([_logits_of([[0.75, 0.25], [0.75, 0.25]])], torch.ones(1, 2), top_k=1)
    assert abs(float(skewed) - 1.5) < 1e-12
    # the second token masked (padding): only [0.75, 0.25] counts, f = [1, 0], P = [0.75, 0.25] -> 1.5
    masked = moe.load_balancing_loss([_logits_of([[0.75, 0.25], [0.25, 0.75]])], torch.tensor([[1, 0]]), top_k=1)
    assert abs(float(masked) - 1.5) < 1e-12
    # two layers are pooled BEFORE the product (transformers' form): layer 1 all [0.75, 0.25], layer 2 all
    # [0.25, 0.75]: pooled f = [1/2, 1/2], P = [1/2, 1/2] -> 1.0, although each layer alone gives 1.5
    pooled = moe.load_balancing_loss([_logits_of([[0.75, 0.25]] * 2), _logits_of([[0.25, 0.75]] * 2)],
                                     torch.ones(1, 2), top_k=1)
    assert abs(float(pooled) - 1.0) < 1e-12
    # top-2 of 4 experts, one token [0.4, 0.3, 0.2, 0.1]: f = [1, 1, 0, 0] (sums to k), P = the probs
    # -> 4 * (0.4 + 0.3) = 2.8; a uniform router gives 4 * (2/4 * 1/4) * 4 = 2 = top_k
    top2 = moe.load_balancing_loss([_logits_of([[0.4, 0.3, 0.2, 0.1]])], torch.ones(1, 1), top_k=2)
    assert abs(float(top2) - 2.8) < 1e-12
    assert abs(float(moe.load_balancing_loss([torch.zeros(3, 4)], torch.ones(1, 3), top_k=2)) - 2.0) < 1e-6


def test_load_balancing_loss_gradient_by_hand():
    # only P carries a gradient: d loss / d p_{n,e} = E * f_e / N (f fixed by the discrete top-k choice). Two tokens
    # [0.75, 0.25] (top-1: f = [1, 0]): d loss / d p_{n,0} = 2 * 1 / 2 = 1, d / d p_{n,1} = 0; through the softmax,
    # d p_0 / d z_0 = p_0 (1 - p_0) = 0.1875 and d p_0 / d z_1 = -p_0 p_1 = -0.1875 for each token
    logits = _logits_of([[0.75, 0.25], [0.75, 0.25]]).requires_grad_(True)
    moe.load_balancing_loss([logits], torch.ones(1, 2), top_k=1).backward()
    assert torch.allclose(logits.grad, torch.tensor([[0.1875, -0.1875]] * 2, dtype=torch.float64), atol=1e-12)


def test_load_balancing_loss_edge_cases():
    assert float(moe.load_balancing_loss([torch.randn(3, 4)], torch.zeros(1, 3), top_k=2)) == 0.0  # no valid token
    with pytest.raises(ValueError, match="empty"):
        moe.load_balancing_loss([], torch.ones(1, 3), top_k=2)
    with pytest.raises(ValueError, match="mask"):
        moe.load_balancing_loss([torch.randn(3, 4)], torch.ones(1, 4), top_k=2)
    with pytest.raises(ValueError, match="top_k"):
        moe.load_balancing_loss([torch.randn(3, 4)], torch.ones(1, 3), top_k=5)


def test_load_balancing_loss_equals_transformers_on_the_model_own_router_logits(tok):
    # the real tiny MoE (4 layers, top-2 of 8): our loss from the captured router logits equals the model's own
    # aux_loss (transformers' load_balancing_loss_func, which TRL weights) on a left-padded batch, and its gradient
    # reaches every router
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    model = models.tiny_moe(tok, seed=0)
    ids = torch.randint(3, len(tok), (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[2, :2] = 0
    with moe.capture_router_logits(model) as logits:
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    ours = moe.load_balancing_loss(logits, mask, top_k=model.config.num_experts_per_tok)
    theirs = load_balancing_loss_func(tuple(logits), model.config.num_experts, model.config.num_experts_per_tok,
                                      mask)
    assert len(logits) == 4 and abs(float(ours.detach() - out.aux_loss.detach())) < 1e-6
    assert abs(float(ours.detach() - theirs)) < 1e-6
    ours.backward()
    assert all(float(r.weight.grad.abs().sum()) > 0 for r in moe.routers(model))


def test_router_aux_loss_coef_is_validated_and_off_by_default(tok):
    assert config.make_config("grpo").router_aux_loss_coef == 0.0
    for bad in (-0.01, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="router_aux_loss_coef"):
            config.make_config("grpo", router_aux_loss_coef=bad)
    cfg = config.make_config("grpo", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4,
                             router_aux_loss_coef=0.01, progress=False)
    with pytest.raises(ValueError, match="TopKRouter"):  # a dense model has no router to balance
        rl.train_rl(models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2), tok, cfg,
                    tasks.load_split("train"))


@pytest.mark.parametrize("micro", [None, 4])
def test_update_adds_exactly_coef_times_the_aux_loss(tok, moe_rollout, micro):
    # the same update with and without the switch: the objective differs by coef x the mean over equal micro-batches
    # of their load-balancing losses, and the router weights get a different gradient
    model0, r = moe_rollout
    adv = torch.tensor([1.0, -1.0] * 4)
    mb = rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=r.n_prompt_tokens,
                    completion_mask=r.completion_mask, loss_mask=r.completion_mask, old_logprobs=r.logprobs,
                    advantages=adv)
    out, grads = {}, {}
    for coef in (0.0, 0.5):
        model = models.tiny_moe(tok, seed=0)
        model.load_state_dict(model0.state_dict())
        cfg = config.make_config("grpo", beta=0.0, router_aux_loss_coef=coef, micro_batch_size=micro, progress=False)
        out[coef] = rl.update_minibatch(model, torch.optim.SGD(model.parameters(), lr=0.0), mb, cfg, beta=0.0)
        grads[coef] = moe.routers(model)[0].weight.grad.clone()
    with torch.no_grad(), moe.capture_router_logits(model0) as logits:
        model0(input_ids=r.input_ids, attention_mask=r.attention_mask)
    if micro is None:
        expected = moe.load_balancing_loss(logits, r.attention_mask, top_k=2)
    else:  # 8 rows in micro-batches of 4: the mean of the two halves' losses
        layers = len(logits)
        halves = [moe.load_balancing_loss([x.view(8, -1, x.shape[-1])[rows].reshape(-1, x.shape[-1])
                                           for x in logits[:layers]], r.attention_mask[rows], top_k=2)
                  for rows in (slice(0, 4), slice(4, 8))]
        expected = sum(halves) / 2
    assert abs(out[0.5]["loss"] - out[0.0]["loss"] - 0.5 * float(expected)) < 1e-6
    assert abs(out[0.5]["aux_loss"] - float(expected)) < 1e-6 and "aux_loss" not in out[0.0]
    assert float((grads[0.5] - grads[0.0]).abs().max()) > 1e-6
