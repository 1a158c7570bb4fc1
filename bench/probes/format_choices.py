"""Which candidate does a model pick on reasoning-gym's number_format? (issue 46)

    python bench/probes/format_choices.py --model ~/.cache/llmrl/models/qwen2.5-coder-0.5b-instruct \
        [--model RUN_EXPORT ...] [--n 100] [--out bench/results/number-format-choices-qwen0.5b.json]

number_format asks for the largest or smallest of 2-5 numbers written in different formats
("1.168514008950000e+08 116851392.708000 116,851,407.035 ..."). Per model, greedy on the first n
held-out questions of `llmrl train --task rg:number_format` (the same split and prompt, the model's
chat template with its own system prompt, ≤ 32 new tokens, plain transformers generation), the last
`<answer>` tag's content read as a number (commas dropped) and matched to a candidate by value
(within 5e-4: the candidates differ by ≥ 0.001): how often it is the right extreme, which rank by value
and which position in the list the picked candidate has, and how the answer is written (commas,
e-notation). A trained run is scored after `llmrl export RUN --out DIR`.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.probes.rg_answers import greedy_answers  # noqa: E402
from bench.rg_screen import cpu_name  # noqa: E402
from llmrl.config import load_config  # noqa: E402
from llmrl.tasks import task_from_config  # noqa: E402

CANDIDATES = re.compile(r"candidates: (.*)")


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def one_question(prompt: str, given: str) -> dict[str, object]:
    """(the extreme asked, candidate count, rank by value and position of the pick or None, how written)."""
    cands = CANDIDATES.search(prompt).group(1).split()
    largest = "largest" in prompt.split("candidates:")[0][-40:]
    values = [number(c) for c in cands]
    order = sorted(range(len(values)), key=lambda j: -values[j] if largest else values[j])
    a = None if given.startswith("<none>") else number(given)
    hit = next((j for j, v in enumerate(values) if a is not None and abs(v - a) <= 5e-4), None)
    return {"asked": "largest" if largest else "smallest", "candidates": len(values),
            "rank": None if hit is None else order.index(hit) + 1, "position": None if hit is None else hit + 1,
            "commas": "," in given, "e_notation": "e+" in given or "e-" in given}


def summary(picks: list[dict]) -> dict[str, object]:
    right = [p["rank"] == 1 for p in picks]
    by = lambda key: {str(k): f"{sum(r for p, r in zip(picks, right) if p[key] == k)}/{sum(p[key] == k for p in picks)}"
                      for k in sorted({p[key] for p in picks})}
    return {"right": sum(right), "questions": len(picks), "right_by_asked": by("asked"),
            "right_by_candidates": by("candidates"),
            "rank_of_pick": dict(collections.Counter(str(p["rank"]) for p in picks)),
            "position_of_pick": dict(collections.Counter(str(p["position"]) for p in picks)),
            "answers_with_commas": sum(p["commas"] for p in picks),
            "answers_in_e_notation": sum(p["e_notation"] for p in picks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="a model folder; repeatable")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    missing = [m for m in args.model if not Path(m, "config.json").is_file()]
    if missing:
        parser.error(f"--model must be a model folder with a config.json (e.g. from `llmrl export`), got {missing[0]!r}")
    if args.n < 1:
        parser.error(f"--n must be a positive number of questions, got {args.n}")
    torch.set_num_threads(2)
    rows = task_from_config(load_config(overrides={"task": "rg:number_format"})).eval[:args.n]
    results = {}
    for path in args.model:
        tok = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        given = greedy_answers(model, tok, [r["prompt"] for r in rows], None, 32)
        results[path] = summary([one_question(r["prompt"], g) for r, g in zip(rows, given)])
        print(path, json.dumps(results[path]))
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu_name(), "models": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
