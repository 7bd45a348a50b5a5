#!/usr/bin/env bash
# End-to-end through the command line: gen, encode, decode (bit-exact), inspect, bench, and
# the failures a user can cause: corrupt deltas, wrong bases, missing files, bad flags.
set -uo pipefail
dc=${1:?usage: cli_test.sh path/to/deltacast [path/to/decode_rate]}
decode_rate=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
check() {  # check "description" command...
  local what=$1
  shift
  if "$@" >"$tmp/out" 2>"$tmp/err"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAILED: $what"
    cat "$tmp/out" "$tmp/err" | head -20
  fi
}
fails() {  # fails "description" "expected stderr text" command...
  local what=$1 text=$2
  shift 2
  if "$@" >"$tmp/out" 2>"$tmp/err"; then
    failed=$((failed + 1))
    echo "FAILED (exit 0): $what"
  elif ! grep -q -- "$text" "$tmp/err"; then
    failed=$((failed + 1))
    echo "FAILED (message): $what: expected '$text' in:"
    cat "$tmp/err"
  else
    passed=$((passed + 1))
  fi
}

for cmd in gen encode decode inspect bench; do
  check "$cmd --help" "$dc" "$cmd" --help
done
check "gen" "$dc" gen -q -o "$tmp/s" --hidden 64 --layers 2 --vocab 512 --ffn 192 --steps 2 --fp32-norms
check "encode delta" "$dc" encode -q --chunk-size 64KiB "$tmp/s/step-000000.safetensors" "$tmp/s/step-000001.safetensors" -o "$tmp/d1.dcd"
check "decode delta" "$dc" decode -q "$tmp/s/step-000000.safetensors" "$tmp/d1.dcd" -o "$tmp/r1.safetensors"
check "decoded file is identical" cmp "$tmp/r1.safetensors" "$tmp/s/step-000001.safetensors"
check "encode anchor" "$dc" encode -q "$tmp/s/step-000002.safetensors" -o "$tmp/a2.dcd"
check "decode anchor" "$dc" decode -q "$tmp/a2.dcd" -o "$tmp/r2.safetensors"
check "anchor decodes identical" cmp "$tmp/r2.safetensors" "$tmp/s/step-000002.safetensors"
check "encode delta, codec v3" "$dc" encode -q --chunk-size 64KiB --codec v3 "$tmp/s/step-000000.safetensors" "$tmp/s/step-000001.safetensors" -o "$tmp/d1v3.dcd"
check "decode delta, codec v3" "$dc" decode -q "$tmp/s/step-000000.safetensors" "$tmp/d1v3.dcd" -o "$tmp/r1v3.safetensors"
check "codec v3 decodes identical" cmp "$tmp/r1v3.safetensors" "$tmp/s/step-000001.safetensors"
check "inspect delta, codec v3" "$dc" inspect "$tmp/d1v3.dcd"
grep -Eq "chunks coded v1 0, v2 0, v3 [1-9]" "$tmp/out" || { failed=$((failed + 1)); echo "FAILED: inspect does not count the v3 chunks"; }
fails "an unknown codec for encode" "--codec" "$dc" encode -q --codec v9 "$tmp/s/step-000000.safetensors" "$tmp/s/step-000001.safetensors" -o "$tmp/x.dcd"
check "inspect delta" "$dc" inspect "$tmp/d1.dcd"
grep -q "changed" "$tmp/out" && grep -q "positions" "$tmp/out" || { failed=$((failed + 1)); echo "FAILED: inspect output lacks statistics"; }
check "inspect checkpoint" "$dc" inspect --tensors "$tmp/s/step-000000.safetensors"
grep -q "lm_head.weight" "$tmp/out" || { failed=$((failed + 1)); echo "FAILED: inspect lists no tensors"; }

