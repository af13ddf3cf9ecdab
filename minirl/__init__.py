"""minirl: a small, readable reference implementation of RL for language models.

Modules mirror the notebooks: tasks, tokenizer, models, rollout, kl, advantages, losses, rewards, sampling, moe,
preference, trainer, plots. The names below are the public API (see README.md and DESIGN.md).
"""

from .advantages import gae, group_advantages, group_advantages_to_go, whiten
from .kl import k1, k2, k3, kl_in_loss, kl_in_reward
from .losses import aggregate, policy_loss, value_loss
from .moe import record_routing, replay_routing, routing_change_fraction
from .preference import dpo_loss, ipo_loss, kto_loss, simpo_loss
from .rewards import overlong_penalty
from .rollout import completion_mask, generate, sequence_logprobs, token_logprobs
from .sampling import dynamic_sampling, has_signal
from .trainer import ALGORITHMS, History, RLConfig, evaluate, make_config, resolve_profile, train_rl, warm_start

__all__ = [
    "gae", "group_advantages", "group_advantages_to_go", "whiten", "k1", "k2", "k3", "kl_in_loss", "kl_in_reward",
    "aggregate", "policy_loss", "value_loss", "record_routing", "replay_routing", "routing_change_fraction",
    "dpo_loss", "ipo_loss", "kto_loss", "simpo_loss", "overlong_penalty", "completion_mask", "generate",
    "sequence_logprobs", "token_logprobs", "dynamic_sampling", "has_signal", "ALGORITHMS", "History", "RLConfig",
    "evaluate", "make_config", "resolve_profile", "train_rl", "warm_start",
]

__version__ = "0.1.0"
