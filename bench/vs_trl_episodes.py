"""llmrl against TRL's own multi-turn (tool-calling) GRPO on llmrl's tool task `chat_calc` (issue 27):
seconds per step and held-out greedy accuracy, same model, same task, same budget, on the CPU.

Task: llmrl's `chat_calc` (llmrl/tasks/calc.py `chat_splits`): a worked example of one calculator call in
the plain format (user "What is 12*34?", assistant "12*34=", tool "408", assistant "408"), then
"What is a*b + c*d?"; reward 1 when the last assistant turn, stripped, is str(a·b + c·d). Tool: the
`calculator(expression: str) -> str` of llmrl/envs/calculator.py (copied below: TRL runs in its own
virtualenv without llmrl). Model: SmolLM2-135M-Instruct (safetensors, MODEL).

llmrl: `llmrl train --recipe recipes/smollm2-135m-calc.yaml --steps 3 --set eval.size=0` (GRPO, 8 prompts
× 8 generations, ≤ 3 turns of ≤ 24 new tokens, T 0.7, LoRA r16 α32 on q,k,v,o, lr 1e-3 linear, β 0,
minibatch 16 rows, fp32, 2 threads; its per-step `step_time_s` from metrics.jsonl).

TRL: GRPOTrainer(tools=[calculator]) — TRL's own multi-turn loop (`_tool_call_loop`: generate, parse the
turn with `tokenizer.parse_response`, run the tool, append the tool message's template tokens, generate
again) on the transformers generate path (no vLLM), settings matched to the recipe (`trl_args`).
TRL parses tool calls with a per-model-family response template (trl.chat_template_utils
`add_response_schema`); SmolLM2's chat template is not among the known ones, so the stock
configuration fails at GRPOTrainer(...) (`probe`, recorded). The run that works gives the tokenizer a
response template of its own (PLAIN_RESPONSE_TEMPLATE: llmrl's plain call format, a turn ending in '='
before <|im_end|> calls `calculator` with the text before '='), which TRL then uses instead
(GRPOTrainer skips add_response_schema when one is set). Held-out greedy accuracy before/after on the
first EVAL_ROWS eval rows is measured by `greedy_accuracy` (this file: ≤ 3 greedy turns of ≤ 24 tokens,
the same plain-format rule, the tool message tokens as TRL appends them).

Order: llmrl (timing), TRL (full: --trl-steps rollout steps + accuracy), llmrl (timing), TRL (timing),
each in its own subprocess (A, B, A, B). The first step of every run is a warm-up and is not counted.

    python bench/vs_trl_episodes.py [--trl-python bench/.venv-trl/bin/python] [--trl-steps 12]
        [--timing-steps 3] [--llmrl-runs runs/calc-s0 ...] [--out bench/results/vs-trl-episodes.json]
    (--skip probe llmrl-1 trl-full llmrl-2 trl-timing: only re-summarise the results file)

TRL's virtualenv: python3 -m venv bench/.venv-trl && bench/.venv-trl/bin/pip install torch==2.13.0 trl peft
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL = os.path.expanduser("~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-a75f97db0130")
RECIPE = "recipes/smollm2-135m-calc.yaml"
PROMPTS, GENERATIONS, NEW_TOKENS, TURNS, TEMPERATURE, LR, SEED, THREADS = 8, 8, 24, 3, 0.7, 1e-3, 0, 2
MINIBATCH = 16  # llmrl update.minibatch_size: rows per optimizer step (64 rows → 4 optimizer steps per rollout step)
EPISODE_TOKENS = 2 * TURNS * NEW_TOKENS  # llmrl's episode budget (step/episodes.py episode_budget): model + tool tokens
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
EVAL_ROWS = 100

# ---- the task and the tool (copies of llmrl/tasks/calc.py chat_splits and llmrl/envs/calculator.py) ----
SPLIT_SEED, CHAT_TRAIN_SIZE, CHAT_EVAL_SIZE = 1234, 2000, 200
DEMO = [{"role": "user", "content": "What is 12*34?"}, {"role": "assistant", "content": "12*34="},
        {"role": "tool", "content": "408"}, {"role": "assistant", "content": "408"}]


# llmrl's ToolEnv renders a plain-format episode's prompt with the tool explained in a system message
# (llmrl/envs/render.py with_tool_instructions, PLAIN_INSTRUCTIONS, calculator's description) and no
# `tools=` to the template. TRL passes `tools=` to the chat template, which SmolLM2's ignores, so the
# same system message is put into the rows: both then see the same prompt tokens.
SYSTEM = {"role": "system", "content": "You have a calculator-style tool, calculator: Evaluate an integer arithmetic "
          "expression. To use it, reply with its input alone, ending in '=' (for example: 12*34=), and it answers "
          "with the result. Any other reply is your final answer."}


def chat_splits(train_size: int = CHAT_TRAIN_SIZE, eval_size: int = CHAT_EVAL_SIZE) -> tuple[list[dict], list[dict]]:
    rng = random.Random(SPLIT_SEED + 1)
    quads: dict[tuple[int, int, int, int], None] = {}
    while len(quads) < train_size + eval_size:
        quads[(rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999), rng.randint(10, 99))] = None
    rows = [{"prompt": [SYSTEM, *DEMO, {"role": "user", "content": f"What is {a}*{b} + {c}*{d}?"}],
             "answer": str(a * b + c * d)} for a, b, c, d in quads]
    return rows[eval_size:], rows[:eval_size]


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod}


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        v = _OPS[type(node.op)](left, right)
        if abs(v) > 10**30:
            raise ValueError("the result is too large")
        return v
    raise ValueError("only integers and + - * // % ( ) are allowed")


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers with + - * // % and parentheses, e.g. "347*28".
    """
    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression!r}") from None
    return str(_value(tree.body))


