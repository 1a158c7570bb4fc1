"""The same runs on a CUDA device (skipped without one; `bench/gpu_check.sh` runs them on a GPU machine).

- float64 training on cuda equals training on the CPU: the same sampled completions, rewards and token
  counts, and losses and adapters equal to 1e-9 (a tiny GPT-2, which computes everything in float64;
  a float64 Llama keeps its RMSNorm and rotary tables in float32, whose CPU and CUDA roundings differ),
  for ppo (micro-batches, two epochs), ppo with the critic's values from its update forward, grpo
  (shared prompt caches, log π_old from the update) and remax (greedy baseline);
- `llmrl train --set model.device=cuda` as a subprocess, then `llmrl export`: the merged model loads with
  transformers and computes the actor's logits;
- a run resumed on cuda (LoRA dropout on, so the CUDA RNG matters) continues the uninterrupted run;
- bfloat16 on cuda: finite losses, float32 adapters that moved;
- `llmrl eval --device cuda` reports what the CPU reports for the same run;
- data parallel: more processes than GPUs is one sentence; with two GPUs, nccl processes equal one; a CPU
  run on a GPU machine shards its base on the CPU.

CUDA float32 kernels may accumulate in a different order from run to run (attention backward), so
float32 comparisons use the tolerances of tests/test_distributed.py: the same rollouts exactly,
losses to 1e-4 relative, adapters to 1e-5.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
from typer.testing import CliRunner

import tests.dist_plugin  # noqa: F401  (registers dist_digits for the in-process runs)
from llmrl import load_config, read_run, train
from llmrl.run.checkpoint import list_checkpoints
from llmrl.cli import app
from llmrl.run import session as trainer_mod
from llmrl.run.memory import peak_device_mib
from llmrl.model_eval import eval_model
from llmrl.run.actor import load_actor
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import TASKS
from tests.helpers import digits_task, is_timing
from tests.test_distributed import CASES, COMMON, EXACT, _launch, _single

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (torch.cuda.is_available() is False); run on a GPU machine: bench/gpu_check.sh",
)

ROOT = Path(__file__).resolve().parent.parent
DIGITS = f"{ROOT / 'tests' / 'helpers.py'}:digit_share"  # a dense reward a random model earns, by file path
INPUTS = torch.tensor([[1, 8, 11, 17, 9, 6, 20], [1, 13, 17, 5, 20, 6, 4]])  # "<s>47+58=2", "<s>9+14=0" in char ids
SMALL = {"task": "digits", "rollout.prompts_per_step": 8, "update.minibatch_size": 4, "eval.size": 8,
         "eval.every": 0, "update.lr_actor": 1e-2, "update.lr_critic": 1e-2}


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": "120"}


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in read_run(run).metrics]


def _close_rows(got: list[dict], expected: list[dict], rel: float, abs_: float) -> None:
    """The same steps, the EXACT entries (rollouts, prompts) equal, every other number to (rel, abs_)."""
    assert len(got) == len(expected) > 0
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        for key, value in a.items():
            if isinstance(value, float) and key not in EXACT:
                assert b[key] == pytest.approx(value, rel=rel, abs=abs_), (a["step"], key)
            elif key not in EXACT:
                assert b[key] == value, (a["step"], key)


def _adapters(run: Path, role: str) -> dict[str, torch.Tensor]:
    return load_file(run / "adapters" / role / "adapter_model.safetensors")


def _close_adapters(got: Path, expected: Path, roles: list[str], atol: float) -> None:
    for role in roles:
        a, b = _adapters(expected, role), _adapters(got, role)
        assert a.keys() == b.keys() and a, role
        for k in a:
            torch.testing.assert_close(b[k], a[k], atol=atol, rtol=0)
    trained = _adapters(expected, "actor")
    assert any(float(v.abs().max()) > 1e-3 for k, v in trained.items() if "lora_B" in k), "nothing trained"


@pytest.fixture(autouse=True)
def _digits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "digits", digits_task)


# ---- float64: cuda equals the CPU ------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer GPT-2 on the char tokenizer: LayerNorm, GELU and attention all run in the
    model's dtype, so in float64 nothing is rounded to float32 on the way."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(cfg).eval().save_pretrained(path)
    tok.save_pretrained(path)
    return path


F64_CASES = {
    # two epochs of two minibatches, micro-batches of 3, whitening, KL in the reward, critic from the rollout
    "ppo": {"algo": "ppo", "update.micro_batch_size": 3, "update.epochs": 2},
    # one pass of all rows: the critic's values come from its update forward (update.on_policy_values)
    "ppo-one-pass": {"algo": "ppo", "update.minibatch_size": 8},
    # G = 4: shared prompt caches; one minibatch of all rows: log π_old from the update's forward
    "grpo-one-pass": {"algo": "grpo", "rollout.prompts_per_step": 4, "rollout.num_generations": 4,
                      "update.minibatch_size": 16},
    # a greedy rollout per step for the baseline
    "remax": {"algo": "remax"},
}


def _float64_run(monkeypatch: pytest.MonkeyPatch, model: Path, out: Path, device: str, case: str) -> Path:
    """A 2-step run of `case` with the model cast to float64 after loading it on `device`."""
    real = trainer_mod.load_base

    def load_base_float64(cfg, show_progress=True):
        base, tok = real(cfg, show_progress=show_progress)
        return base.to(torch.float64), tok

    with monkeypatch.context() as m:
        m.setattr(trainer_mod, "load_base", load_base_float64)
        train(load_config(overrides={**SMALL, **F64_CASES[case], "model.name": str(model), "model.device": device,
                                     "out": str(out), "steps": 2, "log.completions_every": 1,
                                     "log.completions_rows": 16}))
    return out


@pytest.mark.parametrize("case", list(F64_CASES))
def test_float64_training_on_cuda_equals_the_cpu(gpt2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 case: str) -> None:
    cpu = _float64_run(monkeypatch, gpt2_dir, tmp_path / "cpu", "cpu", case)
    gpu = _float64_run(monkeypatch, gpt2_dir, tmp_path / "cuda", "cuda", case)
    # the same sampled completions and rewards, token for token
    completions = lambda run: (run / "completions.jsonl").read_text().splitlines()  # noqa: E731
    assert completions(gpu) == completions(cpu) and len(completions(cpu)) >= 16
    rows = _rows(cpu)
    assert 0 < rows[0]["reward_mean"] < 1 and not rows[0]["zero_advantage"]  # a real signal to train on
    _close_rows(_rows(gpu), rows, rel=1e-9, abs_=1e-12)
    roles = ["actor", "critic"] if case.startswith("ppo") else ["actor"]
    _close_adapters(gpu, cpu, roles, atol=1e-10)
    adapter = _adapters(gpu, "actor")
    assert {v.dtype for v in adapter.values()} == {torch.float64}
    if case.startswith("ppo"):
        torch.testing.assert_close(load_file(gpu / "value_head.safetensors")["weight"],
                                   load_file(cpu / "value_head.safetensors")["weight"], atol=1e-10, rtol=0)
    for key in ("eval_accuracy_before", "eval_accuracy_after", "eval_reward_before", "eval_reward_after"):
        assert read_run(gpu).summary[key] == pytest.approx(read_run(cpu).summary[key], abs=1e-12), key
    assert read_run(cpu).summary["peak_device_mib"] is None and read_run(gpu).summary["peak_device_mib"] > 0


# ---- the CLI on cuda: train, export, eval ---------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`llmrl train --set model.device=cuda` as a user runs it: 2 PPO steps of the random tiny Llama,
    its norms trained as modules_to_save, the digit-share reward given by file path."""
    out = tmp_path_factory.mktemp("cuda-cli") / "run"
    sets = ["model.device=cuda", "rollout.prompts_per_step=8", "update.minibatch_size=4", "eval.size=8",
            "lora.modules_to_save=norm", "update.lr_actor=1e-2", "checkpoint.every=1"]
    cmd = [sys.executable, "-m", "llmrl", "train", "--model", str(tiny_model_dir), "--out", str(out),
           "--steps", "2", "--reward", DIGITS, *[a for s in sets for a in ("--set", s)]]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_cli_train_on_cuda_then_export(cuda_run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    run = read_run(cuda_run)
    assert run.config["model"]["device"] == "cuda" and run.summary["steps"] == 2
    assert run.summary["peak_device_mib"] > 0 and [p.name for p in list_checkpoints(cuda_run)][-1] == "step-000002"
    assert all(math.isfinite(r["policy_loss"]) and math.isfinite(r["value_loss"]) for r in run.metrics)

    result = CliRunner().invoke(app, ["export", str(cuda_run), "--out", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.stderr
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").to("cuda").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).to("cuda").eval()
    stack, _, _ = load_actor(cuda_run)  # on the run's own device
    assert stack.lm.device.type == "cuda"
    cpu_stack, _, _ = load_actor(cuda_run, device="cpu")
    with torch.no_grad():
        with stack.use("actor"):
            actor = stack.lm(input_ids=INPUTS.cuda()).logits
        with cpu_stack.use("actor"):
            actor_on_cpu = cpu_stack.lm(input_ids=INPUTS).logits
        got, plain = merged(input_ids=INPUTS.cuda()).logits, base(input_ids=INPUTS.cuda()).logits
    assert (actor - plain).abs().max() > 1e-3, "the adapter did not train: the test could not fail"
    torch.testing.assert_close(got, actor, atol=1e-5, rtol=0)
    torch.testing.assert_close(actor.cpu(), actor_on_cpu, atol=1e-5, rtol=0)
    weights, base_weights = load_file(tmp_path / "merged" / "model.safetensors"), load_file(tiny_model_dir / "model.safetensors")
    assert not torch.equal(weights["model.norm.weight"], base_weights["model.norm.weight"])  # trained norms merged


def test_cli_eval_on_cuda_equals_the_cpu(cuda_run: Path) -> None:
    args = ["--model", str(cuda_run), "--size", "16", "--samples", "4", "--json"]
    proc = subprocess.run([sys.executable, "-m", "llmrl", "eval", *args, "--device", "cuda"], env=_env(),
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gpu = json.loads(proc.stdout)
    cpu = eval_model(str(cuda_run), size=16, samples=4, device="cpu")
    assert gpu["prompts"] == cpu["prompts"] == 16
    assert 0 < cpu["sampled"]["reward_mean"] < 1  # digit shares: a comparison that could fail
    assert gpu["greedy"]["accuracy"] == cpu["greedy"]["accuracy"]
    assert gpu["greedy"]["reward_mean"] == pytest.approx(cpu["greedy"]["reward_mean"], abs=1e-6)
    for key, value in cpu["sampled"].items():  # the same per-row uniforms on both devices: the same samples
        assert gpu["sampled"][key] == pytest.approx(value, abs=1e-6), key


# ---- resume, bfloat16 ------------------------------------------------------------------------------

def test_resume_on_cuda_continues_the_uninterrupted_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    """LoRA dropout draws from the CUDA generator in the update's forwards, so the resumed run
    trains the same adapters (and so samples the same completions) only if the checkpoint restored
    the CUDA RNG state."""
    base = {**SMALL, "model.name": str(tiny_model_dir), "model.device": "cuda", "checkpoint.every": 2,
            "lora.dropout": 0.1}
    train(load_config(overrides={**base, "out": str(tmp_path / "full"), "steps": 4}))
    train(load_config(overrides={**base, "out": str(tmp_path / "cut"), "steps": 2}))
    state = torch.load(list_checkpoints(tmp_path / "cut")[-1] / "state.pt", weights_only=True, map_location="cpu")
    assert state["rng"]["cuda"].dtype == torch.uint8  # the CUDA generator is checkpointed
    assert any(t.is_floating_point() for s in state["optimizers"]["actor"]["state"].values() for t in s.values())
    train(load_config(tmp_path / "cut" / "config.yaml", {"out": str(tmp_path / "cut"), "steps": 4}), resume=True)
    full = _rows(tmp_path / "full")
    assert len(full) == 4 and 0 < full[0]["reward_mean"] < 1
    _close_rows(_rows(tmp_path / "cut"), full, rel=1e-4, abs_=1e-5)
    _close_adapters(tmp_path / "cut", tmp_path / "full", ["actor", "critic"], atol=1e-5)


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_bfloat16_on_cuda_trains_with_finite_losses(tiny_model_dir: Path, tmp_path: Path, algo: str) -> None:
    groups = {"rollout.prompts_per_step": 4, "rollout.num_generations": 4, "update.minibatch_size": 8} if algo == "grpo" else {}
    run = train(load_config(overrides={**SMALL, **groups, "algo": algo, "model.name": str(tiny_model_dir),
                                       "model.device": "cuda", "model.dtype": "bfloat16",
                                       "out": str(tmp_path / "r"), "steps": 2}))
    keys = ["policy_loss", "entropy", "approx_kl", "actor_grad_norm", "kl"] + (["value_loss", "critic_grad_norm"] if algo == "ppo" else [])
    for row in run.metrics:
        assert row["skipped_updates"] == 0, row
        assert all(math.isfinite(row[k]) for k in keys), row
        assert row["actor_grad_norm"] > 0 and not row["zero_advantage"]
    adapter = _adapters(tmp_path / "r", "actor")
    assert {v.dtype for v in adapter.values()} == {torch.float32}  # peft keeps adapters in float32 on a bf16 base
    assert any(float(v.abs().max()) > 1e-4 for k, v in adapter.items() if "lora_B" in k)
    if algo == "ppo":
        assert load_file(tmp_path / "r" / "value_head.safetensors")["weight"].dtype == torch.float32
    assert run.summary["peak_device_mib"] > 0 and run.summary["eval_accuracy_after"] is not None


def test_peak_device_memory_is_reported_for_cuda_runs_only() -> None:
    torch.ones(1, device="cuda")
    assert peak_device_mib("cpu") is None
    assert peak_device_mib("cuda") > 0 and peak_device_mib("auto") > 0


# ---- several processes -------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs a machine with exactly one GPU")
def test_two_processes_on_one_gpu_is_one_sentence(tiny_model_dir: Path, tmp_path: Path) -> None:
    proc = _launch("nproc", tiny_model_dir, tmp_path / "r", "dist_digits", 1,
                   {**COMMON, **CASES["grpo"], "model.device": "cuda"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert ("error: Process 1 needs GPU cuda:1 (one GPU per process on a node) but this node has 1; start at most "
            "that many processes per node, or set model.device=cpu.") in proc.stderr
    assert "The 2-process run stopped: rank 1 exited first, with code 2" in proc.stderr


def test_a_cpu_run_on_a_gpu_machine_shards_its_base_on_the_cpu(tiny_model_dir: Path, tmp_path: Path) -> None:
    """FSDP's default mesh is the machine's accelerator; a gloo run must keep its shards on the CPU."""
    _two_processes_equal_one(tiny_model_dir, tmp_path, {**COMMON, **CASES["ppo-sharded"], "model.device": "cpu"},
                             steps=2, sharded=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("sharded", [False, True], ids=["nccl", "nccl-sharded"])
def test_two_gpu_processes_equal_one(tiny_model_dir: Path, tmp_path: Path, sharded: bool) -> None:
    _two_processes_equal_one(tiny_model_dir, tmp_path, {**COMMON, **CASES["ppo"], "model.device": "cuda"},
                             steps=3, sharded=sharded)


def _two_processes_equal_one(model: Path, tmp_path: Path, settings: dict, steps: int, sharded: bool) -> None:
    """A 2-process run (launched by --nproc) logs the rows and saves the adapters of one process."""
    proc = _launch("nproc", model, tmp_path / "two", "dist_digits", steps, {**settings, "dist.shard_base": sharded})
    assert proc.returncode == 0, proc.stderr[-3000:]
    _single(model, tmp_path / "one", "dist_digits", steps, settings)
    _close_rows(_rows(tmp_path / "two"), _rows(tmp_path / "one"), rel=1e-4, abs_=1e-5)
    _close_adapters(tmp_path / "two", tmp_path / "one", ["actor", "critic"], atol=1e-5)
