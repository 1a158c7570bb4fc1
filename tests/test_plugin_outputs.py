"""Every plug-in boundary checks what it is handed (issue 44): a bad value from user code is named at
its source in one sentence — the plug-in, what it returned, where, what was expected — with exit 1
and a checkpoint of the last completed step during a run, exit 2 before the first step; and a run
that applied no update says so. The rows of docs/errors.md's plug-in table, each through the real
command line: the run-time ones as real `llmrl train` subprocesses (a random tiny model, 2 prompts ×
2 samples, about 5 s each), the ones before the first step in-process (Typer's CliRunner).
The values themselves are fuzzed in test_fuzz_plugins.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmrl.run.checkpoint import list_checkpoints
from tests.fuzzing import count
from tests.helpers import cli_run

ROOT = Path(__file__).resolve().parent.parent
TINY_RUN = ["--set", "rollout.prompts_per_step=2", "--set", "rollout.num_generations=2", "--set",
            "update.minibatch_size=4", "--set", "rollout.max_new_tokens=4", "--set", "threads=1"]
LAST_RESORT = "did not expect"

ENVS = '''
from llmrl.envs import EnvStep, ToolCall, ToolEnv

STEPS = [0]


class Plain:
    def reset(self, row, seed):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, text, calls):
        return EnvStep(reward=0.5, done=True)


class NaNReward(Plain):
    """Rewards 0.5 for step 1's four episodes, then NaN."""

    def step(self, text, calls):
        STEPS[0] += 1
        return EnvStep(reward=float("nan") if STEPS[0] > 4 else 0.5, done=True)


class BadLater(Plain):
    """Rewards 0.5 for step 1's four episodes, then the EnvStep `bad()` makes."""

    def step(self, text, calls):
        STEPS[0] += 1
        return self.bad() if STEPS[0] > 4 else EnvStep(reward=0.5, done=True)


class InfReward(BadLater):
    def bad(self):
        return EnvStep(reward=float("inf"), done=True)


class HugeLater(BadLater):
    def bad(self):
        return EnvStep(reward=3e38, done=True)


def huge_task_reward(prompts, completions, **columns):
    """3e38 for every completion: within float32's range, as is the environment's 3e38; their sum is not."""
    return [3e38] * len(completions)


class DoneYes(BadLater):
    def bad(self):
        return EnvStep(reward=0.5, done="yes")


class TextMessages(BadLater):
    def bad(self):
        return EnvStep(messages="higher", reward=0.5)


class MoreErrors(BadLater):
    def bad(self):
        return EnvStep(reward=0.5, done=True, tool_calls=1, tool_errors=2)


class NeedsArg(Plain):
    def __init__(self, size):
        self.size = size


class Boom(Plain):
    def __init__(self):
        raise RuntimeError("no boards left")


PLAYING = [False]


class BreaksOnceItPlays(Plain):
    """Builds until a game is reset with a real key (the setup sizes prompts with key 0), then raises."""

    def __init__(self):
        if PLAYING[0]:
            raise RuntimeError("the board is taken")

    def reset(self, row, seed):
        PLAYING[0] = PLAYING[0] or seed != 0
        return super().reset(row, seed)


class ResetLater(Plain):
    """A good opening for the setup's sizing (key 0), the prompt's text for a real game."""

    def reset(self, row, seed):
        return super().reset(row, seed) if seed == 0 else row["prompt"]


class ToolsRaise(Plain):
    def tools(self):
        raise ValueError("no schemas today")


class Tools42(Plain):
    def tools(self):
        return 42


class NotSchemas(Plain):
    def tools(self):
        return [{"not": "a schema"}]


class Opening(Plain):
    def reset(self, row, seed):
        return row["prompt"]


def lookup(word: str):
    """Look a word up.

    Args:
        word: the word
    """
    return {"a", "set"}


class Lookup(ToolEnv):
    """Every turn calls its one tool, which returns a set."""

    def __init__(self):
        super().__init__([lookup])

    def step(self, text, calls):
        return super().step(text, [ToolCall("lookup", {"word": text})])
'''

ESTIMATORS = '''
from llmrl.estimators import EstimatorOutput, register

CALLS = [0]


