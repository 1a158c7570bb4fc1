"""`llmrl export` of a reward run: a merged `AutoModelForSequenceClassification` folder that plain transformers
loads and that scores as the run's peft model and llmrl's scorer do, its `--adapter-only` twin that plain peft
loads, a card that names no local path and whose snippet runs, a 4-bit run merged into the de-quantised base,
and bad reward runs refused in one sentence.

The tolerance, float32 throughout: the merged layer computes (W + s·B·A)·x where the unmerged one computes
W·x + s·B·(A·x); the two differ by float32 rounding, about √H·2⁻²⁴·|W||x| ≈ 1e-6 relative per product at H = 128,
over 2 decoder layers and the head (scores of order 1): atol 1e-4 leaves two orders of margin (measured: < 1e-5).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from typer.testing import CliRunner

from llmrl.cli import app
from llmrl.export import export_run
from tests.qwen2_tiny import save_qwen2
from tests.reward_runs import build_reward_run

TEXTS = ["2+3=5", "12+34=46", "7", "(1+2)*3=9"]  # different lengths: a right-padded batch
TOL = dict(atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_qwen2(tmp_path_factory.mktemp("rm-base") / "qwen2")


@pytest.fixture(scope="module")
def run(base: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PeftModel]:
    folder = tmp_path_factory.mktemp("rm-run") / "run"
    return folder, build_reward_run(folder, base)


@pytest.fixture(scope="module")
def merged(run: tuple[Path, PeftModel], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The merged export, through the CLI → (its folder, what the CLI printed, without white space: the
    console wraps long paths)."""
    out = tmp_path_factory.mktemp("rm-export") / "reward-merged"
    done = CliRunner().invoke(app, ["export", str(run[0]), "--out", str(out)])
    assert done.exit_code == 0, done.stderr
    return out, "".join(done.stdout.split())


def alone(model: torch.nn.Module, tokenizer, texts: list[str]) -> torch.Tensor:  # noqa: ANN001
    """Each text's score in a batch of its own (no padding at all)."""
    with torch.no_grad():
        return torch.stack([model(**tokenizer([t], return_tensors="pt")).logits[0, 0] for t in texts])


def batched(model: torch.nn.Module, tokenizer, texts: list[str]) -> torch.Tensor:  # noqa: ANN001
    """The texts' scores in one right-padded batch (asserted padded)."""
    tokenizer.padding_side = "right"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    assert not bool(batch["attention_mask"].all())
    with torch.no_grad():
        return model(**batch).logits[:, 0]


def llmrl_scores(run_dir: Path, texts: list[str]) -> torch.Tensor:
    """llmrl's own r(x) of `texts`: the reward run's adapter on its base as llmrl loads it (models/scorer.py)."""
    from llmrl.config.schema import LoraConfig, ModelConfig
    from llmrl.models.load import load_base
    from llmrl.models.scorer import RewardScorer, read_reward_adapter, tokenized

    info = json.loads((run_dir / "reward.json").read_text())
    lm, tokenizer = load_base(ModelConfig(name=info["base"], dtype="float32", quantize=info["quantize"]),
                              show_progress=False)
    scorer = RewardScorer(lm, LoraConfig(), seed=0, saved=read_reward_adapter(run_dir / "adapter"))
    ids, mask = tokenized(tokenizer, texts, torch.device("cpu"))
    with torch.no_grad():
        return scorer(ids, mask, info["pad_token_id"])


def snippet(card: str) -> str:
    found = re.search(r"```python\n(.*?)```", card, re.S)
    assert found, card
    return found.group(1)


