"""Episodes through the vllm engine for real (step/episodes.py): each turn is the grown row sent as a
token prompt, so the ids vLLM samples, the environment's ids and the trainer's forward are of one
sequence; greedy episodes are the `hf` engine's, token for token; a row that outgrows the engine's
context ends there; and `llmrl train --engine vllm` runs an environment end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from llmrl.config.load import load_config
from llmrl.engines import build_engine
from llmrl.envs import EnvSpec, EnvStep
from llmrl.models.load import load_base
from llmrl.models.stack import PolicyStack
from llmrl.models.tokenizer import stop_token_ids
from llmrl.step.episodes import generate_episodes
from llmrl.step.forward import masked_logprobs
from llmrl.tasks import task_from_config

from tests.helpers import CLI_SMALL, cli_subprocess

CONTEXT = 64
ROWS = 8


class Seven:
    """Answers every turn '7' and ends the episode after its third turn with a reward of 1."""

    def reset(self, row: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        self.turns = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text: str, calls: list) -> EnvStep:
        self.turns += 1
        return EnvStep(reward=1.0, done=True) if self.turns == 3 else EnvStep([{"role": "user", "content": "7"}])


class Endless(Seven):
    """Never ends: only the context (or rollout.max_turns) stops its episodes."""

    def step(self, text: str, calls: list) -> EnvStep:
        return EnvStep([{"role": "user", "content": "77777"}])


@pytest.fixture(scope="module")
def run(warm_tiny_dir):
    """The warm tiny model's stack with a `vllm` engine (context 64) and the `hf` engine on the same base."""
    config = load_config(None, {"model.name": str(warm_tiny_dir), "rollout.engine": "vllm"},
                         ["engine.kv_cache_gb=0.05", f"engine.max_model_len={CONTEXT}", "rollout.max_turns=3",
                          "rollout.max_new_tokens=6", "rollout.num_generations=2"])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    vllm = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config)
    hf = build_engine("hf", stack=stack, tokenizer=tokenizer, config=config)
    rows = task_from_config(config).eval[:ROWS]
    return dict(config=config, stack=stack, tokenizer=tokenizer, vllm=vllm, hf=hf, rows=rows)


def episodes(run, engine: str, *, greedy: bool, env: type = Seven, **rollout: Any):
    cfg = replace(run["config"].rollout, **rollout)
    return generate_episodes(run[engine], run["tokenizer"], EnvSpec(env.__name__, env), run["rows"],
                             torch.arange(ROWS), cfg=cfg, seed=5, step=1, device=torch.device("cpu"),
                             stop_ids=stop_token_ids(run["tokenizer"], run["stack"].lm), logprobs=True,
                             context=CONTEXT, greedy=greedy)


def test_greedy_episodes_are_the_hf_engines_token_for_token(run) -> None:
    a, b = episodes(run, "hf", greedy=True), episodes(run, "vllm", greedy=True)
    assert int(b.episodes.turns.max()) > 1 and int(b.episodes.env_tokens.sum()) > 0  # several turns, env ids
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.context_mask, b.context_mask) and torch.equal(a.episodes.turns, b.episodes.turns)
    assert a.completions == b.completions


def test_sampled_episodes_log_the_trainers_logprobs_of_the_whole_row(run) -> None:
    """float32 on both sides: vLLM's μ of each turn's tokens, sampled from the grown row as a token prompt,
    equals the trainer's log π over prompt + every turn + the environment's ids, within 1e-4."""
    samples = episodes(run, "vllm", greedy=False, temperature=1.0)
    assert int(samples.episodes.turns.max()) > 1 and bool((samples.context_mask & ~samples.response_mask).any())
    with run["stack"].use("actor"):
        full = masked_logprobs(run["stack"], samples, 1.0)
    assert float(full.abs().max()) > 0.1
    torch.testing.assert_close(samples.behaviour_logprobs, full, atol=1e-4, rtol=0)
    again = episodes(run, "vllm", greedy=False, temperature=1.0)
    assert torch.equal(again.response_ids, samples.response_ids)  # keyed by (seed, step, prompt, sample, turn)