# A corrupt delta: exit non-zero, name the problem, and leave an existing output untouched.
cp "$tmp/d1.dcd" "$tmp/bad.dcd"
size=$(stat -c %s "$tmp/bad.dcd")
printf '\x55' | dd of="$tmp/bad.dcd" bs=1 seek=$((size - 10)) conv=notrunc status=none
echo "previous" >"$tmp/keep.safetensors"
fails "corrupt delta" "hash mismatch" "$dc" decode -q "$tmp/s/step-000000.safetensors" "$tmp/bad.dcd" -o "$tmp/keep.safetensors"
check "output untouched after a failed decode" grep -q previous "$tmp/keep.safetensors"
head -c $((size / 2)) "$tmp/d1.dcd" >"$tmp/trunc.dcd"
fails "truncated delta" "truncated" "$dc" decode -q "$tmp/s/step-000000.safetensors" "$tmp/trunc.dcd" -o "$tmp/x.safetensors"
fails "wrong base" "base bytes differ" "$dc" decode -q "$tmp/s/step-000001.safetensors" "$tmp/d1.dcd" -o "$tmp/x.safetensors"
fails "delta without base" "needs its base" "$dc" decode -q "$tmp/d1.dcd" -o "$tmp/x.safetensors"
fails "not a deltacast file" "bad magic" "$dc" decode -q "$tmp/s/step-000000.safetensors" "$tmp/s/step-000001.safetensors" -o "$tmp/x.safetensors"
fails "missing input" "does not exist" "$dc" encode "$tmp/nope.safetensors" -o "$tmp/x.dcd"
fails "bad chunk size" "not a size" "$dc" encode "$tmp/s/step-000000.safetensors" -o "$tmp/x.dcd" --chunk-size lots
printf 'garbage!' >"$tmp/garbage.safetensors"
fails "garbage checkpoint" "safetensors" "$dc" encode "$tmp/garbage.safetensors" -o "$tmp/x.dcd"
fails "unknown flag" "not expected" "$dc" encode "$tmp/s/step-000000.safetensors" -o "$tmp/x.dcd" --frobnicate
test -e "$tmp/x.safetensors" && { failed=$((failed + 1)); echo "FAILED: a failed decode left an output file"; }
ls "$tmp"/*.tmp.* >/dev/null 2>&1 && { failed=$((failed + 1)); echo "FAILED: temporary files left behind"; }

check "bench on files" "$dc" bench -q --runs 1 --no-anchor "$tmp/s/step-000000.safetensors" "$tmp/s/step-000001.safetensors" "$tmp/s/step-000002.safetensors"
grep -q "deltacast v1" "$tmp/out" || { failed=$((failed + 1)); echo "FAILED: bench printed no table"; }
# End to end: the same pairs through encode_file and decode_file (each decoded file compared
# with its checkpoint), and its scratch directory removed afterwards.
check "bench end to end" env TMPDIR="$tmp" "$dc" bench -q --end-to-end --runs 1 "$tmp/s/step-000000.safetensors" "$tmp/s/step-000001.safetensors"
grep -q "^| decode | .* | \*\*[0-9.]*x\*\* |$" "$tmp/out" || { failed=$((failed + 1)); echo "FAILED: bench --end-to-end printed no decode row"; }
ls -d "$tmp"/deltacast-bench-* >/dev/null 2>&1 && { failed=$((failed + 1)); echo "FAILED: bench --end-to-end left its directory"; }
# Three checkpoints: also publish -> worker --out-dir, both worker modes (each saved file is
# compared with its checkpoint by the bench itself).
check "bench end to end, publish to a worker" env TMPDIR="$tmp" "$dc" bench -q --end-to-end --runs 1 "$tmp/s"/step-00000[012].safetensors
for mode in "" " --in-place"; do
  grep -q "^| publish -> worker --out-dir$mode | .* | \*\*[0-9.]*x\*\* |$" "$tmp/out" ||
    { failed=$((failed + 1)); echo "FAILED: bench --end-to-end printed no publish -> worker --out-dir$mode row"; }
done
ls -d "$tmp"/deltacast-bench-* >/dev/null 2>&1 && { failed=$((failed + 1)); echo "FAILED: bench --end-to-end left its directory"; }

# The validation's decode-rate probe (tests/helpers/decode_rate_main.cc): a rate, a barrier, a
# clear refusal of checkpoints that do not belong together.
if [ -n "$decode_rate" ]; then
  a="$tmp/s/step-000000.safetensors" b="$tmp/s/step-000001.safetensors"
  check "decode_rate" "$decode_rate" "$a" "$b" --seconds 0.2
  grep -Eq "^[0-9]+ bytes/s median of [0-9]+ decodes" "$tmp/out" || { failed=$((failed + 1)); echo "FAILED: decode_rate printed no rate"; }
  "$decode_rate" "$a" "$b" --seconds 0.2 --barrier "$tmp/go" >"$tmp/barrier.out" 2>&1 &
  probe=$!
  for _ in $(seq 300); do grep -q armed "$tmp/barrier.out" && break; sleep 0.1; done  # at most 30 s
  if grep -q "bytes/s" "$tmp/barrier.out" || ! grep -q armed "$tmp/barrier.out"; then
    failed=$((failed + 1))
    echo "FAILED: decode_rate did not wait, armed, for its barrier"
  fi
  touch "$tmp/go"
  wait "$probe" && grep -q "bytes/s" "$tmp/barrier.out" || { failed=$((failed + 1)); echo "FAILED: decode_rate after its barrier"; }
  check "gen, another shape" "$dc" gen -q -o "$tmp/other" --hidden 32 --layers 1 --vocab 256 --ffn 96 --steps 1
  fails "decode_rate across layouts" "differ in layout" "$decode_rate" "$a" "$tmp/other/step-000001.safetensors"
  fails "decode_rate on garbage" "safetensors" "$decode_rate" "$a" "$tmp/garbage.safetensors"
fi

# Operator traps: each a clear error before anything starts.
fails "a port out of range" "port must be 1 to 65535" "$dc" relay --id r --listen tcp://127.0.0.1:99999 --parent tcp://127.0.0.1:7100
fails "a parent port out of range" "port must be 1 to 65535" "$dc" worker --id w --parent tcp://127.0.0.1:0
fails "a node id with a path in it" "node id '../../x'" "$dc" worker --id ../../x --parent tcp://127.0.0.1:7100 --out-dir "$tmp/out"
fails "an unknown log level" "unknown log level 'bogus'" "$dc" worker --id w --parent tcp://127.0.0.1:7100 --log-level bogus
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7100"], "log_level": "loud"}' >"$tmp/level.json"
fails "an unknown log level in a config" "unknown log level 'loud'" "$dc" worker --config "$tmp/level.json"
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7100"], "limits": {"connections_maxx": 5}}' >"$tmp/limits.json"
fails "an unknown limit in a config" 'unknown limit "connections_maxx"' "$dc" worker --config "$tmp/limits.json"
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7100"], "limits": {"image_bytes_max": "lots"}}' >"$tmp/limits.json"
fails "a limit that is not a size" "image_bytes_max" "$dc" worker --config "$tmp/limits.json"
# Values that would disable a node are refused at load, with the field named.
for bad in '"message_bytes_max": 10' '"needs_per_s_max": 0' '"version_jump_max": 0' '"freshness_ms_max": 5' '"connections_max": 0'; do
  echo "{\"id\": \"r\", \"listen\": \"tcp://127.0.0.1:7199\", \"parents\": [\"tcp://127.0.0.1:7100\"], \"limits\": {$bad}}" >"$tmp/limits.json"
  field=$(echo "$bad" | cut -d'"' -f2)
  fails "a limit that disables a node ($bad)" "config \"limits\": $field: .* is outside" "$dc" relay --config "$tmp/limits.json"
done
# A key file that others can read is refused; a signing key file given as a trust key only warned about.
"$dc" keygen -o "$tmp/open.key" >/dev/null && chmod 0666 "$tmp/open.key"
fails "a CURVE key file readable by others" "other users can reach it (mode 0666): chmod 600" "$dc" worker --id w --parent tcp://127.0.0.1:7100 --keys "$tmp/open.key" --parent-key "$(sed -n 's/.*"public_key": "\([^"]*\)".*/\1/p' "$tmp/open.key")"
"$dc" keygen --sign -o "$tmp/open-sign.key" >/dev/null && chmod 0644 "$tmp/open-sign.key" && touch "$tmp/none.safetensors"
fails "a signing key file readable by others" "other users can reach it (mode 0644)" "$dc" publish --listen tcp://127.0.0.1:7198 --sign-key "$tmp/open-sign.key" "$tmp/none.safetensors"
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7100"], "timing": {"parent_timeout_ms": 300}}' >"$tmp/timing.json"
fails "a parent timeout within two heartbeats" "parent_timeout_ms (300) must be at least twice heartbeat_ms (500)" "$dc" worker --config "$tmp/timing.json"
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7100"], "timing": {"heartbeat": 100}}' >"$tmp/timing.json"
fails "an unknown timing field" 'unknown field "heartbeat"' "$dc" worker --config "$tmp/timing.json"
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7100"], "timing": {"need_after_ms": 0}}' >"$tmp/timing.json"
fails "a zero timing" "need_after_ms: 0 is outside 1 to 86400000" "$dc" worker --config "$tmp/timing.json"
# A parent timeout from the config is the one the worker keeps: nobody answers on the port, and
# the worker gives the parent up after 3 s, not the default 2 s.
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7109"], "timing": {"parent_timeout_ms": 3000, "heartbeat_ms": 500}}' >"$tmp/timing.json"
timeout -s INT 5 "$dc" worker --config "$tmp/timing.json" >"$tmp/timing.out" 2>&1 || true
if grep -E "silent for 3[0-9]{3} ms" "$tmp/timing.out" >/dev/null && ! grep -E "silent for 2[0-9]{3} ms" "$tmp/timing.out" >/dev/null; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "FAILED: a worker with timing.parent_timeout_ms 3000 gives its silent parent up after 3 s:"
  cat "$tmp/timing.out"
