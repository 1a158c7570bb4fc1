"""The memory plan's predicted peak against the measured one (issue 68), one whole `llmrl train` command a
configuration, one at a time, some under a memory cgroup's cap (`bash bench/in_cgroup.sh GIB …`, as root).

    python bench/memory_plan.py --only tiny-ppo,smollm2-grpo --out bench/results/memory-plan.json
    python bench/memory_plan.py --list

Per configuration, from RUN/summary.json: `predicted_peak_mib` (the plan's), `peak_rss_mib` and each phase's
`peak_rss_<phase>_mib` (from the logged rows where a run died first); exit status (an OOM kill in a cap:
137), seconds, the cap's line (its cgroup peak); `fill`, the mean response length / rollout.max_new_tokens
(the plan holds every answer at its longest); last, predicted / measured − 1. A preset holding RM gets a
reward run on its base from a few pairs, once per base. Every command runs `--steps 2` unless its preset
says otherwise. The output is rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rg_learning import commit  # noqa: E402
from rg_screen import cpu_name  # noqa: E402

Q05, Q15, SMOL = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct"
NF4 = ["--set", "model.quantize=nf4"]
TOK = lambda n: ["--set", f"rollout.max_new_tokens={n}"]  # noqa: E731
ISSUE_4G = ["--model", Q05, "--task", "chat_sum", "--algo", "grpo", "--steps", "3", "--set", "rollout.prompts_per_step=8",
            "--set", "rollout.num_generations=8", "--set", "rollout.max_new_tokens=64", "--set", "eval.size=16"]
ISSUE_PPO = ["--model", Q15, "--algo", "ppo", *NF4, "--set", "rollout.prompts_per_step=8", "--set", "update.minibatch_size=8", *TOK(32)]
PRESETS: dict[str, tuple[int | None, list[str]]] = {  # name: (cap in GiB or None, llmrl train's arguments)
    "tiny-ppo": (None, []),  # the default run
    "tiny-grpo": (None, ["--algo", "grpo"]),
    "tiny-ppo-rm": (None, ["--reward", "RM"]),
    "smollm2-grpo": (None, ["--model", SMOL, "--algo", "grpo", *TOK(32)]),
    "smollm2-grpo-nf4": (None, ["--model", SMOL, "--algo", "grpo", *NF4, *TOK(32)]),
    "smollm2-ppo-256": (None, ["--model", SMOL, "--algo", "ppo", *TOK(256)]),
    "smollm2-ppo-rm": (None, ["--model", SMOL, "--algo", "ppo", "--task", "chat_sum", "--reward", "RM", *TOK(64)]),
    "qwen0.5b-grpo": (None, ["--model", Q05, "--algo", "grpo", *TOK(64)]),
    "qwen0.5b-grpo-nf4": (None, ["--model", Q05, "--algo", "grpo", *NF4, *TOK(64)]),
    "qwen0.5b-ppo-nf4-128": (None, ["--model", Q05, "--algo", "ppo", *NF4, *TOK(128)]),
    "qwen0.5b-ppo-rm": (None, ["--model", Q05, "--algo", "ppo", "--task", "chat_sum", "--reward", "RM", *TOK(32)]),
    "qwen1.5b-grpo": (None, ["--model", Q15, "--algo", "grpo", *TOK(32)]),
    "qwen1.5b-ppo-nf4": (None, ISSUE_PPO),  # the issue's 12,230 MiB run against an 8,737 MiB table
    "qwen1.5b-grpo-nf4-256": (None, ["--model", Q15, "--algo", "grpo", *NF4, *TOK(256)]),
    "issue-chat_sum-float": (None, ISSUE_4G),  # the uncapped float32 defaults: the 4 GiB run's yardstick
    "issue-chat_sum-nf4-4g": (4, [*ISSUE_4G, *NF4]),  # the issue's command in a 4 GiB cgroup
    "qwen1.5b-ppo-nf4-6g": (6, ["--model", Q15, "--algo", "ppo", *NF4]),  # no setting but model.quantize
    "qwen1.5b-grpo-nf4-5g": (5, ["--model", Q15, "--algo", "grpo", *NF4]),
    "qwen1.5b-grpo-nf4-256-8g": (8, ["--model", Q15, "--algo", "grpo", *NF4, *TOK(256)]),
}
PHASES = ("load", "evaluate", "generate", "score", "forwards", "update", "checkpoint")
PAIRS = [{"prompt": f"What is {a}+{b}?", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(8) for b in range(4)]


def reward_run(model: str, root: Path) -> str:
    """A reward run on `model` (its base) from a few arithmetic pairs, trained once per base under ROOT."""
    out = root / f"rm-{model.replace('/', '_')}"
    if not (out / "reward.json").exists():
        (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
        proc = subprocess.run([sys.executable, "-m", "llmrl", "reward", "train", "--model", model, "--data",
                               str(root / "pairs.jsonl"), "--epochs", "1", "--out", str(out), "--overwrite"], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"the reward run on {model} failed: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    return str(out)


def measure(name: str, root: Path) -> dict:
    """One preset's whole command: exit status, seconds, the plan's and the run's peaks."""
    cap, args = PRESETS[name]
    args = [reward_run(args[args.index("--model") + 1] if "--model" in args else "tiny", root) if a == "RM" else a
            for a in args]
    out = root / name
    cmd = [sys.executable, "-m", "llmrl", "train", *args, *([] if "--steps" in args else ["--steps", "2"]),
           "--out", str(out), "--overwrite"]
    cmd = ["bash", str(Path(__file__).parent / "in_cgroup.sh"), str(cap), *cmd] if cap else cmd
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row = {"name": name, "cap_gib": cap, "command": " ".join(cmd), "exit": proc.returncode,
           "seconds": round(time.perf_counter() - start, 1),
           "cgroup": next((ln for ln in proc.stdout.splitlines() if ln.startswith("cgroup:")), None)}
    if proc.returncode:
        row["error"] = ((proc.stderr or proc.stdout).strip().splitlines() or [""])[-1]
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] if (out / "metrics.jsonl").exists() else []
    row.update(predicted_mib=summary.get("predicted_peak_mib"), measured_mib=summary.get("peak_rss_mib"))
    tokens = yaml.safe_load((out / "config.yaml").read_text())["rollout"]["max_new_tokens"] if logged else 1
    lengths = [r["response_len"] for r in logged if "response_len" in r]
    row["fill"] = round(sum(lengths) / len(lengths) / tokens, 3) if lengths else None
    keys = {p: f"peak_rss_{p}_mib" for p in PHASES}
    return row | {p: max((r[k] for r in [summary, *logged] if r.get(k) is not None), default=None) for p, k in keys.items()}


