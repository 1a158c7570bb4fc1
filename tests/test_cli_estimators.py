"""`llmrl algos`, `llmrl advantages` and user-registered estimators, through the real CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.estimators import ESTIMATORS

runner = CliRunner()


def _advantages(payload: object, algo: str) -> tuple[int, dict | None, str]:
    result = runner.invoke(app, ["advantages", "--algo", algo, "--input", "-", "--json"], input=json.dumps(payload))
    return result.exit_code, (json.loads(result.stdout) if result.exit_code == 0 else None), result.stderr


def test_algos_lists_every_algorithm() -> None:
    result = runner.invoke(app, ["algos"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("ppo", "grpo", "dr_grpo", "rloo", "remax", "reinforce", "reinforce_baseline", "a2c"):
        assert name in result.stdout
    assert "λ-return (GAE)" in result.stdout and "mean of the other G−1 samples" in result.stdout


@pytest.mark.parametrize(
    ("lam", "advantages", "returns"),
    [
        (1.0, [[0.5, 0.6, 0.2]], [[1.0, 1.0, 1.0]]),  # the theory text's worked example, λ = 1
        (0.0, [[-0.1, 0.4, 0.2]], [[0.4, 0.8, 1.0]]),  # and λ = 0: δ_t alone
    ],
)
def test_worked_gae_example_through_the_cli(lam: float, advantages: list, returns: list) -> None:
    code, out, err = _advantages({"token_rewards": [[0, 0, 1]], "values": [[0.5, 0.4, 0.8]], "gamma": 1, "lam": lam}, "ppo")
    assert code == 0, err
    assert out == {"advantages": advantages, "returns": returns}


def test_group_estimators_through_the_cli() -> None:
    # GRPO [1,0,0,1]: mean 0.5, unbiased std √(1/3) = 0.57735 → ±0.5/0.57735 = ±0.866025
    code, out, _ = _advantages({"scores": [1, 0, 0, 1], "group_size": 4}, "grpo")
    assert code == 0 and out["advantages"] == [[0.866024], [-0.866024], [-0.866024], [0.866024]]
    # RLOO: 1 − (1+0+0)/3 = 2/3 and 0 − 2/3
    code, out, _ = _advantages({"scores": [1, 0, 0, 1], "group_size": 4}, "rloo")
    assert code == 0 and out["advantages"] == [[0.666667], [-0.666667], [-0.666667], [0.666667]]
    # ReMax: r − r_greedy
    code, out, _ = _advantages({"scores": [1, 0], "baseline_scores": [0.25, 0.25]}, "remax")
    assert code == 0 and out == {"advantages": [[0.75], [-0.25]], "returns": None}


@pytest.mark.parametrize(
    ("payload", "algo", "message"),
    [
        ({"token_rewards": [[0, 1], [1]], "values": [[0, 0], [0]]}, "ppo", "ragged rows"),
        ({"token_rewards": [[0, 1]]}, "ppo", "needs 'values'"),
        ({"scores": [1, 0, 1], "group_size": 2}, "grpo", "'group_size' must be a positive integer dividing the 3 rows"),
        ({"scores": [1, 0]}, "remax", "needs 'baseline_scores'"),
        ({"scores": [1], "token_rewards": [[1]]}, "reinforce", "exactly one of"),
        ({"scores": [1, 0]}, "nope", "Unknown estimator 'nope'"),
        ({"scores": [1, 0], "group_sise": 2}, "grpo", "Unknown input key 'group_sise'; did you mean 'group_size'?"),
        ({"token_rewards": [[0, float("nan")]], "values": [[0, 0]]}, "ppo", "'token_rewards' must hold only finite numbers"),
        ({"scores": [1, float("inf")]}, "reinforce", "'scores' must hold only finite numbers"),
        ({"scores": [True, False]}, "reinforce", "'scores' must be a non-empty list of numbers"),
        ({"scores": []}, "reinforce", "'scores' must be a non-empty list of numbers"),
        ({"token_rewards": [[]], "values": [[]]}, "ppo", "non-empty rows"),
        ({"token_rewards": [[0, 1]], "values": [[0, 0]], "gamma": 1.5}, "ppo", "gamma"),
        ({"token_rewards": [[0, 1]], "values": [[0, 0]], "lam": "x"}, "ppo", "lam"),
    ],
)
def test_bad_advantages_input_exits_2(payload: dict, algo: str, message: str) -> None:
    code, _, err = _advantages(payload, algo)
    assert code == 2 and message in err and "Traceback" not in err


def test_user_estimator_module_trains(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_estimators.py").write_text(
        "from llmrl.estimators import register, EstimatorOutput\n"
        "from llmrl.estimators.returns import broadcast, sequence_reward\n"
        "@register('half_reward', q_estimate='R', baseline='0.5')\n"
        "def half_reward(x):\n"
        "    return EstimatorOutput(broadcast(sequence_reward(x.token_rewards, x.response_mask) - 0.5, x.response_mask))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    try:
        result = runner.invoke(app, [
            "train", "--algo", "reinforce", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(out),
            "--set", "estimator.module=my_estimators", "--set", "estimator.name=half_reward",
            "--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=4",
        ])
        assert result.exit_code == 0, result.stderr
        assert json.loads((out / "summary.json").read_text())["estimator"] == "half_reward"
    finally:
        ESTIMATORS.pop("half_reward", None)
        sys.modules.pop("my_estimators", None)


def test_missing_estimator_module_is_a_clear_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "--set", "estimator.module=no_such_module_xyz", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "Cannot import estimator module 'no_such_module_xyz'" in result.stderr
