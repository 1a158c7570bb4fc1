"""A Qwen2-architecture model end to end (tests/qwen2_tiny.py: biases on q/k/v, an untied LM head,
a vocabulary 32× the hidden size): training with chunked log-probs, the engine's merged decode, and
`llmrl export` to a folder plain transformers loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from llmrl import load_config, train
from llmrl.config.schema import LoraConfig
from llmrl.engines.base import GenerationRequest, SamplingSettings, row_keys
from llmrl.engines.hf import HFEngine
from llmrl.export import export_run
from llmrl.models.merged import mergeable
from llmrl.models.stack import PolicyStack
from llmrl.run.actor import load_actor
from llmrl.tasks import TASKS

from tests.helpers import digits_task, is_timing
from tests.qwen2_tiny import VOCAB, make_qwen2, qwen2_tokenizer, save_qwen2

SMALL = ["rollout.prompts_per_step=4", "rollout.num_generations=4", "rollout.max_new_tokens=6",
         "update.minibatch_size=8", "eval.size=4", "eval.every=0", "update.lr_actor=1e-2", "checkpoint.every=1",
         "threads=1"]


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_qwen2(tmp_path_factory.mktemp("qwen2") / "model")


def _run(folder: Path, out: Path, chunk_mib: float, *extra: str) -> list[dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(TASKS, "digits", digits_task)
        train(load_config(overrides={"model.name": str(folder), "out": str(out), "steps": 2, "task": "digits",
                                     "algo": "grpo"}, sets=[*SMALL, f"model.logits_chunk_mib={chunk_mib}", *extra]))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_training_with_chunked_logprobs_matches_the_whole_vocabulary_at_once(qwen2_dir: Path, tmp_path: Path) -> None:
    # 0.05 MiB of float32 logits at V = 4096: 52,428 / 16,384 = 3 positions per chunk, against all at once
    chunked = _run(qwen2_dir, tmp_path / "chunked", 0.05)
    whole = _run(qwen2_dir, tmp_path / "whole", 0)
    first, other = chunked[0], whole[0]  # step 1 samples from the same weights: the same rows
    assert first["reward_mean"] == other["reward_mean"] and first["tokens"] == other["tokens"]
    for key, value in first.items():  # the update's numbers agree to float32 rounding
        if isinstance(value, float) and not is_timing(key):
            assert abs(value - other[key]) <= 1e-4 + 1e-4 * abs(other[key]), (key, value, other[key])
    assert abs(first["kl"] - other["kl"]) <= 1e-6  # KL after the step: the adapters moved the same way


def test_training_with_activation_checkpointing_matches_training_without(qwen2_dir: Path, tmp_path: Path) -> None:
    checkpointed = _run(qwen2_dir, tmp_path / "ckpt", 0.05, "update.activation_checkpointing=true")
    plain = _run(qwen2_dir, tmp_path / "plain", 0.05)
    first, other = checkpointed[0], plain[0]
    assert first["reward_mean"] == other["reward_mean"] and first["tokens"] == other["tokens"]
    for key, value in first.items():  # recomputed layers, unshared prompts: float32 rounding apart
        if isinstance(value, float) and not is_timing(key):
            assert abs(value - other[key]) <= 1e-4 + 1e-4 * abs(other[key]), (key, value, other[key])


def test_merged_decode_with_qkv_biases_and_an_untied_head() -> None:
    torch.manual_seed(0)
    stack = PolicyStack(make_qwen2(), LoraConfig(r=4), with_critic=False)
    for p in stack.parameters_of("actor"):
        torch.nn.init.normal_(p, std=0.2)
    assert mergeable(stack) and not stack.tied
    tok = qwen2_tokenizer()
    ids = torch.tensor([tok.encode(p) for p in ("12+34=", "56+7=9")])
    keys = row_keys(3, 1, torch.arange(2).repeat_interleave(3), torch.arange(3).repeat(2))
    request = GenerationRequest(ids, torch.ones_like(ids, dtype=torch.bool), 3, SamplingSettings(8), keys, logprobs=True)
    plain = HFEngine(stack, tok.eos_token_id, tok.pad_token_id, merge=False).generate(request)
    merged = HFEngine(stack, tok.eos_token_id, tok.pad_token_id, merge=True).generate(request)
    assert torch.equal(merged.response_ids, plain.response_ids)
    assert int(merged.response_ids.max()) > 20  # drawn from the wide vocabulary, past the characters
    torch.testing.assert_close(merged.logprobs, plain.logprobs, atol=1e-4, rtol=0)


def test_export_keeps_the_biases_and_the_untied_head(qwen2_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run(qwen2_dir, run, 64)
    out = tmp_path / "merged"
    export_run(run, out)
    weights, base = load_file(out / "model.safetensors"), load_file(qwen2_dir / "model.safetensors")
    assert weights["lm_head.weight"].shape == (VOCAB, 128)
    assert not torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    bias = "model.layers.0.self_attn.q_proj.bias"
    assert torch.equal(weights[bias], base[bias]) and float(base[bias].abs().max()) > 0.1  # carried over, not zero
    assert not torch.equal(weights["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    inputs = torch.tensor([[1, 8, 11, 17, 9, 6, 20]])
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    stack, _, _ = load_actor(run)
    with torch.no_grad(), stack.use("actor"):
        torch.testing.assert_close(model(input_ids=inputs).logits, stack.lm(input_ids=inputs).logits, atol=1e-5, rtol=0)
