"""Does a model follow an answer convention at all? Greedy answers of the base model to reasoning-gym
questions under several phrasings of the convention, scored the strict way (issue 28).

    python bench/probes/rg_convention_probe.py --model ~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-<hash> \
        --tasks "chain_sum?max_terms=2&max_digits=2;gcd?max_value=20;products?max_digits=1;aiw" \
        [--n 16] [--out bench/results/rg-convention.json]

For each variant, n questions per task (generator seed 7, not a run's split), the question + the
variant's instruction as one chat user message (and, for the prefill variants, the assistant's reply
begun with the prefill, `continue_final_message`), 40 greedy new tokens. Counted per task: answers
whose strict reading scores full credit with reasoning-gym's `score_answer`: for tag variants the
content of the last closed <answer>…</answer> (prefill included), for the others the last non-empty
line as it is; and how many completions close an </answer> tag. Plain transformers generation, so
the probe depends on nothing in llmrl but the query-string parser.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.rg_screen import cpu_name  # noqa: E402
from llmrl.tasks.rg import parse  # noqa: E402

TAG = "Put your final answer between <answer> and </answer> tags."
VARIANTS = {  # name: (instruction, assistant prefill or None, reading)
    "tag": (TAG, None, "tag"),
    "tag + example": (TAG[:-1] + ", for example <answer>42</answer>.", None, "tag"),
    "tag, prefilled <answer>": (TAG, "<answer>", "tag"),
    "last line": ("Write your final answer alone on the last line.", None, "line"),
    "last line + example": ("Write your final answer alone on the last line, for example:\n42", None, "line"),
    "answer only": ("Reply with the final answer only.", None, "line"),
}


def strict(text: str, reading: str) -> str | None:
    if reading == "tag":
        found = re.findall(r"<answer>(.*?)</answer>", text, re.S)
        return found[-1].strip() if found else None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None


def main() -> None:
    import reasoning_gym

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks", required=True, help="reasoning-gym names with settings, separated by ';'")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    result = {"model": a.model, "cpu": cpu_name(), "n": a.n, "variants": {}}
    for variant, (instruction, prefill, reading) in VARIANTS.items():
        per_task = {}
        for spec in a.tasks.split(";"):
            name, settings = parse("rg:" + spec)
            data = reasoning_gym.create_dataset(name, seed=7, size=a.n, **settings)
            items = [data[i] for i in range(a.n)]
            chats = [[{"role": "user", "content": f"{e['question'].rstrip()}\n\n{instruction}"}]
                     + ([{"role": "assistant", "content": prefill}] if prefill else []) for e in items]
            texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=not prefill,
                                             continue_final_message=bool(prefill)) for c in chats]
            enc = tok(texts, return_tensors="pt", padding=True)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=40, do_sample=False)
            completions = [(prefill or "") + c for c in tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)]
            scores = [data.score_answer(strict(c, reading), e) if strict(c, reading) is not None else 0.0
                      for c, e in zip(completions, items, strict=True)]
            per_task[spec] = {"strict_right": sum(s >= 1.0 for s in scores), "closed_tag": sum("</answer>" in c for c in completions),
                              "examples": completions[:2]}
        result["variants"][variant] = per_task
        total = sum(t["strict_right"] for t in per_task.values())
        print(f"{variant:<26} strict-right {total} of {a.n * len(per_task)}; closed tags "
              f"{sum(t['closed_tag'] for t in per_task.values())}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
