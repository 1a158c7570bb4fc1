"""Preference pairs in TRL's format (tasks/preferences.py): each form through real JSONL, Parquet and CSV
files and a real tokenizer, the exact texts a reward model reads, the fixed train/held-out split, the length
check, and every way a row can be wrong (one ConfigError naming the file and the row)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmrl.config.reward_run import PairsConfig
from llmrl.errors import ConfigError
from llmrl.models.prompts import reward_text
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.tasks.preferences import Pair, check_lengths, load_pairs

QWEN = (Path(__file__).parent / "data" / "qwen2.5-chat-template.jinja").read_text()
SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
# A template the character tokenizer can spell: "(" + content + ")" per message.
PARENS = "{% for m in messages %}({{ m['content'] }}){% endfor %}{% if add_generation_prompt %}={% endif %}"
SKY = [{"role": "user", "content": "What color is the sky?"}]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def bot(text: str) -> dict:
    return {"role": "assistant", "content": text}


def tok(template: str | None = None):
    t = build_char_tokenizer()
    t.chat_template = template
    return t


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def parquet(path: Path, rows: list[dict]) -> str:
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def load(path: str, template: str | None = None, **kw) -> tuple[list[Pair], list[Pair]]:
    return load_pairs(PairsConfig(dataset=path, **{"eval_fraction": 0.0, **kw}), tok(template))


def test_text_pairs_with_a_prompt_are_prompt_plus_answer(tmp_path: Path) -> None:
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"},
                                     {"prompt": "2*3=", "chosen": "6", "rejected": "5", "id": 7}])
    train, held = load(f)
    assert held == []
    assert train == [Pair("1+1=2", "1+1=3", 0.0, 0), Pair("2*3=6", "2*3=5", 0.0, 1)]


def test_conversational_pairs_through_the_chat_template(tmp_path: Path) -> None:
    """Qwen2.5's own template: its default system turn, then the prompt and the answer as the assistant's turn."""
    f = parquet(tmp_path / "p.parquet", [{"prompt": SKY, "chosen": [bot("It is blue.")],
                                          "rejected": [bot("It is green.")]}])
    (pair,), _ = load(f, QWEN)
    turns = SYSTEM + "<|im_start|>user\nWhat color is the sky?<|im_end|>\n<|im_start|>assistant\n"
    assert pair == Pair(turns + "It is blue.<|im_end|>\n", turns + "It is green.<|im_end|>\n", 0.0, 0)
    assert pair.chosen == reward_text(tok(QWEN), SKY, "It is blue.")  # what an RL run's reward model reads


def test_message_prompt_with_text_answers_reads_as_an_rl_run_scores(tmp_path: Path) -> None:
    """A prompt of messages and answers of text: each answer is the assistant's turn (reward_text)."""
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": [user("1+1")], "chosen": "2", "rejected": "3"}])
    assert load(f, PARENS)[0] == [Pair("(1+1)(2)", "(1+1)(3)", 0.0, 0)]
    assert load(f)[0] == [Pair("1+1\n2", "1+1\n3", 0.0, 0)]  # no template: contents joined by newlines


def test_implicit_prompt_conversations_and_texts(tmp_path: Path) -> None:
    conv = [{"chosen": [user("1+1"), bot("2")], "rejected": [user("1+1"), bot("3")]},
            {"chosen": [{"role": "system", "content": "0"}, user("2+2"), bot("4"), user("+1"), bot("5")],
             "rejected": [user("2+2"), bot("5")]}]
    f = jsonl(tmp_path / "c.jsonl", conv)
    assert load(f, PARENS)[0] == [Pair("(1+1)(2)", "(1+1)(3)", 0.0, 0), Pair("(0)(2+2)(4)(+1)(5)", "(2+2)(5)", 0.0, 1)]
    (pair, _), _ = load(f)  # without a template: the contents joined by newlines, the RL reward's fallback
    assert pair == Pair("1+1\n2", "1+1\n3", 0.0, 0)
    assert pair.chosen == reward_text(tok(), [user("1+1")], "2")
    t = jsonl(tmp_path / "t.jsonl", [{"chosen": "1+1=2", "rejected": "1+1=3"}])
    assert load(t, PARENS)[0] == [Pair("1+1=2", "1+1=3", 0.0, 0)]  # text stays text, even with a template


