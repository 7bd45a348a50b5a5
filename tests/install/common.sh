# Sourced by install_test.sh and package_test.sh: the build folder ($1), a temporary folder
# removed at exit with the processes started into $pids, fail, and a free loopback endpoint.
# Under pipefail, a pipeline ends in `grep PATTERN >/dev/null`, not `grep -q`: grep -q stops
# reading at the first match, and the writer's SIGPIPE would fail the pipeline.
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "/tmp/dc-$(basename "$0" .sh).XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
free_endpoint() { echo "tcp://127.0.0.1:$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"; }
