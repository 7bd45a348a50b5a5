#!/usr/bin/env bash
# Soak (docs/RELIABILITY.md, "Soak"): many signed versions from an origin through 2 relays to 4
# workers, while relays and workers are SIGKILLed and restarted at random (workers resume from
# their --out-dir), and the origin is SIGKILLed once and restarted with a new run, on a clock
# (faketime) behind the first run's start. A relay that saw only the first run keeps serving it
# (a replaying parent); a worker that joins late tries it first.
#
#   origin --- relay-1 --- w1, w2      (each worker falls back to the other relay)
#          \-- relay-2 --- w3, w4
#   origin (run A only) --- relay-old --- w5 (joins in run B; falls back to relay-1)
#
# Checked at the end:
#   - every version a worker exposed carries the checksum the trainer published for that
#     version in that run (no wrong version exposed);
#   - no worker exposed a version of the old run after its first version of the new run, and w5
#     none of the old run at all;
#   - every worker holds the newest version, its saved file byte for byte the checkpoint;
#   - the largest RSS of each kind of process, sampled every second.
# Prints a summary line for docs/RELIABILITY.md; exits 1 if a check failed.
#
# Usage: scripts/soak.sh [--versions 1000] [--size 4MB] [--kill-every-s 4] [--seed 1] [--build DIR]
#        DC=path/to/deltacast scripts/soak.sh ...   (that binary, no build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
versions=1000 size=4MB kill_every_s=4 seed=1 build="$root/build"
while [ $# -gt 0 ]; do
  case $1 in
    --versions) versions=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --kill-every-s) kill_every_s=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: scripts/soak.sh [--versions N] [--size SIZE] [--kill-every-s S] [--seed N] [--build DIR]" >&2; exit 2 ;;
  esac
done
[ "$versions" -ge 10 ] || { echo "--versions: at least 10" >&2; exit 2; }
# DC=path/to/deltacast runs that binary as it is (a copy, say, while the build folder changes).
if [ -n "${DC:-}" ]; then
  dc=$DC
else
  bash "$root/scripts/build.sh" "$build" >/dev/null
  dc="$build/tools/deltacast"
fi
work=$(mktemp -d)
declare -A pid_of cmd_of
cleanup() {
  for p in "${pid_of[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
RANDOM=$seed

# A block of loopback ports of its own (tests/port_block.sh).
source "$(dirname "$0")/../tests/port_block.sh"
claim_port_block || exit 1
ep() { echo "tcp://127.0.0.1:$((port_base + $1))"; }

per_run=20  # checkpoints per run, published in a cycle
echo "== checkpoints: 2 runs x $per_run of $size"
"$dc" gen -q -o "$work/a" --size "$size" --steps $((per_run - 1)) --seed 1 >/dev/null
"$dc" gen -q -o "$work/b" --size "$size" --steps $((per_run - 1)) --seed 2 >/dev/null
declare -A expected  # "<run letter>:<checkpoint index>" -> version checksum
for run in a b; do
  ckpts=("$work/$run"/step-*.safetensors)
  for ((i = 0; i < per_run; i++)); do
    "$dc" encode -q "${ckpts[$i]}" -o "$work/x.dcd" >/dev/null
    expected[$run:$i]=$("$dc" inspect "$work/x.dcd" | sed -n 's/.*version checksum \([0-9a-f]*\).*/\1/p')
  done
done
rm -f "$work/x.dcd"
"$dc" keygen --sign -o "$work/trainer.key" >/dev/null
trust=$(sed -n 's/.*"public_key": "\([0-9a-f]*\)".*/\1/p' "$work/trainer.key")

# start NAME command... : runs it in the background, output appended to $work/NAME.log.
start() {
  local name=$1
  shift
  cmd_of[$name]="$*"
  "$@" >>"$work/$name.log" 2>&1 &
  pid_of[$name]=$!
  disown "$!"  # killed on purpose: no job-control notices
}
restart() { start "$1" ${cmd_of[$1]}; }

versions_a=$((versions * 6 / 10))
versions_b=$((versions - versions_a))
publish() {  # publish NAME RUN_LETTER COUNT PORT [COMMAND PREFIX...]
  local name=$1 letter=$2 count=$3 port=$4
  shift 4
  local files=() ckpts=("$work/$letter"/step-*.safetensors)
  for ((v = 0; v < count; v++)); do files+=("${ckpts[$((v % per_run))]}"); done
  # The killed origin's port may take a moment to be free: try again until this one listens.
  for _ in $(seq 50); do
    start "$name" "$@" "$dc" publish --listen "$(ep "$port")" --sign-key "$work/trainer.key" --interval-ms 20 --linger-ms 100000000 "${files[@]}"
    for _ in $(seq 20); do
      grep -q "origin listening" "$work/$name.log" 2>/dev/null && return 0
      kill -0 "${pid_of[$name]}" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "${pid_of[$name]}" 2>/dev/null || true
    sleep 0.2
  done
  echo "$name never started: $(tail -3 "$work/$name.log")" >&2
  exit 1
}
published() { grep -c "published version" "$work/$1.log" 2>/dev/null || true; }
run_of() { sed -n 's/.*, run \([0-9a-f-]*\)$/\1/p' "$work/$1.log" | head -1; }

# Run B's origin runs on a clock behind run A's start (by at most clock_behind_s_max): relays and
# workers take timestamp statements that old. The origin of run B listens on another port, which
# relay-old does not know: it keeps run A.
clock_behind_s_max=600
echo "{\"limits\": {\"freshness_ms_max\": $(((clock_behind_s_max + 60) * 1000))}}" >"$work/limits.json"
start relay-1 "$dc" relay --config "$work/limits.json" --id relay-1 --listen "$(ep 1)" --parent "$(ep 0)" --parent "$(ep 4)" --trust-key "$trust"
start relay-2 "$dc" relay --config "$work/limits.json" --id relay-2 --listen "$(ep 2)" --parent "$(ep 0)" --parent "$(ep 4)" --trust-key "$trust"
start relay-old "$dc" relay --id relay-old --listen "$(ep 3)" --parent "$(ep 0)"
for w in 1 2 3 4; do
  first=$(((w - 1) / 2 + 1)) second=$((2 - (w - 1) / 2))
  start "w$w" "$dc" worker --config "$work/limits.json" --id "w$w" --parent "$(ep $first)" --parent "$(ep $second)" --trust-key "$trust" \
    --out-dir "$work/w$w" --keep-versions 2
done

# RSS of every process, every second: the largest per kind.
declare -A rss_max=([origin]=0 [relay]=0 [worker]=0)
sample_rss() {
  for name in "${!pid_of[@]}"; do
    local kb kind=${name%%-*}
    kb=$(awk '/VmRSS/ {print $2}' "/proc/${pid_of[$name]}/status" 2>/dev/null || echo 0)
    case $kind in origin*) kind=origin ;; relay) kind=relay ;; *) kind=worker ;; esac
    [ "${kb:-0}" -gt "${rss_max[$kind]}" ] && rss_max[$kind]=$kb
  done
  return 0
}

