"""Every setting, fuzzed (issue 30): values at and beyond each key's bounds (0, −1, the bounds and one
past them, huge, NaN, ±inf, empty, the wrong type, unicode, control characters) and values Hypothesis
generates, one key at a time through `--set`: each either loads or is refused with one sentence and
exit 2, and the most extreme values each key accepts train the tiny model for 2 steps on a small
dataset through `llmrl train` (or, for a key whose extreme value trains for ever, run until stopped
with Ctrl-C). Never a traceback, never the last resort's sentence, never a file of the user's touched.

Bounded in time: the edge values are loaded in-process (milliseconds each); Hypothesis draws a fixed,
derandomized budget; one run per key (about 0.7 s each in-process) and two real subprocesses.
The counts are tallied in `tests/fuzzing.py` and printed at the end of the session.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmrl.run.loop as loop
from llmrl.config.load import field_types, load_config, parse_override
from llmrl.config.reward_run import RewardRunConfig, load_reward_config
from llmrl.errors import LLMRLError
from tests.fuzzing import count, edge_values
from tests.helpers import CLI_SMALL, cli_run

ROOT = Path(__file__).resolve().parent.parent
KEYS = field_types()
LONG = {"steps", "update.epochs"}  # a valid huge value of these trains for ever: stopped with Ctrl-C
LAST_RESORT = "did not expect"


class TooSlow(BaseException):
    """Raised by the alarm in a run that should have taken a second."""


def _one_sentence(code: int, out: str, err: str, allowed: tuple[int, ...]) -> None:
    # --overwrite names what it removes on stderr before the run (docs/errors.md): a notice, not the error
    lines = [line for line in err.strip().splitlines() if not line.startswith("Replacing the run in ")]
    assert code in allowed, (code, err[-2000:])
    assert "Traceback" not in out + err and LAST_RESORT not in err, err[-2000:]
    if code:
        assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]


SETS = [item for flag, item in zip(CLI_SMALL, CLI_SMALL[1:]) if flag == "--set"]


def _load(key: str, raw: str) -> bool:
    """`--set KEY=RAW` (after the small run's settings) through the config loader, in-process: True when
    the value loads, False when it is refused with one sentence (exit 2); anything else fails the test."""
    try:
        load_config(None, None, [*SETS, f"{key}={raw}"])
    except LLMRLError as exc:
        assert exc.exit_code == 2 and len(str(exc).strip().splitlines()) == 1, (key, raw, str(exc))
        return False
    return True


@pytest.mark.parametrize("key", sorted(KEYS))
def test_edge_values_load_or_are_refused_in_one_sentence(key: str) -> None:
    tp, f = KEYS[key]
    for raw in edge_values(tp, dict(f.metadata)):
        count("config: edge values loaded", "ran" if _load(key, raw) else "refused")


def _yaml(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


VALUES = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70), st.floats(), st.booleans(), st.none(),
    st.text(max_size=30), st.lists(st.one_of(st.integers(), st.text(max_size=8)), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@settings(max_examples=500, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(KEYS)), value=VALUES, typed=st.booleans())
def test_generated_values_load_or_are_refused_in_one_sentence(key: str, value: Any, typed: bool) -> None:
    # typed: the value as YAML text (what a recipe holds); else its Python str (what a user types)
    raw = _yaml(value) if typed else str(value)
    count("config: generated values loaded", "ran" if _load(key, raw) else "refused")


def _extremes(key: str) -> list[str]:
    """The most extreme edge values `key` accepts besides its default: the largest magnitude (the
    longest text, a non-default choice) and, for a float, the smallest non-zero magnitude too."""
    tp, f = KEYS[key]
    default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
    accepted: dict[str, tuple[str, Any]] = {}
    for raw in edge_values(tp, dict(f.metadata)):
        value = parse_override(f"{key}={raw}")[1]
        if repr(value) not in accepted and value != default and _load(key, raw):
            accepted[repr(value)] = (raw, value)
    if not accepted:
        return []

    def size(item: tuple[str, Any]) -> float:
        v = item[1]
        if isinstance(v, bool) or v is None:
            return 0.5
        return abs(float(v)) if isinstance(v, (int, float)) else len(str(v)) + 1

    found = [max(accepted.values(), key=size)[0]]
    numbers = [item for item in accepted.values() if isinstance(item[1], float) and item[1] != 0]
    if numbers and min(numbers, key=size)[0] not in found:
        found.append(min(numbers, key=size)[0])
    return found


@pytest.fixture(scope="module")
def sums(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """25 prompts 'a+b=' (a, b < 5) with their answers: the runs' dataset (a built-in task's 10,000
    prompts would take a second per run to tokenize for the context check)."""
    path = tmp_path_factory.mktemp("fuzz-data") / "sums.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(5) for b in range(5)))
    return path


@pytest.fixture
def no_curves(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Runs without curves.png (a plotting failure is only a warning; it halves a tiny run's time), in a
    folder of their own (`--set out=` means the default runs/… under the current folder)."""
    monkeypatch.setattr(loop, "draw_curves", lambda path: None)
    monkeypatch.chdir(tmp_path)


