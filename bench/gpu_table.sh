#!/usr/bin/env bash
# Issue 8's side-by-side table on a GPU, as one command for the device machine (which reaches no
# package index and no hub). Prepare here first: `bash bench/gpu_prepare.sh` fills .gpu/; then
# device run with carry [".gpu"] and command `bash bench/gpu_table.sh` (results come back in $OUT).
#
# Steps: install the carried wheels into $SITE (this repo's package versions) and TRL 1.12 into
# bench/.trl-1.12; record the machine; build a random-weight model of $SHAPE on the GPU
# (bench/gpu_model.py); run bench/gpu_check.sh when present (CUDA tests); run bench/vs_trl.py on
# the GPU, then bench/roofline.py (the step's phases against the device's measured peak). Each
# stage has its own time limit so that a slow stage still leaves results.
#
# Knobs (environment): SHAPE (qwen2.5-1.5b), DEVICE (cuda), DTYPE (bfloat16), STEPS (4), REPS (2),
# THREADS (4), ONLY (the contenders), VLLM_ONLY (the vLLM contenders, run when vLLM imports), INSTALL (1; 0 uses the current environment), CHECK (1),
# BENCH_LIMIT (seconds for vs_trl, 420), ROOFLINE_LIMIT (300), NF4 (1: the 4-bit base stage), NF4_LIMIT (240), OUT (a new temporary folder). On a CPU, for checking this
# script itself: INSTALL=0 CHECK=0 DEVICE=cpu SHAPE=tiny DTYPE=float32 bash bench/gpu_table.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
SHAPE=${SHAPE:-qwen2.5-1.5b} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}
STEPS=${STEPS:-4} REPS=${REPS:-2} THREADS=${THREADS:-4} SITE=${SITE:-/tmp/llmrl-site}
ONLY=${ONLY:-llmrl-grpo-defaults,trl-grpo,llmrl-rloo-fast,trl-rloo,llmrl-ppo,trl-ppo,bound}
LOG="$OUT/gpu-table.log"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -d .gpu/cache ] && export LLMRL_CACHE_DIR="$PWD/.gpu/cache"  # the built-in tiny model, built here
say() { echo "== $(date -u +%T) $*" | tee -a "$LOG"; }

