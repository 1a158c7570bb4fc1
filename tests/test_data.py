"""Datasets (JSONL, CSV, Parquet through `datasets`), the train/eval split, chat templates, and
every way a dataset can be wrong: one ConfigError naming the file and the row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmrl import load_config
from llmrl.cli import app
from llmrl.config.schema import DataConfig
from llmrl.run.reporting import NullReporter
from llmrl.step.generate import encode_prompts
from llmrl.run.one_step import train_step
from llmrl.run.session import setup
from llmrl.errors import ConfigError
from llmrl.models.prompts import apply_chat_setting, render_prompts
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks import chat_sum, task_from_config
from llmrl.tasks.dataset import dataset_splits, load_rows, split_rows

# A template the character tokenizer can spell: "(" + content + ")" per message, "=" to answer.
TEMPLATE = "{% for m in messages %}({{ m['content'] }}){% endfor %}{% if add_generation_prompt %}={% endif %}"
SMALL = {"rollout.prompts_per_step": 4, "update.minibatch_size": 4, "eval.size": 4, "eval.every": 0, "steps": 1}


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _sums(n: int = 20) -> list[dict]:
    return [{"prompt": f"{i}+{i + 1}=", "answer": str(2 * i + 1), "id": i} for i in range(n)]


def test_jsonl_rows_keep_every_column_and_split_is_fixed(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "d.jsonl", _sums(20))
    cfg = DataConfig(dataset=str(f), eval_fraction=0.25)
    train, held = dataset_splits(cfg)
    assert (len(train), len(held)) == (15, 5)  # round(20 · 0.25) = 5 held out
    assert {r["id"] for r in train} | {r["id"] for r in held} == set(range(20))
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert held[0] == {"prompt": f"{held[0]['id']}+{held[0]['id'] + 1}=", "answer": str(2 * held[0]["id"] + 1), "id": held[0]["id"]}
    assert [r["id"] for r in train] == sorted(r["id"] for r in train)  # train keeps file order
    again = dataset_splits(cfg)
    assert again == (train, held)  # seeded: the same split every time
    other = dataset_splits(DataConfig(dataset=str(f), eval_fraction=0.25, split_seed=7))[1]
    assert {r["id"] for r in other} != {r["id"] for r in held}


def test_csv_and_parquet_give_the_same_rows(tmp_path: Path) -> None:
    import datasets

    rows = _sums(6)
    (tmp_path / "d.csv").write_text("prompt,answer,id\n" + "".join(f"{r['prompt']},{r['answer']},{r['id']}\n" for r in rows))
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    cfg = DataConfig(eval_fraction=0)
    from_csv = load_rows(str(tmp_path / "d.csv"), cfg)
    from_parquet = load_rows(str(tmp_path / "d.parquet"), cfg)
    assert [r["prompt"] for r in from_csv] == [r["prompt"] for r in rows]
    assert [str(r["answer"]) for r in from_csv] == [r["answer"] for r in rows]  # CSV infers ints
    assert from_parquet == rows


def test_chat_messages_prompt_column_max_rows_and_eval_file(tmp_path: Path) -> None:
    msgs = [{"q": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{i}+1"}], "answer": i + 1}
            for i in range(10)]
    f = _jsonl(tmp_path / "chat.jsonl", msgs)
    e = _jsonl(tmp_path / "eval.jsonl", msgs[:3])
    train, held = dataset_splits(DataConfig(dataset=str(f), eval_dataset=str(e), prompt_column="q", max_rows=8))
    assert len(train) == 8 and len(held) == 3
    assert train[2] == {"prompt": msgs[2]["q"], "answer": 3}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "Dataset file '{f}' does not exist."),
        ("", "Dataset '{f}' is empty."),
        ("\n\n", "Dataset '{f}' is empty."),
        ('{"question": "1+1=", "answer": "2"}\n', "Dataset '{f}' has no 'prompt' column (columns: question, answer)"),
        ('{"prompt": "1+1="}\n{"prompt": 5}\n', "Row 2 of dataset '{f}': the prompt is of type int, not a string or a list"),
        ('{"prompt": "1+1="}\n{"prompt": "2+2="}\n{"prompt": [{"role": "user"}]}\n',
         "Row 3 of dataset '{f}': message 1 of the prompt is not a {role: str, content: str} mapping"),
        ('{"prompt": "1+1="}\n{"prompt": []}\n', "Row 2 of dataset '{f}': the prompt is an empty list"),
        ('{"prompt": "1+1="}\n{"prompt": "  "}\n', "Row 2 of dataset '{f}' has an empty prompt."),
        ('{"prompt": "1+1="}\n{"answer": "3"}\n', "Row 2 of dataset '{f}': the prompt is missing"),
        ('{"prompt": "1+1="}\n{"prompt": "2+2=",\n', "Line 2 of dataset '{f}' is not valid JSON"),
        ('{"prompt": "1+1="}\n[1, 2]\n', "Line 2 of dataset '{f}' is not a JSON object (got list)"),
    ],
)
def test_bad_dataset_is_one_clear_error(tmp_path: Path, content: str | None, message: str) -> None:
    f = tmp_path / "d.jsonl"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ConfigError) as info:
        dataset_splits(DataConfig(dataset=str(f), eval_fraction=0))
    assert message.replace("{f}", str(f)) in str(info.value)


def test_other_dataset_errors(tmp_path: Path) -> None:
    txt = tmp_path / "d.txt"
    txt.write_text("x")
    with pytest.raises(ConfigError, match="unsupported format; use .jsonl, .json, .csv or .parquet"):
        load_rows(str(txt), DataConfig())
    f = _jsonl(tmp_path / "one.jsonl", _sums(1))
    with pytest.raises(ConfigError, match=r"has 1 rows; holding out data.eval_fraction=0.1 leaves none to train on"):
        dataset_splits(DataConfig(dataset=str(f)))
    with pytest.raises(ConfigError, match="A dataset needs a reward: pass --reward NAME"):
        task_from_config(load_config(overrides={"data.dataset": str(f), "data.eval_fraction": 0.0}))


def test_hub_name_offline_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigError, match="Cannot load dataset 'nobody-xyz/no-such-set' from the Hugging Face hub: "):
        load_rows("nobody-xyz/no-such-set", DataConfig())


def test_split_rows_is_a_partition() -> None:
    rows = [{"prompt": str(i)} for i in range(10)]
    train, held = split_rows(rows, 0.3, 1234, "x")
    assert len(held) == 3 and sorted(train + held, key=lambda r: int(r["prompt"])) == rows
    assert split_rows(rows, 0.0, 1234, "x") == (rows, [])


# --- chat templates ------------------------------------------------------------------------------

def _chat_tokenizer():
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_default_path_tokenizes_exactly_as_before() -> None:
    tok = build_char_tokenizer()
    prompts = ["1+2=", "33+44="]
    ids, mask = encode_prompts(tok, prompts, torch.device("cpu"))
    ref = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=True)
    assert torch.equal(ids, ref.input_ids) and torch.equal(mask, ref.attention_mask.bool())


def test_chat_template_renders_strings_and_messages_and_can_be_turned_off() -> None:
    tok = _chat_tokenizer()
    texts, templated = render_prompts(tok, ["1+2", [{"role": "system", "content": "0"}, {"role": "user", "content": "3+4"}]])
    assert templated and texts == ["(1+2)=", "(0)(3+4)="]
    ids, _ = encode_prompts(tok, ["1+2"], torch.device("cpu"))
    assert tok.decode(ids[0]) == "(1+2)="
    apply_chat_setting(tok, "off", "m")
    assert render_prompts(tok, ["1+2"]) == (["1+2"], False)
    with pytest.raises(ConfigError, match="The prompts are chat messages but the model has no chat template"):
        render_prompts(tok, [[{"role": "user", "content": "1"}]])
    with pytest.raises(ConfigError, match="'data.chat_template' is on but model 'm' has no chat template"):
        apply_chat_setting(tok, "on", "m")
    with pytest.raises(ConfigError, match="'data.system_prompt' needs a chat template to render it, and model 'm'"):
        apply_chat_setting(tok, "auto", "m", system_prompt="")  # the template was turned off above
    apply_chat_setting(_chat_tokenizer(), "auto", "m", system_prompt="")  # with one: accepted


def test_a_system_prompt_is_any_text_but_a_nul_byte_or_bytes_that_are_not_utf8() -> None:
    """A command line's undecodable bytes reach Python as lone surrogates ('\\udcff'), which no tokenizer
    encodes: refused in one sentence, as a NUL byte is; line breaks and any other character are prose."""
    assert load_config(overrides={"data.system_prompt": "Think.\nThen answer: ünïcödé ✓"}).data.system_prompt.endswith("✓")
    with pytest.raises(ConfigError, match="'data.system_prompt' must be valid UTF-8 text, got 'bad \\\\udcff'"):
        load_config(overrides={"data.system_prompt": "bad \udcff"})
    with pytest.raises(ConfigError, match="'data.system_prompt' must not hold a NUL byte"):
        load_config(overrides={"data.system_prompt": "a\x00b"})


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny test model with TEMPLATE as its tokenizer's chat template."""
    import shutil

    path = tmp_path_factory.mktemp("chat-model")
    shutil.copytree(tiny_model_dir, path, dirs_exist_ok=True)
    _chat_tokenizer().save_pretrained(path)
    return path


