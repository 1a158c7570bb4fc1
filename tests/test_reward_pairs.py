"""`llmrl reward pairs`: preference pairs from a verifier (issue 67). The built-in tiny model (warm-started
on sums) samples the arithmetic task; every chosen answer passes the task's own reward, every rejected one
fails it, both answer the pair's prompt, a seed gives the same file, the held-out split shares no prompt
with the train split, and bad input is one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmrl.tasks import get_task
from tests.helpers import cli_refused, cli_run

ARGS = ["--task", "arithmetic", "--prompts", "16", "--samples", "4", "--pairs-per-prompt", "2",
        "--max-new-tokens", "6", "--set", "threads=1"]


def pairs_cli(model: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return cli_run(["reward", "pairs", "--model", str(model), "--out", str(out), *ARGS, *extra])


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The command on the train split twice (the second with 2 prompts per generate call, not all 16), and
    on the held-out split. `tiny` is built on first use in the session's cache, on the run's one thread."""
    folder = tmp_path_factory.mktemp("pairs")
    files = {"train": folder / "train.jsonl", "again": folder / "again.jsonl", "eval": folder / "eval.jsonl"}
    extra = {"train": [], "again": ["--set", "eval.batch_size=8"], "eval": ["--split", "eval"]}
    with pytest.MonkeyPatch.context() as mp:  # a module fixture runs before conftest's per-test cache: set it here
        mp.setenv("LLMRL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
        for name, path in files.items():
            code, stdout, stderr = pairs_cli(Path("tiny"), path, *extra[name])
            assert code == 0, (stdout, stderr)
            assert "16 prompts sampled" in stdout and "Pairs in" in stdout, stdout
    return files


@pytest.mark.parametrize("split", ["train", "eval"])
def test_chosen_passes_the_verifier_and_rejected_fails(made: dict[str, Path], split: str) -> None:
    task = get_task("arithmetic")
    rows = task.train if split == "train" else task.eval
    pairs = read(made[split])
    assert pairs, "the tiny model at T=1 gets some sums right and some wrong"
    per_row: dict[int, int] = {}
    for p in pairs:
        assert set(p) == {"prompt", "chosen", "rejected", "chosen_reward", "rejected_reward", "row"}
        row = rows[p["row"]]
        assert p["row"] < 16 and p["prompt"] == row["prompt"]  # the first --prompts rows of the split
        chosen, rejected = task.reward([row["prompt"]] * 2, [p["chosen"], p["rejected"]], answer=[row["answer"]] * 2)
        assert chosen >= task.success > rejected, p
        assert (chosen, rejected) == (p["chosen_reward"], p["rejected_reward"])
        assert p["chosen"] != p["rejected"] and p["rejected"].strip()
        per_row[p["row"]] = per_row.get(p["row"], 0) + 1
    assert max(per_row.values()) <= 2  # --pairs-per-prompt
    assert len({(p["row"], p["chosen"], p["rejected"]) for p in pairs}) == len(pairs)


def test_a_seed_gives_the_same_file_whatever_the_batch_and_the_splits_share_no_prompt(made: dict[str, Path]) -> None:
    assert made["train"].read_bytes() == made["again"].read_bytes()
    train_prompts = {p["prompt"] for p in read(made["train"])}
    eval_prompts = {p["prompt"] for p in read(made["eval"])}
    assert eval_prompts and not train_prompts & eval_prompts
    assert not eval_prompts & {r["prompt"] for r in get_task("arithmetic").train}


def test_another_seed_draws_other_pairs_and_overwrite_replaces_its_own_file(made: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    out = tmp_path / "pairs.jsonl"
    out.write_bytes(made["train"].read_bytes())  # a pairs file llmrl wrote
    code, stdout, stderr = pairs_cli(Path("tiny"), out, "--seed", "1", "--overwrite")
    assert code == 0, stderr
    assert out.read_bytes() != made["train"].read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["pairs.jsonl"]  # no temporary file left


def test_no_pair_writes_nothing_and_exits_1(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A random model never gets a sum right: every prompt's completions are all wrong."""
    out = tmp_path / "pairs.jsonl"
    stderr = cli_refused(["reward", "pairs", "--model", str(tiny_model_dir), "--out", str(out), *ARGS],
                         "No prompt gave a pair, so nothing was written: 16 prompts sampled", code=1)
    assert "16 all wrong" in stderr
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--samples", "1"], "--samples must be ≥ 2"),
        (["--pairs-per-prompt", "0"], "--pairs-per-prompt and --prompts must be ≥ 1."),
        (["--split", "test"], "--split must be train or eval; got 'test'."),
        (["--task", "chess"], "Unknown task 'chess'; valid tasks: arithmetic"),
        (["--task", "calc"], "Task 'calc' is played in episodes (environment 'calculator')"),
        (["--temperature", "0"], "--temperature must be a finite number > 0"),
        (["--set", "rollout.top_q=1"], "Unknown setting 'rollout.top_q'"),
    ],
)
def test_bad_input_is_one_sentence(tiny_model_dir: Path, tmp_path: Path, extra: list[str], message: str) -> None:
    out = tmp_path / "pairs.jsonl"
    cli_refused(["reward", "pairs", "--model", str(tiny_model_dir), "--out", str(out), *ARGS, *extra], message)
    assert not out.exists()


def test_an_out_llmrl_may_not_write_is_refused_and_left_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    base = ["reward", "pairs", "--model", str(tiny_model_dir), *ARGS]
    cli_refused([*base, "--out", str(tmp_path)], f"--out '{tmp_path}' is a folder")
    mine = tmp_path / "notes.jsonl"
    mine.write_text('{"note": "mine"}\n')
    cli_refused([*base, "--out", str(mine)], "exists; pass --overwrite to replace it")
    cli_refused([*base, "--out", str(mine), "--overwrite"], "is not a pairs file llmrl wrote")
    assert mine.read_text() == '{"note": "mine"}\n'


def test_a_dataset_with_a_reward_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--set data.dataset=FILE reward.functions=FILE.py:fn: the rows' prompts, graded by the user's reward
    with reward.success (here: an answer of an even number of characters is right)."""
    data, fn = tmp_path / "q.jsonl", tmp_path / "parity.py"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(10)))
    fn.write_text("def even(prompts, completions, **columns):\n"
                  "    return [0.5 * (len(c) % 2 == 0) for c in completions]\n")
    out = tmp_path / "pairs.jsonl"
    code, stdout, stderr = cli_run(["reward", "pairs", "--model", str(tiny_model_dir), "--out", str(out), "--samples", "4",
                                    "--max-new-tokens", "6", "--set", f"data.dataset={data}", "--set", "data.eval_fraction=0",
                                    "--set", f"reward.functions={fn}:even", "--set", "reward.success=0.5",
                                    "--set", "threads=1"])
    assert code == 0, (stdout, stderr)
    pairs = read(out)
    assert pairs and "10 prompts sampled" in stdout
    for p in pairs:
        assert p["prompt"] in {f"{i}+1=" for i in range(10)} and 0 <= p["row"] < 10
        assert len(p["chosen"]) % 2 == 0 and len(p["rejected"]) % 2 == 1
        assert (p["chosen_reward"], p["rejected_reward"]) == (0.5, 0.0)


def test_a_run_folder_samples_its_trained_actor(tiny_model_dir: Path, tmp_path: Path) -> None:
    """--model RUN: the run's base with its trained actor adapter (role 'actor'), the dataset and reward
    still the command's own."""
    from llmrl import load_config, train
    from llmrl.reward_model.verifier_pairs import open_source

    run = tmp_path / "run"
    train(load_config(overrides={"model.name": str(tiny_model_dir), "out": str(run), "steps": 1},
                      sets=["rollout.prompts_per_step=4", "update.minibatch_size=4", "eval.size=2", "eval.every=0",
                            "rollout.max_new_tokens=4", "threads=1"]))
    data, fn = tmp_path / "q.jsonl", tmp_path / "parity.py"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(10)))
    fn.write_text("def even(prompts, completions, **columns):\n    return [float(len(c) % 2 == 0) for c in completions]\n")
    sets = [f"data.dataset={data}", "data.eval_fraction=0", f"reward.functions={fn}:even", "threads=1"]
    src = open_source(str(run), None, "train", prompts=None, samples=4, pairs_per_prompt=1, overrides={}, sets=sets)
    assert src.role == "actor" and len(src.rows) == 10
    trained = [p for name, p in src.engine.stack.lm.named_parameters() if "lora_B.actor" in name]
    assert trained and any(p.abs().sum() > 0 for p in trained)  # B starts at 0: the run's step is loaded
    out = tmp_path / "pairs.jsonl"
    code, stdout, stderr = cli_run(["reward", "pairs", "--model", str(run), "--out", str(out), "--samples", "4",
                                    *[a for s in sets for a in ("--set", s)]])
    assert code == 0 and read(out), (stdout, stderr)
