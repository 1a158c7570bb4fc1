"""`--model path/to/file.gguf`: a llama.cpp GGUF file (written here from a tiny Llama, as
convert_hf_to_gguf would) loads through transformers' GGUF support, computes what the original
computes, trains, evaluates and exports to a standalone safetensors model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.config.schema import ModelConfig
from llmrl.run.actor import load_actor
from llmrl.models.load import load_base
from llmrl.models.tokenizer import build_char_tokenizer
from tests.conftest import make_tiny_model
from tests.gguf_writer import write_gguf

SMALL = ["--set", "rollout.prompts_per_step=4", "--set", "update.minibatch_size=4", "--set", "eval.size=4",
         "--set", "eval.every=0"]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(make_tiny_model(), build_char_tokenizer(), tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf")


def test_gguf_loads_the_same_model(gguf_file: Path) -> None:
    model, tokenizer = load_base(ModelConfig(name=str(gguf_file)), show_progress=False)
    original, chars = make_tiny_model(), build_char_tokenizer()
    text = "12+34= 5"
    assert tokenizer(text).input_ids == chars(text).input_ids
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.padding_side) == ("</s>", "<pad>", "left")
    ids = torch.tensor([chars(text).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, original(input_ids=ids).logits, atol=1e-6, rtol=0)


def test_train_eval_export_from_a_gguf(gguf_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    run = tmp_path / "run"
    trained = runner.invoke(app, ["train", "--model", str(gguf_file), "--out", str(run), "--steps", "2", *SMALL])
    assert trained.exit_code == 0, trained.stderr
    assert (run / "adapters" / "actor" / "adapter_model.safetensors").is_file()
    evaluated = runner.invoke(app, ["eval", "--model", str(gguf_file), "--size", "4", "--samples", "2", "--json"])
    assert evaluated.exit_code == 0 and '"pass@2"' in evaluated.stdout, evaluated.stderr
    out = tmp_path / "exported"
    exported = runner.invoke(app, ["export", str(run), "--out", str(out)])
    assert exported.exit_code == 0, exported.stderr
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert "quantization_config" not in (out / "config.json").read_text()
    model = AutoModelForCausalLM.from_pretrained(out)
    stack, _, _ = load_actor(run)
    ids = torch.tensor([build_char_tokenizer()("7+8=").input_ids])
    with torch.no_grad(), stack.use("actor"):
        torch.testing.assert_close(model(input_ids=ids).logits, stack.lm(input_ids=ids).logits, atol=1e-5, rtol=0)
