#!/usr/bin/env bash
# Installs the build into a fresh prefix once and checks what an operator and
# a library user get from it:
#   1. the files: programs, libmambad.so.0 (SONAME), mambad.h, mambad.pc, the
#      CMake package, the systemd units; `mambad --version`;
#   2. mambad.h compiles alone (C and C++) and every function it declares is
#      exported by libmambad.so (the CUDA IPC pair only in CUDA builds);
#   3. a broker and a CPU worker started from the installed programs serve a
#      GEMM to an out-of-tree program built only with `pkg-config --cflags
#      --libs mambad`, and to the same program built with find_package(mambad);
#   4. `systemd-analyze verify` accepts the installed units;
#   5. `cpack -G DEB` builds a .deb whose Depends and contents are as expected.
# Parts whose tool is missing print why and are skipped; when nothing could
# run at all the test exits 77 (skipped).
set -euo pipefail
build=${MBD_BUILD_DIR:?MBD_BUILD_DIR (the build tree) is not set}
src=${MBD_SOURCE_DIR:?MBD_SOURCE_DIR is not set}
tmp=$(mktemp -d /tmp/mbd-install.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
die() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; }
has() { command -v "$1" >/dev/null 2>&1; }
# A sanitized libmambad needs the sanitizer runtime loaded by a program that
# was not built with it: tolerate the link order there.
if [ "${MBD_SANITIZE:-OFF}" = ON ]; then
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
fi

# ---- 1. install and the files it puts there ----------------------------------
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; die "cmake --install"; }
libdir=$(dirname "$(find "$prefix" -name mambad.pc -path '*/pkgconfig/*' | head -1)")/..
libdir=$(cd "$libdir" && pwd)
for f in bin/mambad bin/mambad-up bin/mambad-broker bin/mambad-worker bin/mambad-run bin/mambad-model \
         bin/mambad-gemm include/mambad.h lib/systemd/system/mambad.service \
         lib/systemd/system/mambad-broker.service "lib/systemd/system/mambad-worker@.service" \
         lib/sysusers.d/mambad.conf share/doc/mambad/deploy.md share/doc/mambad/examples/local.yaml \
         share/doc/mambad/examples/k8s/README.md; do
  [ -e "$prefix/$f" ] || die "not installed: $f"
done
if [ -x "$build/bin/mambad-gateway" ]; then
  [ -x "$prefix/bin/mambad-gateway" ] || die "mambad-gateway is built but not installed"
  [ -f "$prefix/lib/systemd/system/mambad-gateway.service" ] || die "no mambad-gateway.service"
fi
for f in libmambad.so.0 pkgconfig/mambad.pc cmake/mambad/mambadConfig.cmake \
         cmake/mambad/mambadConfigVersion.cmake; do
  [ -e "$libdir/$f" ] || die "not installed: $libdir/$f"
done
if has readelf; then
  readelf -d "$libdir/libmambad.so.0" | grep -q 'SONAME.*\[libmambad\.so\.0\]' || die "libmambad.so.0 has no SONAME libmambad.so.0"
