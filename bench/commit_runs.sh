#!/usr/bin/env bash
# The same llmrl command at two (or more) commits, alternated: whole-command seconds, user CPU seconds and
# peak RSS (GNU time) and the run's held-out accuracy line, one row a run, into OUT (TSV); a run that fails
# stops the script with its exit code and last lines.
# Each commit runs from a worktree of its own (/tmp/llmrl-commit-<hash>) through this checkout's .venv,
# so python imports that commit's llmrl; the runs share LLMRL_CACHE_DIR (the tiny model's warm start).
# usage: bash bench/commit_runs.sh OUT REPS "COMMIT1 COMMIT2 ..." llmrl-args...
#   e.g. bash bench/commit_runs.sh /tmp/default.tsv 2 "76f5d7b HEAD" train --algo ppo
set -euo pipefail
out=$1; reps=$2; commits=$3; shift 3
root=$(cd "$(dirname "$0")/.." && pwd); py=${PY:-$root/.venv/bin/python}
case $py in /*) ;; */*) py=$PWD/$py;; esac  # the runs start in their worktrees
printf 'commit\trep\twall_s\tuser_s\tmaxrss_kb\taccuracy\n' > "$out"
for rep in $(seq 1 "$reps"); do
  for c in $commits; do
    hash=$(git -C "$root" rev-parse --short "$c"); wt=/tmp/llmrl-commit-$hash
    [ -d "$wt" ] || git -C "$root" worktree add -f "$wt" "$hash" > /dev/null 2>&1
    log=$(mktemp); run=$(mktemp -d)
    rc=0; (cd "$wt" && /usr/bin/time -f "%e %U %M" -o "$log.time" "$py" -m llmrl "$@" --out "$run/run" --overwrite > "$log" 2>&1) || rc=$?
    if [ "$rc" != 0 ]; then echo "$hash: exit $rc: $(tail -2 "$log")" >&2; exit "$rc"; fi
    acc=$(grep -o 'held-out accuracy (greedy) *│ *[0-9.]* % → [0-9.]* %' "$log" | sed 's/.*│ *//' || true)
    read -r wall user rss < "$log.time"  # %M: a run since issue 68 restarts VmHWM per phase; its summary keeps the peak
    s=$("$py" -c "import json,sys; print(round(json.load(open(sys.argv[1]))['peak_rss_mib']*1024))" "$run/run/summary.json" 2>/dev/null || echo 0); [ "$s" -gt "$rss" ] && rss=$s
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$hash" "$rep" "$wall" "$user" "$rss" "$acc" | tee -a "$out"
    rm -rf "$run" "$log" "$log.time"
  done
done
