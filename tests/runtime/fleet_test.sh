#!/usr/bin/env bash
# Multi-process tests over loopback: real deltacast publish/relay/worker processes.
#   steady      origin -> 2 relays -> 4 workers, 7 versions
#   relay-kill  a relay SIGKILLed while versions stream; its workers fail over
#   late-join   a worker that starts after the last version: anchor + deltas
#   restart     a worker SIGKILLed and restarted resumes from the version it saved: deltas only
#   full-disk   a worker whose --out-dir (a tmpfs) is too small keeps serving, and saves once it
#               has room
#   corrupt     a relay that corrupts every 3rd chunk; the worker refetches, never applies
#   disk-for-one  a state dir with room for one version: each save removes the oldest first
#   corrupt-failover  a signed worker whose first parent damages every chunk leaves it
#   slow        a stopped worker does not delay its siblings, and catches up when resumed
#   auth        CURVE everywhere; a worker without an allowed key gets nothing
#   c-abi       a worker embedded through the C ABI (tests/embed/c_worker_test.c), signed
#               versions over CURVE, restarted on its state directory
#   watch       the publisher watching a directory that checkpoints appear in
#   shards      2 trainer shards publish their slices; the origin merges them
#   fleet-init  a planned fleet (relay-less region, relaying rollout hosts) run from the configs
#               deltacast fleet-init writes (CURVE on, versions signed)
#   trees       the same with 2 and then 3 trees (fleet-init --trees), a relay killed mid-stream
# Every worker's every exposed version is checked against the publisher's checksum.
# Usage: fleet_test.sh path/to/deltacast path/to/corrupting_relay path/to/c_worker_test [test...]
set -uo pipefail
usage="usage: fleet_test.sh DELTACAST CORRUPTING_RELAY C_WORKER_TEST [test...]"
dc=${1:?$usage}
crelay=${2:?$usage}
cworker=${3:?$usage}
shift 3
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(steady relay-kill late-join restart full-disk disk-for-one corrupt corrupt-failover slow auth c-abi watch shards fleet-init trees)
tmp=$(mktemp -d)
pids=()
mounts=()  # tmpfs mounted by tests, under $tmp
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  # Detached before $tmp is removed, even if a process still has a file open there.
  for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
passed=0
failed=0
versions=7  # step-000000 .. step-000006

"$dc" gen -q -o "$tmp/ckpt" --size 48MB --steps $((versions - 1)) >/dev/null || exit 1
ckpts=("$tmp"/ckpt/step-*.safetensors)
declare -A expected
for ((v = 1; v <= versions; v++)); do
  "$dc" encode -q "${ckpts[$((v - 1))]}" -o "$tmp/a.dcd" >/dev/null || exit 1
  expected[$v]=$("$dc" inspect "$tmp/a.dcd" | sed -n 's/.*version checksum \([0-9a-f]*\).*/\1/p')
done

# Ports: a block of 200 for this invocation (tests/port_block.sh), 10 per test, so tests and
# other scripts may run side by side.
source "$(dirname "$0")/../port_block.sh"
claim_port_block || exit 1
ep() { echo "tcp://127.0.0.1:$((port_base + $1))"; }

start() {  # start NAME command...  (output in $tmp/NAME.log)
  local name=$1
  shift
  "$@" >"$tmp/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_${name//-/_}=$!"
}
# wait_for FILE PATTERN SECONDS
wait_for() {
  local deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ]; do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
