#!/usr/bin/env bash
# Every test, on a fresh Debian 12 machine: set up, then
#   1. Release build, full suite (ctest);
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build, full suite;
#   3. ThreadSanitizer build, the runtime and transport tests;
#   4. libFuzzer targets built with clang, each run for FUZZ_SECONDS (default 60).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_seconds=${FUZZ_SECONDS:-60}
bash "$root/tools/setup.sh" --test

echo "== release build and tests"
bash "$root/tools/build.sh" "$root/build" -DDELTACAST_TESTS=ON
(cd "$root/build" && ctest --output-on-failure -j "$(nproc)")

echo "== sanitizer build and tests"
bash "$root/tools/build.sh" "$root/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_SANITIZE=ON -DDELTACAST_TESTS=ON
(cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$(nproc)")

echo "== thread sanitizer build, runtime and transport tests"
# Only the test binary: the runtime's and transport's threads (the loop, the decode pool, readers).
cmake -S "$root" -B "$root/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_TSAN=ON -DDELTACAST_TESTS=ON >/dev/null
cmake --build "$root/build-tsan" -j "$(nproc)" --target deltacast_tests
TSAN_OPTIONS="halt_on_error=1 suppressions=$root/tests/tsan.supp" "$root/build-tsan/tests/deltacast_tests" "[runtime],[transport]"

echo "== fuzzing, ${fuzz_seconds}s per target"
bash "$root/tools/build.sh" "$root/build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
fuzz_passed=0
for target in chunk_decoder:chunk chunk_v2:chunk_v2 container:container safetensors:safetensors wire:wire fleet:fleet; do
  name=${target%%:*}
  corpus=${target##*:}
  work="$root/build-fuzz/corpus-$name"
  mkdir -p "$work"
  echo "-- fuzz_$name"
  "$root/build-fuzz/tests/fuzz/fuzz_$name" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 "$work" "$root/tests/fuzz/corpus/$corpus" 2>"$root/build-fuzz/fuzz_$name.log" \
    || { tail -60 "$root/build-fuzz/fuzz_$name.log"; echo "fuzz_$name found a failure"; exit 1; }
  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$root/build-fuzz/fuzz_$name.log" | tail -2
  fuzz_passed=$((fuzz_passed + 1))
done
echo "fuzz: $fuzz_passed passed, 0 failed"
