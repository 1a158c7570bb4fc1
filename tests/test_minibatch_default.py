"""A default update.minibatch_size follows the rows per step a user asks for
(config/model_defaults.default_minibatch): a step smaller than the defaults' takes as many minibatches
of it as the defaults make of theirs; only a size the user set (recipe, flag, --set) is refused where it
exceeds the rows, in one sentence. Through the real command line, with a model folder (a real model's
CPU defaults: 32 rows per step in two minibatches of 16)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import cli_refused, cli_run

REFUSED = ("'update.minibatch_size' (16) exceeds the rows per step "
           "(rollout.prompts_per_step × rollout.num_generations = 8).")


def _args(model: Path, out: Path) -> list[str]:
    """A new user's PPO step of 8 prompts (1 sample each: 8 rows), one step, small for the test."""
    return ["train", "--model", str(model), "--algo", "ppo", "--steps", "1", "--out", str(out),
            "--set", "rollout.prompts_per_step=8", "--set", "rollout.max_new_tokens=4", "--set", "eval.size=2"]


def test_a_step_smaller_than_the_defaults_takes_a_minibatch_that_fits(tiny_model_dir: Path, tmp_path: Path) -> None:
    code, _, err = cli_run(_args(tiny_model_dir, tmp_path / "run"))
    assert code == 0, err  # it stopped on "'update.minibatch_size' (16) exceeds the rows per step"
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (config["rollout"]["prompts_per_step"], config["update"]["minibatch_size"]) == (8, 4)  # two of 4
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("where", ["set", "recipe"])
def test_a_minibatch_the_user_set_above_the_rows_is_refused(tiny_model_dir: Path, tmp_path: Path, where: str) -> None:
    args = _args(tiny_model_dir, tmp_path / "run")
    if where == "set":
        args += ["--set", "update.minibatch_size=16"]
    else:
        recipe = tmp_path / "r.yaml"
        recipe.write_text("update:\n  minibatch_size: 16\n")
        args += ["--recipe", str(recipe)]
    cli_refused(args, REFUSED)
    assert not (tmp_path / "run").exists()
