#!/usr/bin/env bash
# Installs OpenAI's own client library for Node.js (the npm package openai;
# about 10 MB) for the test that drives `glint serve`'s OpenAI-compatible
# endpoint with it (tests/e2e/openai_api.sh). Neither Debian nor PyPI-free
# set-ups have the Python package; npm has this one. Nothing is downloaded at
# build or run time: this step fetches, and it is idempotent.
#
#   scripts/setup_openai.sh            # into $GLINT_OPENAI_NODE_DIR or ~/.cache/glint/openai-node
#   scripts/setup_openai.sh --print    # just print where it goes
#   scripts/setup_openai.sh --installed  # print where it is, or fail if it is not there
set -euo pipefail
version=4.104.0
dir="${GLINT_OPENAI_NODE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/glint/openai-node}"
if [[ "${1:-}" == "--print" ]]; then echo "$dir"; exit 0; fi
stamp="$dir/.glint-openai-$version"
if [[ "${1:-}" == "--installed" ]]; then [[ -f $stamp ]] && echo "$dir"; exit $?; fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup_openai: node and npm are needed (apt-get install nodejs npm)" >&2
  exit 1
fi
if [[ -f "$stamp" ]]; then echo "$dir"; exit 0; fi
mkdir -p "$dir"
echo "setup_openai: installing openai@$version (OpenAI's Node.js client) into $dir" >&2
npm install --prefix "$dir" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error "openai@$version" >&2
touch "$stamp"
echo "$dir"
