#!/usr/bin/env bash
# One call on the GPU machine (device tool, carry [".gpu-deps"]): builds for sm_90a,
# runs every GPU test, then the GPU benchmarks; logs and tables land in $OUT.
#   usage: tests/gpu/run-on-device.sh ["tests gemm model latency service scaling" | all]   (default all)
# Recipe and ceilings: ../shared/gpu/README.md. Budget: ~3 min build, ~2 min tests,
# ~3 min benches on one H200.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
what=${1:-all}
out=${OUT:-/tmp/mbd-out}; mkdir -p "$out"
source .gpu-deps/env.sh
S="$out/summary.txt"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$S"; }
stamp "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(nvidia-smi -L | head -2 | tr '\n' ' ')"
B=$PWD/build-dev   # inside the tree (ignored) so a warm machine keeps it between calls
cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$out/build.log" 2>&1 &&
  cmake --build $B -j"$(nproc)" >> "$out/build.log" 2>&1
stamp "build rc=$?"; tail -5 "$out/build.log" | grep -i error && exit 1
export MBD_BIN_DIR=$B/bin MBD_FIXTURES_DIR=$SHARED_FIXTURES MBD_SOURCE_DIR=$PWD
want() { case " $what " in *" all "*|*" $1 "*) return 0;; esac; return 1; }
if want tests; then
  ctest --test-dir $B -L gpu --output-on-failure --timeout 240 > "$out/gpu-tests.log" 2>&1
  stamp "ctest -L gpu rc=$?"; grep -E "tests passed|Passed|Failed|\*\*\*" "$out/gpu-tests.log" | tee -a "$S"
fi
if want gemm; then
  timeout 150 $B/bin/bench_gemm_gpu > "$out/bench-gemm.log" 2>&1; stamp "bench_gemm_gpu rc=$?"
fi
if want model; then
  timeout 240 $B/bin/bench_mamba1_gpu > "$out/bench-mamba1.log" 2>&1; stamp "bench_mamba1_gpu rc=$?"
fi
if want latency; then
  timeout 60 $B/bin/bench_latency_gpu > "$out/bench-latency.log" 2>&1; stamp "bench_latency_gpu rc=$?"
fi
if want service; then
  [ -f /tmp/m130/model.safetensors ] ||
    $B/bin/mambad-model synth --shape 130m --dtype bf16 --out /tmp/m130 > /dev/null 2>&1
  timeout 150 $B/bin/bench_service_gpu $B/bin /tmp/m130 64 > "$out/bench-service.log" 2>&1
  stamp "bench_service_gpu rc=$?"
fi
if want scaling; then
  timeout 240 tests/bench/scale_workers.sh --device gpu --sizes 1,2 --shapes 130m,1.4b \
    --bin-dir $B/bin --cache /tmp/mbd-cache --out "$out" > "$out/scaling.log" 2>&1
  stamp "scale_workers rc=$?"
fi
cat "$S"
