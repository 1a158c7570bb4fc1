"""A run that cannot hold its parts at once is refused before its first step (run/preflight.check_memory, and
before loading the plan, llmrl/memory/choose.py):
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


def test_engine_copies_that_do_not_fit_are_turned_off_before_loading(packable_model: Path, tmp_path: Path) -> None:
    """Since issue 68 the plan made before loading decides (llmrl/memory/choose.py): a budget below what the run
    holds at all is refused before the run folder is written, in one sentence naming the smallest that holds
    it; a budget the engine's packed copies (4.5 MiB of float32 linear weights) alone exceed turns them off,
    the cheapest choice, unless the user set them, who is told it may not fit."""
    from llmrl.config import load_config
    from llmrl.memory.budget import Budget
    from llmrl.memory.choose import choose_settings, line
    from llmrl.memory.plan import plan_run
    from llmrl.memory.shape import read_shape

    limit = _base_bytes(packable_model) + 3 * LORA_BYTES + 2**19
    args = ["train", "--model", str(packable_model), "--algo", "grpo", "--steps", "1", *CLI_SMALL,
            "--set", "rollout.max_new_tokens=4", "--set", "model.dtype=float32", "--max-memory", str(limit)]
    err = cli_refused([*args, "--out", str(tmp_path / "a")], f"This run cannot fit in {limit / 2**20:,.1f} MiB "
                      "(--max-memory) even with micro-batches of one row, evaluation one row at a time, the engine's "
                      "float copies off")
    assert "the smallest budget that holds it is " in err
    assert not (tmp_path / "a" / "config.yaml").exists()  # refused before the run folder was written to
    sets = ["rollout.prompts_per_step=4", "update.minibatch_size=4", "eval.size=2", "rollout.max_new_tokens=4",
            "model.dtype=float32"]
    shape = read_shape(str(packable_model))
    plans = lambda budget: lambda c: plan_run(c, Budget(budget, "--max-memory"), shape=shape,  # noqa: E731
                                              prompt_tokens=8, baseline=0)
    config = load_config(None, {"model.name": str(packable_model), "algo": "grpo"}, sets)
    with_copies = plans(2**40)(config)
    assert with_copies.peak_phase == "generate" and "hf engine: packed linear weights" in str(with_copies.phases)
    budget = with_copies.peak_bytes - 2**20  # the copies are 4.5 MiB: without them it fits
    choice = choose_settings(config, plans(budget), "--max-memory")
    assert choice.chosen == (("engine.pack_weights", False), ("engine.merge_lora", False)) and choice.fits
    assert "with engine.pack_weights=false and engine.merge_lora=false (≈ 1.12× the seconds of a step)" in line(choice)
    own = load_config(None, {"model.name": str(packable_model), "algo": "grpo"},
                      [*sets, "engine.pack_weights=true", "engine.merge_lora=true"])
    kept = choose_settings(own, plans(budget), "--max-memory")
    assert kept.config.engine.pack_weights and not kept.fits and "may not fit in memory with the settings given " \
        "(engine.merge_lora=true and engine.pack_weights=true)" in line(kept)


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
