"""The export of a run on a 4-bit base says which base it belongs to: the card of an adapter gives the
`BitsAndBytesConfig` the run loaded its base with (and that config, pasted, loads a base on which the
adapter computes the trained actor), the card of merged weights says they are the de-quantised 4-bit
ones; neither names llmrl's private 4-bit copy, nor does the adapter's config. A real nf4 run on the
random Qwen2 model (tests/qwen2_tiny.py), bitsandbytes' 4-bit layers on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_quantized import _cli, _env, qwen_dir  # noqa: F401 (the random Qwen2 model's folder)

bnb = pytest.importorskip("bitsandbytes")  # the test extra installs it: CI runs every test here


@pytest.fixture(scope="module")
def nf4_run(qwen_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """2 GRPO steps on the nf4 base, its 4-bit copy cached under the fixture's own folder."""
    tmp = tmp_path_factory.mktemp("nf4-export")
    run = tmp / "run"
    subprocess.run(_cli(qwen_dir, run, tmp, "--algo", "grpo", "--steps", "2", "--set", "rollout.prompts_per_step=2",
                        "--set", "rollout.num_generations=4", "--set", "update.minibatch_size=8"),
                   env={**_env(), "LLMRL_CACHE_DIR": str(tmp / "cache")}, check=True, capture_output=True)
    assert any((tmp / "cache" / "quantized").iterdir())  # the private copy a careless export would point at
    return run


def _export(run: Path, out: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "llmrl", "export", str(run), "--out", str(out), *args],
                          env={**_env(), "LLMRL_CACHE_DIR": str(run.parent / "cache")}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


BNB = ('BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32, '
       'bnb_4bit_use_double_quant=True)')


def test_an_adapter_card_gives_the_4_bit_base_it_needs(nf4_run: Path, qwen_dir: Path) -> None:  # noqa: F811
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from llmrl.run.actor import load_actor

    out = nf4_run.parent / "adapter"
    said = _export(nf4_run, out, "--adapter-only")
    assert f"load the base with quantization_config={BNB} before this adapter" in said, said
    card = (out / "README.md").read_text()
    assert (f"trained on the base loaded in 4 bits (nf4): load the base with `quantization_config={BNB}` "
            f"(bitsandbytes), then `PeftModel.from_pretrained(base, THIS_FOLDER)`") in card, card
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] is None  # peft wrote the 4-bit copy's folder in the cache
    for f in out.iterdir():
        if f.suffix in (".md", ".json"):
            assert str(nf4_run.parent) not in f.read_text(), f.name
    # the card's config, as a reader pastes it, gives the base on which the adapter is the trained actor
    config = eval(BNB, {"BitsAndBytesConfig": BitsAndBytesConfig, "torch": torch})
    base = AutoModelForCausalLM.from_pretrained(qwen_dir, quantization_config=config, device_map={"": "cpu"})
    for layer in base.modules():  # llmrl's one kernel (models/quantized.py): no fused bf16 path on this CPU
        if isinstance(layer, bnb.nn.Linear4bit):
            layer.support_avx512bf16_for_cpu = False
    ids = torch.randint(21, 4096, (3, 10))
    stack, _, _ = load_actor(nf4_run)
    with torch.no_grad(), stack.use("actor"):
        trained = stack.lm(ids).logits
    with torch.no_grad():
        pasted = PeftModel.from_pretrained(base, out).eval()(ids).logits
        on_float = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen_dir), out).eval()(ids).logits
    torch.testing.assert_close(pasted, trained, atol=1e-5, rtol=0)
    assert (on_float - trained).abs().max() > 1e-3  # the float base gives another model, as the card says


def test_a_merged_card_says_the_weights_are_the_dequantised_ones(nf4_run: Path) -> None:
    from llmrl.export import export_run

    out = nf4_run.parent / "merged"
    export_run(nf4_run, out)
    card = " ".join((out / "README.md").read_text().split())
    assert (f"The run trained on the base loaded in 4 bits (`{BNB}`): the actor's LoRA adapter is merged into the "
            f"de-quantised nf4 weights, W = deq(W_q) + s·B·A") in card, card
    assert "without llmrl, peft or bitsandbytes" in card and str(nf4_run.parent) not in card
