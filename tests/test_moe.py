"""Tests of minirl.moe: routing change, Routes, expert load and the router's load-balancing loss by hand, and
Routing Replay on a real transformers MoE. (GSPO's sequence-level loss is tested in test_losses.py, the loop's use of
replay and of the load-balancing loss in test_rl.py.)"""

import math
from functools import partial

import helpers
import pytest
import torch

from minirl import models, moe, rollout

D = torch.float64
close = partial(helpers.close, atol=5e-9, dtype=D)


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
