#!/usr/bin/env bash
# One GPU-machine call that checks and measures a commit: builds for sm_90a,
# runs the GPU tests, then the benchmarks beside the reference implementation
# (../shared/peer, run while this project builds, so its figures and ours come
# from one machine and one call). Run from the project root through the device
# tool with carry [".gpu-deps"] (../shared/gpu/README.md: fetch-deps.sh).
#   usage: [MBD_COMMIT=<commit>] tests/gpu/device-run.sh [SECONDS] [BENCH...]
#   MBD_COMMIT: the commit being run, printed first (the device copy's own
#            git HEAD can be stale)
#   SECONDS: the budget of the whole call (default 540; benches that would
#            start later than 60 s before it are skipped and listed).
#   BENCH:   which benches, in order (default: m2 m1 m1big gemm service):
#            m2 bench_mamba2_gpu --state bf16 all 3; m1 bench_mamba1_gpu
#            --state all 130m 5 bf16; m1big the same for 1.4b and 2.8b;
#            gemm bench_gemm_gpu; service bench_service_gpu on a synthetic
#            130m bf16 checkpoint.
# Everything goes under $OUT as it is produced: summary.txt (the lines to read
# first) and logs.tgz (every log); the device tool returns at most 8 files.
set -uo pipefail
budget=${1:-540}
shift || true
benches=("$@")
[ ${#benches[@]} -eq 0 ] && benches=(m2 m1 m1big gemm service)
t0=$(date +%s)
out=${OUT:-/tmp/device-run}
logs="$out/logs"
mkdir -p "$logs"
summary="$out/summary.txt"
left() { echo $((budget - ($(date +%s) - t0))); }
say() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$summary"; }
pack() { tar -C "$out" -czf "$out/logs.tgz" logs 2>/dev/null; }

[ -f .gpu-deps/env.sh ] || { say "no .gpu-deps/env.sh: carry .gpu-deps (fetch-deps.sh)"; exit 2; }
# shellcheck disable=SC1091
source .gpu-deps/env.sh
# The device copy's git metadata can lag the tree it was sent with, so the
# commit is what the caller names (MBD_COMMIT=...), else marked unchecked.
commit=${MBD_COMMIT:-"$(git rev-parse --short HEAD 2>/dev/null || echo '?') (device copy's git HEAD: may be stale; pass MBD_COMMIT)"}
say "commit $commit, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"

peer_pid=
if [ -d .gpu-deps/peer ]; then
  # Niced: the build is CPU work, the peer GPU work; they share the call's time.
  PEER_TOTAL_S=$(($(left) - 200)) nice -n 10 bash .gpu-deps/peer/run_all.sh "$logs/peer" \
    >"$logs/peer.txt" 2>&1 &
  peer_pid=$!
fi

build=/tmp/mbd-device-build
# env.sh sets SHARED_FIXTURES, which the build reads for the fixtures.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  >"$logs/configure.txt" 2>&1 &&
  cmake --build "$build" -j"$(nproc)" >"$logs/build.txt" 2>&1
rc=$?
say "build rc=$rc"
pack
if [ $rc -ne 0 ]; then
  grep -E "error|Error" "$logs/build.txt" | head -20 | tee -a "$summary"
  exit 1
fi

ctest --test-dir "$build" -L gpu -LE bench -j6 --output-on-failure >"$logs/ctest.txt" 2>&1
say "gpu tests: $(grep -E 'tests passed|tests failed' "$logs/ctest.txt")"
grep -E "\*\*\*Failed|Skipped|Not Run|Exception" "$logs/ctest.txt" | tee -a "$summary"
pack

if [ -n "$peer_pid" ]; then
  wait "$peer_pid"
  say "peer done"
  grep -E "^\| *(mamba|peer|torch)" "$logs/peer.txt" | tail -40 >>"$summary"
  pack
fi

bin="$build/bin"
run_bench() { # name, then the command
  local name=$1
  shift
  if [ "$(left)" -lt 60 ]; then
    say "skipped $name (time)"
    return
  fi
  timeout "$(($(left) - 20))" "$@" >"$logs/$name.txt" 2>&1
  say "$name rc=$?"
  pack
}
for b in "${benches[@]}"; do
  case $b in
  m2) run_bench m2 "$bin/bench_mamba2_gpu" --state bf16 all 3 ;;
  m1) run_bench m1 "$bin/bench_mamba1_gpu" --state all 130m 5 bf16 ;;
  m1big)
    run_bench m1_14b "$bin/bench_mamba1_gpu" --state all 1.4b 5 bf16
    run_bench m1_28b "$bin/bench_mamba1_gpu" 2.8b 3 bf16
    ;;
  gemm) run_bench gemm "$bin/bench_gemm_gpu" ;;
  service)
    "$bin/mambad" model synth --shape 130m --dtype bf16 --out /tmp/m130 >"$logs/synth.txt" 2>&1
    run_bench service "$bin/bench_service_gpu" "$bin" /tmp/m130
    ;;
  *) say "unknown bench $b" ;;
  esac
done
say "done"
pack
