"""The 4-bit base quantised once (models/quantized_cache.py) and no view of a memory-mapped checkpoint
left after loading it (quantized.release_checkpoint): real bitsandbytes nf4 layers on the CPU under a
random Qwen2-architecture model saved in-process (tests/qwen2_tiny.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from llmrl.config.schema import ModelConfig
from llmrl.models.load import load_base
from llmrl.models.quantized_cache import COMPLETE, cache_dir
from tests.qwen2_tiny import save_qwen2

bnb = pytest.importorskip("bitsandbytes")  # the test extra installs it: CI runs every test here


@pytest.fixture()
def qwen_dir(tmp_path: Path) -> Path:
    return save_qwen2(tmp_path / "qwen2")


def _nf4(path: Path, dtype: str = "float32") -> ModelConfig:
    return ModelConfig(name=str(path), dtype=dtype, quantize="nf4")


def _logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.tensor([[5, 17, 3, 9, 40, 2, 11], [8, 1, 30, 30, 7, 19, 4]])
    with torch.no_grad():
        return model(ids).logits


def _mapped_ranges(suffix: str = ".safetensors") -> list[tuple[int, int]]:
    """The address ranges of this process's memory mappings of files ending in `suffix` (/proc/self/maps)."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].endswith(suffix):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            out.append((lo, hi))
    return out


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer, and each 4-bit weight's quantization-state tensors."""
    out = list(model.parameters()) + list(model.buffers())
    for p in model.parameters():
        state = getattr(p, "quant_state", None)
        for holder in (state, getattr(state, "state2", None)):
            out += [getattr(holder, a) for a in ("absmax", "code") if isinstance(getattr(holder, a, None), torch.Tensor)]
    return out


def test_the_first_load_writes_the_4_bit_copy_and_the_second_reads_it_with_identical_logits(
        qwen_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))  # a cache of this test's own: nothing else in it
    folder = cache_dir(str(qwen_dir), "nf4", "float32")
    assert folder is not None and not folder.exists()
    first, _ = load_base(_nf4(qwen_dir), show_progress=False)
    assert (folder / COMPLETE).is_file() and (folder / "model.safetensors").is_file()
    assert first.name_or_path == str(qwen_dir)  # quantised from the float checkpoint
    second, _ = load_base(_nf4(qwen_dir), show_progress=False)
    assert second.name_or_path == str(folder)  # loaded from the copy
    assert torch.equal(_logits(first), _logits(second))  # the very codes and scales: the same numbers, exactly
    # only this model's folder and kind were written: no temporary folder left beside it
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_the_copy_is_keyed_by_kind_dtype_and_the_files(qwen_dir: Path) -> None:
    base = cache_dir(str(qwen_dir), "nf4", "float32")
    assert cache_dir(str(qwen_dir), "fp4", "float32") != base
    assert cache_dir(str(qwen_dir), "nf4", "bfloat16") != base
    weights = qwen_dir / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the checkpoint replaced
    assert cache_dir(str(qwen_dir), "nf4", "float32") != base
    assert cache_dir("Qwen/some-hub-id", "nf4", "float32") is None  # no local folder: not cached


def test_an_unwritable_cache_is_said_once_and_the_run_goes_on(qwen_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be\n")
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(blocker))
    model, _ = load_base(_nf4(qwen_dir), show_progress=False)
    err = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("Loading weights")]
    assert len(err) == 1 and "could not be cached" in err[0] and "quantises the float checkpoint again" in err[0]
    assert blocker.read_text() == "a file where the cache folder would be\n"  # nothing of the user's touched
    assert torch.isfinite(_logits(model)).all()


@pytest.mark.parametrize("cached", [False, True])
def test_no_tensor_views_the_memory_mapped_checkpoint_after_loading(qwen_dir: Path, cached: bool) -> None:
    if cached:
        load_base(_nf4(qwen_dir), show_progress=False)  # writes the copy the second load maps
    model, _ = load_base(_nf4(qwen_dir), show_progress=False)
    ranges = _mapped_ranges()
    inside = [t.shape for t in _tensors(model) if any(lo <= t.data_ptr() < hi for lo, hi in ranges)]
    assert inside == []
    # the embedding and LM head (float, unquantized) are what transformers left as views before the copy
    assert model.get_input_embeddings().weight.dtype == torch.float32


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty config"])
def test_a_damaged_copy_is_said_once_deleted_and_quantised_again(qwen_dir: Path, tmp_path: Path, damage: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))
    first, _ = load_base(_nf4(qwen_dir), show_progress=False)
    folder = cache_dir(str(qwen_dir), "nf4", "float32")
    weights = folder / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00not a safetensors file" * 100)
    else:
        (folder / "config.json").write_text("")
    capsys.readouterr()
    again, _ = load_base(_nf4(qwen_dir), show_progress=False)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("llmrl:")]
    assert len(err) == 1 and "cannot be read" in err[0] and "quantising the float checkpoint again" in err[0]
    assert again.name_or_path == str(qwen_dir)  # quantised afresh from the float checkpoint
    assert torch.equal(_logits(first), _logits(again))
    assert (folder / COMPLETE).is_file()  # and written again, whole
    third, _ = load_base(_nf4(qwen_dir), show_progress=False)
    assert third.name_or_path == str(folder)
