#!/usr/bin/env bash
# Run a command with its memory capped by a memory cgroup of its own, as a container with that much memory
# would run it: the proof that a configuration needs no more than LIMIT (page-cache pages of memory-mapped
# checkpoints are reclaimed inside the cap; anonymous memory past it ends in the kernel's OOM killer).
#
#   sudo bash bench/in_cgroup.sh 12 llmrl train --model /tmp/qwen7b-shape ...      # LIMIT in GiB, then the command
#
# Needs root and a writable memory cgroup (v1 /sys/fs/cgroup/memory or v2 /sys/fs/cgroup with the memory
# controller). Prints, after the command: its exit status, the cgroup's peak usage (v1 max_usage_in_bytes /
# v2 memory.peak, page cache included), how often the cap was hit (v1 failcnt / v2 events "max") and the
# OOM kills inside it. llmrl itself reads the cap as the machine's memory (models/load.cgroup_memory_limit).
set -u
LIMIT_GIB=$1; shift
BYTES=$(( LIMIT_GIB * 1024 * 1024 * 1024 ))
NAME="llmrl-cap-$$"
if [ -d /sys/fs/cgroup/memory ] && [ -w /sys/fs/cgroup/memory ]; then
  CG=/sys/fs/cgroup/memory/$NAME; mkdir "$CG"
  echo "$BYTES" > "$CG/memory.limit_in_bytes"
  V=1
elif [ -w /sys/fs/cgroup/cgroup.procs ]; then
  CG=/sys/fs/cgroup/$NAME; mkdir "$CG"
  echo "$BYTES" > "$CG/memory.max"
  V=2
else
  echo "no writable memory cgroup here (needs root and cgroups v1 or v2)" >&2; exit 2
fi
( echo $BASHPID > "$CG/cgroup.procs"; exec "$@" )
RC=$?
if [ $V = 1 ]; then
  PEAK=$(cat "$CG/memory.max_usage_in_bytes"); HITS=$(cat "$CG/memory.failcnt")
  OOM=$(grep -E '^oom_kill ' "$CG/memory.oom_control" | awk '{print $2}')
else
  PEAK=$(cat "$CG/memory.peak" 2>/dev/null || echo 0); HITS=$(grep '^max ' "$CG/memory.events" | awk '{print $2}')
  OOM=$(grep '^oom_kill ' "$CG/memory.events" | awk '{print $2}')
fi
printf 'cgroup: limit %s GiB, exit %s, peak %.2f GiB (page cache included), cap hit %s times, OOM kills %s\n' \
  "$LIMIT_GIB" "$RC" "$(echo "$PEAK / 1073741824" | bc -l)" "$HITS" "${OOM:-0}"
rmdir "$CG" 2>/dev/null
exit $RC