def test_csv_answers_of_digits_stay_text(tmp_path: Path) -> None:
    f = tmp_path / "p.csv"
    f.write_text("prompt,chosen,rejected\n1+1=,2,3\n")
    assert load(str(f))[0] == [Pair("1+1=2", "1+1=3", 0.0, 0)]


def test_margins_from_the_margin_column_or_a_named_one(tmp_path: Path) -> None:
    rows = [{"prompt": "1", "chosen": "2", "rejected": "3", "margin": 0.5, "gap": 2},
            {"prompt": "1", "chosen": "4", "rejected": "5", "margin": 0, "gap": 0}]
    f = jsonl(tmp_path / "m.jsonl", rows)
    assert [p.margin for p in load(f)[0]] == [0.5, 0.0]  # 'margin' read where it is, as TRL does
    assert [p.margin for p in load(f, margin_column="gap")[0]] == [2.0, 0.0]
    g = jsonl(tmp_path / "n.jsonl", [{"prompt": "1", "chosen": "2", "rejected": "3"}])
    assert load(g)[0][0].margin == 0.0


def test_split_is_fixed_disjoint_and_seeded(tmp_path: Path) -> None:
    rows = [{"prompt": f"{i}+0=", "chosen": str(i), "rejected": str(i + 1)} for i in range(20)]
    f = jsonl(tmp_path / "s.jsonl", rows)
    train, held = load(f, eval_fraction=0.25)
    assert (len(train), len(held)) == (15, 5)  # round(20 · 0.25)
    assert sorted(p.row for p in train + held) == list(range(20))
    assert not {p.row for p in train} & {p.row for p in held}
    assert [p.row for p in train] == sorted(p.row for p in train)  # train keeps file order
    assert all(p.chosen == f"{p.row}+0={p.row}" for p in train + held)
    assert load(f, eval_fraction=0.25) == (train, held)
    assert {p.row for p in load(f, eval_fraction=0.25, split_seed=7)[1]} != {p.row for p in held}
    assert [p.row for p in load(f, max_rows=4)[0]] == [0, 1, 2, 3]
    e = jsonl(tmp_path / "e.jsonl", rows[:3])
    train, held = load(f, eval_fraction=0.25, eval_dataset=e, max_rows=8)
    assert ([p.row for p in train], [p.chosen for p in held]) == (list(range(8)), ["0+0=0", "1+0=1", "2+0=2"])


def test_check_lengths_counts_tokens_and_names_the_pair() -> None:
    t = tok()  # one token per character, no special tokens added
    pairs = [Pair("1+1=2", "1+1=3", 0.0, 0), Pair("1+1=2", "1+1=33", 0.0, 4)]
    check_lengths(pairs, t, 6, "train")
    with pytest.raises(ConfigError, match=r"^Row 5 of the held-out pairs is too long: its rejected text is 6 tokens, "
                                          r"over the limit of 5 \(pairs.max_length"):
        check_lengths(pairs, t, 5, "held-out")
    check_lengths([], t, 1, "train")


