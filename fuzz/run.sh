#!/usr/bin/env bash
# Runs one fuzz target for a bounded time, over its committed seed corpus
# and a fresh scratch corpus: what each `fuzz` ctest test does (about 20 s).
#
#   fuzz/run.sh FUZZER CORPUS WORKDIR SECONDS [libFuzzer flags...]
#
# New inputs go to WORKDIR/new (emptied first: the committed corpus is never
# written), an input that crashes, leaks or hangs to WORKDIR/crashes/, and
# the run fails. Keep such an input in CORPUS once its bug is fixed.
set -euo pipefail
if (($# < 4)); then
  echo "usage: $0 FUZZER CORPUS WORKDIR SECONDS [libFuzzer flags...]" >&2
  exit 2
fi
fuzzer=$1 corpus=$2 work=$3 seconds=$4
shift 4
rm -rf "$work"
mkdir -p "$work/new" "$work/crashes"
# Quiet logs (a refused template is a warning per input); stack traces for
# undefined behaviour; leaks are checked (LeakSanitizer, on by default).
export GLINT_LOG=off
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# -timeout: one input running longer is a hang; -rss_limit_mb: memory.
rc=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/crashes/" "$@" "$work/new" "$corpus" || rc=$?
if ((rc != 0)); then
  echo "fuzz: $(basename "$fuzzer") failed (exit $rc); the input is in $work/crashes/:" >&2
  ls -l "$work/crashes/" >&2 || true
  echo "fuzz: fix the bug, then keep the input: cp $work/crashes/* $corpus/" >&2
fi
exit $rc
