"""End to end through the real CLI on a tiny random model: files, formats, and that training trains."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from llmrl import load_config, read_run
from llmrl.cli import app
from llmrl.run.reporting import NullReporter
from llmrl.run.one_step import train_step
from llmrl.run.session import setup
from llmrl.tasks import TASKS
from tests.helpers import digits_task as make_digits_task, is_timing

SMALL = ["--set", "rollout.prompts_per_step=8", "--set", "update.minibatch_size=4", "--set", "eval.size=16"]


@pytest.fixture(autouse=True)
def digits_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Task 'digits': the arithmetic prompts with `_digit_share` as reward (registered for the test)."""
    monkeypatch.setitem(TASKS, "digits", make_digits_task)


def _train(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["train", *args])
    return result.exit_code, result.stdout, result.stderr


def test_train_cli_writes_a_complete_run_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = _train(["--model", str(tiny_model_dir), "--task", "digits", "--steps", "3", "--out", str(out), *SMALL])
    assert code == 0, stderr
    assert "held-out accuracy" in stdout and str(out) in stdout.replace("\n", "")
    assert yaml.safe_load((out / "config.yaml").read_text())["algo"] == "ppo"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    required = {"step", "reward_mean", "kl", "policy_loss", "value_loss", "entropy", "clip_frac",
                "response_len", "tokens", "step_time_s", "time_generate_s", "time_score_s", "time_forward_s",
                "time_estimate_s", "time_update_s", "time_sync_s"}
    assert required <= set(rows[0])
    for r in rows:  # the phases are disjoint parts of the step, and generation and the update take real time
        phases = [r[k] for k in required if k.startswith("time_")]
        assert min(phases) >= 0 and sum(phases) <= r["step_time_s"] and r["time_generate_s"] > 0 and r["time_update_s"] > 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("algo", "steps", "eval_accuracy_before", "eval_accuracy_after", "reward_mean_last",
                "wall_time_s", "peak_rss_mib"):
        assert summary[key] is not None, key
    assert summary["steps"] == 3
    # the actor adapter is a PEFT adapter that trained: lora_B starts at 0 and moved
    actor = load_file(out / "adapters" / "actor" / "adapter_model.safetensors")
    lora_b = [v for k, v in actor.items() if "lora_B" in k]
    assert lora_b and max(float(v.abs().max()) for v in lora_b) > 0
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, out / "adapters" / "actor")
    assert model.active_adapter == "default"
    assert (out / "adapters" / "critic" / "adapter_model.safetensors").is_file()
    head = load_file(out / "value_head.safetensors")
    assert head["weight"].shape == (1, 32)
    run = read_run(out)
    assert run.summary["steps"] == 3 and len(run.metrics) == 3


def test_only_adapters_and_value_head_change(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_config(overrides={"model.name": str(tiny_model_dir), "task": "digits", "out": str(tmp_path / "r")},
                         sets=SMALL[1::2])
    session = setup(config, NullReporter())
    before = {n: p.detach().clone() for n, p in session.stack.named_parameters()}
    for step in range(2):
        train_step(session, step)
    after = dict(session.stack.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed, "training changed nothing"
    assert all(("lora_" in n) or n.startswith("value_head") for n in changed), changed
    assert any(".actor." in n for n in changed) and any(".critic." in n for n in changed)
    assert any(n.startswith("value_head") for n in changed)


def test_same_seed_same_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = []
    for name in ("a", "b"):
        code, _, err = _train(["--model", str(tiny_model_dir), "--task", "digits", "--steps", "2", "--out", str(tmp_path / name), *SMALL])
        assert code == 0, err
        rows.append([{k: v for k, v in json.loads(line).items() if not is_timing(k)}
                     for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    assert rows[0] == rows[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algo", "ppp"], "Unknown algorithm 'ppp'; valid algorithms: ppo"),
        (["--task", "chess"], "Unknown task 'chess'; valid tasks: arithmetic"),
        (["--set", "update.lr_actr=1"], "did you mean 'update.lr_actor'"),
        (["--steps", "0"], "'steps' must be ≥ 1"),
        (["--model", "/nonexistent/model"], "does not exist"),
        (["--recipe", "/nonexistent.yaml"], "Recipe file '/nonexistent.yaml' does not exist"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str, tmp_path: Path) -> None:
    code, stdout, stderr = _train([*args, "--out", str(tmp_path / "x")])
    assert code == 2
    assert message in stderr
    assert "Traceback" not in stderr + stdout
    assert len(stderr.strip().splitlines()) == 1


def test_existing_run_is_not_overwritten(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--model", str(tiny_model_dir), "--steps", "1", "--out", str(out), *SMALL]
    assert _train(args)[0] == 0
    code, _, stderr = _train(args)
    assert code == 2 and "already holds a run" in stderr
    assert _train([*args, "--overwrite"])[0] == 0


def test_prompt_longer_than_context_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    # the test model has 64 positions; 60 new tokens plus a 6-character prompt do not fit
    code, _, stderr = _train(["--model", str(tiny_model_dir), "--out", str(tmp_path / "r"), "--set", "rollout.max_new_tokens=60"])
    assert code == 2 and "exceeds the model's context of 64 tokens" in stderr and "Traceback" not in stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits: nothing to refuse")
def test_unwritable_output_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, _, stderr = _train(["--model", str(tiny_model_dir), "--steps", "1", "--out", str(locked / "run"), *SMALL])
    finally:
        locked.chmod(0o700)
    assert code == 1 and "Cannot write to run folder" in stderr