def test_the_merged_export_loads_in_plain_transformers_and_scores_as_the_run(
        run: tuple[Path, PeftModel], merged: tuple[Path, str], base: Path) -> None:
    (run_dir, peft), (out, said) = run, merged
    assert f"Loaditwith:AutoModelForSequenceClassification.from_pretrained('{out}')" in said, said
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    pad = json.loads((run_dir / "reward.json").read_text())["pad_token_id"]
    assert type(model).__name__ == "Qwen2ForSequenceClassification" and model.config.num_labels == 1
    assert model.config.pad_token_id == pad == tokenizer.pad_token_id and tokenizer.padding_side == "right"
    saved = load_file(out / "model.safetensors")
    assert not any("lora" in k for k in saved) and saved["score.weight"].shape == (1, 128)
    plain = load_file(base / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    assert (saved["model.layers.0.self_attn.q_proj.weight"] - plain).abs().max() > 1e-3  # LoRA folded in
    scores = batched(model, tokenizer, TEXTS)
    expected = alone(peft, AutoTokenizer.from_pretrained(run_dir / "adapter"), TEXTS)
    assert expected.std() > 0.1  # texts tell apart
    torch.testing.assert_close(scores, expected, **TOL)
    torch.testing.assert_close(scores, llmrl_scores(run_dir, TEXTS), **TOL)


def test_the_card_names_no_local_path_and_its_snippet_scores(merged: tuple[Path, str], run: tuple[Path, PeftModel]) -> None:
    out = merged[0]
    card = (out / "README.md").read_text()
    for text in [card] + [f.read_text() for f in out.glob("*.json")]:
        assert str(run[0].parent) not in text and "/home/someone" not in text and str(out.parent) not in text
    assert "library_name: llmrl" in card and "pipeline_tag: text-classification" in card and "reward-model" in card
    assert "`pairs.jsonl`" in card and "the local model `qwen2`" in card  # by their last part only
    assert "| accuracy | 50.0% | 87.5% |" in card and "| margin | 0.01 | 1.25 |" in card, card
    code = snippet(card)
    assert f'from_pretrained("{out.name}")' in code
    space: dict = {}
    exec(code.replace(f'"{out.name}"', repr(str(out))).replace("print(scores)", ""), space)  # noqa: S102
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    torch.testing.assert_close(space["scores"], alone(model, tokenizer, space["texts"]), **TOL)


def test_adapter_only_loads_in_plain_peft_with_the_same_scores(run: tuple[Path, PeftModel], base: Path,
                                                                tmp_path: Path) -> None:
    run_dir, peft = run
    out = tmp_path / "reward-adapter"
    done = export_run(run_dir, out, adapter_only=True)
    assert done.kind == "adapter" and done.task == "reward"
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and config["base_model_name_or_path"] is None  # a local base
    for f in out.iterdir():
        if f.suffix in (".md", ".json"):
            assert str(tmp_path.parent) not in f.read_text() and str(base.parent) not in f.read_text(), f.name
    pad = json.loads((run_dir / "reward.json").read_text())["pad_token_id"]
    loaded = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=1, pad_token_id=pad), out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    expected = alone(peft, tokenizer, TEXTS)
    torch.testing.assert_close(batched(loaded, tokenizer, TEXTS), expected, **TOL)
    code = snippet((out / "README.md").read_text())  # the card's snippet, with the base's folder for BASE
    space: dict = {}
    exec(code.replace('"BASE"', repr(str(base))).replace(f'"{out.name}"', repr(str(out)))  # noqa: S102
         .replace("print(scores)", ""), space)
    torch.testing.assert_close(space["scores"], alone(peft, tokenizer, space["texts"]), **TOL)
    half = export_run(run_dir, tmp_path / "half", adapter_only=True, dtype="bfloat16")
    assert {t.dtype for t in load_file(half.path / "adapter_model.safetensors").values()} == {torch.bfloat16}


