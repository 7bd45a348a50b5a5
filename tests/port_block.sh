# Sourced by the multi-process test scripts (tests/runtime/fleet_test.sh, scripts/soak.sh):
# claims a block of 200 loopback ports for this invocation and sets port_base.
#
# Blocks lie in 10000-29999, below the kernel's ephemeral range (32768 and up by default),
# where other tests' "127.0.0.1:*" listeners and every outgoing connection take theirs. Block n
# is held through an flock on $TMPDIR/deltacast-ports.<n>.lock for as long as this shell or a
# process it started lives, so scripts running side by side (ctest -j, tests/runtime/hostile_peers.py
# takes its block the same way) never share one; a block with a port already bound by
# something else is passed over. The empty lock files stay: removing one that another process
# holds would let a third claim the same block.
claim_port_block() {
  local ephemeral_low n i busy
  ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  if [ "$ephemeral_low" -lt 30000 ]; then
    echo "the kernel's ephemeral ports start at $ephemeral_low, among the tests' (10000-29999)" >&2
    return 1
  fi
  for ((i = 0; i < 100; i++)); do
    n=$(( ($$ + i) % 100 ))
    exec {port_lock_fd}>"${TMPDIR:-/tmp}/deltacast-ports.$n.lock"
    if flock -n "$port_lock_fd"; then
      busy=$(ss -Htln 2>/dev/null | awk -v lo=$((10000 + n * 200)) -v hi=$((10000 + n * 200 + 199)) \
        '{ k = split($4, a, ":"); p = a[k] + 0; if (p >= lo && p <= hi) print p }' | head -1)
      if [ -z "$busy" ]; then
        port_base=$((10000 + n * 200))
        return 0
      fi
    fi
    exec {port_lock_fd}>&-
  done
  echo "no free block of 200 loopback ports in 10000-29999" >&2
  return 1
}
