#!/usr/bin/env bash
# Installs the build and runtime dependencies that are missing (Debian/Ubuntu, as root).
# Idempotent: does nothing (and needs no network) when everything is present.
set -euo pipefail
msgpack=libmsgpack-dev
gateway=(libmicrohttpd-dev curl prometheus) # mambad-gateway; curl and promtool for its tests
if apt-cache show libmsgpack-c-dev >/dev/null 2>&1; then msgpack=libmsgpack-c-dev; fi
want=(build-essential cmake pkg-config libzmq3-dev "$msgpack" libyaml-dev libcmocka-dev libjansson-dev
      libpcre2-dev libutf8proc-dev
      python3-yaml systemd)  # tests/deploy: manifest checks, systemd-analyze verify
missing=()
for p in "${want[@]}" "${gateway[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "mambad: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The CUDA toolkit is optional: without nvcc the CPU backend alone is built.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "mambad: note: nvcc found at /usr/local/cuda/bin (add it to PATH to build the CUDA backend)" >&2
fi
