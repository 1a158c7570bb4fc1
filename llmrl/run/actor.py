"""The trained actor of a run folder: its base model plus the run's actor adapter.

A finished run holds the actor as a PEFT adapter in `RUN/adapters/actor`; a run that was stopped
or is still running has only checkpoints, whose `trainable.safetensors` holds the same weights
under the stack's parameter names. `load_actor` reads whichever is newer into a `PolicyStack`
(no critic), so `llmrl eval` and `llmrl export` see exactly the actor the trainer saw.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml
from peft import set_peft_model_state_dict
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .checkpoint import list_checkpoints, read_safetensors
from ..config import Config, load_config
from ..errors import LLMRLError
from .folder import MARKER
from ..models.load import DTYPES, load_base
from ..models import quantized_cache
from ..models.quantized import dequantized
from ..models.stack import PolicyStack, of_adapter

ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class ActorSource:
    """Where the actor weights come from: the final adapter folder or a checkpoint's weights file."""

    path: Path
    kind: str  # "adapter" | "checkpoint"

    def describe(self) -> str:
        return f"{self.kind} {self.path}"


RESUME_KEYS = ("algo", "task", "seed", "steps", "model", "lora", "rollout", "estimator", "kl", "update",
               "eval")  # top-level entries of every config.yaml llmrl has written (the first schema's)


def check_run_config(path: Path) -> None:
    """Refuse a run's config.yaml cut short or edited into another shape (a resume would silently train
    with defaults for what it lost); one that is not YAML at all, the config loader names."""
    try:
        tree = yaml.safe_load((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    if isinstance(tree, dict) and {"pairs", "rm"} <= tree.keys():  # config/reward_run.py's sections
        raise LLMRLError(f"'{path}' is a reward run (llmrl reward train), not an RL run; resume it with "
                         f"`llmrl reward train --resume {path}`, or use it as a reward with --reward {path}.")
    lost = [k for k in RESUME_KEYS if not isinstance(tree, dict) or k not in tree]
    named = not lost and isinstance(tree["model"], dict) and isinstance(tree["model"].get("name"), str)
    lost = lost or ([] if named else ["model.name"])
    if lost:
        raise LLMRLError(f"'{path / MARKER}' is not a whole llmrl run config (it lacks {', '.join(lost[:4])}"
                         f"{', …' if len(lost) > 4 else ''}): it was cut short or edited; restore it, or start the "
                         f"run again with --overwrite.")


def run_config(run_dir: Path) -> Config:
    """The resolved configuration a run was trained with (its config.yaml)."""
    if not (run_dir / MARKER).is_file():
        raise LLMRLError(f"'{run_dir}' is not a run folder (no {MARKER}).")
    check_run_config(run_dir)
    return load_config(run_dir / MARKER, {"out": str(run_dir)})


def actor_source(run_dir: Path) -> ActorSource:
    """The final adapter when the run finished, else its newest checkpoint."""
    final = run_dir / "adapters" / "actor"
    if (final / ADAPTER_FILE).is_file():
        return ActorSource(final, "adapter")
    found = list_checkpoints(run_dir)
    if found:
        return ActorSource(found[-1] / "trainable.safetensors", "checkpoint")
    raise LLMRLError(f"'{run_dir}' has neither adapters/actor nor a checkpoint: the run saved no actor yet.")


def _load_checkpoint_actor(stack: PolicyStack, path: Path) -> None:
    """Copy a checkpoint's actor tensors (`of_adapter(name, 'actor')`) into a critic-less stack."""
    saved = {k: v for k, v in read_safetensors(path, "checkpoint").items() if of_adapter(k, "actor")}
    named = dict(stack.named_parameters())
    wanted = {n for n in named if of_adapter(n, "actor")}
    if set(saved) != wanted:
        raise LLMRLError(f"Checkpoint {path} does not match the run's model (actor parameters differ).")
    bad = next((n for n, t in saved.items() if t.shape != named[n].shape), None)
    if bad is not None:
        raise LLMRLError(f"Checkpoint {path} does not match the run's model ({bad} has shape {tuple(saved[bad].shape)}).")
    with torch.no_grad():
        for name, tensor in saved.items():
            named[name].copy_(tensor)


def _load_adapter_actor(stack: PolicyStack, folder: Path) -> None:
    """Load a saved PEFT adapter's weights into the stack's `actor` adapter; every key must land."""
    weights = read_safetensors(folder / ADAPTER_FILE, "adapter")
    try:
        result = set_peft_model_state_dict(stack.peft, weights, adapter_name="actor")
    except RuntimeError as exc:  # a tensor of another shape: the file was altered, or is another model's
        first = (str(exc).strip().splitlines() or [""])[0]
        raise LLMRLError(f"Adapter {folder} does not match the run's model ({first[:200]}).") from None
    missing = [k for k in result.missing_keys if of_adapter(k, "actor")]
    if result.unexpected_keys or missing:
        raise LLMRLError(f"Adapter {folder} does not match the run's model ({len(missing)} missing, "
                         f"{len(result.unexpected_keys)} unexpected tensors).")


def load_actor(run_dir: Path, *, dtype: str | None = None, device: str | None = None,
               show_progress: bool = False, dequantize: bool = False) -> tuple[PolicyStack, PreTrainedTokenizerBase, Config]:
    """(stack with the run's trained `actor` adapter, tokenizer, the run's config with the model as loaded).

    `dtype`/`device` override the run's `model.dtype`/`model.device` (e.g. float32 for an exact
    merge of a run trained in bfloat16). A run trained on a 4-bit base (model.quantize) gets that base
    as it trained on it: quantised with products in the run's own model.dtype, so from the 4-bit copy
    the run loaded or wrote where the cache still holds it (models/quantized_cache.py), whatever
    `dtype` says. `dequantize` then replaces every 4-bit layer by a plain one holding deq(W_q), the
    matrix the run multiplied by, and casts the whole base to `dtype` (models/quantized.py), so the
    adapter merges into float weights, not back into 4-bit codes; where no cached copy was found (the
    float checkpoint quantised again, on this device) it says so in one line on stderr.
    """
    config = run_config(run_dir)
    wanted = replace(config.model, **{k: v for k, v in (("dtype", dtype), ("device", device)) if v})
    four_bit = config.model.quantize != "none"
    model = replace(wanted, dtype=config.model.dtype) if four_bit else wanted
    source = actor_source(run_dir)
    base, tokenizer = load_base(model, show_progress=show_progress)
    if dequantize and four_bit:
        if quantized_cache.record(base) is None:
            print(f"llmrl: no cached {model.quantize} copy of '{model.name}' ({model.dtype}) was found, so its float "
                  f"checkpoint was quantised again on the {base.device.type}: the codes the run trained on only if it "
                  f"quantised them there too (model.device: {config.model.device}).", file=sys.stderr)
        target = DTYPES.get(wanted.dtype, torch.float32)
        base, model = dequantized(base, target).to(target), wanted
    stack = PolicyStack(base, config.lora, with_critic=False)
    if source.kind == "adapter":
        _load_adapter_actor(stack, source.path)
    else:
        _load_checkpoint_actor(stack, source.path)
    stack.eval()
    return stack, tokenizer, replace(config, model=model)


def merge_actor(stack: PolicyStack) -> PreTrainedModel:
    """base + actor folded into plain weights: W ← W + (α/r)·B·A for each LoRA layer, and every
    `modules_to_save` copy (e.g. trained norms) replaces its original, in the base's dtype (float32
    masters of a half-precision stack are cast back first). The stack is consumed."""
    stack.release_float32_masters()
    return stack.peft.merge_and_unload(adapter_names=["actor"])
