"""Issue 6's bad-input rows not covered elsewhere, through the real CLI: one sentence on stderr,
the documented exit code, no traceback (docs/errors.md lists each row with its test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForSequenceClassification, T5Config
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.models.tokenizer import build_char_tokenizer

SMALL = ["--steps", "1", "--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=4"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folders that look like models but are not causal LMs, and broken model files."""
    root = tmp_path_factory.mktemp("bad-models")
    tok = build_char_tokenizer()
    small = dict(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16)
    T5Config(vocab_size=len(tok), d_model=16, num_layers=1, num_heads=2, d_kv=8, d_ff=16).save_pretrained(root / "t5")
    tok.save_pretrained(root / "t5")
    LlamaConfig(**small).save_pretrained(root / "no-weights")
    tok.save_pretrained(root / "no-weights")
    LlamaForSequenceClassification(LlamaConfig(**small, num_labels=1, pad_token_id=0)).save_pretrained(root / "classifier")
    tok.save_pretrained(root / "classifier")
    (root / "bad-json").mkdir()
    (root / "bad-json" / "config.json").write_text("{not json")
    (root / "garbage.gguf").write_bytes(b"this is not a GGUF file")
    # a GGUF header that promises tensors and metadata the file does not hold (a download cut short):
    # magic, version 3, 1 tensor, 1 metadata entry, then the file ends inside the entry's key length
    (root / "cut.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little")
                                    + (1).to_bytes(8, "little") + b"\x05\x00")
    return root


def _run(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def _one_line(code: int, stdout: str, stderr: str, expected_code: int, message: str) -> None:
    assert code == expected_code, stderr
    assert message in stderr, stderr
    assert "Traceback" not in stdout + stderr and len(stderr.strip().splitlines()) == 1, stderr


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("t5", "Cannot load model '{path}' as a causal LM: Unrecognized configuration class"),
        ("no-weights", "Cannot load model '{path}' as a causal LM: Error no file named model.safetensors"),
        ("bad-json", "Cannot load model '{path}' as a causal LM: It looks like the config file"),
        ("classifier", "Model '{path}' is a LlamaForSequenceClassification, not a causal language model"),
        ("garbage.gguf", "Cannot load model '{path}' as a causal LM: {path} does not start with the GGUF magic bytes"),
        ("cut.gguf", "Cannot load model '{path}' as a causal LM: the file is cut short or damaged"),
        ("missing.gguf", "Model file '{path}' does not exist."),
    ],
)
def test_model_that_is_not_a_causal_lm(models: Path, tmp_path: Path, name: str, message: str) -> None:
    path = models / name
    _one_line(*_run(["train", "--model", str(path), "--out", str(tmp_path / "r"), *SMALL]), 2,
              message.format(path=path))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("algo: [unclosed\n", "is not valid YAML (line 2)"),
        ("algo: ppo\n\tsteps: 3\n", "is not valid YAML"),
        ("update:\n  lr_actr: 0.1\n", "Unknown setting 'update.lr_actr'; did you mean 'update.lr_actor'?"),
        ("steps: many\n", "'steps' must be int, got 'many'."),
        ("- a\n- b\n", "must hold a mapping of settings, not list"),
    ],
)
def test_bad_recipe_file(tmp_path: Path, text: str, message: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    _one_line(*_run(["train", "--recipe", str(recipe), "--out", str(tmp_path / "r")]), 2, message)
    assert not (tmp_path / "r").exists()


def test_output_folder_under_a_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Not writable even for root: the run folder's parent is a regular file."""
    (tmp_path / "file").write_text("x")
    _one_line(*_run(["train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "file" / "run"), *SMALL]), 1,
              f"Cannot write to run folder '{tmp_path / 'file' / 'run'}': Not a directory.")


def test_resume_without_a_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Steps were logged but none checkpointed (a run with no completed step restarts instead:
    test_qa_files.py)."""
    import yaml

    from llmrl.config.load import load_config, to_tree

    whole = to_tree(load_config(overrides={"algo": "ppo", "model.name": str(tiny_model_dir), "out": str(tmp_path)}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(whole))  # a whole run config, as a run writes it
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    _one_line(*_run(["train", "--resume", str(tmp_path)]), 2,
              f"'{tmp_path}' has no checkpoint to resume from; start it again with --overwrite.")


def test_group_estimator_with_one_sample_per_prompt(tmp_path: Path) -> None:
    _one_line(*_run(["train", "--algo", "grpo", "--set", "rollout.num_generations=1", "--set", "update.minibatch_size=8",
                     "--out", str(tmp_path / "r")]), 2,
              "Estimator 'grpo' compares samples of a prompt; set rollout.num_generations ≥ 2.")
    assert not (tmp_path / "r").exists()
