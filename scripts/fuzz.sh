#!/usr/bin/env bash
# Runs the parser fuzzers (fuzz/) longer than the test suite's 20 s each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   each target SECONDS (default 600); all targets by default
#   scripts/fuzz.sh --seeds                 rewrites the seeds in fuzz/corpus/ with fuzz_seeds
#
# Builds first (scripts/build.sh; the fuzzers need clang and libclang-rt-dev,
# which scripts/setup.sh installs). Each target starts from its committed
# corpus (fuzz/corpus/TARGET) and from what earlier runs here found; after
# the run, everything is merged (libFuzzer -merge=1, keeping only inputs
# that add coverage) into the corpus copy build/fuzz/corpus/TARGET, never
# into the tree. An input that crashes, leaks, hangs (-timeout, 10 s) or
# takes too much memory is kept in build/fuzz/crashes/TARGET/ and listed;
# the script then fails. Once its bug is fixed, commit the input into
# fuzz/corpus/TARGET/ so every later run replays it. GLINT_FUZZ_JOBS
# targets run at once (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GLINT_BUILD_DIR:-build}
fz=$build/fuzz

if [[ ${1:-} == --seeds ]]; then
  bash scripts/build.sh
  "$fz/fuzz_seeds" fuzz/corpus
  echo "fuzz: seeds written to fuzz/corpus/ (git status shows what changed)"
  exit 0
fi
seconds=600
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in fuzz/targets/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi

bash scripts/build.sh
for t in "${targets[@]}"; do
  if [[ ! -x $fz/fuzz_$t ]]; then
    echo "fuzz: $fz/fuzz_$t is missing: unknown target, or no clang with libFuzzer (see cmake/fuzz.cmake)" >&2
    exit 2
  fi
done

export GLINT_LOG=off
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
limits=(-timeout=10 -rss_limit_mb=2048)

run_one() {
  local t=$1 work=$fz/long/$t corpus=$fz/corpus/$t crashes=$fz/crashes/$t log=$fz/logs/$t.log
  rm -rf "$work"
  mkdir -p "$work" "$corpus" "$crashes" "$fz/logs"
  local rc=0
  "$fz/fuzz_$t" -max_total_time="$seconds" "${limits[@]}" -print_final_stats=1 -artifact_prefix="$crashes/" \
    "$work" "$corpus" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  # The corpus copy: committed seeds, earlier runs and this one, minimised.
  local merged=$fz/merge/$t
  rm -rf "$merged"
  mkdir -p "$merged"
  "$fz/fuzz_$t" -merge=1 "${limits[@]}" -artifact_prefix="$crashes/" "$merged" "fuzz/corpus/$t" "$corpus" "$work" \
    >>"$log" 2>&1 || true
  rm -rf "$corpus"
  mv "$merged" "$corpus"
  local stats
  stats=$(grep -E '^stat::number_of_executed_units' "$log" | head -n 1 | awk '{print $2}')
  echo "fuzz: $t: ${stats:-?} inputs in ${seconds} s, corpus copy $(ls "$corpus" | wc -l) files, exit $rc (log $log)"
  return $rc
}

jobs=${GLINT_FUZZ_JOBS:-$(nproc)}
failed=()
declare -A pids
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_one "$t" &
  pids[$t]=$!
done
for t in "${!pids[@]}"; do wait "${pids[$t]}" || failed+=("$t"); done

crashed=0
for t in "${targets[@]}"; do
  if compgen -G "$fz/crashes/$t/*" >/dev/null; then
    crashed=1
    echo "fuzz: $t: inputs that failed (fix the bug, then cp them into fuzz/corpus/$t/):"
    ls -1 "$fz/crashes/$t/" | sed "s|^|  $fz/crashes/$t/|"
  fi
done
if ((${#failed[@]} > 0 || crashed)); then
  echo "fuzz: failed: ${failed[*]:-see the inputs above}" >&2
  exit 1
fi
echo "fuzz: no crash, leak or hang in ${#targets[@]} targets"
