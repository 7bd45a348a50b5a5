#!/usr/bin/env bash
# Regenerates the golden files of the current format. (The *-format1.dcd and
# anchor-signed-format2.dcd files were written by an earlier deltacast, before manifest format 3,
# and the anchor*-format3.dcd files before anchor v2 (manifest format 4); they are kept as they
# are: readers must still accept them.) Only for a deliberate format change: the golden test exists so
# that the format cannot drift silently. Usage: tests/golden/regenerate.sh path/to/deltacast
set -euo pipefail
dc=${1:?usage: regenerate.sh path/to/deltacast}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$dc" gen -q -o "$tmp" --hidden 32 --layers 1 --vocab 128 --ffn 64 --fp32-norms --steps 1 --seed 42 >/dev/null
cp "$tmp/step-000000.safetensors" "$here/base.safetensors"
cp "$tmp/step-000001.safetensors" "$here/next.safetensors"
"$dc" encode -q -j1 --chunk-size 16KiB --base-version 1 "$here/base.safetensors" "$here/next.safetensors" -o "$here/delta.dcd"
"$dc" encode -q -j1 --chunk-size 16KiB --base-version 1 --v2 "$here/base.safetensors" "$here/next.safetensors" -o "$here/delta-v2.dcd"
"$dc" encode -q -j1 --chunk-size 16KiB --version 2 "$here/next.safetensors" -o "$here/anchor.dcd"
# A signed anchor, signed with a key kept for this test only (Ed25519 signatures are
# deterministic, so the file is reproducible).
[ -e "$here/test.sign.key" ] || "$dc" keygen --sign -o "$here/test.sign.key"
"$dc" encode -q -j1 --chunk-size 16KiB --version 2 --sign-key "$here/test.sign.key" "$here/next.safetensors" -o "$here/anchor-signed.dcd"
"$dc" inspect "$here/delta.dcd" | grep checksum
# The wire's golden frames (tests/golden/wire-frames.txt), from the transport tests.
echo "wire frames: DELTACAST_WRITE_GOLDEN=1 build/tests/deltacast_transport_tests '[golden]'"
echo "codec v3 (delta-v3.dcd, chunk-v3-blocked.bin): DELTACAST_WRITE_GOLDEN=1 build/tests/deltacast_io_tests '[golden]'"
