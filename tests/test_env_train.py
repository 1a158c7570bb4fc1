"""`llmrl train` with an environment, end to end on a random tiny model: the built-in tool task
(`--task calc`: episodes in the calculator environment) and a user's environment class
(`rollout.env=file.py:Class`), two steps each, through the same verbs as a single-turn run."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from llmrl.models.tokenizer import build_char_tokenizer
from tests.helpers import CLI_SMALL, cli_run

EOS = build_char_tokenizer().eos_token
EPISODE_KEYS = ("turns_mean", "tool_calls_per_episode", "tool_error_rate", "episode_tokens", "masked_token_frac",
                "env_reward_mean", "env_time_s")
USER_ENV = '''
from llmrl.envs import EnvStep


class Echo:
    """Answers '7' twice, then ends the episode with a reward of 1."""

    def reset(self, row, seed):
        self.turns = 0
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, calls):
        self.turns += 1
        if self.turns == 3:
            return EnvStep(reward=1.0, done=True)
        return EnvStep([{"role": "user", "content": "7"}])
'''


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train(model: Path, run: Path, *extra: str) -> list[dict]:
    code, out, err = cli_run(["train", "--model", str(model), "--steps", "2", "--out", str(run), *CLI_SMALL,
                              "--set", "rollout.num_generations=2", "--set", "rollout.max_new_tokens=6", *extra])
    assert code == 0, (out, err)
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert all(k in r for k in EPISODE_KEYS), sorted(r)
        assert math.isfinite(r["policy_loss"]) and r["skipped_updates"] == 0
    return rows


def test_the_calculator_task_trains_in_episodes(tiny_model_dir: Path, tmp_path: Path) -> None:
    rows = _train(tiny_model_dir, tmp_path / "calc", "--task", "calc", "--set", "rollout.max_turns=3")
    assert all(1 <= r["turns_mean"] <= 3 and r["episode_tokens"] > 0 for r in rows)
    assert "value_loss" in rows[0]  # ppo: GAE and the critic over the model's tokens
    summary = json.loads((tmp_path / "calc" / "summary.json").read_text())
    for when in ("before", "after"):  # evaluated in episodes of the calculator, plain format (one call a turn):
        turns, calls = summary[f"eval_turns_mean_{when}"], summary[f"eval_tool_calls_per_episode_{when}"]
        # every turn but an episode's last made a call (else it was the answer), the last may have: t − 1 ≤ c ≤ t
        assert 1 <= turns <= 3 and turns - 1 <= calls <= turns, (when, turns, calls)
        assert 0 <= summary[f"eval_tool_error_rate_{when}"] <= 1


def test_a_users_environment_runs_several_turns(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = tmp_path / "echo_env.py"
    env.write_text(USER_ENV)
    rows = _train(tiny_model_dir, tmp_path / "echo", "--algo", "grpo", "--env", f"{env}:Echo",
                  "--set", "rollout.max_turns=3")
    assert any(r["turns_mean"] > 1 for r in rows) and any(r["masked_token_frac"] > 0 for r in rows)
    assert all(r["tool_calls_per_episode"] == 0 for r in rows)
    assert any(r["env_reward_mean"] > 0 for r in rows)  # the third turn's reward of 1 reaches the score
    logged = [json.loads(line) for line in (tmp_path / "echo" / "completions.jsonl").read_text().splitlines()]
    plain = lambda text: re.sub(r"</?s>|<pad>|<unk>", "", text)  # noqa: E731  (the view shows special tokens)
    assert logged and all(r["turns"][0]["by"] == r["turns"][-1]["by"] == "model" for r in logged)
    assert all(plain(r["turns"][-1]["text"]) == r["completion"] for r in logged)
    env_turns = [t for r in logged for t in r["turns"] if t["by"] == "env"]
    assert env_turns and all(t["text"] == "7" and not t["trained"] for t in env_turns)
    config = (tmp_path / "echo" / "config.yaml").read_text()
    assert f"env: {env}:Echo" in config


def test_an_environment_that_raises_stops_the_run_in_one_sentence(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = tmp_path / "boom_env.py"
    env.write_text("class Boom:\n    def reset(self, row, seed):\n        return [{'role': 'user', 'content': row['prompt']}]\n"
                   "    def step(self, text, calls):\n        raise RuntimeError('the board is gone')\n")
    code, out, err = cli_run(["train", "--model", str(tiny_model_dir), "--steps", "2", "--out", str(tmp_path / "boom"),
                              *CLI_SMALL, "--env", f"{env}:Boom"])
    # it raises in the evaluation before the first step: found before anything was trained, exit 2 (issue 44)
    assert code == 2, (out, err)
    assert f"Environment '{env}:Boom' raised RuntimeError: the board is gone (episode 0). Nothing was trained" in err
    assert f"start it again with: llmrl train --resume {tmp_path / 'boom'}" in err
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1, err


def test_a_chat_model_gets_the_tools_in_its_prompt(tmp_path: Path) -> None:
    """A model with a chat template (Hermes calls, the calculator offered through tools=; the rendering
    itself is checked in test_episodes.py) runs `llmrl train --task calc` end to end, and `--task
    chat_calc` in its own plain format."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.test_episodes import chat_tokenizer

    tok = chat_tokenizer()
    model_dir = tmp_path / "chat-model"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rows = _train(model_dir, tmp_path / "chat", "--task", "calc", "--set", "rollout.max_turns=2")
    assert all(r["episode_tokens"] > 0 for r in rows)
    logged = [json.loads(line) for line in (tmp_path / "chat" / "completions.jsonl").read_text().splitlines()]
    assert logged and all(r["turns"][0]["by"] == "model" for r in logged)
    assert "tool_format: auto" in (tmp_path / "chat" / "config.yaml").read_text()  # calc shows no worked call
    # chat_calc's worked example is a plain call: its format applies where the setting is auto, and config.yaml
    # keeps auto as asked (test_eval.py: the format a run and an evaluation of it on another task read)
    _train(model_dir, tmp_path / "chat_calc", "--task", "chat_calc", "--set", "rollout.max_turns=2")
    assert "tool_format: auto" in (tmp_path / "chat_calc" / "config.yaml").read_text()


