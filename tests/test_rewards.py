"""Rewards: the built-ins (hand-computed tables), user functions by module or file, a reward
model, weighted sums logged per term, and every way a reward can be wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, LlamaConfig, LlamaForSequenceClassification
from typer.testing import CliRunner

from llmrl import load_config
from llmrl.run.checkpoint import list_checkpoints
from llmrl.cli import app
from llmrl.step.score import RewardFailed, score_parts, score_texts
from llmrl.errors import ConfigError
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.rewards import build_reward
from llmrl.rewards.builtin import (exact_match, first_answer_number, first_number, format, last_number, length_penalty,
                                   numeric)
from llmrl.rewards.model import RewardModel
from tests.helpers import CLI_SMALL, cli_run

CPU = torch.device("cpu")
USER_MODULE = '''
NOT_CALLABLE = 3

def length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]

def with_answer(prompts, completions, answer, scale=1.0):
    return [scale * float(c == a) for c, a in zip(completions, answer)]

def boom(prompts, completions, **columns):
    raise ValueError("bad reward")

def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)

def short(prompts, completions, **columns):
    return [0.0]
'''


def _build(*specs, columns=frozenset({"answer"})):
    return build_reward(list(specs), columns=set(columns), source="test.jsonl", device=CPU)


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`myrewards` importable as a module, and the same code as a file."""
    path = tmp_path / "myrewards.py"
    path.write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


# --- built-ins ---------------------------------------------------------------------------------

def test_numeric_reads_the_last_number() -> None:
    completions = ["7 + 12 = 19.", "The answer is 19", "19 is not 7+12", "no number", "It is 1,234", "-3", "2.50", "19"]
    answers = ["19", "19", "19", "19", "1234", "-3", "2.5", 19]
    # last numbers: 19, 19, 12, none, 1234, -3, 2.5, 19
    assert numeric([""] * 8, completions, answer=answers) == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert last_number("x 3, 4.") == 4.0 and last_number("none") is None and last_number(7) == 7.0
    assert numeric(["", ""], ["q 5", "q 6"], column="sol", sol=["#### 5", "5"]) == [1.0, 0.0]


def test_first_number_counts_only_the_first_answer_stated() -> None:
    chat = lambda a, b: [{"role": "user", "content": f"What is {a}+{b}?"}]  # noqa: E731
    prompts = [chat(12, 9)] * 9 + ["What is 3+4?", "What is 3+4?"]
    completions = ["12+9 = 21", "12+9 = 19 or 21", "9 + 12 = 21.", "The sum of 12 and 9 is 21", "21, or maybe 20",
                   "12+9", "no number", "20 or 21", "12 + 9 = 21 and 12 + 9 = 22", "3+4=7", "4+3 is 8"]
    # the answers read: 21 (restated 12, 9 skipped), 19, 21, 21, 21, 12 (nothing after the restatement),
    # none, 20, 21, 7, 8
    assert [first_answer_number(c, p) for c, p in zip(completions, prompts)] == [
        21.0, 19.0, 21.0, 21.0, 21.0, 12.0, None, 20.0, 21.0, 7.0, 8.0]
    answers = ["21"] * 9 + ["7", "7"]
    assert first_number(prompts, completions, answer=answers) == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    # numeric reads the last number: it calls the hedges "19 or 21" and "20 or 21" right, and
    # "21, or maybe 20" and "12 + 9 = 21 and 12 + 9 = 22" wrong
    assert numeric(prompts, completions, answer=answers) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_exact_match_format_and_length_penalty_tables() -> None:
    assert exact_match([""] * 4, [" 19 ", "19.", "x", "19"], answer=["19", "19", "x", 19]) == [1.0, 0.0, 1.0, 1.0]
    assert format(["", ""], ["a1", "ab"], pattern=r"\d+") == [1.0, 0.0]
    assert format(["", "", ""], ["12", "a12", "a\nb"], pattern=r"\d+|a.b", match="full") == [1.0, 0.0, 1.0]
    # target 4: lengths 0, 4, 5, 6, 8, 12 → 0, 0, −1/4, −2/4, −4/4, −1 (clipped)
    got = length_penalty([""] * 6, ["", "abcd", "abcde", "abcdef", "a" * 8, "a" * 12], target=4)
    assert got == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


# --- resolving names ---------------------------------------------------------------------------

