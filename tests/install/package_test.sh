#!/usr/bin/env bash
# The Debian packages CPack builds from this build (cmake/package.cmake):
#   - each holds what it should (dpkg-deb -c), and depends on what it should (dpkg-deb -f);
#   - apt-get resolves every dependency from Debian's archive (a simulated install of all four);
#   - lintian reports no errors, where lintian is installed;
#   - extracted with dpkg -x, the packaged deltacast runs, and a C program built against the
#     extracted headers and library takes a version from the packaged deltacast's publisher.
# Usage: package_test.sh BUILD_DIR
source "$(dirname "$0")/common.sh"

(cd "$build" && cpack -G DEB -B "$tmp/debs" >"$tmp/cpack.log" 2>&1) || { tail -20 "$tmp/cpack.log"; fail "cpack -G DEB"; }
deb() { ls "$tmp"/debs/"$1"_*.deb 2>/dev/null | head -1; }
python=0
[ -f "$build/python/deltacast/__init__.py" ] && python=1
for p in deltacast libdeltacast0 libdeltacast-dev $([ $python = 1 ] && echo python3-deltacast); do
  [ -n "$(deb "$p")" ] || fail "no $p package"
done
has() {  # package, path (a regular expression over `dpkg-deb -c` paths)
  dpkg-deb -c "$(deb "$1")" | awk '{print $6}' | grep -E "^\./$2\$" >/dev/null || fail "$1 does not hold $2"
}
has deltacast usr/bin/deltacast
has deltacast 'usr/lib/systemd/system/deltacast-relay@\.service'
has deltacast 'usr/lib/systemd/system/deltacast-worker@\.service'
has deltacast usr/lib/sysusers.d/deltacast.conf
has deltacast usr/share/doc/deltacast/RUNTIME.md
has libdeltacast0 'usr/lib/libdeltacast\.so\.0\.[0-9.]*'
has libdeltacast-dev usr/include/deltacast/c/worker.h
has libdeltacast-dev usr/lib/libdeltacast.so
has libdeltacast-dev usr/lib/pkgconfig/deltacast.pc
has libdeltacast-dev usr/lib/cmake/deltacast/deltacastConfig.cmake
[ $python = 1 ] && has python3-deltacast 'usr/lib/python3/dist-packages/deltacast/_native\..*\.so'
for p in deltacast libdeltacast0 libdeltacast-dev $([ $python = 1 ] && echo python3-deltacast); do
  has "$p" "usr/share/doc/$p/copyright"
done
if dpkg-deb -c "$(deb libdeltacast0)" | grep "usr/include" >/dev/null; then fail "libdeltacast0 holds headers"; fi
dpkg-deb -f "$(deb libdeltacast-dev)" Depends | grep "libdeltacast0 (= " >/dev/null || fail "libdeltacast-dev does not depend on libdeltacast0"
for lib in libzmq5 libuv1 libsodium23 libprotobuf; do
  dpkg-deb -f "$(deb libdeltacast0)" Depends | grep "$lib" >/dev/null || fail "libdeltacast0 does not depend on $lib"
done
dpkg-deb -I "$(deb deltacast)" postinst | grep sysusers >/dev/null || fail "deltacast's postinst does not create the deltacast user"
echo "contents and dependencies: $(ls "$tmp"/debs/*.deb | xargs -n1 basename | tr '\n' ' ')"

# apt-get resolves the dependencies from Debian (simulated: nothing is installed).
apt-get install -s "$tmp"/debs/*.deb >"$tmp/apt.log" 2>&1 || { tail -20 "$tmp/apt.log"; fail "apt-get cannot install the packages"; }
echo "apt-get install -s: every dependency resolves"

if command -v lintian >/dev/null; then
  lintian "$tmp"/debs/*.deb >"$tmp/lintian.log" 2>&1 || true
  if grep -q "^E:" "$tmp/lintian.log"; then grep "^E:" "$tmp/lintian.log"; fail "lintian reports errors"; fi
  echo "lintian: no errors ($(grep -c '^W:' "$tmp/lintian.log" || true) warnings)"
else
  echo "lintian: not installed here"
fi

# Extracted, not installed: the executable and the library run from the packages' files.
for d in "$tmp"/debs/*.deb; do dpkg -x "$d" "$tmp/root"; done
root=$tmp/root/usr
"$root/bin/deltacast" --help >/dev/null || fail "the packaged deltacast --help"
cc -std=c11 -Wall -Werror -I"$root/include" "$here/embed.c" -L"$root/lib" -ldeltacast -o "$tmp/embed" || fail "embed.c against the extracted package"
export LD_LIBRARY_PATH=$root/lib
ldd "$tmp/embed" | grep "$root/lib/libdeltacast.so.0" >/dev/null || fail "embed does not load the extracted libdeltacast"
"$root/bin/deltacast" gen -q -o "$tmp/ckpt" --hidden 64 --layers 2 --vocab 512 --ffn 192 --steps 2 >/dev/null
endpoint=$(free_endpoint)
"$root/bin/deltacast" publish --listen "$endpoint" --interval-ms 300 --linger-ms 60000 --log-level warn "$tmp"/ckpt/step-*.safetensors \
  >"$tmp/publish.log" 2>&1 &
pids+=($!)
timeout 90 "$tmp/embed" "$endpoint" 3 >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "embed against the extracted library did not get version 3"; }
echo "extracted: deltacast --help runs; $(tail -1 "$tmp/out")"
echo "PASS packages"
