#!/usr/bin/env bash
# The simulator against reality (docs/SIM.md, "Validation"): real processes on loopback, every
# link shaped by the test-only shaper (tests/link_shaper/shaper.h) to DELAY one way and RATE per
# direction, then the same fleet, model sizes, decode rate and CPU per byte moved in the
# simulator, every node on one host of this machine's cores; prints the measured and predicted
# publish-to-ready times and their ratio, per round and the median.
#
#   origin --- relay-a --- worker-1, worker-2
#          \-- relay-b --- worker-3, worker-4      (every link: 20 ms, 200 Mbit/s)
#
# (--per-relay 1: one worker per relay, for a machine short of cores; see docs/SIM.md.)
#
# Usage: scripts/validate_sim.sh [--rounds 3] [--deltas 5] [--size 256MB] [--lr 1e-4]
#                              [--delay-ms 20] [--rate 200Mbit] [--per-relay 2] [--build DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 deltas=5 size=256MB lr=1e-4 delay_ms=20 rate=200Mbit per_relay=2 build="$root/build"
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --deltas) deltas=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --delay-ms) delay_ms=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --per-relay) per_relay=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: scripts/validate_sim.sh [--rounds N] [--deltas N] [--size SIZE] [--lr LR] [--delay-ms MS] [--rate RATE] [--per-relay N] [--build DIR]" >&2; exit 2 ;;
  esac
done
bash "$root/scripts/build.sh" "$build" -DDELTACAST_TESTS=ON >/dev/null
dc="$build/tools/deltacast"
shaper="$build/tests/shaper"
work=$(mktemp -d)
pids=() rate_pids=()
stop_all() {
  for p in "${pids[@]}" "${rate_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}" "${rate_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=() rate_pids=()
}
trap 'stop_all; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

echo "== model: $size, lr $lr: an anchor, a warm-up delta, then $deltas deltas measured"
"$dc" gen -o "$work/ckpt" --size "$size" --steps $((deltas + 1)) --lr "$lr" -q >/dev/null
ckpts=("$work"/ckpt/step-*.safetensors)
image_bytes=$(stat -c %s "${ckpts[0]}")
# What the simulator needs from the real data: compressed delta size, chunks, decode rate.
delta_bytes=0 chunks=0
for i in $(seq 2 $((deltas + 1))); do
  line=$("$dc" encode "${ckpts[$((i - 1))]}" "${ckpts[$i]}" -o "$work/d.dcd" -q)
  delta_bytes=$((delta_bytes + $(stat -c %s "$work/d.dcd")))
  chunks=$(echo "$line" | sed -E 's/.*: ([0-9]+) chunks.*/\1/')
