#!/usr/bin/env bash
# The GPU benchmarks of this tree against a baseline tree in one device call, so
# that the ratios come from one machine and one run (device tool, carry
# [".gpu-deps", "<baseline dir>"]; make the baseline with
# `git archive COMMIT | tar -x -C .baseline`, .baseline ignored in .git/info/exclude).
#   usage: tests/gpu/ab-on-device.sh BASELINE_DIR build|bench
#   build: builds both trees (in parallel) and runs this tree's `ctest -L gpu`;
#   bench: bench_gemm_gpu ($REPS times each, default 3, alternating new and
#          baseline, appended to one log per tree) and bench_mamba1_gpu.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
base=$1 what=$2
out=${OUT:-/tmp/mbd-out}; mkdir -p "$out"
source .gpu-deps/env.sh
[ -e "$base/.gpu-deps" ] || ln -s "$PWD/.gpu-deps" "$base/.gpu-deps"
S="$out/summary.txt"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$S"; }
N=$PWD/build-dev B=$PWD/$base/build-dev
build() { cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a &&
          cmake --build "$2" -j8; }
export MBD_FIXTURES_DIR=$SHARED_FIXTURES
if [ "$what" = build ]; then
  build . "$N" > "$out/build-new.log" 2>&1 & pn=$!
  build "$base" "$B" > "$out/build-base.log" 2>&1 & pb=$!
  wait $pn; stamp "build new rc=$?"; wait $pb; stamp "build base rc=$?"
  MBD_BIN_DIR=$N/bin MBD_SOURCE_DIR=$PWD \
    ctest --test-dir "$N" -L gpu --output-on-failure --timeout 240 > "$out/gpu-tests.log" 2>&1
  stamp "ctest -L gpu rc=$?"; grep -E "tests passed|Passed|Failed|\*\*\*" "$out/gpu-tests.log" | tee -a "$S"
else
  for i in $(seq "${REPS:-3}"); do
    for t in new base; do
      d=$N; [ $t = base ] && d=$B
      echo "=== rep $i" >> "$out/gemm-$t.log"
      timeout 150 "$d/bin/bench_gemm_gpu" >> "$out/gemm-$t.log" 2>&1; stamp "bench_gemm_gpu $t $i rc=$?"
    done
  done
  for t in new base; do
    d=$N; [ $t = base ] && d=$B
    timeout 200 "$d/bin/bench_mamba1_gpu" > "$out/mamba1-$t.log" 2>&1; stamp "bench_mamba1_gpu $t rc=$?"
  done
fi
cat "$S"
