"""A run that fails keeps what it learned: reward-function errors checkpoint first, then stop."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from llmrl import load_config, read_run, train
from llmrl.run.checkpoint import list_checkpoints
from llmrl.errors import LLMRLError, RunFailed
from llmrl.tasks import TASKS, Task, get_task

SMALL = {"rollout.prompts_per_step": 8, "update.minibatch_size": 8, "eval.size": 8, "eval.every": 0,
         "checkpoint.every": 100, "steps": 5}


def _task_with(reward) -> Task:
    base = get_task("arithmetic")
    return Task("flaky", base.train, base.eval, reward)


def _breaking_after(n_calls: int, bad):
    calls = {"n": 0}

    def reward(prompts, completions, answer):
        calls["n"] += 1
        if calls["n"] > n_calls:
            return bad(completions)
        return [float(len(c) % 2) for c in completions]

    return reward


def _raise(completions):
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_raise, "raised ZeroDivisionError: boom"),
        (lambda c: [0.0] * (len(c) - 1), "returned 7 values for 8 completions"),
        (lambda c: [math.nan] * len(c), "returned NaN or infinity"),
        (lambda c: ["x"] * len(c), "returned the str 'x' for completion 0, not a number"),
    ],
)
def test_reward_failure_checkpoints_then_stops(tiny_model_dir: Path, tmp_path: Path, monkeypatch, bad, message) -> None:
    # call 1 is the eval before training, calls 2–4 are steps 1–3; step 4 breaks
    monkeypatch.setitem(TASKS, "flaky", lambda: _task_with(_breaking_after(4, bad)))
    config = load_config(overrides={"model.name": str(tiny_model_dir), "task": "flaky", "out": str(tmp_path / "r"), **SMALL})
    with pytest.raises(RunFailed) as info:
        train(config)
    assert message in str(info.value) and "reward" in str(info.value).lower()
    assert "continue with: llmrl train --resume" in str(info.value)
    assert [p.name for p in list_checkpoints(tmp_path / "r")] == ["step-000003"]
    assert len(read_run(tmp_path / "r").metrics) == 3
    # with the reward fixed, the run resumes and finishes
    monkeypatch.setitem(TASKS, "flaky", lambda: _task_with(_breaking_after(10**6, bad)))
    run = train(config, resume=True)
    assert run.summary["steps"] == 5 and [r["step"] for r in run.metrics] == [1, 2, 3, 4, 5]


def test_non_finite_steps_stop_the_run(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from dataclasses import replace

    from llmrl.losses import POLICY_LOSSES

    real = POLICY_LOSSES["ppo"].fn

    def poisoned(logprobs, *args, **kwargs):
        out = real(logprobs, *args, **kwargs)
        # a finite loss whose gradient is NaN: d√u/du = inf at u = 0, times du/dθ = 0 (a loss that is itself
        # not finite is refused at its source now, naming the loss: test_plugin_outputs.py)
        return type(out)(out.loss + torch.sqrt(logprobs.sum() * 0.0), out.clip_frac, out.approx_kl)

    # a policy loss whose gradient is not finite, chosen by name like any other (losses.py registry)
    monkeypatch.setitem(POLICY_LOSSES, "poisoned", replace(POLICY_LOSSES["ppo"], name="poisoned", fn=poisoned))
    monkeypatch.setitem(TASKS, "flaky", lambda: _task_with(_breaking_after(10**6, None)))
    config = load_config(overrides={"model.name": str(tiny_model_dir), "task": "flaky", "out": str(tmp_path / "r"), **SMALL},
                         sets=["update.max_bad_steps=2", "update.policy_loss=poisoned"])
    with pytest.raises(RunFailed, match="2 steps in a row had a non-finite loss or gradient"):
        train(config)
    rows = read_run(tmp_path / "r").metrics
    assert [r["skipped_updates"] > 0 for r in rows] == [True, True]


def test_checkpoint_write_failure_is_one_clear_error(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "r"
    score = _breaking_after(10**6, None)

    def reward(prompts, completions, answer):  # once the run folder exists, block its checkpoint folder
        if not (out / "checkpoints").exists():
            (out / "checkpoints").write_text("a file where the checkpoint folder should go")
        return score(prompts, completions, answer)

    monkeypatch.setitem(TASKS, "flaky", lambda: _task_with(reward))
    config = load_config(overrides={"model.name": str(tiny_model_dir), "task": "flaky", "out": str(out), **SMALL},
                         sets=["checkpoint.every=1"])
    with pytest.raises(LLMRLError, match=r"Cannot write checkpoint .*step-000001"):
        train(config)


def test_resume_needs_a_run_with_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from llmrl.cli import app

    result = CliRunner().invoke(app, ["train", "--resume", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "nothing to resume" in result.stderr
    result = CliRunner().invoke(app, ["train", "--resume", str(tmp_path), "--algo", "grpo"])
    assert result.exit_code == 2 and "only --steps may be given with it" in result.stderr
