"""`llmrl eval`: greedy accuracy equals what the trainer measured; pass@k is the unbiased estimator."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from math import comb
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmrl import load_config, read_run, train
from llmrl.cli import app
from llmrl.engines import build_engine
from llmrl.engines.base import GenerationRequest, SamplingSettings
from llmrl.model_eval import eval_model, load_target, resolve_task
from llmrl.models.tokenizer import stop_token_ids
from llmrl.run.evaluate import batch_order, evaluate, in_row_order, pass_at_k
from llmrl.step.generate import encode_prompts
from llmrl.tasks import TASKS, Task, get_task
from tests.helpers import digits_task as make_digits_task

SMALL = ["rollout.prompts_per_step=8", "update.minibatch_size=4", "eval.size=12", "eval.every=0",
         "update.lr_actor=1e-2", "rollout.max_new_tokens=4"]


def _digits() -> Task:
    return make_digits_task(success=0.5)


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(TASKS, "digits", _digits)
        train(load_config(overrides={"model.name": str(tiny_model_dir), "out": str(out), "steps": 3, "task": "digits"},
                          sets=SMALL))
    return out


@pytest.fixture(autouse=True)
def digits_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "digits", _digits)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),  # k = 1: c / n
        (4, 2, 2, 5 / 6),  # 1 − C(2,2)/C(4,2) = 1 − 1/6
        (5, 0, 3, 0.0),  # nothing correct
        (5, 3, 3, 1.0),  # only 2 wrong: every 3-subset holds a correct one
        (10, 1, 10, 1.0),  # k = n: any correct sample passes
        (10, 3, 4, 1 - 35 / 210),  # 1 − C(7,4)/C(10,4)
    ],
)
def test_pass_at_k_table(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_chance_a_random_k_subset_holds_a_correct_sample() -> None:
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                brute = sum(any(s) for s in subsets) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12), (n, c, k)


def test_run_eval_matches_what_the_trainer_measured(run_dir: Path, tiny_model_dir: Path) -> None:
    summary = read_run(run_dir).summary
    trained = eval_model(str(run_dir), samples=0)
    assert trained["task"] == "digits" and trained["prompts"] == 12 and "sampled" not in trained
    assert trained["greedy"]["reward_mean"] == pytest.approx(summary["eval_reward_after"], abs=1e-7)
    assert trained["greedy"]["accuracy"] == pytest.approx(summary["eval_accuracy_after"], abs=1e-7)
    # the plain base model is what the actor was before training
    plain = eval_model(str(tiny_model_dir), task="digits", size=12, samples=0, max_new_tokens=4)
    assert plain["greedy"]["reward_mean"] == pytest.approx(summary["eval_reward_before"], abs=1e-7)
    assert plain["greedy"]["reward_mean"] != pytest.approx(trained["greedy"]["reward_mean"], abs=1e-4)


def test_eval_metrics_eos_rate_and_length_are_those_of_its_completions(run_dir: Path) -> None:
    target = load_target(str(run_dir))
    task = resolve_task(None, target)
    engine = build_engine("hf", stack=target.stack, tokenizer=target.tokenizer, config=target.config)
    first_is_one = lambda prompts, completions, **_: [float(c[:1] == "1") for c in completions]  # noqa: E731
    logged = evaluate(engine, target.tokenizer, task.eval[:12], task.reward, max_new_tokens=4,
                      stop_ids=stop_token_ids(target.tokenizer, target.stack.lm))
    # what the run logged after its last step is the same evaluation
    summary = read_run(run_dir).summary
    assert summary["eval_eos_rate_after"] == logged.metrics["eos_rate"]
    assert summary["eval_response_len_after"] == pytest.approx(logged.metrics["response_len"], abs=1e-12)
    # this barely trained random model never draws EOS in 4 tokens, but it does draw the pad id 0 in
    # some rows: with {0, EOS} as the stop ids both kinds of row occur
    engine = replace(engine, stop_ids=[0, *stop_token_ids(target.tokenizer, target.stack.lm)])
    res = evaluate(engine, target.tokenizer, task.eval[:12], task.reward, max_new_tokens=4, batch_size=5,
                   metrics={"first_is_one": first_is_one}, stop_ids=engine.stop_ids)
    # by hand, from one unbatched request: a row stopped when it holds fewer than 4 tokens (generation
    # ends at a stop token, which the mask keeps) or its 4th token is a stop token; its length is Σ mask
    ids, mask = encode_prompts(target.tokenizer, [r["prompt"] for r in task.eval[:12]], torch.device("cpu"))
    gen = engine.generate(GenerationRequest(ids, mask, 1, SamplingSettings(4)))
    lengths = gen.response_mask.sum(-1).tolist()
    ended = [n < 4 or int(row[3]) in engine.stop_ids for n, row in zip(lengths, gen.response_ids)]
    assert 0 < sum(ended) < 12, ended  # both kinds occur: a wrong count cannot pass by chance
    assert res.metrics["eos_rate"] == pytest.approx(sum(ended) / 12, abs=1e-12)
    assert res.metrics["response_len"] == pytest.approx(sum(lengths) / 12, abs=1e-12)
    assert res.metrics["first_is_one"] == pytest.approx(sum(c[:1] == "1" for c in res.completions) / 12, abs=1e-12)


def test_rows_that_share_an_opening_are_batched_together_and_come_back_in_row_order(run_dir: Path) -> None:
    # a mixture's held-out rows come one task at a time (A, B, A, B, …); batched in that order every
    # batch holds both tasks and shares only the template's opening
    mixed = [f"Task {t}: question {i}" for i in range(4) for t in "AB"]
    assert batch_order(mixed, 3) == [0, 2, 4, 6, 1, 3, 5, 7]  # A's four, then B's four
    assert batch_order(mixed, 8) == list(range(8))  # one batch: the rows as given, the plain batch
    chats = [[{"role": "user", "content": p}] for p in mixed]
    assert batch_order(chats, 3) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert in_row_order([mixed[i] for i in batch_order(mixed, 3)], batch_order(mixed, 3)) == mixed
    # through the real engine: 12 rows in batches of 5, run in another order than given, come back in
    # row order (equal to one batch of 12, which runs them as given)
    target = load_target(str(run_dir))
    task = resolve_task(None, target)
    engine = build_engine("hf", stack=target.stack, tokenizer=target.tokenizer, config=target.config)
    rows = task.eval[:12]
    order = batch_order([r["prompt"] for r in rows], 5)
    whole = evaluate(engine, target.tokenizer, rows, task.reward, max_new_tokens=4, batch_size=12)
    batched = evaluate(engine, target.tokenizer, rows, task.reward, max_new_tokens=4, batch_size=5)
    # the completions in batch order differ from them in row order: an order not undone would show
    assert [whole.completions[i] for i in order] != whole.completions
    assert batched.completions == whole.completions
    assert (batched.accuracy, batched.reward_mean) == (whole.accuracy, whole.reward_mean)


def test_sampled_eval(run_dir: Path) -> None:
    report = eval_model(str(run_dir), samples=4, size=12)
    sampled = report["sampled"]
    assert set(sampled) >= {"pass@1", "pass@4", "reward_mean"}
    assert 0 < sampled["pass@1"] <= sampled["pass@4"] <= 1
    # the per-row uniforms make the samples independent of the batch layout
    assert eval_model(str(run_dir), samples=4, size=12, batch_size=5)["sampled"] == sampled
    # another seed draws other samples
    assert eval_model(str(run_dir), samples=4, size=12, seed=1)["sampled"]["reward_mean"] != sampled["reward_mean"]
    # at a vanishing temperature sampling is greedy: pass@1 = pass@4 = greedy accuracy
    cold = eval_model(str(run_dir), samples=4, size=12, temperature=1e-4)
    assert cold["sampled"]["pass@1"] == cold["sampled"]["pass@4"] == cold["greedy"]["accuracy"]
    assert cold["sampled"]["reward_mean"] == pytest.approx(cold["greedy"]["reward_mean"], abs=1e-6)


def test_cli_eval_table_and_json(run_dir: Path) -> None:
    runner = CliRunner()
    table = runner.invoke(app, ["eval", "--model", str(run_dir), "--size", "6", "--samples", "3"], env={"COLUMNS": "150"})
    assert table.exit_code == 0, table.stderr
    assert "accuracy (greedy)" in table.stdout and "pass@1" in table.stdout and "pass@3" in table.stdout
    js = runner.invoke(app, ["eval", "--model", str(run_dir), "--size", "6", "--samples", "3", "--json"])
    assert js.exit_code == 0, js.stderr
    report = json.loads(js.stdout)
    assert report["prompts"] == 6 and report["sampled"]["samples"] == 3 and "pass@3" in report["sampled"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--samples", "-1"], "--samples must be ≥ 0"),
        (["--task", "chess"], "Unknown task 'chess'; valid tasks: arithmetic"),
        (["--device", "tpu"], "--device must be one of cpu, cuda, auto"),
    ],
)
def test_cli_eval_bad_input(run_dir: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["eval", "--model", str(run_dir), *args])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_cli_eval_missing_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_eval_on_a_dataset_file_equals_the_same_rows_as_a_task(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--dataset FILE scores every row of the file with --reward: the arithmetic eval rows written to
    a JSONL file and scored with the exact_match built-in give exactly the task's numbers."""
    rows = get_task("arithmetic").eval[:10]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "--model", str(tiny_model_dir), "--size", "10", "--samples", "2", "--json"]
    from_task = CliRunner().invoke(app, [*args, "--task", "arithmetic"])
    from_file = CliRunner().invoke(app, [*args, "--dataset", str(data), "--reward", "exact_match"])
    assert from_task.exit_code == 0 and from_file.exit_code == 0, (from_task.stderr, from_file.stderr)
    a, b = json.loads(from_task.stdout), json.loads(from_file.stdout)
    assert (b["task"], b["prompts"]) == ("sums", 10)
    assert b["greedy"] == a["greedy"] and b["sampled"] == a["sampled"]