def prompt_order(steps: int, n_rows: int) -> list[int]:
    """The train-row indices llmrl's run with SEED reads in its first `steps` steps (llmrl/run/data.py
    PromptSampler: one torch.randperm per epoch, seeded SEED·7919 + epoch); TRL gets these, unshuffled."""
    import torch

    out = []
    for k in range(steps * PROMPTS):
        g = torch.Generator().manual_seed(SEED * 7919 + k // n_rows)
        out.append(int(torch.randperm(n_rows, generator=g)[k % n_rows]))
    return out


# llmrl's plain call format as a transformers response template: a turn whose text ends with '=' right
# before <|im_end|> is one call of `calculator` with the text before '=' (envs/tools.py parse_calls "plain");
# any other turn, or one cut at the token limit (no <|im_end|>), is content.
PLAIN_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"(?P<expr>.*?)=\s*(?=<\|im_end\|>)",
            "close_pattern": r"<\|im_end\|>\s*",
            "repeats": True,
            "content": "text",
            "transform": {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "{expr}"}}},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


# TRL (GRPOTrainer.__init__) refuses tools with a chat template that drops an assistant message's
# `tool_calls` (trl.chat_template_utils supports_tool_calling); SmolLM2's renders `content` only. This is
# SmolLM2's template with one addition: a message's tool_calls rendered after its content in the plain
# format ("<expression>=", any other call as "name({json arguments})="). The prompts hold no tool_calls
# and TRL builds each episode by concatenating token ids (the tool message's tokens from a dummy
# conversation, cut at the last <|im_end|>), so the episodes' tokens are those of the stock template.
CALL_RENDER = ("{% if message['tool_calls'] is defined and message['tool_calls'] %}{% for call in message['tool_calls'] %}"
               "{% set f = call['function'] if call['function'] is defined else call %}"
               "{% if f['arguments'] is mapping and f['arguments']['expression'] is defined %}"
               "{{ f['arguments']['expression'] }}{% else %}{{ f['name'] }}({{ f['arguments'] | tojson }}){% endif %}="
               "{% endfor %}{% endif %}")
