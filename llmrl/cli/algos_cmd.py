"""`llmrl algos` (the table of methods, from the registry), `llmrl advantages` (run one estimator) and
`llmrl losses` (the registered policy losses)."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any

import torch
import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from ..algos import ALGOS, get_algo, preset_for
from ..config.load import check_bounds, coerce, field_types
from ..errors import ConfigError
from ..estimators import EstimatorInput, get_estimator, import_user_module
from ..losses import POLICY_LOSSES
from ..ops import whiten
from .errors import friendly


ALGO_COLUMNS = ("algo", "estimator", "Q estimate", "baseline", "loss", "needs", "paper")


def algo_rows() -> list[tuple[str, ...]]:
    """One row per registered algorithm, in ALGO_COLUMNS order."""
    rows = []
    for algo in ALGOS.values():
        spec = get_estimator(algo.estimator)
        needs = [n for n, on in (("critic", spec.needs.critic), ("G samples per prompt", spec.needs.groups),
                                 ("greedy rollout", spec.needs.greedy)) if on]
        loss = preset_for(algo.name).get("update.policy_loss", "ppo")
        rows.append((algo.name, spec.name, spec.q_estimate, spec.baseline, loss, ", ".join(needs) or "—", algo.paper))
    return rows


def plain_blocks(rows: list[tuple[str, ...]]) -> str:
    """The table as text blocks for a narrow console (80 columns when piped): a line per algorithm
    with its estimator, then one indented line per property, so no name is ever cut."""
    width = max(len(c) for c in ALGO_COLUMNS[2:])
    out = []
    for name, estimator, *rest in rows:
        out.append(f"{name}  (estimator {estimator})")
        out += [f"  {col + ':':<{width + 1}} {value}" for col, value in zip(ALGO_COLUMNS[2:], rest)]
    return "\n".join(out)


@friendly
def algos() -> None:
    """Every registered algorithm: its Q estimate, baseline, policy loss, what it needs and its paper."""
    title = "Algorithms (advantage = Q estimate − baseline)"
    table = Table(title=title)
    for col in ALGO_COLUMNS:
        table.add_column(col, no_wrap=col in ("algo", "estimator"))
    rows = algo_rows()
    for row in rows:
        table.add_row(*row)
    console = Console()
    if Measurement.get(console, console.options.update(width=10_000), table).maximum <= console.width:
        console.print(table)
    else:  # the table would wrap its cells: print each algorithm as a block instead
        console.print(f"{title}\n\n{plain_blocks(rows)}", highlight=False, markup=False, soft_wrap=True)


@friendly
def losses(
    module: str = typer.Option(None, "--module", help="Import this module first (as update.policy_loss_module)."),
) -> None:
    """Every registered policy loss (`update.policy_loss`): its per-token loss and its paper."""
    if module:
        import_user_module(module, "policy-loss")
    table = Table(title="Policy losses (ℓ_t per kept token, then update.loss_agg)")
    for col in ("loss", "ℓ_t", "update.dual_clip", "paper"):
        table.add_column(col)
    for spec in POLICY_LOSSES.values():
        table.add_row(spec.name, spec.formula, "yes" if spec.dual_clip else "—", spec.paper)
    Console().print(table)


INPUT_KEYS = ("token_rewards", "values", "scores", "group_size", "baseline_scores", "gamma", "lam", "n")
SETTINGS = {"gamma": "estimator.gamma", "lam": "estimator.lam", "n": "estimator.n_step"}  # bounds as in a recipe


F32_MAX = torch.finfo(torch.float32).max


def _finite(key: str, x: torch.Tensor) -> torch.Tensor:
    """`x` (float64) when every entry is a number a training run could hold (finite in float32).

    The estimator then runs in float64, so sums and squares of such numbers cannot overflow (in
    float32, [3e38, 3e38] gave -inf, and the std of ±3e38 overflowed to advantages of 0)."""
    if not (x.abs() <= F32_MAX).all():
        raise ConfigError(f"'{key}' must hold only finite numbers within float32's range "
                          f"(|x| ≤ {F32_MAX:.4g}, like a training run's rewards).")
    return x


def _matrix(data: dict[str, Any], key: str) -> torch.Tensor | None:
    rows = data.get(key)
    if rows is None:
        return None
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) and r for r in rows):
        raise ConfigError(f"'{key}' must be a non-empty list of non-empty rows (lists of numbers).")
    if len({len(r) for r in rows}) != 1:
        raise ConfigError(f"'{key}' has ragged rows; every row must have the same length.")
    if any(isinstance(v, bool) for r in rows for v in r):
        raise ConfigError(f"'{key}' must hold only numbers.")
    try:
        return _finite(key, torch.tensor(rows, dtype=torch.float64))
    except (TypeError, ValueError):
        raise ConfigError(f"'{key}' must hold only numbers.") from None


def _vector(data: dict[str, Any], key: str) -> torch.Tensor | None:
    values = data.get(key)
    if values is None:
        return None
    if not isinstance(values, list) or not values or any(isinstance(v, bool) for v in values):
        raise ConfigError(f"'{key}' must be a non-empty list of numbers.")
    try:
        return _finite(key, torch.tensor(values, dtype=torch.float64).reshape(-1))
    except (TypeError, ValueError):
        raise ConfigError(f"'{key}' must be a list of numbers.") from None


def _setting(data: dict[str, Any], key: str) -> Any:
    """gamma, lam or n from the input, checked like the recipe keys estimator.gamma/lam/n_step."""
    tp, f = field_types()[SETTINGS[key]]
    value = coerce(key, data.get(key, f.default), tp)
    check_bounds(key, value, f.metadata)
    return value


def _check_keys(data: dict[str, Any]) -> None:
    for key in data:
        if key not in INPUT_KEYS:
            close = difflib.get_close_matches(str(key), INPUT_KEYS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ConfigError(f"Unknown input key '{key}'; {hint}valid keys: {', '.join(INPUT_KEYS)}.")


def parse_input(data: Any, estimator: str) -> EstimatorInput:
    """Validate the JSON of `llmrl advantages` and build the estimator's input record."""
    if not isinstance(data, dict):
        raise ConfigError("The input must be a JSON object.")
    _check_keys(data)
    spec = get_estimator(estimator)
    rewards = _matrix(data, "token_rewards")
    scores = _vector(data, "scores")
    if (rewards is None) == (scores is None):
        raise ConfigError("Give exactly one of 'token_rewards' (per token) or 'scores' (one per response).")
    if rewards is None:
        rewards = scores[:, None]  # one-token responses carrying their sequence reward
    values = _matrix(data, "values")
    if spec.needs.critic and values is None:
        raise ConfigError(f"Estimator '{estimator}' needs 'values' (the critic's V(s_t) per token).")
    if values is not None and values.shape != rewards.shape:
        raise ConfigError(f"'values' has shape {tuple(values.shape)} but the rewards have {tuple(rewards.shape)}.")
    n = rewards.shape[0]
    group = data.get("group_size", n if spec.needs.groups else 1)
    if not isinstance(group, int) or group < 1 or n % group:
        raise ConfigError(f"'group_size' must be a positive integer dividing the {n} rows, got {group!r}.")
    if spec.needs.groups and group < 2:
        raise ConfigError(f"Estimator '{estimator}' needs groups of at least 2 responses per prompt.")
    baseline = _vector(data, "baseline_scores")
    if spec.needs.greedy and (baseline is None or baseline.shape[0] != n):
        raise ConfigError(f"Estimator '{estimator}' needs 'baseline_scores', one per row ({n}).")
    return EstimatorInput(rewards, torch.ones_like(rewards, dtype=torch.bool), group, values, baseline,
                          _setting(data, "gamma"), _setting(data, "lam"), _setting(data, "n"))


