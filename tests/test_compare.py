"""`llmrl compare` end to end on a tiny random model: files, identical prompts (checked), reuse and
resume on a second call, the plan check, bad input; and the gradient-noise statistics it reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmrl import load_config, read_run
from llmrl.cli import app
from llmrl.compare import build_plan
from llmrl.compare.aggregate import check_prompts
from llmrl.step import update as update_mod
from llmrl.run.data import PromptSampler, stream_digest
from llmrl.step.grad_stats import GradMoments
from llmrl.run.reporting import NullReporter
from llmrl.run.one_step import train_step
from llmrl.run.session import setup
from llmrl.tasks import TASKS, Task, get_task
from tests.helpers import digit_share, digits_task as make_digits_task, is_timing

PLOTS = ("reward_vs_step.png", "reward_vs_time.png", "kl_vs_step.png", "accuracy.png")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def digits_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "digits", make_digits_task)


def _small(model: Path) -> list[str]:
    sets = [f"model.name={model}", "task=digits", "rollout.prompts_per_step=4", "rollout.num_generations=2",
            "update.minibatch_size=4", "eval.size=8", "eval.every=1", "checkpoint.every=1", "threads=1"]
    return [a for s in sets for a in ("--set", s)]


def _compare(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["compare", *args])
    return result.exit_code, result.stdout, result.stderr


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]


@pytest.fixture(scope="module")
def done(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], str]:
    """A finished compare of ppo and grpo × seeds 0, 1 × 2 steps (made once for this module)."""
    out = tmp_path_factory.mktemp("cmp") / "cmp"
    args = ["--algos", "ppo,grpo", "--seeds", "0,1", "--steps", "2", "--out", str(out), *_small(tiny_model_dir)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(TASKS, "digits", make_digits_task)
        code, stdout, stderr = _compare(*args)
    assert code == 0, stderr
    return out, args, stdout


def test_compare_writes_every_file(done: tuple[Path, list[str], str]) -> None:
    out, _, stdout = done
    for name in ("ppo-seed0", "ppo-seed1", "grpo-seed0", "grpo-seed1"):
        run = read_run(out / name)
        assert run.summary is not None and run.summary["steps"] == 2, name
        assert (out / name / "curves.png").read_bytes().startswith(PNG)
        assert {"actor_grad_norm_var", "actor_grad_var", "actor_grad_rel_var", "prompt_digest"} <= set(run.metrics[0])
    for plot in PLOTS:
        assert (out / plot).read_bytes().startswith(PNG), plot
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["algos"]) == ["ppo", "grpo"]
    for algo in ("ppo", "grpo"):
        cols = summary["algos"][algo]
        assert cols["acc_after"]["n"] == 2 and cols["acc_after"]["std"] is not None
        assert cols["prompts_seen"]["values"] == [8, 8]  # 2 steps × 4 prompts, both seeds
        assert cols["grad_var"]["mean"] > 0 and cols["adv_std"]["mean"] > 0
        # the held-out EOS rate is each run's summary figure; the arithmetic task has no strict metric
        eos = [read_run(out / f"{algo}-seed{k}").summary["eval_eos_rate_after"] for k in (0, 1)]
        assert cols["eos_after"]["values"] == eos and all(0 <= e <= 1 for e in eos)
        assert cols["strict_after"]["mean"] is None
    # reward AUC is the mean train reward over the steps of each run
    rows = read_run(out / "ppo-seed0").metrics
    assert summary["runs"]["ppo-seed0"]["reward_auc"] == pytest.approx(sum(r["reward_mean"] for r in rows) / 2, abs=1e-12)
    # the presets' differences, and only those, are listed
    diff = summary["differences"]
    assert diff["estimator.name"] == {"ppo": "gae", "grpo": "grpo"} and diff["kl.placement"] == {"ppo": "reward", "grpo": "loss"}
    assert not any(k.startswith("rollout.") or k in ("seed", "steps", "task") for k in diff)
    report = (out / "report.md").read_text()
    assert all(f"]({p})" in report for p in PLOTS) and "| `grpo` |" in report
    assert "EOS rate after" in report and "strict acc." not in report  # a column no run measured is left out
    assert "What differs between the algorithms" in stdout and "estimator.name" in stdout
    assert all(f"{n}" in stdout for n in ("ppo-seed0", "grpo-seed1")) and "done" in stdout  # the live view's lines
    assert "Outcome (mean ± std over 2 seeds)" in stdout and "seed 0: identical over the first 8 prompts" in stdout


def test_runs_of_a_seed_read_identical_prompts(done: tuple[Path, list[str], str]) -> None:
    out, _, _ = done
    digests = {name: [r["prompt_digest"] for r in read_run(out / name).metrics]
               for name in ("ppo-seed0", "grpo-seed0", "ppo-seed1", "grpo-seed1")}
    assert digests["ppo-seed0"] == digests["grpo-seed0"]
    assert digests["ppo-seed1"] == digests["grpo-seed1"]
    assert digests["ppo-seed0"] != digests["ppo-seed1"]  # a seed changes the stream, so the check can fail
    # the logged digest is the fingerprint of the rows the sampler hands the trainer
    sampler = PromptSampler(len(get_task("arithmetic").train), 4, 0)
    assert digests["ppo-seed0"] == [f"{stream_digest(4 * s, sampler.indices(s)):016x}" for s in range(2)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == {"identical": True, "seeds": {"0": {"identical": True, "checked": 8},
                                                               "1": {"identical": True, "checked": 8}}}


def test_digest_sums_do_not_depend_on_step_size() -> None:
    """B = 4 for 2 steps and B = 8 for 1 step read the same stream: the summed digests agree."""
    small, big = PromptSampler(100, 4, 3), PromptSampler(100, 8, 3)
    two = sum(stream_digest(4 * s, small.indices(s)) for s in range(2)) % 2**64
    assert two == stream_digest(0, big.indices(0))
    assert stream_digest(0, small.indices(0)) != stream_digest(0, small.indices(1))


def test_prompt_check_detects_a_different_stream(done: tuple[Path, list[str], str], tmp_path: Path) -> None:
    out, _, _ = done
    copy = tmp_path / "cmp"
    shutil.copytree(out, copy)
    metrics = copy / "grpo-seed1" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[1]["prompt_digest"] = f"{(int(rows[1]['prompt_digest'], 16) + 1) % 2**64:016x}"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = build_plan(["ppo", "grpo"], [0, 1], copy, steps=2, sets=_small(Path("m"))[1::2])
    runs = {r.name: read_run(copy / r.name) for r in plan.runs}
    check = check_prompts(plan, runs)
    assert check["identical"] is False
    assert check["seeds"]["0"]["identical"] is True and check["seeds"]["1"]["identical"] is False


def test_second_call_reuses_resumes_and_retrains(done: tuple[Path, list[str], str], tmp_path: Path) -> None:
    out, args, _ = done
    copy = tmp_path / "cmp"
    shutil.copytree(out, copy)
    args = [a if a != str(out) else str(copy) for a in args]
    before = {n: _metrics(copy / n) for n in ("ppo-seed0", "grpo-seed0", "grpo-seed1", "ppo-seed1")}
    stamps = {n: (copy / n / "metrics.jsonl").stat().st_mtime_ns for n in ("ppo-seed0", "grpo-seed0")}
    # grpo-seed1 stopped after step 1 (its step-2 checkpoint and summary are gone); ppo-seed1 never started
    (copy / "grpo-seed1" / "summary.json").unlink()
    shutil.rmtree(copy / "grpo-seed1" / "checkpoints" / "step-000002")
    shutil.rmtree(copy / "ppo-seed1")
    code, stdout, stderr = _compare(*args)
    assert code == 0, stderr
    assert "ppo-seed0: finished earlier, reused" in stdout and "grpo-seed0: finished earlier, reused" in stdout
    assert "grpo-seed1: resuming" in stdout and "ppo-seed1: training" in stdout
    assert {n: (copy / n / "metrics.jsonl").stat().st_mtime_ns for n in stamps} == stamps
    for name, rows in before.items():
        assert _metrics(copy / name) == rows, name  # resumed and retrained runs redo the same numbers
    assert json.loads((copy / "summary.json").read_text())["prompts"]["identical"] is True


def test_a_compare_run_equals_a_plain_train_run(done: tuple[Path, list[str], str], tiny_model_dir: Path, tmp_path: Path) -> None:
    """The fourth run of the compare, trained after three others in one process, leaks nothing."""
    out, _, _ = done
    result = CliRunner().invoke(app, ["train", "--algo", "grpo", "--seed", "1", "--steps", "2", "--out", str(tmp_path / "g"),
                                      *_small(tiny_model_dir)])
    assert result.exit_code == 0, result.stderr
    assert _metrics(tmp_path / "g") == _metrics(out / "grpo-seed1")


def test_a_different_plan_is_refused_unless_overwrite(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "c"
    base = ["--algos", "reinforce", "--out", str(out), "--model", str(tiny_model_dir), "--task", "digits",
            *_small(tiny_model_dir)[4:]]  # the flags instead of --set model.name/task
    assert _compare(*base, "--steps", "1")[0] == 0
    code, _, stderr = _compare(*base, "--steps", "2")
    assert code == 2 and "holds a compare with a different plan (steps: 1 → 2)" in stderr
    assert len(stderr.strip().splitlines()) == 1
    code, _, stderr = _compare(*base, "--steps", "2", "--overwrite")
    assert code == 0, stderr
    run = read_run(out / "reinforce-seed0")
    assert run.summary["steps"] == 2 and run.config["task"] == "digits"
    assert run.config["model"]["name"] == str(tiny_model_dir)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--algos", "ppo,grpp"], "Unknown algorithm 'grpp'; valid algorithms: ppo, reinforce, reinforce_baseline, a2c, grpo, dr_grpo, rloo, remax, reinforce_pp, "
                                   "reinforce_pp_baseline, gspo, dapo, cispo."),
        (["--algos", "ppo,ppo"], "--algos lists ppo more than once."),
        (["--algos", "ppo", "--seeds", "0,x"], "--seeds expects comma-separated integers ≥ 0"),
        (["--algos", "ppo", "--set", "seed=3"], "use --seeds instead of --set seed=…"),
        (["--algos", "ppo", "--match", "tokens"], "--match must be one of rows, prompts; got 'tokens'."),
        (["--algos", "ppo,grpo", "--set", "rollout.prompts_per_step=8", "--set", "update.minibatch_size=8"],
         "different rows per step (prompts_per_step × num_generations: ppo 8, grpo 32)"),
    ],
)
def test_bad_input_is_one_clear_line_before_training(args: list[str], message: str, tmp_path: Path) -> None:
    code, stdout, stderr = _compare(*args, "--out", str(tmp_path / "c"))
    assert code == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr + stdout
    assert not (tmp_path / "c").exists()


def test_a_folder_that_is_not_a_compare_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    code, _, stderr = _compare("--algos", "ppo", "--steps", "1", "--out", str(tmp_path / "c"))
    assert code == 2 and "exists and is not a compare folder" in stderr
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"


def test_match_prompts_gives_every_run_the_group_sizes(tmp_path: Path) -> None:
    plan = build_plan(["ppo", "grpo", "remax"], [0], tmp_path, match="prompts")
    sizes = {r.algo: (r.config.rollout.prompts_per_step, r.config.rollout.num_generations) for r in plan.runs}
    assert sizes == {"ppo": (128, 4), "grpo": (128, 4), "remax": (128, 4)}
    rows = build_plan(["ppo", "grpo"], [0], tmp_path)
    assert {r.algo: (r.config.rollout.prompts_per_step, r.config.rollout.num_generations) for r in rows.runs} == \
        {"ppo": (512, 1), "grpo": (128, 4)}
    assert "rollout.prompts_per_step" not in plan.differences() and "rollout.prompts_per_step" in rows.differences()


def _grad(param: torch.nn.Parameter, values: list[float]) -> None:
    param.grad = torch.tensor(values)


def test_grad_moments_by_hand() -> None:
    # g_1 = (3, 4), g_2 = (1, 0): ‖g‖ = 5, 1 → Var‖g‖ = ((5−3)² + (1−3)²)/1 = 8
    # ḡ = (2, 2), ‖ḡ‖² = 8; tr Cov = (‖(1,2)‖² + ‖(−1,−2)‖²)/1 = 10 = (25 + 1 − 2·8)/1; rel = 10/8
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    moments = GradMoments()
    for ga, gb in ((3.0, 4.0), (1.0, 0.0)):
        _grad(a, [ga])
        _grad(b, [gb])
        moments.add([a, b])
    stats = moments.stats("actor")
    assert stats["actor_grad_norm_var"] == pytest.approx(8.0, abs=1e-9)
    assert stats["actor_grad_var"] == pytest.approx(10.0, abs=1e-9)
    assert stats["actor_grad_rel_var"] == pytest.approx(1.25, abs=1e-9)
    assert torch.equal(a.grad, torch.tensor([1.0]))  # read, never written
    one = GradMoments()
    one.add([a, b])
    _grad(a, [float("inf")])
    one.add([a, b])  # a non-finite gradient (a skipped step) is not counted
    assert one.count == 1
    assert one.stats("actor") == dict.fromkeys(stats)


def test_recording_gradients_changes_no_weight(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = []
    for name, record in (("on", True), ("off", False)):
        if not record:
            monkeypatch.setattr(update_mod.GradMoments, "add", lambda self, p: None)
        config = load_config(overrides={"algo": "grpo", "model.name": str(tiny_model_dir), "task": "digits",
                                        "out": str(tmp_path / name)}, sets=_small(tiny_model_dir)[1::2])
        session = setup(config, NullReporter())
        rows = [train_step(session, s) for s in range(2)]
        assert (rows[0]["actor_grad_var"] is not None) is record
        params.append({n: p.detach().clone() for n, p in session.stack.named_parameters()})
    assert params[0].keys() == params[1].keys()
    assert all(torch.equal(params[0][n], params[1][n]) for n in params[0])


def test_plot_of_a_compare_folder_draws_all_its_runs(done: tuple[Path, list[str], str], tmp_path: Path) -> None:
    out, _, _ = done
    result = CliRunner().invoke(app, ["plot", str(out), "--out", str(tmp_path / "all.png")])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "all.png").read_bytes().startswith(PNG)


def test_a_failed_run_stops_the_compare_and_a_rerun_resumes_it(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0, "fail_at": 3}  # call 1: evaluation before; 2: step 1; 3: step 2

    def flaky(prompts: list[str], completions: list[str], answer: list[str]) -> list[float]:
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise ZeroDivisionError("boom")
        return digit_share(prompts, completions, answer)

    base = get_task("arithmetic")
    monkeypatch.setitem(TASKS, "flaky", lambda: Task("flaky", base.train, base.eval, flaky))
    args = ["--algos", "reinforce", "--steps", "2", "--out", str(tmp_path / "c"), *_small(tiny_model_dir),
            "--set", "task=flaky", "--set", "eval.every=0"]
    code, _, stderr = _compare(*args)
    assert code == 1
    assert stderr.startswith("error: reinforce-seed0: Reward function")
    assert "raised ZeroDivisionError: boom." in stderr and stderr.strip().endswith("Rerun the same llmrl compare command to continue.")
    assert len(stderr.strip().splitlines()) == 1
    code, stdout, stderr = _compare(*args)
    assert code == 0, stderr
    assert "reinforce-seed0: resuming" in stdout
    assert [r["step"] for r in read_run(tmp_path / "c" / "reinforce-seed0").metrics] == [1, 2]


def test_compare_runs_algorithms_in_an_environment(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`llmrl compare --task calc`: every run plays episodes in the calculator environment on the same
    prompts, and the summary carries the episode numbers side by side."""
    out = tmp_path / "cmp"
    sets = [f"model.name={tiny_model_dir}", "task=calc", "rollout.prompts_per_step=4", "rollout.num_generations=2",
            "rollout.max_turns=3", "rollout.max_new_tokens=6", "update.minibatch_size=4", "eval.size=2",
            "threads=1"]
    code, stdout, stderr = _compare("--algos", "ppo,grpo", "--seeds", "0", "--steps", "2", "--out", str(out),
                                    *[a for s in sets for a in ("--set", s)])
    assert code == 0, stderr
    runs = sorted(p for p in out.iterdir() if (p / "metrics.jsonl").is_file())
    assert len(runs) == 2
    digests = []
    for run in runs:
        rows = _metrics(run)
        assert [r["step"] for r in rows] == [1, 2] and all(r["turns_mean"] >= 1 for r in rows)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["eval_turns_mean_after"] >= 1
        digests.append([r["prompt_digest"] for r in rows])
    assert digests[0] == digests[1]  # identical prompts, step by step
