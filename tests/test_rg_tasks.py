"""reasoning-gym as a task source (llmrl/tasks/rg.py), mixtures (tasks/mixture.py) and `llmrl tasks`:
real generators, offline; a tiny Llama built here with room for their prompts trains on one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from llmrl.config import load_config
from llmrl.models.tokenizer import build_char_tokenizer
from llmrl.run.evaluate import per_group
from llmrl.tasks import get_task, task_from_config
from llmrl.tasks import rg as rgt

from .helpers import cli_refused, cli_run

reasoning_gym = pytest.importorskip("reasoning_gym")
SMALL = dict(train_size=200, eval_size=60)


def _task(spec: str, settings: dict | None = None, **kw):
    return get_task(spec, settings, **{**SMALL, **kw})


def test_train_and_held_out_questions_are_disjoint_and_the_held_out_set_is_fixed() -> None:
    # leg_counting with 1-2 animals of 1-3 instances has few distinct questions: the seeds alone would
    # repeat held-out questions in the train split, so the dedup is what this checks
    small = {"min_animals": 1, "max_animals": 2, "max_instances": 3}
    task = _task("rg:leg_counting", small)
    held = {r["prompt"] for r in task.eval}
    assert len(task.eval) == 60 and held.isdisjoint(r["prompt"] for r in task.train)
    assert 0 < len(task.train) < 200  # some train questions were dropped, as they equal held-out ones
    again = _task("rg:leg_counting", small, train_size=50)
    assert [r["prompt"] for r in again.eval] == [r["prompt"] for r in task.eval]
    # the held-out questions are reasoning-gym's items 0..E-1 of the generator seeded data.split_seed
    gen = reasoning_gym.create_dataset("leg_counting", **small, seed=1234, size=60)
    assert [r["answer"] for r in task.eval] == [gen[i]["answer"] for i in range(60)]
    assert task.eval[0]["prompt"] == f"{gen[0]['question'].rstrip()}\n\n{rgt.INSTRUCTION}"
    assert _task("rg:leg_counting", small).train == task.train  # a resumed run regenerates the same rows
    other = _task("rg:leg_counting", small, split_seed=7)
    assert [r["prompt"] for r in other.eval] != [r["prompt"] for r in task.eval]


def test_reward_is_reasoning_gyms_own_scorer_on_the_same_answers() -> None:
    task = _task("rg:basic_arithmetic")
    gen = reasoning_gym.create_dataset("basic_arithmetic", seed=1234, size=60)
    rows = task.eval[:6]
    answers = [r["answer"] for r in rows]
    said = [answers[0], f"{answers[1]}.", "7", f"x {answers[3]} y", "", f" {answers[5]} "]
    completions = [f"I think <answer>{a}</answer>" for a in said]
    got = task.reward([r["prompt"] for r in rows], completions, answer=answers, rg_id=[r["rg_id"] for r in rows],
                      task=[r["task"] for r in rows])
    want = [gen.score_answer(reasoning_gym.utils.extract_answer(c), gen[i]) for i, c in enumerate(completions)]
    assert got == pytest.approx(want, abs=0) and got[0] == 1.0 and 0 < got[1] < 1 and got[5] == 1.0
    # no <answer> pair: no answer, 0, as reasoning-gym scores None
    assert task.reward([rows[0]["prompt"]], [answers[0]], answer=answers[:1], rg_id=[rows[0]["rg_id"]]) == [0.0]


def test_generator_settings_from_the_query_string() -> None:
    task = _task("rg:basic_arithmetic?operators=[+,-]&max_terms=2&max_digits=1", eval_size=30)
    questions = [r["prompt"].split("\n")[0] for r in task.eval]
    assert all("*" not in q and "/" not in q for q in questions) and any("-" in q for q in questions)
    assert rgt.parse("rg:leg_counting?max_animals=3&x=true&y=[1, 2]&z=a") == (
        "leg_counting", {"max_animals": 3, "x": True, "y": [1, 2], "z": "a"})
    # '+' is a plus, not a query string's space (the docs' `operators=+,-`); %2B and %26 decode
    assert rgt.parse("rg:basic_arithmetic?operators=+,-&b=%2B&c=a%26b") == (
        "basic_arithmetic", {"operators": "+,-", "b": "+", "c": "a&b"})
    assert rgt.check_settings("basic_arithmetic", {"operators": "+,-"}, "s") == {"operators": ("+", "-")}
    # and in --task, where commas also separate a mixture's tasks: only a task's name starts a new one
    from llmrl.tasks.mixture import split_names
    assert split_names("rg:basic_arithmetic?operators=+,-,chat_sum,rg:gcd?max_value=20,rg:lcm", ("chat_sum",)) == [
        "rg:basic_arithmetic?operators=+,-", "chat_sum", "rg:gcd?max_value=20", "rg:lcm"]
    assert split_names("arithmetic,chat_sum") == ["arithmetic", "chat_sum"]  # no settings: every comma splits


def test_a_list_setting_of_enum_members_is_read_from_their_names() -> None:
    # aiw's task_types holds TaskType members, whose .value the generator reads: the text 'siblings'
    # becomes TaskType.SIBLINGS (before this, every item failed with "'str' object has no attribute 'value'")
    task = _task("rg:aiw?task_types=[siblings]&task_type_weights=[1.0]", eval_size=20)
    questions = [r["prompt"] for r in task.eval]
    assert all("sisters does" in q or "brothers does" in q for q in questions), questions[:3]
    settings = rgt.check_settings("aiw", {"task_types": "siblings,FRIENDS"}, "s")
    assert [m.value for m in settings["task_types"]] == ["siblings", "friends"]
    with pytest.raises(rgt.ConfigError, match="'task_types' takes siblings, friends, colleagues; not 'sibs'"):
        rgt.check_settings("aiw", {"task_types": "sibs"}, "rg:aiw?task_types=sibs")


def test_the_last_line_convention() -> None:
    # rg.answer=line: the prompt asks for the answer alone on the last line, and strict reads that line
    # as it is; reasoning-gym's default scorer gives len(answer)/len(line) when the answer sits inside
    # it, the partial credit that lets a model which never writes tags learn the convention
    task = get_task("rg:gcd?max_value=20", train_size=20, eval_size=10, answer="line")
    row = task.eval[0]
    a = row["answer"]
    assert row["prompt"].endswith("\n\nWrite your final answer alone on the last line.")
    completions = [f"Working...\n{a}\n", f"The gcd is {a}", f"<answer>{a}</answer>", "", f"{a}\nor not"]
    cols = dict(answer=[a] * 5, rg_id=[row["rg_id"]] * 5, task=[row["task"]] * 5)
    scores = task.reward([row["prompt"]] * 5, completions, **cols)
    assert scores[0] == 1.0 and scores[3] == 0.0 and scores[4] == 0.0
    assert scores[1] == pytest.approx(len(a) / len(f"The gcd is {a}"), abs=1e-9)  # partial credit
    assert scores[2] == pytest.approx(len(a) / len(f"<answer>{a}</answer>"), abs=1e-9)  # the tags are not the line's
    assert task.metrics["strict_accuracy"]([row["prompt"]] * 5, completions, **cols) == [1.0, 0, 0, 0, 0]
    assert task.metrics["lenient_accuracy"]([row["prompt"]] * 5, completions, **cols)[:4] == [1.0, 1.0, 1.0, 0]


def test_strict_and_lenient_readings() -> None:
    task = _task("rg:leg_counting")
    row = task.eval[0]
    a = row["answer"]
    completions = [f"<answer>{a}</answer>", f"The answer is {a}.", f"Counting...\nAnswer: **{a}**", f"<answer>{a}",
                   f"<answer>{int(a) + 1}</answer>", f"{a} legs, or maybe {int(a) + 2}"]
    cols = dict(answer=[a] * 6, rg_id=[row["rg_id"]] * 6, task=[row["task"]] * 6)
    prompts = [row["prompt"]] * 6
    assert task.metrics["strict_accuracy"](prompts, completions, **cols) == [1.0, 0, 0, 0, 0, 0]
    assert task.metrics["lenient_accuracy"](prompts, completions, **cols) == [1.0, 1.0, 1.0, 1.0, 0, 0]
    assert rgt.lenient_candidates("Sum: 3\nso <answer> 12 </answer>") == ["12", "so 12"]
    assert rgt.lenient_candidates("**The answer is 7.**\n") == ["7"]
    lenient = get_task("rg:leg_counting", reward="lenient", **SMALL).reward(prompts, completions, **cols)
    # the last one: reasoning-gym's partial credit, len(answer) / len(line), for the answer inside a longer line
    assert lenient[:5] == [1.0, 1.0, 1.0, 1.0, 0] and lenient[5] == len(a) / len(completions[5])
    both = get_task("rg:leg_counting", reward="both", **SMALL).reward(prompts, completions, **cols)
    assert both == [1.0, 0.5, 0.5, 0.5, 0, lenient[5] / 2]


def test_the_exact_reward_gives_no_partial_credit() -> None:
    # reasoning-gym's letter_counting scores a wrong count that contains the right one's digits 0.5 (or
    # len(answer)/len(given)); a Qwen2.5-0.5B run trained on that learned to write such counts (docs/tasks.md)
    task = _task("rg:letter_counting")
    row = next(r for r in task.eval if len(r["answer"]) == 1)
    a = row["answer"]
    completions = [f"<answer>{a}</answer>", f"<answer>1{a}</answer>", f"<answer>{(int(a) + 1) % 10}</answer>"]
    cols = dict(answer=[a] * 3, rg_id=[row["rg_id"]] * 3, task=[row["task"]] * 3)
    prompts = [row["prompt"]] * 3
    strict = get_task("rg:letter_counting", reward="strict", **SMALL).reward(prompts, completions, **cols)
    exact = get_task("rg:letter_counting", reward="exact", **SMALL).reward(prompts, completions, **cols)
    assert strict[0] == 1.0 and 0 < strict[1] < 1 and strict[2] == 0.0, strict  # partial credit for '1a'
    assert exact == [1.0, 0.0, 0.0]
    assert task.metrics["strict_accuracy"](prompts, completions, **cols) == exact


@pytest.mark.parametrize(("spec", "message"), [
    ("rg:leg_countin", "reasoning-gym has no dataset 'leg_countin'; did you mean 'rg:leg_counting'?"),
    ("rg:leg_counting?max_animal=3", "reasoning-gym's 'leg_counting' has no setting 'max_animal'; its settings: min_animals"),
    ("rg:leg_counting?min_animals=0", "reasoning-gym refuses the settings: min_animals must be positive"),
    ("rg:leg_counting?seed=3", "'seed' is set by llmrl"),
    ("rg:?x=1", "names no reasoning-gym dataset"),
    ("chess", "Unknown task 'chess'; valid tasks: arithmetic, chat_sum"),
    ("rg:leg_counting,,chat_sum", "has an empty name between its commas"),
])
def test_bad_task_is_one_sentence(spec: str, message: str, tmp_path: Path) -> None:
    cli_refused(["train", "--task", spec, "--out", str(tmp_path / "r")], message)


@pytest.mark.parametrize(("sets", "message"), [
    (["task=mix"], "task 'mix' trains on the tasks of mix.tasks, which is empty"),
    (["mix.tasks=rg:leg_counting,chat_sum"], "'mix.tasks' is set but task is 'arithmetic'; set task: mix"),
    (["task=mix", "mix.tasks=[{name: chat_sum, weight: 0}]"], "mix.tasks entry 'chat_sum': 'weight' must be a number > 0"),
    (["task=mix", "mix.tasks=[{name: chat_sum, size: 3}]"], "has unknown key 'size'"),
    (["task=chat_sum", "rg.config={max_animals: 3}"], "Task 'chat_sum' is built in and takes no config"),
    (["task=rg:leg_counting,chat_sum", "rg.config={max_animals: 3}"], "'rg.config' holds the settings of a single task"),
])
def test_bad_mixture_is_one_sentence(sets: list[str], message: str, tmp_path: Path) -> None:
    args = [a for s in sets for a in ("--set", s)]
    cli_refused(["train", *args, "--out", str(tmp_path / "r")], message)


def test_failing_or_exhausted_generator_is_one_sentence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # 1 animal of 1 instance: 37 questions, all of them among the 500 held out, so no train question is left
    cli_refused(["train", "--task", "rg:leg_counting?min_animals=1&max_animals=1&max_instances=1", "--out", str(tmp_path / "r")],
                "every generated train question is also a held-out one")
    from reasoning_gym.factory import DATASETS

    def boom(self, idx):
        raise RuntimeError("boom")

    monkeypatch.setattr(DATASETS["leg_counting"][0], "__getitem__", boom)
    cli_refused(["train", "--task", "rg:leg_counting", "--out", str(tmp_path / "r")],
                "Task 'rg:leg_counting': reasoning-gym's generator failed (RuntimeError: boom).")


def test_missing_package_is_one_sentence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    cli_refused(["train", "--task", "rg:leg_counting", "--out", str(tmp_path / "r")],
                "reasoning-gym tasks need the 'reasoning-gym' package, which is not installed: pip install 'llmrl[reasoning-gym]'")
    code, out, err = cli_run(["tasks", "--json"])
    assert code == 0, err
    report = json.loads(out)
    # the built-in tasks come first; tests that ran before may have registered their own after them
    assert report["reasoning_gym"] is None and [t["name"] for t in report["builtin"]][:3] == ["arithmetic", "chat_sum", "calc"]


def test_tasks_command_lists_builtins_and_reasoning_gym() -> None:
    code, out, err = cli_run(["tasks", "--json"])
    assert code == 0, err
    report = json.loads(out)
    names = [t["name"] for t in report["reasoning_gym"]]
    assert "rg:leg_counting" in names and len(names) > 90 and report["reasoning_gym_version"] == "0.1.25"
    code, out, err = cli_run(["tasks", "rg:leg_counting?max_animals=3", "--json"])
    one = json.loads(out)
    assert code == 0 and one["settings"]["max_animals"] == 10 and rgt.INSTRUCTION in one["example"]["prompt"]
    assert one["metrics"] == ["accuracy", "strict_accuracy", "lenient_accuracy"]


def test_mixture_rows_weights_reward_and_per_task_accuracy() -> None:
    cfg = load_config(overrides={"task": "mix"}, sets=[
        "mix.tasks=[{name: rg:leg_counting, weight: 3}, {name: rg:basic_arithmetic, config: {max_terms: 3}}, chat_sum]",
        "rg.train_size=100", "rg.eval_size=20"])
    task = task_from_config(cfg)
    counts = {t: sum(r["task"] == t for r in task.train) for t in ("rg:leg_counting", "rg:basic_arithmetic", "chat_sum")}
    assert counts == {"rg:leg_counting": 60, "rg:basic_arithmetic": 20, "chat_sum": 20}  # 100 · w / Σw
    assert [r["task"] for r in task.eval[:4]] == ["rg:leg_counting", "rg:basic_arithmetic", "chat_sum", "rg:leg_counting"]
    assert len(task.eval) == 20 + 20 + 100 and task.by == "task"
    assert all(set(r) == {"prompt", "answer", "task", "rg_id"} for r in task.train + task.eval)
    rows = task.eval[:6]  # 2 of each task; right answers for the first of each, wrong for the second
    right = [f"<answer>{r['answer']}</answer>" if "rg:" in r["task"] else f"{r['answer']}" for r in rows[:3]]
    completions = right + ["<answer>-1</answer>", "<answer>x</answer>", "0"]
    got = per_group(rows, completions, task.reward, by="task", success=task.success, metrics=task.metrics)
    assert got == {"accuracy/rg:leg_counting": 0.5, "strict_accuracy/rg:leg_counting": 0.5,
                   "lenient_accuracy/rg:leg_counting": 0.5, "accuracy/rg:basic_arithmetic": 0.5,
                   "strict_accuracy/rg:basic_arithmetic": 0.5, "lenient_accuracy/rg:basic_arithmetic": 0.5,
                   "accuracy/chat_sum": 0.5, "strict_accuracy/chat_sum": 0.5, "lenient_accuracy/chat_sum": 0.5}
    twice = task_from_config(load_config(overrides={"task": "chat_sum,chat_sum"}))  # a repeated name is numbered
    assert {r["task"] for r in twice.eval} == {"chat_sum", "chat_sum#2"} and len(twice.eval) == 200
    # each row is scored by its own task's reward
    alone = get_task("rg:leg_counting", train_size=60, eval_size=20)  # as in the mixture: rg_id counts its train rows
    leg = [r for r in rows if r["task"] == "rg:leg_counting"]
    assert task.reward([r["prompt"] for r in rows], completions, **{k: [r[k] for r in rows] for k in ("answer", "task", "rg_id")})[::3] \
        == alone.reward([r["prompt"] for r in leg], completions[::3], answer=[r["answer"] for r in leg], rg_id=[r["rg_id"] for r in leg])


@pytest.fixture(scope="module")
def long_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Llama with the char tokenizer and 192 positions: a reasoning-gym prompt's
    letters are <unk> to the tokenizer, and the short arithmetic ones fit."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=192,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    path = tmp_path_factory.mktemp("long-tiny")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_tiny_model_trains_on_a_reasoning_gym_mixture(long_tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    sets = ["algo=grpo", "rollout.prompts_per_step=4", "rollout.num_generations=2", "update.minibatch_size=8",
            "rollout.max_new_tokens=6", "eval.size=6", "eval.every=0", "rg.train_size=40", "rg.eval_size=10",
            "threads=1", "checkpoint.every=0", "log.completions_every=1"]
    code, stdout, stderr = cli_run(["train", "--model", str(long_tiny_dir), "--task", "rg:basic_arithmetic,rg:chain_sum",
                                    "--steps", "2", "--out", str(out), *[a for s in sets for a in ("--set", s)]])
    assert code == 0, stdout + stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["task"] == "rg:basic_arithmetic,rg:chain_sum"
    for key in ("strict_accuracy", "lenient_accuracy", "accuracy/rg:basic_arithmetic", "strict_accuracy/rg:chain_sum"):
        assert summary[f"eval_{key}_after"] is not None and 0 <= summary[f"eval_{key}_after"] <= 1, key
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert {r["task"] for r in logged} <= {"rg:basic_arithmetic", "rg:chain_sum"} and all("rg_id" in r for r in logged)
    # `llmrl eval` of the run scores the same held-out questions the trainer did
    code, stdout, stderr = cli_run(["eval", "--model", str(out), "--samples", "0", "--json"])
    assert code == 0, stderr
    report = json.loads(stdout)["greedy"]
    assert report["accuracy/rg:chain_sum"] == summary["eval_accuracy/rg:chain_sum_after"]
    assert report["lenient_accuracy"] == summary["eval_lenient_accuracy_after"]


def test_compare_reports_a_mixtures_accuracy_per_task(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from llmrl.compare.aggregate import per_task, tasks_by_algo
    from llmrl.compare.report import _task_table
    from llmrl.run.folder import Run

    def run(strict_a: float, strict_b: float) -> Run:
        summary = {"eval_accuracy_after": 0.5, "eval_strict_accuracy/rg:a_before": 0.1,
                   "eval_strict_accuracy/rg:a_after": strict_a, "eval_strict_accuracy/chat_sum_after": strict_b,
                   "eval_accuracy/chat_sum_after": 0.9}
        return Run(tmp_path, {}, [], summary)

    runs = {"grpo-s0": run(0.2, 0.4), "grpo-s1": run(0.4, 0.6), "rloo-s0": run(0.3, 0.5)}
    assert per_task(runs["grpo-s0"]) == {"rg:a": {"strict_accuracy_before": 0.1, "strict_accuracy_after": 0.2},
                                         "chat_sum": {"strict_accuracy_after": 0.4, "accuracy_after": 0.9}}
    plan = SimpleNamespace(algos=("grpo", "rloo"), runs=[SimpleNamespace(algo=n.split("-")[0], name=n) for n in runs])
    tasks = tasks_by_algo(plan, runs)
    assert tasks["grpo"]["rg:a"]["strict_accuracy_after"]["mean"] == pytest.approx(0.3)
    assert tasks["grpo"]["rg:a"]["strict_accuracy_after"]["std"] == pytest.approx(0.1414, abs=1e-4)
    table = "\n".join(_task_table({"tasks": tasks}))
    assert "| `grpo` | 10.0 ± 0.0 → 30.0 ± 14.1 % | — → 50.0 ± 14.1 % |" in table and "`rg:a` strict before → after" in table
    assert _task_table({"tasks": {}}) == []


def test_eval_of_one_task_of_a_mixture_run_drops_the_runs_mixture() -> None:
    from types import SimpleNamespace

    from llmrl.model_eval import resolve_task

    cfg = load_config(overrides={"task": "mix"}, sets=[
        "mix.tasks=[{name: rg:leg_counting, weight: 3}, chat_sum]", "rg.train_size=20", "rg.eval_size=10"])
    target = SimpleNamespace(config=cfg)
    assert resolve_task(None, target).by == "task"
    one = resolve_task("rg:chain_sum", target)
    assert one.name == "rg:chain_sum" and one.by is None and len(one.eval) == 10


def test_compare_on_a_mixture_reports_each_task(long_tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    sets = ["rollout.prompts_per_step=2", "rollout.num_generations=2", "update.minibatch_size=4",
            "rollout.max_new_tokens=4", "eval.size=4", "eval.every=0", "rg.train_size=20", "rg.eval_size=4",
            "threads=1", "checkpoint.every=0"]
    code, stdout, stderr = cli_run(["compare", "--algos", "grpo,rloo", "--model", str(long_tiny_dir), "--steps", "1",
                                    "--task", "rg:basic_arithmetic,rg:chain_sum", "--out", str(out),
                                    *[a for s in sets for a in ("--set", s)]])
    assert code == 0, stdout + stderr
    report = (out / "report.md").read_text()
    assert "## Held-out accuracy per task" in report and "`rg:chain_sum` strict before → after" in report
    tasks = json.loads((out / "summary.json").read_text())["tasks"]
    assert set(tasks) == {"grpo", "rloo"} and set(tasks["rloo"]) == {"rg:basic_arithmetic", "rg:chain_sum"}
