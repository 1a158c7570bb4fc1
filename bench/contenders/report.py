"""bench/vs_trl.py's table: per contender the median seconds per step over the steps after the first of
all repetitions, generated tokens per second over those steps, peak RSS (and GPU memory) as the median
over repetitions, mean reward; then the ratios llmrl/TRL and llmrl against the floor of its algorithm.
"""

from __future__ import annotations

import statistics
from typing import Any

from . import shared

# the issue's figures for TRL 1.12's experimental PPOTrainer (policy + reference + value model), 2 threads
ISSUE_PPO = {"s_per_step": 10.63, "peak_rss_mib": 5.3 * 1024}
LABELS = {"llmrl-grpo-defaults": "llmrl grpo (defaults)", "llmrl-grpo": "llmrl grpo, on_policy_logprobs=false",
          "llmrl-grpo-fast": "llmrl grpo, on_policy_logprobs=true", "trl-grpo": "TRL GRPOTrainer",
          "llmrl-rloo-fast": "llmrl rloo-style, on_policy_logprobs",
          "llmrl-grpo-fast-adapters": "llmrl grpo fast, engine.merge_lora=false", "trl-rloo": "TRL RLOOTrainer",
          "llmrl-ppo": "llmrl ppo (actor+critic+ref)", "llmrl-ppo-top4": "llmrl ppo, lora.critic_layers=4",
          "trl-ppo": "TRL 1.12 PPOTrainer (bench/trl_ppo.py)",
          "bound": "floor pieces", "llmrl-vllm": "llmrl grpo, --engine vllm (merged sync)",
          "llmrl-vllm-adapter": "llmrl grpo, --engine vllm, engine.sync=adapter",
          "llmrl-vllm-bf16": "llmrl grpo, vllm engine in bfloat16", "trl-grpo-vllm": "TRL GRPOTrainer, use_vllm colocate",
          "vllm-generate": "plain vLLM LLM.generate"}


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def memory_of(results: list[dict[str, Any]]) -> dict[str, float]:
    """Median over repetitions of peak RSS and, on a GPU, of peak GPU memory (allocated, reserved)."""
    keys = ("peak_rss_mib", "peak_gpu_mib", "peak_gpu_reserved_mib")
    return {k: median([r[k] for r in results]) for k in keys if k in results[0]}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per contender: median s/step over (steps after the warm-up) × repetitions, tokens/s over the
    same steps, median peak RSS over repetitions, mean reward over all steps."""
    table: dict[str, Any] = {}
    for name, results in runs.items():
        if not results:
            continue
        if name in ("bound", "vllm-generate"):
            pieces = {k: median([x for r in results for x in r["pieces_s"][k]]) for k in results[0]["pieces_s"]}
            toks = {k: median([x for r in results for x in r["gen_tokens"][k]]) for k in results[0]["gen_tokens"]}
            table[name] = {"pieces_s": pieces, "gen_tokens": toks,
                           "gen_tokens_per_s": {k: toks[k] / pieces[k] for k in toks},
                           **memory_of(results), "dtype": results[0].get("dtype", "float32")}
            continue
        steps = [x for r in results for x in r["step_s"][1:]]
        toks = [x for r in results for x in r["tokens"][1:]]
        table[name] = {
            "s_per_step": median(steps), "steps_counted": len(steps),
            "tokens_per_step": statistics.mean(toks) if toks else None,
            "tokens_per_s": sum(toks) / sum(steps) if steps else None,
            **memory_of(results),
            **generation_rate(results),
            "reward_mean": statistics.mean([x for r in results for x in r["reward"]]),
            "dtype": results[0].get("dtype", "float32"), "label": label_of(name),
        }
    return table


def generation_rate(results: list[dict[str, Any]]) -> dict[str, float]:
    """llmrl runs: tokens/s of the generate phase alone and the median sync seconds (after the warm-up)."""
    if "generate_s" not in results[0]:
        return {}
    gen = [x for r in results for x in r["generate_s"][1:]]
    toks = [x for r in results for x in r["tokens"][1:]]
    return {"generate_tokens_per_s": sum(toks) / sum(gen), "sync_s": median([x for r in results for x in r["sync_s"][1:]])}


def split_contender(name: str) -> tuple[str, str | None]:
    """'NAME@DTYPE' → (NAME, DTYPE); a plain name → (name, None): it runs in --dtype."""
    base, _, dtype = name.partition("@")
    return base, dtype or None


def label_of(name: str) -> str:
    base, dtype = split_contender(name)
    return LABELS.get(base, base) + (f" ({dtype})" if dtype else "")


def pair_ratios(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """ours/theirs for time, throughput and every memory figure both have."""
    keys = ("s_per_step", "tokens_per_s", "peak_rss_mib", "peak_gpu_mib", "peak_gpu_reserved_mib")
    return {k: a[k] / b[k] for k in keys if k in a and k in b}


def ratios(table: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pairs = [("llmrl-grpo-defaults", "trl-grpo"), ("llmrl-grpo", "trl-grpo"), ("llmrl-grpo-fast", "trl-grpo"),
             ("llmrl-rloo-fast", "trl-rloo"), ("llmrl-grpo-fast", "llmrl-grpo-fast-adapters")]
    for ours, theirs in pairs:
        if ours in table and theirs in table:
            a, b = table[ours], table[theirs]
            out[f"{ours}/{theirs}"] = pair_ratios(a, b)
    for ours in ("llmrl-ppo", "llmrl-ppo-top4"):
        if ours in table and "trl-ppo" in table:
            out[f"{ours}/trl-ppo"] = pair_ratios(table[ours], table["trl-ppo"])
    if "llmrl-ppo" in table and "peak_gpu_mib" not in table["llmrl-ppo"]:  # the issue's figures are CPU ones
        out["llmrl-ppo/issue-trl-ppo"] = {k: table["llmrl-ppo"][k] / v for k, v in ISSUE_PPO.items()}
    trl_best = min((table[n] for n in table if split_contender(n)[0] in ("trl-grpo", "trl-grpo-vllm")),
                   key=lambda r: r["s_per_step"], default=None)
    for ours in table:
        if split_contender(ours)[0] in ("llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16", "llmrl-grpo-fast",
                                        "llmrl-grpo-fast-adapters") and trl_best is not None:
            out[f"{ours}/fastest TRL ({trl_best['label']})"] = pair_ratios(table[ours], trl_best)
    for ours in ("llmrl-vllm", "llmrl-vllm-adapter", "llmrl-vllm-bf16"):  # issue 29: the engine's memory
        if ours in table and "llmrl-grpo-fast" in table:
            out[f"{ours}/llmrl-grpo-fast"] = pair_ratios(table[ours], table["llmrl-grpo-fast"])
    if "vllm-generate" in table:
        rate = table["vllm-generate"]["gen_tokens_per_s"]
        out["vllm-generate"] = {"llmrl engine/plain LLM.generate tokens_per_s": rate["llmrl_vllm_engine"] / rate["vllm_generate"]}
        for ours in ("llmrl-vllm", "llmrl-vllm-bf16"):
            if ours in table:
                out[f"{ours} generate phase/plain vLLM generate"] = {
                    "tokens_per_s": table[ours]["generate_tokens_per_s"] / rate["vllm_generate"]}
    if "bound" in table:
        p = table["bound"]["pieces_s"]
        floor = p["hf_generate_lora"] + p["nograd_forward_ref"] + p["lora_fwd_bwd"]
        out["bound"] = {"grpo_floor_s": floor, "grpo_floor_with_old_forward_s": floor + p["nograd_forward_lora"]}
        for name in ("llmrl-grpo-defaults", "llmrl-grpo", "llmrl-grpo-fast", "llmrl-rloo-fast", "trl-grpo", "trl-rloo"):
            if name in table:
                out["bound"][f"{name}/floor"] = table[name]["s_per_step"] / floor
        t = table["bound"]["gen_tokens_per_s"]
        out["bound"]["llmrl_generate/hf_generate_lora tokens_per_s"] = t["llmrl_generate"] / t["hf_generate_lora"]
    return out


def print_table(table: dict[str, Any], rat: dict[str, Any], dtype: str) -> None:
    print(f"\ndtype {dtype}, device {shared.DEVICE} (every contender)")
    print(f"{'contender':<21}{'dtype':>9}{'s/step':>9}{'tok/step':>10}{'tok/s':>8}{'RSS MiB':>9}{'GPU MiB':>9}"
          f"{'reward':>8}  label")
    for name, r in table.items():
        if name in ("bound", "vllm-generate"):
            continue
        gpu = f"{r['peak_gpu_mib']:>9.0f}" if "peak_gpu_mib" in r else f"{'-':>9}"
        print(f"{name:<21}{r['dtype']:>9}{r['s_per_step']:>9.2f}{r['tokens_per_step']:>10.1f}{r['tokens_per_s']:>8.1f}"
              f"{r['peak_rss_mib']:>9.0f}{gpu}{r['reward_mean']:>8.3f}  {r['label']}")
    if "bound" in table:
        b = table["bound"]
        print("\nfloor pieces (median s):", {k: round(v, 3) for k, v in b["pieces_s"].items()})
        print("generate tokens/s:", {k: round(v, 1) for k, v in b["gen_tokens_per_s"].items()})
    if "vllm-generate" in table:
        print("vLLM generate tokens/s:", {k: round(v, 1) for k, v in table["vllm-generate"]["gen_tokens_per_s"].items()})
    for name, r in table.items():
        if "generate_tokens_per_s" in r:
            print(f"{name}: generate phase {r['generate_tokens_per_s']:.1f} tokens/s, sync {r['sync_s']:.3f} s")
    print("\nratios:")
    for k, v in rat.items():
        print(f"  {k}: " + ", ".join(f"{kk}={vv:.3f}" for kk, vv in v.items()))
