"""A .gguf file converted one tensor at a time (models/gguf_stream.py) is the folder transformers' own
GGUF loading then save_pretrained writes, byte for byte, in every quantisation type the catalogue's
files use (Q4_1, Q4_K, Q6_K, Q8_0, F32, and F16, BF16, Q5_0, Q5_K besides), for a Llama (q/k rows
permuted back) and a Qwen2 (biases, tied embedding); and the conversion does not hold the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmrl.errors import ConfigError
from llmrl.models.gguf import plain_copy
from tests.gguf_writer import MIXED, write_mixed_gguf

ROOT = Path(__file__).resolve().parents[1]


def _transformers_copy(src: Path, out: Path) -> dict[str, torch.Tensor]:
    """What transformers makes of `src`: its GGUF loading, the model rebuilt without the GGUF
    quantisation mark, save_pretrained (llmrl's conversion before it streamed); the loaded state dict."""
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(loaded.config, attr):
            delattr(loaded.config, attr)
    plain = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return loaded.state_dict()


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen2", True)])
def test_streamed_copy_is_transformers_copy_byte_for_byte(tmp_path: Path, arch: str, tied: bool) -> None:
    src = write_mixed_gguf(tmp_path / f"{arch}.gguf", arch, tied=tied)
    streamed = plain_copy(src, tmp_path / "streamed")
    state = _transformers_copy(src, tmp_path / "transformers")
    names = sorted(p.name for p in (tmp_path / "transformers").iterdir())
    assert sorted(p.name for p in streamed.iterdir()) == names
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(names)
    for name in names:
        assert (streamed / name).read_bytes() == (tmp_path / "transformers" / name).read_bytes(), name
    with safe_open(str(streamed / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert ("lm_head.weight" in keys) is not tied
        assert keys == set(state) - ({"lm_head.weight"} if tied else set())
        for key in keys:
            assert torch.equal(f.get_tensor(key), state[key]), key
    assert json.loads((streamed / "config.json").read_text())["tie_word_embeddings"] is tied


def test_a_weight_missing_from_the_file_is_one_sentence(tmp_path: Path) -> None:
    src = write_mixed_gguf(tmp_path / "m.gguf", types={**MIXED, "ffn_up": None})
    with pytest.raises(ConfigError, match=r"Cannot load model '.*m\.gguf' as a causal LM: the file has no tensor "
                                          r"for its weight model\.layers\.0\.mlp\.up_proj\.weight \(2 missing\)\."):
        plain_copy(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]  # no folder, no temporary folder


PEAK = """
import resource, sys
from pathlib import Path
from llmrl.models.gguf import plain_copy
plain_copy(Path(sys.argv[1]), Path(sys.argv[2]) / "warm")  # transformers' lazy imports, the tokenizer's
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
plain_copy(Path(sys.argv[3]), Path(sys.argv[2]) / "out")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_the_conversion_does_not_hold_the_model(tmp_path: Path) -> None:
    """Loading whole held the model's float32 weights twice (the loaded model and the plain rebuild:
    the peak grew by 300 MiB here); streamed, it grows by about one tensor (9 MiB here) and a chunk,
    not by the 151 MB model."""
    warm = write_mixed_gguf(tmp_path / "warm.gguf", layers=1)
    src = write_mixed_gguf(tmp_path / "m.gguf", layers=4, hidden=768, ffn=3072, heads=8, kv_heads=8)
    done = subprocess.run([sys.executable, "-c", PEAK, str(warm), str(tmp_path), str(src)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    grown, model = int(done.stdout.split()[-1]), (tmp_path / "out" / "model.safetensors").stat().st_size
    assert model > 150e6
    assert grown < model / 3, f"the peak grew by {grown / 2**20:.0f} MiB converting a {model / 2**20:.0f} MiB model"