@register("half_rows", q_estimate="R", baseline="none")
def half_rows(x):
    """Fine at step 1; at step 2 advantages for half the rows."""
    CALLS[0] += 1
    adv = x.token_rewards.clone()
    return EstimatorOutput(adv if CALLS[0] == 1 else adv[: len(adv) // 2])
'''

LOSSES = '''
import torch

from llmrl.losses import PolicyLoss, register_policy_loss


@register_policy_loss("per_token", formula="-A·ρ per token, never reduced")
def per_token(logprobs, old_logprobs, advantages, mask, *settings, **totals):
    ratio = torch.exp(logprobs - old_logprobs)
    return PolicyLoss(-advantages * ratio, ratio.new_zeros(()), ratio.new_zeros(()))


@register_policy_loss("nan_grad", formula="PPO's loss plus 0·√0: finite, its gradient NaN")
def nan_grad(logprobs, old_logprobs, advantages, mask, *settings, **totals):
    from llmrl.losses import policy_loss

    out = policy_loss(logprobs, old_logprobs, advantages, mask, *settings, **totals)
    return PolicyLoss(out.loss + torch.sqrt(logprobs.sum() * 0.0), out.clip_frac, out.approx_kl)
'''


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of misbehaving plug-ins: envs.py (environments), bad_est.py and bad_loss.py (modules to import)."""
    path = tmp_path_factory.mktemp("plugins")
    (path / "envs.py").write_text(ENVS)
    (path / "bad_est.py").write_text(ESTIMATORS)
    (path / "bad_loss.py").write_text(LOSSES)
    return path


def _train(model: Path, plugins: Path, out: Path, *args: str, steps: int = 2) -> tuple[int, str, str]:
    """`llmrl train` as a real subprocess, the plug-ins' folder importable."""
    cmd = [sys.executable, "-m", "llmrl", "train", "--model", str(model), "--steps", str(steps), "--out", str(out),
           *TINY_RUN, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugins)])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=plugins, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def _one_sentence(code: int, out: str, err: str, want_code: int, sentence: str) -> str:
    """The run stopped with `want_code` and one line on stderr, 'error: ' + a line starting with `sentence`."""
    lines = err.strip().splitlines()
    assert code == want_code, (code, out[-1500:], err[-2000:])
    assert "Traceback" not in out + err and LAST_RESORT not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {sentence}"), err[-2000:]
    count("plug-ins: the real command line", "refused")
    return lines[0]


# --- during a run: exit 1, a checkpoint of the last completed step (real subprocesses) -----------

def test_an_environment_reward_of_nan_stops_the_run_at_its_source(tiny_model_dir: Path, plugins: Path,
                                                                    tmp_path: Path) -> None:
    """Was: exit 0, every update of both steps skipped (skipped_updates 2 a step, reward_mean null)."""
    out = tmp_path / "nan"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--env", "envs.py:NaNReward", "--set", "eval.size=0"), 1,
                         "Environment 'envs.py:NaNReward' returned the reward nan from step (episode 0, turn 1); a "
                         "reward is a finite number within float32's range (|r| ≤ 3.403e+38).")
    assert line.endswith(f"Training state after step 1 is checkpointed; fix the cause and continue with: "
                         f"llmrl train --resume {out}")
    assert [p.name for p in list_checkpoints(out)] == ["step-000001"]
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and rows[0]["skipped_updates"] == 0


def test_a_task_reward_plus_environment_rewards_beyond_float32_stops_the_run(tiny_model_dir: Path, plugins: Path,
                                                                             tmp_path: Path) -> None:
    """Each term within float32's range (3e38 ≤ 3.4028e38), their sum 6e38 not: the episode's reward
    is refused in one sentence where run/draws.py adds them (was: reward inf, no error)."""
    out = tmp_path / "sum"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--env", "envs.py:HugeLater", "--reward",
                                 "envs.py:huge_task_reward", "--set", "eval.size=0"), 1,
                         "The reward of episode 0 overflows float32: the task's reward 3e+38 plus the environment's "
                         "3e+38; scale one of them down. Training state after step 1 is checkpointed")
    assert line.endswith(f"continue with: llmrl train --resume {out}")
    assert [p.name for p in list_checkpoints(out)] == ["step-000001"]


@pytest.mark.parametrize(("env", "returned"), [
    ("InfReward", "the reward inf from step (episode 0, turn 1); a reward is a finite number within float32's range "
                  "(|r| ≤ 3.403e+38)."),
    ("DoneYes", "done='yes' from step (episode 0, turn 1); done is True or False."),
    ("TextMessages", "EnvStep(messages=the str 'higher') from step (episode 0, turn 1); messages is a list of "
                     "{role: str, content: str} messages."),
    ("MoreErrors", "tool_calls=1, tool_errors=2 from step (episode 0, turn 1); both are whole numbers ≥ 0, "
                   "tool_errors ≤ tool_calls."),
], ids=["inf-reward", "done-not-bool", "messages-not-a-list", "more-errors-than-calls"])
def test_a_bad_step_field_stops_the_run_at_its_source(tiny_model_dir: Path, plugins: Path, tmp_path: Path, env: str,
                                                      returned: str) -> None:
    """The docs/errors.md rows of `step`'s reward (±inf) and its other fields, at step 2 of a real run."""
    out = tmp_path / "r"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--env", f"envs.py:{env}", "--set", "eval.size=0"), 1,
                         f"Environment 'envs.py:{env}' returned {returned} Training state after step 1 is checkpointed")
    assert line.endswith(f"continue with: llmrl train --resume {out}")
    assert [p.name for p in list_checkpoints(out)] == ["step-000001"]


@pytest.mark.parametrize(("env", "sentence"), [
    ("BreaksOnceItPlays", "Environment 'envs.py:BreaksOnceItPlays' cannot be built with no argument: RuntimeError: the "
                          "board is taken (episode 1)."),
    ("ResetLater", "Environment 'envs.py:ResetLater' returned the str "),
], ids=["construction", "reset"])
def test_an_environment_that_fails_to_start_an_episode_during_the_run_stops_it(
        tiny_model_dir: Path, plugins: Path, tmp_path: Path, env: str, sentence: str) -> None:
    """Construction and reset pass the checks before the run (one object; every row's opening with key 0),
    then fail in step 1's episodes: exit 1, nothing trained yet."""
    out = tmp_path / "r"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--env", f"envs.py:{env}", "--set", "eval.size=0"), 1,
                         sentence)
    if env == "ResetLater":
        assert "from reset (episode 0), not a non-empty list of {role: str, content: str} messages." in line
    assert line.endswith("No checkpoint was written yet; fix the cause and start again with --overwrite.")
    assert list_checkpoints(out) == []


def test_a_tools_result_that_is_neither_text_nor_json_stops_the_run(tiny_model_dir: Path, plugins: Path,
                                                                     tmp_path: Path) -> None:
    out = tmp_path / "tool"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--env", "envs.py:Lookup", "--set", "eval.size=0"), 1,
                         f"Tool '{plugins / 'envs.py'}:lookup' returned a set; a tool returns a str, or a JSON value "
                         "(None, a bool, a finite number, or a list or dict of them), written as JSON (environment "
                         "'envs.py:Lookup', episode 0, turn 1).")
    assert line.endswith("No checkpoint was written yet; fix the cause and start again with --overwrite.")
    assert list_checkpoints(out) == []


def test_an_estimators_advantages_of_the_wrong_shape_stop_the_run(tiny_model_dir: Path, plugins: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "est"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--set", "estimator.module=bad_est", "--set",
                                 "estimator.name=half_rows", "--set", "eval.size=0"), 1,
                         "Estimator 'half_rows' (bad_est:half_rows) returned advantages that are a torch.float32 "
                         "tensor of shape (2, ")
    assert ") on cpu, for a batch of shape (4, " in line and "advantages must be a floating tensor of that shape" in line
    assert [p.name for p in list_checkpoints(out)] == ["step-000001"]


def test_a_policy_loss_that_is_not_a_scalar_stops_the_run(tiny_model_dir: Path, plugins: Path, tmp_path: Path) -> None:
    out = tmp_path / "loss"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--set", "update.policy_loss_module=bad_loss", "--set",
                                 "update.policy_loss=per_token", "--set", "eval.size=0"), 1,
                         "Policy loss 'per_token' (bad_loss:per_token) returned a loss that is a torch.float32 tensor "
                         "of shape (4, ")
    assert "not a scalar (a floating 0-d tensor)." in line and "No checkpoint was written yet" in line


def test_a_reward_model_without_labels_is_named(tiny_model_dir: Path, plugins: Path, tmp_path: Path) -> None:
    """A real classifier saved with num_labels=0: its logits are (batch, 0), with no score to read."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from llmrl.models.tokenizer import build_char_tokenizer

    rm = tmp_path / "rm0"
    tok = build_char_tokenizer()
    LlamaForSequenceClassification(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                               num_labels=0, pad_token_id=tok.pad_token_id)).save_pretrained(rm)
    tok.save_pretrained(rm)
    out = tmp_path / "rm"
    line = _one_sentence(*_train(tiny_model_dir, plugins, out, "--reward", str(rm), "--set", "eval.size=0", steps=1), 1,
                         f"Reward model '{rm}' returned logits of shape (4, 0) (torch.float32) for completions 0–3, not "
                         "a floating (batch, labels) tensor of shape (4, L) with L ≥ 1 labels.")
    assert "No checkpoint was written yet" in line


# --- before the first step: exit 2, nothing trained (in-process, the real CLI) -------------------

def _refused(model: Path, plugins: Path, out: Path, *args: str) -> str:
    code, stdout, err = cli_run(["train", "--model", str(model), "--steps", "2", "--out", str(out), *TINY_RUN, *args])
    return _one_sentence(code, stdout, err, 2, "")


@pytest.mark.parametrize(("env", "sentence"), [
    ("NeedsArg", "Environment '{p}:NeedsArg' cannot be built with no argument: TypeError: NeedsArg.__init__() missing 1 "
                 "required positional argument: 'size'; llmrl builds one object per episode with no argument, so its "
                 "constructor must take none (give the others defaults)."),
    ("Tools42", "Environment '{p}:Tools42' returned the int 42 from tools(); tools() returns None or a list of tool "
                "schemas, each {{'type': 'function', 'function': {{'name': str, 'parameters': {{...}}}}}}."),
    ("NotSchemas", "Environment '{p}:NotSchemas' returned from tools() a list whose item 0 is {{'not': 'a schema'}}, "
                   "not a tool schema {{'type': 'function', 'function': {{'name': str, 'parameters': {{...}}}}}}."),
    ("Boom", "Environment '{p}:Boom' cannot be built with no argument: RuntimeError: no boards left."),
    ("ToolsRaise", "Environment '{p}:ToolsRaise' raised ValueError in tools(): no schemas today."),  # was: exit 1
], ids=["NeedsArg", "Tools42", "NotSchemas", "Boom", "ToolsRaise"])
def test_an_environment_that_cannot_be_built_or_offers_no_schemas_is_refused_before_the_run(
        tiny_model_dir: Path, plugins: Path, tmp_path: Path, env: str, sentence: str) -> None:
    """Was: the last resort's 'failed with TypeError … (an error llmrl did not expect)' / exit 0, tools never read."""
    path = plugins / "envs.py"
    line = _refused(tiny_model_dir, plugins, tmp_path / "r", "--env", f"{path}:{env}")
    assert line == "error: " + sentence.format(p=path)
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


@pytest.mark.parametrize("env", ["NeedsArg", "Tools42", "ToolsRaise"])
def test_llmrl_eval_refuses_an_environment_that_cannot_be_built_or_offers_no_schemas(tiny_model_dir: Path,
                                                                                     plugins: Path, env: str) -> None:
    """`llmrl eval --env` checks the environment as `llmrl train` does, before any episode: exit 2 (was: 1,
    from the first episode)."""
    path = plugins / "envs.py"
    code, stdout, err = cli_run(["eval", "--model", str(tiny_model_dir), "--size", "2", "--samples", "0",
                                 "--env", f"{path}:{env}"])
    line = _one_sentence(code, stdout, err, 2, f"Environment '{path}:{env}' ")
    assert "(episode" not in line


def test_a_bad_value_in_the_first_evaluation_is_found_before_the_first_step(tiny_model_dir: Path, plugins: Path,
                                                                             tmp_path: Path) -> None:
    """reset returns the prompt text instead of messages: the setup, which sizes every prompt from its
    opening (issue 45), meets it before any episode is played (exit 2)."""
    path, out = plugins / "envs.py", tmp_path / "r"
    line = _refused(tiny_model_dir, plugins, out, "--env", f"{path}:Opening", "--set", "eval.size=2")
    assert line.startswith(f"error: Environment '{path}:Opening' returned the str ")
    assert line.endswith("from reset (episode 0), not a non-empty list of {role: str, content: str} messages.")
    metrics = out / "metrics.jsonl"
    assert list_checkpoints(out) == [] and (not metrics.exists() or not metrics.read_text().strip())


@pytest.mark.parametrize(("rows", "reward", "sentence"), [
    ([{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": None}], "numeric",
     "Row 2 of dataset '{d}': column 'answer', which reward 'numeric' reads, holds None, not a string or a finite "
     "number."),
    ([{"prompt": "1+1=", "answer": "two"}], "first_number",
     "Row 1 of dataset '{d}': column 'answer' holds 'two', in which reward 'first_number' finds no number, so no "
     "completion could ever match it."),
    ([{"prompt": "1+1=", "answer": [2]}], "exact_match",
     "Row 1 of dataset '{d}': column 'answer', which reward 'exact_match' reads, holds a list, not a string or a finite "
     "number."),
])
def test_a_dataset_answer_a_built_in_reward_cannot_read_is_refused(tiny_model_dir: Path, plugins: Path, tmp_path: Path,
                                                                   rows: list, reward: str, sentence: str) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows * 3))
    line = _refused(tiny_model_dir, plugins, tmp_path / "r", "--dataset", str(data), "--reward", reward,
                    "--set", "data.eval_fraction=0")
    assert line == "error: " + sentence.format(d=data)


# --- a run that applied no update says so ---------------------------------------------------------

def test_a_run_whose_every_pass_was_skipped_says_so_and_fails(tiny_model_dir: Path, plugins: Path,
                                                              tmp_path: Path) -> None:
    """A policy loss whose gradient is NaN (finite loss: nothing to refuse at the source) on 2 steps,
    fewer than update.max_bad_steps: was exit 0 and nothing said; now the summary and the last line say
    no update was applied and why, exit 1 (a real subprocess)."""
    out = tmp_path / "r"
    code, stdout, err = _train(tiny_model_dir, plugins, out, "--set", "update.policy_loss_module=bad_loss", "--set",
                               "update.policy_loss=nan_grad", "--set", "eval.size=0")
    line = _one_sentence(code, stdout, err, 1, "No update was applied in the run's 2 steps: every actor update pass of "
                                               "all 2 steps had a non-finite loss or gradient and was skipped")
    assert line.endswith(f"the adapters saved in {out} are the initial ones.")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates_applied"] == 0 and summary["no_update"].startswith("every actor update pass of all 2 steps")
    assert stdout.strip().splitlines()[-1].startswith("No update was applied: every actor update pass")


def test_a_run_whose_every_group_was_dropped_says_so_and_succeeds(tiny_model_dir: Path, plugins: Path,
                                                                  tmp_path: Path) -> None:
    """Dynamic sampling with a reward that is the same for every sample (length_penalty under its target):
    every group is dropped, legitimately; exit 0, and the summary and the last line say so (a real subprocess)."""
    out = tmp_path / "r"
    code, stdout, err = _train(tiny_model_dir, plugins, out, "--algo", "grpo", "--reward", "length_penalty", "--set",
                               "rollout.filter_groups=true", "--set", "eval.size=0")
    assert code == 0 and "Traceback" not in stdout + err, (stdout[-2000:], err[-2000:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates_applied"] == 0 and summary["no_update"].startswith("dynamic sampling (rollout.filter_groups) "
                                                                               "dropped every group of all 2 steps")
    assert stdout.strip().splitlines()[-1] == f"No update was applied: {summary['no_update']}."


def test_a_run_that_trained_records_its_updates(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r"
    code, stdout, err = cli_run(["train", "--model", str(tiny_model_dir), "--steps", "2", "--out", str(out), *TINY_RUN,
                                 "--set", "eval.size=0", "--set", "update.epochs=2"])
    assert code == 0, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates_applied"] == 4 and summary["no_update"] is None  # 2 steps × 2 epochs × 1 minibatch
    assert "No update was applied" not in stdout
