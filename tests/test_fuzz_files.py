"""Corrupt copies of every file format llmrl reads (issue 30): a GGUF model, a model folder's
safetensors, a run's adapter folder, its config.yaml (edited by hand), its checkpoints, JSONL / CSV /
Parquet datasets and recipes, each empty, cut short at three offsets, with bytes flipped at two, and a
folder where the file should be. Each either works (a flipped byte inside a tensor's data is just
another weight) or stops with one sentence that names the file, a non-zero exit and no traceback;
nothing is deleted. A damaged newest checkpoint falls back to the one before it with a warning.

In-process through Typer's CliRunner, about a second per input; counted in `tests/fuzzing.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

import llmrl.run.loop as loop
from tests.fuzzing import count
from tests.gguf_writer import write_gguf
from tests.helpers import CLI_SMALL, cli_run

LAST_RESORT = "did not expect"


def damaged(data: bytes) -> list[tuple[str, bytes | None]]:
    """(label, bytes) variants of `data`: empty, cut short at 3 offsets (inside the header, half-way, one
    byte short), 2 bytes flipped at 2 offsets (the header, the end: a footer or an index); None is a
    folder in the file's place."""
    n = len(data)
    cuts = sorted({8, n // 2, n - 1} - {0, n})
    variants: list[tuple[str, bytes | None]] = [("empty", b"")]
    variants += [(f"cut at {c}", data[:c]) for c in cuts]
    for at in sorted({4, n - 3}):
        flipped = bytearray(data)
        for i in (at, at + 1):
            if i < n:
                flipped[i] ^= 0xFF
        variants.append((f"flipped at {at}", bytes(flipped)))
    return variants + [("a folder", None)]


def _place(path: Path, content: bytes | None) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if content is None:
        path.mkdir()
        (path / "inside.txt").write_text("a user's file inside the folder\n")
    else:
        path.write_bytes(content)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def check(family: str, args: list[str], bad: Path, keep: Path, names: tuple[str, ...] = (), run: bool = False) -> str:
    """Run `llmrl ARGS` with the damaged `bad` in place: exit 0, or one sentence naming the file (or
    one of `names`) with a non-zero exit; no traceback. Nothing under `keep` is deleted or changed, except,
    for `keep` a run folder (`run`) that trained on, the files a resumed run writes (its logs, config and
    checkpoints); the damaged file stays where it was in any case."""
    before = _snapshot(keep)
    code, out, err = cli_run(args)
    lines = [line for line in err.strip().splitlines() if not line.startswith("Replacing the run")]
    count(family, "traceback" if "Traceback" in out + err else "ran" if code == 0 else "refused")
    assert "Traceback" not in out + err and LAST_RESORT not in err, err[-3000:]
    after = _snapshot(keep)
    if not (run and code == 0):
        assert all(after.get(k) == v for k, v in before.items()), "a file was deleted or changed"
    assert bad.exists(), "the damaged file was deleted"
    if code != 0:
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        wanted = (bad.name, str(bad), *names)
        assert any(w in lines[0] for w in wanted), (wanted, lines[0])
    return err


@pytest.fixture(autouse=True)
def _no_curves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "draw_curves", lambda path: None)  # half a tiny run's time; not what is tested


def _train(model: Path | str, out: Path, *extra: str) -> list[str]:
    return ["train", "--model", str(model), "--steps", "1", "--out", str(out), "--overwrite", *CLI_SMALL, *extra]


# ---- models ----------------------------------------------------------------------------------

def test_a_damaged_gguf_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    good = write_gguf(LlamaForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir),
                      tmp_path / "good.gguf").read_bytes()
    folder = tmp_path / "models"
    folder.mkdir()
    for i, (label, content) in enumerate(damaged(good)):
        bad = folder / f"m{i}.gguf"
        _place(bad, content)
        check("file: GGUF model", _train(bad, tmp_path / "run"), bad, folder)


def test_damaged_safetensors_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    for i, (label, content) in enumerate(damaged((tiny_model_dir / "model.safetensors").read_bytes())):
        model = tmp_path / f"model{i}"
        shutil.copytree(tiny_model_dir, model)
        _place(model / "model.safetensors", content)
        check("file: safetensors weights", _train(model, tmp_path / "run"), model / "model.safetensors", model,
              names=(str(model),))


# ---- a run's files -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step run with a checkpoint after each step and its actor adapter."""
    out = tmp_path_factory.mktemp("fuzz-files") / "run"
    code, _, err = cli_run(["train", "--model", str(tiny_model_dir), "--steps", "2", "--out", str(out), *CLI_SMALL,
                            "--set", "checkpoint.every=1", "--set", "checkpoint.keep=2"])
    assert code == 0, err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    return out


def _each_damaged(run: Path, tmp_path: Path, rel: str, family: str, command: Callable[[Path], list[str]],
                  names: Callable[[Path], tuple[str, ...]] = lambda r: ()) -> None:
    for i, (label, content) in enumerate(damaged((run / rel).read_bytes())):
        copy = tmp_path / f"run{i}"
        shutil.copytree(run, copy)
        _place(copy / rel, content)
        check(family, command(copy), copy / rel, copy, names=names(copy), run=True)