ONE_TURN = '''
from llmrl.envs import EnvStep


class OneTurn:
    def reset(self, row, seed):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, calls):
        return EnvStep(done=True)
'''


def test_one_turn_episodes_give_the_single_turn_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An environment that ends every episode after its first turn, through the episode path, trains
    exactly as today's single-turn path: every metric both log is bit-identical, timings aside."""
    from tests.helpers import is_timing

    env = tmp_path / "one_turn.py"
    env.write_text(ONE_TURN)
    plain = [json.loads(line) for line in _plain_run(tiny_model_dir, tmp_path / "plain")]
    episodes = _train(tiny_model_dir, tmp_path / "episodes", "--env", f"{env}:OneTurn")
    for a, b in zip(plain, episodes, strict=True):
        shared = [k for k in a if not is_timing(k)]
        assert set(shared) <= set(b) and {k: a[k] for k in shared} == {k: b[k] for k in shared}
        assert b["turns_mean"] == 1 and b["masked_token_frac"] == 0


def _plain_run(model: Path, run: Path) -> list[str]:
    code, out, err = cli_run(["train", "--model", str(model), "--steps", "2", "--out", str(run), *CLI_SMALL,
                              "--set", "rollout.num_generations=2", "--set", "rollout.max_new_tokens=6"])
    assert code == 0, (out, err)
    return (run / "metrics.jsonl").read_text().splitlines()


def test_a_resumed_episode_run_equals_an_uninterrupted_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    """1 step, then --resume to 2, gives the metrics of 2 steps in one go (episodes of several turns,
    keyed by seed, step, prompt, sample and turn; nothing of an environment outlives its episode)."""
    from tests.helpers import is_timing

    env = tmp_path / "echo_env.py"
    env.write_text(USER_ENV)
    args = ["--algo", "grpo", "--env", f"{env}:Echo", "--set", "rollout.max_turns=3"]
    whole = _train(tiny_model_dir, tmp_path / "whole", *args)
    code, out, err = cli_run(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(tmp_path / "cut"),
                              *CLI_SMALL, "--set", "rollout.num_generations=2", "--set", "rollout.max_new_tokens=6", *args])
    assert code == 0, (out, err)
    code, out, err = cli_run(["train", "--resume", str(tmp_path / "cut"), "--steps", "2"])
    assert code == 0, (out, err)
    resumed = _rows(tmp_path / "cut")
    strip = lambda r: {k: v for k, v in r.items() if not is_timing(k) and k != "env_time_s"}  # noqa: E731
    assert [strip(r) for r in resumed] == [strip(r) for r in whole]
    assert any(r["turns_mean"] > 1 for r in whole)