fi
parents17=$(python3 -c 'import json; print(json.dumps([f"tcp://127.0.0.1:{7100 + i}" for i in range(17)]))')
echo "{\"id\": \"w\", \"parents\": $parents17}" >"$tmp/parents.json"
fails "more parents than a node tries" "parents: at most 16" "$dc" worker --config "$tmp/parents.json"
echo "{\"id\": \"w\", \"trees\": [[\"tcp://127.0.0.1:7100\"], $parents17]}" >"$tmp/parents.json"
fails "more parents in a tree than a node tries" "at most 16 parents a tree" "$dc" worker --config "$tmp/parents.json"
echo '{"id": "w", "trees": [["tcp://127.0.0.1:7100"]]}' >"$tmp/parents.json"
fails "one tree of parents" "trees: 2 to 8 lists" "$dc" worker --config "$tmp/parents.json"
echo '{"id": "w", "parents": ["tcp://127.0.0.1:7100"], "trees": [["tcp://127.0.0.1:7100"], ["tcp://127.0.0.1:7101"]]}' >"$tmp/parents.json"
fails "parents and trees both" 'give "parents" or "trees", not both' "$dc" worker --config "$tmp/parents.json"
# The log goes to stderr: stdout is for reports (here: nothing but the log would print).
timeout 1 "$dc" worker --id w --parent tcp://127.0.0.1:1 >"$tmp/log.out" 2>"$tmp/log.err"
check "the log goes to stderr, not stdout" bash -c "[ ! -s '$tmp/log.out' ] && grep -q unauthenticated '$tmp/log.err'"
check "keygen" "$dc" keygen -o "$tmp/node.key"
fails "keygen over an existing key" "exists" "$dc" keygen -o "$tmp/node.key"
check "keygen --force" "$dc" keygen --force -o "$tmp/node.key"
check "keygen --sign" "$dc" keygen --sign -o "$tmp/sign.key"
check "the signing key is private" test "$(stat -c %a "$tmp/sign.key")" = 600
fails "a trust key that is neither hex nor a key file" "neither a 64-hex-digit public key nor a key file" \
  "$dc" worker --id w --parent tcp://127.0.0.1:7100 --trust-key abc