# Every "version N ready, checksum C" line in a worker log must carry the publisher's checksum.
check_worker() {
  local log=$1 bad=0
  while read -r v c; do
    if [ "${expected[$v]:-}" != "$c" ]; then
      echo "  $log: version $v exposed with checksum $c, publisher's is ${expected[$v]:-?}"
      bad=1
    fi
  done < <(sed -n 's/.*version \([0-9]*\) ready, checksum \([0-9a-f]*\).*/\1 \2/p' "$log")
  # Each line also says how much CPU the process has used so far, which never goes down.
  local last=0 cpu
  while read -r cpu; do
    if [ -z "$cpu" ] || [ "$cpu" -lt "$last" ]; then
      echo "  $log: process CPU missing or going down ($last ms, then '${cpu}' ms)"
      bad=1
    fi
    last=${cpu:-$last}
  done < <(grep "ready, checksum" "$log" | sed -n 's/.*, process CPU \([0-9]*\) ms$/\1/p;t;s/.*//p')
  return $bad
}
result() {  # result NAME ok?
  if [ "$2" = 0 ]; then
    passed=$((passed + 1))
    echo "PASS $1"
  else
    failed=$((failed + 1))
    echo "FAIL $1"
    for f in "$tmp"/*.log; do
      echo "--- $f"
      tail -15 "$f"
    done
  fi
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  pids=()
  rm -f "$tmp"/*.log
  port_base=$((port_base + 10))
}

test_steady() {
  local ok=0
  start relay-a "$dc" relay --id relay-a --listen "$(ep 1)" --parent "$(ep 0)"
  start relay-b "$dc" relay --id relay-b --listen "$(ep 2)" --parent "$(ep 0)"
  for i in 1 2 3 4; do
    start "w$i" "$dc" worker --id "w$i" --parent "$(ep $((1 + i % 2)))" --exit-after-version $versions
  done
  timeout 120 "$dc" publish --listen "$(ep 0)" --wait-workers 4 --wait-timeout-ms 30000 --linger-ms 500 "${ckpts[@]}" >"$tmp/origin.log" 2>&1 || ok=1
  for i in 1 2 3 4; do
    wait_for "$tmp/w$i.log" "version $versions ready" 10 || { echo "  w$i did not reach version $versions"; ok=1; }
    check_worker "$tmp/w$i.log" || ok=1
    [ "$(grep -c ready "$tmp/w$i.log")" = "$versions" ] || { echo "  w$i skipped versions"; ok=1; }
  done
  grep -c "ready on 4/4 workers" "$tmp/origin.log" | grep -q "^$versions$" || { echo "  publisher did not see every version everywhere"; ok=1; }
  result steady $ok
}

test_relay_kill() {
  local ok=0
  start relay-a "$dc" relay --id relay-a --listen "$(ep 1)" --parent "$(ep 0)"
  start relay-b "$dc" relay --id relay-b --listen "$(ep 2)" --parent "$(ep 0)"
  for i in 1 2 3 4; do
    if [ $((i % 2)) = 1 ]; then a=1 b=2; else a=2 b=1; fi
    start "w$i" "$dc" worker --id "w$i" --parent "$(ep $a)" --parent "$(ep $b)" --exit-after-version $versions
  done
  start origin "$dc" publish --listen "$(ep 0)" --interval-ms 400 --linger-ms 20000 "${ckpts[@]}"
  wait_for "$tmp/w1.log" "version 3 ready" 30 || { echo "  no version 3"; ok=1; }
  kill -9 "$pid_relay_a"
  for i in 1 2 3 4; do
    wait_for "$tmp/w$i.log" "version $versions ready" 40 || { echo "  w$i did not reach version $versions"; ok=1; }
    check_worker "$tmp/w$i.log" || ok=1
  done
  result relay-kill $ok
}

test_late_join() {
  local ok=0
  start w1 "$dc" worker --id w1 --parent "$(ep 0)"
  start origin "$dc" publish --listen "$(ep 0)" --anchor-every 3 --wait-workers 1 --wait-timeout-ms 30000 --linger-ms 30000 "${ckpts[@]}"
  wait_for "$tmp/origin.log" "version $versions: ready on 1/1" 60 || { echo "  first worker never finished"; ok=1; }
  # A relay and a worker that arrive after the last version: the relay fetches the newest
  # anchor (6, anchors every 3) from the origin and the deltas after it (7).
  start relay "$dc" relay --id relay --listen "$(ep 1)" --parent "$(ep 0)"
  start late "$dc" worker --id late --parent "$(ep 1)" --exit-after-version $versions
  wait_for "$tmp/late.log" "version $versions ready" 30 || { echo "  late joiner did not reach version $versions"; ok=1; }
  check_worker "$tmp/late.log" || ok=1
  first=$(sed -n 's/.*version \([0-9]*\) ready.*/\1/p' "$tmp/late.log" | head -1)
  [ "$first" = 6 ] || { echo "  late joiner started from version ${first:-none}, expected anchor 6"; ok=1; }
  result late-join $ok
}

