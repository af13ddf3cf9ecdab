"""The reward-model losses (minirl.reward_models) by hand, their gradients, their edge cases, the gold step labels of
the running-sums task, and the Bradley-Terry loss against TRL 1.16's RewardTrainer (with and without its margin and
centring terms)."""

import math
from types import SimpleNamespace

import pytest
import torch

from minirl import reward_models as rm

D = torch.float64


def t(*rows):
    return torch.tensor(rows, dtype=D)


# paper-index: reward_models.bradley_terry_loss
def test_bradley_terry_by_hand_and_its_gradient():
    chosen = torch.tensor([1.0, 0.0], dtype=D, requires_grad=True)
    loss = rm.bradley_terry_loss(chosen, t(0.0, 0.0))
    # -(log sigmoid(1) + log sigmoid(0)) / 2 = (0.313262 + 0.693147) / 2
    assert float(loss) == pytest.approx((math.log(1 + math.exp(-1)) + math.log(2)) / 2, abs=1e-12)
    loss.backward()
    # d/d r_c = -sigmoid(-(r_c - r_r)) / B = (-0.268941 / 2, -0.5 / 2)
    sig = 1 / (1 + math.exp(1))
    assert chosen.grad.tolist() == pytest.approx([-sig / 2, -0.25], abs=1e-12)
    assert float(rm.bradley_terry_loss(t(1.0, 0.0), t(0.0, 0.0), margin=t(1.0, 0.0))) == pytest.approx(math.log(2))
    centred = rm.bradley_terry_loss(t(1.0, 0.0), t(0.0, 0.0), center_coef=0.01)
    assert float(centred) == pytest.approx(float(loss) + 0.01 * (1 + 0) / 2, abs=1e-12)


def test_bradley_terry_sees_only_differences_and_stays_finite():
    a = rm.bradley_terry_loss(t(1.0, -2.0), t(0.5, -3.0))
    assert float(a) == pytest.approx(float(rm.bradley_terry_loss(t(11.0, 8.0), t(10.5, 7.0))), abs=1e-12)
    extreme = torch.tensor([1e4, -1e4], dtype=D, requires_grad=True)
    loss = rm.bradley_terry_loss(extreme, t(0.0, 0.0))
    loss.backward()
    assert math.isfinite(float(loss)) and float(loss) == pytest.approx(1e4 / 2, rel=1e-9)  # log sigmoid(-1e4) = -1e4
    assert torch.isfinite(extreme.grad).all()
    with pytest.raises(ValueError, match="finite"):
        rm.bradley_terry_loss(t(math.nan), t(0.0))
    with pytest.raises(ValueError, match="center_coef"):
        rm.bradley_terry_loss(t(1.0), t(0.0), center_coef=-1.0)
    with pytest.raises(ValueError, match="chosen_rewards"):
        rm.bradley_terry_loss(t(1.0, 2.0), t(0.0))


def test_bradley_terry_is_trls_reward_trainer_loss():
    trl = pytest.importorskip("trl")
    g = torch.Generator().manual_seed(0)
    chosen, rejected = torch.randn(6, generator=g), torch.randn(6, generator=g)
    margin = torch.rand(6, generator=g)
    for use_margin in (False, True):
        for coef in (None, 0.01):
            logits = torch.cat([chosen, rejected]).unsqueeze(-1)  # TRL chunks (2B, 1) into chosen and rejected
            stub = SimpleNamespace(model=SimpleNamespace(training=False), args=SimpleNamespace(
                center_rewards_coefficient=coef), accelerator=SimpleNamespace(
                gather=lambda x: x, gather_for_metrics=lambda x: x), _metrics={"eval": {
                    k: [] for k in ("min_reward", "mean_reward", "max_reward", "accuracy", "margin", "num_tokens")}},
                _total_train_tokens=0, _tp_size=1)
            inputs = {"input_ids": torch.zeros(12, 3, dtype=torch.long), "attention_mask": torch.ones(12, 3)}
            if use_margin:
                inputs["margin"] = margin
            model = (lambda out: lambda **kw: out)(SimpleNamespace(logits=logits))  # returns this pass's logits
            theirs = trl.RewardTrainer.compute_loss(stub, model, inputs)
            ours = rm.bradley_terry_loss(chosen, rejected, margin=margin if use_margin else None, center_coef=coef)
            assert float(ours) == pytest.approx(float(theirs), abs=1e-7), (use_margin, coef)


