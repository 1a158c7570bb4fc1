"""Nothing deleted, nothing silent (issue 17, items 1-6 and 19): the run folder's files, through the
real CLI with a real tiny model, real files and real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import CLI_SMALL, cli_refused, cli_run
from llmrl.run.folder import LOCK, atomic_write

ROOT = Path(__file__).resolve().parent.parent
SMALL = CLI_SMALL
_run, _refused = cli_run, cli_refused


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def _cli(args: list[str], cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmrl", *args], env=_env(), cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step PPO run of the random tiny model, written under umask 022."""
    out = tmp_path_factory.mktemp("qa-files") / "run"
    old = os.umask(0o022)
    try:
        code, _, err = _run(["train", "--model", str(tiny_model_dir), "--steps", "2", "--out", str(out), *SMALL])
    finally:
        os.umask(old)
    assert code == 0, err
    return out


# ---- 1. --overwrite replaces only a run ------------------------------------------------------------

def test_overwrite_never_deletes_a_folder_that_is_not_a_run(tiny_model_dir: Path, run_dir: Path, tmp_path: Path) -> None:
    train = ["train", "--model", str(tiny_model_dir), "--steps", "1", *SMALL, "--overwrite", "--out"]
    project = tmp_path / "p"  # the case: a project folder that happens to hold a config.yaml
    (project / "src").mkdir(parents=True)
    (project / "config.yaml").write_text("x\n")
    (project / "src" / "main.py").write_text("print('mine')\n")
    before = _files(project)
    _refused([*train, str(project)], f"'{project}' holds a config.yaml but also files llmrl did not write (src)")
    assert _files(project) == before
    # a real run's config.yaml copied next to the user's files: still not a run
    (project / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    before = _files(project)
    _refused([*train, str(project)], "files llmrl did not write (src); llmrl never deletes them")
    assert _files(project) == before
    # a config.yaml alone that llmrl did not write
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "config.yaml").write_text("learning_rate: 3\n")
    _refused([*train, str(lone)], f"'{lone}/config.yaml' is not an llmrl run's config")
    assert (lone / "config.yaml").read_text() == "learning_rate: 3\n"