def test_context_check_sees_the_template_and_off_restores_raw_prompts(chat_model_dir: Path, tmp_path: Path) -> None:
    # prompts "i+j=" are ≤ 6 characters; the template adds "(", ")" and "=" → ≤ 9 tokens.
    f = _jsonl(tmp_path / "d.jsonl", [{"prompt": "12+34", "answer": "46"}] * 8)
    base = {"model.name": str(chat_model_dir), "data.dataset": str(f), "data.eval_fraction": 0.25,
            "reward.functions": ["exact_match"], "rollout.max_new_tokens": 57, **SMALL}
    with pytest.raises(ConfigError, match="Prompt 0 of the train split has 8 tokens; with rollout.max_new_tokens=57"):
        setup(load_config(overrides={**base, "out": str(tmp_path / "a")}), NullReporter())
    s = setup(load_config(overrides={**base, "out": str(tmp_path / "b"), "data.chat_template": "off"}), NullReporter())
    assert s.tokenizer.chat_template is None
    row = train_step(s, 0)
    assert row["reward/exact_match"] == row["reward_mean"]


def test_chat_sum_task_is_fixed_and_scored_on_the_last_number() -> None:
    train, held = chat_sum.splits()
    assert (len(train), len(held)) == (300, 100)
    pairs = {r["prompt"][0]["content"] for r in train + held}
    assert len(pairs) == 400 and "What is 20+20?" in pairs
    assert chat_sum.splits() == (train, held)
    from llmrl.tasks import get_task

    task = get_task("chat_sum")
    got = task.reward([r["prompt"] for r in held[:1]] * 3, ["7 + 12 = 19.", "19", "none"], answer=["19", "20", "1"])
    assert list(got) == [1.0, 0.0, 0.0]


