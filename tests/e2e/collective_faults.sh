#!/usr/bin/env bash
# Collectives fail at once (docs/faults.md): for each kind of model
# group (dp=2, fsdp=2, tp=2, pp=2; `glint sft` under `glint run --nproc 2`,
# model rank 1 in process 1), process 1 is killed, then, in a second job,
# frozen (SIGSTOP, never thawed) after step 3. Rank 0's call fails, naming
# rank 1: within 3 s of a kill, and within the peer timeout (5 s by default)
# plus 3 s of a freeze; none waits out Gloo's collective timeout (a minute).
# The job then ends with a non-zero code.
#   collective_faults.sh GLINT
set -uo pipefail
source "$(cd "$(dirname "$0")/../../scripts" && pwd)/fault_lib.sh"  # find_rank
glint=${1:?usage: collective_faults.sh GLINT}
fail() { echo "collective_faults: FAILED: $*" >&2; exit 1; }
root=$(mktemp -d /tmp/glint-collective-faults-XXXXXX)
victims=()
trap 'for v in "${victims[@]}"; do kill -KILL "$v" 2> /dev/null; done; rm -rf "$root"' EXIT
cd "$root"
"$glint" init-data arithmetic arith.jsonl --rows 200 --max-operand 9 --seed 1 > setup.log 2>&1 &&
  "$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 \
    --vocab 400 --max-positions 256 --tokenizer-from arith.jsonl >> setup.log 2>&1 || { cat setup.log; fail "set-up"; }
now() { date +%s.%N; }

# broken MESH HOW BOUND: the job of MESH (dp=2 is --dp 2), process 1 hit by
# HOW (kill or freeze) once 3 steps are written; fails unless rank 0's call
# fails naming rank 1 within BOUND seconds and the job then ends non-zero.
broken() {
  local mesh=$1 how=$2 bound=$3 out=${1/=/}_$2 args
  if [[ $mesh == dp=2 ]]; then args=(--dp 2); else args=(--mesh "$mesh"); fi
  # --max-restarts 1: `glint run` does not stop the job the moment process 1
  # dies (its SIGTERM could end the driver before it says why); it would
  # start process 1 again, and the driver, which does not restart its model
  # group, fails the job itself.
  timeout -s KILL 120 "$glint" run --nproc 2 --max-restarts 1 -- "$glint" sft --model model --dataset arith.jsonl --train-type full \
    --lr 3e-3 --batch-size 32 --max-steps 5000 --lr-scheduler constant "${args[@]}" --output $out > $out.log 2>&1 &
  local job=$! victim t t0 t1 code
  victim=$(find_rank $out 1 $job) || { wait $job; cat $out.log; fail "$out: process 1 not found"; }
  victims+=("$victim")
  for ((t = 0; ; t++)); do
    (($({ wc -l < $out/metrics.jsonl; } 2> /dev/null || echo 0) >= 3)) && break
    kill -0 $job 2> /dev/null || { cat $out.log; fail "$out: the job ended before step 3"; }
    ((t < 3000)) || { kill -KILL $job; cat $out.log; fail "$out: no step 3 within 60 s"; }
    sleep 0.02
  done
  t0=$(now)
  if [[ $how == kill ]]; then kill -KILL $victim; else kill -STOP $victim; fi
  # The driver's line for the failed call ("glint sft: forward_backward at
  # step 4: unavailable: ...", or the optimizer step's).
  local failed="^glint sft: [^:]* at [a-z ]*[0-9]*: unavailable: "
  for ((t = 0; t < 3000; t++)); do
    grep -q "$failed" $out.log && break
    kill -0 $job 2> /dev/null || break
    sleep 0.02
  done
  t1=$(now)
  # A machine that hangs stays frozen; `glint run` would give the process
  # 15 s to stop before it kills it. What is tested ends here.
  kill -KILL $victim 2> /dev/null
  wait $job
  code=$?
  kill -KILL $victim 2> /dev/null
  local line took
  line=$(grep -m1 "$failed" $out.log) || { cat $out.log; fail "$out: no failed call in the log"; }
  took=$(awk -v a=$t0 -v b=$t1 'BEGIN{printf "%.2f", b - a}')
  awk -v t=$took -v b=$bound 'BEGIN{exit !(t <= b)}' || { cat $out.log; fail "$out: the call failed ${took} s after the $how (bound ${bound} s)"; }
  [[ $line == *"rank 1 "* ]] || { cat $out.log; fail "$out: the error does not name rank 1: $line"; }
  ((code != 0 && code != 137)) || { tail -20 $out.log; fail "$out: the job exited $code (want: it fails, by itself)"; }
  local done_to=killed
  [[ $how == kill ]] || done_to=frozen
  echo "collective_faults: $mesh, process 1 $done_to: rank 0's call failed after $took s (bound $bound s), exit $code: ${line#glint sft: }"
}

for mesh in dp=2 fsdp=2 tp=2 pp=2; do
  broken $mesh kill 3
  broken $mesh freeze 8
done
echo "collective_faults: 8 jobs, every call failed in time naming rank 1"