def test_dynamic_sampling_trains_only_episode_groups_whose_rewards_differ(tiny_model_dir: Path, tmp_path: Path) -> None:
    """rollout.filter_groups with episodes: Echo rewards the episodes that reach a third turn, so a group
    of 2 is kept exactly when one of its episodes did and the other did not; refill rounds draw more."""
    env = tmp_path / "echo_env.py"
    env.write_text(USER_ENV)
    rows = _train(tiny_model_dir, tmp_path / "ds", "--algo", "grpo", "--env", f"{env}:Echo", "--set",
                  "rollout.max_turns=3", "--set", "rollout.filter_groups=true", "--set", "rollout.max_draws=3",
                  "--set", "kl.beta=0", "--set", "log.completions_every=1", "--set", "log.completions_rows=64")
    logged = [json.loads(line) for line in (tmp_path / "ds" / "completions.jsonl").read_text().splitlines()]
    for r in rows:
        groups = [g for g in (logged[i : i + 2] for i in range(0, len(logged), 2)) if g[0]["step"] == r["step"]]
        assert r["groups_kept"] == len(groups) and r["groups_kept"] + r["groups_dropped"] <= r["ds_prompts"]
        assert all({e["env_reward"] for e in g} == {0.0, 1.0} for g in groups)  # only mixed groups are trained
        for e in (e for g in groups for e in g):  # Echo rewards its third turn: 3 model turns and 2 answers
            model = [t for t in e["turns"] if t["by"] == "model"]
            if e["env_reward"]:
                assert [t["by"] for t in e["turns"]] == ["model", "env", "model", "env", "model"]
                assert all(t["text"].endswith(EOS) for t in model[:2])  # a turn without its stop ends the episode
            else:  # ended before its third turn: its last turn was cut (no stop token), the others were not
                assert len(model) < 3 and len(e["turns"]) == 2 * len(model) - 1
                assert not model[-1]["text"].endswith(EOS) and all(t["text"].endswith(EOS) for t in model[:-1])
    assert sum(r["groups_kept"] for r in rows) > 0 and any(r["ds_draws"] > 0 for r in rows)


def test_eval_scores_a_run_and_a_plain_model_in_episodes(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`llmrl eval` of a run trained in an environment plays its episodes (the run's own environment and
    limits): the greedy numbers are the run's own final evaluation; a plain model on `--task calc` plays
    them too (the task's environment) and equals the run's evaluation before training; pass@k samples
    episodes. `--env` names another environment. The reward is the digits' share of the last turn (a random
    model earns it too) with success at 0.5, so the accuracies compared are neither 0 nor 1."""
    run = tmp_path / "calc"
    reward = ["--reward", "tests.helpers:digit_share", "--set", "reward.success=0.5", "--set", "eval.size=8"]
    _train(tiny_model_dir, run, "--task", "calc", "--set", "rollout.max_turns=3", *reward)
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["eval_accuracy_before"] < 1 and 0 < summary["eval_accuracy_after"] < 1, summary
    code, out, err = cli_run(["eval", "--model", str(run), "--samples", "2", "--json"])
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["env"] == "calculator" and report["prompts"] == 8
    assert report["greedy"]["accuracy"] == summary["eval_accuracy_after"]
    assert report["greedy"]["reward_mean"] == summary["eval_reward_after"]
    assert report["greedy"]["turns_mean"] == summary["eval_turns_mean_after"]
    assert set(report["sampled"]) >= {"pass@1", "pass@2"} and 0 <= report["sampled"]["pass@1"] <= report["sampled"]["pass@2"]
    code, out, err = cli_run(["eval", "--model", str(tiny_model_dir), "--task", "calc", "--size", "8", "--samples", "0",
                              "--json", "--reward", "tests.helpers:digit_share", "--max-new-tokens", "6"])
    assert code == 0, (out, err)
    plain = json.loads(out)
    assert plain["env"] == "calculator" and plain["greedy"]["turns_mean"] == summary["eval_turns_mean_before"]
    assert plain["greedy"]["reward_mean"] == summary["eval_reward_before"]  # the run's max_new_tokens (6)
    env = tmp_path / "echo_env.py"
    env.write_text(USER_ENV)
    code, out, err = cli_run(["eval", "--model", str(tiny_model_dir), "--env", f"{env}:Echo", "--size", "4",
                              "--samples", "0", "--json"])
    assert code == 0, (out, err)
    echo = json.loads(out)
    assert echo["env"] == f"{env}:Echo" and echo["greedy"]["turns_mean"] >= 1 and echo["task"] == "arithmetic"
    code, out, err = cli_run(["eval", "--model", str(tiny_model_dir), "--env", "nope", "--size", "2"])
    assert code == 2 and "Environment 'nope' is not a built-in" in err and "Traceback" not in out + err
