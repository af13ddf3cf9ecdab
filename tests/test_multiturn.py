"""Multi-turn episodes (minirl.multiturn, train_rl's env_factory): the environments by hand, token in / token out
(and where re-tokenising would change the tokens), the masks (the environment's tokens get exactly zero gradient, and
a mask that lets them in is caught), a one-turn episode equal to today's single-turn step bit for bit, turn rewards
and GAE over an episode by hand, and the settings episodes refuse."""

import copy
from types import SimpleNamespace

import datasets
import pytest
import torch
from helpers import tiny_model
from standins import build_chat_tokenizer

from minirl import config, decoding, multiturn, rl, rollout, tasks, warm_start

TIMING = {"time", "time_generate", "time_optimise"}


# --- the environments, by hand -------------------------------------------------------------------------------------
def test_worked_steps_and_the_first_wrong_hint():
    assert multiturn.worked_steps("7+5+9=") == ["7+5=12", "12+9=21"]
    assert multiturn.worked_steps("3+4=") == ["3+4=7"]
    assert multiturn.first_wrong_hint("7+5+9=", "7+5=13;13+9=22#22") == "7+5=12;"
    assert multiturn.first_wrong_hint("7+5+9=", "7+5=12;12+9=22#22") == "7+5=12;12+9=21#"
    assert multiturn.first_wrong_hint("7+5+9=", "7+5=12;12+9=21#20") == "7+5=12;12+9=21#"  # the answer alone wrong
    assert multiturn.first_wrong_hint("7+5+9=", "#21") == "7+5=12;"  # no step written: the first one


def test_retry_env_by_hand():
    env = multiturn.RetryEnv(max_turns=3, decay=0.5)
    assert env.reset("7+5+9=", answer="21") == ""
    first = env.step("7+5=13;13+9=22#22")
    assert (first.observation, first.reward, first.done) == ("<bos>7+5+9=7+5=12;", 0.0, False)
    second = env.step("12+9=21#21")  # scored as "7+5=12;12+9=21#21"
    assert (second.reward, second.done) == (0.5, True)
    env.reset("3+4=", answer="7")
    assert env.step("3+4=7#7").reward == 1.0  # right first time: decay^0
    env = multiturn.RetryEnv(max_turns=2, hint=False)
    env.reset("3+4=", answer="7")
    assert env.step("3+4=8#8").observation == "<bos>3+4="  # "try again", no hint
    last = env.step("3+4=9#9")
    assert (last.reward, last.done) == (0.0, True)  # the turn limit


def test_calculator_env_by_hand():
    env = multiturn.CalculatorEnv(max_turns=4)
    env.reset("7+5+9=", answer="21")
    assert env.step("7+5=").observation == "12"
    assert env.step(";12+9=").observation == "21"
    end = env.step("#21")
    assert (end.reward, end.done, env.transcript) == (1.0, True, "7+5=12;12+9=21#21")
    env.reset("7+5+9=", answer="21")
    assert env.step("7+5=12;12+9=21#21").reward == 1.0  # no call at all: a plain answer
    env = multiturn.CalculatorEnv(max_turns=1)
    env.reset("7+5=", answer="12")
    assert env.step("7+5=").done  # the turn limit: a call is scored as the answer (0)


# --- the rollout: token in, token out -------------------------------------------------------------------------------
def rows_of(prompts):
    return datasets.Dataset.from_dict({"prompt": prompts, "answer": [str(sum(map(int, p[:-1].split("+"))))
                                                                   for p in prompts]})


@pytest.fixture(scope="module")
def episodes(tok):
    """The shipped warm start's episodes of two prompts x 4 with the retry environment: it ends its turns with EOS,
    gets some wrong and is answered (a random model would never end a turn)."""
    model, _, _ = warm_start.warm_start("cpu", seed=0, progress=False)
    torch.manual_seed(0)
    r = multiturn.generate_episodes(model, tok, rows_of(["8+9+6+8=", "9+9+1+2+7="]),
                                    lambda: multiturn.RetryEnv(max_turns=3), 4, 40, max_turns=3)
    return model, r


