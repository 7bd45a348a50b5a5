#!/usr/bin/env bash
# cmake --install into a temporary prefix, then use what it installed and nothing of the build:
#   - the files are there: deltacast, libdeltacast.so.0 (SONAME), headers, deltacast.pc, the
#     CMake package, the Python package, the systemd units, the docs;
#   - libdeltacast exports the C ABI and the installed headers' API and hides the rest (the
#     runtime's internals, the Protobuf code);
#   - a C program built with `pkg-config --cflags --libs deltacast` and a C++ program built with
#     find_package(deltacast) each take a version from a relay on loopback (the installed
#     deltacast's publish and relay), with the publisher's checksum;
#   - the installed Python package imports from the prefix;
#   - systemd-analyze verify passes on the units, where systemd is installed.
# Usage: install_test.sh BUILD_DIR
source "$(dirname "$0")/common.sh"
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }

libdir=$(dirname "$(find "$prefix" -name libdeltacast.so.0 | head -1)")
[ -n "$libdir" ] && [ -d "$libdir" ] || fail "no libdeltacast.so.0 under $prefix"
for f in "$prefix/bin/deltacast" "$libdir/libdeltacast.so" "$prefix/include/deltacast/c/worker.h" \
         "$prefix/include/deltacast/embed/worker.h" "$libdir/pkgconfig/deltacast.pc" "$libdir/cmake/deltacast/deltacastConfig.cmake" \
         "$prefix/lib/systemd/system/deltacast-relay@.service" "$prefix/lib/systemd/system/deltacast-worker@.service" \
         "$prefix/lib/sysusers.d/deltacast.conf" "$prefix/share/doc/deltacast/RUNTIME.md" \
         "$prefix/share/deltacast/monitoring/deltacast-dashboard.json" "$prefix/share/deltacast/monitoring/deltacast-alerts.yml"; do
  [ -e "$f" ] || fail "not installed: ${f#$prefix/}"
done
soname=$(objdump -p "$libdir/libdeltacast.so.0" | awk '/SONAME/ {print $2}')
[ "$soname" = libdeltacast.so.0 ] || fail "SONAME is '$soname', not libdeltacast.so.0"
echo "installed: bin, ${libdir#$prefix/}/libdeltacast.so.0 (SONAME $soname), headers, deltacast.pc, CMake package, units, docs"

# Exported: the C ABI and the public classes; hidden: internals and the Protobuf messages.
nm -D -C --defined-only "$libdir/libdeltacast.so.0" >"$tmp/symbols"
for want in dc_worker_start dc_library_version "deltacast::embed::Worker::start" "deltacast::embed::Publisher::" \
            "deltacast::transport::NodeHost::" "deltacast::embed::load_node_config"; do
  grep -qF "$want" "$tmp/symbols" || fail "libdeltacast does not export $want"
done
for hidden in "ChildServer" "Reconstructor" "deltacast::wire::"; do
  if grep -qF "$hidden" "$tmp/symbols"; then fail "libdeltacast exports $hidden (internal)"; fi
done
echo "exports: $(wc -l <"$tmp/symbols") symbols, the C ABI and the installed headers' API; internals hidden"

# A fleet of the installed binary: an origin and a relay on loopback.
dc=$prefix/bin/deltacast
"$dc" gen -q -o "$tmp/ckpt" --hidden 64 --layers 2 --vocab 512 --ffn 192 --steps 3 >/dev/null
origin=$(free_endpoint)
relay=$(free_endpoint)
"$dc" relay --id relay --listen "$relay" --parent "$origin" --log-level warn >"$tmp/relay.log" 2>&1 &
pids+=($!)
"$dc" publish --listen "$origin" --interval-ms 300 --linger-ms 60000 --log-level warn "$tmp"/ckpt/step-*.safetensors >"$tmp/publish.log" 2>&1 &
pids+=($!)
versions=$(ls "$tmp"/ckpt/step-*.safetensors | wc -l)

# C, with pkg-config alone.
export PKG_CONFIG_PATH=$libdir/pkgconfig
cc -std=c11 -Wall -Werror "$here/embed.c" $(pkg-config --cflags --libs deltacast) -Wl,-rpath,"$libdir" -o "$tmp/embed" ||
  fail "the C program does not build with pkg-config --cflags --libs deltacast"
# C++, with find_package(deltacast) alone.
cmake -S "$here/cpp" -B "$tmp/cpp" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release -DCMAKE_BUILD_RPATH="$libdir" >"$tmp/cpp.log" 2>&1 &&
  cmake --build "$tmp/cpp" >>"$tmp/cpp.log" 2>&1 || { cat "$tmp/cpp.log"; fail "the C++ program does not build with find_package(deltacast)"; }
# The publisher's checksum of the last version (the checksum of its anchor).
"$dc" encode -q "$(ls "$tmp"/ckpt/step-*.safetensors | tail -1)" -o "$tmp/last.dcd" >/dev/null
want=$("$dc" inspect "$tmp/last.dcd" | sed -n 's/.*version checksum \([0-9a-f]*\).*/\1/p')
[ -n "$want" ] || fail "no checksum from deltacast inspect"
for prog in "$tmp/embed" "$tmp/cpp/embed_cpp"; do
  ldd "$prog" | grep "$libdir/libdeltacast.so.0" >/dev/null || fail "$(basename "$prog") does not load the installed libdeltacast"
  timeout 90 "$prog" "$relay" "$versions" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "$(basename "$prog") did not get version $versions"; }
  got=$(sed -n 's/.*checksum \([0-9a-f]*\).*/\1/p' "$tmp/out")
  [ "$got" = "$want" ] || fail "$(basename "$prog") holds checksum '$got', the publisher's is $want"
  echo "$(basename "$prog"): $(cat "$tmp/out")"
done

# Python, from the prefix (when the build has the package).
if [ -f "$build/python/deltacast/__init__.py" ]; then
  py=$(find "$prefix" -path "*dist-packages/deltacast/__init__.py" | head -1)
  [ -n "$py" ] || fail "no Python package under $prefix"
  PYTHONPATH=$(dirname "$(dirname "$py")") /usr/bin/python3 -c "import deltacast; assert deltacast.__file__.startswith('$prefix'), deltacast.__file__" ||
    fail "the installed Python package does not import from the prefix"
  echo "python: imports from ${py#$prefix/}"
fi

if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify "$prefix"/lib/systemd/system/deltacast-relay@.service "$prefix"/lib/systemd/system/deltacast-worker@.service \
    >"$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log"; fail "systemd-analyze verify"; }
  echo "systemd-analyze verify: units pass"
else
  echo "systemd-analyze: not installed here (the units are checked where it is)"
fi
echo "PASS install"
