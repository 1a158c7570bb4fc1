"""What a GPU changes, checked on the CPU where a CPU can check it (the GPU runs are test_cuda.py).

- A checkpoint written by a GPU run holds CUDA tensors (the AdamW moments) in state.pt: it must load
  wherever the run resumes (another rank's GPU, or a machine without one), continuing bit-identically.
- More processes per node than GPUs, and `model.device=cuda` without CUDA: one sentence, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.serialization
from safetensors.torch import load_file
from typer.testing import CliRunner

from llmrl import load_config, read_run, train
from llmrl.run.checkpoint import list_checkpoints
from llmrl.cli import app
from llmrl.parallel.distributed import init
from llmrl.errors import ConfigError
from llmrl.run.memory import peak_device_mib
from llmrl.tasks import TASKS
from tests.helpers import digits_task, is_timing

SMALL = {"rollout.prompts_per_step": 8, "update.minibatch_size": 4, "eval.size": 8, "eval.every": 0,
         "checkpoint.every": 1, "task": "digits", "lora.r": 4, "lora.alpha": 4, "update.lr_actor": 1e-2,
         "update.lr_critic": 1e-2}


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in read_run(run).metrics]


def _as_if_saved_on_cuda(state_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewrite state.pt with every tensor storage tagged 'cuda:0', byte for byte what torch.save
    writes for tensors living on the first GPU."""
    state = torch.load(state_file, weights_only=True)
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, state_file)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA (a GPU would load the tensors)")
def test_a_checkpoint_saved_on_a_gpu_resumes_on_the_cpu(tiny_model_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "digits", digits_task)
    base = {"model.name": str(tiny_model_dir), **SMALL}
    train(load_config(overrides={**base, "out": str(tmp_path / "full"), "steps": 3}))
    train(load_config(overrides={**base, "out": str(tmp_path / "cut"), "steps": 2}))
    newest = list_checkpoints(tmp_path / "cut")[-1]
    _as_if_saved_on_cuda(newest / "state.pt", monkeypatch)
    with pytest.raises(RuntimeError, match="CUDA"):  # what torch.load without map_location does here
        torch.load(newest / "state.pt", weights_only=True)

    train(load_config(tmp_path / "cut" / "config.yaml", {"out": str(tmp_path / "cut"), "steps": 3}), resume=True)
    assert _rows(tmp_path / "cut") == _rows(tmp_path / "full") and len(_rows(tmp_path / "full")) == 3
    for role in ("actor", "critic"):  # the restored AdamW moments continue the same trajectory, bit for bit
        a = load_file(tmp_path / "full" / "adapters" / role / "adapter_model.safetensors")
        b = load_file(tmp_path / "cut" / "adapters" / role / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role


def test_more_processes_per_node_than_gpus_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2 on a node with one GPU: refused before torch.cuda.set_device(1) fails obscurely."""
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for device in ("cuda", "auto"):
        with pytest.raises(ConfigError, match=r"^Process 1 needs GPU cuda:1 \(one GPU per process on a node\) but "
                                              r"this node has 1; start at most that many processes per node, "
                                              r"or set model.device=cpu\.$"):
            init(device, 5.0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_one_sentence(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r"),
                                      "--steps", "1", "--set", "model.device=cuda"])
    assert result.exit_code == 2, result.stderr
    assert result.stderr.strip() == "error: 'model.device' is cuda but no CUDA device is available; use cpu or auto."
    evaluated = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dir), "--device", "cuda"])
    assert evaluated.exit_code == 2 and "no CUDA device is available" in evaluated.stderr
    assert "Traceback" not in result.stderr + evaluated.stderr


def test_a_cpu_run_reports_no_gpu_memory() -> None:
    assert peak_device_mib("cpu") is None