def _user_files(tmp_path: Path) -> dict[str, bytes]:
    mine = tmp_path / "mine"
    mine.mkdir(exist_ok=True)
    (mine / "notes.txt").write_text("a user's file next to the run\n")
    return {p.name: p.read_bytes() for p in mine.iterdir()}


@pytest.mark.parametrize("key", sorted(KEYS.keys() - LONG))
def test_the_most_extreme_accepted_values_train_or_are_refused(key: str, tiny_model_dir: Path, sums: Path,
                                                               tmp_path: Path, no_curves: None) -> None:
    for raw in _extremes(key) or [None]:
        if raw is None:  # the key accepts no edge value but its default
            count("config: extreme values trained", "refused")
            continue
        before = _user_files(tmp_path)
        previous = signal.signal(signal.SIGALRM, _too_slow)
        signal.alarm(90)
        try:
            code, out, err = cli_run(["train", "--model", str(tiny_model_dir), "--dataset", str(sums), "--reward",
                                      "exact_match", "--steps", "2", "--out", str(tmp_path / "run"), "--overwrite",
                                      *CLI_SMALL, "--set", f"{key}={raw}"])
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        count("config: extreme values trained",
              "traceback" if "Traceback" in err else "ran" if code == 0 else "refused")
        # exit 1 only for a run that started and failed in a documented way (never the last resort)
        _one_sentence(code, out, err, (0, 1, 2))
        assert before == _user_files(tmp_path)


def _too_slow(signum: int, frame: Any) -> None:
    raise TooSlow("a tiny run took more than 90 s")


