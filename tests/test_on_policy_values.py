"""`update.on_policy_values`: V_old from the critic's own update forward, not a rollout forward.

With one epoch of one minibatch of all rows (one micro-batch), the critic is the same at the rollout
and at its update, so the values of the critic's update forward (run first, its graph kept for the
backward) are the rollout's values. Skipping the rollout's no-grad critic forward must give the same
values, advantages, losses and adapter weights (float64: 1e-10).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llmrl import load_config
from llmrl.run.checkpoint import trainable_state
from llmrl.config.on_policy import on_policy_values
from llmrl.step.estimate import estimate, shape_rewards
from llmrl.step.records import StepPlan
from llmrl.run.session import resolve_estimator
from llmrl.step.update import make_optimizers, update
from llmrl.errors import ConfigError
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import get_task
from tests.conftest import make_tiny_model
from tests.helpers import digit_share
from tests.steps import rollout

ROOT = Path(__file__).resolve().parent.parent
# ppo, 8 prompts × 1, one minibatch of all rows, k1 KL in the reward: one update pass
SINGLE = {"algo": "ppo", "rollout.prompts_per_step": 8, "update.minibatch_size": 8}


def _step(in_update: bool):
    """One ppo rollout + update on a fresh float64 tiny model: (rollout, advantages, stats, weights,
    no-grad critic forwards the rollout ran, all critic forwards)."""
    config = load_config(overrides={**SINGLE, "update.lr_actor": 1e-2, "update.lr_critic": 1e-2,
                                    "update.on_policy_values": "on" if in_update else "off"})
    spec = resolve_estimator(config)
    torch.manual_seed(0)
    stack = PolicyStack(make_tiny_model().to(torch.float64), config.lora, with_critic=True)
    with torch.no_grad():  # a critic that is not 0, so values and their gradients are real
        for p in stack.parameters_of("critic"):
            p.add_(0.3 * torch.randn_like(p))
    calls = []
    real = stack.values
    # True: a gradient forward (the update's, or the one forward keeps for it); False: a no-grad one
    stack.values = lambda seq, base=None: calls.append(torch.is_grad_enabled()) or real(seq, base)  # type: ignore[method-assign]
    plan = StepPlan(reference=True, critic=not in_update, greedy=False, from_generation=True, critic_in_update=in_update)
    r = rollout(stack, build_char_tokenizer(), get_task("arithmetic").train[:8], torch.arange(8),
                cfg=config.rollout, plan=plan, reward_fn=digit_share, seed=0, step=0)
    rollout_calls = calls.count(False)
    targets = estimate(spec, *r, shape_rewards(*r, config.kl.beta, config.kl), config.estimator)
    result = update(stack, make_optimizers(stack, config.update), r.rows, targets,
                    config.update, config.kl, config.kl.beta, config.rollout.temperature,
                    torch.Generator().manual_seed(7), critic_values=r.forwards.value_graph)
    return r, targets.advantages, result.stats, trainable_state(stack), rollout_calls, len(calls)


def test_values_from_the_update_forward_keep_the_update_exact() -> None:
    slow, slow_adv, slow_stats, slow_w, slow_rollout, slow_total = _step(False)
    fast, fast_adv, fast_stats, fast_w, fast_rollout, fast_total = _step(True)
    assert (slow_rollout, slow_total) == (1, 2)  # rollout forward + the critic pass's forward
    assert (fast_rollout, fast_total) == (0, 1)  # only the update's forward
    assert float(slow.forwards.values.abs().max()) > 0.1
    torch.testing.assert_close(fast.forwards.values, slow.forwards.values, atol=1e-12, rtol=0)
    torch.testing.assert_close(fast_adv, slow_adv, atol=1e-10, rtol=0)
    for key in ("value_loss", "critic_grad_norm", "policy_loss", "actor_grad_norm"):
        assert fast_stats[key] == pytest.approx(slow_stats[key], abs=1e-10), key
        assert slow_stats[key] != 0, key
    for name in slow_w:
        torch.testing.assert_close(fast_w[name], slow_w[name], atol=1e-10, rtol=0)


@pytest.mark.parametrize("sets", [{"update.epochs": 2}, {"update.minibatch_size": 4},
                                  {"update.micro_batch_size": 4}])
def test_auto_is_on_for_one_pass_only(sets: dict) -> None:
    assert on_policy_values(load_config(overrides=SINGLE))
    assert on_policy_values(load_config(overrides={**SINGLE, "update.micro_batch_size": 8}))
    assert not on_policy_values(load_config(overrides={**SINGLE, **sets}))
    assert not on_policy_values(load_config(overrides={**SINGLE, "update.on_policy_values": False}))
    with pytest.raises(ConfigError, match="'update.on_policy_values' needs one update pass"):
        load_config(overrides={**SINGLE, **sets, "update.on_policy_values": "on"})


def test_the_default_ppo_run_keeps_its_rollout_critic_forward() -> None:
    assert not on_policy_values(load_config(overrides={"algo": "ppo"}))  # two minibatches of 256


def test_on_with_two_epochs_is_one_sentence_on_stderr(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "llmrl", "train", "--algo", "ppo", "--out", str(tmp_path / "r"),
                           "--set", "update.epochs=2", "--set", "update.on_policy_values=on"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "'update.on_policy_values' needs one update pass" in proc.stderr
    assert not (tmp_path / "r").exists()
