#!/usr/bin/env bash
# Host roles of `mambad up`: one deployment YAML, two "hosts". The broker host
# runs `mambad up --role broker`; the workers host runs `mambad up --role
# workers --broker-host ADDR` and its CPU worker registers over tcp. The hosts
# are two loopback addresses (127.0.0.2 for the broker; the workers connect to
# it from 127.0.0.1). Requests are served; then the broker host is stopped and
# started again, and the same workers host, never restarted, serves again.
# --check accepts both roles' plans and refuses a missing program.
set -euo pipefail
bin=${MBD_BIN_DIR:?MBD_BIN_DIR is not set}
tmp=$(mktemp -d /tmp/mbd-roles.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
die() { echo "FAIL: $*" >&2; for f in "$tmp"/*.log; do echo "== $f" >&2; cat "$f" >&2; done; exit 1; }

broker_addr=127.0.0.2
if command -v python3 >/dev/null &&
   ! python3 -c "import socket; socket.socket().bind(('$broker_addr', 0))" 2>/dev/null; then
  echo "SKIP: cannot bind $broker_addr (no second loopback address here)"
  exit 77
fi
base=$((20000 + $$ % 20000))
clients="tcp://$broker_addr:$base"
cat >"$tmp/deploy.yaml" <<YAML
broker:
  clients: "tcp://$broker_addr:$base"
  workers: "tcp://$broker_addr:$((base + 1))"
  heartbeat_ms: 200
  liveness: 3
models: []
workers:
  - name: cpu
    device: cpu
    threads: 1
security:
  insecure: {clients: true, workers: true}   # loopback only: CURVE has its own tests
YAML

# --check: both roles plan and find their programs; a missing one is refused.
"$bin/mambad-up" --config "$tmp/deploy.yaml" --role broker --bin-dir "$bin" --check >"$tmp/check.log" 2>&1 ||
  die "--check --role broker"
"$bin/mambad-up" --config "$tmp/deploy.yaml" --role workers --broker-host "$broker_addr" \
  --bin-dir "$bin" --check >>"$tmp/check.log" 2>&1 || die "--check --role workers"
grep -q "ok: 1 worker; broker at $clients" "$tmp/check.log" || die "--check output: $(cat "$tmp/check.log")"
mkdir "$tmp/empty"
if PATH="$tmp/empty" "$bin/mambad-up" --config "$tmp/deploy.yaml" --bin-dir "$tmp/empty" --check \
     >"$tmp/check-missing.log" 2>&1; then
  die "--check accepted a plan whose programs are missing"
fi
grep -q "needs mambad-worker" "$tmp/check-missing.log" || die "--check: $(cat "$tmp/check-missing.log")"
# The workers role does not plan a broker, the broker role no workers.
"$bin/mambad-up" --config "$tmp/deploy.yaml" --role workers --broker-host "$broker_addr" --dry-run >"$tmp/plan.txt"
! grep -q '^mambad-broker' "$tmp/plan.txt" || die "--role workers plans a broker"
grep -q "^mambad-worker --connect tcp://$broker_addr:$((base + 1)) " "$tmp/plan.txt" || die "worker plan: $(cat "$tmp/plan.txt")"

start_broker_host() {
  "$bin/mambad-up" --config "$tmp/deploy.yaml" --role broker --bin-dir "$bin" --grace-ms 5000 \
    >>"$tmp/broker-host.log" 2>&1 &
  broker_host=$!
  pids+=("$broker_host")
}
serves() { # waits until the worker from the workers host answers a GEMM through the broker
  for _ in $(seq 1 150); do
    if "$bin/mambad" gemm --connect "$clients" --m 3 --n 5 --k 7 --seed 1 --deadline-ms 2000 \
         >"$tmp/gemm.out" 2>&1; then
      return 0
    fi
    sleep 0.2
  done
  return 1
}
start_broker_host
"$bin/mambad-up" --config "$tmp/deploy.yaml" --role workers --broker-host "$broker_addr" \
  --bin-dir "$bin" --grace-ms 5000 >"$tmp/workers-host.log" 2>&1 &
workers_host=$!
pids+=("$workers_host")
serves || die "no GEMM served through the broker host"
"$bin/mambad" status --connect "$clients" >"$tmp/status.out" || die "status"
grep -q '^cpu ' "$tmp/status.out" || die "the workers host's worker is not listed: $(cat "$tmp/status.out")"
worker_pid=$(pgrep -P "$workers_host" -x mambad-worker || true)
[ -n "$worker_pid" ] || die "the workers host runs no mambad-worker"
echo "served through the broker host; workers host worker pid $worker_pid"

# Broker restart: stop the broker host entirely, start it again.
kill -TERM "$broker_host"
wait "$broker_host" || true
"$bin/mambad" status --connect "$clients" --deadline-ms 500 >/dev/null 2>&1 &&
  die "the broker still answers after its host stopped"
start_broker_host
serves || die "the workers host did not serve again after the broker restarted"
kill -0 "$workers_host" 2>/dev/null || die "the workers host exited while the broker was away"
[ "$(pgrep -P "$workers_host" -x mambad-worker || true)" = "$worker_pid" ] ||
  echo "note: the workers host restarted its worker while the broker was away"
echo "served again after the broker restart; PASS"
