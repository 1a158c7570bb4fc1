"""Speed switches must not change the numbers they claim to keep.

`update.on_policy_logprobs`: with one epoch of one minibatch the update is exactly on-policy, so
log π_old equals the detached log-probs of the update's own forward. Skipping the rollout's no-grad
forward must give the same old log-probs, the same losses and the same adapter weights (float64:
only summation order may differ, so 1e-10), and the KL logged from them after the update.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmrl import load_config
from llmrl.checkpoint import trainable_state
from llmrl.cli import app
from llmrl.engine.advantages import estimate, sequence_kl, shape_rewards
from llmrl.engine.rollout import RolloutPlan, rollout
from llmrl.engine.trainer import resolve_estimator
from llmrl.engine.update import Targets, make_optimizers, update
from llmrl.errors import ConfigError
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import get_task
from tests.helpers import digit_share as _digit_share
from tests.conftest import make_tiny_model




def _step(fast: bool, micro: int | None):
    """One rollout + update of grpo (2 prompts × 4, KL k3 in the loss) on a fresh float64 tiny model:
    (old log-probs before the update, batch after it, update stats, trainable weights)."""
    config = load_config(overrides={"algo": "grpo", "rollout.prompts_per_step": 2, "rollout.num_generations": 4,
                                    "update.minibatch_size": 8, "update.micro_batch_size": micro,
                                    "update.lr_actor": 1e-2, "kl.beta": 0.04, "update.on_policy_logprobs": fast})
    spec = resolve_estimator(config)
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(torch.float64), config.lora, with_critic=False)
    with torch.no_grad():  # an actor that differs from the reference, so the KL terms are not 0
        for p in stack.parameters_of("actor"):
            p.add_(0.3 * torch.randn_like(p))
    initial = {k: v.clone() for k, v in trainable_state(stack).items()}
    rows = get_task("arithmetic").train[:2]
    plan = RolloutPlan(reference=True, critic=False, greedy=False, old_logprobs=not fast)
    batch, _ = rollout(stack, build_char_tokenizer(), rows, torch.arange(2), cfg=config.rollout, plan=plan,
                       reward_fn=_digit_share, seed=0, step=0)
    before = batch.old_logprobs.clone()
    out = estimate(spec, batch, shape_rewards(batch, config.kl.beta, config.kl), config.estimator)
    stats = update(stack, make_optimizers(stack, config.update), batch, Targets(out.advantages, out.returns),
                   config.update, config.kl, config.kl.beta, config.rollout.temperature, torch.Generator().manual_seed(7))
    weights = trainable_state(stack)
    assert max(float((weights[k] - initial[k]).abs().max()) for k in weights) > 1e-3  # the update moved them
    return before, batch, stats, weights


@pytest.mark.parametrize("micro", [None, 3])
def test_on_policy_logprobs_keep_the_update_exact(micro: int | None) -> None:
    slow_before, slow, slow_stats, slow_w = _step(False, micro)
    fast_before, fast, fast_stats, fast_w = _step(True, micro)
    assert slow_before.abs().max() > 0.1 and fast_before.abs().max() == 0  # the fast rollout skipped the forward
    assert slow.response_mask.sum() > 8
    torch.testing.assert_close(fast.old_logprobs, slow.old_logprobs, atol=1e-10, rtol=0)
    assert sequence_kl(fast) == pytest.approx(sequence_kl(slow), abs=1e-10) and abs(sequence_kl(slow)) > 1e-3
    for key in ("policy_loss", "entropy", "clip_frac", "approx_kl", "actor_grad_norm"):
        assert fast_stats[key] == pytest.approx(slow_stats[key], abs=1e-10), key
    assert fast_w.keys() == slow_w.keys()
    for name in slow_w:
        torch.testing.assert_close(fast_w[name], slow_w[name], atol=1e-10, rtol=0)


@pytest.mark.parametrize("sets", [
    {"update.epochs": 2},
    {"update.minibatch_size": 4},
    {"kl.placement": "reward", "kl.beta": 0.1},
])
def test_on_policy_logprobs_refuses_an_off_policy_update(sets: dict) -> None:
    base = {"algo": "grpo", "rollout.prompts_per_step": 2, "rollout.num_generations": 4, "update.minibatch_size": 8,
            "update.on_policy_logprobs": True}
    load_config(overrides=base)  # the on-policy case is accepted
    with pytest.raises(ConfigError, match="needs one exactly on-policy update"):
        load_config(overrides={**base, **sets})


def test_on_policy_logprobs_cli_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--set", "update.on_policy_logprobs=true", "--set", "update.epochs=2",
                                      "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.stderr
    assert "'update.on_policy_logprobs' needs one exactly on-policy update" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
