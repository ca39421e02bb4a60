#!/usr/bin/env bash
# The main job: set up, build, and run the GRPO demo (examples/grpo) in local
# mode: generated arithmetic data, a tiny model with a trained tokenizer, a
# short SFT warm-up, then GRPO with weight sync every step. Writes
# runs/grpo/metrics.jsonl, runs/grpo/report.html and checkpoints every 40
# steps; each run starts the run over (--fresh). Extra arguments go to
# the example (e.g. --steps 40); GLINT_DEMO_NPROC=2 runs it as a 2-process
# cluster job instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build=${GLINT_BUILD_DIR:-build}
if [[ ${GLINT_DEMO_NPROC:-1} -gt 1 ]]; then
  exec "$build/launcher/glint" run --nproc "$GLINT_DEMO_NPROC" -- "$build/examples/grpo" --fresh "$@"
fi
exec "$build/examples/grpo" --fresh "$@"
