"""A random Qwen2-architecture model of a few layers, built in-process (no download): what
Qwen2.5-Coder-0.5B-Instruct has that the Llama test models lack: biases on q, k and v, an LM head
of its own (not tied to the embedding) and a vocabulary far larger than the hidden size.

The tokenizer is the built-in character tokenizer widened with filler tokens `<f0>`, `<f1>`, … to
the model's vocabulary, so every id a random model samples decodes to text."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from llmrl.config.schema import LoraConfig
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import ALPHABET, SPECIALS

VOCAB = 4096  # 32 × the hidden size: the head's product dominates, as at Qwen's 151,936 × 896
HIDDEN = 128  # heads of 32: vLLM's CPU kernels take no smaller head


def qwen2_tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    """The char tokenizer's ids 0..20, then fillers up to `vocab` ids."""
    chars = SPECIALS + ALPHABET
    table = {tok: i for i, tok in enumerate(chars + [f"<f{i}>" for i in range(vocab - len(chars))])}
    core = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", padding_side="left")


def make_qwen2(seed: int = 0, vocab: int = VOCAB, dtype: torch.dtype = torch.float32) -> Qwen2ForCausalLM:
    """2 layers, 4 query heads and 2 key/value heads of 32, biases on q/k/v, an untied head."""
    tok = qwen2_tokenizer(vocab)
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=256, max_position_embeddings=128,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():  # transformers zero-initialises biases: give q/k/v's real values to carry
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(std=0.5)
    return model


def save_qwen2(path: Path, seed: int = 0) -> Path:
    """The model and its tokenizer in `path`, loadable by `--model path`."""
    make_qwen2(seed).save_pretrained(path)
    qwen2_tokenizer().save_pretrained(path)
    return path


def actor_critic_stack(dtype: torch.dtype = torch.float32, **kwargs: object) -> PolicyStack:
    """A PolicyStack with actor and critic (LoRA r=4 on every linear layer) on `make_qwen2(dtype=dtype)`,
    every LoRA B ~ N(0, 0.2²) (seed 1), so that actor, critic and reference differ; `kwargs` go to
    PolicyStack (e.g. length_buckets=True)."""
    stack = PolicyStack(make_qwen2(dtype=dtype), LoraConfig(r=4, alpha=8.0), with_critic=True, **kwargs)
    torch.manual_seed(1)
    with torch.no_grad():  # LoRA B starts at zero
        for name, p in stack.peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    return stack
