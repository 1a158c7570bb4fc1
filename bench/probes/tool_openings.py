"""How often a model calls the calculator, well-formed, and answers right, under several openings of the
tool task (docs/environments.md, "The tool task on a chat model"): the probe behind `chat_calc`'s
worked example.

For each opening, 16 held-out questions × 4 episodes (temperature 0.7, ≤ 3 turns of ≤ 20 tokens, or 40
for Hermes) and the same greedily, through llmrl's own episode generation (`step/episodes.py`) with
the plain model (adapters off). Printed per opening: well-formed calls, malformed calls and right
answers, out of 64, and a few episodes.

    python bench/probes/tool_openings.py --model smollm2-135m-instruct [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from typing import Any, Callable

import torch

from llmrl.engines import build_engine
from llmrl.envs import resolve_env
from llmrl.model_eval import load_target
from llmrl.models.tokenizer import stop_token_ids
from llmrl.step.episodes import generate_episodes
from llmrl.tasks import calc

QUESTIONS, SAMPLES = 16, 4
DEMO_JSON = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'


def _demo(call: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "What is 12*34?"}, {"role": "assistant", "content": call},
            {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}]


SYSTEM_DEMO = {"role": "system", "content": "Example of using the tool:\nuser: What is 12*34?\nassistant: 12*34=\n"
                                            "tool: 408\nassistant: 408"}
Opening = Callable[[tuple[int, int, int, int]], tuple[Any, str]]
OPENINGS: dict[str, tuple[str, Opening]] = {  # name → (tool format, (a, b, c, d) → (prompt, answer))
    "bare a*b=": ("plain", lambda q: (f"{q[0]}*{q[1]}=", str(q[0] * q[1]))),
    "system-message example": ("plain", lambda q: ([SYSTEM_DEMO, {"role": "user", "content": f"What is {q[0]}*{q[1]}?"}],
                                                   str(q[0] * q[1]))),
    "worked a*b, asks a*b": ("plain", lambda q: ([*_demo("12*34="), {"role": "user", "content": f"What is {q[0]}*{q[1]}?"}],
                                                 str(q[0] * q[1]))),
    "chat_calc": ("plain", lambda q: ([*_demo("12*34="), {"role": "user", "content": f"What is {q[0]}*{q[1]} + {q[2]}*{q[3]}?"}],
                                      str(q[0] * q[1] + q[2] * q[3]))),
    "hermes worked a*b, asks a*b": ("hermes", lambda q: ([*_demo(DEMO_JSON), {"role": "user", "content": f"What is {q[0]}*{q[1]}?"}],
                                                         str(q[0] * q[1]))),
}


def questions() -> list[tuple[int, int, int, int]]:
    """The first QUESTIONS held-out questions of `chat_calc` as (a, b, c, d)."""
    pattern = r"What is (\d+)\*(\d+) \+ (\d+)\*(\d+)\?"
    return [tuple(map(int, re.fullmatch(pattern, r["prompt"][-1]["content"]).groups()))  # type: ignore[misc]
            for r in calc.chat_splits()[1][:QUESTIONS]]


def probe(target: Any, engine: Any, fmt: str, opening: Opening, greedy: bool) -> dict[str, Any]:
    rows = [dict(zip(("prompt", "answer"), opening(q))) for q in questions()]
    cfg = replace(target.config.rollout, num_generations=SAMPLES, max_new_tokens=40 if fmt == "hermes" else 20,
                  max_turns=3, temperature=0.7, tool_format=fmt)
    ep = generate_episodes(engine, target.tokenizer, resolve_env("calculator"), rows, torch.arange(len(rows)), cfg=cfg,
                           seed=0, step=0, device=torch.device("cpu"),
                           stop_ids=stop_token_ids(target.tokenizer, target.stack.lm), greedy=greedy, role="reference")
    answers = [r["answer"] for r in rows for _ in range(SAMPLES)]
    calls, errors = int(ep.episodes.tool_calls.sum()), int(ep.episodes.tool_errors.sum())
    shown = [target.tokenizer.decode(ep.response_ids[i][ep.response_mask[i] | ep.context_mask[i]]) for i in (0, 9, 18, 27)]
    return {"well_formed_calls": calls - errors, "malformed_calls": errors,
            "right": sum(c.strip() == a for c, a in zip(ep.completions, answers)), "of": len(answers), "episodes": shown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    target = load_target(args.model)
    engine = build_engine("hf", stack=target.stack, tokenizer=target.tokenizer, config=target.config)
    results = {}
    for name, (fmt, opening) in OPENINGS.items():
        for greedy in (False, True):
            res = probe(target, engine, fmt, opening, greedy)
            results[f"{name} ({'greedy' if greedy else 'T 0.7'})"] = res
            print(f"{name:32s} {'greedy' if greedy else 'T 0.7':6s} well-formed {res['well_formed_calls']:2d}  "
                  f"malformed {res['malformed_calls']:2d}  right {res['right']:2d} of {res['of']}", flush=True)
            for text in res["episodes"][:2]:
                print("    ", repr(text[:160]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "questions": QUESTIONS, "samples": SAMPLES, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
