#!/usr/bin/env bash
# Kills a sampler's node process in the middle of a GRPO run, N times, and
# says for each run whether it finished, and with the metrics of an
# uninterrupted run.
#
#   scripts/chaos.sh [N]          (default 5; GLINT_BUILD_DIR picks the build, default build/)
#
# The job: `glint run --nproc 2 --max-restarts 1 -- glint grpo --sampler-dp 2`
# on a tiny model warmed up with `glint sft`: the model and sampler rank 0
# run in the driver (process 0), sampler rank 1 in process 1. Each run gets
# SIGKILL on process 1 after a random step (between 1 and 14 of 20); the
# sampler rank there is lost, its requests go to rank 0, `glint run`
# starts process 1 again and the driver admits it, and the sampler group
# (--sampler-max-restarts 1) spawns rank 1 again, on node 1 if it is back by
# the next weight sync, else on node 0; it samples once that sync reached it. metrics.jsonl must equal
# the uninterrupted run's, row by row (rewards, lengths and counts exactly;
# loss and grad_norm to 1e-5 relative, the sampler's batches differing
# after the kill), and no run may take longer than 120 s.
# Prints one line per run, then chaos_runs, chaos_hangs, chaos_mismatches
# and chaos_failures; exits non-zero if any run hung, failed or differed.
set -uo pipefail
# Each process picks its matmul backend by timing both (kernels.cpp); on a
# loaded machine two runs can pick differently and round differently (a grad
# norm 1e-5 apart). Pin it: what is compared here is the fault, not the backend.
export GLINT_MATMUL=aten
runs=${1:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
glint=${GLINT:-$here/${GLINT_BUILD_DIR:-build}/launcher/glint}
source "$here/scripts/fault_lib.sh"  # tiny_setup, same_metrics, find_rank
[[ -x $glint ]] || { echo "chaos: no glint binary at $glint; build first (scripts/build.sh)" >&2; exit 2; }
root=$(mktemp -d /tmp/glint-chaos-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"

tiny_setup "$glint" 300 100 || exit 1
steps=20
grpo=(grpo --model sft/last --dataset arith.jsonl --max-tokens 16 --max-prompt-length 64 --prompts-per-step 8
      --num-generations 4 --lr 1e-3 --max-steps $steps --sampler-dp 2 --sampler-max-restarts 1)

"$glint" run --nproc 2 -- "$glint" "${grpo[@]}" --output reference > reference.log 2>&1 \
  || { cat reference.log; echo "chaos: the uninterrupted run failed" >&2; exit 1; }

# rows DIR: the steps DIR/metrics.jsonl has (0 before it exists).
rows() { { wc -l < "$1/metrics.jsonl"; } 2>/dev/null || echo 0; }

hangs=0 mismatches=0 failures=0 respawned=0
for ((i = 1; i <= runs; i++)); do
  at=$((1 + RANDOM % 14))
  out=run$i
  timeout -s KILL 120 "$glint" run --nproc 2 --max-restarts 1 -- "$glint" "${grpo[@]}" --output $out > $out.log 2>&1 &
  job=$!
  # Find process 1 (by its GLINT_RANK) first: scanning /proc takes longer
  # than a step. Then wait for step `at` to end and kill it at once.
  victim=$(find_rank $out 1 $job)
  for ((t = 0; t < 2400; t++)); do
    # metrics.jsonl gets a row per step as it ends (the log is buffered).
    (($(rows $out) >= at)) && break
    kill -0 $job 2>/dev/null || break
    sleep 0.02
  done
  # The step the run was at (rows written) when the kill came.
  killed_after=$(rows $out)
  [[ -n $victim ]] && kill -KILL "$victim"
  wait $job
  code=$?
  if [[ -z $victim ]]; then
    outcome="NOT KILLED (the run ended first)"; failures=$((failures + 1))
  elif [[ $code == 137 ]]; then
    outcome="HUNG (killed after 120 s)"; hangs=$((hangs + 1))
  elif [[ $code != 0 ]]; then
    outcome="FAILED (exit $code): $(grep -m1 -i "error\|glint:" $out.log)"; failures=$((failures + 1))
  elif why=$(same_metrics reference/metrics.jsonl $out/metrics.jsonl); then
    outcome="same metrics as the uninterrupted run"
    if where=$(grep -m1 -o "respawned as rank 1 of group 'sampler' on node [0-9]*" $out.log); then
      outcome+="; sampler rank 1 respawned on ${where##* on }"
      respawned=$((respawned + 1))
    else
      outcome+="; sampler rank 1 not respawned (the run ended first)"
    fi
  else
    outcome="DIFFERENT metrics: $why"; mismatches=$((mismatches + 1))
  fi
  echo "chaos run $i: SIGKILL to process 1 after step $killed_after (aimed at $at): $outcome"
done
echo "chaos_runs: $runs"
echo "chaos_hangs: $hangs"
echo "chaos_mismatches: $mismatches"
echo "chaos_failures: $failures"
echo "chaos_respawns: $respawned"
[[ $hangs == 0 && $mismatches == 0 && $failures == 0 ]]
