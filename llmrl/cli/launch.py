"""`llmrl train --nproc N`: run the same command under torchrun with N processes on this machine.

This is torchrun's own launcher (`torch.distributed.run`, single-node rendezvous on a free port);
each worker is a subprocess running `python -m llmrl train …` without `--nproc`. Runs over several
nodes are launched with `torchrun` directly (see docs/scaling.md).
"""

from __future__ import annotations

import os

from ..errors import ConfigError, LLMRLError


def train_args(algo: str | None, recipe: object, model: str | None, task: str | None, steps: int | None,
               seed: int | None, out: object, sets: list[str] | None, overwrite: bool, resume: object,
               report_to: list[str] | None = None) -> list[str]:
    """The `llmrl train` arguments that reproduce these options (without --nproc)."""
    args: list[str] = []
    for flag, value in (("--algo", algo), ("--recipe", recipe), ("--model", model), ("--task", task),
                        ("--steps", steps), ("--seed", seed), ("--out", out), ("--resume", resume)):
        if value is not None:
            args += [flag, str(value)]
    for item in sets or []:
        args += ["--set", item]
    for item in report_to or []:
        args += ["--report-to", item]
    return args + (["--overwrite"] if overwrite else [])


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
