"""Trackers: the step metrics also go where users already look (TensorBoard, Weights & Biases).

`metrics.jsonl` stays the record; a tracker receives the scalar entries of each row (numbers and
booleans as 0/1; None and text are left out) under the row's `step`. `log.report_to` names them:

    tensorboard   event files in RUN/tensorboard (torch.utils.tensorboard; needs `tensorboard`)
    wandb         a W&B run (needs `wandb`; project from $WANDB_PROJECT, default 'llmrl')

On resume, TensorBoard purges the events logged after the checkpoint (`purge_step`), so the
curves show each step once, like metrics.jsonl.
"""

from __future__ import annotations

import importlib.util
import math
import os
import uuid
from pathlib import Path
from typing import Any, Protocol

from ..config import Config, to_tree
from ..errors import ConfigError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


class Tracker(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The scalar metrics of a row: ints, floats and bools (as 0/1), without 'step'."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, (str, list, dict)) or value is None:
            continue
        if isinstance(value, (bool, int, float)):
            out[key] = float(value)
    return out


def check_available(names: list[str]) -> None:
    """Refuse, before the run starts, a tracker whose package is not installed."""
    for name in names:
        package = PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"log.report_to asks for {name} but the '{package}' package is not installed; "
                              f"pip install {package}, or drop it from log.report_to.")


class TensorBoardTracker:
    """Scalars into RUN/tensorboard as TensorBoard event files, tagged by metric name."""

    def __init__(self, run_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = {"purge_step": start_step + 1} if start_step else {}
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), **purge)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            if math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run named after the run folder; resuming the folder continues the same W&B run."""

    def __init__(self, run_dir: Path, config: Config) -> None:
        import wandb

        id_file = run_dir / ".wandb-id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "llmrl"), name=run_dir.name, id=run_id,
                              resume="allow", dir=str(run_dir), config=to_tree(config))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """All trackers of a run behind one `log(row)`."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log(self, row: dict[str, Any], step: int | None = None) -> None:
        values = scalars(row)
        if values:
            for t in self.trackers:
                t.log(values, int(row["step"]) if step is None else step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def open_trackers(config: Config, run_dir: Path, start_step: int) -> Trackers:
    """The trackers `config.log.report_to` names (none by default)."""
    names = list(dict.fromkeys(config.log.report_to))
    check_available(names)
    made: list[Tracker] = []
    for name in names:
        made.append(TensorBoardTracker(run_dir, start_step) if name == "tensorboard" else WandbTracker(run_dir, config))
    return Trackers(made)