done
delta_bytes=$((delta_bytes / deltas))
"$dc" encode "${ckpts[0]}" -o "$work/a.dcd" -q >/dev/null
anchor_bytes=$(stat -c %s "$work/a.dcd")
rm -f "$work/a.dcd" "$work/d.dcd"
# What each link carries in a round: the anchor, the warm-up delta and the measured ones.
link_bytes=$((anchor_bytes + (deltas + 1) * delta_bytes))
cores=$(nproc)
clk_tck=$(getconf CLK_TCK)
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
# CPU time the processes have used so far, in clock ticks.
cpu_ticks() { local p t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
med() { sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
workers=$((2 * per_relay))
printf "   image %.1f MB, delta %.1f MB compressed in %d chunks, anchor %.1f MB; %d cores\n" "$(calc "$image_bytes / 1e6")" \
  "$(calc "$delta_bytes / 1e6")" "$chunks" "$(calc "$anchor_bytes / 1e6")" "$cores"

# One core's decode rate: what one process decoding and applying a delta on one thread gets
# while every worker's process decodes too, as on this machine's shared cores
# (tests/helpers/decode_rate_main.cc: its median over 3 s; then the median over the processes),
# times the processes per busy core. A shared machine's speed drifts by 10-20% within minutes,
# so each round measures it just before and just after its fleet runs and takes the mean.
decode_rate_now() {
  local n=$1 i failed=0
  rm -f "$work/go" "$work"/rate-*
  for i in $(seq 1 "$n"); do
    "$build/tests/decode_rate" "${ckpts[$((deltas - 1))]}" "${ckpts[$deltas]}" --seconds 3 --barrier "$work/go" \
      >"$work/rate-$i.txt" 2>"$work/rate-$i.err" &
    rate_pids+=($!)
  done
  # Every copy armed (encoded, waiting), or one gone: then the barrier is not worth waiting for.
  until [ "$(cat "$work"/rate-*.txt | grep -c armed)" -ge "$n" ]; do
    for i in "${rate_pids[@]}"; do kill -0 "$i" 2>/dev/null || break 2; done
    sleep 0.05
  done
  touch "$work/go"
  for i in "${rate_pids[@]}"; do wait "$i" || failed=1; done
  rate_pids=()
  if [ "$failed" = 1 ]; then
    echo "decode_rate failed:" >&2
    cat "$work"/rate-*.err >&2
    return 1
  fi
  cat "$work"/rate-*.txt | awk '/bytes\/s/ {print $1}' | med
}
alone=$(decode_rate_now 1)
printf "   decode %.2f GB/s of image on one core, alone\n" "$(calc "$alone / 1e9")"

# The simulated twin: two regions so that each relay has its own link from the origin; every
# NIC fast, so the per-link shaping is the only limit, as through the shaper. Every node on one
# host with this machine's cores, as here (docs/SIM.md, "Host CPU"): one core's decode rate,
# and the CPU moving a byte costs. Prints the median and slowest worker's publish-to-ready time
# and the lower bound, in seconds.
simulate() {
  local core_decode_bps=$1 net_ns_per_byte=$2
  cat >"$work/scenario.json" <<EOF
{
  "name": "shaper validation: origin, 2 relays, $workers workers, $delay_ms ms / $rate links",
  "fleet": {
    "origin": {"region": "a", "uplink": "100Gbit"},
    "defaults": {
      "lan": {"latency_ms": $delay_ms, "bandwidth": "$rate"},
      "worker_nic": {"uplink": "100Gbit", "downlink": "100Gbit"},
      "relay_nic": {"uplink": "100Gbit", "downlink": "100Gbit"},
      "worker_relays": false
    },
    "regions": [{"name": "a", "workers": $per_relay, "relays": 1}, {"name": "b", "workers": $per_relay, "relays": 1}],
    "wan": [{"between": ["a", "b"], "latency_ms": $delay_ms, "bandwidth": "$rate"}]
  },
  "model": {"parameters": $((image_bytes / 2)), "delta_fraction": $(calc "$delta_bytes / $image_bytes"),
            "chunks": $chunks},
  "run": {"versions": $((deltas + 1)), "step_period_s": 30, "decode": "$(calc "$core_decode_bps / 1e6")MB/s", "settle_s": 60,
          "cpu": {"cores": $cores, "one_host": true, "net_ns_per_byte": $net_ns_per_byte}}
}
EOF
  "$dc" sim "$work/scenario.json" --seed 1 --svg "$work/sim.svg" 2>"$work/sim.log" | awk '/^cut-through relay tree/ {print $(NF-10), $(NF-8), $(NF-7)}'
}

port_base=$((10000 + RANDOM % 20000))  # below the kernel's ephemeral ports (32768 and up)
measured_max=() measured_p50=() simulated_max=() simulated_p50=() ratio_p50=() ratio_max=()
last=$((deltas + 2))
for round in $(seq 1 "$rounds"); do
  rate_before=$(decode_rate_now "$workers")
  p=$((port_base + round * 10))
  origin="127.0.0.1:$p" relay_a="127.0.0.1:$((p + 1))" relay_b="127.0.0.1:$((p + 2))"
  "$shaper" --delay-ms "$delay_ms" --rate "$rate" --map "127.0.0.1:$((p + 3))=$origin" --map "127.0.0.1:$((p + 4))=$relay_a" \
    --map "127.0.0.1:$((p + 5))=$relay_b" >"$work/shaper.log" 2>&1 &
  pids+=($!)
  shaper_pid=$! relay_pids=()
  until grep -q ready "$work/shaper.log"; do sleep 0.05; done
  via_origin="tcp://127.0.0.1:$((p + 3))" via_a="tcp://127.0.0.1:$((p + 4))" via_b="tcp://127.0.0.1:$((p + 5))"
  for r in a b; do
    listen=$relay_a
    [ "$r" = b ] && listen=$relay_b
    "$dc" relay --id "relay-$r" --listen "tcp://$listen" --parent "$via_origin" --log-level "${LOG_LEVEL:-warn}" >"$work/relay-$r.log" 2>&1 &
    pids+=($!)
    relay_pids+=($!)
  done
  for i in $(seq 1 "$workers"); do
    parent=$via_a
    [ "$i" -gt "$per_relay" ] && parent=$via_b
    "$dc" worker --id "worker-$i" --parent "$parent" --exit-after-version "$last" --log-level "${LOG_LEVEL:-warn}" >"$work/worker-$i.log" 2>&1 &
    pids+=($!)
  done
  "$dc" publish --listen "tcp://$origin" --wait-workers "$workers" --wait-timeout-ms 120000 --log-level "${LOG_LEVEL:-warn}" "${ckpts[@]}" \
    >"$work/publish.log" 2>&1 || {
    for f in "$work"/*.log; do echo "-- $f" >&2; tail -20 "$f" >&2; done
    exit 1
  }
  # The CPU moving bytes costs here: the relays only move bytes (each takes in a stream and
  # sends it to its workers), the shaper passes every link's bytes once more. The simulator
  # charges net_ns_per_byte for each byte a node sends and each it receives, so the relays' cost
  # per byte plus the shaper's spread over both ends of every link.
  relay_s=$(calc "$(cpu_ticks "${relay_pids[@]}") / $clk_tck")
  shaper_s=$(calc "$(cpu_ticks "$shaper_pid") / $clk_tck")
  net_ns=$(calc "($relay_s / (2 * (1 + $per_relay) * $link_bytes) + $shaper_s / (2 * (2 + $workers) * $link_bytes)) * 1e9")
  stop_all
  rate_after=$(decode_rate_now "$workers")
  decode_bps=$(calc "($rate_before + $rate_after) / 2")
  core_decode_bps=$(calc "$decode_bps * $workers / ($workers < $cores ? $workers : $cores)")
  read -r sim_p50 sim_max sim_bound < <(simulate "$core_decode_bps" "$net_ns") || true
  # A check on the decode rate: the CPU each worker used per measured version, by its own
  # account (the worker's "process CPU" on each version's line; median over the workers).
  worker_cpu_ms=$(for f in "$work"/worker-*.log; do
    a=$(sed -n "s/.*: version 2 ready,.*process CPU \([0-9]*\) ms.*/\1/p" "$f")
    b=$(sed -n "s/.*: version $last ready,.*process CPU \([0-9]*\) ms.*/\1/p" "$f")
    echo $(((b - a) / deltas))
  done | med)
  [ -n "$sim_bound" ] || { echo "the simulator gave no prediction:" >&2; cat "$work/sim.log" >&2; exit 1; }
  simulated_p50+=("$sim_p50")
  simulated_max+=("$sim_max")
  printf "   round %d: decode %.2f GB/s per worker with %d decoding at once (%.2f before the fleet ran, %.2f after), %.2f per core;\n" \
    "$round" "$(calc "$decode_bps / 1e9")" "$workers" "$(calc "$rate_before / 1e9")" "$(calc "$rate_after / 1e9")" "$(calc "$core_decode_bps / 1e9")"
  printf "            moving bytes %.2f ns/byte (relays %.2f s of CPU, shaper %.2f s); each worker's CPU per version %d ms (at that decode rate: %.0f ms)\n" \
    "$net_ns" "$relay_s" "$shaper_s" "$worker_cpu_ms" "$(calc "$image_bytes / $core_decode_bps * 1000")"
  printf "            simulated median %.2f s, slowest %.2f s\n" "$sim_p50" "$sim_max"
  # Publish to ready as each worker measured it. Version 1 is the anchor every worker starts
  # from (the simulated ones hold it already) and version 2 the first delta, for which each
  # worker allocates its second image: both are left out, as the steady state is compared.
  v_p50=() v_max=()
  for v in $(seq 3 "$last"); do
    times=$(sed -n "s/.*: version $v ready, [^,]*, \([0-9]*\) ms after publish.*/\1/p" "$work"/worker-*.log)
    [ "$(echo "$times" | grep -c .)" = "$workers" ] || { echo "version $v: not every worker reported it" >&2; exit 1; }
    v_p50+=("$(echo "$times" | med)")
    v_max+=("$(echo "$times" | sort -g | tail -1)")
  done
  round_p50=$(calc "$(printf "%s\n" "${v_p50[@]}" | med) / 1000")
  round_max=$(calc "$(printf "%s\n" "${v_max[@]}" | med) / 1000")
  measured_p50+=("$round_p50")
  measured_max+=("$round_max")
  ratio_p50+=("$(calc "$sim_p50 / $round_p50")")
  ratio_max+=("$(calc "$sim_max / $round_max")")
  printf "            measured versions 3-%d, median worker %s ms, slowest %s ms; medians %.2f s, %.2f s; simulated / measured %.3f, %.3f\n" \
    "$last" "$(IFS=/; echo "${v_p50[*]}")" "$(IFS=/; echo "${v_max[*]}")" "$round_p50" "$round_max" \
    "${ratio_p50[-1]}" "${ratio_max[-1]}"
done
m_p50=$(printf "%s\n" "${measured_p50[@]}" | med)
m_max=$(printf "%s\n" "${measured_max[@]}" | med)
sim_p50=$(printf "%s\n" "${simulated_p50[@]}" | med)
sim_max=$(printf "%s\n" "${simulated_max[@]}" | med)
echo
printf "%-28s %10s %10s %10s\n" "publish to ready" "measured" "simulated" "sim/meas"
printf "%-28s %9.2fs %9.2fs %10.3f\n" "median worker" "$m_p50" "$sim_p50" "$(printf "%s\n" "${ratio_p50[@]}" | med)"
printf "%-28s %9.2fs %9.2fs %10.3f\n" "slowest worker" "$m_max" "$sim_max" "$(printf "%s\n" "${ratio_max[@]}" | med)"
printf "(medians of %d rounds x %d deltas, sim/meas the median of the rounds' ratios; the simulator's lower bound: %.2f s)\n" \
  "$rounds" "$deltas" "$sim_bound"