def test_overwrite_of_a_run_says_what_it_removes(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    args = ["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(out), *SMALL]
    assert _run(args)[0] == 0
    code, _, err = _run([*args, "--overwrite"])
    assert code == 0, err
    assert (f"Replacing the run in '{out}' (--overwrite): removing adapters/, checkpoints/, completions.jsonl, "
            f"config.yaml, curves.png, metrics.jsonl, summary.json, value_head.safetensors.") in err
    assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1]


# ---- 2. export never replaces a file ---------------------------------------------------------------

def test_export_never_replaces_a_plain_file(run_dir: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for extra in ([], ["--overwrite"]):
        _refused(["export", str(run_dir), "--out", str(notes), *extra],
                 f"'{notes}' is a file, not a folder; --out names the folder to write the model into")
    assert notes.read_text() == "mine"


# ---- 3. one run per folder at a time ---------------------------------------------------------------

def _wait_for(predicate, proc: subprocess.Popen, seconds: float = 120, poll: float = 0.2) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll)


def test_a_second_run_on_a_busy_folder_is_refused_and_a_stale_lock_is_not(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    first = subprocess.Popen([sys.executable, "-m", "llmrl", "train", "--model", str(tiny_model_dir), "--steps", "400",
                              "--out", str(out), *SMALL, "--set", "checkpoint.every=1"],
                             env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # any checkpoint: step-000001 alone is deleted once two later ones exist (checkpoint.keep), and a
        # fast machine can pass it between two polls
        _wait_for(lambda: any((out / "checkpoints").glob("step-*")), first)
        assert (out / LOCK).read_text().split()[0] == str(first.pid)
        busy = f"'{out}' is in use by another llmrl run (pid {first.pid}); wait for it to end or stop it first."
        for args in (["--model", str(tiny_model_dir), "--out", str(out), "--overwrite", *SMALL], ["--resume", str(out)]):
            second = _cli(["train", *args])
            assert second.returncode == 2, second.stderr
            assert second.stderr.strip() == f"error: {busy}"
        assert (out / "config.yaml").is_file() and (out / "checkpoints").is_dir(), "the running run is untouched"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # kill -9 left the lock behind; its process is gone, so --resume takes it over
    assert (out / LOCK).is_file()
    done = max(int(p.name.split("-")[1]) for p in (out / "checkpoints").iterdir() if p.name.startswith("step-"))
    resumed = _cli(["train", "--resume", str(out), "--steps", str(done + 1)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"Resuming after step {done}" in resumed.stdout
    assert not (out / LOCK).exists(), "released at the end"
    # and --overwrite of the finished run takes a stale lock over too
    (out / LOCK).write_text("999999999 1\n")
    again = _cli(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(out), "--overwrite", *SMALL])
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (out / LOCK).exists()


# ---- 4. dataset columns never overwrite logged fields ----------------------------------------------

REWARD_FILE = '''
def score(prompts, completions, **columns):
    """len(c)/10, plus 1 when every clashing column arrived under its dataset_ name."""
    seen = [(columns["dataset_prompts"][i], columns["dataset_completions"][i], columns["dataset_completion"][i],
             columns["dataset_reward"][i], columns["dataset_step"][i]) for i in range(len(completions))]
    return [len(c) / 10 + (1.0 if s == ("pp", "cc", "THE REFERENCE ANSWER", 99.0, 1000) else 0.0)
            for c, s in zip(completions, seen)]
'''


def test_dataset_columns_named_like_logged_fields(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "completion": "THE REFERENCE ANSWER", "reward": 99.0,
             "prompts": "pp", "completions": "cc", "step": 1000} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2),
                                                                             (4, 4), (6, 1), (3, 3), (9, 1), (5, 5)]]
    data = tmp_path / "trl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "rw.py").write_text(REWARD_FILE)
    out = tmp_path / "r"
    proc = _cli(["train", "--model", str(tiny_model_dir), "--dataset", str(data), "--reward", f"{tmp_path / 'rw.py'}:score",
                 "--steps", "1", "--out", str(out), *SMALL, "--set", "log.completions_every=1",
                 "--set", "log.completions_rows=4"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 4
    for r in logged:
        assert r["step"] == 1 and r["completion"] != "THE REFERENCE ANSWER"
        # the logged reward is the reward function's value of the model's completion: len/10 + 1
        assert abs(r["reward"] - (len(r["completion"]) / 10 + 1.0)) < 1e-4, r
        assert (r["dataset_completion"], r["dataset_reward"], r["dataset_prompts"], r["dataset_step"]) == (
            "THE REFERENCE ANSWER", 99.0, "pp", 1000)
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # 4 prompts x 1 sample: the step's mean reward is the mean of the 4 logged rows
    assert abs(metrics["reward_mean"] - sum(r["reward"] for r in logged) / 4) < 1e-4
    shown = [line for line in proc.stdout.splitlines() if "→" in line and "(reward" in line]
    assert shown and not any("REFERENCE" in line for line in shown)


# ---- 5. run files follow the umask -----------------------------------------------------------------

def test_run_files_follow_the_umask(run_dir: Path, tmp_path: Path) -> None:
    for name in ("config.yaml", "summary.json", "metrics.jsonl", "completions.jsonl"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o644, name  # 0o666 & ~0o022
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "report.md", "x")  # what compare's summary.json and report.md go through
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == 0o640  # 0o666 & ~0o027


# ---- 6. relative paths still work from another folder ----------------------------------------------

def test_relative_paths_are_stored_absolute(tiny_model_dir: Path, tmp_path: Path) -> None:
    here, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (here / "data").mkdir(parents=True)
    elsewhere.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(1, 4) for b in range(1, 4)]
    (here / "data" / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (here / "rw.py").write_text("def score(prompts, completions, answer):\n    return [0.0 for _ in completions]\n")
    model = os.path.relpath(tiny_model_dir, here)
    out = tmp_path / "run"
    proc = _cli(["train", "--model", model, "--dataset", "data/sums.jsonl", "--reward", "rw.py:score",
                 "--set", "data.eval_dataset=./data/sums.jsonl", "--steps", "1", "--out", str(out), *SMALL], cwd=here)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stored = yaml.safe_load((out / "config.yaml").read_text())
    assert stored["model"]["name"] == str(tiny_model_dir.resolve())
    assert stored["data"]["dataset"] == stored["data"]["eval_dataset"] == str(here / "data" / "sums.jsonl")
    assert stored["reward"]["functions"] == [{"name": f"{here / 'rw.py'}:score"}]
    resumed = _cli(["train", "--resume", str(out), "--steps", "2"], cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    evaluated = _cli(["eval", "--model", str(out), "--size", "2"], cwd=elsewhere)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "held-out" in evaluated.stdout


# ---- 19. messages that name the right thing --------------------------------------------------------

def test_non_finite_stop_without_a_checkpoint_names_none(tiny_model_dir: Path, tmp_path: Path) -> None:
    # lr 1e30: the first update sends the weights to inf, so step 2's loss is not finite
    err = _refused(["train", "--model", str(tiny_model_dir), "--steps", "6", "--out", str(tmp_path / "r"), *SMALL,
                    "--set", "update.lr_actor=1e30", "--set", "update.max_bad_steps=1", "--set", "checkpoint.every=0"],
                   "had a non-finite loss or gradient (last at step 2). No checkpoint was written yet; fix the cause "
                   "and start again with --overwrite.", code=1)
    assert "newest good checkpoint" not in err


def test_interrupt_during_the_first_evaluation_says_how_to_start_again(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    # 100 held-out prompts one at a time: the first evaluation takes seconds (~12 s on a 2-core CPU);
    # config.yaml is the last file setup writes, so the signal lands in the start-up table or the
    # evaluation. The child gets SIGINT's default action back: a suite started in the background
    # (`nohup … &`) hands its children SIGINT ignored, and Python then keeps ignoring it (the run
    # finished with exit 0 in two such CI runs).
    first = subprocess.Popen([sys.executable, "-m", "llmrl", "train", "--model", str(tiny_model_dir), "--steps", "1",
                              "--out", str(out), *SMALL, "--set", "eval.size=100", "--set", "eval.batch_size=1"],
                             env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for(lambda: (out / "config.yaml").is_file(), first, poll=0.05)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    assert err.strip() == (f"error: Interrupted before the first step; nothing was trained. Start it again with: "
                           f"llmrl train --resume {out}")
    assert not (out / LOCK).exists()
    resumed = _cli(["train", "--resume", str(out)])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 1


def test_resume_of_a_run_with_steps_but_no_checkpoint_still_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    assert _run(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(out), *SMALL])[0] == 0
    for p in sorted((out / "checkpoints").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (out / "summary.json").unlink()
    _refused(["train", "--resume", str(out), "--steps", "2"],
             f"'{out}' has no checkpoint to resume from; start it again with --overwrite.")


def test_eval_dataset_without_the_rewards_column_names_the_eval_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    train_file, eval_file = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train_file.write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in range(8)))
    eval_file.write_text("".join(json.dumps({"prompt": f"{a}+2=", "solution": str(a + 2)}) + "\n" for a in range(4)))
    _refused(["train", "--model", str(tiny_model_dir), "--dataset", str(train_file), "--reward", "numeric",
              "--set", f"data.eval_dataset={eval_file}", "--out", str(tmp_path / "r"), *SMALL],
             f"Reward 'numeric' reads column 'answer', which '{eval_file}' does not have (columns: solution)")
    assert not (tmp_path / "r" / "config.yaml").exists()


def test_errors_of_a_two_process_run_are_printed_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    proc = _cli(["train", "--nproc", "2", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r"),
                 "--set", "steps=abc"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("'steps' must be int, got 'abc'.") == 1, proc.stderr