kills=0
next_kill=$((SECONDS + kill_every_s))
# Runs the chaos (and samples RSS) until `done_pred` succeeds or the deadline passes.
chaos_until() {  # chaos_until SECONDS PREDICATE...
  local deadline=$((SECONDS + $1))
  shift
  while [ $SECONDS -lt $deadline ]; do
    "$@" && return 0
    sample_rss
    if [ $SECONDS -ge $next_kill ]; then
      local victims=(relay-1 relay-2 w1 w2 w3 w4)  # not relay-old, w5 (their roles need them up)
      local v=${victims[$((RANDOM % 6))]}
      kill -9 "${pid_of[$v]}" 2>/dev/null || true
      kills=$((kills + 1))
      sleep 0.$((RANDOM % 9 + 1))
      restart "$v"
      next_kill=$((SECONDS + kill_every_s / 2 + RANDOM % (kill_every_s + 1)))
    fi
    sleep 0.5
    local p
    p=$(published "${current_origin:-origin-a}")
    # Progress: a line that redraws on a terminal, a line every 20 s in a log.
    if [ -t 2 ]; then
      printf '\r  %s: %s versions published, %s kills' "${current_origin:-origin-a}" "$p" "$kills" >&2
    elif [ $((SECONDS % 20)) = 0 ]; then
      echo "  $current_origin: $p versions published, $kills kills" >&2
    fi
  done
  return 1
}
published_all() { [ "$(published "$1")" -ge "$2" ]; }

echo "== run A: $versions_a versions, random kills every ~${kill_every_s}s"
current_origin=origin-a
run_a_started=$SECONDS
publish origin-a a "$versions_a" 0
chaos_until $((versions_a + 600)) published_all origin-a "$versions_a" || { echo; echo "run A did not publish everything" >&2; exit 1; }
echo
behind_s=$((SECONDS - run_a_started + 30))
[ $behind_s -le $clock_behind_s_max ] || behind_s=$clock_behind_s_max
faketime=()
if command -v faketime >/dev/null; then
  faketime=(env FAKETIME_DONT_FAKE_MONOTONIC=1 faketime -f "-${behind_s}s")
  echo "== origin SIGKILLed, restarted on a clock ${behind_s} s behind: run B, $versions_b versions"
else
  echo "== origin SIGKILLed, restarted (faketime is not installed: the clock is not set back): run B, $versions_b versions"
