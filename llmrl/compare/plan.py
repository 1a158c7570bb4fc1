"""Which runs a compare makes and what differs between them.

Every (algo, seed) run is resolved exactly as `llmrl train --algo A --seed S --steps N --recipe FILE
--set …` would be (defaults < algo preset < model defaults < recipe < --set), in the folder
DIR/<algo>-seed<S>. Runs of one algorithm differ only in `seed`; runs of one seed differ only in
what the algorithm presets set. How the budget is held identical (`match`):

- ``rows`` (default): every run generates the same number of rows per step, R = B × G, each with its
  preset's own G (group algorithms 128 × 4, the others 512 × 1 on the default). All runs of a seed read
  the same seeded prompt stream in the same order; a run with G samples per prompt reads B = R / G
  prompts per step, so after S steps it has seen S·R/G prompts (a prefix of what a G = 1 run saw).
  Equal rows per step means an equal generated-token budget up to response lengths.
- ``prompts``: every run uses the same B and G, those of the first listed algorithm that samples
  groups (else of the first listed); step s of every run trains on the identical B prompts. The
  estimator and its loss/KL preset are then the only differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..algos import ALGOS, get_algo
from ..config import Config, load_config, to_tree
from ..config.load import flatten, parse_override
from ..run.session import resolve_estimator
from ..errors import ConfigError

MATCHES = ("rows", "prompts")
RESERVED = {"algo": "--algos", "seed": "--seeds", "out": "--out", "steps": "--steps"}
SIZE_KEYS = ("rollout.prompts_per_step", "rollout.num_generations")


@dataclass(frozen=True)
class RunSpec:
    """One run of the compare: its folder name `<algo>-seed<S>` and its resolved config."""

    name: str
    algo: str
    seed: int
    config: Config

    @property
    def flat(self) -> dict[str, Any]:
        """The resolved config as {dotted key: value}, without `out` (where it lives is not what it is)."""
        flat = flatten(to_tree(self.config))
        flat.pop("out", None)
        return flat

    @property
    def rows_per_step(self) -> int:
        return self.config.rollout.prompts_per_step * self.config.rollout.num_generations


@dataclass(frozen=True)
class Plan:
    algos: tuple[str, ...]
    seeds: tuple[int, ...]
    match: str
    runs: tuple[RunSpec, ...]

    def fingerprint(self) -> dict[str, Any]:
        """What makes two compares the same compare (stored in DIR/compare.json)."""
        return {"algos": list(self.algos), "seeds": list(self.seeds), "match": self.match,
                "runs": {r.name: r.flat for r in self.runs}}

    def differences(self) -> dict[str, dict[str, Any]]:
        """{key: {algo: value}} for every setting whose value differs between the algorithms
        (compared at the first seed; runs of one algorithm differ only in `seed`)."""
        first = [r for r in self.runs if r.seed == self.seeds[0]]
        keys = sorted({k for r in first for k in r.flat})
        out: dict[str, dict[str, Any]] = {}
        for key in keys:
            values = {r.algo: r.flat.get(key) for r in first}
            if len({repr(v) for v in values.values()}) > 1:
                out[key] = values
        return out


def parse_algos(text: str) -> list[str]:
    """'grpo, rloo,ppo' → ['grpo', 'rloo', 'ppo']; unknown or repeated names are a ConfigError."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--algos needs at least one algorithm; valid algorithms: {', '.join(ALGOS)}.")
    for name in names:
        get_algo(name)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"--algos lists {', '.join(repeated)} more than once.")
    return names


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' → [0, 1, 2]; anything but distinct integers ≥ 0 is a ConfigError."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items or not all(s.isdigit() for s in items):
        raise ConfigError(f"--seeds expects comma-separated integers ≥ 0, e.g. 0,1,2; got '{text}'.")
    seeds = [int(s) for s in items]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds lists a seed more than once: '{text}'.")
    return seeds


def _sizes_from(algos: list[str], recipe: Path | None, sets: list[str], common: dict[str, Any]) -> dict[str, int]:
    """B and G of the first algorithm that samples groups (else the first), as `match=prompts` uses."""
    configs = [load_config(recipe, {**common, "algo": a}, sets) for a in algos]
    chosen = next((c for c in configs if resolve_estimator(c).needs.groups), configs[0])
    return {"rollout.prompts_per_step": chosen.rollout.prompts_per_step,
            "rollout.num_generations": chosen.rollout.num_generations}


def build_plan(algos: list[str], seeds: list[int], out: Path, steps: int | None = None,
               recipe: Path | None = None, sets: list[str] | None = None, match: str = "rows",
               overrides: dict[str, Any] | None = None) -> Plan:
    """Resolve and validate every run's config before anything trains.

    `overrides` are typed values for every run (e.g. {'model.name': …, 'task': …}); `sets` win over them.
    """
    sets = list(sets or [])
    common = {k: v for k, v in (overrides or {}).items() if v is not None}
    if match not in MATCHES:
        raise ConfigError(f"--match must be one of {', '.join(MATCHES)}; got '{match}'.")
    for item in sets:
        key = parse_override(item)[0]
        if key in RESERVED:
            raise ConfigError(f"compare sets '{key}' for each run itself; use {RESERVED[key]} instead of --set {key}=….")
    sizes = _sizes_from(algos, recipe, sets, common) if match == "prompts" else {}
    runs = []
    for algo in algos:
        for seed in seeds:
            name = f"{algo}-seed{seed}"
            own = {"algo": algo, "seed": seed, "steps": steps, "out": str(out / name)}
            config = load_config(recipe, {**common, **own, **sizes}, sets)
            resolve_estimator(config)
            runs.append(RunSpec(name, algo, seed, config))
    plan = Plan(tuple(algos), tuple(seeds), match, tuple(runs))
    _check_budget(plan)
    return plan


def _check_budget(plan: Plan) -> None:
    """Every run must generate the same rows per step and run the same number of steps."""
    rows = {r.algo: r.rows_per_step for r in plan.runs}
    if len(set(rows.values())) > 1:
        listed = ", ".join(f"{a} {n}" for a, n in rows.items())
        raise ConfigError(
            f"The runs would generate different rows per step (prompts_per_step × num_generations: {listed}); "
            f"set both sizes so the products agree, or use --match prompts."
        )
    steps = {r.config.steps for r in plan.runs}
    if len(steps) > 1:
        raise ConfigError(f"The runs would train different numbers of steps ({sorted(steps)}); set --steps.")