# paper-index: reward_models.outcome_loss
def test_outcome_loss_by_hand():
    # (log 2 + log(1 + e^2)) / 2
    assert float(rm.outcome_loss(t(0.0, 2.0), t(1.0, 0.0))) == pytest.approx(
        (math.log(2) + math.log(1 + math.exp(2))) / 2, abs=1e-12)
    with pytest.raises(ValueError, match="labels"):
        rm.outcome_loss(t(0.0), t(0.5))


# paper-index: reward_models.process_loss
def test_process_loss_by_hand_masks_and_an_empty_batch():
    scores, labels, mask = t([0.0, 2.0], [1.0, 9.0]), t([1.0, 1.0], [0.0, 5.0]), t([1.0, 1.0], [1.0, 0.0])
    want = (math.log(2) + math.log(1 + math.exp(-2)) + math.log(1 + math.e)) / 3  # the masked 9 (label 5) not read
    assert float(rm.process_loss(scores, labels, mask)) == pytest.approx(want, abs=1e-12)
    assert float(rm.process_loss(scores, labels, torch.zeros(2, 2, dtype=D))) == 0.0
    with pytest.raises(ValueError, match="step_labels"):
        rm.process_loss(scores, t([1.0, 0.5], [0.0, 1.0]), mask)


def test_gold_step_labels():
    assert rm.step_labels("7+5+9=", "7+5=13;13+9=22#22") == [0, 0]  # after a wrong step, judged on the true total
    assert rm.step_labels("7+5+9=", "7+5=12;12+9=22#22") == [1, 0]
    assert rm.step_labels("7+5+9=", "7+5=12;12+9=21#21") == [1, 1]
    assert rm.step_labels("7+5+9=", "7+5=12;x#1") == [1, 0]
    assert rm.step_labels("3+4=", "3+4=7;7+1=8#8") == [1, 0]  # a step the problem does not have
    with pytest.raises(ValueError, match="running sum"):
        rm.step_labels("seven=", "7#7")


