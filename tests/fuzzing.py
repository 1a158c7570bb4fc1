"""Generated inputs for the fuzz tests (issue 30): edge values of every setting, corrupt copies of
every file llmrl reads, and the tally of what each family tried that the run prints at its end."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

from llmrl.config.domains import FLOAT_MAX, INT_MAX, base_type

TALLY: dict[str, Counter] = {}
"""family → Counter(tried, ran, refused, tracebacks): printed by conftest's terminal summary and
written to $LLMRL_FUZZ_REPORT (a JSON file) when that is set."""


def count(family: str, outcome: str) -> None:
    tally = TALLY.setdefault(family, Counter())
    tally["tried"] += 1
    tally[outcome] += 1
    target = os.environ.get("LLMRL_FUZZ_REPORT")
    if target:
        Path(target).write_text(json.dumps({k: dict(v) for k, v in TALLY.items()}, indent=1))


def save_tally(path: Path) -> None:
    """This process's tally as JSON (an xdist worker's, for the controlling process to sum)."""
    path.write_text(json.dumps({k: dict(v) for k, v in TALLY.items()}))


def report_lines(saved: list[Path] = ()) -> list[str]:
    """The table: this process's tally plus the tallies `saved` by other processes."""
    total: dict[str, Counter] = {k: Counter(v) for k, v in TALLY.items()}
    for path in saved:
        for family, c in json.loads(path.read_text()).items():
            total.setdefault(family, Counter()).update(c)
    if not total:
        return []
    lines = [f"{'family':<34} {'tried':>6} {'ran':>5} {'refused':>8} {'tracebacks':>10}"]
    for family, c in sorted(total.items()):
        lines.append(f"{family:<34} {c['tried']:>6} {c['ran']:>5} {c['refused']:>8} {c['traceback']:>10}")
    return lines


TEXT = ["", " ", "ünïcödé✓", "a\x00b", "line\nbreak", "../..", "x" * 300, "123", "true", "[a]", "{a: 1}"]
WRONG = ["", "abc", "ünïcödé✓", "[1, 2]", "{a: 1}", "nan", "inf", "-inf"]


def _yaml_float(x: float) -> str:
    return repr(x) if math.isfinite(x) else {math.inf: "inf", -math.inf: "-inf"}.get(x, "nan")


def edge_values(tp: Any, meta: dict[str, Any]) -> list[str]:
    """`--set key=VALUE` texts at and beyond a setting's bounds: 0, −1, the bounds and one past them,
    huge, NaN, ±inf, empty, the wrong type, unicode, control characters."""
    base = base_type(tp)
    if meta.get("kind") == "size":  # memory.max: a size with units (llmrl/config/memory.parse_size)
        return ["6GiB", "1.5GiB", "6GB", "1", "0", "-1", "0.4", "inf", "nan", "1e400", str(2**62 + 1), "6XB", "GiB",
                *TEXT[:6]]
    if "choices" in meta:
        return [*map(str, meta["choices"]), str(meta["choices"][0]).upper(), *TEXT[:6], "0", "true", "[]"]
    if base is bool:
        return ["true", "false", "0", "1", "yes", "off", "maybe", "", "nan", "[]", "{a: 1}"]
    if base is int:
        lo, hi = meta.get("min", 0), meta.get("max", INT_MAX)
        values = [lo - 1, lo, lo + 1, hi, hi + 1, 0, -1, 2**31, 2**63, 2**64, 10**30]
        return [*dict.fromkeys(map(str, values)), "1.5", "1e3", "true", *WRONG]
    if base is float:
        lo = meta.get("gt", meta.get("min", -FLOAT_MAX))
        hi = meta.get("max", FLOAT_MAX)
        values = [lo, hi, 0.0, -0.0, -1.0, 5e-324, -5e-324, 1e-30, 3.5e38, 1e308, 1e-7]
        return [*dict.fromkeys(_yaml_float(float(v)) for v in values), "1e400", "true", *WRONG]
    if base is str:
        return TEXT
    if getattr(base, "__origin__", None) is list and base.__args__[:1] == (float,):
        return ["0.5,2", "", "[]", "[0.5]", "[0.5, 2, 3]", "nan,2", "0.5,inf", "[1e39, 2]", "a,b", "[true, 2]", "ünï"]
    if getattr(base, "__origin__", None) is list and base.__args__[:1] == (str,):
        return ["norm", "a,b", "", "[]", "[1, 2]", "[null]", "{a: 1}", "ünïcödé✓", "a\x00b", "[[a]]", ","]
    if getattr(base, "__origin__", None) is list:
        return ["exact_match", "", "[]", "nosuch", "[{name: numeric, weight: nan}]", "[{name: \"a\\0b\"}]",
                "{}", "[1]", "[{weight: 1}]", "ünï.py:f", "[{name: numeric, weight: 1e39}]"]
    return ["", "[]", "{}", "1", "ünï", "{a: 1}", "nan"]
