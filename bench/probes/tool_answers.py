"""Does a model answer once the calculator has given it the result? (issue 46: the tool task in the
model's own format). Qwen2.5-Coder-0.5B-Instruct calls the calculator with the right expression but,
after the tool's answer, calls it again instead of answering; this probe counts how often.

Two measurements with plain transformers (`generate`, the model's own chat template and `tools=`),
on the first `--questions` held-out questions of `chat_calc_tools`:

    first turn   `--samples` sampled first turns per question at each of `--temperatures`: how many
                 hold a `<tool_call>` tag, how many a JSON call (`parse_calls(..., "json")`)
    after tool   the conversation so far is the question, the model's own first call (greedy) and the
                 calculator's right result; `--samples` sampled replies per question at each temperature:
                 how many are no call (an answer), how many are exactly the answer. Under variants of
                 the conversation: as is; a system message asking for the answer alone; the result
                 phrased "a*b + c*d = n"; a worked example (12*34 → 408) first, its call tagged or bare;
                 the model's call rewritten as the template's own tool_calls rendering.

    python bench/probes/tool_answers.py --model ~/.cache/llmrl/models/qwen2.5-coder-0.5b-instruct \\
        --questions 4 --samples 8 --temperatures 1.0 --out bench/results/tool-answers-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from llmrl.envs import parse_calls, resolve_env
from llmrl.tasks import TASKS

ASK = ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant. Once a tool has given you the result, "
       "reply to the user with the final answer alone, without calling a tool again.")
DEMO_CALL = '{"name": "calculator", "arguments": {"expression": "12*34"}}'


def demo(tagged: bool) -> list[dict]:
    """A worked example: the question, one call (the template's tool_calls, or the bare JSON), 408, '408'."""
    call = ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "calculator", "arguments": {"expression": "12*34"}}}]} if tagged
        else {"role": "assistant", "content": DEMO_CALL})
    return [{"role": "user", "content": "What is 12*34?"}, call, {"role": "tool", "name": "calculator", "content": "408"},
            {"role": "assistant", "content": "408"}]


def sample(model, tok, messages: list[dict], tools: list[dict], n: int, temperature: float | None,
           max_new_tokens: int = 64) -> list[str]:
    """`n` replies (greedy: one) to `messages` under the template with `tools=`."""
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    ids = tok(text, return_tensors="pt").input_ids
    kw = dict(do_sample=False) if temperature is None else dict(do_sample=True, temperature=temperature, top_k=0)
    out = model.generate(ids.repeat(1 if temperature is None else n, 1), max_new_tokens=max_new_tokens,
                         pad_token_id=tok.pad_token_id, **kw)
    return [tok.decode(o[ids.shape[1]:], skip_special_tokens=False).replace("<|im_end|>", "").replace("<|endoftext|>", "")
            for o in out]


def after_tool(model, tok, rows, tools, variant: str, n: int, temperature: float) -> dict:
    """Replies sampled after the model's own first call and the tool's right result, under `variant`."""
    answers = exact = total = 0
    examples = []
    for row in rows:
        question = row["prompt"]
        opening = {"tagged example": demo(True), "bare example": demo(False)}.get(variant, [])
        system = [{"role": "system", "content": ASK}] if variant == "ask for the answer" else []
        first = sample(model, tok, system + opening + question, tools, 1, None)[0]
        calls = parse_calls(first, "json")
        expr = calls[0].arguments.get("expression", "") if calls and calls[0].error is None else ""
        call_msg = ({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "calculator", "arguments": {"expression": expr}}}]} if variant == "template's tool_calls"
            else {"role": "assistant", "content": first})
        result = f"{expr} = {row['answer']}" if variant == "result as an equation" else row["answer"]
        messages = system + opening + question + [call_msg, {"role": "tool", "name": "calculator", "content": result}]
        for reply in sample(model, tok, messages, tools, n, temperature):
            total += 1
            answered = not parse_calls(reply, "json")
            answers += answered
            exact += reply.strip() == row["answer"]
            if answered and len(examples) < 3:
                examples.append(reply[:120])
        if len(examples) < 3 and not answers:
            examples.append(reply[:120])
    return {"variant": variant, "temperature": temperature, "replies": total, "answers": answers, "exact": exact,
            "examples": examples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a model folder (e.g. llmrl's cached safetensors copy)")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperatures", default="0.7,1.0", help="sampling temperatures, comma-separated")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tools = resolve_env("calculator").make().tools()
    rows = TASKS["chat_calc_tools"]().eval[: args.questions]
    result: dict = {"command": "python bench/probes/tool_answers.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None), "first_turn": [], "after_tool": []}
    temperatures = [float(t) for t in args.temperatures.split(",")]
    out = Path(args.out) if args.out else None
    with torch.no_grad():
        for temperature in temperatures:
            replies = [r for row in rows for r in sample(model, tok, row["prompt"], tools, args.samples, temperature)]
            row = {"temperature": temperature, "replies": len(replies), "tagged": sum("<tool_call>" in r for r in replies),
                   "json_calls": sum(bool(parse_calls(r, "json")) for r in replies)}
            result["first_turn"].append(row)
            print("first turn", row, flush=True)
        for variant in ("as is", "ask for the answer", "result as an equation", "tagged example", "bare example",
                        "template's tool_calls"):
            for temperature in temperatures:
                row = after_tool(model, tok, rows, tools, variant, args.samples, temperature)
                result["after_tool"].append(row)
                print("after tool", {k: v for k, v in row.items() if k != "examples"}, flush=True)
                result["total_wall_s"] = round(time.perf_counter() - start, 1)
                if out:  # rewritten after every row: a stopped probe keeps what it counted
                    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
