#!/usr/bin/env bash
# A lost model rank restarts the run from its newest checkpoint (grpo, sft, dpo).
#
#   tests/e2e/model_restart.sh GLINT
#
# `glint grpo --dp 2` under `glint run --nproc 2 --max-restarts 1`: model
# rank 1 lives in process 1. SIGKILL to process 1 after step 3 poisons the
# model group's collective; with --model-max-restarts 1 the run starts again
# from checkpoint 2 once glint run has the process back, and ends with the
# metrics.jsonl rows and the adapter of a run never interrupted. With
# --model-max-restarts 0 the same kill ends the job with a non-zero code and
# a line naming the node and why. The same for glint sft and glint dpo, and
# for an SFT run whose process 1 is frozen for a while instead of killed.
set -uo pipefail
source "$(cd "$(dirname "$0")/../../scripts" && pwd)/fault_lib.sh"  # tiny_setup, same_metrics, find_rank
# Each process picks its matmul backend by timing both (kernels.cpp); pin it:
# what is compared here is the restart, not the backend.
export GLINT_MATMUL=aten
glint=${1:?usage: model_restart.sh GLINT}
fail() { echo "model_restart: FAILED: $*" >&2; exit 1; }
root=$(mktemp -d /tmp/glint-model-restart-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"
tiny_setup "$glint" 200 40 || fail "the tiny model set-up"
base=(grpo --model sft/last --dataset arith.jsonl --max-tokens 16 --max-prompt-length 64 --prompts-per-step 8
      --num-generations 4 --lr 1e-3 --max-steps 8 --dp 2)
grpo=("${base[@]}" --save-every 2)

"$glint" run --nproc 2 -- "$glint" "${grpo[@]}" --output reference > reference.log 2>&1 \
  || { cat reference.log; fail "the uninterrupted run"; }
grep -q "2 model rank(s) on node 0,1" reference.log || { cat reference.log; fail "model rank 1 is not in process 1"; }


# tensors A B: the safetensors files hold the same tensors: bit for bit, or
# (f32) within 1e-6 of the largest value, as two fresh runs can differ in the
# last bits (docs/recipes.md, "Resuming"); says which.
tensors() {
  python3 - "$1" "$2" << 'PY'
import array, json, struct, sys
def load(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
if a.keys() != b.keys(): print("other tensor names"); sys.exit(1)
worst = 0.0
for k in a:
    (da, sa, xa), (db, sb, xb) = a[k], b[k]
    if (da, sa) != (db, sb): print(f"tensor {k}: {da}{sa} against {db}{sb}"); sys.exit(1)
    if xa == xb: continue
    if da != "F32": print(f"tensor {k} differs"); sys.exit(1)
    fa, fb = array.array("f", xa), array.array("f", xb)
    scale = max(1.0, max(abs(v) for v in fa))
    d = max(abs(p - q) for p, q in zip(fa, fb)) / scale
    if d > 1e-6: print(f"tensor {k} differs by {d:.3g} of its largest value"); sys.exit(1)
    worst = max(worst, d)
print(f"{len(a)} tensors " + ("bit for bit" if worst == 0 else f"within {worst:.2g}"))
PY
}

# killed NAME ROWS RECIPE...: the recipe's job (--output NAME), process 1
# killed once step ROWS is written; sets code. With FREEZE=S set, process 1
# is frozen (SIGSTOP) instead, and thawed S seconds later.
killed() {
  local out=$1 rows=$2; shift 2
  timeout -s KILL 300 "$glint" run --nproc 2 --max-restarts 1 -- "$glint" "$@" --output $out > $out.log 2>&1 &
  local job=$! victim t
  victim=$(find_rank $out 1 $job) || { wait $job; cat $out.log; fail "$out: process 1 not found"; }
  for ((t = 0; t < 3000; t++)); do
    (($({ wc -l < $out/metrics.jsonl; } 2> /dev/null || echo 0) >= rows)) && break
    kill -0 $job 2> /dev/null || break
    sleep 0.02
  done
  if [[ -n ${FREEZE:-} ]]; then
    kill -STOP $victim
    sleep "$FREEZE"
    kill -CONT $victim
  else
    kill -KILL $victim
  fi
  wait $job
  code=$?
}

# uninterrupted NAME RECIPE...: the recipe's job, never killed, in NAME.
uninterrupted() {
  local out=$1; shift
  "$glint" run --nproc 2 -- "$glint" "$@" --output $out > $out.log 2>&1 || { cat $out.log; fail "$out: the uninterrupted run"; }
}

# came_back REF OUT FILE: OUT's job (after `killed`) exited 0 after a restart
# of the model group, with REF's metrics rows and final last/FILE; sets why
# (how the tensors compare).
came_back() {
  local ref=$1 out=$2 file=$3
  ((code == 0)) || { tail -n 20 $out.log; fail "$out: with --model-max-restarts 1 the job exited $code"; }
  grep -q "the model group lost node 1 .*restarting the run from its newest checkpoint" $out.log \
    || { cat $out.log; fail "$out: no restart of the model group in the log"; }
  why=$(same_metrics $ref/metrics.jsonl $out/metrics.jsonl) || fail "$out: metrics after the restart: $why"
  why=$(tensors $ref/last/$file $out/last/$file) || fail "$out: the final $file after the restart: $why"
}

killed restarted 3 "${grpo[@]}" --model-max-restarts 1
came_back reference restarted adapter_model.safetensors
grep -q "resumed at step [2-8]" restarted.log || { cat restarted.log; fail "the second try did not resume from a checkpoint"; }
echo "model_restart: process 1 killed after step 3: $(grep -o 'resumed at step [0-9]*' restarted.log | head -1); the same metrics and final adapter ($why)"

# Killed before its first checkpoint, with a validation set: the second try
# starts afresh, its step-0 evaluation row written once.
early=("${base[@]}" --val-split 0.1 --eval-every 100 --save-every 100)
uninterrupted early_reference "${early[@]}"
killed early 3 "${early[@]}" --model-max-restarts 1
((code == 0)) || { tail -n 20 early.log; fail "killed before any checkpoint, the job exited $code"; }
grep -q "restarting the run from its newest checkpoint" early.log || { cat early.log; fail "no restart before any checkpoint"; }
why=$(same_metrics early_reference/metrics.jsonl early/metrics.jsonl) || fail "after a restart before any checkpoint: $why"
echo "model_restart: killed before the first checkpoint (validation set on): the run started afresh, the same metrics"

killed given_up 3 "${grpo[@]}" --model-max-restarts 0
((code != 0 && code != 137)) || { tail -n 20 given_up.log; fail "with --model-max-restarts 0 the job exited $code (want: it fails)"; }
grep -q "the model group lost node 1 .*not restarting it (--model-max-restarts 0)" given_up.log \
  || { cat given_up.log; fail "the failure does not name the node and why"; }
echo "model_restart: without restarts the same kill fails the job (exit $code): $(grep -o 'the model group lost node 1.*' given_up.log | head -1)"

# glint sft, full training: the same with its model.safetensors.
sft=(sft --model model --dataset arith.jsonl --train-type full --lr 3e-3 --batch-size 32 --max-steps 60
     --lr-scheduler constant --dp 2 --save-every 5)
uninterrupted sft_reference "${sft[@]}"
killed sft_restarted 8 "${sft[@]}" --model-max-restarts 1
came_back sft_reference sft_restarted model.safetensors
echo "model_restart: sft, process 1 killed after step 8: $(grep -o 'resumed at step [0-9]*' sft_restarted.log | head -1); the same metrics and final model ($why)"

# glint dpo (LoRA, the reference log-probs from the same group): the same.
awk 'BEGIN{srand(1); for(i=0;i<120;i++){a=int(rand()*9);b=int(rand()*9);w=int(rand()*18);
  printf("{\"prompt\": \"%d + %d = ?\", \"chosen\": \"%d + %d = %d\", \"rejected\": \"%d + %d = %d\"}\n",a,b,a,b,a+b,a,b,w)}}' > pairs.jsonl
