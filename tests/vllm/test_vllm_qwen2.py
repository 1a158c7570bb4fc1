"""A Qwen2-architecture model through the vllm engine (tests/qwen2_tiny.py: biases on q, k and v, an
LM head of its own, a vocabulary 32× the hidden size): vLLM samples what the trainer computes, and
after a sync of the adapted q/k/v projections and the trained head, from the new weights; `llmrl
train` on it trains through the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmrl.config.load import load_config
from llmrl.engines import GenerationRequest, SamplingSettings, build_engine
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack
from llmrl.tasks import task_from_config
from tests.helpers import CLI_SMALL, cli_subprocess
from tests.qwen2_tiny import save_qwen2
from tests.vllm.test_vllm_engine import PROMPTS, keys_for, perturb, trainer_logprobs


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = save_qwen2(tmp_path_factory.mktemp("qwen2") / "model", seed=3)
    config = load_config(None, {"model.name": str(folder), "rollout.engine": "vllm"},
                         ["engine.kv_cache_gb=0.05", "engine.max_model_len=64",
                          "lora.target_modules=[q_proj,k_proj,v_proj,o_proj]", "lora.modules_to_save=[lm_head]"])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    engine = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config)
    prompts = [r["prompt"] for r in task_from_config(config).eval[:PROMPTS]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return dict(stack=stack, engine=engine, ids=enc.input_ids, mask=enc.attention_mask.bool(), folder=folder)


def draw(run: dict, offset: int):
    request = GenerationRequest(run["ids"], run["mask"], 2, SamplingSettings(6, 1.0), keys_for(2 * PROMPTS, offset),
                                logprobs=True)
    return run["engine"].generate(request)


def test_the_engine_holds_the_biases_and_the_untied_head(run: dict) -> None:
    names = set(run["engine"]._names)
    assert {"lm_head.weight", "model.layers.0.self_attn.q_proj.weight"} <= names
    base = run["stack"].lm
    assert base.model.layers[0].self_attn.q_proj.bias.abs().max() > 0.1  # biases that matter
    assert base.lm_head.weight.data_ptr() != base.model.embed_tokens.weight.data_ptr()


def test_a_qwen2_model_samples_what_the_trainer_computes_before_and_after_a_sync(run: dict) -> None:
    gen = draw(run, 0)
    # float32 on both sides: vLLM's kernels and the trainer's forward agree to float rounding
    torch.testing.assert_close(gen.logprobs, trainer_logprobs(run, gen), atol=1e-4, rtol=0)
    perturb(run["stack"], seed=7)  # the q/k/v/o LoRAs and the head's trained copy all move
    run["engine"].sync(run["stack"])
    after = draw(run, 0)
    assert not torch.equal(after.response_ids, gen.response_ids)  # same keys, new weights: new draws
    torch.testing.assert_close(after.logprobs, trainer_logprobs(run, after), atol=1e-4, rtol=0)


def test_llmrl_train_runs_a_qwen2_model_on_the_vllm_engine(run: dict, tmp_path: Path) -> None:
    # a real `llmrl train` process (one engine a process: tests/vllm/test_vllm_episodes.py), GRPO on the
    # built-in sums with the q/k/v/o adapters and the head trained at lr 1e-2, so step 2 samples from
    # weights the update moved: its log μ must equal the trainer's π_old to float32 rounding, which
    # holds only if the sync carried the adapted projections (over their biases) and the new head. The
    # random model never answers a sum, so the reward is a completion's count of distinct characters,
    # which differs within a group and gives step 1 something to update.
    reward = tmp_path / "distinct.py"
    reward.write_text("def distinct(prompts, completions, **_):\n    return [float(len(set(c))) for c in completions]\n")
    out = tmp_path / "run"
    done = cli_subprocess(["train", "--model", str(run["folder"]), "--engine", "vllm", "--algo", "grpo",
                           "--reward", f"{reward}:distinct",
                           "--steps", "2", "--out", str(out), *CLI_SMALL, "--set", "rollout.num_generations=2",
                           "--set", "rollout.max_new_tokens=6", "--set", "update.lr_actor=1e-2",
                           "--set", "engine.kv_cache_gb=0.05", "--set", "engine.max_model_len=64",
                           "--set", "lora.target_modules=[q_proj,k_proj,v_proj,o_proj]",
                           "--set", "lora.modules_to_save=[lm_head]"])
    assert done.returncode == 0, (done.stdout, done.stderr)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r and "is_logprob_diff_max" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["is_logprob_diff_max"] < 1e-4 and abs(r["is_weight_mean"] - 1) < 1e-4 for r in rows)
    # step 1 updated, and its merged weights reached the engine before step 2 sampled
    assert rows[0]["actor_grad_norm"] > 0 and not rows[0]["zero_advantage"]
    assert any(r["engine_sync_mb"] > 0 for r in rows)
