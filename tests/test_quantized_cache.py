"""The 4-bit base quantised once (models/quantized_cache.py) and no view of a memory-mapped checkpoint
left after loading it (quantized.release_checkpoint): real bitsandbytes nf4 layers on the CPU under a
random Qwen2-architecture model saved in-process (tests/qwen2_tiny.py)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from llmrl.config.schema import ModelConfig
from llmrl.models.load import load_base
from llmrl.models import quantized_cache
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
    # only this model's folder and kind were written: no temporary folder left beside it (its lock file
    # and the weight files' remembered digests stay)
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, f".{folder.name}.lock", "digests.json"])


def _edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2))


def test_the_copy_is_keyed_by_kind_dtype_and_the_contents_of_what_it_depends_on(qwen_dir: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))
    base = cache_dir(str(qwen_dir), "nf4", "float32")
    assert cache_dir(str(qwen_dir), "fp4", "float32") != base
    assert cache_dir(str(qwen_dir), "nf4", "bfloat16") != base
    config = qwen_dir / "config.json"
    original = config.read_bytes()
    _edit_json(config, rms_norm_eps=1e-5)  # another model: the norms divide by another epsilon
    edited = cache_dir(str(qwen_dir), "nf4", "float32")
    assert edited != base
    config.write_bytes(original)  # the same bytes again, under a new mtime: the same copy
    assert cache_dir(str(qwen_dir), "nf4", "float32") == base
    weights = qwen_dir / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched, not changed
    assert cache_dir(str(qwen_dir), "nf4", "float32") == base
    _edit_json(qwen_dir / "generation_config.json", eos_token_id=[2, 7])  # the stop tokens' source
    stops = cache_dir(str(qwen_dir), "nf4", "float32")
    assert stops not in (base, edited)
    (qwen_dir / "modeling_custom.py").write_text("# remote code the copy holds a copy of\n")
    assert cache_dir(str(qwen_dir), "nf4", "float32") not in (base, edited, stops)
    assert cache_dir("Qwen/some-hub-id", "nf4", "float32") is None  # no local folder: not cached


def test_another_checkpoint_copied_in_with_the_old_sizes_and_mtimes_is_quantised_afresh(
        qwen_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cp -p` of another checkpoint of the same shape (here: another seed) whose file has the old one's
    mtime: the same size and mtime, other numbers. The stale copy must not be loaded."""
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))
    load_base(_nf4(qwen_dir), show_progress=False)
    stale = cache_dir(str(qwen_dir), "nf4", "float32")
    other = save_qwen2(tmp_path / "other", seed=1)
    expected, _ = load_base(_nf4(other), show_progress=False)  # what quantising the new numbers gives
    weights = qwen_dir / "model.safetensors"
    before = weights.stat()
    shutil.copyfile(other / "model.safetensors", weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = weights.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    model, _ = load_base(_nf4(qwen_dir), show_progress=False)
    assert model.name_or_path == str(qwen_dir)  # quantised from the float checkpoint, not the stale copy
    assert torch.equal(_logits(model), _logits(expected))
    assert (stale / COMPLETE).is_file() and cache_dir(str(qwen_dir), "nf4", "float32") != stale


def test_an_edited_generation_config_reaches_the_next_run(qwen_dir: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy holds its own generation_config.json (the stop tokens llmrl reads): an edit of the float
    folder's must reach the model of the next run."""
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))
    first, _ = load_base(_nf4(qwen_dir), show_progress=False)
    assert first.generation_config.eos_token_id == 2
    _edit_json(qwen_dir / "generation_config.json", eos_token_id=[2, 7])
    again, _ = load_base(_nf4(qwen_dir), show_progress=False)
    assert again.generation_config.eos_token_id == [2, 7]
    third, _ = load_base(_nf4(qwen_dir), show_progress=False)  # and the copy written for it says so too
    assert third.name_or_path != str(qwen_dir) and third.generation_config.eos_token_id == [2, 7]


def test_a_killed_writers_temporary_folders_are_swept_by_the_next_writer(qwen_dir: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed while it wrote the copy leaves `.COPY.tmp-PID-HEX` (up to the copy's size); the next
    run that writes the copy deletes it, as `llmrl models get` does its own (obtain.sweep). One of a
    live process and folders of other names are kept."""
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))
    folder = cache_dir(str(qwen_dir), "nf4", "float32")
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: no process has its pid now (barring reuse within this test)
    dead = folder.parent / f".{folder.name}.tmp-{gone.pid}-0123abcd"
    kept = [folder.parent / f".{folder.name}.tmp-{os.getpid()}-0123abcd", folder.parent / f".other.tmp-{gone.pid}-0123abcd"]
    for leftover in (dead, *kept):
        leftover.mkdir(parents=True)
        (leftover / "model.safetensors").write_bytes(b"\0" * 1000)  # cut short where the kill found it
    load_base(_nf4(qwen_dir), show_progress=False)
    assert (folder / COMPLETE).is_file() and not dead.exists()
    assert all((f / "model.safetensors").is_file() for f in kept)


def _no_free_file_descriptor() -> tuple[int, int]:
    """Lower this process's open-file limit to its lowest free descriptor (the one an open would get),
    so every open fails with EMFILE (a full file table); returns the limits to restore."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.open(os.devnull, os.O_RDONLY)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, limits[1]))
    return limits


@pytest.mark.parametrize("failure", ["transformers refuses a setting", "the file table is full"])
def test_a_failure_that_is_not_the_copys_is_raised_and_the_copy_kept(qwen_dir: Path, tmp_path: Path, failure: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))
    load_base(_nf4(qwen_dir), show_progress=False)
    folder = quantized_cache.cached(str(qwen_dir), "nf4", "float32")
    files = {f.name: f.read_bytes() for f in folder.iterdir()}
    kwargs = {"dtype": torch.float32, "device_map": {"": "cpu"}}
    if failure == "transformers refuses a setting":  # flash-attn is not installed: transformers raises ImportError
        with pytest.raises(ImportError, match="FlashAttention2"):
            quantized_cache.load(folder, attn_implementation="flash_attention_2", **kwargs)
    else:
        limits = _no_free_file_descriptor()
        try:
            with pytest.raises(Exception, match="Too many open files"):
                quantized_cache.load(folder, **kwargs)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == files  # whole, so kept as it was
    model, _ = load_base(_nf4(qwen_dir), show_progress=False)
    assert model.name_or_path == str(folder)


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


def test_the_plan_reads_the_copys_bytes_once_a_run_left_one(qwen_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory plan's loading part (memory/choose.copy_bytes): nothing of its own before the first 4-bit load
    (the float checkpoint's bytes stand), the copy's safetensors bytes after, and 0 for a float run."""
    from llmrl.config import load_config
    from llmrl.memory.choose import copy_bytes

    monkeypatch.setenv("LLMRL_CACHE_DIR", str(tmp_path / "cache"))
    config = load_config(None, {"model.name": str(qwen_dir)}, ["model.dtype=float32", "model.quantize=nf4"])
    assert copy_bytes(config, str(qwen_dir)) == 0
    load_base(_nf4(qwen_dir), show_progress=False)
    folder = quantized_cache.cached(str(qwen_dir), "nf4", "float32")
    assert folder is not None
    written = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert copy_bytes(config, str(qwen_dir)) == written > 0
    assert written < sum(f.stat().st_size for f in qwen_dir.glob("*.safetensors"))  # 4-bit codes, not float32
    float_run = load_config(None, {"model.name": str(qwen_dir)}, ["model.dtype=float32"])
    assert copy_bytes(float_run, str(qwen_dir)) == 0
