#!/usr/bin/env bash
# Installs llama.cpp, prebuilt for linux-x64, from the npm registry (the
# node-llama-cpp package and its CPU binaries; about 85 MB), for the GGUF
# export test and `glint bench sample`'s llama.cpp baseline. Nothing is
# built and nothing is downloaded at build or run time: this is the one step
# that fetches, and it is idempotent.
#
#   scripts/setup_llamacpp.sh            # into $GLINT_LLAMACPP_DIR or ~/.cache/glint/llamacpp
#   scripts/setup_llamacpp.sh --print    # just print where it goes
set -euo pipefail
version=3.22.1
dir="${GLINT_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/glint/llamacpp}"
if [[ "${1:-}" == "--print" ]]; then echo "$dir"; exit 0; fi
if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
  echo "setup_llamacpp: node-llama-cpp's prebuilt CPU binaries used here are for Linux x86-64, not $(uname -s)-$(uname -m)" >&2
  exit 1
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup_llamacpp: node and npm are needed (apt-get install nodejs npm)" >&2
  exit 1
fi
stamp="$dir/.glint-node-llama-cpp-$version"
if [[ -f "$stamp" ]]; then echo "$dir"; exit 0; fi
mkdir -p "$dir"
# --omit=optional skips the CUDA and Vulkan builds (hundreds of MB); the CPU
# one is named explicitly. --ignore-scripts: the postinstall step would only
# look for (and could try to build) a binary, which the package ships.
echo "setup_llamacpp: installing node-llama-cpp@$version (llama.cpp, prebuilt) into $dir" >&2
npm install --prefix "$dir" --no-save --no-audit --no-fund --ignore-scripts --omit=optional --loglevel=error \
  "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >&2
touch "$stamp"
echo "$dir"