test_restart() {
  local ok=0 state="$tmp/state"
  start origin "$dc" publish --listen "$(ep 0)" --interval-ms 300 --linger-ms 30000 "${ckpts[@]}"
  start w1 "$dc" worker --id w1 --parent "$(ep 0)" --out-dir "$state"
  wait_for "$tmp/w1.log" "version 3 ready" 30 || { echo "  w1 never reached version 3"; ok=1; }
  for _ in $(seq 100); do [ -f "$state/w1-v3.json" ] && break; sleep 0.1; done  # saved after it is announced
  kill -9 "$pid_w1"
  wait_for "$tmp/origin.log" "published version $versions" 60 || { echo "  the publisher did not finish"; ok=1; }
  start again "$dc" worker --id w1 --parent "$(ep 0)" --out-dir "$state" --exit-after-version $versions
  wait_for "$tmp/again.log" "version $versions ready" 30 || { echo "  the restarted worker did not reach version $versions"; ok=1; }
  check_worker "$tmp/again.log" || ok=1
  # It resumed from the newest version it had saved (3 or later), with that version's checksum,
  # and was sent only the deltas after it: the next version it exposed is the one after.
  read -r resumed sum < <(sed -n 's/.*resumed version \([0-9]*\), checksum \([0-9a-f]*\).*/\1 \2/p' "$tmp/again.log")
  if [ -z "${resumed:-}" ] || [ "$resumed" -lt 3 ]; then
    echo "  the restarted worker did not resume (resumed: ${resumed:-nothing})"
    ok=1
  else
    [ "$sum" = "${expected[$resumed]}" ] || { echo "  resumed version $resumed has checksum $sum, publisher's ${expected[$resumed]}"; ok=1; }
    first=$(sed -n 's/.*version \([0-9]*\) ready.*/\1/p' "$tmp/again.log" | head -1)
    [ "$resumed" = "$versions" ] || [ "$first" = $((resumed + 1)) ] || { echo "  after resuming $resumed it exposed ${first:-nothing} first"; ok=1; }
  fi
  for _ in $(seq 100); do kill -0 "$pid_again" 2>/dev/null || break; sleep 0.1; done
  cmp -s "$state/w1-v$versions.safetensors" "${ckpts[$((versions - 1))]}" || { echo "  the saved version $versions differs from its checkpoint"; ok=1; }
  [ "$(ls "$state"/w1-v*.safetensors | wc -l)" = 2 ] || { echo "  kept $(ls "$state"/w1-v*.safetensors | wc -l) versions, not 2"; ok=1; }
  rm -rf "$state"
  result restart $ok
}