def test_an_episode_that_outgrows_the_engines_context_ends_there(run) -> None:
    samples = episodes(run, "vllm", greedy=False, env=Endless, temperature=1.0, max_turns=20)
    rows = samples.prompt_mask.sum(-1) + samples.context_mask.sum(-1)
    assert int(rows.max()) <= CONTEXT and int(samples.episodes.turns.max()) > 3


def test_train_runs_an_environment_on_the_vllm_engine(warm_tiny_dir, tmp_path: Path) -> None:
    env = tmp_path / "seven.py"
    # the reward is the count of distinct characters the model wrote in its three turns, so a group's
    # episodes differ and step 1 updates (a constant reward left every advantage 0 on a CPU whose warm
    # start never cut an episode, and then nothing was synced)
    env.write_text("from llmrl.envs import EnvStep\n\n\nclass Seven:\n"
                   "    def reset(self, row, seed):\n        self.turns, self.seen = 0, ''\n"
                   "        return [{'role': 'user', 'content': row['prompt']}]\n\n"
                   "    def step(self, text, calls):\n        self.turns, self.seen = self.turns + 1, self.seen + text\n"
                   "        if self.turns == 3:\n            return EnvStep(reward=float(len(set(self.seen))), done=True)\n"
                   "        return EnvStep([{'role': 'user', 'content': '7'}])\n")
    out = tmp_path / "run"
    done = cli_subprocess(["train", "--model", str(warm_tiny_dir), "--engine", "vllm", "--algo", "grpo",
                           "--env", f"{env}:Seven", "--steps", "2", "--out", str(out), *CLI_SMALL,
                           "--set", "rollout.num_generations=2", "--set", "rollout.max_new_tokens=6",
                           "--set", "rollout.max_turns=3"])
    assert done.returncode == 0, (done.stdout, done.stderr)

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and any(r["turns_mean"] > 1 for r in rows)
    # sampled by vLLM and corrected towards the trainer's π_old on the model's tokens only: float32 on
    # both sides, so the two log-probs agree to rounding and the importance weights are 1
    assert all(r["is_logprob_diff_max"] < 1e-4 and abs(r["is_weight_mean"] - 1) < 1e-4 for r in rows)
    assert rows[0]["engine_sync_mb"] > 0 or rows[1]["engine_sync_mb"] > 0


def test_a_step_whose_prompts_pass_vllms_token_budget_is_not_split(tmp_path: Path) -> None:
    """64 seeded requests of ~100 prompt tokens (> vLLM's default 4 096-token step budget): with the
    budget left at its default, vLLM splits the prefill and rewinds each split request's CPU generator,
    which raises 'CPU Generator does not use offset'; llmrl sizes the budget to rows × context."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmrl.engines import GenerationRequest, SamplingSettings
    from tests.test_episodes import chat_tokenizer

    tok = chat_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    config = load_config(None, {"model.name": str(tmp_path / "model"), "rollout.engine": "vllm"},
                         ["rollout.prompts_per_step=16", "rollout.num_generations=4", "rollout.max_new_tokens=4",
                          "eval.batch_size=16"])
    base, tokenizer = load_base(config.model)
    stack = PolicyStack(base, config.lora, with_critic=False)
    prompts = [f"question {i}: " + "x" * 90 for i in range(16)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    longest = int(enc.attention_mask.sum(-1).max())
    assert 64 * (longest + 4) > 4096
    engine = build_engine("vllm", stack=stack, tokenizer=tokenizer, config=config, longest_prompt=longest)
    keys = torch.arange(64, dtype=torch.long) * 7919 + 1
    gen = engine.generate(GenerationRequest(enc.input_ids, enc.attention_mask.bool(), 4,
                                            SamplingSettings(4, 1.0), keys, logprobs=True))
    assert gen.response_ids.shape[0] == 64 and bool(gen.response_mask[:, 0].all())
