#!/usr/bin/env bash
# Runs one deltacast benchmark with two builds in turn (A B A B ...), each run's output kept, so
# that two commits are compared pair by pair on a machine whose speed drifts.
#   scripts/ab_runs.sh A/deltacast B/deltacast PAIRS OUT_DIR -- bench-net --size 64MB --runs 5
# writes OUT_DIR/A.1, OUT_DIR/B.1, OUT_DIR/A.2, ...: read each figure from both and take the
# median of the pairwise ratios.
set -euo pipefail
a=${1:?usage: ab_runs.sh A_BIN B_BIN PAIRS OUT_DIR -- ARGS...}
b=${2:?}
pairs=${3:?}
out=${4:?}
shift 4
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  echo "pair $i of $pairs ($(date +%T))" >&2
  "$a" "$@" >"$out/A.$i" 2>&1
  "$b" "$@" >"$out/B.$i" 2>&1
done