def _rounded(x: torch.Tensor | None) -> list[list[float]] | None:
    return None if x is None else [[round(v, 6) for v in row] for row in x.tolist()]


@friendly
def advantages(
    algo: str = typer.Option(..., "--algo", "-a", help="Algorithm (or estimator) name, see `llmrl algos`."),
    input: str = typer.Option(..., "--input", "-i", help="JSON file, or - for standard input."),
    as_json: bool = typer.Option(False, "--json", help="Print {\"advantages\": ..., \"returns\": ...} as JSON."),
    white: bool = typer.Option(False, "--whiten", help="Also whiten the advantages over all entries, as "
                               "`estimator.whiten` does over a batch (on in the ppo and reinforce_pp presets)."),
) -> None:
    """Compute advantages and returns of one estimator for given rewards (and values).

    Input JSON: {"token_rewards": [[...]], "values": [[...]], "scores": [...], "group_size": G,
    "baseline_scores": [...], "gamma": γ, "lam": λ, "n": n}. Numbers must be finite in float32;
    the estimator runs in float64.
    """
    estimator = algo if algo not in ALGOS else get_algo(algo).estimator
    try:
        text = sys.stdin.read() if input == "-" else Path(input).read_text()
    except OSError as exc:
        raise ConfigError(f"Cannot read input '{input}': {exc.strerror}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Input '{input}' is not valid JSON (line {exc.lineno}).") from None
    x = parse_input(data, estimator)
    out = get_estimator(estimator).fn(x)
    adv = whiten(out.advantages, x.response_mask) if white else out.advantages
    result = {"advantages": _rounded(adv), "returns": _rounded(out.returns)}
    if as_json:
        typer.echo(json.dumps(result))
        return
    table = Table(title=f"{estimator}: advantages and returns")
    table.add_column("row")
    table.add_column("advantages")
    table.add_column("returns")
    for i, adv in enumerate(result["advantages"]):
        ret = result["returns"][i] if result["returns"] else "—"
        table.add_row(str(i), str(adv), str(ret))
    Console().print(table)
    for k, v in out.stats.items():
        Console().print(f"{k}: {v:.4g}")
