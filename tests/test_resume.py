"""Nothing lost: a run killed with SIGKILL mid-run and resumed equals an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import is_timing, kill_9_after, resume_equals
from tests.test_env_train import USER_ENV

ARGS = ["--steps", "8", "--set", "rollout.prompts_per_step=16", "--set", "update.minibatch_size=8",
        "--set", "eval.size=32", "--set", "eval.every=0", "--set", "checkpoint.every=2",
        "--set", "lora.r=4", "--set", "lora.alpha=4", "--set", "update.lr_actor=1e-3",
        "--set", "update.lr_schedule=cosine", "--set", "update.warmup_steps=2"]  # rates change across the kill


def _cmd(model: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "llmrl", "train", "--model", str(model), "--out", str(out), *ARGS, *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing(k) and k != "env_time_s"} for r in rows]


ECHO = USER_ENV  # Echo: answers '7' twice, then ends the episode with a reward of 1


@pytest.mark.parametrize("episodes", [False, True], ids=["one-turn", "episodes"])
def test_kill_9_then_resume_is_bit_identical(warm_tiny_dir: Path, tmp_path: Path, episodes: bool) -> None:
    """PPO (GAE, the critic); `episodes`: in a 3-turn environment, GAE over the model's tokens only."""
    full, killed = tmp_path / "full", tmp_path / "killed"
    extra: list[str] = []
    if episodes:
        (tmp_path / "echo_env.py").write_text(ECHO)
        extra = ["--env", f"{tmp_path / 'echo_env.py'}:Echo", "--set", "rollout.max_turns=3"]
    subprocess.run(_cmd(warm_tiny_dir, full, *extra), check=True, env=_env(), capture_output=True)
    if episodes:
        assert any(r["turns_mean"] > 1 for r in _metrics(full)), "the episodes must have several turns"

    kill_9_after(_cmd(warm_tiny_dir, killed, *extra), _env(), killed)
    assert not (killed / "summary.json").exists()

    resume_equals(full, killed, _env())
    s_full = json.loads((full / "summary.json").read_text())
    s_res = json.loads((killed / "summary.json").read_text())
    for key in ("eval_accuracy_before", "eval_accuracy_after", "reward_mean_last", "kl_last", "tokens_total"):
        assert s_full[key] == s_res[key], key
    assert s_full["reward_mean_last"] is not None and any(r["reward_mean"] > 0 for r in _metrics(full))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_saves_a_checkpoint_and_says_how_to_resume(warm_tiny_dir: Path, tmp_path: Path,
                                                                  sig: signal.Signals) -> None:
    """SIGTERM (a scheduler, `kill`) and SIGHUP (the terminal or SSH session closed) finish the step,
    checkpoint it and exit 130; SIGHUP's default would end the process with nothing saved."""
    out = tmp_path / "run"
    cmd = _cmd(warm_tiny_dir, out)
    cmd[cmd.index("checkpoint.every=2")] = "checkpoint.every=100"
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Continue with: llmrl train --resume" in err and "Traceback" not in err
    done = len((out / "metrics.jsonl").read_text().splitlines())
    assert (out / "checkpoints" / f"step-{done:06d}" / "trainable.safetensors").is_file()


def test_a_reader_that_goes_away_does_not_end_the_run(warm_tiny_dir: Path, tmp_path: Path) -> None:
    """stdout is a pipe whose reader leaves mid-run (`llmrl train | head`, a harness that captured the
    output and was stopped): the run goes quiet and finishes with its whole folder. rich's default
    answer to the BrokenPipeError, SystemExit(1) from the next print (here, step 2's completions), ended
    such a run mid-way with no checkpoint and no error.log."""
    out = tmp_path / "run"
    cmd = _cmd(warm_tiny_dir, out, "--set", "log.completions_every=1")
    cmd[cmd.index("checkpoint.every=2")] = "checkpoint.every=100"
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the start-up table, then the run folder; no step has printed yet
        if line.startswith("Run folder"):
            break
    proc.stdout.close()
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 8
    assert (out / "summary.json").is_file() and (out / "adapters" / "actor" / "adapter_model.safetensors").is_file()
