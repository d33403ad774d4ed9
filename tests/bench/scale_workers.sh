#!/usr/bin/env bash
# Per-device worker scaling: for each size n, writes a deployment YAML
# (GPU: one worker per GPU via `device: all` with CUDA_VISIBLE_DEVICES limited to
# the first n GPUs; CPU: `count: n` cpu workers), starts it with `mambad up`,
# waits for n workers, drives it with bench_scaling (P client processes x S
# sessions of greedy GENERATE), stops it, and prints one table: aggregate decode
# tok/s, efficiency vs 1 worker, broker CPU, brokered STATUS p50/p99, route ids
# and bits identical. Synthetic bf16 checkpoints are made once into a cache dir.
#
#   tests/bench/scale_workers.sh [--sizes 1,2,4,8] [--shapes 130m,1.4b] [--device cpu|gpu]
#       [--bin-dir DIR] [--cache DIR] [--out DIR] [--gen G] [--reps R]
#       [--sessions-per-worker S] [--procs-per-worker P] [--threads T]
#
# Shapes: 130m 370m 1.4b 2.8b (mambad-model synth) and `tiny` (d_model 128, 4
# layers, vocab 1024: the CPU smoke). Binaries: --bin-dir, else $MBD_BIN_DIR,
# else build/bin. Output: $OUT (or --out) gets scaling_table.md, results.txt and
# one log per run. Exit 0 when every run completed with both checks passing.
set -u

sizes=1,2,4,8
shapes=130m,1.4b
device=gpu
bin_dir=${MBD_BIN_DIR:-}
cache=${MBD_SCALING_CACHE:-/tmp/mbd-scaling-cache}
out=${OUT:-/tmp/mbd-scaling-out}
gen= reps= spw= ppw= threads=1

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "scale_workers: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes=${2:?}; shift 2 ;;
    --shapes) shapes=${2:?}; shift 2 ;;
    --device) device=${2:?}; shift 2 ;;
    --bin-dir) bin_dir=${2:?}; shift 2 ;;
    --cache) cache=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --gen) gen=${2:?}; shift 2 ;;
    --reps) reps=${2:?}; shift 2 ;;
    --sessions-per-worker) spw=${2:?}; shift 2 ;;
    --procs-per-worker) ppw=${2:?}; shift 2 ;;
    --threads) threads=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
[ -n "$bin_dir" ] || bin_dir="$here/../../build/bin"
bin_dir=$(cd "$bin_dir" 2>/dev/null && pwd) || die "no binary dir (--bin-dir or MBD_BIN_DIR)"
for b in mambad-up mambad-broker mambad-worker mambad-model bench_scaling; do
  [ -x "$bin_dir/$b" ] || die "$bin_dir/$b missing: build it (cmake --build BUILD --target $b)"
done
case "$device" in
  cpu)
    : "${gen:=128}" "${reps:=3}" "${spw:=16}" "${ppw:=1}"
    dtype_line="device: cpu"; warm=4 ;;
  gpu)
    # 256 sessions per worker = the worker's max batch: the saturated decode point.
    : "${gen:=64}" "${reps:=3}" "${spw:=256}" "${ppw:=2}"
    dtype_line="device: all"; warm=16
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    vis=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((ngpu > 0 ? ngpu - 1 : 0)))}
    [ "$ngpu" -gt 0 ] || die "--device gpu but nvidia-smi lists no GPU (use --device cpu)" ;;
  *) die "--device wants cpu or gpu, got '$device'" ;;
esac
for v in "$gen" "$reps" "$spw" "$ppw" "$threads"; do
  case "$v" in ''|*[!0-9]*) die "--gen/--reps/--sessions-per-worker/--procs-per-worker/--threads want numbers" ;; esac
done
mkdir -p "$cache" "$out" || die "cannot create $cache or $out"

# Makes $cache/<shape>-bf16 once; prints its path.
checkpoint() {
  local dir="$cache/$1-bf16"
  if [ ! -f "$dir/config.json" ]; then
    local args=(--shape "$1")
    [ "$1" = tiny ] && args=(--shape custom --d-model 128 --layers 4 --vocab 1024)
    "$bin_dir/mambad-model" synth "${args[@]}" --dtype bf16 --out "$dir.tmp" >&2 &&
      rm -rf "$dir" && mv "$dir.tmp" "$dir" || return 1
  fi
  echo "$dir"
}

run_dir=$(mktemp -d /tmp/mbd-scale-XXXXXX)
up_pid=
stop_up() {
  if [ -n "$up_pid" ] && kill -0 "$up_pid" 2>/dev/null; then
    kill -TERM "$up_pid"
    wait "$up_pid" 2>/dev/null
  fi
  up_pid=
}
trap 'stop_up; rm -rf "$run_dir"' EXIT
trap 'exit 130' INT TERM

