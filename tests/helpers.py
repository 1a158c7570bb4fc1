"""Small helpers shared by the math table tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ATOL = dict(atol=1e-4, rtol=0)


def close(actual, expected) -> None:
    """assert_close with the project's tight math tolerance (atol 1e-4, rtol 0)."""
    if isinstance(actual, torch.Tensor):
        expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, **ATOL)


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def m(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def digit_share(prompts: list[str], completions: list[str], answer: list[str]) -> list[float]:
    """A dense reward a random model earns too: the share of digits in the completion."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def digits_task(name: str = "digits", success: float = 1.0):
    """The arithmetic prompts with `digit_share` as reward, for runs on a random tiny model."""
    from llmrl.tasks import Task, get_task

    base = get_task("arithmetic")
    return Task(name, base.train, base.eval, digit_share, success=success)


def kill_9_after(cmd: list[str], env: dict[str, str], run: Path, rows: int = 5) -> None:
    """Start the `llmrl train` command `cmd` writing into `run` and SIGKILL it once its metrics.jsonl
    holds `rows` rows (within 120 s); fails if the run ended first."""
    import signal
    import time

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, metrics = time.time() + 120, run / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= rows:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def run_metrics(run: Path) -> list[dict]:
    """A run's metrics.jsonl rows without their wall-clock entries (timings, env_time_s)."""
    import json

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing(k) and k != "env_time_s"} for r in rows]


def resume_equals(full: Path, killed: Path, env: dict[str, str], after_step: int = 4) -> None:
    """`llmrl train --resume KILLED` finishes the killed run, whose metrics (but timings) and actor and
    critic adapters then equal the uninterrupted run `full`'s bit for bit."""
    from safetensors.torch import load_file

    resumed = subprocess.run([sys.executable, "-m", "llmrl", "train", "--resume", str(killed)], env=env,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"Resuming after step {after_step}" in resumed.stdout
    assert run_metrics(killed) == run_metrics(full)
    for role in ("actor", "critic"):
        a = load_file(full / "adapters" / role / "adapter_model.safetensors")
        b = load_file(killed / "adapters" / role / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role


def is_timing(key: str) -> bool:
    """A metrics-row key that is measured, not computed: wall seconds (`step_time_s`, `time_<phase>_s`)
    or a phase's peak memory (`peak_rss_<phase>_mib`, `peak_cuda_<phase>_mib`): never compared."""
    return (key == "step_time_s" or (key.startswith("time_") and key.endswith("_s"))
            or (key.startswith(("peak_rss_", "peak_cuda_")) and key.endswith("_mib")))


# a CLI run of the tiny model small enough for a refusal test, and the in-process CLI checks
CLI_SMALL = ["--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=2",
             "--set", "eval.every=0", "--set", "threads=1"]


def cli_run(args: list[str]) -> tuple[int, str, str]:
    """`llmrl ARGS` in-process: (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from llmrl.cli import app

    threads = torch.get_num_threads()
    try:
        result = CliRunner().invoke(app, args)
    finally:  # a run sets `threads` for its process: give the test process its own count back
        torch.set_num_threads(threads)
    return result.exit_code, result.stdout, result.stderr


def cli_subprocess(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m llmrl ARGS` in a real subprocess of its own (this checkout on PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-m", "llmrl", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def cli_refused(args: list[str], message: str, code: int = 2) -> str:
    """Run the CLI and check: exit `code`, `message` on stderr, one line, no traceback."""
    exit_code, stdout, stderr = cli_run(args)
    assert exit_code == code, (exit_code, stdout, stderr)
    assert message in stderr, stderr
    assert "Traceback" not in stdout + stderr and len(stderr.strip().splitlines()) == 1, stderr
    return stderr
