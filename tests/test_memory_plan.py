"""The run's memory plan (issue 68): shapes from headers, each part's formula, `llmrl train --plan` through
the CLI without loading a weight, and summary.json's predicted_peak_mib against the measured peak."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llmrl.config import load_config
from llmrl.memory.budget import Budget
from llmrl.memory.parts import ACT_SLACK, NF4_BYTES, layer_bytes, update_bytes_per_token
from llmrl.memory.plan import HELD, PHASES, TRANSIENT, plan_run
from llmrl.memory.shape import read_shape

from .conftest import make_tiny_model
from .helpers import CLI_SMALL, cli_run, cli_subprocess

BIG = Budget(2**40, "physical memory")


def _config(model: Path, *sets: str):
    return load_config(None, {"model.name": str(model)}, ["model.dtype=float32", *sets])


def test_shape_from_config_and_headers(tiny_model_dir: Path) -> None:
    """L, H, the KV width and one layer's linears as the model has them; every number counted once."""
    shape = read_shape(str(tiny_model_dir))
    assert (shape.layers, shape.hidden, shape.intermediate, shape.kv_dim, shape.q_dim) == (2, 32, 64, 16, 32)
    assert dict((n, (i, o)) for n, i, o in shape.linears) == {
        "q_proj": (32, 32), "k_proj": (32, 16), "v_proj": (32, 16), "o_proj": (32, 32),
        "gate_proj": (32, 64), "up_proj": (32, 64), "down_proj": (64, 32)}
    model = make_tiny_model()
    assert shape.numbers == sum(p.numel() for p in model.parameters())  # tied LM head: once


def test_plan_parts_are_their_formulas(tiny_model_dir: Path) -> None:
    """Hand-computed parts of a PPO run of the 2-layer model: base, adapters, AdamW, KV cache, checkpoint;
    the peak is the largest phase's held + transient."""
    config = _config(tiny_model_dir, "rollout.prompts_per_step=4", "rollout.num_generations=2",
                     "rollout.max_new_tokens=6", "eval.size=2", "lora.r=4")
    shape = read_shape(str(tiny_model_dir))
    plan = plan_run(config, BIG, shape=shape, prompt_tokens=10, baseline=1000)
    assert [name for name, _ in plan.phases] == list(PHASES)
    parts = {(phase, x.name): x for phase, items in plan.phases for x in items}
    lora = 2 * 4 * (64 + 48 + 48 + 64 + 96 + 96 + 96)  # L · r · Σ (in + out)
    assert parts["update", "actor LoRA adapter"].bytes == 4 * lora
    assert parts["update", "critic LoRA adapter + value head"].bytes == 4 * (lora + 33)
    assert parts["update", "AdamW state (2 × float32)"].bytes == 2 * 4 * (2 * lora + 33)
    assert parts["load", "base"].bytes == 4 * shape.numbers and parts["load", "base"].kind == HELD
    kv = parts["generate", "KV cache (8 rows × 16 tokens)"]
    assert kv.bytes == 8 * 16 * 2 * 2 * 16 * 4 and kv.kind == TRANSIENT  # N · S · 2 · L · kv · b
    assert parts["checkpoint", "checkpoint bytes in memory"].bytes == 3 * 4 * (2 * lora + 33)
    assert plan.peak_bytes == max(sum(x.bytes for x in items) for _, items in plan.phases)
    assert plan.peak_bytes == plan.phase_bytes(plan.peak_phase) and plan.budget == BIG.bytes
    four = plan_run(replace(config, model=replace(config.model, quantize="nf4")), BIG, shape=shape,
                    prompt_tokens=10, baseline=1000)
    assert dict(four.phases)["load"][1].bytes == int(shape.linear_numbers * NF4_BYTES) + 4 * shape.other  # codes + scales


def test_train_plan_prints_without_loading(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """`llmrl train --plan`: the table, the peak phase marked, --max-memory as the budget, exit 0; no run folder
    and no weight loaded (load_base would fail the test)."""
    import llmrl.run.session as session

    monkeypatch.setattr(session, "load_base", lambda *a, **k: pytest.fail("--plan loaded the model"))
    out = tmp_path / "run"
    # in-process: the plan's process part is pytest's own resident memory, which a long session grows past a
    # few GiB, so the budget here is one no session reaches
    code, stdout, stderr = cli_run(["train", "--model", str(tiny_model_dir), "--plan", "--max-memory", "64GiB",
                                    "--out", str(out), *CLI_SMALL])
    assert code == 0, stderr
    assert "Memory plan" in stdout and "← peak" in stdout and "update" in stdout and "KV cache" in stdout
    words = " ".join(stdout.split())  # rich wraps the closing sentence at the terminal's width
    assert "64.0 GiB of --max-memory" in words and "No weight was loaded" in words
    assert not out.exists()


def test_summary_predicted_peak_near_measured(warm_tiny_dir: Path, tmp_path: Path) -> None:
    """summary.json's predicted_peak_mib beside peak_rss_mib, within ±15 % of it on the tiny default run
    (measured +1 % PPO, +5 % GRPO: docs/scaling.md)."""
    run = tmp_path / "run"
    done = cli_subprocess(["train", "--steps", "2", "--out", str(run), "--set", "eval.size=100"])
    assert done.returncode == 0, done.stderr
    summary = json.loads((run / "summary.json").read_text())
    predicted, measured = summary["predicted_peak_mib"], summary["peak_rss_mib"]
    assert 0.85 * measured <= predicted <= 1.15 * measured, (predicted, measured)


def test_shared_prompts_count_each_distinct_prompt_once(tiny_model_dir: Path) -> None:
    """GRPO, 4 prompts × 8 samples, 6 new tokens, 10-token prompts, micro-batches of 16: with model.share_prompts
    the update's 16 rows run 16·6 + 4·10 = 136 positions (≤ 4 distinct prompts, 2·4 ≤ 16 shares them), the
    no-grad forwards' 32 rows 32·6 + 4·10 = 232; LoRA dropout keeps the update's gradient forward plain
    (16·16 = 256) and sharing off keeps both plain (32·16 = 512 in the forwards)."""
    shape = read_shape(str(tiny_model_dir))
    common = ["algo=grpo", "rollout.prompts_per_step=4", "rollout.num_generations=8", "rollout.max_new_tokens=6",
              "update.minibatch_size=32", "update.micro_batch_size=16", "eval.size=2"]

    def positions(*sets: str) -> tuple[int, int]:
        plan = plan_run(_config(tiny_model_dir, *common, *sets), BIG, shape=shape, prompt_tokens=10, baseline=1000)
        parts = {(phase, x.name.split(" (")[0]): x for phase, items in plan.phases for x in items}
        a = update_bytes_per_token(shape, 4, 16, None, False)  # float32, lora.r 16 (the default), every linear
        update = parts["update", "activations"].bytes / (a * ACT_SLACK)
        forwards = parts["forwards", "no-grad forward"].bytes / layer_bytes(shape, 1, 1, 4)
        return round(update), round(forwards)

    assert positions() == (136, 232)
    assert positions("lora.dropout=0.1") == (256, 232)
    assert positions("model.share_prompts=false") == (256, 512)