fi
kill -9 "${pid_of[origin-a]}"
unset 'pid_of[origin-a]'
current_origin=origin-b
publish origin-b b "$versions_b" 4 "${faketime[@]}"
# A worker that joins now tries relay-old first: run A's last statement is older than its
# bound by the time it comes, so it must refuse run A and fall back to relay-1.
(sleep 25; echo "{\"limits\": {\"freshness_ms_max\": $(((behind_s + 20) * 1000))}}" >"$work/w5.json") &
start w5 bash -c "sleep 26; exec \"$dc\" worker --config \"$work/w5.json\" --id w5 --parent \"$(ep 3)\" --parent \"$(ep 1)\" --trust-key $trust"
chaos_until $((versions_b + 600)) published_all origin-b "$versions_b" || { echo; echo "run B did not publish everything" >&2; exit 1; }
echo
run_a=$(sed -n 's/.*, run \([0-9a-f-]*\)$/\1/p' "$work/origin-a.log" | head -1)
run_b=$(sed -n 's/.*, run \([0-9a-f-]*\)$/\1/p' "$work/origin-b.log" | head -1)
last_b=$versions_b
echo "== every worker to version $last_b of run $run_b (no more kills)"
all_newest() {
  for w in 1 2 3 4 5; do grep -q "version $last_b ready, checksum .*, run $run_b," "$work/w$w.log" || return 1; done
}
deadline=$((SECONDS + 120))
until all_newest || [ $SECONDS -ge $deadline ]; do sample_rss; sleep 0.5; done

failed=0 wrong=0 old_after_new=0 exposed=0
for w in 1 2 3 4 5; do
  seen_b=0
  [ "$w" != 5 ] || seen_b=1  # w5 joined in run B: nothing of run A, ever
  while read -r v c r; do
    exposed=$((exposed + 1))
    i=$(((v - 1) % per_run))
    if [ "$r" = "$run_a" ]; then
      [ "$c" = "${expected[a:$i]}" ] || wrong=$((wrong + 1))
      [ $seen_b = 0 ] || old_after_new=$((old_after_new + 1))
    elif [ "$r" = "$run_b" ]; then
      [ "$c" = "${expected[b:$i]}" ] || wrong=$((wrong + 1))
      seen_b=1
    else
      wrong=$((wrong + 1))
    fi
  done < <(sed -n 's/.*version \([0-9]*\) ready, checksum \([0-9a-f]*\).*, run \([0-9a-f-]*\), process CPU.*/\1 \2 \3/p' "$work/w$w.log")
  grep -q "version $last_b ready, checksum .*, run $run_b," "$work/w$w.log" || { echo "w$w never reached version $last_b of run B"; failed=1; }
  [ "$w" != 5 ] || continue  # w5 saves nothing
  # The saved newest version is the checkpoint, byte for byte (saved just after it is exposed).
  want="${work}/b/$(printf 'step-%06d.safetensors' $(((last_b - 1) % per_run)))"
  for _ in $(seq 100); do cmp -s "$work/w$w/w$w-v$last_b.safetensors" "$want" && break; sleep 0.2; done
  cmp -s "$work/w$w/w$w-v$last_b.safetensors" "$want" || { echo "w$w's saved version $last_b differs from the checkpoint"; failed=1; }
done
[ $wrong = 0 ] || { echo "$wrong exposed versions carried a checksum the trainer never published in that run"; failed=1; }
[ $old_after_new = 0 ] || { echo "$old_after_new versions of the old run were exposed after the new run's first"; failed=1; }
behind=$(sed -n "s/.*this host's clock is \([0-9]*\) s behind the start of the previous run.*/\1/p" "$work/origin-b.log" | head -1)
[ -z "${faketime[*]}" ] || [ -n "$behind" ] || { echo "origin-b did not say its clock is behind run A's start"; failed=1; }
stale=$(grep -c "gave no timestamp statement within freshness_ms_max" "$work/w5.log" || true)
[ "$stale" -gt 0 ] || { echo "w5 did not leave relay-old for its stale statements"; failed=1; }
lost=0
for w in 1 2 3 4 5; do grep -q "version $last_b ready, checksum .*, run $run_b," "$work/w$w.log" || lost=$((lost + 1)); done
echo "soak: $((versions_a + versions_b)) versions (run A $versions_a, run B $versions_b), $kills SIGKILLs of relays and workers, 1 origin restart" \
  "(clock ${behind:-not} s behind run A's start), w5 left relay-old (run A) $stale times;" \
  "$exposed versions exposed, $wrong wrong, $old_after_new of the old run after the new one, workers missing the newest: $lost;" \
  "max RSS: origin $((rss_max[origin] / 1024)) MB, relay $((rss_max[relay] / 1024)) MB, worker $((rss_max[worker] / 1024)) MB"
exit $failed
