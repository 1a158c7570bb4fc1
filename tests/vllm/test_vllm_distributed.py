"""`llmrl train --nproc 2 --engine vllm` on the CPU (gloo): an engine per process, and the same run as one
process. Each rank's vLLM joins the run's process group (distributed_executor_backend=external_launcher,
tensor parallel 1, as TRL's colocate mode), samples its own share of the rows, each with its own seed,
and is synced from its own copy of the actor, which the all-reduced update keeps equal on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import is_timing

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ["--set", "rollout.prompts_per_step=8", "--set", "rollout.num_generations=4", "--algo", "grpo",
            "--set", "update.minibatch_size=16", "--set", "eval.size=16", "--set", "eval.every=0",
            "--set", "engine.kv_cache_gb=0.05", "--set", "threads=1", "--set", "lora.r=4", "--set", "lora.alpha=4",
            "--set", "update.lr_actor=1e-3"]
EXACT = ("step", "reward_mean", "tokens", "response_len", "prompts_seen", "prompt_digest", "zero_advantage")


def _train(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    cmd = [sys.executable, "-m", "llmrl", "train", "--model", str(model), "--engine", "vllm", "--steps", "3",
           "--out", str(out), *SETTINGS, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_processes_with_an_engine_each_equal_one(warm_tiny_dir: Path, tmp_path: Path) -> None:
    two = _train(warm_tiny_dir, tmp_path / "two", "--nproc", "2")
    assert two.returncode == 0, two.stderr[-3000:]
    one = _train(warm_tiny_dir, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert [r["step"] for r in b] == [1, 2, 3]  # rank 0 alone logs
    assert 0 < a[0]["reward_mean"] < 1
    for x, y in zip(a, b):
        assert {k: x[k] for k in EXACT} == {k: y[k] for k in EXACT}  # the same rollouts
        for key, value in x.items():  # losses, gradient norms, the vLLM/trainer mismatch: up to summation order
            # generate_useful_frac is each process's batch: two halves decode to their own longest answers
            if isinstance(value, float) and key not in EXACT and not is_timing(key) and key != "generate_useful_frac":
                assert y[key] == pytest.approx(value, abs=1e-5, rel=1e-4), key
        assert y["time_sync_s"] > 0  # every rank's engine was synced after every update
    first = load_file(tmp_path / "one" / "adapters" / "actor" / "adapter_model.safetensors")
    second = load_file(tmp_path / "two" / "adapters" / "actor" / "adapter_model.safetensors")
    assert first.keys() == second.keys()
    for k in first:
        torch.testing.assert_close(second[k], first[k], atol=1e-5, rtol=0)
    assert any(float(v.abs().max()) > 1e-3 for k, v in first.items() if "lora_B" in k)  # it did train