def test_an_episode_records_who_wrote_each_token_and_the_masks_follow(tok, episodes):
    _, r = episodes
    P = r.n_prompt_tokens
    valid = r.attention_mask[:, P:]
    assert torch.equal(r.completion_mask, (r.author * valid).float())  # the loss mask is the model's tokens
    assert bool(((r.author == 0) & (valid > 0)).any())  # some environment tokens were written (untrained model)
    for b in range(len(r.completion_ids)):
        turns = r.turn[b][valid[b] > 0].tolist()
        assert turns == sorted(turns) and turns[0] == 1  # in order, from turn 1
        # the environment's tokens are exactly the observation's own tokens: "<bos>" + the prompt (+ a hint)
        obs = r.completion_ids[b][(r.author[b] == 0) & (valid[b] > 0)].tolist()
        if obs:
            assert obs[:1] == [tok.bos_token_id] and tok.decode(obs).startswith("<bos>" + r.prompts[b])
    assert torch.equal(r.episode_rewards, r.turn_rewards.sum(1))
    assert r.logprobs is r.sampler_logprobs and float(r.sampler_logprobs[r.completion_mask == 0].abs().sum()) == 0


def test_retokenising_the_models_text_would_change_its_tokens_on_a_bpe_tokenizer():
    # the model may sample a word as pieces; decoding and encoding again merges them into other tokens
    tok = build_chat_tokenizer()
    merged = tok("the answer", add_special_tokens=False)["input_ids"]
    pieces = [i for ch in "the answer" for i in tok(ch, add_special_tokens=False)["input_ids"]]
    assert tok.decode(pieces) == tok.decode(merged) == "the answer"
    assert pieces != merged and len(pieces) > len(merged)
    assert tok(tok.decode(pieces), add_special_tokens=False)["input_ids"] == merged  # re-tokenised: not what was drawn


def test_generate_episodes_refuses_bad_input(tok):
    model = tiny_model(tok)
    with pytest.raises(ValueError, match="max_turns"):
        multiturn.generate_episodes(model, tok, rows_of(["1+2="]), multiturn.RetryEnv, 2, 4, max_turns=0)
    with pytest.raises(ValueError, match="string prompts"):
        multiturn.generate_episodes(model, tok, {"prompt": [[{"role": "user", "content": "1+2="}]], "answer": ["3"]},
                                    multiturn.RetryEnv, 2, 4, max_turns=2)


# --- a one-turn episode is today's single-turn step -----------------------------------------------------------------
class OneTurn:
    """One turn, scored by the task's reward: the single-turn step as an environment."""

    def reset(self, prompt, answer, **_):
        self.answer = answer
        return ""

    def step(self, completion):
        return multiturn.StepResult("", tasks.score(completion, self.answer).reward, True)


def test_a_one_turn_episode_is_generates_rollout(tok):
    model = tiny_model(tok)
    prompts = ["1+2=", "3+4+5="]
    torch.manual_seed(3)
    single = decoding.generate(model, tok, prompts, 4, 8, recompute_logprobs=False)
    torch.manual_seed(3)
    episode = multiturn.generate_episodes(model, tok, rows_of(prompts), OneTurn, 4, 8, max_turns=1)
    for name in ("input_ids", "attention_mask", "completion_ids", "completion_mask", "truncated", "prompt_index",
                 "logprobs", "sampler_logprobs"):
        assert torch.equal(getattr(single, name), getattr(episode, name)), name
    assert single.completions == episode.completions


@pytest.mark.parametrize("algo", ["grpo", "dapo"])
def test_one_turn_training_is_todays_single_turn_step_bit_for_bit(tok, algo):
    train = tasks.load_split("train")
    extra = dict(dynamic_sampling=False, overlong_shaping=False) if algo == "dapo" else {}
    cfg = config.make_config(algo, steps=2, prompts_per_step=2, group_size=4, max_new_tokens=12, lr=1e-3,
                             progress=False, **extra)
    base = tiny_model(tok)
    models, rows = [copy.deepcopy(base), copy.deepcopy(base)], []
    for model, env in zip(models, (None, OneTurn), strict=True):
        h = rl.train_rl(model, tok, cfg, train, env_factory=env)
        rows.append([{k: v for k, v in r.items() if k not in TIMING and not k.startswith("rewards/")} for r in h.rows])
    assert rows[0] == rows[1]
    assert all(torch.equal(p, q) for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True))