BAD = [
    ([{"prompt": "1", "answer": "2", "rejected": "3"}], {},
     "Dataset '{f}' has no 'chosen' column (columns: prompt, answer, rejected); preference pairs need chosen"),
    ([{"prompt": "1", "good": "2", "bad": "3"}], {}, "has no 'chosen' or 'rejected' column (columns: prompt, good, bad)"),
    ([{"prompt": "1", "chosen": "2", "rejected": "3"}, {"prompt": "1", "chosen": "", "rejected": "3"}], {},
     "Row 2 of dataset '{f}' has an empty chosen answer."),
    ([{"prompt": [user("1")], "chosen": [bot("2")], "rejected": []}], {},
     "Row 1 of dataset '{f}' has an empty rejected answer (an empty list of messages)."),
    ([{"prompt": "1", "chosen": "2", "rejected": "2"}], {},
     "Row 1 of dataset '{f}': chosen and rejected are identical, so the pair prefers nothing; drop the row."),
    ([{"chosen": [user("1"), bot("2")], "rejected": [user("1"), bot("2")]}], {}, "chosen and rejected are identical"),
    ([{"prompt": "1", "chosen": [bot("2")], "rejected": [bot("3")]}], {},
     "Row 1 of dataset '{f}': the prompt is text but the chosen answer is a list of messages; give both"),
    ([{"chosen": "2", "rejected": [user("1"), bot("3")]}], {},
     "Row 1 of dataset '{f}': chosen is text but rejected is messages; give both in one form"),
    ([{"chosen": [user("1"), bot("2")], "rejected": [user("1"), user("3")]}], {},
     "Row 1 of dataset '{f}': the rejected conversation has no assistant turn (roles: user, user), so there is no"),
    ([{"prompt": [user("1")], "chosen": [user("2")], "rejected": [bot("3")]}], {},
     "Row 1 of dataset '{f}': the chosen answer has no assistant turn (roles: user), so"),
    ([{"chosen": [user("1"), bot(" ")], "rejected": [user("1"), bot("3")]}], {},
     "Row 1 of dataset '{f}': the chosen conversation has only empty assistant turns, so there is no answer to score."),
    ([{"prompt": [user("1")], "chosen": " ", "rejected": "3"}], {}, "Row 1 of dataset '{f}' has an empty chosen answer."),
    ([{"prompt": [user("1")], "chosen": [{"role": "assistant"}], "rejected": [bot("3")]}], {},
     "Row 1 of dataset '{f}': message 1 of the chosen answer is not a {role: str, content: str} mapping"),
    ([{"prompt": "", "chosen": "2", "rejected": "3"}], {}, "Row 1 of dataset '{f}': the prompt is empty, not a"),
    ([{"prompt": "1", "chosen": 2, "rejected": "3"}], {},
     "Row 1 of dataset '{f}': the chosen answer is of type int, not a string"),
    ([{"prompt": "1", "chosen": "2", "rejected": "3", "margin": -1}], {},
     "Row 1 of dataset '{f}': the margin is -1, not a finite number ≥ 0."),
    ([{"prompt": "1", "chosen": "2", "rejected": "3", "margin": "big"}], {}, "the margin is 'big', not a finite"),
    ([{"prompt": "1", "chosen": "2", "rejected": "3"}], {"margin_column": "gap"},
     "Dataset '{f}' has no margin column 'gap' (pairs.margin_column; columns: prompt, chosen, rejected)."),
    ([{"prompt": "1", "chosen": "2", "rejected": "3"}], {"eval_fraction": 0.1},
     "Dataset '{f}' has 1 pair(s): holding out pairs.eval_fraction=0.1 leaves none to train on"),
    ([{"prompt": [user("1")], "chosen": [bot("2")], "rejected": [bot("3")]}], {"chat_template": "on"},
     "'pairs.chat_template' is on but the model's tokenizer has no chat template; use auto."),
]


@pytest.mark.parametrize("rows,kw,message", BAD)
def test_bad_pairs_are_one_sentence_naming_the_file_and_row(tmp_path: Path, rows, kw, message) -> None:
    f = jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ConfigError) as err:
        load(f, **kw)
    assert message.replace("{f}", f) in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_files_and_parquet_values(tmp_path: Path) -> None:
    import datasets

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match="^Dataset '.*empty.jsonl' is empty.$"):
        load(str(empty))
    zero = tmp_path / "zero.parquet"
    datasets.Dataset.from_dict({"prompt": [], "chosen": [], "rejected": []}).to_parquet(str(zero))
    with pytest.raises(ConfigError, match="^Cannot load dataset '.*zero.parquet' from file: "):  # datasets' word
        load(str(zero))
    one = jsonl(tmp_path / "one.jsonl", [{"prompt": "1", "chosen": "2", "rejected": "3"}])
    with pytest.raises(ConfigError, match="^Dataset '.*empty.jsonl' is empty.$"):  # the held-out file too
        load(one, eval_dataset=str(empty))
    nan = parquet(tmp_path / "nan.parquet", [{"prompt": "1", "chosen": "2", "rejected": "3", "margin": math.nan}])
    with pytest.raises(ConfigError, match=r"^Row 1 of dataset '.*nan.parquet': the margin is nan, not a finite"):
        load(nan)
    held = jsonl(tmp_path / "held.jsonl", [{"prompt": "1", "chosen": "2", "rejected": "2"}])
    with pytest.raises(ConfigError, match=r"^Row 1 of dataset '.*held.jsonl': chosen and rejected are identical"):
        load(one, eval_dataset=held)
    with pytest.raises(ConfigError, match=r"^A reward run needs preference pairs"):
        load_pairs(PairsConfig(), tok())