def test_a_4_bit_reward_run_merges_into_the_dequantised_base(base: Path, tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    from llmrl.config.schema import ModelConfig
    from llmrl.models.load import load_base
    from llmrl.models.quantized import dequantize_weight

    run_dir = tmp_path / "nf4-run"
    peft = build_reward_run(run_dir, base, quantize="nf4")
    out = tmp_path / "nf4-merged"
    done = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(out)])
    assert done.exit_code == 0, done.stderr
    assert "mergedintoitsde-quantisedweights" in "".join(done.stdout.split())
    assert "de-quantised nf4 weights, W = deq(W_q) + s·B·A" in " ".join((out / "README.md").read_text().split())
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))
    # q_proj of layer 0 is deq(W_q) + s·B·A, s = α/r = 2
    four_bit, _ = load_base(ModelConfig(name=str(base), dtype="float32", quantize="nf4"), show_progress=False)
    adapter = load_file(run_dir / "adapter" / "adapter_model.safetensors")
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    delta = 2.0 * adapter[f"{prefix}.lora_B.weight"] @ adapter[f"{prefix}.lora_A.weight"]
    expected = dequantize_weight(four_bit.model.layers[0].self_attn.q_proj) + delta
    torch.testing.assert_close(model.model.layers[0].self_attn.q_proj.weight, expected, atol=1e-6, rtol=0)
    tokenizer = AutoTokenizer.from_pretrained(out)
    scores = batched(model, tokenizer, TEXTS)
    torch.testing.assert_close(scores, llmrl_scores(run_dir, TEXTS), **TOL)
    assert (scores - alone(peft, tokenizer, TEXTS)).abs().max() > 1e-3  # not the float base's model
    adapter_dir = export_run(run_dir, tmp_path / "nf4-adapter", adapter_only=True).path  # its card: the 4-bit base
    code = snippet((adapter_dir / "README.md").read_text())
    assert ('quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", '
            'bnb_4bit_compute_dtype=torch.float32, bnb_4bit_use_double_quant=True)') in code, code


def _refused(run_dir: Path, out: Path, *args: str) -> str:
    done = CliRunner().invoke(app, ["export", str(run_dir), "--out", str(out), *args])
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))
    return lines[0]


def test_a_bad_reward_run_is_one_sentence_exit_1(run: tuple[Path, PeftModel], tmp_path: Path) -> None:
    gone = tmp_path / "no-adapter"
    shutil.copytree(run[0], gone)
    (gone / "adapter" / "adapter_model.safetensors").unlink()
    said = _refused(gone, tmp_path / "a")
    assert "has no adapter_config.json and adapter_model.safetensors" in said, said
    assert "adapter_model.safetensors" in _refused(gone, tmp_path / "a2", "--adapter-only")
    damaged = tmp_path / "damaged"
    shutil.copytree(run[0], damaged)
    weights = damaged / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    assert "cannot be read" in _refused(damaged, tmp_path / "b")
    no_base = tmp_path / "no-base"
    shutil.copytree(run[0], no_base)
    missing = str(tmp_path / "deleted-model")
    for name in ("config.yaml", "reward.json"):
        path = no_base / name
        path.write_text(path.read_text().replace(json.loads((run[0] / "reward.json").read_text())["base"], missing))
    said = _refused(no_base, tmp_path / "c")
    assert said.startswith("error: The reward run's base cannot be loaded: Model folder") and missing in said, said


def test_a_trained_reward_run_exports_with_llmrls_scores(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`llmrl reward train`'s own folder (trained norms as modules_to_save too) → the merged export scores as
    llmrl's scorer, and its card holds the run's real held-out figures."""
    from llmrl.reward_model.train import train_reward
    from tests.test_reward_model import reward_config, write_pairs

    run_dir = tmp_path / "rm"
    train_reward(reward_config(tiny_model_dir, write_pairs(tmp_path / "pairs.jsonl", n=24), run_dir,
                               "rm.epochs=1", "lora.modules_to_save=norm"), show_progress=False)
    out = tmp_path / "rm-merged"
    export_run(run_dir, out)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    torch.testing.assert_close(batched(model, tokenizer, TEXTS), llmrl_scores(run_dir, TEXTS), **TOL)
    plain, merged = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert [k for k in merged if "norm" in k and not torch.equal(merged[k], plain[k])]  # the trained norms
    summary = json.loads((run_dir / "summary.json").read_text())
    card = " ".join((out / "README.md").read_text().split())
    assert f"| accuracy | {summary['eval_accuracy_before']:.1%} | {summary['eval_accuracy_after']:.1%} |" in card, card
    assert "`pairs.jsonl`" in card and str(tmp_path) not in card
