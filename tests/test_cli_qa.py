"""A new user's mistakes through the real CLI (quality pass): each is refused with one sentence on
stderr and a non-zero exit, and nothing the user made is deleted. Real files, a real tiny model,
real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmrl.cli import app
from tests.helpers import CLI_SMALL, cli_refused, cli_run

SMALL = CLI_SMALL
_run, _refused = cli_run, cli_refused


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step PPO run of the random tiny model."""
    out = tmp_path_factory.mktemp("qa") / "run"
    code, _, err = _run(["train", "--model", str(tiny_model_dir), "--steps", "2", "--out", str(out), *SMALL])
    assert code == 0, err
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_never_replaces_the_run_or_what_is_not_an_export(run_dir: Path, tmp_path: Path) -> None:
    before = _files(run_dir)
    _refused(["export", str(run_dir), "--out", str(run_dir), "--overwrite"], "is or contains the run folder")
    _refused(["export", str(run_dir), "--out", str(run_dir.parent), "--overwrite"], "is or contains the run folder")
    _refused(["export", str(run_dir), "--out", str(run_dir / "adapters" / "actor"), "--overwrite"],
             "is part of the run folder")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    _refused(["export", str(run_dir), "--out", str(notes), "--overwrite"], "--overwrite replaces only an earlier export")
    assert (notes / "todo.txt").read_text() == "mine"
    assert _files(run_dir) == before
    # an earlier export is still replaced, and a new folder inside the run is fine
    inside = run_dir / "merged"
    assert _run(["export", str(run_dir), "--out", str(inside)])[0] == 0
    code, _, err = _run(["export", str(run_dir), "--out", str(inside), "--overwrite", "--adapter-only"])
    assert code == 0, err
    assert (inside / "adapter_config.json").is_file() and not (inside / "model.safetensors").exists()


def test_train_refuses_a_folder_with_other_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        _refused(["train", "--model", str(tiny_model_dir), "--steps", "1", "--out", str(mine), *SMALL, *extra],
                 f"'{mine}' is not empty and holds no run; choose an empty or new --out folder.")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(("item", "message"), [
    ("update.lr_actor=nan", "'update.lr_actor' must be a finite number, got nan."),
    ("kl.beta=.inf", "'kl.beta' must be a finite number, got inf."),
    ("reward.success=-.inf", "'reward.success' must be a finite number, got -inf."),
    ("update.dual_clip=nan", "'update.dual_clip' must be a finite number, got nan."),
])
def test_non_finite_settings_are_refused(tmp_path: Path, item: str, message: str) -> None:
    _refused(["train", "--steps", "1", "--set", item, "--out", str(tmp_path / "r")], message)
    recipe = tmp_path / "r.yaml"
    key, value = item.split("=")
    section, _, leaf = key.rpartition(".")
    value = ".nan" if value == "nan" else value  # YAML's float NaN (plain `nan` is a string there)
    recipe.write_text(f"{section}:\n  {leaf}: {value}\n")
    _refused(["config", "--recipe", str(recipe)], message)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("item", "message"), [
    ("lora.target_modules=nope", "'lora.target_modules' ['nope'] matches no linear layer of the model; its linear "
                                 "layers: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj."),
    ("lora.target_modules=[input_layernorm]", "LoRA cannot adapt the model with lora.target_modules=['input_layernorm']"),
    ("lora.modules_to_save=[nrom]", "'lora.modules_to_save' entry 'nrom' matches no module of the model; its modules: "
                                    "act_fn, down_proj, embed_tokens, gate_proj, input_layernorm, k_proj, layers,"),
])
def test_lora_targets_the_model_lacks(tiny_model_dir: Path, tmp_path: Path, item: str, message: str) -> None:
    _refused(["train", "--model", str(tiny_model_dir), "--steps", "1", *SMALL, "--set", item,
              "--out", str(tmp_path / "r")], message)


def test_lora_targets_by_full_name_train(tiny_model_dir: Path, tmp_path: Path) -> None:
    code, _, err = _run(["train", "--model", str(tiny_model_dir), "--steps", "1", *SMALL, "--out", str(tmp_path / "r"),
                         "--set", "lora.target_modules=[model.layers.0.self_attn.q_proj,no_such_layer]"])
    assert code == 0, err
    adapter = json.loads((tmp_path / "r" / "adapters" / "actor" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["model.layers.0.self_attn.q_proj", "no_such_layer"]


@pytest.mark.parametrize(("content", "message"), [
    (b"steps: 1\nseed: 3\nsteps: 2\n", "sets 'steps' twice (line 3)."),
    (b"update:\n  lr_actor: 0.1\n  lr_actor: 0.2\n", "sets 'lr_actor' twice (line 3)."),
    (b"\xff\xfe s\x00t\x00", "is not valid YAML (not UTF-8 text)."),
])
def test_recipe_file_mistakes(tmp_path: Path, content: bytes, message: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(content)
    _refused(["train", "--recipe", str(recipe), "--out", str(tmp_path / "r")], f"Recipe file '{recipe}' {message}")
    assert not (tmp_path / "r").exists()


def test_recipe_that_is_a_folder(tmp_path: Path) -> None:
    _refused(["config", "--recipe", str(tmp_path)], f"Recipe file '{tmp_path}' is a folder, not a YAML file.")


def test_recipe_merge_keys_still_override(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("update:\n  <<: {lr_actor: 0.1, epochs: 2}\n  lr_actor: 0.2\n")
    result = CliRunner().invoke(app, ["config", "--recipe", str(recipe), "--yaml"])
    assert result.exit_code == 0, result.stderr
    assert "  lr_actor: 0.2\n" in result.stdout and "  epochs: 2\n" in result.stdout


def test_resume_a_finished_run_goes_nowhere_and_never_back(tiny_model_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert _run(["train", "--model", str(tiny_model_dir), "--steps", "2", "--out", str(run), *SMALL])[0] == 0
    summary = (run / "summary.json").read_bytes()
    code, stdout, stderr = _run(["train", "--resume", str(run)])
    assert code == 0 and stderr == "", stderr
    assert f"'{run}' has finished its 2 steps; nothing to resume (pass --steps N with N > 2" in stdout
    assert (run / "summary.json").read_bytes() == summary
    _refused(["train", "--resume", str(run), "--steps", "1"],
             f"'{run}' has trained 2 steps already; --steps 1 cannot go back (give more than 2 to train further).")
    assert (run / "summary.json").read_bytes() == summary
    code, _, stderr = _run(["train", "--resume", str(run), "--steps", "3"])
    assert code == 0, stderr
    assert "steps: 3\n" in (run / "config.yaml").read_text()  # config.yaml is the recipe of the 3-step run
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    code, stdout, _ = _run(["train", "--resume", str(run)])
    assert code == 0 and "has finished its 3 steps" in stdout


def test_train_refuses_task_and_dataset_together(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n' * 20)
    _refused(["train", "--task", "chat_sum", "--dataset", str(data), "--reward", "numeric", "--out", str(tmp_path / "r")],
             "Give --task or --dataset, not both.")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_eval_refuses_a_temperature_that_is_not_a_positive_number(value: str) -> None:
    _refused(["eval", "--model", "tiny", "--temperature", value], "--temperature a finite number > 0.")
