"""The `llmrl` command line: a thin Typer layer over the importable engine."""

from __future__ import annotations

import warnings

import typer
from transformers.utils import logging as hf_logging

from .algos_cmd import advantages, algos, losses
from .compare_cmd import compare
from .config_cmd import config
from .plot_cmd import plot
from .eval_cmd import eval
from .export_cmd import export
from .train import train

warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*")
# peft's notes on tied embeddings: llmrl refuses LoRA on a tied head or embedding and the vllm engine
# with a trained copy of one (models/stack.py, engines/vllm_engine.py); a copy on the hf engine is exact
warnings.filterwarnings("ignore", message=r".*tie_word_embeddings=True.*")
warnings.filterwarnings("ignore", message=r"Input and output embeddings are no longer tied after merging.*")
hf_logging.disable_progress_bar()  # our own bars only; transformers' per-load bars are noise here

app = typer.Typer(
    name="llmrl",
    help="Fine-tune language models with reinforcement learning: one engine, every advantage estimator.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(train)
app.command()(config)
app.command()(algos)
app.command()(advantages)
app.command()(losses)
app.command()(compare)
app.command()(plot)
app.command()(export)
app.command(name="eval")(eval)


def main() -> None:
    app()
