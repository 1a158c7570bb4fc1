"""llmrl against TRL on one configuration, side by side: seconds per step, generated tokens per
second, peak RSS, and llmrl's step time against the floor of its own algorithm.

Configuration (issue 8): SmolLM2-135M-Instruct, LoRA r=16 (α=32) on q,k,v,o, 2 prompts × 4 samples,
32 new tokens, β=0.04 (KL k3 in the loss), one update per batch, temperature 1, fp32, chat prompts
"What is a+b?" (a, b in 1..20, llmrl's `chat_sum` train split), reward 1.0 when the last number of
the completion is the sum (llmrl's `numeric` reward, given to TRL too).

Every contender runs in its own subprocess (peak RSS = VmHWM of that process), with
torch.set_num_threads(THREADS); repetitions alternate the contenders (A, B, C, A, B, C, ...), so a
slow patch of a shared CPU hits all of them. A step is timed end to end (rollout, reward, update);
the first step of each run is a warm-up and is not counted.

    python bench/vs_trl.py --model PATH --out bench-results.json [--steps 4] [--reps 2]

Contenders: llmrl-grpo (update.on_policy_logprobs=off), llmrl-grpo-fast (=on: what the default 'auto'
gives this on-policy configuration), llmrl-rloo-fast,
trl-grpo, trl-rloo, llmrl-ppo (actor + critic + reference on one base), bound (plain HF generate,
llmrl's own generate, one no-grad forward, one LoRA forward + backward). TRL is optional
(`pip install -e '.[bench]'`); without it the TRL rows are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

MODEL = "~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-629336b87325"
PROMPTS, GENERATIONS, NEW_TOKENS, BETA, LR, SEED = 2, 4, 32, 0.04, 1e-5, 0
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
# the issue's figures for TRL 1.12's experimental PPOTrainer (policy + reference + value model), 2 threads
ISSUE_PPO = {"s_per_step": 10.63, "peak_rss_mib": 5.3 * 1024}
CONTENDERS = ["llmrl-grpo", "llmrl-grpo-fast", "trl-grpo", "llmrl-rloo-fast", "trl-rloo", "llmrl-ppo", "bound"]


# ---- children: one contender per process ---------------------------------------------------------
def vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def llmrl_run(model: str, algo: str, fast: bool, steps: int) -> dict[str, Any]:
    """`steps` llmrl train steps (setup as `llmrl train` does, no eval, no checkpoints)."""
    from llmrl import load_config
    from llmrl.engine.reporting import NullReporter
    from llmrl.engine.trainer import setup, train_step

    out = tempfile.mkdtemp(prefix="bench-llmrl-")
    overrides = {
        "algo": algo, "task": "chat_sum", "seed": SEED, "threads": THREADS, "out": out,
        "model.name": model, "model.dtype": "float32", "model.device": "cpu", "data.chat_template": "auto",
        "lora.r": 16, "lora.alpha": 32.0, "lora.dropout": 0.0, "lora.target_modules": TARGETS,
        "rollout.prompts_per_step": PROMPTS, "rollout.num_generations": 1 if algo == "ppo" else GENERATIONS,
        "rollout.max_new_tokens": NEW_TOKENS, "rollout.temperature": 1.0,
        "update.epochs": 1, "update.minibatch_size": PROMPTS * (1 if algo == "ppo" else GENERATIONS),
        "update.lr_actor": LR, "update.on_policy_logprobs": fast,
        "eval.size": 0, "checkpoint.every": 0,
    }
    if algo == "ppo":  # same rows per step: 8 prompts × 1 sample
        overrides["rollout.prompts_per_step"] = PROMPTS * GENERATIONS
    else:
        overrides.update({"kl.beta": BETA, "kl.estimator": "k3", "kl.placement": "loss"})
    config = load_config(overrides=overrides)
    s = setup(config, NullReporter(), overwrite=True)
    times, tokens, rewards = [], [], []
    for step in range(steps):
        t0 = time.perf_counter()
        row = train_step(s, step)
        times.append(time.perf_counter() - t0)
        tokens.append(row["tokens"])
        rewards.append(row["reward_mean"])
    return {"step_s": times, "tokens": tokens, "reward": rewards}


def trl_run(model: str, kind: str, steps: int) -> dict[str, Any]:
    """`steps` TRL GRPOTrainer / RLOOTrainer steps with the same model, LoRA, batch and reward."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    import trl

    from llmrl.rewards.builtin import numeric
    from llmrl.tasks import get_task

    rows = get_task("chat_sum").train[:64]
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    tokens: list[int] = []
    rewards: list[float] = []

    def reward(prompts, completions, answer, completion_ids=None, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = numeric(prompts, texts, answer=answer)
        tokens.append(sum(len(ids) for ids in completion_ids) if completion_ids is not None else -1)
        rewards.append(sum(scores) / len(scores))
        return scores

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            times.append(time.perf_counter() - self.t0)

    common = dict(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=NEW_TOKENS, temperature=1.0, beta=BETA,
        num_iterations=1, learning_rate=LR, max_steps=steps, logging_steps=1, report_to="none",
        save_strategy="no", use_cpu=True, bf16=False, seed=SEED, dataloader_num_workers=0,
        gradient_accumulation_steps=1,
    )
    Config, Trainer = (trl.GRPOConfig, trl.GRPOTrainer) if kind == "grpo" else (trl.RLOOConfig, trl.RLOOTrainer)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model)
    trainer = Trainer(
        model=policy, reward_funcs=reward, args=Config(**common), train_dataset=data, processing_class=tok,
        peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"),
        callbacks=[Timer()],
    )
    trainer.train()
    return {"step_s": times, "tokens": tokens[: len(times)], "reward": rewards[: len(times)], "trl": trl.__version__}