test_full_disk() {
  local ok=0 disk="$tmp/disk" left
  mkdir -p "$disk"
  # A 1 MB tmpfs: no version (48 MB) fits. Needs root, as the whole suite does.
  if ! mount -t tmpfs -o size=1m tmpfs "$disk" 2>"$tmp/mount.err"; then
    echo "  cannot mount a tmpfs on $disk (this test needs root): $(cat "$tmp/mount.err")"
    result full-disk 1
    return
  fi
  mounts+=("$disk")
  start origin "$dc" publish --listen "$(ep 0)" --interval-ms 300 --linger-ms 30000 "${ckpts[@]}"
  start w1 "$dc" worker --id w1 --parent "$(ep 0)" --out-dir "$disk"
  wait_for "$tmp/w1.log" "cannot save version .*No space left" 30 || { echo "  no save error logged"; ok=1; }
  wait_for "$tmp/w1.log" "version 2 ready" 30 || { echo "  the worker stopped reporting versions"; ok=1; }
  kill -0 "$pid_w1" 2>/dev/null || { echo "  the worker exited on a full disk"; ok=1; }
  # A failing save holds its temporary file for a moment; one left behind stays.
  for _ in 1 2 3 4 5; do
    left=$(ls "$disk")
    [ -z "$left" ] && break
    sleep 0.05
  done
  [ -z "$left" ] || { echo "  files left on the full disk: $left"; ok=1; }
  # Room again: the newest version is saved (at the next version, or the retry 5 s later).
  mount -o remount,size=256m "$disk" || ok=1
  wait_for "$tmp/w1.log" "saving works again" 15 || { echo "  saving did not resume"; ok=1; }
  wait_for "$tmp/w1.log" "version $versions ready" 30 || { echo "  w1 did not reach version $versions"; ok=1; }
  for _ in $(seq 100); do [ -f "$disk/w1-v$versions.json" ] && break; sleep 0.1; done  # saved after it is announced
  cmp -s "$disk/w1-v$versions.safetensors" "${ckpts[$((versions - 1))]}" || { echo "  version $versions not saved once there was room"; ok=1; }
  check_worker "$tmp/w1.log" || ok=1
  left=$(cd "$disk" && ls -- *.tmp.* 2>/dev/null)
  [ -z "$left" ] || { echo "  temporary files left: $left"; ok=1; }
  umount -l "$disk" && mounts=()
  result full-disk $ok
}

test_disk_for_one() {
  local ok=0 disk="$tmp/disk1" size
  mkdir -p "$disk"
  size=$(stat -c %s "${ckpts[0]}")
  # Room for one version and its record, not two: each save makes room by removing the oldest.
  if ! mount -t tmpfs -o size=$((size + size / 4)) tmpfs "$disk" 2>"$tmp/mount.err"; then
    echo "  cannot mount a tmpfs on $disk (this test needs root): $(cat "$tmp/mount.err")"
    result disk-for-one 1
    return
  fi
  mounts+=("$disk")
  start w1 "$dc" worker --id w1 --parent "$(ep 0)" --out-dir "$disk" --metrics "127.0.0.1:$((port_base + 1))"
  start origin "$dc" publish --listen "$(ep 0)" --interval-ms 500 --linger-ms 30000 "${ckpts[@]}"
  wait_for "$tmp/w1.log" "version $versions ready" 60 || { echo "  w1 did not reach version $versions"; ok=1; }
  for _ in $(seq 100); do [ -f "$disk/w1-v$versions.json" ] && break; sleep 0.1; done
  cmp -s "$disk/w1-v$versions.safetensors" "${ckpts[$((versions - 1))]}" || { echo "  version $versions was not saved: $(ls "$disk")"; ok=1; }
  grep -q "removing the oldest saved version" "$tmp/w1.log" || { echo "  no room was made"; ok=1; }
  check_worker "$tmp/w1.log" || ok=1
  umount -l "$disk" && mounts=()
  result disk-for-one $ok
}

test_corrupt() {
  local ok=0
  start relay "$crelay" bad-relay "$(ep 1)" "$(ep 0)" 3
  start w1 "$dc" worker --id w1 --parent "$(ep 1)" --exit-after-version $versions
  timeout 120 "$dc" publish --listen "$(ep 0)" --wait-workers 1 --wait-timeout-ms 30000 --linger-ms 1000 "${ckpts[@]}" >"$tmp/origin.log" 2>&1 || ok=1
  wait_for "$tmp/w1.log" "version $versions ready" 10 || { echo "  w1 did not reach version $versions"; ok=1; }
  check_worker "$tmp/w1.log" || ok=1
  grep -q "corrupted chunk" "$tmp/relay.log" || { echo "  the relay corrupted nothing"; ok=1; }
  grep -q "payload hash mismatch" "$tmp/origin.log" || { echo "  the ledger shows no rejected chunk"; ok=1; }
  result corrupt $ok
}

