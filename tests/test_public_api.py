"""`llmrl.Config()` is a valid config: the schema's defaults train as they stand (the algorithm
`ppo` finds its estimator through the presets), and `load_config()` is what the CLI runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import llmrl
from llmrl import Config, load_config, train
from llmrl.config.schema import EvalConfig, ModelConfig, RolloutConfig, UpdateConfig
from llmrl.run.session import resolve_estimator


def test_the_exported_default_config_names_an_estimator_that_exists() -> None:
    assert resolve_estimator(Config()).name == "gae"  # ppo's estimator (algos.py); it used to be "Unknown estimator 'ppo'"
    assert resolve_estimator(load_config()).name == "gae"
    assert {"Config", "load_config", "train", "read_run"} <= set(llmrl.__all__)


def test_training_from_the_exported_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = replace(Config(), steps=2, out=str(tmp_path / "run"), model=ModelConfig(name=str(tiny_model_dir)),
                     rollout=RolloutConfig(prompts_per_step=8), update=UpdateConfig(minibatch_size=4),
                     eval=EvalConfig(size=8))
    run = train(config)
    assert len(run.metrics) == 2 and run.summary["algo"] == "ppo"
    assert all(r["value_loss"] > 0 for r in run.metrics)  # PPO's critic trained: GAE ran
