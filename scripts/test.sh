#!/usr/bin/env bash
# Set up, build and run the whole test suite (ctest). Extra arguments go to
# ctest, e.g. `scripts/test.sh -L unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/build.sh
# llama.cpp (prebuilt, from npm) for the test that runs exported GGUF files
# in it; where it cannot be installed that test says so and is skipped.
bash scripts/setup_llamacpp.sh >/dev/null ||
  echo "test: llama.cpp could not be installed (above); GgufLlamaCpp.* will be skipped"
# OpenAI's Node.js client (from npm) for the test of the OpenAI-compatible
# endpoint; where it cannot be installed that test runs its own client only.
bash scripts/setup_openai.sh >/dev/null ||
  echo "test: the npm openai client could not be installed (above); openai.endpoint runs without it"
t1=$(date +%s)
cd "${GLINT_BUILD_DIR:-build}"
ctest --output-on-failure -j "${GLINT_TEST_JOBS:-2}" "$@"
t2=$(date +%s)
echo "build: $((t1 - t0)) s, tests: $((t2 - t1)) s"
