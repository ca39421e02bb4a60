#!/usr/bin/env bash
# The main job: set up, build, show the machine, and run the runtime demo in
# local mode and in 2-process cluster mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
glint=${GLINT_BUILD_DIR:-build}/launcher/glint
"$glint" info
echo
"$glint" demo "$@"
echo
"$glint" run --nproc 2 -- "$glint" demo "$@"
