"""What the plan knows of a model before loading it: config.json and the checkpoint's tensor headers.

No weight is read: `safetensors.safe_open` reads each file's JSON header (names, dtypes, shapes), and
transformers' `AutoConfig` reads config.json. From them:

    linears      (leaf name, in, out) of every 2-D weight inside the decoder's layers (q_proj, …, down_proj);
                 without safetensors files (a hub id, .bin weights), from config.json as a Llama-shaped
                 decoder: q (H → n_h·d), k, v (H → n_kv·d), o (n_h·d → H), gate, up (H → I), down (I → H)
    other        numbers outside them: the embedding V·H, an untied LM head V·H, norms, biases
    file_bytes   the checkpoint's bytes on disk (its dtype, whatever model.dtype the run loads it in)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_MARK = ".layers."  # transformers' decoders keep their blocks under model.layers.<i>.


@dataclass(frozen=True)
class ModelShape:
    """A decoder's sizes: L layers, hidden H, intermediate I, attention heads n_h, KV heads n_kv of d_head,
    vocabulary V; `linears` one layer's (leaf, in, out) linear weights; `other` numbers outside them."""
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linears: tuple[tuple[str, int, int], ...]
    other: int
    file_bytes: int
    tied: bool

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def linear_numbers(self) -> int:
        """Σ in·out over every decoder layer's linear weights (L · one layer's)."""
        return self.layers * sum(i * o for _, i, o in self.linears)

    @property
    def numbers(self) -> int:
        return self.linear_numbers + self.other


def _llama_linears(t: Any, hidden: int, inter: int, q: int, kv: int) -> tuple[tuple[str, int, int], ...]:
    return (("q_proj", hidden, q), ("k_proj", hidden, kv), ("v_proj", hidden, kv), ("o_proj", q, hidden),
            ("gate_proj", hidden, inter), ("up_proj", hidden, inter), ("down_proj", inter, hidden))


def _headers(folder: Path) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor in the folder's safetensors files, read from their headers."""
    from safetensors import safe_open

    out = []
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out += [(k, tuple(st.get_slice(k).get_shape())) for k in st.keys()]
    return out


def _first_layer(headers: list[tuple[str, tuple[int, ...]]]) -> tuple[tuple[str, int, int], ...]:
    """One layer's (leaf, in, out) 2-D weights: layer 0's, named by their module's leaf."""
    found = []
    for name, shape in headers:
        head, mark, tail = name.partition(LAYER_MARK)
        index, _, rest = tail.partition(".")
        if mark and index == "0" and len(shape) == 2 and rest.endswith(".weight"):
            found.append((rest.removesuffix(".weight").rsplit(".", 1)[-1], shape[1], shape[0]))
    return tuple(found)


def read_shape(source: str, trust_remote_code: bool = False) -> ModelShape:
    """The ModelShape of the model folder (or hub id) `source`: config.json, and the safetensors headers where
    the folder has them (module docstring). Reads no weight."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    t = config.get_text_config()
    hidden = int(getattr(t, "hidden_size", 0) or 0)
    heads = int(getattr(t, "num_attention_heads", 1) or 1)
    kv_heads = int(getattr(t, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(t, "head_dim", None) or hidden // heads)
    inter = int(getattr(t, "intermediate_size", 0) or 4 * hidden)
    layers, vocab = int(getattr(t, "num_hidden_layers", 1) or 1), int(getattr(t, "vocab_size", 1) or 1)
    tied = bool(getattr(config, "tie_word_embeddings", getattr(t, "tie_word_embeddings", True)))
    folder = Path(source)
    headers = _headers(folder) if folder.is_dir() else []
    linears = _first_layer(headers) or _llama_linears(t, hidden, inter, heads * head_dim, kv_heads * head_dim)
    per_layer = sum(i * o for _, i, o in linears)
    if headers:
        total = sum(math.prod(s) for _, s in headers)
        other = total - layers * per_layer
        file_bytes = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    else:
        other = vocab * hidden * (1 if tied else 2) + (2 * layers + 1) * hidden
        file_bytes = 4 * (layers * per_layer + other)
    return ModelShape(layers, hidden, inter, heads, kv_heads, head_dim, vocab, linears, max(other, 0), file_bytes,
                      tied)