STOCK_CONTENT = "message['content'] + '<|im_end|>'"


def plain_call_template(stock: str) -> str:
    """SmolLM2's chat template with CALL_RENDER after each message's content."""
    if stock.count(STOCK_CONTENT) != 1:
        raise ValueError("not SmolLM2-135M-Instruct's chat template")
    return stock.replace(STOCK_CONTENT, "message['content']}}" + CALL_RENDER + "{{'<|im_end|>'")


def last_answer(completion: list[dict]) -> str:
    """The text of an episode's last assistant turn (a call's content is '')."""
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


def trl_args(steps: int, tmp: str) -> dict[str, Any]:
    """GRPOConfig for llmrl's recipe: 8 prompts × 8 generations = one generation batch of 64 episodes, cut
    into 4 optimizer steps of 16 rows (llmrl update.minibatch_size 16, epochs 1), so one llmrl step = 4
    TRL optimizer steps and max_steps = 4 · steps; ≤ 24 new tokens per turn (generation_kwargs
    max_new_tokens; TRL's max_completion_length is the budget of the whole episode, model and tool
    tokens: llmrl's 2 · turns · max_new_tokens = 144, never reached with 24-token turns), ≤ 2 tool rounds
    (≤ 3 turns), T 0.7, top_p 1, top_k 0, β 0 (no reference model), lr 1e-3 linear to 0 (llmrl
    lr_schedule linear), AdamW (0.9, 0.999, 1e-8), no weight decay, grad clip 1.0, ratio clip 0.2,
    fp32 (no autocast), no gradient checkpointing, CPU, advantages scaled per group, token-mean loss."""
    per_rollout = PROMPTS * GENERATIONS // MINIBATCH
    return dict(
        output_dir=tmp, per_device_train_batch_size=MINIBATCH, generation_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=EPISODE_TOKENS, max_tool_calling_iterations=TURNS - 1,
        generation_kwargs={"max_new_tokens": NEW_TOKENS}, temperature=TEMPERATURE, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, epsilon=0.2, learning_rate=LR, lr_scheduler_type="linear", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        max_steps=steps * per_rollout, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, fp16=False, model_init_kwargs={"dtype": "float32"}, gradient_checkpointing=False,
        shuffle_dataset=False, seed=SEED, dataloader_num_workers=0, gradient_accumulation_steps=1,
        scale_rewards="group", loss_type="dapo",
    )


def tool_suffix_ids(tok: Any, content: str) -> list[int]:
    """The ids TRL appends after an assistant turn that made a call (GRPOTrainer._get_tool_suffix_ids)."""
    calls = [{"type": "function", "function": {"name": "calculator", "arguments": {}}}]
    msgs = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prefix = tok.apply_chat_template(msgs, tokenize=True, return_dict=False)
    full = tok.apply_chat_template(msgs + [{"role": "tool", "name": "calculator", "content": content}],
                                   add_generation_prompt=True, tokenize=True, return_dict=False)
    eos = [i for i, t in enumerate(prefix) if t == tok.eos_token_id]
    prefix = prefix[: eos[-1] + 1] if eos else prefix
    assert full[: len(prefix)] == prefix
    return full[len(prefix):]