def test_module_and_file_functions_with_options_and_columns(user_module: Path) -> None:
    reward = _build({"name": "myrewards:with_answer", "scale": 2.0, "weight": 0.5},
                    {"name": f"{user_module}:length", "label": "len"})
    rows = [{"prompt": "p", "answer": "ab", "id": 1}, {"prompt": "p", "answer": "x", "id": 2}]
    total, parts = score_parts(reward, rows, ["ab", "xyz"])
    # with_answer ignores 'id' (it takes no **kwargs): [2·1, 2·0]; length: [2, 3]; total 0.5·w + 1·len
    assert parts["myrewards:with_answer"].tolist() == [2.0, 0.0] and parts["len"].tolist() == [2.0, 3.0]
    assert total.tolist() == [3.0, 3.0]
    assert score_texts(reward, rows, ["ab", "xyz"]).tolist() == [3.0, 3.0]


def test_duplicate_labels_get_a_suffix() -> None:
    reward = _build({"name": "format", "pattern": "1"}, {"name": "format", "pattern": "2", "weight": 2})
    total, parts = score_parts(reward, [{"prompt": "p", "answer": "1"}] * 2, ["1", "2"])
    assert list(parts) == ["format", "format_2"] and total.tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "Reward 'nosuch' is not a built-in (exact_match, numeric, first_number, math, format, length_penalty), a 'module:function'"),
        ("no_such_module_xyz:fn", "Cannot import reward module 'no_such_module_xyz': No module named 'no_such_module_xyz'."),
        ("/nonexistent/r.py:fn", "Reward file '/nonexistent/r.py' does not exist."),
        ("myrewards:nope", "Reward 'myrewards:nope': 'myrewards' has no function 'nope'."),
        ("myrewards:NOT_CALLABLE", "'NOT_CALLABLE' in 'myrewards' is not callable."),
        ({"name": "numeric", "colum": "x"}, "Reward 'numeric' has no option 'colum'; its options: column, tolerance."),
        ({"name": "myrewards:with_answer", "scal": 1}, "has no option 'scal'; its options: answer, scale."),
        ({"name": "format"}, "Reward 'format' needs a 'pattern' option (a regular expression)."),
        ({"name": "format", "pattern": "("}, "Reward 'format': pattern '(' is not a valid regular expression"),
        ({"name": "format", "pattern": "a", "match": "all"}, "'match' must be search or full, got 'all'."),
        ({"name": "length_penalty", "target": 0}, "'target' must be a positive whole number of characters, got 0."),
        ({"name": "numeric", "weight": "x"}, "'weight' must be a finite number."),
        ({"name": "numeric", "model": "x"}, "needs exactly one of 'name' or 'model'"),
        ({"weight": 1}, "needs exactly one of 'name' or 'model'"),
        ({"model": "/nonexistent/rm"}, "Cannot load reward model '/nonexistent/rm' as a sequence classifier"),
    ],
)
def test_bad_reward_entries_are_config_errors(user_module: Path, spec, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _build(spec)
    assert message in str(info.value)


def test_missing_column_and_file_that_raises_on_import(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Reward 'numeric' reads column 'answer', which 'test.jsonl' does not have "
                                          r"\(columns: solution\); set its 'column' option."):
        _build("numeric", columns={"solution"})
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('no import')\n")
    with pytest.raises(ConfigError, match=r"Importing reward file '.*broken.py' raised RuntimeError: no import."):
        _build(f"{bad}:f")


@pytest.mark.parametrize(
    ("name", "message"),
    [("boom", "raised ValueError: bad reward"), ("nan", "returned NaN or infinity"), ("short", "returned 1 values for 2")],
)
def test_a_failing_term_is_named(user_module: Path, name: str, message: str) -> None:
    reward = _build("numeric", f"myrewards:{name}")
    with pytest.raises(RewardFailed, match=f"Reward function 'myrewards:{name}' {message}"):
        score_texts(reward, [{"prompt": "p", "answer": "1"}] * 2, ["1", "2"])


def test_config_accepts_names_and_mappings(tmp_path: Path) -> None:
    cfg = load_config(sets=["reward.functions=numeric,length_penalty"])
    assert cfg.reward.functions == [{"name": "numeric"}, {"name": "length_penalty"}]
    recipe = tmp_path / "r.yaml"
    recipe.write_text("reward:\n  functions:\n    - {name: format, pattern: '^\\d+$', weight: 0.2}\n    - numeric\n")
    cfg = load_config(recipe)
    assert cfg.reward.functions == [{"name": "format", "pattern": r"^\d+$", "weight": 0.2}, {"name": "numeric"}]
    with pytest.raises(ConfigError, match="'reward.functions' must be a list of names or mappings, got 3."):
        load_config(overrides={"reward.functions": 3})


# --- reward model ------------------------------------------------------------------------------

def _save_classifier(path: Path, num_labels: int) -> Path:
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    LlamaForSequenceClassification(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save_classifier(tmp_path_factory.mktemp("rm"), 1)


def _one_by_one(path: Path, texts: list[str], label: int = 0, softmax: bool = False) -> list[float]:
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = build_char_tokenizer()
    out = []
    with torch.no_grad():
        for text in texts:
            logits = model(**tok(text, return_tensors="pt")).logits[0]
            out.append(float(logits.softmax(-1)[label] if softmax else logits[label]))
    return out


def test_reward_model_scores_prompt_plus_completion_batched_and_frozen(rm_dir: Path) -> None:
    rm = RewardModel(str(rm_dir), CPU, batch_size=2)
    prompts, completions = ["1+2=", "10+20=", "3+3=", "7+8=", "1+1="], ["3", "30", "6 ", "15", "22222"]
    got = rm(prompts, completions)
    want = _one_by_one(rm_dir, [p + c for p, c in zip(prompts, completions)])
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)  # padding changes nothing
    assert len(set(round(v, 6) for v in got)) == 5  # a random head still tells the texts apart
    assert not any(p.requires_grad for p in rm.model.parameters()) and not rm.model.training
    # as a config entry: {model: folder}, or a bare folder name; labelled by the folder's name
    for spec in ({"model": str(rm_dir), "weight": 2.0}, str(rm_dir)):
        reward = _build(spec)
        total, parts = score_parts(reward, [{"prompt": p, "answer": ""} for p in prompts], completions)
        assert list(parts) == [f"model:{rm_dir.name}"]
        torch.testing.assert_close(parts[f"model:{rm_dir.name}"], torch.tensor(want), atol=1e-5, rtol=0)


def test_reward_model_with_two_labels_gives_the_last_labels_probability(tmp_path: Path) -> None:
    path = _save_classifier(tmp_path / "rm2", 2)
    got = RewardModel(str(path), CPU)(["1+2=", "4+4="], ["3", "9"])
    want = _one_by_one(path, ["1+2=3", "4+4=9"], label=1, softmax=True)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)


