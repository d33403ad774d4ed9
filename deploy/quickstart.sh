#!/usr/bin/env bash
# The main job: installs what is missing, builds, starts a local deployment
# (broker + one worker: a GPU worker when a GPU is present, else the CPU worker),
# sends a real generation request through it, prints the tokens, then sends a
# text completion over HTTP (the gateway, deploy/local.yaml's http: section)
# with curl and prints the text, and stops.
#   usage (as root on Debian/Ubuntu): deploy/quickstart.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/install-deps.sh"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)" --target mambad_cli mambad-broker mambad-worker mambad-up \
  mambad-model mambad-run mambad-gateway >/dev/null
bin="$root/build/bin"

# A seeded synthetic checkpoint in the Hugging Face layout (no download needed).
model="$root/deploy/models/mamba-130m"
if [ ! -f "$model/model.safetensors" ]; then
  echo "== making a synthetic 130m checkpoint in $model"
  mkdir -p "$(dirname "$model")"
  "$bin/mambad" model synth --shape 130m --dtype f32 --seed 1 --out "$model"
fi
work=$(mktemp -d)
"$bin/mambad" model prompt --out "$work/prompt.safetensors" --batch 2 --len 8 --vocab 50280 --seed 7

# GPU deployment when this host has a GPU the launcher can use, else the CPU worker.
config="$root/deploy/local-gpu.yaml"
"$bin/mambad" up --config "$config" --dry-run >/dev/null 2>&1 || config="$root/deploy/local.yaml"
echo "== mambad up --config $config"
"$bin/mambad" up --config "$config" > "$work/up.log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true; rm -rf "$work"' EXIT
endpoint=ipc:///tmp/mambad/clients.sock
for _ in $(seq 1 600); do  # a cold 130m load can take a while on a small machine
  if "$bin/mambad" status --connect "$endpoint" 2>/dev/null | grep -q mamba-130m; then break; fi
  kill -0 $up 2>/dev/null || { cat "$work/up.log"; exit 1; }
  sleep 0.5
done
"$bin/mambad" status --connect "$endpoint"
echo "== mambad generate (2 prompts x 8 tokens, 16 new tokens each, greedy)"
"$bin/mambad" generate --connect "$endpoint" --model mamba-130m --input "$work/prompt.safetensors" \
  --output "$work/tokens.safetensors" --max-tokens 16
echo "== POST http://127.0.0.1:8000/v1/completions (the HTTP gateway)"
for _ in $(seq 1 240); do
  curl -sf http://127.0.0.1:8000/health/ready >/dev/null 2>&1 && break
  sleep 0.5
done
reply=$(curl -sS http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
  -d '{"model": "mamba-130m", "prompt": "The capital of France is", "max_tokens": 16, "seed": 1}')
echo "$reply"
echo "== completion text:"
printf '%s\n' "$reply" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
echo "== done; stopping the deployment"
