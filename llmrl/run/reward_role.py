"""Where a reward model given as a LoRA adapter scores (rewards/adapter.py): on the run's own base as the
stack's fourth role, or as a separate classifier, said in one line; and the critic started from it.

The fourth role needs the reward adapter's base to be the model the actor trains: the same `model.name`
(or the same folder once resolved). The first such reward takes the role; any other adapter reward is a
separate classifier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..config import Config
from ..config.schema import ModelConfig
from ..errors import ConfigError
from ..models.load import model_source, resolve_device, torch_dtype
from ..models.scorer import SavedReward, stack_scores
from ..models.stack import PolicyStack
from ..rewards.adapter import AdapterReward, separate
from ..tasks import Task


def adapter_rewards(task: Task) -> list[AdapterReward]:
    """The task's reward terms that are reward adapters (a `reward.functions` entry `{model: RUN}`)."""
    components = getattr(task.reward, "components", ())
    return [c.fn for c in components if isinstance(c.fn, AdapterReward)]


def _where(name: str) -> str:
    """A model name as a comparable place: its resolved folder where it is local or obtained, else the name."""
    try:
        source, _ = model_source(ModelConfig(name=name), show_progress=False)
    except ConfigError:
        return name
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def shared_reward(task: Task, config: Config) -> AdapterReward | None:
    """The adapter reward whose base is the actor's (the fourth role), None when there is none."""
    here = _where(config.model.name)
    for reward in adapter_rewards(task):
        if reward.base and (reward.base == config.model.name or _where(reward.base) == here):
            if config.dist.shard_base:  # its forwards would be collectives that only some ranks run
                raise ConfigError(f"Reward run '{reward.source}' would be a fourth role on a base sharded with "
                                  "dist.shard_base, which llmrl does not do yet; drop dist.shard_base, or export the "
                                  "reward run (llmrl export) and give the merged classifier instead.")
            return reward
    return None


def critic_start(task: Task, config: Config, shared: AdapterReward | None) -> SavedReward | None:
    """What the critic starts from with `lora.critic_from_reward`: the shared reward's adapter and head."""
    if not config.lora.critic_from_reward:
        return None
    if shared is None:
        raise ConfigError("'lora.critic_from_reward' starts the critic from a reward run on the actor's base; "
                          "reward.functions holds none (give {model: RUN} of a reward run trained on model.name).")
    if config.lora.critic_layers is not None:
        raise ConfigError("'lora.critic_from_reward' starts the critic on every layer the reward adapter adapts; "
                          "drop lora.critic_layers.")
    return shared.saved


def bind_rewards(task: Task, config: Config, stack: PolicyStack, tokenizer: Any, shared: AdapterReward | None,
                 say: Callable[[str], None]) -> None:
    """Place every adapter reward: `shared` on the stack (`reward` role), the others as separate classifiers."""
    for reward in adapter_rewards(task):
        if reward is shared:
            texts = lambda t: stack_scores(stack, tokenizer, t, reward.batch_size)  # noqa: E731
            reward.bind(texts, tokenizer, "shared")
            note = "" if reward.quantize == config.model.quantize else \
                f" (trained on the {reward.quantize} base, scored on this run's {config.model.quantize} one)"
            say(f"Reward model {reward.source}: on the actor's base as a fourth role (adapter 'reward' and its "
                f"score head, no second copy of the weights){note}.")
            continue
        bind_separately(reward, config)
        say(f"Reward model {reward.source}: its base ({reward.base}) is not the model trained "
            f"({config.model.name}), so it is loaded as a separate classifier.")


def bind_separately(reward: AdapterReward, config: Config) -> None:
    """`reward` as a separate classifier on its own base (`rewards/adapter.separate`), in the run's dtype."""
    dtype = torch_dtype(config.model.dtype, config.model.device, config.model.name)
    reward.bind(separate(reward, config.model, resolve_device(config.model.device), dtype), reward.tokenizer, "separate")


def bind_for_evaluation(task: Task, config: Config) -> None:
    """`llmrl eval` of a run trained against a reward adapter: each one scores as a separate classifier (the
    evaluated stack holds the actor only)."""
    for reward in adapter_rewards(task):
        bind_separately(reward, config)
