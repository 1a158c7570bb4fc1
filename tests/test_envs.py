"""Environments (llmrl/envs/): the registry and user classes, tool-call parsing, tools under a time
limit, and the refusals of the first slice of episodes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmrl.config import load_config
from llmrl.envs import ENVS, EnvStep, ToolCall, ToolEnv, parse_calls, resolve_env
from llmrl.envs.calculator import calculator
from llmrl.errors import ConfigError

from tests.helpers import CLI_SMALL, cli_refused


def test_hermes_calls_parse_and_malformed_ones_say_why() -> None:
    good = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
    assert parse_calls("let me see " + good, "hermes") == [ToolCall("calculator", {"expression": "12*34"})]
    two = parse_calls(good + '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "hermes")
    assert [c.name for c in two] == ["calculator", "f"] and two[1].arguments == {"x": 1}  # arguments as a string
    assert parse_calls("the answer is 408", "hermes") == []
    bad = parse_calls('<tool_call>{"name": calculator}</tool_call>', "hermes")
    assert len(bad) == 1 and "not valid JSON" in (bad[0].error or "")
    assert 'no "name"' in (parse_calls('<tool_call>{"arguments": {}}</tool_call>', "hermes")[0].error or "")
    assert "not an object" in (parse_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "hermes")[0].error or "")
    assert "no closing" in (parse_calls('<tool_call>{"name": "f"', "hermes")[0].error or "")


def test_json_calls_are_read_bare_or_fenced_and_the_tags_first() -> None:
    # the three forms Qwen2.5-Coder-0.5B-Instruct writes when offered tools (docs/environments.md)
    call = '{"name": "calculator", "arguments": {"expression": "347*28"}}'
    want = [ToolCall("calculator", {"expression": "347*28"})]
    assert parse_calls(call, "json") == want and parse_calls(call, "hermes") == []
    assert parse_calls(f"I will use the calculator.\n```json\n{call}\n```", "json") == want
    assert parse_calls(f"<tool_call>\n{call}\n</tool_call>", "json") == want
    # with a tagged call in the turn, a bare object beside it is not read a second time
    other = '{"name": "f", "arguments": {}}'
    assert parse_calls(f"<tool_call>{call}</tool_call> {other}", "json") == want
    two = parse_calls(f"{call} then {other}", "json")
    assert [c.name for c in two] == ["calculator", "f"]
    # arguments as a JSON string are decoded; arguments that are no object are the model's error
    assert parse_calls('{"name": "f", "arguments": "{\\"x\\": 1}"}', "json") == [ToolCall("f", {"x": 1})]
    assert "not an object" in (parse_calls('{"name": "f", "arguments": [1]}', "json")[0].error or "")
    # no call: an answer, JSON without a name or without arguments, an object cut short, a nested one
    for text in ("9716", '{"answer": 9716}', '{"name": "f"}', call[:-1], '{"x": ' + call + "}", "{ {"):
        assert parse_calls(text, "json") == [], text
    with pytest.raises(ValueError, match="valid: hermes, json, plain"):
        parse_calls(call, "xml")


def test_plain_calls_are_turns_ending_in_equals() -> None:
    assert parse_calls("347*28=", "plain") == [ToolCall("", {"": "347*28"})]
    assert parse_calls(" 9716 ", "plain") == []


def test_tool_env_runs_calls_and_reports_every_mistake() -> None:
    env = ToolEnv([calculator], timeout_s=5.0)
    assert env.tools()[0]["function"]["name"] == "calculator"
    assert env.reset({"prompt": "347*28="}, 0) == [{"role": "user", "content": "347*28="}]
    out = env.step("", [ToolCall("calculator", {"expression": "347*28"})])
    assert out == EnvStep([{"role": "tool", "name": "calculator", "content": "9716"}], 0.0, False, 1, 0)
    assert env.step("", [ToolCall("", {"": "(2+3)*4"})]).messages[0]["content"] == "20"  # plain: the only tool
    mistakes = [ToolCall("", error="the tool call is not valid JSON (x)"), ToolCall("sqrt", {"x": 2}),
                ToolCall("calculator", {"expr": "1"}), ToolCall("calculator", {}),
                ToolCall("calculator", {"expression": "__import__('os')"})]
    out = env.step("", mistakes)
    texts = [m["content"] for m in out.messages]
    assert out.tool_calls == 5 and out.tool_errors == 5 and not out.done, texts
    assert texts[0] == "Error: the tool call is not valid JSON (x)."
    assert "there is no tool 'sqrt'" in texts[1] and "unknown argument 'expr'" in texts[2]
    assert "missing argument 'expression'" in texts[3] and "raised ValueError" in texts[4]
    assert env.step("9716", []) == EnvStep(done=True)  # no call: the answer ends the episode


def test_a_tool_that_hangs_is_an_error_after_its_time_limit() -> None:
    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "woke"

    env = ToolEnv([slow], timeout_s=0.2)
    started = time.perf_counter()
    out = env.step("", [ToolCall("slow", {"seconds": 3.0})])
    assert time.perf_counter() - started < 1.5
    assert out.messages[0]["content"] == "Error: slow took longer than 0.2 s." and out.tool_errors == 1
    assert env.step("", [ToolCall("slow", {"seconds": 0.0})]).messages[0]["content"] == "woke"


def test_environments_resolve_by_name_module_or_file(tmp_path: Path) -> None:
    assert "calculator" in ENVS
    spec = resolve_env("calculator", timeout_s=1.0)
    env = spec.make()
    assert isinstance(env, ToolEnv) and env.timeout_s == 1.0 and spec.make() is not env  # one per episode
    path = tmp_path / "my_env.py"
    path.write_text("class Guess:\n    def reset(self, row, seed):\n        return [{'role': 'user', 'content': 'go'}]\n"
                    "    def step(self, text, calls):\n        return None\nclass NoStep:\n    def reset(self, row, seed):\n"
                    "        return []\n")
    assert resolve_env(f"{path}:Guess").make().reset({}, 0)[0]["content"] == "go"
    for name, message in [("nope", r"is not a built-in \(calculator, guess\)"), (f"{path}:Missing", "has no class 'Missing'"),
                          (f"{path}:NoStep", "has no step method"), ("/no/such.py:Env", "Environment file"),
                          ("no_such_module_xyz:Env", "Cannot import environment module")]:
        with pytest.raises(ConfigError, match=message):
            resolve_env(name)


def test_episode_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_turns"):
        load_config(None, {}, ["rollout.max_turns=0"])
    with pytest.raises(ConfigError, match="max_episode_tokens"):
        load_config(None, {}, ["rollout.max_episode_tokens=0"])
    with pytest.raises(ConfigError, match="tool_timeout_s"):
        load_config(None, {}, ["rollout.tool_timeout_s=0"])


@pytest.mark.parametrize("extra, message", [
    (["--set", "rollout.env=nope"], "Environment 'nope' is not a built-in"),
    (["--env", "no_such_module_xyz:Env"], "Cannot import environment module 'no_such_module_xyz'"),
])
def test_bad_environment_settings_are_one_sentence(tiny_model_dir: Path, tmp_path: Path, extra: list[str],
                                                   message: str) -> None:
    cli_refused(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(tmp_path / "run"),
                 *CLI_SMALL, *extra], message)


def test_episodes_in_several_processes_are_refused() -> None:
    from dataclasses import replace

    from llmrl.parallel.distributed import SINGLE
    from llmrl.run.session import episode_env
    from llmrl.tasks import TASKS

    config = load_config(None, {}, ["task=calc"])
    assert episode_env(config, TASKS["calc"]()) is not None
    with pytest.raises(ConfigError, match=r"^Episodes \(environment 'calculator'\) do not run with several processes yet"):
        episode_env(config, TASKS["calc"](), replace(SINGLE, world_size=2))


def test_the_guessing_game_answers_higher_or_lower_and_ends_on_the_secret() -> None:
    from llmrl.envs.guess import Guess, guessed

    game = resolve_env("guess", timeout_s=5.0).make()
    assert isinstance(game, Guess) and game.tools() is None
    row = {"prompt": "Guess: 20 to 29.", "answer": "23", "low": 20, "high": 29}
    assert game.reset(row, 0) == [{"role": "user", "content": "Guess: 20 to 29."}]
    assert game.step("25", []) == EnvStep([{"role": "user", "content": "Lower."}])
    assert game.step("I guess 21, or 22", []) == EnvStep([{"role": "user", "content": "Higher."}])  # the first number
    assert game.step("no idea", []) == EnvStep([{"role": "user", "content": "Reply with one number from 20 to 29."}])
    assert game.step("23!", []) == EnvStep(done=True)  # the environment gives no reward: the task's reward does
    assert guessed([""] * 4, ["23", "It is 23.", "22 or 23", "none"], ["23"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert game.step("9" * 5000, []) == EnvStep([{"role": "user", "content": "Lower."}])  # no 5,000-digit int
    assert guessed([""], ["9" * 5000], ["23"]) == [0.0]
    with pytest.raises(ValueError, match=r"rows with whole-number 'answer', 'low' and 'high' columns .* has 'prompt', 'answer'"):
        game.reset({"prompt": "37+85=", "answer": "122"}, 0)


def test_every_game_is_won_by_halving_within_the_default_four_turns() -> None:
    """The task is solvable as posed: binary search over [low, high] with the environment's answers
    wins every one of the 900 games in ≤ 4 guesses (rollout.max_turns' default)."""
    from llmrl.tasks import TASKS

    task = TASKS["guess"]()
    assert task.env == "guess" and (len(task.train), len(task.eval)) == (700, 200)
    key = lambda r: (r["low"], r["answer"])  # noqa: E731
    assert not {key(r) for r in task.train} & {key(r) for r in task.eval}  # disjoint games
    assert task.eval == TASKS["guess"]().eval  # fixed, whatever the run's seed
    turns = []
    for row in task.train + task.eval:
        assert row["low"] <= int(row["answer"]) <= row["high"] == row["low"] + 9
        game, low, high = resolve_env("guess").make(), row["low"], row["high"]
        game.reset(row, 0)
        for turn in range(1, 11):
            guess = (low + high) // 2
            out = game.step(str(guess), [])
            if out.done:
                break
            low, high = (guess + 1, high) if out.messages[0]["content"] == "Higher." else (low, guess - 1)
        turns.append(turn)
    assert max(turns) == 4 and min(turns) == 1


@pytest.mark.parametrize("task", ["guess,arithmetic", "arithmetic,calc"])
def test_a_mixture_with_an_episode_task_is_refused(task: str) -> None:
    """A mixture runs every row as one turn; a game or a tool task in it would silently lose its environment."""
    cli_refused(["train", "--task", task, *CLI_SMALL], "is played in episodes in its own environment, which a mixture does not run")
