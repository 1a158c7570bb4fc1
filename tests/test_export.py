"""`llmrl export`: the merged model computes exactly what the trained actor computes, and loads
with plain transformers in a Python that has neither llmrl nor peft."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from llmrl import load_config, train
from llmrl.cli import app
from llmrl.export import export_run
from llmrl.run.actor import load_actor
from llmrl.tasks import TASKS, Task, get_task
from tests.helpers import digit_share as _digit_share

SMALL = ["rollout.prompts_per_step=8", "update.minibatch_size=4", "eval.size=8", "eval.every=0",
         "lora.modules_to_save=norm", "update.lr_actor=1e-2", "checkpoint.every=1"]
INPUTS = torch.tensor([[1, 8, 11, 17, 9, 6, 20], [1, 13, 17, 5, 20, 6, 4]])  # "<s>47+58=2", "<s>9+14=0" in char ids


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 3-step PPO run on the random tiny model, norms trained as modules_to_save."""
    out = tmp_path_factory.mktemp("export") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(TASKS, "digits", lambda: Task("digits", *_arithmetic_rows(), _digit_share))
        train(load_config(overrides={"model.name": str(tiny_model_dir), "out": str(out), "steps": 3, "task": "digits"},
                          sets=SMALL))
    return out


def _arithmetic_rows() -> tuple[list, list]:
    base = get_task("arithmetic")
    return base.train, base.eval



def _actor_logits(run: Path) -> torch.Tensor:
    stack, _, _ = load_actor(run)
    with torch.no_grad(), stack.use("actor"):
        return stack.lm(input_ids=INPUTS).logits


def _plain_logits(folder: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(input_ids=INPUTS).logits


def test_merged_logits_equal_the_actor(run_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    done = export_run(run_dir, out)
    assert done.kind == "merged" and done.source.startswith("adapter")
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json"):
        assert (out / name).is_file(), name
    assert not (out / "adapter_config.json").exists()
    merged, actor, base = _plain_logits(out), _actor_logits(run_dir), _plain_logits(tiny_model_dir)
    assert (actor - base).abs().max() > 1e-3, "the adapter did not train: the test could not fail"
    torch.testing.assert_close(merged, actor, atol=1e-5, rtol=0)
    # the same actor through plain peft (the README's way of loading an adapter)
    with torch.no_grad():
        via_peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), run_dir / "adapters" / "actor")
        torch.testing.assert_close(merged, via_peft(input_ids=INPUTS).logits, atol=1e-5, rtol=0)
    # trained norms (modules_to_save) were merged: they differ from the base's
    weights, base_weights = load_file(out / "model.safetensors"), load_file(tiny_model_dir / "model.safetensors")
    assert not torch.equal(weights["model.norm.weight"], base_weights["model.norm.weight"])


def test_export_from_a_checkpoint_only_run(run_dir: Path, tmp_path: Path) -> None:
    """A run without adapters/ (stopped early) exports its newest checkpoint's actor."""
    partial = tmp_path / "partial"
    shutil.copytree(run_dir, partial)
    shutil.rmtree(partial / "adapters")
    done = export_run(partial, tmp_path / "from-ckpt")
    assert done.source.startswith("checkpoint") and "step-000003" in done.source
    torch.testing.assert_close(_plain_logits(tmp_path / "from-ckpt"), _actor_logits(run_dir), atol=1e-5, rtol=0)


def test_bfloat16_export(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bf16"
    export_run(run_dir, out, dtype="bfloat16")
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        got = model(input_ids=INPUTS).logits
    # bfloat16 keeps 8 bits of mantissa: the logits agree to about 1 % of their scale
    actor = _actor_logits(run_dir)
    assert (got - actor).abs().max() < 0.05 * actor.abs().max()


def test_adapter_only(run_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "adapter"
    export_run(run_dir, out, adapter_only=True)
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".json", ".safetensors")) == \
        ["adapter_config.json", "adapter_model.safetensors"]
    with torch.no_grad():
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out)
        torch.testing.assert_close(model(input_ids=INPUTS).logits, _actor_logits(run_dir), atol=1e-5, rtol=0)


NO_PEFT_SCRIPT = """
import importlib.util, sys
assert importlib.util.find_spec("peft") is None and importlib.util.find_spec("llmrl") is None, "not isolated"
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
enc = tok(["12+34="], return_tensors="pt")
out = model.generate(**enc, max_new_tokens=4, do_sample=False)
print("generated", repr(tok.decode(out[0, enc.input_ids.shape[1]:], skip_special_tokens=True)), "peft" in sys.modules)
"""


def _site_without(tmp: Path, blocked: tuple[str, ...]) -> Path:
    """A folder of symlinks to every site-packages entry except the blocked distributions (and .pth
    files, which is how editable installs such as llmrl's hook themselves in)."""
    view = tmp / "site"
    view.mkdir()
    for root in site.getsitepackages():
        for entry in Path(root).iterdir():
            name = entry.name.lower()
            if name.endswith(".pth") or name.startswith(blocked) or (view / entry.name).exists():
                continue
            (view / entry.name).symlink_to(entry)
    return view


def test_export_loads_without_llmrl_or_peft(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    export_run(run_dir, out)
    view = _site_without(tmp_path, ("peft", "llmrl", "__editable__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(view)
    proc = subprocess.run([sys.executable, "-S", "-c", NO_PEFT_SCRIPT, str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("generated '") and proc.stdout.strip().endswith("False"), proc.stdout
    # the standalone model generates what the trained actor generates (greedy)
    stack, tok, _ = load_actor(run_dir)
    with torch.no_grad(), stack.use("actor"):
        enc = tok(["12+34="], return_tensors="pt")
        ids = stack.lm.generate(**enc, max_new_tokens=4, do_sample=False)
    expected = tok.decode(ids[0, enc.input_ids.shape[1]:], skip_special_tokens=True)
    assert proc.stdout.split("generated ")[1].rsplit(" ", 1)[0] == repr(expected)


def test_cli_export_errors(run_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "is not a run folder" in bad.stderr and "Traceback" not in bad.stderr
    out = tmp_path / "o"
    assert runner.invoke(app, ["export", str(run_dir), "--out", str(out)]).exit_code == 0
    again = runner.invoke(app, ["export", str(run_dir), "--out", str(out)])
    assert again.exit_code == 2 and "already exists; pass --overwrite" in again.stderr
    forced = runner.invoke(app, ["export", str(run_dir), "--out", str(out), "--overwrite", "--adapter-only"])
    assert forced.exit_code == 0 and (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    dtype = runner.invoke(app, ["export", str(run_dir), "--out", str(tmp_path / "d"), "--dtype", "float64"])
    assert dtype.exit_code == 2 and "Unknown dtype 'float64'" in dtype.stderr
    assert not list(tmp_path.glob(".o.tmp-*")) and not (tmp_path / "d").exists()
