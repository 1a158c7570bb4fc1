"""A model of a real model's shape with random weights, for timing runs on a machine that cannot
download one (the GPU machine reaches no hub and takes at most 64 MiB of files along).

Step time and memory depend on the shapes (layers, widths, heads, vocabulary, tokens per row), not on
the values of the weights; a random model differs in one way that matters: it almost never samples
EOS, so every completion runs to `max_new_tokens` (the same for every contender of a side-by-side
run). The tokenizer is SmolLM2's (49152 tokens, with its chat template), saved beside this machine's
cached SmolLM2 copy; the shapes keep their model's layers and replace only the vocabulary, whose
size is the tokenizer's:

| shape | layers × hidden | heads (kv) | MLP | parameters with the 49152 vocabulary |
|---|---|---|---|---|
| qwen2.5-0.5b | 24 × 896 | 14 (2) | 4864 | 0.40 B (Qwen2.5-0.5B: 0.49 B with its 151936) |
| qwen2.5-1.5b | 28 × 1536 | 12 (2) | 8960 | 1.39 B (Qwen2.5-1.5B: 1.54 B with its 151936) |
| qwen2.5-7b | 28 × 3584 | 28 (4) | 18944 | 7.62 B with Qwen2.5's 151936 (`--stream`, the Qwen tokenizer) |
| tiny | 2 × 64 | 4 (2) | 128 | 3.2 M: checks the script itself on a CPU |

`build --stream` never holds the model: it makes the (meta-device) model only to read its parameter names
and shapes, then draws and writes one decoder layer's tensors at a time into its own safetensors shard
(N(0, 0.02²) like transformers' initialisation, norms 1, biases 0) with an index, so a 7B model's 30 GB of
float32 never exist at once (peak ≈ the largest layer); the vocabulary is `--vocab` (default: the
tokenizer's `len`), e.g. Qwen2.5's own 151936 with the 1.5B model's tokenizer:

    python bench/gpu_model.py build --stream --shape qwen2.5-7b --vocab 151936 \
        --tokenizer ~/.cache/llmrl/models/qwen2.5-coder-1.5b-instruct --out /tmp/qwen7b-shape

    python bench/gpu_model.py tokenizer --model ~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-629336b87325 \\
        --out .gpu/tokenizer                      # here, once: the files the GPU machine needs
    python bench/gpu_model.py build --shape qwen2.5-1.5b --tokenizer .gpu/tokenizer --out /tmp/qwen-1.5b \\
        [--device cuda] [--dtype bfloat16]         # there: a loadable model folder (config, weights, tokenizer)
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any

# Qwen2 configuration fields of each shape (from the released models' config.json), vocabulary aside
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768,
                         tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768,
                       tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rope_theta=1e4, rms_norm_eps=1e-6, max_position_embeddings=2048,
                 tie_word_embeddings=True),
}


def save_tokenizer(model: str, out: Path) -> Path:
    """The tokenizer files of `model` (a local folder) in `out`: a few MiB, no weights."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.save_pretrained(out)
    return out


def build(shape: str, tokenizer: Path, out: Path, *, device: str = "cpu", dtype: str = "bfloat16",
          seed: int = 0) -> dict[str, Any]:
    """A Qwen2 causal LM of `shape` with random weights (transformers' own initialisation, on `device`),
    saved in `dtype` with the tokenizer to `out`. Returns what was built."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer)
    config = Qwen2Config(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **SHAPES[shape])
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.device(device):
        lm = Qwen2ForCausalLM(config)
    lm.to(getattr(torch, dtype)).save_pretrained(out)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in lm.parameters())
    return {"shape": shape, "params": params, "vocab": len(tok), "dtype": dtype, "out": str(out),
            "seconds": time.perf_counter() - t0}


def build_streamed(shape: str, tokenizer: Path, out: Path, *, dtype: str = "bfloat16", vocab: int | None = None,
                   seed: int = 0) -> dict[str, Any]:
    """A Qwen2 causal LM of `shape` with random weights written shard by shard (the module docstring):
    one safetensors file per decoder layer plus one for the rest, and model.safetensors.index.json."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer)
    config = Qwen2Config(vocab_size=vocab or len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **SHAPES[shape])
    config.dtype = dtype
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Qwen2ForCausalLM(config).state_dict().items()
                  if not (k == "lm_head.weight" and config.tie_word_embeddings)}  # a tied head is the embedding
    groups: dict[str, list[str]] = {}
    for name in shapes:
        part = name.split(".")
        groups.setdefault(f"layer-{int(part[2]):03d}" if part[:2] == ["model", "layers"] else "rest", []).append(name)
    out.mkdir(parents=True, exist_ok=True)
    gen, t0, weight_map = torch.Generator().manual_seed(seed), time.perf_counter(), {}
    for i, (group, names) in enumerate(sorted(groups.items())):
        tensors = {}
        for name in names:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shapes[name], dtype=getattr(torch, dtype))
            elif name.endswith(".bias"):
                tensors[name] = torch.zeros(shapes[name], dtype=getattr(torch, dtype))
            else:
                tensors[name] = (torch.randn(shapes[name], generator=gen) * 0.02).to(getattr(torch, dtype))
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in names})
        del tensors
    total = sum(math.prod(s) for s in shapes.values())
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total * torch.finfo(getattr(torch, dtype)).bits // 8}, "weight_map": weight_map}))
    config.save_pretrained(out)
    tok.save_pretrained(out)
    return {"shape": shape, "params": total, "vocab": config.vocab_size, "dtype": dtype, "out": str(out),
            "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="save a local model's tokenizer files")
    t.add_argument("--model", default="~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-629336b87325")
    t.add_argument("--out", default=".gpu/tokenizer")
    b = sub.add_parser("build", help="build and save a random-weight model of a shape")
    b.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    b.add_argument("--tokenizer", default=".gpu/tokenizer")
    b.add_argument("--out", required=True)
    b.add_argument("--device", default="cpu", help="where the weights are initialised (cuda is much faster)")
    b.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="dtype of the saved weights")
    b.add_argument("--stream", action="store_true", help="write one layer at a time, never the whole model (7B on a CPU)")
    b.add_argument("--vocab", type=int, default=None, help="with --stream: the vocabulary size (default: the tokenizer's)")
    a = ap.parse_args()
    if a.cmd == "tokenizer":
        print(f"saved tokenizer to {save_tokenizer(os.path.expanduser(a.model), Path(a.out))}")
        return
    info = (build_streamed(a.shape, Path(os.path.expanduser(a.tokenizer)), Path(a.out), dtype=a.dtype, vocab=a.vocab)
            if a.stream else build(a.shape, Path(a.tokenizer), Path(a.out), device=a.device, dtype=a.dtype))
    print(f"built {info['shape']}: {info['params'] / 1e9:.3f} B parameters, vocabulary {info['vocab']}, "
          f"{info['dtype']}, {info['seconds']:.1f} s → {info['out']}")


if __name__ == "__main__":
    main()