def table(rows: list[dict]) -> str:
    mib = lambda x: "—" if x is None else f"{x:,.0f}"  # noqa: E731
    head = ["configuration", "cap", "exit", "s", "predicted", "measured", *PHASES, "fill", "pred/meas−1"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        ratio = (f"{r['predicted_mib'] / r['measured_mib'] - 1:+.1%}" if r["predicted_mib"] and r["measured_mib"] else "—")
        lines.append(" | ".join([r["name"], f"{r['cap_gib']} GiB" if r["cap_gib"] else "—", str(r["exit"]),
                                 f"{r['seconds']:.0f}", mib(r["predicted_mib"]), mib(r["measured_mib"]),
                                 *(mib(r[p]) for p in PHASES), f"{r.get('fill') or 0:.0%}", ratio]))
    return "\n".join(f"| {ln} |" for ln in lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(PRESETS), help="comma-separated presets, in this order (--list)")
    ap.add_argument("--list", action="store_true", help="print each preset's cap and arguments, and exit")
    ap.add_argument("--root", default=None, help="where the run folders go (default: a new temporary folder)")
    ap.add_argument("--out", default="bench/results/memory-plan.json")
    a = ap.parse_args()
    if a.list:
        print("\n".join(f"{n}: {f'{c} GiB cap, ' if c else ''}{' '.join(args) or '(the defaults)'}"
                        for n, (c, args) in PRESETS.items()))
        return
    names = a.only.split(",")
    if unknown := [n for n in names if n not in PRESETS]:
        raise SystemExit(f"unknown preset(s) {', '.join(unknown)}; valid: {', '.join(PRESETS)}")
    (root := Path(a.root or tempfile.mkdtemp(prefix="memory-plan-"))).mkdir(parents=True, exist_ok=True)
    result = {"command": " ".join(["python", *sys.argv]), "cpu": cpu_name(), "llmrl": commit(),
              "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": []}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        result["runs"].append(measure(name, root))
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        print(table(result["runs"][-1:]).splitlines()[-1], flush=True)
    print(table(result["runs"]))


if __name__ == "__main__":
    main()
