"""The run's memory budget (llmrl/memory/budget.py): sizes as a user writes them, and `--max-memory` through
the real command line on the built-in tiny model: a size it cannot read is one sentence before anything
loads, a budget below the base's weights is refused before loading, one below what the run holds while it
generates before the first step, both naming the budget; a roomy one runs and the start-up table names it.
Without it the budget is the device's memory, shared by torchrun's processes on one CPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmrl.config import load_config
from llmrl.errors import ConfigError
from llmrl.memory.budget import Budget, parse_size, run_budget
from llmrl.models.load import device_memory
from tests.helpers import CLI_SMALL, cli_refused, cli_run

GiB, MiB = 2**30, 2**20
TINY_WEIGHTS = 132_736 * 4  # the built-in tiny model's parameters in float32 (its start-up table's base row)


@pytest.mark.parametrize(("text", "size"), [
    ("6GiB", 6 * GiB), ("6 GiB", 6 * GiB), ("6G", 6 * GiB), ("6g", 6 * GiB), ("6Gi", 6 * GiB),
    ("6144MiB", 6 * GiB), ("6144M", 6 * GiB), ("1.5GiB", 3 * GiB // 2), ("512KiB", 512 * 1024), ("1T", 2**40),
    ("6GB", 6 * 10**9), ("6gb", 6 * 10**9), ("250MB", 250 * 10**6), ("6000000000", 6 * 10**9),
    ("6000000000.0", 6 * 10**9), ("6e9", 6 * 10**9), ("1", 1),
])
def test_sizes_as_users_write_them(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "6XB", "6iB", "6 G B", "6GiBB", "0", "0GiB", "0.4", "-1", "-6GiB",
                                  "inf", "nan", "1e400", "9" * 40, "6,5GiB", "GiB"])
def test_what_is_no_size_is_one_sentence(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--max-memory .* is not a memory size a run can have: give a positive "
                                          r"size with units, e\.g\. 6GiB"):
        parse_size(text, "--max-memory")
    with pytest.raises(ConfigError, match="^.?memory.max.? "):  # a recipe's or --set's value, when the settings load
        load_config(None, {"memory.max": text})


@pytest.mark.parametrize("text", ["lots", "6XB", "0", "-1", "-2GiB", "inf", "1e400"])
def test_the_command_line_refuses_what_is_no_size_before_anything_loads(text: str, tmp_path: Path) -> None:
    cli_refused(["train", "--steps", "1", "--out", str(tmp_path / "r"), f"--max-memory={text}"],
                f"--max-memory {text!r} is not a memory size a run can have")
    cli_refused(["train", "--steps", "1", "--out", str(tmp_path / "r"), "--set", f"memory.max={text}"],
                "is not a memory size a run can have")
    assert not (tmp_path / "r").exists()


def test_a_budget_below_the_weights_is_refused_before_loading(tmp_path: Path) -> None:
    # the run's plan, made before loading (llmrl/memory/choose.py), refuses it first, naming the budget that fits
    err = cli_refused(["train", "--steps", "1", "--out", str(tmp_path / "r"), *CLI_SMALL, "--max-memory", "256KiB"],
                      "This run cannot fit in 0.2 MiB (--max-memory) even with micro-batches of one row")
    assert not (tmp_path / "r" / "config.yaml").exists(), err


def test_a_budget_below_what_the_run_holds_is_refused_before_the_first_step(tmp_path: Path) -> None:
    # above the base's 0.5 MiB of weights, below them with the adapters, AdamW state and one step's KV cache
    budget = TINY_WEIGHTS + 64 * 1024
    err = cli_refused(["train", "--steps", "1", "--out", str(tmp_path / "r"), *CLI_SMALL, "--max-memory", str(budget)],
                      f"This run cannot fit in {budget / MiB:.1f} MiB (--max-memory) even with ")
    assert "the smallest budget that holds it is " in err  # the plan's refusal, before loading (memory/choose.py)
    assert not (tmp_path / "r" / "config.yaml").exists()
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_a_roomy_budget_runs_and_the_start_up_table_names_it(tmp_path: Path) -> None:
    code, out, err = cli_run(["train", "--steps", "1", "--out", str(tmp_path / "r"), *CLI_SMALL, "--max-memory", "64GiB"])
    assert code == 0, err[-2000:]
    assert "Memory budget: 64.0 GiB of --max-memory." in out, out
    assert "max: 64GiB" in (tmp_path / "r" / "config.yaml").read_text()  # the run's recipe keeps it
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 1
    code, out, err = cli_run(["train", "--steps", "1", "--out", str(tmp_path / "d"), *CLI_SMALL])
    assert code == 0, err[-2000:]
    budget = run_budget(load_config(), torch.device("cpu"))
    assert f"Memory budget: {budget.describe()} (--max-memory sets another)." in out, out


def test_the_budget_is_the_devices_memory_shared_by_the_processes_of_one_machine() -> None:
    config, cpu = load_config(), torch.device("cpu")
    whole = run_budget(config, cpu)
    assert whole.bytes == device_memory(cpu) and whole.shared_by == 1
    assert whole.source in ("physical memory", "the memory cgroup's limit")
    assert run_budget(config, cpu, processes=2) == Budget(device_memory(cpu) // 2, whole.source, 2)
    assert run_budget(config, cpu, processes=2).describe().endswith(" per process (2 on this machine)")
    capped = load_config(None, None, ["memory.max=6GiB"])
    assert run_budget(capped, cpu) == Budget(6 * GiB, "--max-memory")
    assert run_budget(capped, cpu, processes=4) == Budget(6 * GiB // 4, "--max-memory", 4)
    assert run_budget(capped, torch.device("cuda"), processes=4) == Budget(6 * GiB, "--max-memory")  # a GPU each