test_corrupt_failover() {
  local ok=0 pub
  # A relay that damages every chunk of signed versions: the worker must leave it for its
  # second parent after corrupt_chunks_per_parent_max failures, not ask it again without end.
  "$dc" keygen --sign -o "$tmp/cf-sign.key" >/dev/null
  pub=$(sed -n 's/.*"public_key": "\([0-9a-f]*\)".*/\1/p' "$tmp/cf-sign.key")
  start origin "$dc" publish --listen "$(ep 0)" --sign-key "$tmp/cf-sign.key" --linger-ms 60000 "${ckpts[@]}"
  start relay "$crelay" bad-relay "$(ep 1)" "$(ep 0)" 1
  start w1 "$dc" worker --id w1 --trust-key "$pub" --parent "$(ep 1)" --parent "$(ep 0)" --exit-after-version $versions
  wait_for "$tmp/w1.log" "version $versions ready" 60 || { echo "  w1 did not reach version $versions"; ok=1; }
  grep -q "failed their checksums or digests (corrupt_chunks_per_parent_max)" "$tmp/w1.log" || { echo "  w1 did not say why it left the relay"; ok=1; }
  check_worker "$tmp/w1.log" || ok=1
  result corrupt-failover $ok
}

test_slow() {
  local ok=0
  start relay "$dc" relay --id relay --listen "$(ep 1)" --parent "$(ep 0)" --queue-size 1MB
  for i in 1 2 3; do start "w$i" "$dc" worker --id "w$i" --parent "$(ep 1)" --exit-after-version $versions; done
  # The publisher waits for two workers per version: the third is stopped after version 1.
  start origin "$dc" publish --listen "$(ep 0)" --wait-workers 2 --wait-timeout-ms 30000 --linger-ms 30000 "${ckpts[@]}"
  wait_for "$tmp/w3.log" "version 1 ready" 30 || { echo "  w3 never started"; ok=1; }
  kill -STOP "$pid_w3"
  wait_for "$tmp/origin.log" "version $versions: ready" 60 || { echo "  siblings stalled"; ok=1; }
  # Siblings' delivery stayed fast while w3 was frozen. Version 1 is left out: it is the
  # first anchor, sent while all three workers start, before w3 is stopped.
  worst=$(sed -n 's/^version \([0-9]*\): ready.*slowest \([0-9]*\) ms.*/\1 \2/p' "$tmp/origin.log" |
    awk '$1 > 1 { print $2 }' | sort -n | tail -1)
  [ "${worst:-99999}" -lt 3000 ] || { echo "  a sibling took ${worst:-?} ms"; ok=1; }
  kill -CONT "$pid_w3"
  wait_for "$tmp/w3.log" "version $versions ready" 40 || { echo "  w3 did not catch up"; ok=1; }
  for i in 1 2 3; do check_worker "$tmp/w$i.log" || ok=1; done
  result slow $ok
}