# --- through the command line --------------------------------------------------------------------

def test_dataset_and_reward_flags_train_through_the_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "sums.jsonl", _sums(20))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "llmrl", "train", "--model", str(tiny_model_dir), "--dataset", str(f),
           "--reward", "numeric", "--algo", "grpo", "--steps", "2", "--out", str(out),
           "--set", "rollout.prompts_per_step=2", "--set", "update.minibatch_size=4", "--set", "eval.size=4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/numeric"] == r["reward_mean"] for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == str(f) and summary["eval_accuracy_before"] is not None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: str(p / "missing.jsonl"), "Dataset file '{p}/missing.jsonl' does not exist."),
        (lambda p: str(_jsonl(p / "q.jsonl", [{"question": "1+1="}])), "has no 'prompt' column (columns: question)"),
        (lambda p: str(_jsonl(p / "bad.jsonl", [{"prompt": "1+1="}, {"prompt": 7}])), "Row 2 of dataset '{p}/bad.jsonl'"),
    ],
)
def test_bad_dataset_through_the_cli(tmp_path: Path, make, message: str) -> None:
    data = make(tmp_path)
    result = CliRunner().invoke(app, ["train", "--dataset", data, "--reward", "numeric", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and message.replace("{p}", str(tmp_path)) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


def test_smollm2_recipe_is_a_valid_recipe() -> None:
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m-grpo.yaml"
    cfg = load_config(recipe)
    assert (cfg.algo, cfg.task, cfg.data.chat_template) == ("grpo", "chat_sum", "auto")
    from llmrl.models.catalog import CATALOG

    assert cfg.model.name in CATALOG and cfg.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
