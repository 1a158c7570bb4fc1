"""bench/roofline.py for real, as a subprocess on the built-in default (tiny, PPO, float32): its FLOP
count agrees with torch.utils.flop_counter, every step updates on the whole batch, and the table it
writes pairs each phase's seconds with its FLOPs (issue 29)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_roofline_counts_the_tiny_step(tmp_path: Path) -> None:
    out = tmp_path / "roofline.json"
    proc = subprocess.run([sys.executable, "bench/roofline.py", "--steps", "2", "--dtypes", "float32", "--check",
                           "--set", "rollout.prompts_per_step=32", "--set", "update.minibatch_size=16", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads(out.read_text())["runs"][0]
    # the forward hooks count 2·n·in·out per linear layer: exactly flop_counter's count of the same
    # no-grad forward of an (8, 64) batch on the CPU (attention's products are in neither count)
    check = run["check"]
    assert check["hooks_gflop"] > 0
    assert abs(check["hooks_gflop"] - check["flop_counter_gflop"]) <= 1e-9 * check["flop_counter_gflop"]
    assert run["rows"] == 32 and run["dtype"] == "float32" and run["engine"] == "hf"
    table = {row["phase"]: row for row in run["table"]}
    assert set(table) == {"generate", "forward", "update"}
    counted = run["steps"][1:]  # the first step is the warm-up
    for phase in ("generate", "update"):
        row = table[phase]
        seconds = sum(s["seconds"][phase] for s in counted)
        gflop = sum(s["gflop"][phase] for s in counted)
        assert row["gflop"] > 0 and row["seconds"] > 0
        assert abs(row["gflops"] - round(gflop / seconds, 1)) <= 0.05 + 1e-9
        assert abs(row["pct_peak"] - round(100 * gflop / seconds / run["peak_gflops"]["peak"], 1)) <= 0.05 + 1e-9
    assert all(s["update_rows"] is None for s in run["steps"])  # no group dropped: every row trained on
    assert "update_rows" not in table["update"]
