"""A checkpoint that cannot be written (the disk or the file size limit is full) is one clear error,
and the previous checkpoint stays intact and resumable. Real subprocess, real write failure:
RLIMIT_FSIZE makes every write past the limit fail with EFBIG, as a full disk fails with ENOSPC."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import torch

from llmrl.run.checkpoint import describe, list_checkpoints

ARGS = ["--set", "rollout.prompts_per_step=8", "--set", "update.minibatch_size=8", "--set", "eval.size=8",
        "--set", "eval.every=0", "--set", "checkpoint.every=1", "--set", "checkpoint.keep=5"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_checkpoint_write_failure_keeps_the_previous_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    base = [sys.executable, "-m", "llmrl", "train", "--model", str(tiny_model_dir), "--out", str(run), *ARGS]
    subprocess.run([*base, "--steps", "2"], check=True, env=_env(), capture_output=True)
    before = list_checkpoints(run)
    assert [p.name for p in before] == ["step-000001", "step-000002"]
    saved = {p: (p / "state.pt").read_bytes() for p in before}
    state_size = len(saved[before[-1]])
    logs = max((run / n).stat().st_size for n in ("metrics.jsonl", "completions.jsonl"))
    limit = 4 * logs  # the logs still fit; a checkpoint's files do not
    assert limit < state_size, (limit, state_size)

    failed = subprocess.run([sys.executable, "-m", "llmrl", "train", "--resume", str(run), "--steps", "4"],
                            env=_env(), capture_output=True, text=True, preexec_fn=_limit_file_size(limit))
    assert failed.returncode == 1, failed.stderr
    err = failed.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"Cannot write checkpoint {run}/checkpoints/step-000003: File too large (the file size limit was reached)." in err
    assert f"Training state after step 2 is checkpointed; fix the cause and continue with: llmrl train --resume {run}" in err
    # the previous checkpoints are untouched and no half-written folder is left behind
    assert list_checkpoints(run) == before and not list((run / "checkpoints").glob(".tmp-*"))
    assert all((p / "state.pt").read_bytes() == data for p, data in saved.items())
    assert torch.load(before[-1] / "state.pt", weights_only=True)["step"] == 2

    # with room again, the run continues from step 2 and finishes
    resumed = subprocess.run([sys.executable, "-m", "llmrl", "train", "--resume", str(run), "--steps", "4"],
                             env=_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "Resuming after step 2" in resumed.stdout
    steps = [line.split('"step": ')[1].split(",")[0] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == ["1", "2", "3", "4"]


def test_disk_full_message_says_what_it_means() -> None:
    assert describe(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) == "No space left on device (the disk is full)"
    assert describe(OSError(errno.EACCES, os.strerror(errno.EACCES))) == "Permission denied"


def test_log_write_failure_before_any_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    """metrics.jsonl hits the limit a few steps in, before the first checkpoint: one clear error."""
    run = tmp_path / "run"
    args = ["--model", str(tiny_model_dir), "--out", str(run), "--steps", "50", *ARGS, "--set", "checkpoint.every=0"]
    config = subprocess.run([sys.executable, "-m", "llmrl", "config", "--yaml", "--model", str(tiny_model_dir), *ARGS],
                            env=_env(), capture_output=True, text=True, check=True).stdout
    limit = len(config.encode()) + 2000  # config.yaml (+ "out") fits; about three metrics rows more do not
    failed = subprocess.run([sys.executable, "-m", "llmrl", "train", *args], env=_env(), capture_output=True,
                            text=True, preexec_fn=_limit_file_size(limit))
    assert failed.returncode == 1, failed.stderr
    err = failed.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"Cannot append to {run}/metrics.jsonl: File too large." in err
    assert "No checkpoint was written yet; fix the cause and start again with --overwrite." in err
    assert (run / "config.yaml").is_file() and not list_checkpoints(run)