test_auth() {
  local ok=0
  for n in origin relay good bad; do "$dc" keygen -o "$tmp/$n.key" >"$tmp/$n.pub" || ok=1; done
  pub() { cat "$tmp/$1.pub"; }
  start relay "$dc" relay --id relay --listen "$(ep 1)" --parent "$(ep 0)" --keys "$tmp/relay.key" \
    --parent-key "$(pub origin)" --allow-key "$(pub good)"
  start good "$dc" worker --id good --parent "$(ep 1)" --keys "$tmp/good.key" --parent-key "$(pub relay)" --exit-after-version $versions
  start bad "$dc" worker --id bad --parent "$(ep 1)" --keys "$tmp/bad.key" --parent-key "$(pub relay)"
  start plain "$dc" worker --id plain --parent "$(ep 1)"
  timeout 120 "$dc" publish --listen "$(ep 0)" --keys "$tmp/origin.key" --allow-key "$(pub relay)" --wait-workers 1 \
    --wait-timeout-ms 30000 --linger-ms 1500 "${ckpts[@]}" >"$tmp/origin.log" 2>&1 || ok=1
  wait_for "$tmp/good.log" "version $versions ready" 10 || { echo "  the allowed worker got nothing"; ok=1; }
  check_worker "$tmp/good.log" || ok=1
  if grep -q "ready" "$tmp/bad.log" "$tmp/plain.log"; then echo "  a worker without an allowed key got a version"; ok=1; fi
  grep -q "refused a peer whose key" "$tmp/relay.log" || { echo "  the relay did not log the refusal"; ok=1; }
  result auth $ok
}

test_c_abi() {
  local ok=0
  # Signed versions over CURVE links, as a secured fleet runs.
  "$dc" keygen --sign -o "$tmp/c-sign.key" >"$tmp/c-sign.pub" || ok=1
  for n in c-origin c-worker c-config; do "$dc" keygen -o "$tmp/$n.key" >"$tmp/$n.pub" || ok=1; done
  start origin "$dc" publish --listen "$(ep 0)" --linger-ms 30000 --sign-key "$tmp/c-sign.key" --keys "$tmp/c-origin.key" \
    --allow-key "$(cat "$tmp/c-worker.pub")" --allow-key "$(cat "$tmp/c-config.pub")" "${ckpts[@]}"
  # A multi-tree worker's config, as fleet-init writes one: key files, trust key file, trees.
  local origin_pub; origin_pub=$(cat "$tmp/c-origin.pub")
  cat >"$tmp/c-config.json" <<EOF
{"id": "c-config", "keys": "$tmp/c-config.key", "trust_keys": ["$tmp/c-sign.key"],
 "trees": [["$(ep 0)"], ["$(ep 0)"]], "tree_parent_keys": [["$origin_pub"], ["$origin_pub"]]}
EOF
  DC_CONFIG="$tmp/c-config.json" DC_TRUST_KEY=$(cat "$tmp/c-sign.pub") DC_PARENT_KEY=$(cat "$tmp/c-origin.pub") DC_CURVE_PUBLIC=$(cat "$tmp/c-worker.pub") \
    DC_CURVE_SECRET=$(sed -n 's/.*"secret_key": "\([^"]*\)".*/\1/p' "$tmp/c-worker.key") \
    timeout 90 "$cworker" "$(ep 0)" $versions "${expected[$versions]}" "$tmp/cstate" >"$tmp/c.log" 2>&1 || ok=1
  grep -q "checksum.*: ok" "$tmp/c.log" || ok=1
  grep -q "a worker trusting another key holds nothing: ok" "$tmp/c.log" || { echo "  a C worker took versions its key did not sign"; ok=1; }
  grep -q "restarted: holds version $versions once its parent vouched for the run: ok" "$tmp/c.log" || { echo "  the C worker did not resume from its state dir"; ok=1; }
  grep -q "over two trees: ok" "$tmp/c.log" || { echo "  a C worker over two trees did not get the version"; ok=1; }
  grep -q "from its config file alone: ok" "$tmp/c.log" || { echo "  a C worker from a config file did not get the version"; ok=1; }
  rm -rf "$tmp/cstate"
  result c-abi $ok
}

test_watch() {
  local ok=0
  mkdir -p "$tmp/watched"
  start w1 "$dc" worker --id w1 --parent "$(ep 0)" --exit-after-version 3
  start origin "$dc" publish --listen "$(ep 0)" --watch "$tmp/watched" --linger-ms 60000
  for i in 0 1 2; do
    # Written under another name and renamed into place, as a trainer's checkpoint writer does.
    cp "${ckpts[$i]}" "$tmp/watched/.partial"
    mv "$tmp/watched/.partial" "$tmp/watched/step-$i.safetensors"
    wait_for "$tmp/w1.log" "version $((i + 1)) ready" 30 || { echo "  version $((i + 1)) never arrived"; ok=1; }
  done
  check_worker "$tmp/w1.log" || ok=1
  rm -rf "$tmp/watched"
  result watch $ok
}