fi
version=$(sed -n 's/^project(mambad VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
"$prefix/bin/mambad" --version >"$tmp/version" || die "mambad --version failed"
grep -qx "mambad $version" "$tmp/version" || die "mambad --version: $(cat "$tmp/version")"
grep -Eq '^kernel sources sha256 [0-9a-f]{64}$' "$tmp/version" || die "mambad --version has no kernel digest"
echo "installed into $prefix ($(head -1 "$tmp/version"))"

# ---- 2. the header stands alone, the library exports what it declares --------
cc=${CC:-cc}
echo '#include <mambad.h>' >"$tmp/h.c"
$cc -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$prefix/include" "$tmp/h.c" || die "mambad.h does not compile alone"
if has c++; then
  c++ -Wall -Werror -fsyntax-only -x c++ -I"$prefix/include" "$tmp/h.c" || die "mambad.h does not compile as C++"
fi
if has nm; then
  declared=$(grep -oE '[ *]mbd_[a-z0-9_]+\(' "$prefix/include/mambad.h" | tr -d ' *(' | sort -u)
  exported=$(nm -D --defined-only "$libdir/libmambad.so.0" | grep -oE 'mbd_[a-z0-9_]+' | sort -u)
  missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
  if ! nm -D "$libdir/libmambad.so.0" | grep -q cudaIpcGetMemHandle; then
    missing=$(echo "$missing" | grep -vxE 'mbd_cuda_ipc_ref|mbd_client_host_id' || true)
  fi
  [ -z "$missing" ] || die "declared in mambad.h but not exported by libmambad.so: $missing"
  extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
  [ -z "$extra" ] || die "exported by libmambad.so but not declared in mambad.h: $extra"
fi

# ---- 3. out-of-tree programs against a live deployment of the installed tree ---
ran_client=0
ep_clients="ipc://$tmp/clients.sock"
ep_workers="ipc://$tmp/workers.sock"
"$prefix/bin/mambad-broker" --clients "$ep_clients" --workers "$ep_workers" >"$tmp/broker.log" 2>&1 &
pids+=($!)
"$prefix/bin/mambad-worker" --connect "$ep_workers" --name cpu0 --device cpu --threads 1 \
  >"$tmp/worker.log" 2>&1 &
pids+=($!)
run_smoke() { # $1: program, $2: how it was built
  if ! LD_LIBRARY_PATH="$libdir" "$1" "$ep_clients" >"$tmp/smoke.out" 2>&1; then
    cat "$tmp/smoke.out" "$tmp/broker.log" "$tmp/worker.log" >&2
    die "client built with $2 failed"
  fi
  grep -q '^ok cpu0 [0-9a-f]\{64\}$' "$tmp/smoke.out" || die "client built with $2: $(cat "$tmp/smoke.out")"
  echo "client built with $2: $(cat "$tmp/smoke.out")"
  ran_client=1
}
if has pkg-config; then
  export PKG_CONFIG_PATH="$libdir/pkgconfig"
  # shellcheck disable=SC2046 # the flags are words
  $cc -std=c11 -Wall -Werror -o "$tmp/smoke_pc" "$src/tests/deploy/client_smoke.c" \
    $(pkg-config --cflags --libs mambad) -lm || die "building against pkg-config mambad"
  run_smoke "$tmp/smoke_pc" pkg-config
else
  skip "pkg-config not found: the pkg-config client is not built"
fi
cmake -S "$src/tests/deploy/find_package" -B "$tmp/fp" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$tmp/fp.log" 2>&1 || { cat "$tmp/fp.log"; die "find_package(mambad) configure"; }
cmake --build "$tmp/fp" >>"$tmp/fp.log" 2>&1 || { cat "$tmp/fp.log"; die "find_package(mambad) build"; }
run_smoke "$tmp/fp/client_smoke" find_package

# ---- 4. systemd-analyze verify ----------------------------------------------------
ran_units=0
if ! has systemd-analyze; then
  skip "systemd-analyze not found (apt-get install systemd): units not verified"
else
  printf '[Service]\nExecStart=/bin/true\n' >"$tmp/probe.service"
  if ! systemd-analyze verify "$tmp/probe.service" >"$tmp/probe.log" 2>&1; then
    skip "systemd-analyze cannot run here ($(head -1 "$tmp/probe.log")): units not verified"
  else
    units=$prefix/lib/systemd/system
    cp "$units/mambad-worker@.service" "$tmp/"
    targets=("$units"/mambad.service "$units"/mambad-broker.service "$tmp/mambad-worker@0.service")
    [ -f "$units/mambad-gateway.service" ] && targets+=("$units/mambad-gateway.service")
    if ! systemd-analyze verify "${targets[@]}" >"$tmp/verify.log" 2>&1 || [ -s "$tmp/verify.log" ]; then
      cat "$tmp/verify.log" >&2
      die "systemd-analyze verify rejects the installed units"
    fi
    echo "systemd-analyze verify: ${#targets[@]} units accepted"
    ran_units=1
  fi
fi

# ---- 5. the .deb ------------------------------------------------------------------------
ran_deb=0
if ! has cpack || ! has dpkg-deb; then
  skip "cpack or dpkg-deb not found: no .deb built"
else
  cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/deb" >"$tmp/cpack.log" 2>&1 || { cat "$tmp/cpack.log"; die "cpack -G DEB"; }
  deb=$(ls "$tmp"/deb/mambad_"$version"_*.deb)
  dpkg-deb --info "$deb" >"$tmp/info"
  dpkg-deb --contents "$deb" >"$tmp/contents"
  for d in libzmq5 'libmsgpack-?c2' libyaml-0-2 libjansson4 libpcre2-8-0 'libutf8proc[23]'; do
    grep -Eq "^ Depends:.*\b$d\b" "$tmp/info" || die ".deb Depends lacks $d: $(grep Depends "$tmp/info")"
  done
  for f in usr/bin/mambad usr/bin/mambad-broker usr/bin/mambad-worker usr/bin/mambad-up \
           usr/lib/libmambad.so.0 usr/include/mambad.h usr/lib/pkgconfig/mambad.pc \
           usr/lib/cmake/mambad/mambadConfig.cmake usr/lib/systemd/system/mambad-broker.service \
           'usr/lib/systemd/system/mambad-worker@.service' usr/lib/sysusers.d/mambad.conf \
           usr/share/doc/mambad/deploy.md; do
    grep -q " \./$f\( \|$\)" "$tmp/contents" || die ".deb lacks /$f"
  done
  if [ -x "$build/bin/mambad-gateway" ]; then
    grep -q ' \./usr/bin/mambad-gateway$' "$tmp/contents" || die ".deb lacks /usr/bin/mambad-gateway"
    grep -Eq '^ Depends:.*\blibmicrohttpd12' "$tmp/info" || die ".deb Depends lacks libmicrohttpd12"
  fi
  grep -q 'postinst' "$tmp/info" || die ".deb has no postinst (service user)"
  dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/lib/systemd/system/mambad.service >"$tmp/deb.unit"
  grep -q '^ExecStart=/usr/bin/mambad up --config /etc/mambad/deploy.yaml' "$tmp/deb.unit" || die ".deb unit: $(grep ExecStart "$tmp/deb.unit")"
  echo ".deb: $(basename "$deb"), $(grep -c . "$tmp/contents") entries, $(grep Depends "$tmp/info")"
  ran_deb=1
fi

if [ $((ran_client + ran_units + ran_deb)) -eq 0 ]; then exit 77; fi
echo "PASS"
