#!/usr/bin/env bash
# Installs the Debian 12 packages deltacast needs, only those that are missing.
# Usage: scripts/setup.sh [--test]   (--test adds what the test suite needs: clang for the fuzzers,
# torch, libtorch's headers and pytest for the Python package, iproute2 and procps for the
# emulated WAN, lintian for the Debian packages, prometheus for promtool, faketime for an origin
# whose clock is behind)
set -euo pipefail
packages=(build-essential cmake pkg-config git libzstd-dev libxxhash-dev nlohmann-json3-dev libcli11-dev
  libuv1-dev libzmq3-dev libprotobuf-dev protobuf-compiler libspdlog-dev libsodium-dev
  python3 python3-dev pybind11-dev python3-numpy)
if [ "${1:-}" = "--test" ]; then
  packages+=(catch2 clang libclang-rt-14-dev python3-zmq python3-protobuf python3-torch libtorch-dev python3-pytest iproute2 procps lintian prometheus faketime)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
fi
# The tests want only prometheus's promtool: on a host that runs systemd, the server the
# package starts is stopped and left disabled.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
