"""`llmrl export`: a run's actor (or a reward run's reward model) as a standalone model folder (or just its
PEFT adapter) with its model card, and with `--push-to-hub REPO` uploaded to a hub repository."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..errors import LLMRLError
from ..export import export_run
from ..export.card import four_bit_base
from ..export.reward import read_reward_run
from ..run.actor import run_config
from .errors import friendly


@friendly
def export(
    run_dir: Path = typer.Argument(..., help="A run folder (finished, or stopped with a checkpoint), or a finished "
                                   "reward run's (`llmrl reward train`)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the model into."),
    dtype: str = typer.Option("float32", "--dtype", help="Weights dtype of the export: float32, bfloat16 or float16."),
    adapter_only: bool = typer.Option(False, "--adapter-only", help="Write only the actor's (a reward run's: the reward model's) PEFT adapter, not merged weights."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace what is already in --out."),
    push_to_hub: Optional[str] = typer.Option(
        None, "--push-to-hub", metavar="REPO", help="Then upload the folder to this hub model repository "
        "(NAMESPACE/NAME, made if missing) with the token of HF_TOKEN or `hf auth login`; HF_ENDPOINT picks the hub. "
        "The repository then holds exactly the folder's files: files of an earlier push that it lacks are deleted there."),
    private: bool = typer.Option(False, "--private", help="With --push-to-hub: make the repository private "
                                 "(a new one; an existing public one is refused). Default: the hub's default, public."),
) -> None:
    """Merge the run's actor adapter into the base weights and save a model that
    `AutoModelForCausalLM.from_pretrained(OUT)` loads without llmrl or peft, with a model card (README.md);
    a reward run's, a model that `AutoModelForSequenceClassification.from_pretrained(OUT)` loads."""
    if private and not push_to_hub:
        raise LLMRLError("--private sets the visibility of the repository --push-to-hub makes; add --push-to-hub "
                         "NAMESPACE/NAME or drop --private.")
    done = export_run(run_dir, out, dtype=dtype, adapter_only=adapter_only, overwrite=overwrite,
                      push_to_hub=push_to_hub, private=private)
    reward = done.task == "reward"
    what = {("adapter", False): "PEFT adapter", ("merged", False): "merged model",
            ("adapter", True): "reward model's PEFT adapter", ("merged", True): "merged reward model"}[done.kind, reward]
    Console().print(f"Wrote the {what} ({done.dtype}, from the {done.source}) to [bold]{done.path}[/]")
    if done.quantize != "none" and done.kind == "merged":
        Console().print(f"The run trained on a {done.quantize} base: the adapter is merged into its de-quantised "
                        f"weights (the ones it trained on), so the export holds plain {done.dtype} weights, no 4-bit layer.")
    elif done.quantize != "none":
        model = read_reward_run(run_dir).model if reward else run_config(run_dir).model
        Console().print(f"The run trained on a {done.quantize} base: load the base with quantization_config="
                        f"{four_bit_base(model)} before this adapter to get the trained "
                        f"{'reward model' if reward else 'actor'} (the model card says so too).")
    if done.kind == "merged":
        loader = "AutoModelForSequenceClassification" if reward else "AutoModelForCausalLM"
        Console().print(f"Load it with: {loader}.from_pretrained('{done.path}')")
    if done.pushed:
        Console().print(f"Pushed to {push_to_hub}: {done.pushed}")