def greedy_accuracy(model: Any, tok: Any, rows: list[dict], batch: int = 50) -> dict[str, float]:
    """Held-out greedy accuracy: ≤ 3 greedy turns of ≤ 24 new tokens; a turn that ends with <|im_end|> and
    whose stripped text ends with '=' calls the calculator (its result, or TRL's {'error': …} text,
    appended as TRL appends a tool message), any other turn is the answer, exact match after strip."""
    import torch

    correct, calls, turns_total = 0, 0, 0
    model.eval()
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
               for r in chunk]
        answers = [""] * len(chunk)
        live = list(range(len(chunk)))
        for turn in range(TURNS):
            if not live:
                break
            width = max(len(ids[i]) for i in live)
            inp = torch.tensor([[tok.pad_token_id] * (width - len(ids[i])) + ids[i] for i in live])
            mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in live])
            with torch.no_grad():
                out = model.generate(input_ids=inp, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            nxt = []
            for row, i in enumerate(live):
                new = out[row, width:].tolist()
                if tok.eos_token_id in new:
                    new = new[: new.index(tok.eos_token_id) + 1]
                    ended = True
                else:
                    ended = False
                text = tok.decode(new, skip_special_tokens=True).strip()
                answers[i] = text
                turns_total += 1
                if ended and text.endswith("=") and turn < TURNS - 1:
                    calls += 1
                    try:
                        result = calculator(text[:-1].strip())
                    except Exception as e:  # TRL's tool loop reports {"error": str(e)}
                        result = str({"error": str(e)})
                    ids[i] = ids[i] + new + tool_suffix_ids(tok, result)
                    nxt.append(i)
            live = nxt
        correct += sum(a == r["answer"] for a, r in zip(answers, chunk))
    model.train()
    n = len(rows)
    return {"accuracy": correct / n, "tool_calls_per_episode": calls / n, "turns_mean": turns_total / n, "rows": n}


# ---- children --------------------------------------------------------------------------------------
def probe() -> dict[str, Any]:
    """The stock configurations, constructed only: GRPOTrainer(tools=[calculator]) and
    GRPOTrainer(environment_factory=...) with SmolLM2's own tokenizer. Records each one's error."""
    import transformers
    import trl
    from peft import LoraConfig
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    train, _ = chat_splits()
    data = Dataset.from_list(train[:16])
    tok = AutoTokenizer.from_pretrained(MODEL)
    out: dict[str, Any] = {"trl": trl.__version__, "transformers": transformers.__version__,
                           "supports_tool_calling": supports_tool_calling(tok),
                           "chat_template_prefix_preserving": is_chat_template_prefix_preserving(tok)}

    def reward(completions, answer, **_: Any) -> list[float]:
        return [float(last_answer(c).strip() == a) for c, a in zip(completions, answer)]

    class CalcEnv:
        def reset(self, **kwargs: Any) -> None:
            return None

        def calculator(self, expression: str) -> str:
            """Evaluate an integer arithmetic expression.

            Args:
                expression: integers with + - * // % and parentheses, e.g. "347*28".
            """
            return calculator(expression)

    def tokenizer(call_template: bool) -> Any:
        t = AutoTokenizer.from_pretrained(MODEL)
        if call_template:
            t.chat_template = plain_call_template(t.chat_template)
        return t

    out["supports_tool_calling_with_call_template"] = supports_tool_calling(tokenizer(True))
    out["prefix_preserving_with_call_template"] = is_chat_template_prefix_preserving(tokenizer(True))
    for name, extra, call_template in (
            ("tools", {"tools": [calculator]}, False),
            ("environment_factory", {"environment_factory": CalcEnv}, False),
            ("tools+call_template (no response template)", {"tools": [calculator]}, True)):
        tmp = tempfile.mkdtemp(prefix="bench-trl-ep-")
        try:
            trl.GRPOTrainer(model=MODEL, reward_funcs=reward, args=trl.GRPOConfig(**trl_args(1, tmp)), train_dataset=data,
                            processing_class=tokenizer(call_template),
                            peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                                                   task_type="CAUSAL_LM"), **extra)
            out[name] = {"constructed": True}
        except Exception as e:
            out[name] = {"constructed": False, "error": f"{type(e).__name__}: {e}",
                         "where": traceback.format_exc().strip().splitlines()[-3:]}
    return out


