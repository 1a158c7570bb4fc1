"""What `--engine vllm` refuses, each before the run folder is made: one sentence, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def refused(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "llmrl", "train", "--engine", "vllm", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()
    return done.stderr.strip()


def test_a_head_size_without_cpu_kernels(tiny_model_dir: Path, tmp_path: Path) -> None:
    # the random test model: hidden 32 over 4 heads = head size 8
    assert refused(["--model", str(tiny_model_dir)], tmp_path) == (
        "error: vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512, and this "
        "model's is 8: use rollout.engine=hf for it.")


def test_sleep_on_the_cpu(tmp_path: Path) -> None:
    assert refused(["--set", "engine.sleep=true"], tmp_path) == (
        "error: 'engine.sleep' frees GPU memory during the update; it needs a CUDA device.")


def test_an_adapter_sync_cannot_carry_trained_norms(tmp_path: Path) -> None:
    assert refused(["--set", "engine.sync=adapter", "--set", "lora.modules_to_save=[norm]"], tmp_path) == (
        "error: engine.sync=adapter serves the LoRA adapter alone; it cannot carry lora.modules_to_save (norm): use "
        "engine.sync=merged.")


def test_a_vllm_that_fails_to_import(tmp_path: Path) -> None:
    broken = tmp_path / "site" / "vllm"
    broken.mkdir(parents=True)  # what a CUDA torchvision beside the CPU torch does to `import vllm`
    (broken / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    assert refused([], tmp_path, env={"PYTHONPATH": f"{broken.parent}{os.pathsep}{ROOT}"}) == (
        "error: vLLM is installed but fails to import (operator torchvision::nms does not exist); on the CPU, "
        "`pip uninstall -y torchvision torchaudio torchcodec` removes the usual cause.")