fails "a CURVE key file given as a signing key" "not a signing key file" \
  "$dc" publish --listen tcp://127.0.0.1:7199 --sign-key "$tmp/node.key" "$tmp/s/step-000000.safetensors"

# An in-place worker takes version after version, saving each: neither its saver nor the
# command's own wait holds a version between versions (an in-place update waits for readers).
"$dc" publish --listen "tcp://127.0.0.1:*" --wait-workers 1 --wait-timeout-ms 60000 --linger-ms 0 \
  "$tmp/s"/step-00000[012].safetensors >"$tmp/pub.out" 2>"$tmp/pub.err" &
pub=$!
endpoint=""
for _ in $(seq 200); do
  endpoint=$(grep -o "tcp://127.0.0.1:[0-9]*" "$tmp/pub.out" | head -1)
  [ -n "$endpoint" ] && break
  sleep 0.1
done
check "an in-place worker saving to --out-dir takes three versions" \
  timeout 90 "$dc" worker --id ip --parent "$endpoint" --in-place --out-dir "$tmp/in-place" --exit-after-version 3
check "the publisher saw each version delivered" wait "$pub"
check "the third version saved" test -f "$tmp/in-place/ip-v3.safetensors"

# publish --codec auto: per version, v2 where the WAN is the bottleneck, v1 where the workers' CPU is.
fails "an unknown codec" "--codec" "$dc" publish --listen "tcp://127.0.0.1:*" --codec v4 "$tmp/s/step-000000.safetensors"
fails "a WAN rate that is not one" "--wan-rate" \
  "$dc" publish --listen "tcp://127.0.0.1:*" --codec auto --wan-rate fast "$tmp/s/step-000000.safetensors"