dpo=(dpo --model model --dataset pairs.jsonl --lr 5e-3 --beta 0.5 --batch-size 8 --max-steps 40 --dp 2 --save-every 3)
uninterrupted dpo_reference "${dpo[@]}"
killed dpo_restarted 8 "${dpo[@]}" --model-max-restarts 1
came_back dpo_reference dpo_restarted adapter_model.safetensors
echo "model_restart: dpo, process 1 killed after step 8: $(grep -o 'resumed at step [0-9]*' dpo_restarted.log | head -1); the same metrics and final adapter ($why)"

# Frozen, not killed: process 1 SIGSTOPped after step 8 and thawed 8 s later
# (peer timeout 5 s). Model rank 0's all-reduce gives up on the silent rank
# within the peer timeout (not Gloo's 5 minutes), the driver drops node 1,
# the thawed process finds it was dropped and exits 75, glint run starts it
# again, and the run resumes from its checkpoint: the same metrics and model.
start=$(date +%s)
FREEZE=8 killed sft_frozen 8 "${sft[@]}" --model-max-restarts 1
took=$(($(date +%s) - start))
came_back sft_reference sft_frozen model.safetensors
grep -q "process 1 (pid [0-9]*) lost its driver (exit code 75); starting it again" sft_frozen.log \
  || { cat sft_frozen.log; fail "the thawed process was not started again"; }
((took < 60)) || fail "the frozen run took $took s: something waited for a timeout longer than the peer timeout"
echo "model_restart: sft, process 1 frozen for 8 s after step 8: dropped, thawed, started again, $(grep -o 'resumed at step [0-9]*' sft_frozen.log | head -1); the same metrics and final model ($why); $took s in all"