def _stopped_with_ctrl_c(args: list[str], out: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`llmrl ARGS` in a subprocess, interrupted (SIGINT) once its first step is logged or 5 s after its
    config.yaml appeared, then a second time 5 s later if it is still running (the first Ctrl-C waits for
    the step to end, and a step of 2^63 epochs never does)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    proc = subprocess.Popen([sys.executable, "-m", "llmrl", *args], env=env, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started = time.monotonic()
    seen = None
    while proc.poll() is None and time.monotonic() - started < 240:
        if seen is None and (out / "config.yaml").exists():
            seen = time.monotonic()
        metrics = out / "metrics.jsonl"
        if seen and ((metrics.exists() and metrics.read_text().strip()) or time.monotonic() - seen > 5):
            break
        time.sleep(0.2)
    for _ in range(2):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    if proc.poll() is None:
        proc.kill()
    stdout, stderr = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("key", sorted(LONG))
def test_a_value_that_trains_for_ever_runs_until_stopped(key: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    raw = _extremes(key)[0]
    assert int(raw) > 2**62, raw  # the largest int64: a run that never ends by itself
    out = tmp_path / "run"
    before = _user_files(tmp_path)
    done = _stopped_with_ctrl_c(["train", "--model", str(tiny_model_dir), "--out", str(out), *CLI_SMALL,
                                 "--set", f"{key}={raw}"], out, tmp_path)
    count("config: extreme values trained", "traceback" if "Traceback" in done.stderr else "ran")
    assert done.returncode == 130, done.stderr[-2000:]
    _one_sentence(1, done.stdout, done.stderr, (1,))
    assert "Interrupted" in done.stderr and f"llmrl train --resume {out}" in done.stderr, done.stderr
    assert before == _user_files(tmp_path)


@pytest.mark.parametrize(("setting", "message"), [
    ("lora.r=33", "'lora.r' (33) exceeds the model's hidden size (32): a LoRA update of a layer has rank at most "
                  "its width, so a larger rank only adds parameters."),
    (f"threads={(os.cpu_count() or 1) + 1}", f"'threads' ({(os.cpu_count() or 1) + 1}) exceeds the "
                                             f"{os.cpu_count() or 1} CPUs of this machine;"),
    # the memory plan (issue 68) refuses it before the weights load, naming the smallest budget that would hold it
    ("rollout.prompts_per_step=2147483648", "even with micro-batches of one row, evaluation one row at a time, "
                                            "the engine's float copies off, 4 MiB logits chunks and activation "
                                            "checkpointing: the smallest budget that holds it is "),
])
def test_sizes_the_machine_cannot_hold_are_refused_before_the_stack(setting: str, message: str, tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    code, out, err = cli_run(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(tmp_path / "r"),
                              *CLI_SMALL, "--set", "update.minibatch_size=1", "--set", setting])
    _one_sentence(code, out, err, (2,))
    assert message in err, err


def test_a_seed_at_the_edge_of_the_integer_range(tmp_path: Path) -> None:
    """The issue's first case: `--seed 18446744073709551615` (2^64 − 1) ended in torch's 'Overflow when
    unpacking long long' from the minibatch generator's seed + 1; now the domain refuses it first."""
    for seed in ("18446744073709551615", "-1", "4294967296"):
        code, out, err = cli_run(["train", "--seed", seed, "--out", str(tmp_path / "r")])
        _one_sentence(code, out, err, (2,))
        assert "'seed' must be" in err and not (tmp_path / "r").exists(), err


# ---- a reward run's settings (issue 67): `llmrl reward train --set`, config/reward_run.py ----------

REWARD_KEYS = field_types(RewardRunConfig)


@pytest.mark.parametrize("section", sorted({key.split(".")[0] for key in REWARD_KEYS}))
def test_reward_run_edge_values_load_or_are_refused_in_one_sentence(section: str) -> None:
    """Every key of a reward run (its own pairs.* and rm.*, and model.*, lora.*, checkpoint.* as it reads them):
    each edge value loads or is one sentence, exit 2 (in-process, milliseconds each)."""
    for key in sorted(k for k in REWARD_KEYS if k.split(".")[0] == section):
        tp, f = REWARD_KEYS[key]
        for raw in edge_values(tp, dict(f.metadata)):
            try:
                load_reward_config(sets=[f"{key}={raw}"])
            except LLMRLError as exc:
                assert exc.exit_code == 2 and len(str(exc).strip().splitlines()) == 1, (key, raw, str(exc))
                count("config: reward run edge values", "refused")
            else:
                count("config: reward run edge values", "ran")


@pytest.mark.parametrize("setting", ["rm.batch_size=9223372036854775807", "rm.batch_size=12"])
def test_a_reward_batch_above_the_pairs_is_refused(setting: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """rm.batch_size above the training pairs: one sentence (the largest accepted value built a list of 2^63
    positions for its first step, and never began)."""
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a + 2)}) + "\n"
                            for a in range(12)))
    code, out, err = cli_run(["reward", "train", "--model", str(tiny_model_dir), "--data", str(data), "--out",
                              str(tmp_path / "r"), "--set", "threads=1", "--set", setting])
    _one_sentence(code, out, err, (2,))
    assert f"exceeds the 11 training pairs of '{data}', so a step would read a pair twice; set it to at most 11." in err
