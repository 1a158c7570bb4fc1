"""What does a base model answer greedy on a reasoning-gym task? Its answers against the truth on the
held-out questions a run scores, to tell a model that computes from one that guesses (issue 46).

    python bench/probes/rg_answers.py --model ~/.cache/llmrl/models/qwen2.5-coder-0.5b-instruct \
        --tasks "letter_counting;number_sorting?min_numbers=3&max_numbers=4&max_decimals=0" \
        [--n 100] [--max-new-tokens 16] [--system-prompt TEXT] [--out bench/results/rg-answers-qwen0.5b.json]

Per task: the first n held-out questions of `llmrl train --task rg:NAME` (the same split, prompt and
answer convention), rendered by the model's chat template (its own system prompt unless
--system-prompt), greedy, batches of 50, plain transformers generation. Counted: answers whose
`<answer>` content equals the item's answer as text (reasoning-gym's scorer may accept more, so this is
a floor of strict accuracy), the most common true and given answers, and the most common wrong
(truth, given) pairs. A model whose given answers are one or two values whatever the truth is
guessing: its accuracy is what the most common answer scores, and a reward has nothing to reinforce
but that guess.
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
from bench.rg_screen import cpu_name  # noqa: E402
from llmrl.config import load_config  # noqa: E402
from llmrl.tasks import task_from_config  # noqa: E402

TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def greedy_answers(model, tok, prompts: list[str], system: str | None, max_new_tokens: int) -> list[str]:
    """The content of each completion's last closed <answer> tag, or '<none> ' + its first 60 characters."""
    texts = [tok.apply_chat_template(([{"role": "system", "content": system}] if system is not None else [])
                                     + [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    given = []
    for i in range(0, len(texts), 50):
        enc = tok(texts[i:i + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
        for ids in out:
            text = tok.decode(ids[enc.input_ids.shape[1]:], skip_special_tokens=True)
            tags = TAG.findall(text)
            given.append(tags[-1].strip() if tags else "<none> " + text[:60])
    return given


def one_task(model, tok, task: str, n: int, system: str | None, max_new_tokens: int) -> dict:
    rows = task_from_config(load_config(overrides={"task": f"rg:{task}"})).eval[:n]
    truth = [str(r["answer"]) for r in rows]
    given = greedy_answers(model, tok, [r["prompt"] for r in rows], system, max_new_tokens)
    wrong = collections.Counter((t, g) for t, g in zip(truth, given) if t != g)
    return {"task": task, "questions": len(rows), "right": sum(t == g for t, g in zip(truth, given)),
            "truth": collections.Counter(truth).most_common(8), "given": collections.Counter(given).most_common(8),
            "wrong": [[t, g, c] for (t, g), c in wrong.most_common(12)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder (transformers loads it)")
    parser.add_argument("--tasks", required=True, help="reasoning-gym names with their ?settings, separated by ';'")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rows = [one_task(model, tok, t, args.n, args.system_prompt, args.max_new_tokens) for t in args.tasks.split(";")]
    for row in rows:
        print(f"{row['task']}: {row['right']}/{row['questions']} right; given {row['given'][:4]}; truth {row['truth'][:4]}")
    if args.out:
        Path(args.out).write_text(json.dumps({"model": args.model, "cpu": cpu_name(), "max_new_tokens": args.max_new_tokens,
                                              "system_prompt": args.system_prompt, "tasks": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
