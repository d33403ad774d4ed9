#!/usr/bin/env bash
# Prepares .gpu-deps for tests/gpu/device-run.sh: ../shared/gpu/fetch-deps.sh with
# the Debian packages this project needs beyond its default list (the tokenizer's
# PCRE2 and utf8proc). Run from the project root; add "/.gpu-deps/" to
# .git/info/exclude once.
set -euo pipefail
GPU_EXTRA_DEBS="libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 ${GPU_EXTRA_DEBS:-}" \
  bash ../shared/gpu/fetch-deps.sh "${1:-.gpu-deps}"
