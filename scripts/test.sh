#!/usr/bin/env bash
# Set up, build and run the whole test suite (ctest). Extra arguments go to
# ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/build.sh
t1=$(date +%s)
cd "${GLINT_BUILD_DIR:-build}"
ctest --output-on-failure -j "${GLINT_TEST_JOBS:-2}" "$@"
t2=$(date +%s)
echo "build: $((t1 - t0)) s, tests: $((t2 - t1)) s"
