"""Trainable full-module copies (`lora.modules_to_save`) are float32 master weights on a half base.

bfloat16's spacing near 1.0 is 2^-7, so AdamW steps of ~lr = 1e-3 on a bfloat16 norm weight round
away and the norms never train. The copies are float32 (like peft's LoRA weights) while the model
around them keeps running in bfloat16: a hook casts each copy's output back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from llmrl import load_config, train
from llmrl.config.schema import LoraConfig
from llmrl.export import export_run
from llmrl.run.actor import load_actor, merge_actor
from llmrl.models.stack import PolicyStack, layout, token_logprobs
from llmrl.tasks import TASKS

from tests.conftest import make_tiny_model
from tests.helpers import digits_task, is_timing

NORMS = ["input_layernorm", "post_attention_layernorm", "model.norm"]


def _stack(dtype: torch.dtype, save: list[str]) -> PolicyStack:
    torch.manual_seed(0)
    return PolicyStack(make_tiny_model().to(dtype), LoraConfig(r=4, modules_to_save=save), with_critic=True)


def _seq():
    ids = torch.tensor([[0, 7, 8, 17], [5, 6, 14, 17]])
    resp = torch.tensor([[9, 10, 2], [11, 2, 0]])
    return layout(ids, ids != 0, resp, torch.tensor([[True, True, True], [True, True, False]])), resp


def _copies(stack: PolicyStack, role: str) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in stack.peft.named_parameters() if f".modules_to_save.{role}." in n}


def test_norm_copies_are_float32_and_the_forward_keeps_its_dtype() -> None:
    stack = _stack(torch.bfloat16, NORMS)
    for role in ("actor", "critic"):
        copies = _copies(stack, role)
        assert len(copies) == 5 and {p.dtype for p in copies.values()} == {torch.float32}
    originals = [p for n, p in stack.peft.named_parameters() if "original_module" in n]
    assert len(originals) == 5 and {p.dtype for p in originals} == {torch.bfloat16}
    assert {p.dtype for p in stack.parameters_of("actor")} == {torch.float32}
    seq, resp = _seq()
    with torch.no_grad():
        with stack.use("actor"):
            hidden = stack.hidden(seq)
            actor = stack.response_logits(seq, 1.0)
            norm = stack.lm.model.norm.modules_to_save["actor"]
            assert norm(hidden).dtype == torch.bfloat16
        with stack.use("reference"):
            ref_hidden = stack.hidden(seq)
            ref = stack.response_logits(seq, 1.0)
        with stack.use("critic"):
            values = stack.values(seq)
    assert hidden.dtype == ref_hidden.dtype == torch.bfloat16 and values.dtype == torch.float32
    # LoRA B = 0 and the copies are exact upcasts: at the start the actor is the reference, bit for bit
    assert torch.equal(actor, ref) and torch.equal(hidden, ref_hidden)


def test_float32_stacks_are_untouched() -> None:
    stack = _stack(torch.float32, NORMS)
    assert stack._masters == []
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in stack.modules())


def test_a_linear_copy_computes_in_float32_and_returns_bfloat16() -> None:
    stack = _stack(torch.bfloat16, ["lm_head"])
    head = stack.lm.lm_head.modules_to_save["actor"]
    assert head.weight.dtype == torch.float32
    seq, resp = _seq()
    with stack.use("actor"):
        h = stack.hidden(seq)
        out = head(h)
        assert out.dtype == torch.bfloat16
        loss = -token_logprobs(stack.response_logits(seq, 1.0), resp).sum()
    loss.backward()
    assert head.weight.grad is not None and head.weight.grad.dtype == torch.float32
    assert float(head.weight.grad.abs().max()) > 0
    with stack.use("reference"), torch.no_grad():
        ref = stack.response_logits(seq, 1.0)
    with stack.use("actor"), torch.no_grad():
        actor = stack.response_logits(seq, 1.0)
    torch.testing.assert_close(actor, ref, atol=0.05, rtol=0.02)  # bfloat16 logits, summed in another order


def _run(tiny_model_dir: Path, out: Path, steps: int, dtype: str, **extra) -> Path:
    base = {"model.name": str(tiny_model_dir), "model.dtype": dtype, "task": "digits",
            "lora.modules_to_save": ["norm"], "rollout.prompts_per_step": 8, "update.minibatch_size": 4,
            "eval.size": 8, "eval.every": 0, "checkpoint.every": 2, "update.lr_actor": 1e-3, **extra}
    train(load_config(overrides={**base, "out": str(out), "steps": steps}))
    return out


def _norm_change(run: Path, tiny_model_dir: Path) -> dict[str, float]:
    """max |trained − base| of each norm in the run's saved actor, the base rounded to the run's dtype."""
    base = load_file(tiny_model_dir / "model.safetensors")
    adapter = load_file(run / "adapters" / "actor" / "adapter_model.safetensors")
    out = {}
    for name, value in adapter.items():
        if "norm" in name:
            original = base[name.removeprefix("base_model.model.")].to(torch.bfloat16)
            assert value.dtype == torch.float32, name
            out[name] = float((value - original.float()).abs().max())
    return out


def test_a_bfloat16_run_trains_its_norms_and_resumes_exactly(tiny_model_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TASKS, "digits", digits_task)
    full = _run(tiny_model_dir, tmp_path / "full", 4, "bfloat16")
    change = _norm_change(full, tiny_model_dir)
    assert len(change) == 5
    # 8 AdamW steps of lr 1e-3, each below half the bfloat16 spacing near 1: every norm moved
    assert all(1e-4 < c < 0.05 for c in change.values()), change
    ckpt = load_file(full / "checkpoints" / "step-000004" / "trainable.safetensors")
    assert {v.dtype for k, v in ckpt.items() if "norm" in k} == {torch.float32}

    cut = _run(tiny_model_dir, tmp_path / "cut", 2, "bfloat16")
    train(load_config(cut / "config.yaml", {"out": str(cut), "steps": 4}), resume=True)
    rows = [[{k: v for k, v in json.loads(line).items() if not is_timing(k)}
             for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (full, cut)]
    assert len(rows[0]) == 4 and rows[0] == rows[1]
    for role in ("actor", "critic"):
        a = load_file(full / "adapters" / role / "adapter_model.safetensors")
        b = load_file(cut / "adapters" / role / "adapter_model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role

    # export merges the float32 masters: the merged norms are the trained ones
    export_run(full, tmp_path / "merged")
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    adapter = load_file(full / "adapters" / "actor" / "adapter_model.safetensors")
    for name, value in adapter.items():
        if "norm" in name:
            assert torch.equal(merged[name.removeprefix("base_model.model.")], value), name

    # a bfloat16 stack merges into plain bfloat16 modules without hooks
    stack, _, _ = load_actor(full)
    model = merge_actor(stack)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    torch.testing.assert_close(model.model.norm.weight, adapter["base_model.model.model.norm.weight"].to(torch.bfloat16),
                               atol=0, rtol=0)
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "merged").dtype == torch.float32
