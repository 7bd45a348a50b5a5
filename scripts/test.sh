#!/usr/bin/env bash
# Every test, on a fresh Debian 12 machine: set up, then
#   1. Release build, full suite (ctest);
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build, full suite;
#   3. ThreadSanitizer build, the runtime, transport and embed tests;
#   4. libFuzzer targets built with clang, each run for FUZZ_SECONDS (default 20; the long
#      campaigns are scripts/fuzz.sh runs whose results docs/RELIABILITY.md records).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
fuzz_seconds=${FUZZ_SECONDS:-20}
echo "== setup ($(date +%T))"
bash "$root/scripts/setup.sh" --test

echo "== release build and tests ($(date +%T), setup done)"
bash "$root/scripts/build.sh" "$root/build" -DDELTACAST_TESTS=ON
(cd "$root/build" && ctest --output-on-failure -j "$(nproc)")

echo "== sanitizer build and tests ($(date +%T))"
bash "$root/scripts/build.sh" "$root/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_SANITIZE=ON -DDELTACAST_TESTS=ON
# A small quarantine: ASan's default holds 256 MiB of freed memory, which the memory bounds the
# hostile-peer tests check would read as growth. Leaks inside libzmq: tests/lsan.supp.
(cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=16 LSAN_OPTIONS="suppressions=$root/tests/lsan.supp" \
  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j "$(nproc)")

echo "== thread sanitizer build, runtime, transport and embed tests ($(date +%T))"
# Only the runtime's, transport's and embed's test binaries: their threads (the loop, the decode
# pool, readers, a worker's saver).
# Not the [load] cases: they push megabytes through ZeroMQ to measure a queue bound, and under
# ThreadSanitizer's memory interceptors that takes minutes and measures nothing (Release and
# ASan run them).
cmake -S "$root" -B "$root/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDELTACAST_TSAN=ON -DDELTACAST_TESTS=ON >/dev/null
cmake --build "$root/build-tsan" -j "$(nproc)" --target deltacast_runtime_tests deltacast_transport_tests deltacast_embed_tests
for layer in runtime transport embed; do
  TSAN_OPTIONS="halt_on_error=1 suppressions=$root/tests/tsan.supp" "$root/build-tsan/tests/deltacast_${layer}_tests" "~[load]"
done

echo "== fuzzing, ${fuzz_seconds}s per target ($(date +%T))"
bash "$root/scripts/fuzz.sh" "$fuzz_seconds"
echo "== all passed ($(date +%T))"