check "publish --codec auto over a slow WAN" "$dc" publish --listen "tcp://127.0.0.1:*" --linger-ms 0 --chunk-size 64KiB \
  --codec auto --wan-rate 1Mbit --worker-cores 1000 "$tmp/s"/step-00000[012].safetensors
cp "$tmp/out" "$tmp/auto-slow.out"
check "a slow WAN gets v2" grep -q "^version 2: codec v2; v1: WAN .*; v2: WAN" "$tmp/auto-slow.out"
check "publish --codec auto to few cores" "$dc" publish --listen "tcp://127.0.0.1:*" --linger-ms 0 --chunk-size 64KiB \
  --codec auto --wan-rate 1Tbit --worker-cores 1 "$tmp/s"/step-00000[012].safetensors
cp "$tmp/out" "$tmp/auto-cpu.out"
check "few cores get v1" grep -q "^version 3: codec v1; .*v2 not tried" "$tmp/auto-cpu.out"

# Signed files: decode --trust-key takes only a file its key signed, whole.
check "encode --sign-key" "$dc" encode -q --chunk-size 64KiB --sign-key "$tmp/sign.key" \
  "$tmp/s/step-000000.safetensors" "$tmp/s/step-000001.safetensors" -o "$tmp/signed.dcd"
check "decode --trust-key (the key file)" "$dc" decode -q --trust-key "$tmp/sign.key" "$tmp/s/step-000000.safetensors" "$tmp/signed.dcd" -o "$tmp/rs.safetensors"
check "a signed file decodes identical" cmp "$tmp/rs.safetensors" "$tmp/s/step-000001.safetensors"
check "inspect names the signer" "$dc" inspect "$tmp/signed.dcd"
grep -q "signed by $(sed -n 's/.*"public_key": "\([0-9a-f]*\)".*/\1/p' "$tmp/sign.key")" "$tmp/out" || { failed=$((failed + 1)); echo "FAILED: inspect does not name the signer"; }
check "keygen --sign another" "$dc" keygen --sign -o "$tmp/other.key"
fails "a file signed by another key" "does not trust" \
  "$dc" decode -q --trust-key "$tmp/other.key" "$tmp/s/step-000000.safetensors" "$tmp/signed.dcd" -o "$tmp/y.safetensors"
fails "an unsigned file where a signed one is wanted" "not signed" \
  "$dc" decode -q --trust-key "$tmp/sign.key" "$tmp/s/step-000000.safetensors" "$tmp/d1.dcd" -o "$tmp/y.safetensors"
cp "$tmp/signed.dcd" "$tmp/forged.dcd"
size=$(stat -c %s "$tmp/forged.dcd")
# The signed digest catches a changed payload before any checksum is looked at.
printf '\x55' | dd of="$tmp/forged.dcd" bs=1 seek=$((size - 10)) conv=notrunc status=none
fails "a signed file with a changed payload" "does not match the digest" \
  "$dc" decode -q --trust-key "$tmp/sign.key" "$tmp/s/step-000000.safetensors" "$tmp/forged.dcd" -o "$tmp/y.safetensors"
test -e "$tmp/y.safetensors" && { failed=$((failed + 1)); echo "FAILED: a refused signed file left an output file"; }

# Multi-tree plans: the fewest trees that bring every worker to its own bound, drawn per tree.
fleet="$(dirname "$0")/../../sim/scenarios/four-regions.json"
check "plan --trees auto" "$dc" plan "$fleet" --trees auto -o "$tmp/trees"
grep -q "multi-tree plan: 2 trees" "$tmp/out" && grep -q "region us-west .*slowest worker 20 Gbit/s" "$tmp/out" ||
  { failed=$((failed + 1)); echo "FAILED: plan --trees auto did not split the four-region fleet over 2 trees at its bounds"; cat "$tmp/out"; }
for t in 0 1; do check "tree $t drawn" test -s "$tmp/trees-t$t.svg"; done
check "plan --trees 3" "$dc" plan "$fleet" --trees 3 -o "$tmp/three"
check "three trees drawn" test -s "$tmp/three-t2.dot"
fails "too many trees" "not in range 1 to 8" "$dc" plan "$fleet" --trees 9 -o "$tmp/nine"
fails "trees of a star" "multi-tree plans are relay trees" "$dc" plan "$fleet" --trees 2 --shape star -o "$tmp/star"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
