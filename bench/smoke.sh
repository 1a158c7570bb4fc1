#!/usr/bin/env bash
# Every maintained benchmark of bench/ in its smallest configuration, one after another, on random tiny
# models (no download): that each still runs end to end, not what it measures. Its files go to $OUT (a
# new temporary folder), never to bench/results/. Needs the `[bench]` extra (TRL), reasoning-gym for the
# rg_* rows, and a chat tokenizer folder TOKENIZER (default .gpu/tokenizer, which bench/gpu_prepare.sh
# saves from SmolLM2; any local chat model's folder will do). trl_ppo installs TRL 1.12.0, the last release
# with PPOTrainer, into bench/.trl-1.12 on first use (PyPI, once).
#
#   bash bench/smoke.sh                  # from the repo root; ONLY="vs_trl roofline" runs some of them
#
# Not here: gpu_check.sh (a CUDA device) and in_cgroup.sh (root, a writable memory cgroup); gpu_prepare.sh is
# gpu_table.sh's preparation (PyPI and the hub), and its output is what TOKENIZER reads by default.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
TOKENIZER=${TOKENIZER:-.gpu/tokenizer}
ONLY=${ONLY:-model vs_trl trl_ppo reward_curve roofline scaling memory_settings quantized_phases setting_runs commit_runs dtype_runs rg_screen rg_learning memory_plan gpu_table}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PATH="$(dirname "$(command -v "$PY")"):$PATH"  # rg_screen.py runs `llmrl eval`
mkdir -p "$OUT"
MODEL="$OUT/tiny-chat"
failed=0

step() {  # step NAME COMMAND...: run it (under LIMIT seconds) if NAME is in ONLY; one line: ok or FAILED, seconds
  local name=$1 t0 rc
  shift
  [[ " $ONLY " == *" $name "* ]] || return 0
  t0=$(date +%s)
  timeout "${LIMIT:-900}" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  # these scripts record a failed command in their JSON instead of exiting with it
  case $name in rg_screen|rg_learning|dtype_runs|setting_runs|memory_plan) [ $rc = 0 ] && grep -qs '"error"' "$OUT/${name//_/-}.json" && rc=1;; esac
  [ $rc = 0 ] || failed=$((failed + 1))
  echo "$name: $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)"), $(( $(date +%s) - t0 )) s  ($OUT/$name.log)"
}

cat > "$OUT/tiny.yaml" <<'YAML'
steps: 2
eval:
  size: 16
YAML
cat > "$OUT/tiny-rg.yaml" <<YAML
algo: grpo
steps: 2
model:
  name: $MODEL
rollout:
  prompts_per_step: 4
  num_generations: 4
  max_new_tokens: 8
update:
  minibatch_size: 16
rg:
  train_size: 64
  eval_size: 8
eval:
  size: 8
YAML

step model "$PY" bench/gpu_model.py build --shape tiny --tokenizer "$TOKENIZER" --out "$MODEL" --dtype float32
step vs_trl "$PY" bench/vs_trl.py --model "$MODEL" --steps 2 --reps 1 --out "$OUT/vs-trl.json"
step trl_ppo "$PY" -m bench.trl_ppo --model "$MODEL" --steps 2
step reward_curve "$PY" bench/reward_curve.py --model "$MODEL" --steps 2 --seeds 0 --parallel 1 --out "$OUT/reward-curve.json"
step roofline "$PY" bench/roofline.py --steps 2 --dtypes float32 --check --out "$OUT/roofline.json"
step scaling "$PY" bench/scaling.py --steps 2 --out "$OUT/scaling.json"
step memory_settings "$PY" bench/memory_settings.py --model "$MODEL" --steps 1 --threads 1 --only defaults,ckpt+malloc \
  --set rollout.max_new_tokens=8 --set rollout.prompts_per_step=2 --set rollout.num_generations=4 --set update.minibatch_size=4 \
  --out "$OUT/memory-settings.json"
step quantized_phases "$PY" bench/quantized_phases.py --model "$MODEL" --tokens 4 --reps 1 --threads 1 \
  --out "$OUT/quantized-phases.json"
step setting_runs "$PY" bench/setting_runs.py --recipe "$OUT/tiny.yaml" --contender keep=engine.drop_finished=false \
  --contender drop=engine.drop_finished=true --root "$OUT/setting-runs" --out "$OUT/setting-runs.json"
step commit_runs env PY="$PY" bash bench/commit_runs.sh "$OUT/commit-runs.tsv" 1 HEAD train --recipe "$OUT/tiny.yaml"
step dtype_runs "$PY" bench/dtype_runs.py --recipe "$OUT/tiny.yaml" --seeds 0 --dtypes float32,bfloat16 --root "$OUT/dtype-runs" --out "$OUT/dtype-runs.json"
step rg_screen "$PY" bench/rg_screen.py --model tiny --tasks leg_counting --size 4 --max-new-tokens 8 --out "$OUT/rg-screen.json"
step rg_learning "$PY" bench/rg_learning.py --recipe "$OUT/tiny-rg.yaml" --runs "leg_counting:0" --root "$OUT/rg-runs" --out "$OUT/rg-learning.json"
step memory_plan "$PY" bench/memory_plan.py --only tiny-ppo --root "$OUT/memory-plan" --out "$OUT/memory-plan.json"
if [[ " $ONLY " == *" gpu_table "* && "$TOKENIZER" != .gpu/tokenizer ]]; then
  echo "gpu_table: skipped (it reads .gpu/tokenizer; TOKENIZER is $TOKENIZER)"
else
  step gpu_table env INSTALL=0 CHECK=0 DEVICE=cpu SHAPE=tiny DTYPE=float32 STEPS=2 REPS=1 THREADS=1 OUT="$OUT/gpu-table" \
    PYTHON="$PY" bash bench/gpu_table.sh
fi
echo "$failed failed; logs and files in $OUT"
exit $((failed > 0))