# The data section of a safetensors file (after its 8-byte length and JSON header).
data_of() {
  local n
  n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  tail -c +$((9 + n)) "$1"
}

test_shards() {
  local ok=0
  "$dc" gen -q -o "$tmp/sharded" --size 16MB --steps 3 --shards 2 >/dev/null || ok=1
  start relay "$dc" relay --id relay --listen "$(ep 1)" --parent "$(ep 0)"
  start w1 "$dc" worker --id w1 --parent "$(ep 1)" --exit-after-version 4 --out-dir "$tmp"
  start origin "$dc" publish --listen "$(ep 0)" --expect-shards 2 --wait-workers 1
  start t0 "$dc" publish --shard 0/2 --parent "$(ep 0)" --linger-ms 20000 "$tmp"/sharded/step-*.shard-0-of-2.safetensors
  start t1 "$dc" publish --shard 1/2 --parent "$(ep 0)" --linger-ms 20000 "$tmp"/sharded/step-*.shard-1-of-2.safetensors
  wait_for "$tmp/w1.log" "version 4 ready" 60 || { echo "  the merged version 4 never arrived"; ok=1; }
  # The worker exits once it has written version 4 (--exit-after-version).
  for _ in $(seq 100); do kill -0 "$pid_w1" 2>/dev/null || break; sleep 0.1; done
  # The worker's version 4 is the two shards' step 3 back to back.
  if ! cmp -s <(data_of "$tmp/w1-v4.safetensors") <(cat <(data_of "$tmp/sharded/step-000003.shard-0-of-2.safetensors") \
      <(data_of "$tmp/sharded/step-000003.shard-1-of-2.safetensors")); then
    echo "  merged version differs from the shards' checkpoints"
    ok=1
  fi
  grep -q "merged version 4 from 2 shards" "$tmp/origin.log" || { echo "  the origin did not report the merge"; ok=1; }
  rm -rf "$tmp/sharded" "$tmp"/w1-v*.safetensors
  result shards $ok
}

# A fleet description: region a with the origin, RELAYS relays and 3 rollout hosts; region b
# with 2 rollout hosts and no relay.
two_region_fleet() {
  cat <<EOF
{"origin": {"region": "a", "uplink": "100Gbit"}, "fanout_max": 2,
 "defaults": {"lan": {"latency_ms": 0.1, "bandwidth": "25Gbit"}, "worker_nic": {"uplink": "25Gbit", "downlink": "25Gbit"},
              "relay_nic": {"uplink": "100Gbit", "downlink": "100Gbit"}},
 "regions": [{"name": "a", "workers": 3, "relays": $1}, {"name": "b", "workers": 2, "relays": 0}],
 "wan": [{"between": ["a", "b"], "latency_ms": 30, "bandwidth": "10Gbit"}]}
EOF
}

