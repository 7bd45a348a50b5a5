#!/usr/bin/env bash
# The main job, on a fresh Debian 12 machine: set up, build, then on this machine over
# loopback, as separate processes:
#   1. generate a series of RL checkpoints (docs/MODEL.md);
#   2. run an origin, 2 regional relays and 6 workers, and publish every checkpoint as a
#      version; each worker verifies each version against the publisher's checksums, the
#      publisher prints each version's delivery time, and every worker's last version is
#      compared byte for byte with the checkpoint it came from;
#   3. print the codec benchmark table for the same series.
# Usage: scripts/demo.sh [--size 128MB] [--steps 5] [--bin PATH/TO/deltacast]
# (--bin: run that build instead of setting up and building; tests/tools/readme_test.py does)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
size=128MB
steps=5
dc=
while [ $# -gt 0 ]; do
  case $1 in
    --size) size=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) dc=$2; shift 2 ;;
    *) echo "usage: scripts/demo.sh [--size SIZE] [--steps N] [--bin PATH]" >&2; exit 2 ;;
  esac
done
if [ -z "$dc" ]; then
  bash "$root/scripts/setup.sh"
  bash "$root/scripts/build.sh" "$root/build" -DDELTACAST_TESTS=OFF
  dc="$root/build/tools/deltacast"
fi
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
versions=$((steps + 1))

echo "== 1. generating $steps training steps of a $size model"
"$dc" gen -o "$work/ckpt" --size "$size" --steps "$steps"
ckpts=("$work"/ckpt/step-*.safetensors)

echo
echo "== 2. origin -> 2 relays -> 6 workers on loopback, $versions versions"
port=$((17000 + RANDOM % 2000))
origin="tcp://127.0.0.1:$port"
relay_a="tcp://127.0.0.1:$((port + 1))"
relay_b="tcp://127.0.0.1:$((port + 2))"
"$dc" relay --id relay-a --listen "$relay_a" --parent "$origin" --log-level warn &
pids+=($!)
"$dc" relay --id relay-b --listen "$relay_b" --parent "$origin" --log-level warn &
pids+=($!)
mkdir -p "$work/out"
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then first=$relay_a second=$relay_b; else first=$relay_b second=$relay_a; fi
  # Each worker has the other relay as its fallback parent.
  "$dc" worker --id "worker-$i" --parent "$first" --parent "$second" --exit-after-version "$versions" \
    --log-level warn >"$work/worker-$i.log" 2>&1 &
  pids+=($!)
done
# The publisher keeps serving after the last version so a late worker can join below.
"$dc" publish --listen "$origin" --wait-workers 6 --wait-timeout-ms 60000 --linger-ms 120000 --log-level warn \
  "${ckpts[@]}" >"$work/publish.log" 2>&1 &
publisher=$!
pids+=($publisher)
shown=0
until grep -q "^version $versions: " "$work/publish.log" 2>/dev/null; do
  kill -0 $publisher 2>/dev/null || { cat "$work/publish.log" >&2; exit 1; }
  n=$(grep -c "^version " "$work/publish.log" || true)
  if [ "$n" -gt "$shown" ]; then grep "^version " "$work/publish.log" | sed -n "$((shown + 1)),${n}p"; shown=$n; fi
  sleep 0.2
done
grep "^version " "$work/publish.log" | sed -n "$((shown + 1)),\$p"
grep -q "did not reach" "$work/publish.log" && { cat "$work/publish.log" >&2; exit 1; }

echo
echo "== verifying"
for i in 1 2 3 4 5 6; do
  n=$(grep -c "ready, checksum" "$work/worker-$i.log" || true)
  [ "$n" = "$versions" ] || { echo "worker-$i exposed $n of $versions versions" >&2; cat "$work/worker-$i.log" >&2; exit 1; }
done
echo "   every worker verified all $versions versions against the publisher's checksums (chunk by chunk, xxh3)"
# A seventh worker joins late: it rebuilds the newest version from an anchor and writes it out.
"$dc" worker --id late --parent "$relay_a" --exit-after-version "$versions" --out-dir "$work/out" --log-level warn >"$work/late.log"
cmp -s "$work/out/late-v$versions.safetensors" "${ckpts[-1]}" || { echo "late worker's version $versions differs from the checkpoint" >&2; exit 1; }
echo "   a late worker caught up to version $versions; its copy is byte-identical to ${ckpts[-1]##*/}"
kill $publisher 2>/dev/null || true

echo
echo "== 3. codec benchmark on the same series"
"$dc" bench --runs 5 "${ckpts[@]}"
