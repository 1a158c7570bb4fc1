"""A .gguf model: loaded through transformers' GGUF support, cached once as a plain safetensors copy
that gives the same logits, and trainable with its chat template (a tiny GGUF written here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.errors import ConfigError
from llmrl.models.gguf import cached_copy_dir, plain_copy

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>{% endif %}")


def _byte_symbols() -> list[str]:
    """GPT-2's byte → printable-character table (the base vocabulary of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 32, 64 positions) with a byte-level BPE tokenizer and a chat template."""
    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_symbols(), "Ġt"]
    v, h, f, layers, heads, kv = len(tokens), 32, 64, 2, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(h)
    w.add_feed_forward_length(f)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(v)
    w.add_rope_dimension_count(h // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (v - 3))
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    t = lambda *shape: (rng.standard_normal(shape) * 0.1).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", t(v, h))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", t(h, h))
        w.add_tensor(f"blk.{i}.attn_k.weight", t(h // heads * kv, h))
        w.add_tensor(f"blk.{i}.attn_v.weight", t(h // heads * kv, h))
        w.add_tensor(f"blk.{i}.attn_output.weight", t(h, h))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(f, h))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(f, h))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(h, f))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    w.add_tensor("output.weight", t(v, h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_plain_copy_has_the_same_logits_and_is_built_once(tiny_gguf: Path, tmp_path: Path) -> None:
    out = plain_copy(tiny_gguf, tmp_path / "plain")
    direct = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).eval()
    copy = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == TEMPLATE and tok.eos_token == "<|im_end|>"
    ids = torch.tensor([tok("1+2=3 tt").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(copy(ids).logits, direct(ids).logits, atol=1e-6, rtol=0)
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert plain_copy(tiny_gguf, tmp_path / "plain") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_missing_gguf_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Model file '.*nothing.gguf' does not exist."):
        plain_copy(tmp_path / "nothing.gguf")


def test_train_a_gguf_chat_model_on_a_dataset(tiny_gguf: Path, tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(10)))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "--model", str(tiny_gguf), "--dataset", str(data), "--reward", "numeric", "--algo", "grpo",
        "--steps", "1", "--out", str(out), "--set", "rollout.prompts_per_step=2", "--set", "update.minibatch_size=4",
        "--set", "rollout.max_new_tokens=4", "--set", "eval.size=2"])
    assert result.exit_code == 0, result.stderr
    assert cached_copy_dir(tiny_gguf).is_dir()  # under $LLMRL_CACHE_DIR (a temp folder in tests)
    assert Path(os.environ["LLMRL_CACHE_DIR"]) in cached_copy_dir(tiny_gguf).parents
    assert json.loads((out / "summary.json").read_text())["steps"] == 1
