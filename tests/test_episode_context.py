"""A run's prompts are sized and checked as its episodes render them (issue 45, item 2): with the
environment's opening and tools, which the dataset's prompts alone lack."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.config.schema import RolloutConfig
from llmrl.envs import prompt_ids, resolve_env
from llmrl.run.session import check_context
from llmrl.tasks import get_task
from tests.helpers import CLI_SMALL, cli_refused
from tests.test_episodes import chat_tokenizer


def _chat_model(path: Path, context: int) -> Path:
    tok = chat_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=context,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_the_longest_prompt_is_the_rendered_opening_with_its_tools() -> None:
    """calc's longest prompt with the calculator's schema in the chat template (what an episode's prompt
    ids are, and what sizes the vllm engine) is the longest `prompt_ids` of its rows, longer than the bare
    prompt by the tools block."""
    tok = chat_tokenizer()
    task = get_task("calc")
    spec = resolve_env("calculator")
    config = LlamaConfig(max_position_embeddings=4096)
    bare = check_context(task, tok, config, 8)
    rendered = check_context(task, tok, config, 8, env=spec, rollout=RolloutConfig())
    env = spec.make()
    want = max(len(prompt_ids(tok, env.reset(r, 0), env.tools(), "hermes")) for r in task.train + task.eval)
    assert rendered == want and rendered > bare + 300  # the schema JSON, a token per character here


def test_a_prompt_that_fits_only_without_its_tools_is_refused(tmp_path: Path) -> None:
    """A model of 128 positions: calc's prompts (≈ 40 tokens as a chat) fit with 6 new tokens, but not with
    the calculator's schema in them; the run is refused before it starts, instead of its episodes ending
    before their first turn and scoring as empty answers."""
    model = _chat_model(tmp_path / "chat", 128)
    stderr = cli_refused(["train", "--model", str(model), "--task", "calc", "--steps", "1", "--out", str(tmp_path / "r"),
                          *CLI_SMALL, "--set", "rollout.max_new_tokens=6"], "as the environment opens it (its tools "
                         "included); with rollout.max_new_tokens=6 it exceeds the model's context of 128 tokens.", code=2)
    assert "Prompt 0 of the train split" in stderr


def test_an_environment_whose_reset_raises_is_refused_before_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = tmp_path / "boom.py"
    env.write_text("class Boom:\n    def reset(self, row, seed):\n        raise RuntimeError('no board')\n"
                   "    def step(self, text, calls):\n        return None\n")
    cli_refused(["train", "--model", str(tiny_model_dir), "--env", f"{env}:Boom", "--steps", "1",
                 "--out", str(tmp_path / "r"), *CLI_SMALL],
                f"Environment '{env}:Boom' raised RuntimeError: no board in reset (row 0 of the train split).", code=2)
