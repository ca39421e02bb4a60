#!/usr/bin/env bash
# Configures and builds glint into build/ (or $GLINT_BUILD_DIR) after installing
# its dependencies. Used by scripts/demo.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${GLINT_BUILD_DIR:-build}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=${GLINT_BUILD_TYPE:-RelWithDebInfo}
fi
cmake --build "$build" -j "${GLINT_JOBS:-$(nproc)}"
