#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS (default 60), one after
# the other, from its seed corpus (tests/fuzz/corpus, read only) and a working corpus in
# build-fuzz/corpus-NAME that grows from run to run. Prints each target's executions and the
# coverage it reached; stops at the first failure with the crashing input's path.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 600 (a one-hour campaign)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
all="chunk_decoder:chunk chunk_v2:chunk_v2 chunk_v3:chunk_v3 container:container safetensors:safetensors wire:wire fleet:fleet"
# Only the fuzz targets and the libraries they link (not the simulator or the generator).
cmake -S "$root" -B "$root/build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
targets=""
for target in $all; do targets="$targets fuzz_${target%%:*}"; done
# shellcheck disable=SC2086
cmake --build "$root/build-fuzz" -j "$(nproc)" --target $targets
passed=0
for target in $all; do
  name=${target%%:*}
  corpus=${target##*:}
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
  work="$root/build-fuzz/corpus-$name"
  log="$root/build-fuzz/fuzz_$name.log"
  mkdir -p "$work"
  echo "-- fuzz_$name, ${seconds}s ($(date +%H:%M:%S))"
  (cd "$root/build-fuzz" && "$root/build-fuzz/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 "$work" "$root/tests/fuzz/corpus/$corpus" 2>"$log") \
    || { tail -60 "$log"; echo "fuzz_$name found a failure (input saved in build-fuzz/, log $log)"; exit 1; }
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -Eo "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+" "$log" | tail -1)
  echo "   ${execs:-?} executions (${rate:-?}/s), $cov"
  passed=$((passed + 1))
done
echo "fuzz: $passed passed, 0 failed"
