"""Metrics reach TensorBoard; sampled completions reach completions.jsonl and the terminal; neither
changes the run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.run.folder import RunFolder
from llmrl.tasks import TASKS, Task, get_task
from tests.helpers import digit_share as _digit_share, is_timing

SMALL = ["--steps", "4", "--set", "rollout.prompts_per_step=6", "--set", "rollout.num_generations=2",
         "--set", "update.minibatch_size=6", "--set", "eval.size=8", "--set", "eval.every=0",
         "--set", "update.lr_actor=1e-2"]




@pytest.fixture(autouse=True)
def digits_task(monkeypatch: pytest.MonkeyPatch) -> None:
    base = get_task("arithmetic")
    monkeypatch.setitem(TASKS, "digits", lambda: Task("digits", base.train, base.eval, _digit_share))


def _train(model: Path, out: Path, *extra: str):
    result = CliRunner().invoke(app, ["train", "--model", str(model), "--task", "digits", "--out", str(out), *SMALL, *extra],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    return result


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tensorboard_gets_every_scalar_metric(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    _train(tiny_model_dir, out, "--report-to", "tensorboard", "--set", "log.completions_every=0")
    assert (out / "config.yaml").read_text().count("- tensorboard") == 1
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    metrics = _rows(out / "metrics.jsonl")
    expected = {k for k, v in metrics[0].items() if k != "step" and isinstance(v, (int, float)) and v is not None}
    assert expected <= tags and {"eval_accuracy", "eval_reward"} <= tags
    for key in ("reward_mean", "policy_loss", "kl", "tokens", "zero_advantage"):
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in logged] == [1, 2, 3, 4], key
        for (_, value), row in zip(logged, metrics):
            assert value == pytest.approx(float(row[key]), rel=1e-6, abs=1e-7), key  # stored as float32
    summary = json.loads((out / "summary.json").read_text())
    evals = {e.step: e.value for e in events.Scalars("eval_reward")}
    assert evals.keys() == {0, 4}
    assert evals[0] == pytest.approx(summary["eval_reward_before"], rel=1e-6)
    assert evals[4] == pytest.approx(summary["eval_reward_after"], rel=1e-6)


def test_completions_are_logged_without_changing_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    logged = _train(tiny_model_dir, tmp_path / "on", "--set", "log.completions_every=2", "--set", "log.completions_rows=5")
    _train(tiny_model_dir, tmp_path / "off", "--set", "log.completions_every=0")
    assert not (tmp_path / "off" / "completions.jsonl").exists()
    strip = lambda rows: [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]  # noqa: E731
    assert strip(_rows(tmp_path / "on" / "metrics.jsonl")) == strip(_rows(tmp_path / "off" / "metrics.jsonl"))
    rows = _rows(tmp_path / "on" / "completions.jsonl")
    assert [r["step"] for r in rows] == [1] * 5 + [2] * 5 + [4] * 5  # step 1, then every 2nd step
    assert set(rows[0]) == {"step", "prompt", "completion", "reward", "answer"}
    for r in rows:  # each reward is the task's reward of that completion
        assert r["reward"] == pytest.approx(_digit_share([r["prompt"]], [r["completion"]], [r["answer"]])[0], abs=1e-6)
        assert r["prompt"].endswith("=") and str(sum(map(int, r["prompt"][:-1].split("+")))) == r["answer"]
    # rows 0 and 1 are the two samples (G = 2) of the batch's first prompt
    assert rows[0]["prompt"] == rows[1]["prompt"] != rows[2]["prompt"]
    shown = [line for line in logged.stdout.splitlines() if "→" in line and "(reward" in line]
    assert len(shown) == 3 * 3  # 3 rows shown per logged step
    assert rows[0]["prompt"] in shown[0]


def test_resume_truncates_completions_with_metrics(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    for step in (1, 2, 3, 4):
        folder.log_metrics({"step": step})
        folder.log_completions([{"step": step, "prompt": "1+1=", "completion": "2", "reward": 1.0}] * 2)
    folder.truncate_metrics(2)
    assert [r["step"] for r in _rows(tmp_path / "completions.jsonl")] == [1, 1, 2, 2]
    assert [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [1, 2]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_wandb_not_installed_is_one_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r"), "--report-to", "wandb"])
    assert result.exit_code == 2 and "the 'wandb' package is not installed; pip install wandb" in result.stderr
    assert not (tmp_path / "r").exists(), "the check runs before the run folder is made"


def test_unknown_tracker_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "r"), "--report-to", "tensorboard,mlflow"])
    assert result.exit_code == 2 and "'log.report_to' entries must be among tensorboard, wandb; got 'mlflow'" in result.stderr


def test_resume_shows_each_step_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Steps logged after the newest checkpoint are redone on resume: TensorBoard purges their
    events and completions.jsonl drops their rows, like metrics.jsonl."""
    import shutil

    out = tmp_path / "run"
    _train(tiny_model_dir, out, "--report-to", "tensorboard", "--set", "checkpoint.every=2",
           "--set", "checkpoint.keep=5", "--set", "log.completions_every=1", "--set", "log.completions_rows=2")
    shutil.rmtree(out / "checkpoints" / "step-000004")  # as if killed after logging step 4, before its checkpoint
    (out / "summary.json").unlink()
    resumed = CliRunner().invoke(app, ["train", "--resume", str(out)])
    assert resumed.exit_code == 0, resumed.stderr
    assert [r["step"] for r in _rows(out / "completions.jsonl")] == [1, 1, 2, 2, 3, 3, 4, 4]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("reward_mean")]
    metrics = _rows(out / "metrics.jsonl")
    assert [s for s, _ in logged] == [1, 2, 3, 4]
    assert [v for _, v in logged] == pytest.approx([r["reward_mean"] for r in metrics], rel=1e-6)
