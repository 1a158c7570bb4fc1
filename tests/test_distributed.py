"""Data-parallel runs: 2 real torchrun processes (gloo, CPU) equal 1 process with the same global batch.

Each 2-process run is a real subprocess (`llmrl train --nproc 2`, or torchrun itself); the 1-process
run of the same config runs in this process. The tasks come from tests/dist_plugin.py, imported by
every worker through `estimator.module`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tests.dist_plugin  # noqa: F401  (registers dist_digits and dist_dying here too)
from llmrl import load_config, read_run, train
from llmrl.run.checkpoint import list_checkpoints
from llmrl.config.on_policy import on_policy_update
from llmrl.parallel.distributed import DistContext
from llmrl.run.reporting import NullReporter
from llmrl.run.session import setup
from llmrl.errors import ConfigError
from tests.helpers import is_timing

ROOT = Path(__file__).resolve().parent.parent
COMMON = {"estimator.module": "tests.dist_plugin", "eval.size": 16, "eval.every": 0, "lora.r": 4,
          "lora.alpha": 4, "update.lr_actor": 1e-3, "update.lr_critic": 1e-3, "threads": 1}
CASES = {
    # a critic algorithm with batch whitening, two minibatches per epoch, micro-batches
    "ppo": {"algo": "ppo", "rollout.prompts_per_step": 8, "update.minibatch_size": 4,
            "update.micro_batch_size": 3, "estimator.whiten": True, "update.epochs": 2},
    # the same, with the base's decoder layers sharded over the 2 processes by FSDP2 (fully_shard)
    "ppo-sharded": {"algo": "ppo", "rollout.prompts_per_step": 8, "update.minibatch_size": 4,
                    "update.micro_batch_size": 3, "estimator.whiten": True, "update.epochs": 2},
    # a group algorithm: G = 4 samples of a prompt stay on one rank, KL in the loss
    "grpo": {"algo": "grpo", "rollout.prompts_per_step": 4, "rollout.num_generations": 4,
             "update.minibatch_size": 8},
    # one minibatch of all 16 rows: update.on_policy_logprobs=auto skips the rollout's actor forward
    # and each rank's update forward fills in its rows' log π_old; sharded base, micro-batches
    "grpo-on-policy-sharded": {"algo": "grpo", "rollout.prompts_per_step": 4, "rollout.num_generations": 4,
                               "update.minibatch_size": 16, "update.micro_batch_size": 3},
}
EXACT = ("step", "reward_mean", "tokens", "response_len", "prompts_seen", "prompt_digest", "zero_advantage",
         "skipped_updates", "beta")


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "COLUMNS": "120", **extra}


def _sets(settings: dict) -> list[str]:
    return [a for k, v in settings.items() for a in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")]


def _launch(entry: str, model: Path, out: Path, task: str, steps: int, settings: dict, **env: str) -> subprocess.CompletedProcess:
    args = ["train", "--model", str(model), "--task", task, "--steps", str(steps), "--out", str(out), *_sets(settings)]
    if entry == "nproc":  # llmrl starts torchrun itself
        cmd = [sys.executable, "-m", "llmrl", *args, "--nproc", "2"]
    else:  # what a user types: torchrun --nproc-per-node 2 -m llmrl train …
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "llmrl", *args]
    return subprocess.run(cmd, env=_env(**env), capture_output=True, text=True, timeout=300, cwd=ROOT)


def _single(model: Path, out: Path, task: str, steps: int, settings: dict) -> None:
    train(load_config(overrides={"model.name": str(model), "task": task, "steps": steps, "out": str(out), **settings}))


@pytest.mark.parametrize(("name", "entry"), [("ppo-sharded", "nproc"), ("grpo", "torchrun"),
                                             ("grpo-on-policy-sharded", "nproc")])
def test_two_processes_equal_one(tiny_model_dir: Path, tmp_path: Path, name: str, entry: str) -> None:
    settings = {**COMMON, **CASES[name]}
    assert on_policy_update(load_config(overrides=settings)) == ("on-policy" in name)
    sharded = {"dist.shard_base": True} if name.endswith("sharded") else {}
    proc = _launch(entry, tiny_model_dir, tmp_path / "two", "dist_digits", 3, {**settings, **sharded})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # rank 0's memory table counts what it holds: the 2 decoder layers (2 × 9,280 weights) are split
    # in half with FSDP2; embeddings, LM head and final norm (1,376) stay whole
    assert ("10,656" if sharded else "19,936") in proc.stdout
    _single(tiny_model_dir, tmp_path / "one", "dist_digits", 3, settings)
    one, two = read_run(tmp_path / "one"), read_run(tmp_path / "two")

    # the same rollouts: rewards, token counts, prompts; rank 0 alone logged (3 rows, not 6)
    assert [r["step"] for r in two.metrics] == [1, 2, 3]
    assert 0 < one.metrics[0]["reward_mean"] < 1
    for a, b in zip(one.metrics, two.metrics):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        for key, value in a.items():  # losses, KL, gradient norms: equal up to summation order
            # generate_useful_frac is each process's batch: two halves decode to their own longest answers
            if isinstance(value, float) and key not in EXACT and not is_timing(key) and key != "generate_useful_frac":
                assert b[key] == pytest.approx(value, abs=1e-5, rel=1e-4), key
    # the same adapters after 3 steps
    roles = ["actor", "critic"] if name.startswith("ppo") else ["actor"]
    for role in roles:
        a = load_file(tmp_path / "one" / "adapters" / role / "adapter_model.safetensors")
        b = load_file(tmp_path / "two" / "adapters" / role / "adapter_model.safetensors")
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0)
        assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    first = load_file(tmp_path / "one" / "adapters" / "actor" / "adapter_model.safetensors")
    assert any(float(v.abs().max()) > 1e-3 for k, v in first.items() if "lora_B" in k)  # it did train
    for key in ("eval_accuracy_before", "eval_accuracy_after", "tokens_total"):
        assert one.summary[key] == two.summary[key], key


def test_a_dying_rank_stops_the_run_and_a_2_process_resume_finishes_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    # rank 1's reward calls: 1 = eval before training (sharded), 2 = step 1, 3 = step 2, 4 = step 3 → dies
    # rank 0 must notice the loss before torchrun, which SIGTERMs it as rank 1 dies, SIGKILLs it 30 s later
    # (torch/distributed/elastic/multiprocessing/api.py `_close`): a collective that hangs on the dead
    # peer instead of failing at once gives up after 20 s and still prints its sentence
    settings = {**COMMON, **CASES["ppo"], "checkpoint.every": 1, "dist.timeout_s": 20}
    proc = _launch("nproc", tiny_model_dir, tmp_path / "r", "dist_dying", 5, settings,
                   LLMRL_TEST_DIE_RANK="1", LLMRL_TEST_DIE_CALL="4")
    assert proc.returncode == 1
    assert "Rank 0 of 2 lost the other processes" in proc.stderr
    assert "Training state after step 2 is checkpointed" in proc.stderr
    assert "rank 1 exited first, with code 3" in proc.stderr
    assert not (tmp_path / "r" / "summary.json").exists()
    assert [p.name for p in list_checkpoints(tmp_path / "r")] == ["step-000001", "step-000002"]
    assert [r["step"] for r in read_run(tmp_path / "r").metrics] == [1, 2]
    # the checkpoint is whole: a 2-process resume continues it to the end, and the result equals
    # an uninterrupted 1-process run (same reward, no death)
    resumed = subprocess.run([sys.executable, "-m", "llmrl", "train", "--resume", str(tmp_path / "r"), "--nproc", "2"],
                             env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming after step 2" in resumed.stdout
    _single(tiny_model_dir, tmp_path / "one", "dist_digits", 5, settings)
    one, two = read_run(tmp_path / "one").metrics, read_run(tmp_path / "r").metrics
    assert [{k: r[k] for k in EXACT} for r in two] == [{k: r[k] for k in EXACT} for r in one]
    for role in ("actor", "critic"):
        a = load_file(tmp_path / "one" / "adapters" / role / "adapter_model.safetensors")
        b = load_file(tmp_path / "r" / "adapters" / role / "adapter_model.safetensors")
        for k in a:
            torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0)


def test_prompts_per_step_must_split_over_the_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_config(overrides={"model.name": str(tiny_model_dir), "task": "dist_digits", "out": str(tmp_path / "r"),
                                    **COMMON, "rollout.prompts_per_step": 7, "update.minibatch_size": 7})
    # rank 0 of 2 (no process group is needed: the check comes before any collective)
    with pytest.raises(ConfigError, match=r"^'rollout.prompts_per_step' \(7\) must be divisible by the number of processes \(2\)\.$"):
        setup(config, NullReporter(), dist=DistContext(rank=0, world_size=2))


def test_dynamic_sampling_is_refused_with_several_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_config(overrides={"model.name": str(tiny_model_dir), "task": "dist_digits", "out": str(tmp_path / "r"),
                                    **COMMON, **CASES["grpo"], "rollout.filter_groups": True})
    with pytest.raises(ConfigError, match=r"^'rollout.filter_groups' runs in one process for now"):
        setup(config, NullReporter(), dist=DistContext(rank=0, world_size=2))
    assert not (tmp_path / "r").exists()


def test_nproc_under_torchrun_is_refused(monkeypatch) -> None:
    from typer.testing import CliRunner

    from llmrl.cli import app

    monkeypatch.setenv("WORLD_SIZE", "2")
    result = CliRunner().invoke(app, ["train", "--nproc", "2"])
    assert result.exit_code == 2 and "--nproc starts torchrun itself; under torchrun, leave it out." in result.stderr


def test_shards_and_local_rows() -> None:
    ranks = [DistContext(rank=r, world_size=2) for r in range(2)]
    assert [c.shard(8) for c in ranks] == [slice(0, 4), slice(4, 8)]
    rows = torch.tensor([6, 1, 4, 3])  # a minibatch of global rows; each rank holds 4 rows
    assert ranks[0].local_rows(rows, 4).tolist() == [1, 3]
    assert ranks[1].local_rows(rows, 4).tolist() == [2, 0]
    with pytest.raises(ConfigError, match="7 items cannot be split evenly over 2 processes"):
        ranks[0].shard(7)


def test_shard_base_needs_several_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = load_config(overrides={"model.name": str(tiny_model_dir), "task": "dist_digits", "out": str(tmp_path / "r"),
                                    **COMMON, "rollout.prompts_per_step": 8, "update.minibatch_size": 8,
                                    "dist.shard_base": True})
    with pytest.raises(ConfigError, match=r"^'dist.shard_base' shards the base over the processes of a torchrun run"):
        setup(config, NullReporter())


def test_micro_batches_report_the_minibatch_statistics(tiny_model_dir: Path, tmp_path: Path) -> None:
    # the update's logged losses are sums of per-micro-batch shares (what ranks add up too): split
    # into micro-batches of 3 rows they equal the whole-minibatch values
    base = {"model.name": str(tiny_model_dir), "task": "dist_digits", "steps": 1, **COMMON, **CASES["ppo"]}
    whole = train(load_config(overrides={**base, "out": str(tmp_path / "whole"), "update.micro_batch_size": None}))
    split = train(load_config(overrides={**base, "out": str(tmp_path / "split")}))
    for key in ("policy_loss", "entropy", "clip_frac", "approx_kl", "value_loss", "actor_grad_norm"):
        assert split.metrics[0][key] == pytest.approx(whole.metrics[0][key], abs=1e-6), key
    assert whole.metrics[0]["entropy"] > 1.0


def test_nproc_forwards_every_option_given(monkeypatch) -> None:
    from typer.testing import CliRunner

    from llmrl.cli import app

    seen: dict = {}
    monkeypatch.setattr(sys.modules["llmrl.cli.train"], "launch", lambda n, args: seen.update(n=n, args=args))
    result = CliRunner().invoke(app, ["train", "--nproc", "2", "-a", "grpo", "--set", "a=1", "--set", "b=2", "--overwrite",
                                      "--report-to", "tensorboard", "--dataset", "x.jsonl", "-n", "3", "-o", "runs/x"])
    assert result.exit_code == 0, result.output
    assert seen == {"n": 2, "args": ["--algo", "grpo", "--dataset", "x.jsonl", "--steps", "3", "--out", "runs/x",
                                     "--set", "a=1", "--set", "b=2", "--overwrite", "--report-to", "tensorboard"]}
