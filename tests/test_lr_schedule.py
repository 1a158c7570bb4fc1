"""update.lr_schedule / update.warmup_steps: the factor table by hand, the optimizer moves by the
scheduled rate, and a run logs the rate of every step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmrl import load_config, read_run, train
from llmrl.config.schema import UpdateConfig
from llmrl.step.schedule import lr_factor, set_learning_rates

# S = 10 steps, W = 2 warm-up steps. Warm-up (s + 1)/(W + 1): s=0 → 1/3, s=1 → 2/3. After it
# progress p = (s − 2)/8: linear 1 − p (s=2 → 1, s=6 → 4/8, s=9 → 1/8); cosine ½(1 + cos πp)
# (s=6: ½(1 + cos π/2) = 0.5; s=9: ½(1 + cos 7π/8) = ½(1 − 0.9238795) = 0.0380602).
TABLE = [
    ("constant", 0, 1 / 3), ("constant", 1, 2 / 3), ("constant", 2, 1.0), ("constant", 9, 1.0),
    ("linear", 0, 1 / 3), ("linear", 2, 1.0), ("linear", 6, 0.5), ("linear", 9, 0.125),
    ("cosine", 1, 2 / 3), ("cosine", 2, 1.0), ("cosine", 6, 0.5), ("cosine", 9, 0.0380602),
]


@pytest.mark.parametrize("schedule,step,expected", TABLE)
def test_factor_table(schedule: str, step: int, expected: float) -> None:
    assert lr_factor(step, 10, schedule, 2) == pytest.approx(expected, abs=1e-6, rel=0)


def test_no_warmup_and_warmup_longer_than_the_run() -> None:
    # W = 0, S = 4, linear: (4 − s)/4 = 1, 0.75, 0.5, 0.25; W = 5 ≥ S = 3: warm-up throughout, s=2 → 3/6
    assert [lr_factor(s, 4, "linear", 0) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert lr_factor(2, 3, "cosine", 5) == 0.5


def test_the_optimizer_steps_with_the_scheduled_rate() -> None:
    # AdamW's first step moves each weight by lr · m̂/(√v̂ + ε) = lr · g/(|g| + 1e-8) ≈ lr · sign(g)
    # (weight decay 0): with lr_actor 0.1 and factor 0.125 (linear, s = 9 of 10, W = 2) that is 0.0125.
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = torch.optim.AdamW([w], lr=123.0, weight_decay=0.0)
    rates = set_learning_rates({"actor": opt}, UpdateConfig(lr_actor=0.1, lr_schedule="linear", warmup_steps=2), 9, 10)
    assert rates == {"lr_actor": pytest.approx(0.0125, abs=1e-12)}
    (w * torch.tensor([3.0, -0.5])).sum().backward()
    opt.step()
    assert torch.allclose(w.detach(), torch.tensor([1.0 - 0.0125, -2.0 + 0.0125]), atol=1e-6, rtol=0)


def test_a_run_logs_each_steps_rates(tiny_model_dir: Path, tmp_path: Path) -> None:
    # ppo (actor and critic), S = 4, W = 1, cosine: s=0 → 1/2; p = (s − 1)/3: s=1 → 1, s=2 → ½(1 + cos π/3)
    # = 0.75, s=3 → ½(1 + cos 2π/3) = 0.25
    train(load_config(overrides={"model.name": str(tiny_model_dir), "out": str(tmp_path / "run"), "steps": 4},
                      sets=["rollout.prompts_per_step=4", "update.minibatch_size=4", "eval.size=2", "eval.every=0",
                            "threads=1", "update.lr_schedule=cosine", "update.warmup_steps=1",
                            "update.lr_actor=1e-3", "update.lr_critic=4e-3"]))
    rows = read_run(tmp_path / "run").metrics
    factors = [0.5, 1.0, 0.75, 0.25]
    assert [r["lr_actor"] for r in rows] == pytest.approx([1e-3 * f for f in factors], abs=1e-12, rel=0)
    assert [r["lr_critic"] for r in rows] == pytest.approx([4e-3 * f for f in factors], abs=1e-12, rel=0)
