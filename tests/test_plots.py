"""Plots: the curves a train run leaves, `llmrl plot` through a real subprocess, and the helpers' maths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.run.plots import accuracy_points, smooth, wall_clock
from llmrl.run.folder import Run

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = ["--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=8",
         "--set", "threads=1"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("plot")
    out = []
    for algo in ("ppo", "reinforce"):
        run = root / algo
        result = CliRunner().invoke(app, ["train", "--algo", algo, "--model", str(tiny_model_dir), "--steps", "2",
                                          "--out", str(run), *SMALL])
        assert result.exit_code == 0, result.stderr
        out.append(run)
    return out


def test_train_leaves_its_curves(two_runs: list[Path]) -> None:
    for run in two_runs:
        png = run / "curves.png"
        assert png.read_bytes().startswith(PNG) and png.stat().st_size > 10_000


def test_plot_cli_draws_runs_together(two_runs: list[Path], tmp_path: Path) -> None:
    target = tmp_path / "both.png"
    proc = subprocess.run([sys.executable, "-m", "llmrl", "plot", *map(str, two_runs), "--out", str(target)],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {target}" in proc.stdout
    assert target.read_bytes().startswith(PNG)
    # without --out, several runs go to ./curves.png
    proc = subprocess.run([sys.executable, "-m", "llmrl", "plot", *map(str, two_runs)],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}"], "is not a run folder (no config.yaml)"),
        (["{run}", "--out", "{tmp}/x.jpeg"], "must end in .png, .svg, .pdf"),
    ],
)
def test_plot_bad_input(args: list[str], message: str, two_runs: list[Path], tmp_path: Path) -> None:
    args = [a.format(tmp=tmp_path, run=two_runs[0]) for a in args]
    result = CliRunner().invoke(app, ["plot", *args])
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_smooth_is_a_trailing_mean() -> None:
    # w = 2: [1, (1+2)/2, (2+3)/2, (3+4)/2]
    np.testing.assert_allclose(smooth([1, 2, 3, 4], 2), [1.0, 1.5, 2.5, 3.5], atol=1e-12, rtol=0)
    # default w = max(1, len // 25): 50 values → w = 2
    np.testing.assert_allclose(smooth(list(range(50)))[:3], [0.0, 0.5, 1.5], atol=1e-12, rtol=0)


def test_accuracy_points_and_wall_clock() -> None:
    metrics = [{"step": 1, "step_time_s": 0.5}, {"step": 2, "step_time_s": 1.0, "eval_accuracy": 0.4},
               {"step": 3, "step_time_s": 0.25}]
    run = Run(Path("r"), {}, metrics, {"eval_accuracy_before": 0.1, "eval_accuracy_after": 0.7, "steps": 3})
    x, y = accuracy_points(run)
    np.testing.assert_array_equal(x, [0.0, 2.0, 3.0])
    np.testing.assert_allclose(y, [0.1, 0.4, 0.7], atol=1e-12, rtol=0)
    np.testing.assert_allclose(wall_clock(run), [0.5, 1.5, 1.75], atol=1e-12, rtol=0)


def test_plot_of_a_run_without_steps_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\n")
    result = CliRunner().invoke(app, ["plot", str(run)])
    assert result.exit_code == 2 and f"'{run}' has no logged steps yet; nothing to plot." in result.stderr
    assert not (run / "curves.png").exists()