# --- through the command line ------------------------------------------------------------------

FLAKY = '''
CALLS = [0]

def flaky(prompts, completions, answer):
    CALLS[0] += 1
    if CALLS[0] > 3:  # call 1: eval before training; calls 2-3: steps 1-2; step 3 breaks
        raise ZeroDivisionError("boom")
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
'''


def test_reward_that_raises_stops_the_real_cli_after_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    reward_file = tmp_path / "flaky.py"
    reward_file.write_text(FLAKY)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "llmrl", "train", "--model", str(tiny_model_dir), "--reward", f"{reward_file}:flaky",
           "--steps", "5", "--out", str(out), "--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4",
           "--set", "eval.size=4", "--set", "eval.every=0", "--set", "checkpoint.every=100"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(f"error: Reward function '{reward_file}:flaky' raised ZeroDivisionError: boom.")
    assert f"continue with: llmrl train --resume {out}" in err and "Traceback" not in proc.stderr + proc.stdout
    assert [p.name for p in list_checkpoints(out)] == ["step-000002"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(f"reward/{reward_file}:flaky" in r for r in rows)


def test_unknown_reward_is_refused_before_the_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--reward", "no_such_module_xyz:fn", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: Cannot import reward module 'no_such_module_xyz': "
                                     "No module named 'no_such_module_xyz'.")
    assert not (tmp_path / "r").exists()


# --- rewards written for TRL ---------------------------------------------------------------------

TRL_REWARD = '''
def answer_and_length(completions, prompts, answer, **kwargs):
    """Written for TRL's GRPOTrainer on a conversational dataset: called by keyword, each prompt a list of
    messages and each completion a list of one assistant message."""
    return [1000.0 * (p[-1]["role"] == "user") + 100.0 * int(a) + len(c[0]["content"])
            for c, p, a in zip(completions, prompts, answer)]


def length_only(completions, **kwargs):
    """TRL's shape for a reward that reads the completions alone (think_format_reward's)."""
    return [float(len(c[0]["content"])) for c in completions]
'''