def bound_run(model: str, reps: int) -> dict[str, Any]:
    """Medians over `reps` of the pieces a GRPO step cannot avoid, on one batch of 2 × 4 rows."""
    import torch

    from llmrl import load_config
    from llmrl.engine.reporting import NullReporter
    from llmrl.engine.rollout import RolloutPlan, encode_prompts, masked_logprobs, rollout
    from llmrl.engine.sampling import generate, row_uniforms
    from llmrl.engine.trainer import setup
    from llmrl.models.stack import layout, token_logprobs

    config = load_config(overrides={
        "algo": "grpo", "task": "chat_sum", "threads": THREADS, "out": tempfile.mkdtemp(prefix="bench-bound-"),
        "model.name": model, "model.dtype": "float32", "lora.r": 16, "lora.alpha": 32.0,
        "lora.target_modules": TARGETS, "rollout.prompts_per_step": PROMPTS,
        "rollout.num_generations": GENERATIONS, "rollout.max_new_tokens": NEW_TOKENS,
        "update.minibatch_size": PROMPTS * GENERATIONS, "eval.size": 0})
    s = setup(config, NullReporter(), overwrite=True)
    with torch.no_grad():  # a trained-looking adapter (B ≠ 0), as after a few steps
        for p in s.stack.parameters_of("actor"):
            p.add_(1e-3 * torch.randn_like(p))
    rows = s.task.train[:PROMPTS]
    tok, stack = s.tokenizer, s.stack
    ids, mask = encode_prompts(tok, [r["prompt"] for r in rows], stack.lm.device)
    ids, mask = ids.repeat_interleave(GENERATIONS, 0), mask.repeat_interleave(GENERATIONS, 0)
    batch, _ = rollout(stack, tok, rows, torch.arange(PROMPTS), cfg=config.rollout,
                       plan=RolloutPlan(reference=True, critic=False, greedy=False), reward_fn=s.task.reward, seed=0, step=0)
    out: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        result = fn()
        out.setdefault(name, []).append(time.perf_counter() - t0)
        return result

    def hf_generate() -> int:
        g = stack.lm.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=1.0, top_k=0,
                              top_p=1.0, max_new_tokens=NEW_TOKENS, pad_token_id=tok.pad_token_id)
        resp = g[:, ids.shape[1]:]
        ended = (resp == tok.eos_token_id).long().cumsum(-1)
        return int(((ended == 0) | ((ended == 1) & (resp == tok.eos_token_id))).sum())

    def own_generate(i: int) -> int:
        u = row_uniforms(0, 100 + i, torch.arange(PROMPTS).repeat_interleave(GENERATIONS),
                         torch.arange(GENERATIONS).repeat(PROMPTS), NEW_TOKENS)
        g = generate(stack, ids, mask, max_new_tokens=NEW_TOKENS, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                     temperature=1.0, uniforms=u)
        return int(g.response_mask.sum())

    def fwd_bwd() -> None:
        seq = layout(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
        lp = token_logprobs(stack.response_logits(seq, 1.0), batch.response_ids)
        loss = -(lp * batch.response_mask).sum() / batch.response_mask.sum()
        loss.backward()
        stack.zero_grad(set_to_none=True)

    gen_tokens: dict[str, list[int]] = {"hf_generate_lora": [], "hf_generate_base": [], "llmrl_generate": []}
    for i in range(reps + 1):  # the first round is a warm-up
        with torch.no_grad(), stack.use("actor"):
            gen_tokens["hf_generate_lora"].append(timed("hf_generate_lora", hf_generate))
        with torch.no_grad(), stack.use("reference"):
            gen_tokens["hf_generate_base"].append(timed("hf_generate_base", hf_generate))
        with stack.use("actor"):
            gen_tokens["llmrl_generate"].append(timed("llmrl_generate", lambda: own_generate(i)))
        with stack.use("reference"):
            timed("nograd_forward_ref", lambda: masked_logprobs(stack, batch, 1.0))
        with stack.use("actor"):
            timed("nograd_forward_lora", lambda: masked_logprobs(stack, batch, 1.0))
            timed("lora_fwd_bwd", fwd_bwd)
    return {"pieces_s": {k: v[1:] for k, v in out.items()}, "gen_tokens": {k: v[1:] for k, v in gen_tokens.items()},
            "batch_response_tokens": int(batch.response_mask.sum())}


def child(name: str, model: str, steps: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    if name == "bound":
        result = bound_run(model, max(steps - 1, 1))
    elif name.startswith("trl-"):
        result = trl_run(model, name.split("-")[1], steps)
    else:
        algo = name.split("-")[1]
        result = llmrl_run(model, algo, fast=name.endswith("-fast"), steps=steps)
    result["peak_rss_mib"] = vm_hwm_mib()
    result["threads"] = torch.get_num_threads()
    return result


# ---- parent: alternate the contenders, then summarise ----------------------------------------------
def run_child(name: str, model: str, steps: int, timeout: float) -> dict[str, Any] | None:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, __file__, "--child", name, "--model", model, "--steps", str(steps),
           "--threads", str(THREADS), "--child-out", path]
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(f"  {name}: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    result = json.loads(Path(path).read_text())
    result["wall_s"] = wall
    return result


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per contender: median s/step over (steps after the warm-up) × repetitions, tokens/s over the
    same steps, median peak RSS over repetitions, mean reward over all steps."""
    table: dict[str, Any] = {}
    for name, results in runs.items():
        if not results:
            continue
        if name == "bound":
            pieces = {k: median([x for r in results for x in r["pieces_s"][k]]) for k in results[0]["pieces_s"]}
            toks = {k: median([x for r in results for x in r["gen_tokens"][k]]) for k in results[0]["gen_tokens"]}
            table[name] = {"pieces_s": pieces, "gen_tokens": toks,
                           "gen_tokens_per_s": {k: toks[k] / pieces[k] for k in toks},
                           "peak_rss_mib": median([r["peak_rss_mib"] for r in results])}
            continue
        steps = [x for r in results for x in r["step_s"][1:]]
        toks = [x for r in results for x in r["tokens"][1:]]
        table[name] = {
            "s_per_step": median(steps), "steps_counted": len(steps),
            "tokens_per_step": statistics.mean(toks) if toks else None,
            "tokens_per_s": sum(toks) / sum(steps) if steps else None,
            "peak_rss_mib": median([r["peak_rss_mib"] for r in results]),
            "reward_mean": statistics.mean([x for r in results for x in r["reward"]]),
        }
    return table


def ratios(table: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pairs = [("llmrl-grpo", "trl-grpo"), ("llmrl-grpo-fast", "trl-grpo"), ("llmrl-rloo-fast", "trl-rloo")]
    for ours, theirs in pairs:
        if ours in table and theirs in table:
            a, b = table[ours], table[theirs]
            out[f"{ours}/{theirs}"] = {k: a[k] / b[k] for k in ("s_per_step", "tokens_per_s", "peak_rss_mib")}
    if "llmrl-ppo" in table:
        out["llmrl-ppo/issue-trl-ppo"] = {k: table["llmrl-ppo"][k] / v for k, v in ISSUE_PPO.items()}
    if "bound" in table:
        p = table["bound"]["pieces_s"]
        floor = p["hf_generate_lora"] + p["nograd_forward_ref"] + p["lora_fwd_bwd"]
        out["bound"] = {"grpo_floor_s": floor, "grpo_floor_with_old_forward_s": floor + p["nograd_forward_lora"]}
        for name in ("llmrl-grpo", "llmrl-grpo-fast", "llmrl-rloo-fast", "trl-grpo", "trl-rloo"):
            if name in table:
                out["bound"][f"{name}/floor"] = table[name]["s_per_step"] / floor
        t = table["bound"]["gen_tokens_per_s"]
        out["bound"]["llmrl_generate/hf_generate_lora tokens_per_s"] = t["llmrl_generate"] / t["hf_generate_lora"]
    return out


def print_table(table: dict[str, Any], rat: dict[str, Any]) -> None:
    print(f"\n{'contender':<18}{'s/step':>9}{'tok/step':>10}{'tok/s':>8}{'RSS MiB':>9}{'reward':>8}")
    for name, r in table.items():
        if name == "bound":
            continue
        print(f"{name:<18}{r['s_per_step']:>9.2f}{r['tokens_per_step']:>10.1f}{r['tokens_per_s']:>8.1f}"
              f"{r['peak_rss_mib']:>9.0f}{r['reward_mean']:>8.3f}")
    if "bound" in table:
        b = table["bound"]
        print("\nfloor pieces (median s):", {k: round(v, 3) for k, v in b["pieces_s"].items()})
        print("generate tokens/s:", {k: round(v, 1) for k, v in b["gen_tokens_per_s"].items()})
    print("\nratios:")
    for k, v in rat.items():
        print(f"  {k}: " + ", ".join(f"{kk}={vv:.3f}" for kk, vv in v.items()))


def main() -> None:
    global THREADS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--out", default=None, help="write the results JSON here")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is a warm-up")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of each contender, alternated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default=",".join(CONTENDERS), help="comma-separated contenders")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per child run")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    THREADS = a.threads
    model = str(Path(os.path.expanduser(a.model)))
    if a.child:
        Path(a.child_out).write_text(json.dumps(child(a.child, model, a.steps)))
        return
    names = [n for n in a.only.split(",") if n]
    try:
        import trl  # noqa: F401
    except ImportError:
        print("TRL is not installed (pip install -e '.[bench]'): skipping the TRL contenders", file=sys.stderr)
        names = [n for n in names if not n.startswith("trl-")]
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    t0 = time.perf_counter()
    for rep in range(a.reps):
        for name in names:
            r = run_child(name, model, a.steps, a.timeout)
            if r is not None:
                runs[name].append(r)
                shown = r.get("step_s") or r.get("pieces_s")
                print(f"rep {rep + 1} {name}: wall {r['wall_s']:.0f} s, RSS {r['peak_rss_mib']:.0f} MiB, "
                      f"{json.dumps(shown)[:140]}", flush=True)
    table = summarise(runs)
    rat = ratios(table)
    print_table(table, rat)
    result = {"config": {"model": model, "prompts": PROMPTS, "generations": GENERATIONS, "new_tokens": NEW_TOKENS,
                         "beta": BETA, "lr": LR, "threads": THREADS, "steps": a.steps, "reps": a.reps,
                         "lora": {"r": 16, "alpha": 32, "targets": TARGETS}},
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
              "total_wall_s": time.perf_counter() - t0, "table": table, "ratios": rat, "runs": runs}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {a.out}")


def machine() -> dict[str, Any]:
    import platform

    import torch
    import transformers

    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
            "transformers": transformers.__version__}
    try:
        import peft
        import trl

        info.update(peft=peft.__version__, trl=trl.__version__)
    except ImportError:
        pass
    return info


THREADS = 1

if __name__ == "__main__":
    main()