def trl_run(steps: int, eval_rows: int) -> dict[str, Any]:
    """`steps` rollout steps of TRL's GRPOTrainer(tools=[calculator]) with PLAIN_RESPONSE_TEMPLATE on the
    tokenizer; greedy accuracy on the first `eval_rows` eval rows before and after (0: none)."""
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback

    train, held_out = chat_splits()
    order = prompt_order(steps, len(train))
    data = Dataset.from_list([train[i] for i in order])
    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.chat_template = plain_call_template(tok.chat_template)
    tok.response_template = PLAIN_RESPONSE_TEMPLATE
    rewards: list[float] = []
    samples: list[dict[str, Any]] = []

    def exact_match(prompts, completions, answer, **_: Any) -> list[float]:
        scores = [float(last_answer(c).strip() == a) for c, a in zip(completions, answer)]
        rewards.append(sum(scores) / len(scores))
        if len(samples) < 6:
            samples.append({"question": prompts[0][-1]["content"], "answer": answer[0], "completion": completions[0],
                            "reward": scores[0]})
        return scores

    ends: list[float] = []
    t_start: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            if not t_start:
                t_start.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            ends.append(time.perf_counter())

    kwargs = trl_args(steps, tempfile.mkdtemp(prefix="bench-trl-ep-"))
    config = trl.GRPOConfig(**kwargs)
    trainer = trl.GRPOTrainer(
        model=MODEL, reward_funcs=exact_match, args=config, train_dataset=data, processing_class=tok,
        tools=[calculator],
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"),
        callbacks=[Timer()],
    )
    result: dict[str, Any] = {"trl": trl.__version__, "transformers": transformers.__version__,
                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                              "mixed_precision": str(trainer.accelerator.mixed_precision),
                              "model_dtype": str(next(trainer.model.parameters()).dtype),
                              "chat_template_replaced": trainer.chat_template is not None,
                              "response_template": "PLAIN_RESPONSE_TEMPLATE (user-supplied)",
                              "chat_template": "SmolLM2's + CALL_RENDER (plain_call_template)"}
    rows = held_out[:eval_rows]
    if rows:
        t0 = time.perf_counter()
        result["eval_before"] = greedy_accuracy(trainer.model, tok, rows)
        result["eval_before"]["seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainer.train()
    result["train_wall_s"] = time.perf_counter() - t0
    if rows:
        t0 = time.perf_counter()
        result["eval_after"] = greedy_accuracy(trainer.model, tok, rows)
        result["eval_after"]["seconds"] = time.perf_counter() - t0
    per = PROMPTS * GENERATIONS // MINIBATCH
    marks = t_start[:1] + ends[per - 1::per]
    result["step_s"] = [b - a for a, b in zip(marks, marks[1:])]
    result["reward"] = rewards
    logs = [h for h in trainer.state.log_history if "step" in h and "train_runtime" not in h]
    keep = ("completions/mean_length", "tools/call_frequency", "tools/failure_frequency", "reward", "num_tokens")
    result["metrics_first_optimizer_step_of_each_rollout"] = [
        {k: h.get(k) for k in keep if k in h} for h in logs[::per]]
    result["samples"] = samples
    result["trl_args"] = {k: v for k, v in kwargs.items() if k != "output_dir"}
    return result


def child_main(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(THREADS)
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    out = probe() if args.child == "probe" else trl_run(args.steps, args.eval_rows)
    Path(args.child_out).write_text(json.dumps(out, default=str))


# ---- parent ----------------------------------------------------------------------------------------
def run_child(python: str, name: str, steps: int, eval_rows: int, timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = Path(f.name)
    cmd = [python, str(Path(__file__).resolve()), "--child", name, "--steps", str(steps), "--eval-rows",
           str(eval_rows), "--child-out", str(path)]
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false",
           "TRL_EXPERIMENTAL_SILENCE": "1"}
    t0, c0, load = time.perf_counter(), children_cpu_s(), os.getloadavg()
    print(f"- {name} ({steps} steps, eval {eval_rows})", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"failed": f"killed after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    cpu = children_cpu_s() - c0
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}", "stderr_tail": proc.stderr.strip().splitlines()[-25:]}
    result = json.loads(path.read_text())
    path.unlink()
    result.update(wall_s=wall, cpu_s=cpu, cores_busy=cpu / wall, loadavg_before=load)
    return result


def children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def llmrl_timing(steps: int, timeout: float) -> dict[str, Any]:
    """`llmrl train --recipe RECIPE --steps N --set eval.size=0` in its own process; step_time_s per step."""
    out = Path(tempfile.mkdtemp(prefix="bench-llmrl-ep-")) / "run"
    cmd = [str(ROOT / ".venv/bin/llmrl"), "train", "--recipe", RECIPE, "--steps", str(steps), "--out", str(out),
           "--set", "eval.size=0"]
    print(f"- llmrl ({steps} steps): {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0, c0, load = time.perf_counter(), children_cpu_s(), os.getloadavg()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"})
    except subprocess.TimeoutExpired:
        return {"failed": f"killed after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}", "stderr_tail": proc.stderr.strip().splitlines()[-25:]}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - c0
    return {"command": "llmrl " + " ".join(a for a in cmd[1:] if a != str(out)).replace("--out ", ""),
            "wall_s": wall, "cpu_s": cpu, "cores_busy": cpu / wall, "loadavg_before": load,
            "step_s": [r["step_time_s"] for r in rows], "reward": [r["reward_mean"] for r in rows],
            "time_generate_s": [r["time_generate_s"] for r in rows], "time_update_s": [r["time_update_s"] for r in rows],
            "groups_kept": [r.get("groups_kept") for r in rows], "turns_mean": [r.get("turns_mean") for r in rows]}


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", choices=["probe", "trl"])
    p.add_argument("--child-out")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--eval-rows", type=int, default=0)
    p.add_argument("--trl-python", default=str(ROOT / "bench/.venv-trl/bin/python"))
    p.add_argument("--trl-steps", type=int, default=12, help="rollout steps of the TRL run with accuracy")
    p.add_argument("--timing-steps", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], help="probe, llmrl-1, trl-full, llmrl-2, trl-timing")
    p.add_argument("--llmrl-runs", nargs="*", default=[],
                   help="folders of full `llmrl train --recipe RECIPE` runs (e.g. runs/calc-s0): their step times and "
                        "accuracies are added as the llmrl reference of the full 12-step run")
    p.add_argument("--out", default=str(ROOT / "bench/results/vs-trl-episodes.json"))
    args = p.parse_args()
    if args.child:
        child_main(args)
        return
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    results: dict[str, Any] = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    results.setdefault("runs", {})
    results["setup"] = {
        "task": "llmrl chat_calc (system note on the plain tool format + worked example + 'What is a*b + c*d?'), "
                "exact match on the last assistant turn; TRL gets llmrl's seed-0 prompt order",
        "llmrl": f"llmrl train --recipe {RECIPE} --steps {args.timing_steps} --set eval.size=0 (step_time_s of "
                 "metrics.jsonl); full 12-step runs: --llmrl-runs",
        "trl": "GRPOTrainer(tools=[calculator]) on the transformers generate path (no vLLM), tokenizer with "
               "plain_call_template (SmolLM2's + tool_calls rendered as 'expr=') and PLAIN_RESPONSE_TEMPLATE "
               "(llmrl's plain call format); settings in runs.trl-full.trl_args",
        "stock_trl_errors": "runs.probe: GRPOTrainer(tools=[calculator]) and GRPOTrainer(environment_factory=...) with "
                            "SmolLM2's own tokenizer; with only the chat template extended, add_response_schema fails",
        "accuracy": f"greedy, first {EVAL_ROWS} eval rows, <= {TURNS} turns of <= {NEW_TOKENS} tokens: TRL by "
                    "greedy_accuracy (this file), llmrl by its own eval (summary.json of --llmrl-runs)",
        "step": "one rollout step = 8 prompts x 8 episodes; TRL: 4 optimizer steps of 16 rows (llmrl minibatch 16); "
                "the first step of each run is a warm-up, not counted",
        "differences": "llmrl's recipe filters groups whose 8 scores are all equal (filter_groups: no forward or "
                       "backward for them; later steps often skip the update entirely), TRL trains on all 64 rows; "
                       "llmrl generates with its own engine, TRL with transformers generate, one call per turn",
    }
    results["machine"] = {"cpu": cpu, "cores": os.cpu_count(), "threads": THREADS, "platform": platform.platform()}
    plan = [("probe", lambda: run_child(args.trl_python, "probe", 1, 0, 900)),
            ("llmrl-1", lambda: llmrl_timing(args.timing_steps, 1800)),
            ("trl-full", lambda: run_child(args.trl_python, "trl", args.trl_steps, EVAL_ROWS, 5400)),
            ("llmrl-2", lambda: llmrl_timing(args.timing_steps, 1800)),
            ("trl-timing", lambda: run_child(args.trl_python, "trl", args.timing_steps, 0, 1800))]
    for name, fn in plan:
        if name in args.skip:
            continue
        results["runs"][name] = fn()
        Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    runs = results["runs"]
    k = args.timing_steps
    # s/step over steps 2..k of every run (step 1 = warm-up), the TRL full run's first k steps included
    summary = {}
    for who, names in (("llmrl", ["llmrl-1", "llmrl-2"]), ("trl", ["trl-full", "trl-timing"])):
        xs = [x for n in names if "step_s" in runs.get(n, {}) for x in runs[n]["step_s"][1:k]]
        summary[who] = {"s_per_step_steps_2_to_%d" % k: mean(xs), "n_steps": len(xs)}
    if "step_s" in runs.get("trl-full", {}):
        summary["trl"]["s_per_step_full_run_steps_2_on"] = mean(runs["trl-full"]["step_s"][1:])
    if "step_s" in runs.get("trl-full", {}):
        full = runs["trl-full"]
        summary["trl"].update(eval_accuracy_before=full["eval_before"]["accuracy"],
                              eval_accuracy_after=full["eval_after"]["accuracy"], train_wall_s=full["train_wall_s"])
    for folder in args.llmrl_runs:
        summ = json.loads((Path(folder) / "summary.json").read_text())
        rows = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines() if line.strip()]
        results.setdefault("llmrl_full_runs", {})[folder] = {
            "step_s": [r["step_time_s"] for r in rows], "reward": [r["reward_mean"] for r in rows],
            **{k: summ.get(k) for k in ("steps", "seed", "eval_accuracy_before", "eval_accuracy_after", "wall_time_s",
                                         "step_time_s_mean")}}
    if results.get("llmrl_full_runs"):
        ref = results["llmrl_full_runs"].values()
        summary["llmrl"]["s_per_step_full_runs_steps_2_on"] = mean([x for r in ref for x in r["step_s"][1:]])
        summary["llmrl"]["eval_accuracy_before"] = [r["eval_accuracy_before"] for r in ref]
        summary["llmrl"]["eval_accuracy_after"] = [r["eval_accuracy_after"] for r in ref]
    if summary["llmrl"].get("s_per_step_steps_2_to_%d" % k) and summary["trl"].get("s_per_step_steps_2_to_%d" % k):
        summary["trl_over_llmrl_steps_2_to_%d" % k] = (summary["trl"]["s_per_step_steps_2_to_%d" % k]
                                                        / summary["llmrl"]["s_per_step_steps_2_to_%d" % k])
    if summary["llmrl"].get("s_per_step_full_runs_steps_2_on") and summary["trl"].get("s_per_step_full_run_steps_2_on"):
        summary["trl_over_llmrl_full_runs_steps_2_on"] = (summary["trl"]["s_per_step_full_run_steps_2_on"]
                                                          / summary["llmrl"]["s_per_step_full_runs_steps_2_on"])
    results["summary"] = summary
    Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