def test_a_reward_written_for_trls_conversational_data_trains_through_the_cli(tmp_path: Path) -> None:
    """A TRL reward file, used as it is, on a dataset of chat prompts: its entry's `completions: messages` hands
    each completion as [{"role": "assistant", "content": text}], every argument by keyword, the prompts as
    their message lists. Each logged reward is 1000 (the last prompt message is the user's) + 100·answer +
    the completion's length in characters, term by term: the shapes TRL gives, or the sum would differ."""
    from tests.test_episodes import chat_tokenizer
    from transformers import LlamaForCausalLM

    tok = chat_tokenizer()
    model = tmp_path / "chat-model"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(model)
    tok.save_pretrained(model)
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "system", "content": "Answer with a number."},
                                                   {"role": "user", "content": f"What is {i}+{i % 3}?"}],
                                        "answer": str(i + i % 3)}) + "\n" for i in range(1, 21)))
    rewards = tmp_path / "trl_rewards.py"
    rewards.write_text(TRL_REWARD)
    recipe = tmp_path / "trl.yaml"
    recipe.write_text(f"reward:\n  functions:\n    - {{name: '{rewards}:answer_and_length', completions: messages}}\n"
                      f"    - {{name: '{rewards}:length_only', completions: messages, weight: 0.5}}\n")
    out = tmp_path / "run"
    code, stdout, err = cli_run(["train", "--algo", "grpo", "--model", str(model), "--dataset", str(data), "--recipe",
                                 str(recipe), "--steps", "1", "--out", str(out), *CLI_SMALL,
                                 "--set", "rollout.num_generations=2", "--set", "rollout.max_new_tokens=6",
                                 "--set", "log.completions_rows=8"])
    assert code == 0, (stdout, err)
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 8  # all 4 prompts × 2 samples of step 1
    for row in logged:
        assert isinstance(row["prompt"], list) and row["prompt"][-1]["role"] == "user"
        first, second = (row["rewards"][f"{rewards}:{f}"] for f in ("answer_and_length", "length_only"))
        assert first == 1000 + 100 * int(row["answer"]) + len(row["completion"])
        # float32 totals of values < 4000: exact to 2⁻¹² · 4000 ≈ 1e-3 at worst
        assert second == len(row["completion"]) and row["reward"] == pytest.approx(first + 0.5 * second, abs=1e-3, rel=0)
    (metrics,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    mean = sum(len(r["completion"]) for r in logged) / 8
    assert metrics[f"reward/{rewards}:length_only"] == pytest.approx(mean, abs=1e-5, rel=0)  # every row's, logged


def test_a_trl_reward_left_on_text_is_told_what_to_set(tmp_path: Path) -> None:
    """The same reward without `completions: messages`: called by keyword, it indexes a text as a message list
    on chat prompts and raises TypeError; the sentence naming it says what to set. On string prompts TRL hands
    the text too: then `length_only` reads c[0] as one character, which has no 'content'."""
    rewards = tmp_path / "trl_rewards.py"
    rewards.write_text(TRL_REWARD)
    chat = [{"prompt": [{"role": "user", "content": "What is 1+1?"}], "answer": "2"}]
    with pytest.raises(RewardFailed, match=r"raised TypeError: .* \(the prompts are chat messages: a reward written "
                                           r"for TRL's conversational data reads each completion as "
                                           r"\[\{'role': 'assistant', 'content': \.\.\.\}\]; give its reward.functions "
                                           r"entry completions: messages\)"):
        score_texts(_build(f"{rewards}:answer_and_length"), chat, ["2"])
    as_messages = _build({"name": f"{rewards}:answer_and_length", "completions": "messages"})
    assert score_texts(as_messages, chat, ["22"]).tolist() == [1000 + 200 + 2]


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"name": "numeric", "completions": "messages"},
      "Reward 'numeric' reads the completions as text; 'completions: messages' is for a function of your own "
      "written for TRL's conversational data."),
     ({"name": "myrewards:length", "completions": "chat"}, "'completions' must be text or messages, got 'chat'.")],
)
def test_the_completions_shape_is_checked(user_module: Path, spec: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _build(spec)
    assert message in str(info.value)


def test_llmrl_rewards_are_called_as_before(user_module: Path) -> None:
    # positional (prompts, completions) whatever the names; a TRL function taking only completions gets no prompts
    (user_module.parent / "named.py").write_text("def f(ps, cs):\n    return [float(len(p) + len(c)) for p, c in zip(ps, cs)]\n"
                                                 "def g(completions):\n    return [float(len(c)) for c in completions]\n")
    rows = [{"prompt": "abc", "answer": "1"}]
    assert score_texts(_build(f"{user_module.parent / 'named.py'}:f"), rows, ["xy"]).tolist() == [5.0]
    assert score_texts(_build(f"{user_module.parent / 'named.py'}:g"), rows, ["xy"]).tolist() == [2.0]
