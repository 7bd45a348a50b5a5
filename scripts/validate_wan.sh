#!/usr/bin/env bash
# The simulator against kernel TCP over the WAN emulator (docs/SIM.md, "Validation against real
# processes"): builds the tree with the test tools, as scripts/validate_sim.sh does, then runs
# scripts/validate_wan.py (root) with the same arguments.
#
#   origin --30 ms--- r1: relay -> 2 workers
#          --37.5 ms- r2: relay -> 2 workers     (Reno, windows a quarter of the 75 ms link's
#          --75 ms--- r3: relay -> 2 workers      bandwidth-delay product; --stripes 1 and 8)
#
# Usage: scripts/validate_wan.sh [--invocations 3] [--stripes 1,8] [--size 32MB] [--lr 4e-4]
#                              [--versions 7] [--interval-ms 12000] [--rate-mbit 25] [--build DIR]
#                              [--no-build] [--keep] [--json FILE]     (--help: every option)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build" do_build=1 args=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; args+=("$1" "$2"); shift 2 ;;
    --no-build) do_build=0; shift ;;
    -h|--help) exec python3 "$root/scripts/validate_wan.py" --help ;;
    *) args+=("$1"); shift ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "scripts/validate_wan.sh needs root (network namespaces, TUN devices)" >&2; exit 2; }
[ "$do_build" = 0 ] || bash "$root/scripts/build.sh" "$build" -DDELTACAST_TESTS=ON >/dev/null
exec python3 "$root/scripts/validate_wan.py" --build "$build" "${args[@]}"
