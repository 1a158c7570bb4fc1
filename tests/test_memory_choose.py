"""Settings chosen to the budget before the model loads (llmrl/memory/choose.py, issue 68), through the real
CLI in processes of their own (the plan's process part is the process's resident memory, so an in-process
run would plan pytest's): micro-batches chosen, said and recorded; a budget no setting can meet refused
before loading, naming the smallest that holds the run (which then runs); a size the user set kept with a
line; an ample budget changing nothing."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llmrl.config import load_config
from llmrl.memory.budget import Budget
from llmrl.memory.plan import plan_run
from llmrl.memory.shape import read_shape

from .helpers import CLI_SMALL, cli_subprocess, run_metrics

# GRPO on the 2-layer test model, one minibatch of 256 rows × (6 + 48) tokens: the plan's update holds ≈ 105 MiB
# of activations above a process of ≈ 510 MiB, its no-grad forwards ≈ 20 MiB (the floor no setting lowers)
ARGS = ["train", "--algo", "grpo", "--steps", "2", "--set", "rollout.prompts_per_step=32", "--set",
        "rollout.num_generations=8", "--set", "update.minibatch_size=256", "--set", "rollout.max_new_tokens=48",
        "--set", "eval.size=2", "--set", "eval.every=0", "--set", "threads=1"]


def _phases(model: Path) -> dict[str, float]:
    """MiB of each phase in `llmrl train --plan`'s table for ARGS, planned in a process of its own as a run
    plans (its process part is that process's resident memory, which differs from machine to machine)."""
    shown = cli_subprocess([*ARGS, "--model", str(model), "--plan", "--max-memory", "64GiB"])
    assert shown.returncode == 0, shown.stderr[-3000:]
    return {m.group(1): float(m.group(2).replace(",", "")) for m in
            re.finditer(r"(\w+) total \(held \+ transient\)(?:  ← peak)?\s*│\s*([\d,.]+) MiB", shown.stdout)}


def _recorded(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())


def _tight(model: Path, part: float = 0.5) -> str:
    """A budget `part` of the way from the no-grad forwards (the floor) to the update with all 256 rows at once."""
    phases = _phases(model)
    assert phases["update"] > phases["forwards"] + 40, phases
    return f"{round(phases['forwards'] + part * (phases['update'] - phases['forwards']))}MiB"


def test_a_tight_budget_chooses_micro_batches_says_so_and_records_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    tight = _tight(tiny_model_dir)
    run = [*ARGS, "--model", str(tiny_model_dir), "--max-memory", tight]
    done = cli_subprocess([*run, "--out", str(tmp_path / "r")])
    assert done.returncode == 0, done.stderr[-3000:]
    said = re.search(r"llmrl: memory: [\d.]+ MiB \(--max-memory\) holds this run, predicted peak [\d.]+ MiB \(update\), "
                     r"with update\.micro_batch_size=(\d+) \(≈ 1\.22× the seconds of a step\); set them to choose "
                     r"otherwise\.", done.stderr)
    assert said, done.stderr[-3000:]
    micro = int(said.group(1))
    assert 1 <= micro < 256
    assert _recorded(tmp_path / "r")["update"]["micro_batch_size"] == micro  # what --resume runs again
    assert "may not fit" not in done.stderr  # the fit after loading finds room for the chosen size
    assert len(run_metrics(tmp_path / "r")) == 2
    shown = cli_subprocess([*run, "--plan"])  # --plan shows the same choice
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert f"update.micro_batch_size={micro} " in " ".join(shown.stdout.split()), shown.stdout
    # positions: 48 answer tokens a row, and each of the ≤ 32 distinct 6-token prompts once where that shares
    # at least half the prompts (model.share_prompts; memory/plan._tokens), else 54 a row
    distinct = min(micro, 32)
    positions = micro * 48 + distinct * 6 if 2 * distinct <= micro else micro * 54
    assert f"activations ({micro} rows, {positions:,} positions" in " ".join(shown.stdout.split())


def test_a_budget_no_setting_meets_is_refused_before_loading_naming_the_smallest_that_runs(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    run = [*ARGS, "--model", str(tiny_model_dir)]
    done = cli_subprocess([*run, "--out", str(tmp_path / "r"), "--max-memory", "300MiB"])
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    named = re.search(r"^error: This run cannot fit in 300\.0 MiB \(--max-memory\) even with micro-batches of one row, "
                      r"evaluation one row at a time, the engine's float copies off, 4 MiB logits chunks and activation "
                      r"checkpointing: the smallest budget that holds it is [\d.]+ MiB \(--max-memory (\d+)MiB\); fewer "
                      r"rows or new tokens, or model\.quantize=nf4, need less\.$", done.stderr.strip())
    assert named, done.stderr
    assert not (tmp_path / "r" / "config.yaml").exists()  # refused before the run folder was written
    smallest = f"{named.group(1)}MiB"
    done = cli_subprocess([*run, "--out", str(tmp_path / "s"), "--max-memory", smallest])
    assert done.returncode == 0, done.stderr[-3000:]  # the budget named does run
    assert len(run_metrics(tmp_path / "s")) == 2
    assert "llmrl: memory: " in done.stderr and "holds this run" in done.stderr, done.stderr[-3000:]


def test_a_micro_batch_size_the_user_set_is_kept_under_a_tight_budget(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The size set is kept: llmrl chooses the next setting left to it (activation checkpointing); where the
    user set that too, one line says the run may not fit, and it goes on as set."""
    # checkpointing the 2-layer model keeps 2.7 KB a position where the plain update keeps 4.9 KB, and gives up
    # sharing the prompts in the gradient forward (13,824 positions, not 12,480): the checkpointed update
    # lands ≈ 54 % of the way from the forwards to the plain update, so the budget here is at 75 %
    run = [*ARGS, "--model", str(tiny_model_dir), "--max-memory", _tight(tiny_model_dir, 0.75),
           "--set", "update.micro_batch_size=256"]
    done = cli_subprocess([*run, "--out", str(tmp_path / "r")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"llmrl: memory: [\d.]+ MiB \(--max-memory\) holds this run, predicted peak [\d.]+ MiB "
                     r"\(\w+\), with update\.activation_checkpointing=true \(≈ 1\.66× the seconds of a step\)",
                     done.stderr), done.stderr[-3000:]
    assert _recorded(tmp_path / "r")["update"]["micro_batch_size"] == 256
    assert _recorded(tmp_path / "r")["update"]["activation_checkpointing"] is True
    done = cli_subprocess([*run, "--out", str(tmp_path / "s"), "--set", "update.activation_checkpointing=false"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"llmrl: memory: this run may not fit in memory with the settings given "
                     r"\(update\.activation_checkpointing=false and update\.micro_batch_size=256\): its plan peaks at "
                     r"[\d.]+ MiB \(update\), more than [\d.]+ MiB \(--max-memory\); the run goes on as set\.",
                     done.stderr), done.stderr[-3000:]
    assert _recorded(tmp_path / "s")["update"]["micro_batch_size"] == 256
    assert len(run_metrics(tmp_path / "s")) == 2


def test_an_ample_budget_changes_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A small run of the test model under 64 GiB: no line, config.yaml's micro-batch size unset, and metrics.jsonl
    (but timings) equal to the run that sets every setting llmrl may choose to its default itself."""
    base = ["train", "--model", str(tiny_model_dir), "--steps", "2", *CLI_SMALL]
    done = cli_subprocess([*base, "--out", str(tmp_path / "a"), "--max-memory", "64GiB"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "llmrl: memory:" not in done.stderr
    assert _recorded(tmp_path / "a")["update"]["micro_batch_size"] is None
    own = ["--set", "engine.pack_weights=true", "--set", "engine.merge_lora=true", "--set", "eval.batch_size=256",
           "--set", "model.logits_chunk_mib=64", "--set", "update.activation_checkpointing=false"]
    done = cli_subprocess([*base, *own, "--out", str(tmp_path / "b")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert run_metrics(tmp_path / "a") == run_metrics(tmp_path / "b")


def test_the_cheapest_choice_that_lowers_the_peak_comes_first(tiny_model_dir: Path) -> None:
    """Against stated budgets (a fixed process part of 100 MiB): the update over the budget takes micro-batches
    and nothing else (the engine's copies would not lower its peak); a setting the user gave is never chosen;
    the cost said is the product of the choices' factors."""
    from llmrl.memory.choose import choose_settings, cost, line
    config = load_config(None, {"model.name": str(tiny_model_dir), "algo": "grpo"},
                         ["model.dtype=float32", "rollout.prompts_per_step=16", "rollout.num_generations=8",
                          "update.minibatch_size=128", "rollout.max_new_tokens=48", "eval.size=2"])
    shape = read_shape(str(tiny_model_dir))
    at = lambda budget: lambda c: plan_run(c, Budget(budget, "--max-memory"), shape=shape,  # noqa: E731
                                           prompt_tokens=6, baseline=100 * 2**20)
    roomy = choose_settings(config, at(2**40), "--max-memory")
    assert roomy.chosen == () and roomy.config is config and line(roomy) is None
    tight = choose_settings(config, at(130 * 2**20), "--max-memory")
    assert [k for k, _ in tight.chosen] == ["update.micro_batch_size"] and tight.fits
    assert tight.config.update.micro_batch_size < 128 and cost(tight) == 1.22
    assert tight.config.engine.pack_weights and tight.config.engine.merge_lora  # not chosen: no peak of theirs
    kept = load_config(None, {"model.name": str(tiny_model_dir), "algo": "grpo"},
                       ["model.dtype=float32", "rollout.prompts_per_step=16", "rollout.num_generations=8",
                        "update.minibatch_size=128", "rollout.max_new_tokens=48", "eval.size=2",
                        "update.micro_batch_size=128"])
    held = choose_settings(kept, at(130 * 2**20), "--max-memory")
    assert held.config.update.micro_batch_size == 128 and not held.fits and held.possible
    assert held.kept == (("update.micro_batch_size", 128),)
