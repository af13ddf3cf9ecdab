"""rl.py: which log-probs play pi_old, decided by one function that the rollout stage, the metrics and the update
read."""

import pytest
import torch

from minirl import config, models, rl, rollout
from minirl.rl import pi_old_source


@pytest.mark.parametrize("overrides, sampler_is_trainer, expected", [
    (dict(num_minibatches=1), True, "current"),  # one update per rollout: the training forward's own, detached
    (dict(num_minibatches=2), True, "recomputed"),  # later minibatches see an updated policy
    (dict(num_minibatches=1, num_iterations=2), True, "recomputed"),
    (dict(num_minibatches=1), False, "recomputed"),  # a sampler that is not the trainer: its gap is measured
    (dict(num_minibatches=1, routing_replay=True), True, "recomputed"),  # R2 records pi_old's experts
    (dict(num_minibatches=1, beta=0.05, kl_placement="reward"), True, "recomputed"),  # read before the update
    (dict(num_minibatches=1, pi_old="naive"), True, "sampler"),
    (dict(num_minibatches=2, pi_old="naive"), False, "sampler"),
])
def test_pi_old_source_decides_once(overrides, sampler_is_trainer, expected):
    cfg = config.make_config("grpo", **overrides)
    assert pi_old_source(cfg, sampler_is_trainer=sampler_is_trainer) == expected


@pytest.mark.parametrize("source", ["current", "recomputed", "sampler"])
def test_behaviour_logprobs_follow_the_source(tok, source):
    """"current": None (the update detaches its own); "recomputed": the trainer's forward; "sampler": the decode
    loop's own log-probs, exactly."""
    model = models.tiny_dense(tok, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    torch.manual_seed(0)
    r = rollout.generate(model, tok, ["1+2=", "3+4="], 2, 6, recompute_logprobs=False)
    cfg = config.make_config("grpo", pi_old="naive" if source == "sampler" else "recomputed")
    old, _, _ = rl.behaviour_logprobs(model, None, r, cfg, source=source)
    if source == "current":
        assert old is None
    elif source == "sampler":
        assert torch.equal(old, torch.where(r.completion_mask > 0, r.sampler_logprobs, 0.0))
    else:
        want = rollout.token_logprobs(model, r.input_ids, r.attention_mask, r.n_prompt_tokens)
        torch.testing.assert_close(old, torch.where(r.completion_mask > 0, want, 0.0))
    with pytest.raises(ValueError, match="source"):
        rl.behaviour_logprobs(model, None, r, cfg, source="trainer")