if [ "${INSTALL:-1}" = 1 ]; then
  say "installing the carried wheels"
  pip_install() { "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "$@"; }
  pip_install --target "$SITE" .gpu/whl/*.whl && pip_install --target bench/.trl-1.12 .gpu/trl112/*.whl \
    || { say "wheel install failed (run bench/gpu_prepare.sh here and carry .gpu)"; exit 1; }
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  nproc
  "$PY" -c "import sys, torch, transformers, peft, datasets; print(sys.version.split()[0], 'torch', torch.__version__, \
torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'datasets', datasets.__version__)"
} 2>&1 | tee -a "$LOG"

MODEL=/tmp/llmrl-bench-$SHAPE
say "building $SHAPE at $MODEL"
[ "$DEVICE" = cuda ] && BUILD_DEVICE=cuda || BUILD_DEVICE=cpu
timeout 300 "$PY" bench/gpu_model.py build --shape "$SHAPE" --tokenizer .gpu/tokenizer --out "$MODEL" \
  --device "$BUILD_DEVICE" 2>&1 | tee -a "$LOG"
[ -f "$MODEL/config.json" ] || { say "model build failed"; exit 1; }

if [ "${CHECK:-1}" = 1 ] && [ -f bench/gpu_check.sh ]; then
  say "bench/gpu_check.sh"
  # its logs and run folder stay there (what comes back from $OUT is limited to 8 files); the tails come here
  OUT=/tmp/llmrl-gpu-check timeout 300 bash bench/gpu_check.sh 2>&1 | tee -a "$LOG"
fi

say "bench/vs_trl.py on $DEVICE, $DTYPE, $STEPS steps × $REPS reps: $ONLY"
timeout "${BENCH_LIMIT:-420}" "$PY" bench/vs_trl.py --device "$DEVICE" --dtype "$DTYPE" --model "$MODEL" \
  --steps "$STEPS" --reps "$REPS" --threads "$THREADS" --timeout 180 --only "$ONLY" \
  --out "$OUT/results-vs-trl-$DEVICE-$SHAPE.json" 2>&1 | tee -a "$LOG"
# the vLLM contenders (issue 15), when the machine has vLLM: its CUDA wheel (~400 MB) is over the
# 64 MiB a device call carries, so it cannot be brought here; VLLM_ONLY="" skips this stage
VLLM_ONLY=${VLLM_ONLY-llmrl-vllm,llmrl-grpo-fast,vllm-generate,trl-grpo-vllm,trl-grpo}
if [ -n "$VLLM_ONLY" ] && "$PY" -c "import vllm" 2>/dev/null; then
  say "bench/vs_trl.py vLLM contenders on $DEVICE, $DTYPE: $VLLM_ONLY"
  timeout "${BENCH_LIMIT:-420}" "$PY" bench/vs_trl.py --device "$DEVICE" --dtype "$DTYPE" --model "$MODEL" \
    --steps "$STEPS" --reps "$REPS" --threads "$THREADS" --timeout 180 --only "$VLLM_ONLY" \
    --out "$OUT/results-vs-trl-vllm-$DEVICE-$SHAPE.json" 2>&1 | tee -a "$LOG"
elif [ -n "$VLLM_ONLY" ]; then
  say "no vLLM on this machine: the vLLM contenders ($VLLM_ONLY) were not run"
fi
# the roofline (issue 29): each phase of a GRPO step on this model as FLOP/s and % of the device's
# measured peak matmul rate, generation also against the memory-bandwidth bound; float32 and bfloat16
say "bench/roofline.py on $DEVICE: a GRPO step of $SHAPE, 8 prompts × 8 samples × 64 tokens"
timeout "${ROOFLINE_LIMIT:-300}" "$PY" bench/roofline.py --steps 3 --dtypes float32,bfloat16 \
  --set model.name="$MODEL" --set model.device="$DEVICE" --set algo=grpo --set task=chat_sum \
  --set rollout.prompts_per_step=8 --set rollout.num_generations=8 --set rollout.max_new_tokens=64 \
  --set threads="$THREADS" --out "$OUT/results-roofline-$DEVICE-$SHAPE.json" 2>&1 | tee -a "$LOG"
# the 4-bit base (issue 56): PPO with actor, critic and reference on one nf4 base against the same run on
# the $DTYPE base, 2 steps each on $DEVICE: peak device memory and s/step (summary.json), when the machine
# has bitsandbytes (its 43 MB wheel with the ~30 MiB of .gpu/ is over the 64 MiB a device call carries); NF4=0 skips it
if [ "${NF4:-1}" = 1 ] && "$PY" -c "import bitsandbytes" 2>/dev/null; then
  for Q in none nf4; do
    say "llmrl train PPO on $SHAPE, model.quantize=$Q, $DEVICE, 2 steps"
    timeout "${NF4_LIMIT:-240}" "$PY" -m llmrl train --model "$MODEL" --algo ppo --task chat_sum --steps 2 \
      --out "$OUT/run-ppo-$Q" --overwrite --set model.quantize=$Q --set model.device="$DEVICE" \
      --set model.dtype="$DTYPE" --set rollout.prompts_per_step=32 --set rollout.max_new_tokens=64 \
      --set update.minibatch_size=16 --set eval.size=0 --set checkpoint.every=0 --set threads="$THREADS" \
      > "$OUT/run-ppo-$Q.log" 2>&1
    "$PY" -c "import json, sys; s = json.load(open(sys.argv[1])); print({k: s.get(k) for k in ('steps', \
'step_time_s_mean', 'peak_device_mib', 'peak_rss_mib')})" "$OUT/run-ppo-$Q/summary.json" 2>&1 | tee -a "$LOG"
  done
else
  say "no bitsandbytes on this machine (or NF4=0): the nf4 stage was not run"
fi
say "done; results in $OUT"