results="$out/results.txt"
: > "$results"
status=0
IFS=, read -r -a size_list <<< "$sizes"
IFS=, read -r -a shape_list <<< "$shapes"
for shape in "${shape_list[@]}"; do
  model_dir=$(checkpoint "$shape") || { echo "scale_workers: synth $shape failed" >&2; status=1; continue; }
  for n in "${size_list[@]}"; do
    log="$out/run-$shape-$n.log"
    yaml="$run_dir/$shape-$n.yaml"
    if [ "$device" = gpu ]; then
      IFS=, read -r -a vis_list <<< "$vis"
      if [ "${#vis_list[@]}" -lt "$n" ]; then
        echo "RESULT shape=$shape workers=$n ok=skipped(only ${#vis_list[@]} GPUs)" >> "$results"
        continue
      fi
      devs=$(IFS=,; echo "${vis_list[*]:0:$n}")
      worker_lines="    $dtype_line"
    else
      devs=
      worker_lines="    $dtype_line
    count: $n
    threads: $threads"
    fi
    cat > "$yaml" <<EOF
broker:
  clients: ipc://$run_dir/c.sock
  workers: ipc://$run_dir/w.sock
  heartbeat_ms: 1000
  liveness: 5
  queue_limit: 65536
  max_message_mb: 1024
  default_deadline_ms: 600000
models:
  - name: m
    path: $model_dir
workers:
  - name: w
$worker_lines
    dtype: bf16
    gemm_mode: deterministic
    capacity: $((2 * spw > 16 ? 2 * spw : 16))
    max_batch: $spw
    models: [m]
EOF
    if [ -n "$devs" ]; then
      CUDA_VISIBLE_DEVICES=$devs "$bin_dir/mambad-up" --config "$yaml" --bin-dir "$bin_dir" > "$log" 2>&1 &
    else
      "$bin_dir/mambad-up" --config "$yaml" --bin-dir "$bin_dir" > "$log" 2>&1 &
    fi
    up_pid=$!
    for _ in $(seq 1 600); do # ready, or dead, within 300 s
      grep -q '^mambad up: ready' "$log" && break
      kill -0 "$up_pid" 2>/dev/null || break
      sleep 0.5
    done
    broker_pid=$(sed -n 's/^mambad up: started broker (pid \([0-9]*\)).*/\1/p' "$log" | tail -1)
    procs=$((n * ppw))
    sessions=$spw
    [ "$ppw" -gt 1 ] && sessions=$(((spw + ppw - 1) / ppw))
    echo "== $shape, $n worker(s): $procs procs x $sessions sessions, gen $gen x $reps" | tee -a "$log"
    "$bin_dir/bench_scaling" --connect "ipc://$run_dir/c.sock" --model m --model-dir "$model_dir" \
      --workers "$n" --procs "$procs" --sessions "$sessions" --gen "$gen" --warm "$warm" \
      --reps "$reps" --broker-pid "${broker_pid:-0}" --wait-s 120 >> "$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    line=$(grep '^RESULT ' "$log" | tail -1)
    [ -n "$line" ] || line="RESULT workers=$n ok=no"
    echo "${line/RESULT /RESULT shape=$shape }" >> "$results"
    grep -E '^(workers|load|broker CPU|sessions per|GENERATE)' "$log" | sed 's/^/   /'
    stop_up
  done
done

# The table: efficiency = tok/s(n) / (n * tok/s(1)) for the same shape.
awk -v dev="$device" '
  function kv(s,   a, i, k) { delete f; n = split(s, a, " ");
    for (i = 2; i <= n; i++) { k = index(a[i], "="); f[substr(a[i], 1, k - 1)] = substr(a[i], k + 1) } }
  BEGIN {
    printf "| shape | workers | clients | tok/s | eff vs 1 | broker CPU %% | clients CPU %% | STATUS p50 us | p99 us | routes same | bits same |\n"
    printf "|---|---|---|---|---|---|---|---|---|---|---|\n"
  }
  {
    kv($0)
    if (f["ok"] != "yes") { printf "| %s | %s | - | %s | - | - | - | - | - | - | - |\n", f["shape"], f["workers"], (f["ok"] == "" ? "failed" : f["ok"]); next }
    if (f["workers"] == 1) base[f["shape"]] = f["tok_s"]
    eff = (f["shape"] in base && base[f["shape"]] > 0) ? sprintf("%.1f%%", 100 * f["tok_s"] / (f["workers"] * base[f["shape"]])) : "-"
    printf "| %s | %s | %sx%s | %.0f | %s | %s | %s | %s | %s | %s | %s |\n", f["shape"], f["workers"],
      f["procs"], f["sessions"], f["tok_s"], eff, f["broker_cpu_pct"], f["client_cpu_pct"],
      f["status_p50_us"], f["status_p99_us"], f["routes_same"], f["bits_same"]
  }' "$results" > "$out/scaling_table.md"
{
  echo
  echo "Worker scaling, device $device, bf16 deterministic, gen $gen x $reps rounds, $spw sessions/worker ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  cat "$out/scaling_table.md"
} | tee "$out/scaling_summary.txt"
exit $status
