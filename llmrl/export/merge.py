"""export_run: a run's trained actor → a standalone Hugging Face model folder (or just its adapter).

The merged folder holds `model.safetensors`, `config.json`, `generation_config.json`, the
tokenizer files and a model card, README.md (card.py), and loads with `AutoModelForCausalLM.from_pretrained(DIR)` without llmrl or peft:
every LoRA layer is folded into its base weight (W ← W + (α/r)·B·A, computed in float32) and every
`modules_to_save` copy (the tiny model's trained norms) replaces the frozen original. The result is
cast to the requested dtype only after merging.

Everything is written into a temporary sibling folder and renamed into place (output.py), so a failed
export never leaves a half-written model under the final name. `push_to_hub` then uploads the folder (hub.py).
A reward run's folder (reward.json) is exported by reward.py, as a sequence classifier.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path


from ..errors import LLMRLError
from ..run.actor import actor_source, load_actor, merge_actor, run_config
from ..models.load import DTYPES
from ..reward_model.folder import is_reward_run
from .card import card
from .hub import hub_token, push
from .names import point_adapter
from .output import EXPORT_MARKERS, Exported, check_out, publish, unquantized, write_export

__all__ = ["EXPORT_MARKERS", "Exported", "check_out", "export_run"]


def _write_merged(run_dir: Path, tmp: Path, dtype: str) -> None:
    """A 4-bit base's run merges into deq(W_q), as peft does for QLoRA (`load_actor(dequantize=True)`)."""
    stack, tokenizer, _ = load_actor(run_dir, dtype="float32", device="cpu", dequantize=True)
    model = unquantized(merge_actor(stack)).to(DTYPES[dtype])
    model.config.dtype = dtype
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if not (tmp / "generation_config.json").is_file() and model.generation_config is not None:
        model.generation_config.save_pretrained(tmp)


def _write_adapter(run_dir: Path, tmp: Path, dtype: str) -> None:
    stack, _, _ = load_actor(run_dir, dtype="float32", device="cpu")
    stack.peft.to(DTYPES[dtype])
    staging = tmp / ".peft"
    stack.peft.save_pretrained(str(staging), selected_adapters=["actor"])
    for f in (staging / "actor").iterdir():  # peft puts a named adapter in a subfolder
        os.replace(f, tmp / f.name)
    shutil.rmtree(staging)


def export_run(run_dir: str | Path, out: str | Path, *, dtype: str = "float32", adapter_only: bool = False,
               overwrite: bool = False, push_to_hub: str | None = None, private: bool = False) -> Exported:
    """Write the run's actor to `out`: merged into the base weights, or (`adapter_only`) as a PEFT adapter,
    with its model card; then, with `push_to_hub` (a hub repository id), upload the folder there (a new
    repository made `private`, hub.py). A reward run's folder (`llmrl reward train`) goes to reward.py."""
    run_dir, out = Path(run_dir), Path(out)
    if dtype not in DTYPES:
        raise LLMRLError(f"Unknown dtype '{dtype}'; valid: {', '.join(DTYPES)}.")
    if is_reward_run(run_dir):  # `llmrl reward train`'s folder: a sequence classifier (reward.py)
        from .reward import export_reward

        return export_reward(run_dir, out, dtype=dtype, adapter_only=adapter_only, overwrite=overwrite,
                             push_to_hub=push_to_hub, private=private)
    if not (run_dir / "config.yaml").is_file():
        raise LLMRLError(f"'{run_dir}' is not a run folder (no config.yaml); nothing to export.")
    source = actor_source(run_dir)  # fails early when the run saved no actor yet
    check_out(out, overwrite, run_dir)
    token = hub_token(push_to_hub) if push_to_hub else None  # before minutes of merging
    config = run_config(run_dir)
    kind = "adapter" if adapter_only else "merged"

    def write(tmp: Path) -> None:
        (_write_adapter if adapter_only else _write_merged)(run_dir, tmp, dtype)
        point_adapter(tmp, config.model.name)  # the adapter names its base by hub id or not at all
        card(config, run_dir, source, kind, dtype, push_to_hub or out.name).save(tmp / "README.md")

    write_export(out, write)
    done = Exported(out, kind, dtype, source.describe(), config.model.quantize)
    if push_to_hub:
        url = push(out, push_to_hub, token or "", f"llmrl export of the run {run_dir.name} ({kind}, {dtype})", private)
        done = replace(done, pushed=url)
    return done
