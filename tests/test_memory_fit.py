"""A run that cannot hold its parts at once is refused before its first step (run/preflight.check_memory):
the base as held, adapters, value head, AdamW state, the `hf` engine's copies while it generates, and one
step's KV cache and logits. The memory is the one thing set here (`--max-memory`, the run's budget); the
model, stack, engine and their sizes are real, and the run goes through the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.models.tokenizer import build_char_tokenizer
from tests.helpers import CLI_SMALL, cli_refused, cli_run

HIDDEN, MLP, LAYERS = 256, 512, 2  # hidden size ≥ 256: the engine packs (and merges) the linear layers


@pytest.fixture(scope="module")
def packable_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=MLP, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    path = tmp_path_factory.mktemp("packable")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _base_bytes(path: Path) -> int:
    """The base's float32 bytes, counted from the model itself."""
    return 4 * sum(p.numel() for p in LlamaForCausalLM.from_pretrained(path).parameters())


# The actor's LoRA (r=16 on every linear layer, llmrl's default): per layer q 16·256 + 256·16, k and v
# 16·256 + 128·16 each, o 16·256 + 256·16, gate and up 16·256 + 512·16 each, down 16·512 + 256·16:
# 65,536 numbers, 2 layers 131,072, 0.5 MiB in float32; AdamW holds 2 more of it. GRPO has no critic.
LORA_BYTES = 4 * 2 * 65_536


def test_a_run_whose_engine_copies_do_not_fit_is_refused_and_fits_without_them(
        packable_model: Path, tmp_path: Path) -> None:
    # the limit: the base, the adapter and its AdamW state, and 0.5 MiB for the KV cache and logits (16 rows
    # × (2·2 layers·5 positions·2 heads·64·4 B + V·4 B) ≈ 0.17 MiB); the engine's merged, packed copy of the
    # linear layers (at least their 4.5 MiB of float32 weights) does not fit beside them
    limit = _base_bytes(packable_model) + 3 * LORA_BYTES + 2**19
    args = ["train", "--model", str(packable_model), "--algo", "grpo", "--steps", "1", *CLI_SMALL,
            "--set", "rollout.max_new_tokens=4", "--set", "model.dtype=float32", "--max-memory", str(limit)]
    err = cli_refused([*args, "--out", str(tmp_path / "a")], "This run holds at least ")
    assert "hf engine: prepacked linear weights, the actor's LoRA merged in (while generating) 4." in err, err
    assert f"more than the {limit / 2**20:,.1f} MiB of --max-memory: engine.pack_weights=false and " \
           "engine.merge_lora=false drop the engine's 4." in err, err
    assert "model.quantize=nf4 holds the base's linear layers in 4 bits" in err
    assert not (tmp_path / "a" / "config.yaml").exists()  # refused before the run folder was written to
    code, out, err = cli_run([*args, "--out", str(tmp_path / "b"), "--set", "engine.pack_weights=false",
                              "--set", "engine.merge_lora=false"])
    assert code == 0, err[-2000:]
    assert (tmp_path / "b" / "metrics.jsonl").read_text().count("\n") == 1


def _tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    """A /proc/self/cgroup and a /sys/fs/cgroup tree of real files under tmp_path."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        (tmp_path / "sys" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys" / rel).write_text(text)
    return str(tmp_path / "cgroup"), str(tmp_path / "sys")


def test_the_memory_cgroups_limit_is_the_machines_memory(tmp_path: Path) -> None:
    """A container's limit bounds what llmrl counts as the CPU's memory: cgroup v2's memory.max, v1's
    memory.limit_in_bytes, the smallest of the cgroup and its ancestors; 'max' and v1's near-2^63
    'unlimited' are no limit."""
    from llmrl.models.load import cgroup_memory_limit

    v2 = _tree(tmp_path / "a", "0::/user/job\n", {"user/job/memory.max": "max\n", "user/memory.max": "8589934592\n",
                                                 "memory.max": "max\n"})
    assert cgroup_memory_limit(*v2) == 8 * 2**30  # the parent's 8 GiB
    v1 = _tree(tmp_path / "b", "9:name=systemd:/\n4:memory:/process_api/x\n0::/\n",
               {"memory/process_api/x/memory.limit_in_bytes": "12884901888\n",
                "memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert cgroup_memory_limit(*v1) == 12 * 2**30
    none = _tree(tmp_path / "c", "4:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n"})
    assert cgroup_memory_limit(*none) is None
    assert cgroup_memory_limit(str(tmp_path / "missing"), str(tmp_path)) is None
    bad = _tree(tmp_path / "d", "garbage\n::\n4:memory:/x\n", {"memory/x/memory.limit_in_bytes": "-5\n"})
    assert cgroup_memory_limit(*bad) is None  # a line of no cgroup, a limit that is no number: no limit, no error
    (tmp_path / "d" / "sys" / "memory" / "x" / "memory.limit_in_bytes").write_bytes(b"\xff\xfe")
    (tmp_path / "d" / "cgroup").write_bytes(b"\xff\x00\n4:memory:/x\n")
    assert cgroup_memory_limit(*bad) is None  # bytes that are no text
