"""`llmrl train --nproc N`: run the same command under torchrun with N processes on this machine.

This is torchrun's own launcher (`torch.distributed.run`, single-node rendezvous on a free port);
each worker is a subprocess running `python -m llmrl train …` without `--nproc`. Runs over several
nodes are launched with `torchrun` directly (see docs/scaling.md).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError, LLMRLError


def forwarded_args(ctx: Any, skip: str = "nproc") -> list[str]:
    """The command's options as given (every option whose value is not its default), in a form that
    parses back to the same values; without the `skip` option. `ctx` is the command's typer.Context."""
    args: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name == skip or param.param_type_name != "option" or value is None or value == param.default:
            continue
        flag = param.opts[0]
        if param.is_flag:
            args += [flag] if value else []
        elif param.multiple:
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, str(value)]
    return args


def launch(nproc: int, args: list[str]) -> None:
    """Run `llmrl train ARGS` under torchrun with `nproc` local processes; a failed worker becomes
    one LLMRLError with that worker's exit code (its own message is already on stderr)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("--nproc starts torchrun itself; under torchrun, leave it out.")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    parsed = get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node", str(nproc), "--module", "llmrl", "train", *args])
    try:
        run(parsed)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()  # the earliest: the cause, not the ranks torchrun stopped after it
        code = failure.exitcode if failure.exitcode in (1, 2, 130) else 1
        raise LLMRLError(f"The {nproc}-process run stopped: rank {rank} exited first, with code {failure.exitcode} "
                         f"(the processes' messages are above).", exit_code=code) from None