test_fleet_init() {
  local ok=0
  # Region a: a relay feeding two hosts, one of which relays to the third; region b: no relay,
  # its first host relays. Written with a relative path: the configs must work from anywhere.
  two_region_fleet 1 >"$tmp/fleet.json"
  (cd "$tmp" && "$dc" fleet-init -o fleet --fleet fleet.json --local-ports "$port_base" >/dev/null) || ok=1
  grep -q '"keys"' "$tmp/fleet/a.w0.json" && grep -q '"allow_keys"' "$tmp/fleet/a.relay-0.json" || { echo "  configs without CURVE"; ok=1; }
  grep -q '"trust_keys"' "$tmp/fleet/a.w0.json" && grep -q '"trust_keys"' "$tmp/fleet/a.relay-0.json" &&
    grep -q '"sign_key"' "$tmp/fleet/origin.json" || { echo "  configs without signed versions"; ok=1; }
  grep -q "\"$tmp/fleet/a.w0.key\"" "$tmp/fleet/a.w0.json" || { echo "  key paths are not absolute"; ok=1; }
  [ "$(stat -c %a "$tmp/fleet/origin.key")" = 600 ] && [ "$(stat -c %a "$tmp/fleet/origin.sign.key")" = 600 ] ||
    { echo "  key file readable by others"; ok=1; }
  local relaying
  relaying=$(grep -l '"relay": true' "$tmp"/fleet/?.w*.json | wc -l)
  [ "$relaying" -ge 2 ] || { echo "  expected rollout hosts that relay in the plan, got $relaying"; ok=1; }
  start a-relay-0 "$dc" relay --config "$tmp/fleet/a.relay-0.json"
  local workers=(a.w0 a.w1 a.w2 b.w0 b.w1) w log
  # Rollout hosts that relay stay up: their children still fetch from them.
  for w in "${workers[@]}"; do start "${w//./-}" "$dc" worker --config "$tmp/fleet/$w.json"; done
  timeout 120 "$dc" publish --config "$tmp/fleet/origin.json" --wait-workers 5 --wait-timeout-ms 30000 --linger-ms 500 "${ckpts[@]}" \
    >"$tmp/origin.log" 2>&1 || ok=1
  for w in "${workers[@]}"; do
    log="$tmp/${w//./-}.log"
    wait_for "$log" "version $versions ready" 10 || { echo "  $w did not reach version $versions"; ok=1; }
    check_worker "$log" || ok=1
    ! grep -q "unauthenticated" "$log" || { echo "  $w runs unauthenticated"; ok=1; }
  done
  rm -rf "$tmp/fleet" "$tmp/fleet.json"
  result fleet-init $ok
}

# A multi-tree fleet from fleet-init --trees N: every chunk comes down its tree, and a relay
# SIGKILLed while versions stream costs its trees' links a failover, nothing else.
test_trees() {
  local n ok w log
  for n in 2 3; do
    ok=0
    two_region_fleet 2 >"$tmp/fleet.json"
    "$dc" fleet-init -o "$tmp/fleet" --fleet "$tmp/fleet.json" --trees $n --local-ports "$port_base" >"$tmp/init.out" || ok=1
    grep -q "the $n trees" "$tmp/init.out" || { echo "  fleet-init did not plan $n trees"; ok=1; }
    [ "$(python3 -c "import json; print(len(json.load(open('$tmp/fleet/b.w1.json'))['trees']))")" = $n ] ||
      { echo "  b.w1's config has no $n trees"; ok=1; }
    start a-relay-0 "$dc" relay --config "$tmp/fleet/a.relay-0.json"
    start a-relay-1 "$dc" relay --config "$tmp/fleet/a.relay-1.json"
    local workers=(a.w0 a.w1 a.w2 b.w0 b.w1)
    for w in "${workers[@]}"; do start "${w//./-}" "$dc" worker --config "$tmp/fleet/$w.json"; done
    start origin "$dc" publish --config "$tmp/fleet/origin.json" --interval-ms 400 --linger-ms 20000 "${ckpts[@]}"
    wait_for "$tmp/a-w0.log" "version 3 ready" 30 || { echo "  no version 3"; ok=1; }
    kill -9 "$pid_a_relay_1"
    for w in "${workers[@]}"; do
      log="$tmp/${w//./-}.log"
      wait_for "$log" "version $versions ready" 40 || { echo "  $w did not reach version $versions ($n trees)"; ok=1; }
      check_worker "$log" || ok=1
    done
    rm -rf "$tmp/fleet" "$tmp/fleet.json" "$tmp/init.out"
    result "trees-$n" $ok
  done
}

for t in "${tests[@]}"; do
  "test_${t//-/_}"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
