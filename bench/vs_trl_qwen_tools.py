"""llmrl against TRL's stock tool-calling GRPO on Qwen2.5-Coder-0.5B-Instruct and llmrl's `chat_calc_json`
(issue 46): seconds per step, peak RSS, and held-out greedy accuracy after the same steps, on the CPU.

Task: `chat_calc_json` (llmrl/tasks/calc.py): a worked example whose call is the bare JSON object this
model writes (`{"name": "calculator", "arguments": {"expression": "12*34"}}` → 408 → "408"), then
"What is a*b + c*d?"; reward 1 when the last assistant turn, stripped, is str(a·b + c·d). The calculator
is offered through the chat template's `tools=` on both sides.

llmrl: `llmrl train --recipe recipes/qwen2.5-0.5b-calc.yaml` (GRPO, 8 prompts × 8 episodes, ≤ 3 turns of
≤ 64 tokens, T 1.0, LoRA r16 α32 on q,k,v,o, lr 2e-4 linear, β 0, minibatch 16, float32, 2 threads, calls
read as Hermes tags or bare/fenced JSON: rollout.tool_format json).

TRL: `GRPOTrainer(tools=[calculator])` **stock**: the model's own tokenizer, whose Qwen2.5 template TRL
knows (trl.chat_template_utils.add_response_schema: calls are `<tool_call>` blocks), the transformers
generate path, settings matched to the recipe (`trl_args`: vs_trl_episodes.trl_args with this recipe's
tokens, temperature and learning rate). After training its LoRA is merged and saved, and the saved model
is scored by the same `llmrl eval` as llmrl's runs (greedy, the first 100 held-out questions, json calls),
so both sides' accuracy is one yardstick; TRL's own view (its tool-call frequency, reward) is recorded.

Order: llmrl (timing), TRL (full, with its eval), llmrl (timing), each in its own process; peak RSS of
each by GNU time. The first step of every run is a warm-up and is not counted in s/step. `--skip` leaves
runs out (their results already in --out are kept); skipping all three only re-summarises.

    python bench/vs_trl_qwen_tools.py --trl-steps 12 --timing-steps 3 \\
        --llmrl-runs /work/calcq0 ... --out bench/results/vs-trl-tools-qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl_episodes as vte

ROOT = Path(__file__).resolve().parent.parent
MODEL = os.path.expanduser("~/.cache/llmrl/models/qwen2.5-coder-0.5b-instruct")
RECIPE = "recipes/qwen2.5-0.5b-calc.yaml"
NEW_TOKENS, TEMPERATURE, LR, THREADS, EVAL_ROWS = 64, 1.0, 2e-4, 2, 100


def rows() -> tuple[list[dict], list[dict]]:
    """chat_calc_json's (train, held-out) rows, from llmrl itself (this script runs in llmrl's virtualenv)."""
    from llmrl.tasks import TASKS

    task = TASKS["chat_calc_json"]()
    return task.train, task.eval


def trl_args(steps: int, tmp: str) -> dict[str, Any]:
    """vs_trl_episodes.trl_args (8 × 8 episodes, 4 optimizer steps of 16 rows per rollout step, β 0, clip 0.2,
    AdamW, grad clip 1, fp32, token-mean loss) with this recipe's ≤ 64 new tokens a turn, ≤ 3 turns (episode
    budget 2 · 3 · 64 model + tool tokens), temperature 1.0, lr 2e-4."""
    args = vte.trl_args(steps, tmp)
    args.update(generation_kwargs={"max_new_tokens": NEW_TOKENS}, max_completion_length=2 * vte.TURNS * NEW_TOKENS,
                temperature=TEMPERATURE, learning_rate=LR)
    return args


def trl_run(steps: int, save_to: str) -> dict[str, Any]:
    """`steps` rollout steps of stock GRPOTrainer(tools=[calculator]); the merged model saved to `save_to`."""
    import resource

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback

    train, _ = rows()
    data = Dataset.from_list([{"prompt": train[i]["prompt"], "answer": train[i]["answer"]}
                              for i in vte.prompt_order(steps, len(train))])
    tok = AutoTokenizer.from_pretrained(MODEL)
    rewards: list[float] = []
    samples: list[dict[str, Any]] = []

    def exact_match(prompts, completions, answer, **_: Any) -> list[float]:
        scores = [float(vte.last_answer(c).strip() == a) for c, a in zip(completions, answer)]
        rewards.append(sum(scores) / len(scores))
        if len(samples) < 6:
            samples.append({"question": prompts[0][-1]["content"], "answer": answer[0], "completion": completions[0]})
        return scores

    t_start: list[float] = []
    ends: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not t_start:
                t_start.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    kwargs = trl_args(steps, tempfile.mkdtemp(prefix="bench-trl-qt-"))
    trainer = trl.GRPOTrainer(
        model=MODEL, reward_funcs=exact_match, args=trl.GRPOConfig(**kwargs), train_dataset=data,
        processing_class=tok, tools=[vte.calculator],
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=vte.TARGETS, task_type="CAUSAL_LM"),
        callbacks=[Timer()])
    t0 = time.perf_counter()
    trainer.train()
    result: dict[str, Any] = {"trl": trl.__version__, "transformers": transformers.__version__,
                              "torch": torch.__version__, "threads": torch.get_num_threads(),
                              "train_wall_s": time.perf_counter() - t0,
                              "model_dtype": str(next(trainer.model.parameters()).dtype)}
    per = vte.PROMPTS * vte.GENERATIONS // vte.MINIBATCH
    marks = t_start[:1] + ends[per - 1::per]
    result["step_s"] = [b - a for a, b in zip(marks, marks[1:])]
    result["reward"] = rewards
    logs = [h for h in trainer.state.log_history if "step" in h and "train_runtime" not in h]
    keep = ("completions/mean_length", "tools/call_frequency", "tools/failure_frequency", "reward")
    result["metrics_first_optimizer_step_of_each_rollout"] = [{k: h.get(k) for k in keep if k in h} for h in logs[::per]]
    result["samples"] = samples
    result["trl_args"] = {k: v for k, v in kwargs.items() if k != "output_dir"}
    result["peak_rss_mib_before_save"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    merged = trainer.model.merge_and_unload()
    merged.save_pretrained(save_to)
    tok.save_pretrained(save_to)
    return result


def timed(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `cmd` under GNU time: (process, wall seconds, peak RSS MiB)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false",
           "TRL_EXPERIMENTAL_SILENCE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    return proc, time.perf_counter() - t0, int(rss.group(1)) / 1024 if rss else float("nan")


def llmrl_timing(steps: int) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="bench-llmrl-qt-")) / "run"
    cmd = [str(ROOT / ".venv/bin/llmrl"), "train", "--recipe", RECIPE, "--steps", str(steps), "--out", str(out),
           "--set", "eval.size=0"]
    print(f"- llmrl ({steps} steps)", file=sys.stderr, flush=True)
    proc, wall, rss = timed(cmd, 3600)
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}", "stderr_tail": proc.stderr.strip().splitlines()[-25:]}
    rows_ = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"command": f"llmrl train --recipe {RECIPE} --steps {steps} --set eval.size=0", "wall_s": wall,
            "peak_rss_mib": rss, "step_s": [r["step_time_s"] for r in rows_], "reward": [r["reward_mean"] for r in rows_],
            "tool_calls_per_episode": [r.get("tool_calls_per_episode") for r in rows_]}


def trl_full(steps: int) -> dict[str, Any]:
    save_to = tempfile.mkdtemp(prefix="bench-trl-qt-model-")
    child_out = Path(save_to) / "child.json"
    print(f"- trl ({steps} steps)", file=sys.stderr, flush=True)
    proc, wall, rss = timed([sys.executable, str(Path(__file__).resolve()), "--child", "--steps", str(steps),
                             "--save-to", save_to, "--child-out", str(child_out)], 7200)
    if proc.returncode != 0:
        return {"failed": f"exit {proc.returncode}", "stderr_tail": proc.stderr.strip().splitlines()[-25:]}
    result = json.loads(child_out.read_text())
    result.update(wall_s=wall, peak_rss_mib=rss)
    evaluation = subprocess.run([str(ROOT / ".venv/bin/llmrl"), "eval", "--model", save_to, "--task", "chat_calc_json",
                                 "--tool-format", "json", "--samples", "0", "--size", str(EVAL_ROWS),
                                 "--max-new-tokens", str(NEW_TOKENS), "--json"],
                                capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
    result["eval_after_by_llmrl_eval"] = (json.loads(evaluation.stdout) if evaluation.returncode == 0
                                          else {"failed": evaluation.stderr.strip().splitlines()[-5:]})
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true")
    p.add_argument("--child-out")
    p.add_argument("--save-to")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--trl-steps", type=int, default=12)
    p.add_argument("--timing-steps", type=int, default=3)
    p.add_argument("--skip", nargs="*", default=[], help="llmrl-1, trl-full, llmrl-2: runs left out")
    p.add_argument("--llmrl-runs", nargs="*", default=[], help="folders of whole recipe runs: their accuracy and s/step")
    p.add_argument("--out", default=str(ROOT / "bench/results/vs-trl-tools-qwen0.5b.json"))
    args = p.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(THREADS)
        Path(args.child_out).write_text(json.dumps(trl_run(args.steps, args.save_to), default=str))
        return
    from rg_screen import cpu_name

    results: dict[str, Any] = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {"runs": {}}
    results.update(cpu=cpu_name(), model=MODEL, recipe=RECIPE)  # runs left out (--skip) keep their earlier results
    for name, fn in (("llmrl-1", lambda: llmrl_timing(args.timing_steps)), ("trl-full", lambda: trl_full(args.trl_steps)),
                     ("llmrl-2", lambda: llmrl_timing(args.timing_steps))):
        if name in args.skip:
            continue
        results["runs"][name] = fn()
        Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    for folder in args.llmrl_runs:
        summ = json.loads((Path(folder) / "summary.json").read_text())
        steps = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines() if line.strip()]
        results.setdefault("llmrl_full_runs", {})[folder] = {
            "step_s": [r["step_time_s"] for r in steps], "reward": [r["reward_mean"] for r in steps],
            **{k: summ.get(k) for k in ("seed", "steps", "eval_accuracy_before", "eval_accuracy_after", "wall_time_s",
                                        "peak_rss_mib")}}
    k = args.timing_steps
    runs = results["runs"]
    llmrl_s = [x for n in ("llmrl-1", "llmrl-2") for x in runs.get(n, {}).get("step_s", [])[1:k]]
    trl_s = runs.get("trl-full", {}).get("step_s", [])[1:k]
    results["summary"] = {
        f"llmrl_s_per_step_2_to_{k}": vte.mean(llmrl_s), f"trl_s_per_step_2_to_{k}": vte.mean(trl_s),
        "llmrl_peak_rss_mib": max((runs[n]["peak_rss_mib"] for n in ("llmrl-1", "llmrl-2") if "peak_rss_mib" in runs.get(n, {})),
                                  default=None),
        "llmrl_full_runs_s_per_step_2_to_%d" % k: vte.mean(
            [x for r in results.get("llmrl_full_runs", {}).values() for x in r["step_s"][1:k]]),
        "llmrl_full_runs_peak_rss_mib": max((r["peak_rss_mib"] for r in results.get("llmrl_full_runs", {}).values()),
                                            default=None),
        "llmrl_full_runs_accuracy": [(r["eval_accuracy_before"], r["eval_accuracy_after"])
                                     for r in results.get("llmrl_full_runs", {}).values()],
        "trl_peak_rss_mib": runs.get("trl-full", {}).get("peak_rss_mib"),
        "trl_accuracy_after": runs.get("trl-full", {}).get("eval_after_by_llmrl_eval", {}).get("greedy", {}).get("accuracy")}
    Path(args.out).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
