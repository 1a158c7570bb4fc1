"""What the vLLM engine's second copy costs in host memory, stage by stage (issue 29).

    .venv-vllm/bin/python bench/probes/vllm_rss.py --model ~/.cache/llmrl/gguf/SmolLM2-135M-Instruct.Q4_1-<hash> \
        [--rows 8] [--new-tokens 32] [--out bench/results/vllm-rss.json]

One process, on the CPU, the way llmrl's engine builds vLLM (in-process engine core, float32, eager,
the KV cache sized as llmrl sizes it for `--rows` rows of ≤ 128 tokens, llmrl/engines/vllm_memory.py):
VmRSS after importing torch + transformers, after `import vllm`, inside `vllm.LLM(...)` around its
CPU worker's stages (`init_device`, `load_model`: read the weights and let the CPU backend repack
them, `initialize_kv_cache`), after building, after `malloc_trim(0)`, and VmHWM (the peak) after
generating `--rows` rows of `--new-tokens` tokens; the end's RSS split into private memory (RssAnon)
and mapped files (RssFile: the safetensors file vLLM read its weights from, the libraries); the
model's own weight bytes for comparison; what vLLM's model keeps as plain parameters after its CPU
backend repacked the linear layers (`dispatch_cpu_unquantized_gemm`: a oneDNN copy per layer, the
plain weight replaced by an empty tensor; the tied LM head keeps both); and the CPU affinity and
torch threads the process has once vLLM is built.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _status(key: str) -> int:
    """VmRSS or VmHWM of this process, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _watch_worker(stages: dict[str, float], mib) -> None:
    """Record VmRSS (and VmHWM) before and after the CPU worker's stages while vllm.LLM is built."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.cpu_worker import CPUWorker

    def wrap(cls: type, name: str) -> None:
        plain = getattr(cls, name)

        def recorded(self, *args, **kwargs):
            stages[f"  before {name}"] = mib(_status("VmRSS"))
            result = plain(self, *args, **kwargs)
            stages[f"  after {name}"] = mib(_status("VmRSS"))
            stages[f"  after {name} (VmHWM)"] = mib(_status("VmHWM"))
            return result

        setattr(cls, name, recorded)

    wrap(CPUWorker, "init_device")
    wrap(CPUModelRunner, "load_model")
    wrap(CPUModelRunner, "initialize_kv_cache")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    import torch
    import transformers  # noqa: F401

    stages = {"torch + transformers": mib(_status("VmRSS"))}
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    import vllm

    stages["+ import vllm"] = mib(_status("VmRSS"))
    _watch_worker(stages, mib)
    config = transformers.AutoConfig.from_pretrained(a.model).get_text_config()
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head * 4
    kv = int(1.25 * a.rows * 128 * per_token)  # llmrl's sizing for rows of <= 128 tokens (vllm_memory.py)
    llm = vllm.LLM(model=a.model, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=kv, max_model_len=128,
                   enable_prefix_caching=True, seed=0, skip_tokenizer_init=True)  # as the engine: ids in, ids out
    stages["+ vllm.LLM built"] = mib(_status("VmRSS"))
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand the loader's freed heap back to the system
    stages["+ malloc_trim(0)"] = mib(_status("VmRSS"))
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    plain = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    emptied = sorted({n.split(".layers.")[-1].split(".", 1)[-1] for n, b in plain.items() if b == 0 and ".layers." in n})
    params = vllm.SamplingParams(max_tokens=a.new_tokens, temperature=1.0, seed=1, ignore_eos=True, detokenize=False)
    prompt = transformers.AutoTokenizer.from_pretrained(a.model)("What is 2+3?").input_ids
    llm.generate([{"prompt_token_ids": prompt}] * a.rows, params, use_tqdm=False)
    stages["+ one generation (VmRSS)"] = mib(_status("VmRSS"))
    stages["peak (VmHWM)"] = mib(_status("VmHWM"))
    split = {k: mib(_status(k)) for k in ("RssAnon", "RssFile", "RssShmem")}  # private memory / mapped files
    weights = sum(p.numel() * p.element_size() for p in
                  transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).parameters())
    out = {"model": a.model, "rows": a.rows, "new_tokens": a.new_tokens, "stages_mib": stages, "rss_split_mib": split,
           "kv_cache_mib": mib(kv), "model_weights_mib": mib(weights),
           "vllm_plain_params_mib": mib(sum(plain.values())), "vllm_repacked_weights": emptied, "affinity": sorted(os.sched_getaffinity(0)),
           "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count()}
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vLLM's engine core shutdown can hang at interpreter exit


if __name__ == "__main__":
    main()
