#!/usr/bin/env bash
# The main job, on a fresh Debian 12 machine: set up, build, generate a series of RL
# checkpoints, encode every step as a delta, decode and verify each bit-exact, print the
# benchmark table. Usage: tools/demo.sh [--size 256MB] [--steps 4]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
size=128MB
steps=4
while [ $# -gt 0 ]; do
  case $1 in
    --size) size=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: tools/demo.sh [--size SIZE] [--steps N]" >&2; exit 2 ;;
  esac
done
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh" "$root/build" -DDELTACAST_TESTS=OFF
dc="$root/build/tools/deltacast"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== generating $steps training steps of a $size model"
"$dc" gen -o "$work/ckpt" --size "$size" --steps "$steps"
echo
echo "== encoding, decoding and verifying every step"
for ((t = 1; t <= steps; t++)); do
  base=$(printf '%s/ckpt/step-%06d.safetensors' "$work" $((t - 1)))
  next=$(printf '%s/ckpt/step-%06d.safetensors' "$work" "$t")
  "$dc" encode -q --base-version $((t - 1)) "$base" "$next" -o "$work/delta-$t.dcd"
  "$dc" decode -q "$base" "$work/delta-$t.dcd" -o "$work/restored-$t.safetensors"
  cmp -s "$next" "$work/restored-$t.safetensors" || { echo "step $t: restored checkpoint differs" >&2; exit 1; }
  echo "   step $t: restored checkpoint is byte-identical"
done
echo
"$dc" inspect "$work/delta-$steps.dcd"
echo
echo "== benchmark on the same series"
files=()
for ((t = 0; t <= steps; t++)); do files+=("$(printf '%s/ckpt/step-%06d.safetensors' "$work" "$t")"); done
"$dc" bench --runs 5 "${files[@]}"
