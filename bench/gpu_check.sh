#!/usr/bin/env bash
# The GPU check, in about two minutes: tests/test_cuda.py, then a short `llmrl train` on cuda.
#
# Run it on a machine with a CUDA GPU, from the repository root, with PYTHONPATH already pointing at
# llmrl's dependencies (this checkout is put first):
#
#     bench/gpu_check.sh                 # logs in a new temporary folder (printed)
#     OUT=/some/folder bench/gpu_check.sh
#
# Every step runs under `timeout` and writes STEP.log to $OUT (else the temporary folder); the tail of
# each log is printed too. Exit status 0 only when every step passed.
set -u

LOGS="${OUT:-$(mktemp -d -t llmrl-gpu-check.XXXXXX)}"
mkdir -p "$LOGS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export COLUMNS=120
failed=0

step() {  # step NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2 start rc
  shift 2
  echo "== $name (limit ${limit}s): $(printf '%s ' "$@" | tr '\n' ' ' | cut -c1-150)"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - start ))s$([ "$rc" -eq 124 ] && echo ' (timed out)'); log: $LOGS/$name.log"
  tail -n 30 "$LOGS/$name.log"
  [ "$rc" -eq 0 ] || failed=1
}

step env 60 python3 -c "
import torch, transformers, peft, llmrl
print('llmrl', llmrl.__file__)
print('torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__, '| peft', peft.__version__)
print('cuda available:', torch.cuda.is_available(), '| devices:', torch.cuda.device_count(),
      '|', torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')
assert torch.cuda.is_available(), 'no CUDA device: tests/test_cuda.py would only skip'
"

step pytest 180 python3 -m pytest -x -q tests/test_cuda.py -rs --durations=20 -p no:cacheprovider

# the built-in tiny model (warm-started on the CPU on first use), default PPO settings, 3 steps on cuda
step train 90 python3 -m llmrl train --steps 3 --out "$LOGS/train-run" --overwrite \
  --set model.device=cuda --set checkpoint.every=1 --set eval.size=64

step train-check 30 python3 -c "
import json, math, sys
run = sys.argv[1]
s = json.load(open(run + '/summary.json'))
rows = [json.loads(line) for line in open(run + '/metrics.jsonl')]
print({k: s[k] for k in ('steps', 'eval_accuracy_before', 'eval_accuracy_after', 'reward_mean_last', 'step_time_s_mean', 'peak_device_mib')})
assert s['steps'] == 3 and len(rows) == 3, 'not 3 steps'
assert s['peak_device_mib'] and s['peak_device_mib'] > 0, 'no GPU memory used: the run was not on cuda'
assert all(math.isfinite(r['policy_loss']) and math.isfinite(r['value_loss']) and r['skipped_updates'] == 0 for r in rows), rows
" "$LOGS/train-run"

echo "== gpu_check: $([ "$failed" -eq 0 ] && echo PASSED || echo FAILED); logs in $LOGS"
exit "$failed"
