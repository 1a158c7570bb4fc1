"""The trainer's narration hooks. The CLI plugs in a rich progress display; library callers get
silence by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ..config import Config
from .memory import RoleCost
from .evaluate import EvalResult


class Reporter(Protocol):
    interactive: bool

    def start(self, config: Config, costs: list[RoleCost], run_dir: Path) -> None: ...
    def evaluated(self, step: int, result: EvalResult | None) -> None: ...
    def step(self, row: dict[str, Any]) -> None: ...
    def end(self, summary: dict[str, Any]) -> None: ...
    def resumed(self, step: int) -> None: ...
    def stopped(self) -> None: ...
    def completions(self, rows: list[dict[str, Any]]) -> None: ...


class NullReporter:
    interactive = False

    def start(self, config: Config, costs: list[RoleCost], run_dir: Path) -> None:
        pass

    def evaluated(self, step: int, result: EvalResult | None) -> None:
        pass

    def step(self, row: dict[str, Any]) -> None:
        pass

    def end(self, summary: dict[str, Any]) -> None:
        pass

    def resumed(self, step: int) -> None:
        pass

    def stopped(self) -> None:
        pass

    def completions(self, rows: list[dict[str, Any]]) -> None:
        pass
