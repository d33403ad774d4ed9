#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: unit, integration and
# fuzz smoke tests (GPU tests print why they skip when no device is present).
#   usage: tests/run-all.sh [--sanitize]   (--sanitize: ASan+UBSan build of host code)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/install-deps.sh"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
jobs=$(nproc)
if [ "${1:-}" = "--sanitize" ]; then
  build="$root/build-sanitize"
  # Host code only: CUDA objects are not instrumented, so leave them out here;
  # benches do not run in this pass, so do not build them. Unit tests (the
  # fuzz smoke tests among them) and integration tests: the broker, worker and
  # CLI processes the integration tests start are the instrumented binaries.
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DMBD_SANITIZE=ON -DMBD_CUDA=OFF \
    -DMBD_BENCH=OFF
  cmake --build "$build" -j"$jobs"
  # Reports go to files as well as failing the process: a broker or worker
  # whose output a test sends to a log it then deletes still leaves one here.
  logs="$build/sanitizer-logs"
  rm -rf "$logs" && mkdir -p "$logs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:log_path="$logs/asan" \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path="$logs/ubsan" \
    ctest --test-dir "$build" -L 'unit|integration' --output-on-failure -j"$jobs" || rc=$?
  if [ -n "$(ls -A "$logs")" ]; then
    echo "sanitizer reports (from tests or the processes they started):" >&2
    cat "$logs"/* >&2
    rc=1
  fi
  exit "${rc:-0}"
else
  build="$root/build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$build" -j"$jobs"
  ctest --test-dir "$build" --output-on-failure -j"$jobs"
fi
