"""Write a Hugging Face Llama as a llama.cpp GGUF file (float32), the way convert_hf_to_gguf does:
llama.cpp tensor names, q/k rows permuted for its rotary layout, a byte-level ('gpt2') vocabulary
without merges (each character one token), as SmolLM2's GGUF does for its own BPE vocabulary; and
`write_mixed_gguf`: a random Llama or Qwen2 in the quantisation types of real files (Q4_K, Q6_K, …)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's rotary layout for q/k rows (transformers' GGUF loader reverses it)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> Path:
    cfg = model.config
    writer = GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    specials = set(tokenizer.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([tok for tok, _ in vocab])
    writer.add_token_types([TokenType.CONTROL if tok in specials else TokenType.NORMAL for tok, _ in vocab])
    writer.add_token_scores([0.0] * len(vocab))  # no merges: single characters stay single tokens
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    for name, tensor in model.state_dict().items():
        w = tensor.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            writer.add_tensor("token_embd.weight", w)
        elif name == "model.norm.weight":
            writer.add_tensor("output_norm.weight", w)
        elif name == "lm_head.weight":
            writer.add_tensor("output.weight", w)
        else:
            _, _, layer, rest = name.split(".", 3)
            module = rest.rsplit(".", 1)[0]
            if module == "self_attn.q_proj":
                w = _permute(w, cfg.num_attention_heads)
            elif module == "self_attn.k_proj":
                w = _permute(w, cfg.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{NAMES[module]}.weight", w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---- a GGUF in the quantisation types real files use (models/gguf_stream.py's tests) --------------

Q = GGMLQuantizationType
# per llama.cpp tensor kind: its type (K types need an input dimension that is a multiple of 256)
MIXED = {"token_embd": Q.Q4_1, "attn_q": Q.Q8_0, "attn_k": Q.Q5_0, "attn_v": Q.F16, "attn_output": Q.BF16,
         "ffn_gate": Q.Q4_K, "ffn_up": Q.Q5_K, "ffn_down": Q.Q6_K, "output": Q.Q6_K}
_SCALES_AT = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}  # byte offsets of a K block's float16 scales


def byte_symbols() -> list[str]:
    """GPT-2's byte → printable-character table (the base vocabulary of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:] + [256 + n for n in range(256 - len(bs))]
    return [chr(c) for c in cs]


def _encoded(rng: np.random.Generator, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> np.ndarray:
    """Random weights of `shape` in `qtype`: quantised by gguf where it can, else (K types, which gguf
    only de-quantises) random blocks with small float16 scales."""
    if qtype in _SCALES_AT:
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (*shape[:-1], shape[-1] // block, size), dtype=np.uint8)
        for at in _SCALES_AT[qtype]:
            raw[..., at : at + 2] = rng.uniform(1e-3, 2e-2, raw.shape[:-1] + (1,)).astype(np.float16).view(np.uint8)
        return raw.reshape(*shape[:-1], -1)
    w = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    return w if qtype == Q.F32 else quantize(w, qtype)


def write_mixed_gguf(path: Path, arch: str = "llama", layers: int = 2, hidden: int = 256, ffn: int = 512,
                     heads: int = 4, kv_heads: int = 2, tied: bool = False,
                     types: dict[str, GGMLQuantizationType | None] = MIXED, seed: int = 0) -> Path:
    """A random `arch` ('llama' or 'qwen2': q/k/v biases) model as llama.cpp writes it, each tensor
    kind in its `types` entry (norms and biases float32; a kind typed None is left out of the file);
    no output.weight when `tied`; a byte-level
    BPE vocabulary with one merge and a chat template."""
    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_symbols(), "Ġt"]
    w = GGUFWriter(str(path), arch)
    for add, value in ((w.add_block_count, layers), (w.add_context_length, 128), (w.add_embedding_length, hidden),
                       (w.add_feed_forward_length, ffn), (w.add_head_count, heads), (w.add_head_count_kv, kv_heads),
                       (w.add_rope_freq_base, 10000.0), (w.add_layer_norm_rms_eps, 1e-6),
                       (w.add_rope_dimension_count, hidden // heads), (w.add_vocab_size, len(tokens))):
        add(value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(tokens) - 3))
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    kv = hidden // heads * kv_heads

    def put(name: str, kind: str, *shape: int) -> None:
        qtype = types.get(kind, Q.F32)
        if qtype is not None:
            w.add_tensor(name, _encoded(rng, shape, qtype), raw_dtype=qtype)

    put("token_embd.weight", "token_embd", len(tokens), hidden)
    for i in range(layers):
        b = f"blk.{i}"
        put(f"{b}.attn_norm.weight", "norm", hidden)
        for kind, rows in (("attn_q", hidden), ("attn_k", kv), ("attn_v", kv)):
            put(f"{b}.{kind}.weight", kind, rows, hidden)
            if arch == "qwen2":
                put(f"{b}.{kind}.bias", "bias", rows)
        put(f"{b}.attn_output.weight", "attn_output", hidden, hidden)
        put(f"{b}.ffn_norm.weight", "norm", hidden)
        put(f"{b}.ffn_gate.weight", "ffn_gate", ffn, hidden)
        put(f"{b}.ffn_up.weight", "ffn_up", ffn, hidden)
        put(f"{b}.ffn_down.weight", "ffn_down", hidden, ffn)
    put("output_norm.weight", "norm", hidden)
    if not tied:
        put("output.weight", "output", len(tokens), hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
