"""Each phase's peak memory (run/memory.PhasePeaks): VmHWM restarted at a phase's start and read at its
end, in every metrics row and, as the run's maximum, in summary.json, without losing the whole run's peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmrl.run import memory
from tests.helpers import CLI_SMALL, cli_run

BIG = 2**26  # float32 elements: 256 MiB, touched (torch.ones), freed on `del` (glibc maps a block this large)
STEP_PHASES = ("generate", "score", "forwards", "update")  # the plan's names of one_step's timed phases


def _restartable() -> None:
    """Skip where the kernel cannot restart VmHWM (not Linux, no permission): there the keys are absent."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    except OSError:
        pytest.skip("no /proc/self/clear_refs here")
    if int(status["VmHWM"].split()[0]) - int(status["VmRSS"].split()[0]) > 4096:
        pytest.skip("this kernel ignores /proc/self/clear_refs")


def test_a_phase_has_its_own_peak_and_the_run_keeps_every_phases() -> None:
    _restartable()
    peaks = memory.PhasePeaks("cpu")
    with peaks("big"):
        x = torch.ones(BIG)
        del x
    with peaks("small"):
        pass
    big, small = peaks.step["peak_rss_big_mib"], peaks.step["peak_rss_small_mib"]
    assert 0 < small < big - 200  # the restart forgot the 256 MiB that "big" held and freed
    assert memory.peak_rss_mib() >= big  # the whole run's peak survives the restarts
    with peaks("small"):  # a phase run twice in a step (generation rounds) keeps its largest peak
        x = torch.ones(BIG // 2)
        del x
    assert peaks.step["peak_rss_small_mib"] > small + 100
    peaks.start_step()
    assert peaks.step == {} and peaks.run["peak_rss_big_mib"] == big  # a new row; the run keeps its maximum


def test_an_outer_phase_keeps_what_a_phase_inside_it_restarted() -> None:
    _restartable()
    peaks = memory.PhasePeaks("cpu")
    with peaks("outer"):
        x = torch.ones(BIG)
        del x
        with peaks("inner"):
            pass
    assert peaks.step["peak_rss_outer_mib"] > peaks.step["peak_rss_inner_mib"] + 200


def test_where_vmhwm_cannot_restart_the_keys_are_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_restart_hwm", lambda: False)  # the kernel's answer without clear_refs
    peaks = memory.PhasePeaks("cpu")
    with peaks("generate"):
        pass
    assert peaks.step == {} and peaks.run == {}


def test_reset_peak_memory_starts_a_new_whole_run_peak() -> None:
    _restartable()
    peaks = memory.PhasePeaks("cpu")
    with peaks("big"):
        x = torch.ones(BIG)
        del x
    memory.reset_peak_memory()  # what llmrl compare does before each run
    assert memory.peak_rss_mib() < peaks.step["peak_rss_big_mib"] - 200


def test_every_row_has_each_phases_peak_below_the_runs(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Through the CLI: rows of 3 steps, an evaluation after steps 1 and 2, a checkpoint after each step.
    Proven bounds: each phase's peak > 0; max over rows and phases ≤ summary's peak_rss_mib (the running
    maximum keeps every restarted peak); summary's step phases = the max over the rows."""
    _restartable()
    out = tmp_path / "run"
    code, _, err = cli_run(["train", "--model", str(tiny_model_dir), "--steps", "3", "--out", str(out), *CLI_SMALL,
                            "--set", "eval.every=1", "--set", "checkpoint.every=1"])
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    for r in rows:
        evaluated = ("evaluate",) if r["step"] < 3 else ()  # the last step's evaluation is the final one
        assert {k for k in r if k.startswith("peak_")} == {f"peak_rss_{p}_mib" for p in (*STEP_PHASES, *evaluated)}
        assert all(r[f"peak_rss_{p}_mib"] > 0 for p in (*STEP_PHASES, *evaluated))
    for p in STEP_PHASES:
        assert summary[f"peak_rss_{p}_mib"] == max(r[f"peak_rss_{p}_mib"] for r in rows)
    phases = [summary[f"peak_rss_{p}_mib"] for p in ("load", "evaluate", "checkpoint", *STEP_PHASES)]
    assert min(phases) > 0 and max(phases) <= summary["peak_rss_mib"]
    assert max(v for r in rows for k, v in r.items() if k.startswith("peak_rss_")) <= summary["peak_rss_mib"]