# --- the masks: the environment's tokens get exactly zero gradient ----------------------------------------------------
def logit_grads(model, r, cfg):
    """The gradient of one update_minibatch on episode rollout ``r`` w.r.t. the LM head's output (b, L, V)."""
    captured = []

    def keep(module, inputs, out):  # returns None: the output is left as it is
        out.retain_grad()
        captured.append(out)

    handle = model.lm_head.register_forward_hook(keep)
    P = r.n_prompt_tokens
    batch = rl.RLBatch(input_ids=r.input_ids, attention_mask=r.attention_mask, n_prompt_tokens=P,
                       completion_mask=r.completion_mask, loss_mask=r.completion_mask, old_logprobs=None,
                       advantages=torch.randn(len(r.input_ids), generator=torch.Generator().manual_seed(0)),
                       ref_logprobs=r.sampler_logprobs * 0.9, sampler_logprobs=r.sampler_logprobs)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    try:
        rl.update_minibatch(model, opt, batch, cfg, beta=cfg.beta)
    finally:
        handle.remove()
    # the logit at position P + t - 1 predicts completion token t
    return captured[-1].grad[:, P - 1:-1]  # (B, T, V)


@pytest.mark.parametrize("switches", [dict(beta=0.04), dict(beta=0.04, entropy_coef=0.01),
                                      dict(beta=0.0, loss_mode="cispo", cispo_form="one-sided", agg="token-mean"),
                                      dict(beta=0.04, agg="seq-mean-token-sum-norm")])
def test_observation_tokens_get_exactly_zero_gradient_and_a_leaky_mask_is_caught(tok, episodes, switches):
    model, r = episodes
    model = copy.deepcopy(model)
    cfg = config.make_config("grpo", num_minibatches=1, group_size=4, prompts_per_step=2, **switches)
    obs = (r.author == 0) & (r.attention_mask[:, r.n_prompt_tokens:] > 0)  # (B, T) the environment's tokens
    grads = logit_grads(model, r, cfg)
    assert float(grads[obs].abs().max()) == 0.0  # exactly: no loss, no KL, no entropy term on them
    assert float(grads[r.completion_mask > 0].abs().max()) > 0  # the model's tokens do learn
    leaky = copy.copy(r)
    leaky.completion_mask = r.attention_mask[:, r.n_prompt_tokens:].float()  # the mutation: observations let in
    assert float(logit_grads(copy.deepcopy(model), leaky, cfg)[obs].abs().max()) > 0  # and the test catches it


def test_mask_observations_false_puts_the_environments_tokens_in_the_loss(tok):
    train = tasks.load_split("train")
    seen = {}
    real = rl.update_minibatch

    def spy(model, optimizer, minibatch, cfg, **kw):
        seen[cfg.mask_observations] = float(minibatch.loss_mask.sum())
        return real(model, optimizer, minibatch, cfg, **kw)

    for mask in (True, False):
        cfg = config.make_config("grpo", steps=1, prompts_per_step=4, group_size=4, max_new_tokens=40, max_turns=3,
                                 num_minibatches=1, beta=0.0, mask_observations=mask, progress=False)
        rl.update_minibatch = spy
        try:
            model, _, _ = warm_start.warm_start("cpu", seed=0, progress=False)  # ends its turns: observations
            rl.train_rl(model, tok, cfg, train, env_factory=lambda: multiturn.RetryEnv(max_turns=3))
        finally:
            rl.update_minibatch = real
    assert seen[False] > seen[True] > 0  # the leaky arm trains on more tokens: the observations


# --- rewards and advantages over an episode, by hand ----------------------------------------------------------------
def test_turn_rewards_go_on_each_turns_last_model_token():
    turn = torch.tensor([[1, 1, 1, 1, 2, 2, 0]])
    model_mask = torch.tensor([[1.0, 1, 0, 0, 1, 1, 0]])  # two observation tokens of turn 1, one pad
    got = multiturn.turn_rewards_on_tokens(torch.tensor([[0.25, 0.5]]), turn, model_mask)
    assert got.tolist() == [[0.0, 0.25, 0.0, 0.0, 0.0, 0.5, 0.0]]
    got = multiturn.turn_rewards_on_tokens(torch.tensor([[0.0, 0.5, 0.7]]), turn, model_mask)  # no turn 3: dropped
    assert got.tolist() == [[0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]]


