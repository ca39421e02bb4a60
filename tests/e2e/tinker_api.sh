#!/usr/bin/env bash
# The Tinker-compatible HTTP API of `glint serve`, driven as the Tinker SDK
# drives it (tests/tinker/conformance.py: JSON and protobuf bodies, futures,
# ordering, retries, 429, the five losses, SFT and RL flows, isolation).
#   tinker_api.sh GLINT_BINARY SOURCE_DIR [ARCH]
# ARCH: the served base's family (serve_lib.sh's tiny_base; default qwen3).
set -euo pipefail
source "$(dirname "$0")/serve_lib.sh"
glint=$1 src=$2 arch=${3:-qwen3}
# conformance.py's bound on the SFT loss after 10 steps (last / first): the
# tiny dense base reaches 0.79, the tiny MoE base 0.80 (its experts' adapters
# each see a share of the tokens).
fall=0.8
[[ $arch == *_moe ]] && fall=0.85
temp_root tinker-api
cd "$root"
tiny_base "$glint" rows.jsonl "$arch"
protoc --python_out="$root" -I"$src/rpc/tinker" tinker_public.proto
start_server "$glint" "$root" "$(printf '[tinker]\nport = 0\nbase_model = "test/tiny-qwen3"\nmax_samples_in_flight = 2\npoll_seconds = 1\nseq_gap_seconds = 3\n[limits]\nmessage_mib = 2\n')"
tport=$(grep -o 'Tinker-compatible API on http://127.0.0.1:[0-9]*' serve.out | grep -o '[0-9]*$')
[[ -n $tport ]] || { echo "no Tinker API port in:"; cat serve.out; exit 1; }
alice=$(new_key "$glint" "$root" alice)
bob=$(new_key "$glint" "$root" bob)
# Debian's python3 (scripts/setup.sh installs requests, protobuf, zstandard for it).
PYTHONPATH="$root:$src/tests/tinker" timeout 600 /usr/bin/python3 "$src/tests/tinker/conformance.py" \
  "http://127.0.0.1:$tport" "$alice" "$bob" test/tiny-qwen3 "$fall" || { tail -30 serve.err; exit 1; }
