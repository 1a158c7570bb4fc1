"""The `llmrl` command line: a thin Typer layer over the importable engine."""

from __future__ import annotations

import os
import sys
import warnings

from ..config.install import broken_extras

_broken = broken_extras()  # before transformers and peft fail to import with a traceback
if _broken:
    print(f"error: {_broken}", file=sys.stderr)
    raise SystemExit(2)

import typer  # noqa: E402
from transformers.utils import logging as hf_logging

from .algos_cmd import advantages, algos, losses
from .compare_cmd import compare
from .config_cmd import config
from .models_cmd import models
from .plot_cmd import plot
from .reward_cmd import reward
from .tasks_cmd import tasks
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


@app.callback()
def _options(debug: bool = typer.Option(
        False, "--debug", help="Show the full traceback of an error llmrl did not expect on stderr (also: "
        "LLMRL_DEBUG=1); without it the traceback goes to RUN/error.log (or ~/.cache/llmrl/error.log).")) -> None:
    if debug:
        os.environ["LLMRL_DEBUG"] = "1"  # read by cli/errors.py, and by the processes --nproc starts


app.command()(train)
app.command()(config)
app.command()(algos)
app.command()(advantages)
app.command()(losses)
app.command()(compare)
app.command()(plot)
app.command()(export)
app.command(name="eval")(eval)
app.command()(tasks)
app.add_typer(models, name="models")
app.add_typer(reward, name="reward")


def main() -> None:
    """`llmrl …`; `--debug` may also follow the command (`llmrl train … --debug`), as users type it."""
    args = sys.argv[1:]
    cut = args.index("--") if "--" in args else len(args)
    if "--debug" in args[1:cut] and args[:1] != ["--debug"]:
        at = args.index("--debug", 1)
        if args[at - 1] != "--set":  # `--set --debug` is a (bad) setting, left for the loader to refuse
            args = ["--debug", *args[:at], *args[at + 1:]]
    app(args=args, prog_name="llmrl")
