"""TextArena's games, unchanged, through llmrl (envs/textarena.py, tasks/textarena.py): the adapter's
turns, rewards and seeds against the game's own state, the task's rows, the refusals, and two steps
of `llmrl train --task ta:GuessTheNumber-v0` in a real subprocess."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.envs import EnvStep, resolve_env
from llmrl.envs.textarena import TextArenaEnv
from llmrl.errors import ConfigError
from llmrl.tasks import get_task

from tests.test_episodes import chat_tokenizer

textarena = pytest.importorskip("textarena")  # installed by the `test` extra: CI runs every test here
GAME = "GuessTheNumber-v0"


def _secret(env: TextArenaEnv) -> int:
    return env.env.state.game_state["game_number"]


def test_a_game_answers_each_turn_with_its_own_messages_and_rewards_the_win() -> None:
    env = TextArenaEnv(GAME)
    opening = env.reset({"ta_seed": 3}, seed=999)  # the row's seed fixes the game, not the episode key
    assert opening[0]["role"] == "user" and opening[0]["content"].startswith("You are Player 0. You are playing Guess")
    assert _secret(env) == 8  # TextArena's own draw for seed 3
    assert env.step("I say [10]", []) == EnvStep([{"role": "user", "content": "The target number is lower."}])
    invalid = env.step("seven", [])  # the player's own action is not echoed back: it is the model's tokens
    assert invalid.messages[0]["content"].startswith("You attempted an invalid move.") and not invalid.done
    assert env.step("[8]", []) == EnvStep(reward=1.0, done=True)


def test_halving_wins_every_game_with_reward_one() -> None:
    for seed in range(20):
        env, low, high = TextArenaEnv(GAME), 1, 20
        env.reset({"ta_seed": seed}, 0)
        for _ in range(5):  # ⌈log2 20⌉ = 5 guesses always suffice
            guess = (low + high) // 2
            out = env.step(f"[{guess}]", [])
            if out.done:
                break
            hint = out.messages[0]["content"]
            low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
        assert out == EnvStep(reward=1.0, done=True), seed


def test_interleaved_games_keep_their_own_randomness_and_leave_random_alone() -> None:
    alone = []
    for seed in (5, 6):
        env = TextArenaEnv(GAME)
        env.reset({"ta_seed": seed}, 0)
        alone.append(_secret(env))
    random.seed(42)
    expected = random.random()
    random.seed(42)
    a, b = TextArenaEnv(GAME), TextArenaEnv(GAME)
    a.reset({"ta_seed": 5}, 0)
    b.reset({"ta_seed": 6}, 0)
    a.step("[1]", [])
    b.step("[1]", [])
    assert random.random() == expected  # TextArena seeds the global `random`: swapped back after each call
    assert [_secret(a), _secret(b)] == alone


def test_the_task_rows_are_games_by_seed_with_their_opening_prompt() -> None:
    task = get_task(f"ta:{GAME}", train_size=4, eval_size=3, split_seed=1234)
    assert [r["ta_seed"] for r in task.eval] == [1234, 1235, 1236]
    assert [r["ta_seed"] for r in task.train] == [1_001_234, 1_001_235, 1_001_236, 1_001_237]  # disjoint seeds
    opening = TextArenaEnv(GAME).reset({"ta_seed": 1234}, 0)[0]["content"]
    assert task.eval[0]["prompt"] == opening and task.env == f"ta:{GAME}"
    assert task.reward([r["prompt"] for r in task.eval], ["[8]"] * 3) == [0.0, 0.0, 0.0]  # the game rewards
    assert resolve_env(f"ta:{GAME}").make().reset(task.eval[0], 7)[0]["content"] == opening


@pytest.mark.parametrize(("name", "message"), [
    ("ta:NoSuchGame-v0", "TextArena has no game 'NoSuchGame-v0'"),
    ("ta:guessthenumber", "did you mean GuessTheNumber-v0"),
    ("ta:TicTacToe-v0", "TextArena's TicTacToe-v0 cannot be played by one player"),
    ("ta:Wordle-v0", "TextArena's Wordle-v0 could not start a game (LookupError: Resource 'words' not found)"),
])
def test_a_game_llmrl_cannot_play_is_one_sentence(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        get_task(name, train_size=1, eval_size=1)
    assert message in str(info.value) and "\n" not in str(info.value)


def _stopping_chat_model(path: Path) -> Path:
    """A random 2-layer Llama with the chat tokenizer whose first choice is always <|im_end|>: every turn
    is an empty answer, which the game calls an invalid move (a context of 1024 holds its prompt)."""
    tok = chat_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a large constant feature in every embedding, read by the <|im_end|> row alone
        model.model.embed_tokens.weight[:, 0] = 10.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tok.eos_token_id, 0] = 5.0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_textarena_game_trains_through_llmrl_unchanged(tmp_path: Path) -> None:
    model = _stopping_chat_model(tmp_path / "model")
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "llmrl", "train", "--model", str(model), "--task", f"ta:{GAME}", "--steps", "2",
         "--out", str(run), "--set", "rollout.prompts_per_step=2", "--set", "rollout.num_generations=2",
         "--set", "rollout.max_new_tokens=4", "--set", "update.minibatch_size=4", "--set", "eval.size=2",
         "--set", "threads=1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # two empty answers: the first is an invalid move the game warns about, the second ends it (reward 0)
    assert [m["turns_mean"] for m in metrics] == [2.0, 2.0]
    assert all(0 < m["masked_token_frac"] < 1 for m in metrics)
    row = json.loads((run / "completions.jsonl").read_text().splitlines()[0])
    assert [t["by"] for t in row["turns"]] == ["model", "env", "model"] and row["prompt"].startswith("You are Player 0")
    assert "You attempted an invalid move." in row["turns"][1]["text"] and not row["turns"][1]["trained"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_turns_mean_before"] == 2.0