# paper-index: multiturn.episode_gae
def test_episode_gae_by_hand():
    # model tokens at columns 0, 1, 3: rewards [0, 0.5, 1], values [0.5, 0.6, 0.7], gamma 1, lam 0.95:
    # deltas [0.1, 0.6, 0.3]; A_3 = 0.3, A_1 = 0.6 + 0.95 * 0.3 = 0.885, A_0 = 0.1 + 0.95 * 0.885 = 0.94075
    rewards = torch.tensor([[0.0, 0.5, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 9.9, 0.7]])  # the observation's 9.9 is never read
    adv, ret = multiturn.episode_gae(rewards, values, torch.tensor([[1.0, 1, 0, 1]]), gamma=1.0, lam=0.95)
    torch.testing.assert_close(adv, torch.tensor([[0.94075, 0.885, 0.0, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[1.44075, 1.485, 0.0, 1.0]]))
    # one turn (no hole): plain GAE
    from minirl.advantages import gae
    full = torch.ones(1, 3)
    torch.testing.assert_close(multiturn.episode_gae(rewards[:, :3], values[:, :3], full)[0],
                               gae(rewards[:, :3], values[:, :3], full)[0])


# --- what episodes refuse ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("switches, match", [
    (dict(advantage="gae"), "gae"), (dict(beta=0.04, kl_placement="reward"), "kl_placement"),
    (dict(top_k=2), "top_k"), (dict(generation_batch_size=4), "generation_batch_size"),
])
def test_episodes_refuse_what_they_do_not_support(tok, switches, match):
    cfg = config.make_config("grpo", steps=1, max_turns=2, progress=False, **switches)
    with pytest.raises(ValueError, match=match):
        rl.train_rl(tiny_model(tok), tok, cfg, tasks.load_split("train"), env_factory=multiturn.RetryEnv)


def test_multi_turn_settings_without_an_environment_are_refused(tok):
    for switches in (dict(max_turns=2), dict(mask_observations=False)):
        cfg = config.make_config("grpo", steps=1, progress=False, **switches)
        with pytest.raises(ValueError, match="env_factory"):
            rl.train_rl(tiny_model(tok), tok, cfg, tasks.load_split("train"))
    with pytest.raises(ValueError, match="reward_fn"):
        rl.train_rl(tiny_model(tok), tok, config.make_config("grpo", steps=1, progress=False),
                    tasks.load_split("train"), env_factory=OneTurn, reward_fn=tasks.running_sums_reward)
    with pytest.raises(ValueError, match="max_turns"):
        config.make_config("grpo", max_turns=0)


def test_evaluate_episodes_counts_first_tries_and_final_successes(tok, monkeypatch):
    fake = SimpleNamespace(turn_rewards=torch.tensor([[1.0, 0.0], [0.0, 0.5], [0.0, 0.0], [0.0, 0.5]]),
                           episode_rewards=torch.tensor([1.0, 0.5, 0.0, 0.5]),
                           turn=torch.tensor([[1, 1], [1, 2], [1, 2], [2, 2]]), completion_mask=torch.ones(4, 2))
    monkeypatch.setattr(multiturn, "generate_episodes", lambda *a, **k: fake)
    m = multiturn.evaluate_episodes(None, tok, rows_of(["1+2="]), OneTurn, 4, max_turns=2)
    assert m == {"first_try_accuracy": 0.25, "final_accuracy": 0.75, "reward": 0.5, "turns": 1.75,
                 "model_tokens": 2.0}


def test_rollout_helpers_keep_the_episode_fields(episodes):
    _, r = episodes
    picked = rollout.select_groups(r, [1])
    assert torch.equal(picked.author, r.author[4:]) and torch.equal(picked.turn_rewards, r.turn_rewards[4:])
    both = rollout.concat([rollout.select_groups(r, [0]), picked], 0)
    assert torch.equal(both.author, r.author) and torch.equal(both.episode_rewards, r.episode_rewards)


def test_the_checkers_episode_gae_copy_agrees_with_minirl():
    from minirl.exercises import _reference

    g = torch.Generator().manual_seed(5)
    r, v = torch.randn(5, 9, generator=g), torch.randn(5, 9, generator=g)
    mask = (torch.rand(5, 9, generator=g) > 0.4).float()
    for gamma, lam in ((1.0, 0.95), (0.9, 0.7)):
        for mine, key in zip(multiturn.episode_gae(r, v, mask, gamma=gamma, lam=lam),
                             _reference.episode_gae(r, v, mask, gamma=gamma, lam=lam), strict=True):
            torch.testing.assert_close(mine, key)