def test_pairs_read_as_an_rl_runs_reward_model_reads(tmp_path: Path) -> None:
    """RewardModel.text (a frozen classifier scoring RL completions) and a pair's text are one rule."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from llmrl.rewards.model import RewardModel

    t = tok()
    cfg = LlamaConfig(vocab_size=len(t), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=32, num_labels=1, pad_token_id=t.pad_token_id)
    LlamaForSequenceClassification(cfg).save_pretrained(tmp_path / "rm")
    t.save_pretrained(tmp_path / "rm")
    rm = RewardModel(str(tmp_path / "rm"), torch.device("cpu"))
    f = jsonl(tmp_path / "p.jsonl", [{"prompt": [user("1+1")], "chosen": [bot("2")], "rejected": [bot("3")]}])
    assert rm.text([user("1+1")], "2") == "1+1\n2" == load(f)[0][0].chosen  # no template: joined by newlines
    assert rm.text("1+1=", "2") == "1+1=2"
    rm.tokenizer.chat_template = PARENS
    assert rm.text([user("1+1")], "2") == "(1+1)(2)" == load(f, PARENS)[0][0].chosen


def test_a_chat_templates_refusal_names_the_row(tmp_path: Path) -> None:
    strict = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with a user "
              "turn') }}{% endif %}" + PARENS)
    f = jsonl(tmp_path / "p.jsonl", [{"chosen": [user("1"), bot("2")], "rejected": [user("1"), bot("3")]},
                                     {"chosen": [bot("2")], "rejected": [user("1"), bot("3")]}])
    with pytest.raises(ConfigError, match=r"^Row 2 of dataset '.*p.jsonl': the chat template refuses the chosen "
                                          r"conversation \(Conversations must start with a user turn\).$"):
        load(f, strict)


# Anything a row's cells may hold: text (maybe blank), messages (maybe malformed, maybe no assistant turn),
# numbers, nothing.
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                           "content": st.sampled_from(["", "1", "2+2", "="])}), max_size=3)
TEXT = st.sampled_from(["1", "2", "1+1=", "7"])
CONVERSATION = st.builds(lambda head, answer: [*head, bot(answer)], MESSAGES, TEXT)
CELL = st.one_of(st.sampled_from(["", " "]), MESSAGES, st.integers(-2, 2), st.none(), TEXT, CONVERSATION,
                 st.lists(st.sampled_from([{"role": "user"}, {"content": "1"}, {}, "x"]), min_size=1, max_size=2))
MARGIN = st.one_of(st.floats(0, 3), st.floats(allow_nan=True), st.none(), st.sampled_from(["1", True]))
GOOD = st.one_of(st.fixed_dictionaries({"prompt": TEXT, "chosen": TEXT, "rejected": TEXT}),
                 st.fixed_dictionaries({"chosen": CONVERSATION, "rejected": CONVERSATION}),
                 st.fixed_dictionaries({"prompt": st.builds(lambda c: [user(c)], TEXT),
                                        "chosen": st.builds(lambda c: [bot(c)], TEXT), "rejected": st.just([bot("0")])}))
ROW = st.one_of(GOOD, GOOD.map(lambda row: {**row, "margin": 0.5}),
                st.fixed_dictionaries({"chosen": CELL, "rejected": CELL}, optional={"prompt": CELL, "margin": MARGIN}))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROW, min_size=1, max_size=2), template=st.sampled_from([None, PARENS]))
def test_any_row_is_pairs_or_one_sentence(tmp_path: Path, rows: list[dict], template: str | None) -> None:
    """Whatever the rows hold, load_pairs returns well-formed pairs or raises one ConfigError naming the file."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        f = Path(d) / "fuzz.jsonl"
        f.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
        try:
            train, _ = load(str(f), template)
        except ConfigError as exc:
            assert str(f) in str(exc) and "\n" not in str(exc)
            event("refused")
            return
    event("pairs")
    assert len(train) == len(rows)
    for p in train:
        assert p.chosen.strip() and p.rejected.strip() and p.chosen != p.rejected
        assert math.isfinite(p.margin) and p.margin >= 0