def test_a_damaged_adapter_folder(finished_run: Path, tmp_path: Path) -> None:
    evaluate = lambda run: ["eval", "--model", str(run), "--size", "2", "--samples", "0"]  # noqa: E731
    for rel in ("adapters/actor/adapter_model.safetensors", "adapters/actor/adapter_config.json"):
        _each_damaged(finished_run, tmp_path / rel.replace("/", "-"), rel, "file: adapter folder", evaluate)


def test_a_hand_edited_run_config(finished_run: Path, tmp_path: Path) -> None:
    resume = lambda run: ["train", "--resume", str(run), "--steps", "3"]  # noqa: E731
    _each_damaged(finished_run, tmp_path, "config.yaml", "file: run config.yaml", resume)


@pytest.mark.parametrize("name", ["trainable.safetensors", "state.pt"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(finished_run: Path, tmp_path: Path,
                                                                  name: str) -> None:
    rel = f"checkpoints/step-000002/{name}"
    for i, (label, content) in enumerate(damaged((finished_run / rel).read_bytes())):
        run = tmp_path / f"run{i}"
        shutil.copytree(finished_run, run)
        _place(run / rel, content)
        err = check("file: checkpoint", ["train", "--resume", str(run), "--steps", "3"], run / rel, run, run=True)
        if label == "empty" or label.startswith("cut") or label == "a folder":
            assert "warning:" in err, (label, err)  # never read as a checkpoint: the one before it is used
        if "warning:" in err:  # refused the damaged step 2 and trained on from step 1
            assert f"{run / rel}" in err and "Resuming from the checkpoint before it, step-000001." in err, err
            assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_every_checkpoint_damaged_is_one_sentence(finished_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    for step in ("step-000001", "step-000002"):
        _place(run / "checkpoints" / step / "state.pt", b"")
    err = check("file: checkpoint", ["train", "--resume", str(run), "--steps", "3"], run, run)
    assert err.startswith(f"error: No checkpoint of '{run}' can be read: The checkpoint file "), err


# ---- datasets and recipes -------------------------------------------------------------------------

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]


def _dataset_bytes(kind: str, path: Path) -> bytes:
    if kind == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    if kind == "csv":
        return ("prompt,answer\n" + "".join(f"{r['prompt']},{r['answer']}\n" for r in ROWS)).encode()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path.read_bytes()


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_a_damaged_dataset(kind: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    good = _dataset_bytes(kind, tmp_path / f"good.{kind}")
    for i, (label, content) in enumerate(damaged(good)):
        bad = data / f"d{i}.{kind}"
        _place(bad, content)
        check(f"file: {kind} dataset", _train(tiny_model_dir, tmp_path / "run", "--dataset", str(bad), "--reward",
                                             "exact_match"), bad, data)


def test_a_damaged_recipe(tiny_model_dir: Path, tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    good = (Path(__file__).resolve().parent.parent / "recipes" / "ppo-arithmetic.yaml").read_bytes()
    for i, (label, content) in enumerate(damaged(good)):
        bad = recipes / f"r{i}.yaml"
        _place(bad, content)
        check("file: recipe", ["train", "--recipe", str(bad), *_train(tiny_model_dir, tmp_path / "run")[1:]], bad,
              recipes)


# ---- a reward run's files and preference pairs (issue 67) -----------------------------------------

@pytest.fixture(scope="module")
def reward_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished reward run on the tiny model, built by hand with plain peft (tests/reward_runs.py)."""
    from tests.reward_runs import build_reward_run

    run = tmp_path_factory.mktemp("fuzz-reward") / "rm"
    build_reward_run(run, tiny_model_dir)
    return run


@pytest.mark.parametrize("rel", ["reward.json", "adapter/adapter_config.json", "adapter/adapter_model.safetensors"])
def test_a_damaged_reward_run_given_as_the_reward(reward_run: Path, tiny_model_dir: Path, tmp_path: Path,
                                                  rel: str) -> None:
    """`llmrl train --reward RUN` with each of the reward run's files damaged: it scores (a flipped byte inside a
    tensor is another weight), or one sentence naming the run or its adapter; the reward run is left as it was."""
    score = lambda run: _train(tiny_model_dir, tmp_path / "out", "--reward", str(run))  # noqa: E731
    family = {"reward.json": "file: reward.json", "adapter/adapter_config.json": "file: reward adapter config",
              "adapter/adapter_model.safetensors": "file: reward adapter weights"}[rel]
    _each_damaged(reward_run, tmp_path, rel, family, score,
                  names=lambda run: (str(run),))


def test_a_damaged_reward_run_config_on_resume(reward_run: Path, tmp_path: Path) -> None:
    """`llmrl reward train --resume RUN` with config.yaml damaged: one sentence naming it (the run is finished, so
    one that still reads is left alone, exit 0)."""
    resume = lambda run: ["reward", "train", "--resume", str(run)]  # noqa: E731
    _each_damaged(reward_run, tmp_path, "config.yaml", "file: reward run config.yaml", resume)


def test_a_damaged_preference_dataset(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    good = "".join(json.dumps({"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": str(a + 2)}) + "\n"
                   for a in range(12)).encode()
    for i, (label, content) in enumerate(damaged(good)):
        bad = data / f"p{i}.jsonl"
        _place(bad, content)
        check("file: preference pairs", ["reward", "train", "--model", str(tiny_model_dir), "--data", str(bad), "--out",
                                         str(tmp_path / "run"), "--overwrite", "--set", "threads=1", "--set",
                                         "pairs.eval_fraction=0.2"], bad, data)
