"""What reaches the vLLM engine's copy of the weights and what it refuses (issue 31): an embedding's
LoRA and a trained LM head on an untied model reach it; a tied model's trained head copy is refused;
responses are never cut short by engine.max_model_len without a word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmrl.config.load import load_config
from llmrl.engines import build_engine
from llmrl.errors import ConfigError
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack, of_adapter
from llmrl.tasks import task_from_config
from tests.vllm.test_vllm_engine import PROMPTS, greedy, keys_for, sampled, trainer_logprobs
from tests.vllm.test_vllm_refusals import ROOT

SMALL = ["engine.kv_cache_gb=0.05", "engine.max_model_len=64"]


def refused(args: list[str], tmp_path: Path) -> str:
    """`llmrl train --engine vllm ARGS` stops in set-up (after the model loads): exit 2, one sentence, and
    the run folder it made holds nothing."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "llmrl", "train", "--engine", "vllm", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists() or not any(out.iterdir())
    return done.stderr.strip()


@pytest.fixture(scope="module")
def untied_dir(warm_tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The warm tiny model with its LM head as a weight of its own (a copy of the embedding)."""
    model = AutoModelForCausalLM.from_pretrained(warm_tiny_dir, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    out = tmp_path_factory.mktemp("untied")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(warm_tiny_dir).save_pretrained(out)
    return out


def _setup(model_dir: Path, *sets: str):
    config = load_config(None, {"model.name": str(model_dir), "rollout.engine": "vllm"}, [*SMALL, *sets])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    prompts = [r["prompt"] for r in task_from_config(config).eval[:PROMPTS]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return config, stack, tokenizer, dict(ids=enc.input_ids, mask=enc.attention_mask.bool(), stack=stack)


def test_an_embedding_lora_and_a_trained_head_reach_the_engine(untied_dir: Path) -> None:
    """The staleness test with lora.target_modules including embed_tokens and lora.modules_to_save=[lm_head]:
    after a sync the engine answers as the trainer's actor, with the same log-probs."""
    config, stack, tokenizer, run = _setup(untied_dir, "lora.target_modules=[q_proj,v_proj,embed_tokens]",
                                           "lora.modules_to_save=[lm_head]")
    engine = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config)
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= set(engine._names)
    before = greedy(engine, run)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():  # move only the embedding's LoRA and the head's copy
        for name, p in stack.peft.named_parameters():
            if of_adapter(name, "actor") and ("lora_embedding" in name or "lm_head" in name):
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    hf = build_engine("hf", stack=stack, tokenizer=tokenizer, config=config)
    actor_now = greedy(hf, run)
    assert actor_now != before, "the change must move the actor's answers, or this test checks nothing"
    assert greedy(engine, run) == before  # stale until synced
    engine.sync(stack)
    assert greedy(engine, run) == actor_now
    drawn = sampled(engine, run, keys_for(2 * PROMPTS, 9))
    torch.testing.assert_close(drawn.logprobs, trainer_logprobs(run, drawn), atol=1e-4, rtol=0)


def test_a_trained_copy_of_a_tied_head_is_refused(warm_tiny_dir: Path, tmp_path: Path) -> None:
    """The built-in tiny model ties its head to its embedding: vLLM keeps one tensor and skips lm_head.weight."""
    assert refused(["--model", str(warm_tiny_dir), "--set", "lora.modules_to_save=[lm_head]"], tmp_path) == (
        "error: The vllm engine keeps this model's LM head and input embedding as one tensor (tie_word_embeddings), "
        "so the trained copy of 'lm_head' in lora.modules_to_save cannot reach it; use rollout.engine=hf, or leave "
        "'lm_head' out of lora.modules_to_save.")


def test_a_prompt_and_response_past_engine_max_model_len_are_refused_before_the_run(warm_tiny_dir: Path,
                                                                                    tmp_path: Path) -> None:
    # the sums' prompts are 4-6 tokens: with 5 new tokens those of 6 exceed a cap of 10
    message = refused(["--model", str(warm_tiny_dir), "--set", "engine.max_model_len=10", "--set",
                       "rollout.max_new_tokens=5"], tmp_path)
    assert message.startswith("error: Prompt ") and message.endswith(
        "with rollout.max_new_tokens=5 it exceeds the vllm engine's engine.max_model_len of 10 tokens."), message


def test_a_response_capped_by_engine_max_model_len_is_never_taken_as_ended(warm_tiny_dir: Path) -> None:
    """Past the run's check (e.g. `llmrl eval --max-new-tokens`), vLLM's 'length' stop before
    max_new_tokens is an error, not a finished answer; a prompt past the cap is one sentence too."""
    config, stack, tokenizer, run = _setup(warm_tiny_dir)
    engine = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config)
    real = run["ids"][0][run["mask"][0]]
    ids = real.repeat(63 // len(real) + 1)[-63:].unsqueeze(0)  # 63 tokens: the cap of 64 leaves room for one
    near = dict(run, ids=ids, mask=torch.ones_like(ids, dtype=torch.bool))
    with pytest.raises(ConfigError, match=r"stopped response 0 at 1 of 6 new tokens: its prompt and response exceed "
                                          r"engine.max_model_len \(64\)"):
        greedy(engine, near)
    long = dict(run, ids=real.repeat(70 // len(real) + 1)[:70].unsqueeze(0), mask=torch.ones(1, 70, dtype=torch.bool))
    with pytest.raises(ConfigError, match="The vllm engine refused a prompt"):
        greedy(engine, long)