def test_a_learned_reward_keeps_the_reward_contract(tok):
    from helpers import tiny_model

    from minirl import models

    torch.manual_seed(0)
    reward_model = models.ValueModel(tiny_model(tok))
    torch.nn.init.normal_(reward_model.head.weight, std=0.5)  # a head that scores something
    reward_model.train()
    fn = rm.learned_reward(reward_model, tok, batch_size=3)
    prompts = ["1+2=", "3+4+5=", "9+9=", "2+2=", "7+1+1="]
    completions = ["1+2=3#3", "3+4=7;7+5=12#12", "9+9=17#17", "#4", "7+1=8;8+1=9#9"]
    scores = fn(prompts, completions)
    assert len(scores) == 5 and all(math.isfinite(s) for s in scores)
    assert reward_model.training  # its mode restored
    order = [4, 2, 0, 3, 1]
    shuffled = fn([prompts[i] for i in order], [completions[i] for i in order])
    assert shuffled == pytest.approx([scores[i] for i in order], abs=1e-5)  # any batch order, any batch size
    alone = [fn([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    assert alone == pytest.approx(scores, abs=1e-5)
    # no gradient reaches the reward model (and so none the policy) through a score
    assert all(p.grad is None for p in reward_model.parameters())


def test_sequence_scores_reads_the_last_real_token(tok):
    class Positions(torch.nn.Module):  # its "value" at each position is the position's index
        def forward(self, input_ids, attention_mask):
            return torch.arange(input_ids.shape[1], dtype=torch.float32).expand(input_ids.shape)

    ids, mask = torch.zeros(2, 4, dtype=torch.long), torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert rm.sequence_scores(Positions(), ids, mask).tolist() == [3.0, 3.0]  # left padding: the last column
    with pytest.raises(ValueError, match="no real token"):
        rm.sequence_scores(Positions(), ids, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))


# --- a reward model trained on the policy's own completions ---------------------------------------------------------
def test_gold_pairs_pair_a_right_answer_with_a_wrong_one_and_noise_flips_them(tok):
    from minirl import reward_model_loop as rml
    from minirl import tasks, warm_start

    policy, _, _ = warm_start.warm_start("cpu", seed=0, progress=False)
    data = tasks.load_split("train").select(range(8))
    answer = dict(zip(data["prompt"], data["answer"], strict=True))

    def right(text):
        prompt = text[:text.index("=") + 1]
        return tasks.score(text[len(prompt):], answer[prompt]).reward == 1.0

    clean = rml.gold_pairs(policy, tok, data, seed=0)
    assert len(clean) > 0 and not any(clean.flipped)
    assert all(right(c) and not right(r) for c, r in zip(clean.chosen, clean.rejected, strict=True))
    noisy = rml.gold_pairs(policy, tok, data, seed=0, noise=0.45)
    assert noisy.chosen != clean.chosen or not any(noisy.flipped)  # the same samples, some labels flipped
    for c, r, f in zip(noisy.chosen, noisy.rejected, noisy.flipped, strict=True):
        assert right(c) != f and right(r) == f
    with pytest.raises(ValueError, match="noise"):
        rml.gold_pairs(policy, tok, data, noise=0.5)


def test_train_reward_model_fits_its_pairs(tok):
    from helpers import tiny_model

    from minirl import models
    from minirl import reward_model_loop as rml

    pairs = rml.Pairs(["1+2=1+2=3#3", "3+4=3+4=7#7"], ["1+2=1+2=4#4", "3+4=3+4=9#9"], [False, False])
    reward_model = models.ValueModel(tiny_model(tok))
    losses = rml.train_reward_model(reward_model, tok, pairs, steps=30, lr=1e-2)
    assert losses[0] == pytest.approx(math.log(2), abs=1e-6)  # the zero head: every pair a tie
    assert losses[-1] < 0.1 and rml.pair_accuracy(reward_model, tok, pairs) == 1.0 and not reward_model.training


class _Positions(torch.nn.Module):
    """A stand-in scalar model whose value at each position is the position's index."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask):
        return torch.arange(input_ids.shape[1], dtype=torch.float32).expand(input_ids.shape) + self.w


def test_a_process_model_reads_each_step_at_the_token_that_closes_it(tok):
    from minirl import reward_model_loop as rml

    # "<bos>7+5+9=" is columns 0-6 of 24; "7+5=12" ends at the ';' of column 13, "12+9=21" at the '#' of column 21
    assert rml.step_end_columns(tok, "7+5+9=", "7+5=12;12+9=21#21", 24) == [13, 21]
    assert rml.step_end_columns(tok, "7+5+9=", "7+5=12;12+9=21#21", 27) == [16, 24]  # three pads on the left
    assert rml.step_end_columns(tok, "7+5+9=", "7+5=12;12+", 17) == [13, 16]  # no '#': the last character
    scores, mask = rml.process_scores(_Positions(), tok, ["7+5+9=", "3+4="], ["7+5=12;12+9=21#21", "3+4=7#7"])
    # the second row (12 tokens) is left-padded by 12: its one step ends at its '#', its column 10 -> 22
    assert scores.tolist() == [[13.0, 21.0], [22.0, 22.0]] and mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
    for p, c in (("7+5+9=", "7+5=12;12+9=21#21"), ("7+5+9=", "7+5=12;12+"), ("7+5+9=", "")):
        assert len(rml.step_end_columns(tok, p, c, 30)) == len(rm.step_labels(p, c))  # one score per label


def test_outcome_and_process_models_fit_their_labels(tok):
    from helpers import tiny_model

    from minirl import models
    from minirl import reward_model_loop as rml

    data = rml.Labelled(["1+2=", "1+2=", "3+4+5=", "3+4+5="], ["1+2=3#3", "1+2=4#4", "3+4=7;7+5=12#12",
                                                                "3+4=8;8+5=13#13"],
                        [1, 0, 1, 0], [[1], [0], [1, 1], [0, 0]])
    for kind, first in (("outcome", math.log(2)), ("process", math.log(2))):
        model = models.ValueModel(tiny_model(tok))
        losses = rml.train_labelled(model, tok, data, kind=kind, steps=60, lr=3e-3)
        assert losses[0] == pytest.approx(first, abs=1e-6), kind  # the zero head: every logit 0
        assert losses[-1] < 0.3 * first, (kind, losses[-1])
    with pytest.raises(ValueError, match="kind"):
        rml.train_labelled(model, tok, data, kind="pairs")
    assert data[[1, 3]].outcome == [0, 0]


# --- over-optimisation: best-of-n and Gao et al.'s forms -----------------------------------------------------------
# paper-index: reward_models.best_of_n_kl
def test_best_of_n_kl_by_hand():
    assert rm.best_of_n_kl(1) == 0.0
    assert rm.best_of_n_kl(4) == pytest.approx(math.log(4) - 0.75, abs=1e-12)  # 0.636294
    with pytest.raises(ValueError, match="n must"):
        rm.best_of_n_kl(0)


# paper-index: reward_models.gao_fit
def test_gao_fit_recovers_known_coefficients():
    d = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=D)
    assert rm.gao_fit(d, d * (1.0 - 0.2 * d), form="bon") == pytest.approx((1.0, 0.2), abs=1e-12)
    assert rm.gao_fit(d, d * (0.7 - 0.3 * torch.log(d)), form="rl") == pytest.approx((0.7, 0.3), abs=1e-12)
    with pytest.raises(ValueError, match="form"):
        rm.gao_fit(d, d, form="ppo")
    with pytest.raises(ValueError, match="d > 0"):
        rm.gao_fit(torch.tensor([0.0, 1.0]), torch.tensor([0.0, 1.0]), form="bon")


def test_best_of_n_picks_the_proxys_favourite_and_reports_its_gold(tok, monkeypatch):
    from minirl import reward_model_loop as rml
    from minirl import rollout

    completions = ["3#3", "4#4", "1+2=3#3", "9#9"]  # prompt "1+2=": right, wrong, right, wrong

    def fake_generate(model, tokenizer, prompts, group_size, max_new_tokens, **kw):
        return rollout.Rollout(input_ids=torch.zeros(4, 1), attention_mask=torch.ones(4, 1),
                               completion_ids=torch.zeros(4, 1), completion_mask=torch.ones(4, 1),
                               truncated=torch.zeros(4, dtype=torch.bool), prompt_index=torch.zeros(4),
                               completions=completions, logprobs=torch.zeros(4, 1), group_size=4,
                               prompts=["1+2="] * 4)

    monkeypatch.setattr(rml.decoding, "generate", fake_generate)
    proxy = lambda prompts, completions, **kw: [0.1, 0.9, 0.5, 0.95]  # noqa: E731  (prefers the wrong "9#9")
    data = {"prompt": ["1+2="], "answer": ["3"]}
    rows = rml.best_of_n(None, tok, data, proxy, [1, 2, 3, 4])
    # n = 1: "3#3" (gold 1); n = 2: "4#4" (0.9, gold 0); n = 3: still "4#4"; n = 4: "9#9" (0.95, gold 0)
    assert [r["gold"] for r in rows] == [1.0, 0.0, 0.0, 0.0]
    assert [r["proxy"] for r in rows] == pytest.approx([0.1, 0.9, 0.9, 0.95])
    assert rows[3]["d"] == pytest.approx(math.sqrt(rm.best_of_n_kl(4)))
    with pytest.raises(ValueError, match="n must"):
        rml.best_of_n(None, tok, data, proxy, [0, 2])


# paper-index: reward_models.ensemble_reward
def test_an_ensemble_takes_the_mean_or_the_minimum_of_its_members():
    a = lambda prompts, completions, **kw: [1.0, -2.0]  # noqa: E731
    b = lambda prompts, completions, **kw: [3.0, 0.0]  # noqa: E731
    assert rm.ensemble_reward([a, b])(["p", "q"], ["x", "y"]) == [2.0, -1.0]
    assert rm.ensemble_reward([a, b], how="min")(["p", "q"], ["x", "y"]) == [1.0, -2.0]
    assert rm.ensemble_reward([a])(["p", "q"], ["x", "y"]) == [1.0, -2.0]  # one member: itself
    with pytest.raises(ValueError, match="how"):
        rm.ensemble_reward([a, b], how="max")
    with pytest.raises(ValueError, match="reward_fns"):
        rm.ensemble_reward([])


def test_a_process_reward_is_the_weakest_step(tok):
    from minirl import reward_model_loop as rml

    # _Positions scores each step by its closing column: row 1's steps close at columns 13 and 21 (min 13); row 2 is
    # left-padded by 12 and its one step closes at column 22; padding steps never count
    fn = rml.process_reward(_Positions(), tok, batch_size=1)
    assert fn(["7+5+9=", "3+4="], ["7+5=12;12+9=21#21", "3+4=7#7"]) == [13.0, 10.0]
    # batched together, row 2 is padded by 12 columns more: its score moves with its column, never to a pad's
    assert rml.process_reward(_Positions(), tok)(["7+5+9=", "3+4="], ["7+5=12;12+9=21#21", "3+4=7#7"]) == [13.0, 22.0]


# paper-index: reward_model_loop.proxy_and_gold
def test_proxy_and_gold_measure_fresh_samples_against_the_start(tok):
    import copy

    from helpers import tiny_model

    from minirl import reward_model_loop as rml

    torch.manual_seed(0)
    policy = tiny_model(tok)
    data = {"prompt": ["1+2=", "3+4="], "answer": ["3", "7"]}
    proxy = lambda prompts, completions, **kw: [float(len(c)) for c in completions]  # noqa: E731
    state = torch.random.get_rng_state()
    same = rml.proxy_and_gold(policy, copy.deepcopy(policy), tok, data, proxy, samples_per_prompt=3, max_new_tokens=6)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG untouched
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["d"] == pytest.approx(0.0, abs=1e-3)
    assert same["n"] == 6 and 0.0 <= same["gold"] <= 1.0 and same["proxy"] > 0
    other = copy.deepcopy(policy)
    with torch.no_grad():
        other.lm_head.weight.add_(torch.randn_like(other.lm_head.weight))
    moved = rml.proxy_and_gold(policy, other, tok, data, proxy, samples_per_prompt=3, max_new_tokens=6)
    assert moved["kl"] > 0.01 and moved["d"] == pytest.approx(math.sqrt(moved["kl"]))
    assert moved["gold"] == same["gold"] and moved["proxy"] == same["proxy"]  # the same seed: the same samples


# paper-index: reward_models.best_of_n_gold
def test_best_of_n_gold_by_hand_ties_and_refusals():
    proxy, gold = torch.tensor([[0.1, 0.9, 0.5, 0.95]]), torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    # n = 1: sample 0 (gold 1); n = 2, 3: sample 1 (0.9, gold 0); n = 4: sample 3 (0.95, gold 0)
    assert rm.best_of_n_gold(proxy, gold, [1, 2, 3, 4]).tolist() == [1.0, 0.0, 0.0, 0.0]
    assert rm.best_of_n_gold(proxy, proxy, [1, 2, 4]).tolist() == pytest.approx([0.1, 0.9, 0.95])  # the proxy's own
    tied = torch.tensor([[1.0, 1.0, 0.0]])
    assert rm.best_of_n_gold(tied, torch.tensor([[0.0, 1.0, 1.0]]), [2, 3]).tolist() == [0.0, 0.0]  # the first
    with pytest.raises(ValueError, match=r"in \[1, 4\]"):
        rm.best_of_n_gold(proxy, gold, [5])
    with pytest.raises(ValueError, match="finite"):
        rm.best_of_n_gold(torch.tensor([[float("nan"), 1.0]]), torch.zeros(1, 2), [2])
    with pytest.raises(ValueError, match="gold"):
        rm.best_of_n_gold(proxy, gold[:, :3], [1])


def test_step_labels_agree_with_the_tasks_own_steps_and_the_gold_reward():
    """On the warm start's own samples: each step label is the task's worked step written out (multiturn's
    independent implementation), and a completion whose every step is labelled right, with as many steps as the
    problem and the last total after '#', is exactly what the gold reward scores 1 (given the task's format)."""
    from minirl import decoding, multiturn, tasks
    from minirl.warm_start import warm_start

    policy, tok, _ = warm_start("cpu", seed=0, progress=False)
    data = tasks.load_split("test").select(range(48))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        r = decoding.generate(policy, tok, list(data["prompt"]), 4, 40, recompute_logprobs=False)
    answers = [a for a in data["answer"] for _ in range(4)]
    checked = 0
    for prompt, completion, answer in zip(r.prompts, r.completions, answers, strict=True):
        labels, steps = rm.step_labels(prompt, completion), multiturn.worked_steps(prompt)
        written = completion.split("#")[0].split(";")
        assert labels == [int(i < len(steps) and w == steps[i]) for i, w in enumerate(written)], (prompt, completion)
        gold = tasks.score(completion, answer).reward
        all_right = len(labels) == len(steps) and all(labels)
        if all_right and completion.count("#") == 1 and completion.split("#")[1] == answer:
            assert gold == 1.0, (prompt, completion)
            checked += 1
    assert checked >= 20  # the warm start writes many fully right solutions: the implication was exercised