def test_eval_dataset_needs_a_reward_and_excludes_task(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    no_reward = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dir), "--dataset", str(data)])
    assert no_reward.exit_code == 2 and "needs a reward" in no_reward.stderr
    both = CliRunner().invoke(app, ["eval", "--model", str(tiny_model_dir), "--dataset", str(data), "--task", "arithmetic"])
    assert both.exit_code == 2 and "not both" in both.stderr


def _markov_chat_model(folder: Path) -> None:
    """A chat model whose next token depends on the current token alone (its attention and MLP write nothing:
    o_proj and down_proj are zero; embedding i is the unit vector e_i, so the final norm gives √128·e_i and
    the head's column i, one 1 at the successor, makes that logit √128 ≈ 11.3, the others 0): after the
    assistant's opening '\\n' it writes '12*34=' and its end token, in every turn. In the plain format that
    turn is a calculator call, in the json format (no JSON object in it) the answer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.test_episodes import chat_tokenizer

    tok = chat_tokenizer()
    vocab, end = len(tok), tok.convert_tokens_to_ids("<|im_end|>")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=2048,
                                         pad_token_id=tok.pad_token_id, eos_token_id=end, tie_word_embeddings=False))
    script = tok.convert_tokens_to_ids(list("\n12*34="))
    successor = dict.fromkeys(range(vocab), end) | dict(zip(script, script[1:]))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, 128))
        head = torch.zeros(vocab, 128)
        for a, b in successor.items():
            head[b, a] = 1.0
        model.lm_head.weight.copy_(head)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def test_an_eval_on_another_task_reads_that_tasks_tool_format(tmp_path: Path) -> None:
    """`llmrl eval RUN --task OTHER` reads OTHER's own tool format where the run left rollout.tool_format auto
    (config.yaml keeps auto), and a format the run set itself wins. The model writes '12*34=' every turn
    (`_markov_chat_model`), so with max_turns 2 an episode read in the plain format makes 2 calls, one read in
    json makes none and ends after its first turn: exact counts, not chance."""
    model = tmp_path / "model"
    _markov_chat_model(model)
    small = ["rollout.prompts_per_step=2", "update.minibatch_size=2", "eval.size=2", "eval.every=0", "threads=1",
             "rollout.max_new_tokens=8", "rollout.max_turns=2"]

    def run(name: str, task: str, *extra: str) -> Path:
        out = tmp_path / name
        train(load_config(overrides={"model.name": str(model), "out": str(out), "steps": 1, "task": task},
                          sets=[*small, *extra]))
        return out

    def read_in(report: dict, fmt: str) -> None:
        calls, turns = {"plain": (2.0, 2.0), "json": (0.0, 1.0)}[fmt]
        assert (report["greedy"]["tool_calls_per_episode"], report["greedy"]["turns_mean"]) == (calls, turns)
        assert report["tool_format"] == fmt

    plain_run = run("chat_calc", "chat_calc")
    assert read_run(plain_run).summary["eval_tool_calls_per_episode_after"] == 2.0  # trained in its task's plain
    read_in(eval_model(str(plain_run), task="chat_calc_json", samples=0), "json")
    read_in(eval_model(str(plain_run), samples=0), "plain")  # its own task: its own format
    json_run = run("chat_calc_json", "chat_calc_json")
    assert read_run(json_run).summary["eval_tool_calls_per_episode_after"] == 0.0
    read_in(eval_model(str(json_run), task="chat_calc", samples=0), "plain")
    js = CliRunner().invoke(app, ["eval", "--model", str(json_run), "--task", "chat_calc", "--samples", "0", "--json"])
    assert js.exit_code == 0, js.stderr
    read_in(json.loads(js.stdout), "plain")
    set_run = run("chat_calc_set", "chat_calc", "rollout.tool_format=plain")  # set by the user: kept
    read_in(eval_model(str(set_run), task="chat_calc_json", samples=0), "plain")
    read_in(eval_model(str(set_run), task="chat_calc_json", samples=0, tool_format="json"), "json")  # the flag wins
