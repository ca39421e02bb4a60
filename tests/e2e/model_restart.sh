#!/usr/bin/env bash
# A lost model rank restarts the run from its newest checkpoint (grpo, sft).
#
#   tests/e2e/model_restart.sh GLINT
#
# `glint grpo --dp 2` under `glint run --nproc 2 --max-restarts 1`: model
# rank 1 lives in process 1. SIGKILL to process 1 after step 3 poisons the
# model group's collective; with --model-max-restarts 1 the run starts again
# from checkpoint 2 once glint run has the process back, and ends with the
# metrics.jsonl rows and the adapter of a run never interrupted. With
# --model-max-restarts 0 the same kill ends the job with a non-zero code and
# a line naming the node and why.
set -uo pipefail
source "$(cd "$(dirname "$0")/../../scripts" && pwd)/fault_lib.sh"  # same_metrics, find_rank
# Each process picks its matmul backend by timing both (kernels.cpp); pin it:
# what is compared here is the restart, not the backend.
export GLINT_MATMUL=aten
glint=${1:?usage: model_restart.sh GLINT}
fail() { echo "model_restart: FAILED: $*" >&2; exit 1; }
root=$(mktemp -d /tmp/glint-model-restart-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"
"$glint" init-data arithmetic arith.jsonl --rows 200 --max-operand 9 --seed 1 > /dev/null
"$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 400 \
  --max-positions 256 --tokenizer-from arith.jsonl > setup.log 2>&1 || { cat setup.log; fail "init-model"; }
"$glint" sft --model model --dataset arith.jsonl --train-type full --lr 3e-3 --batch-size 32 --max-steps 40 \
  --lr-scheduler constant --output sft >> setup.log 2>&1 || { cat setup.log; fail "sft"; }
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
# killed once step ROWS is written; sets code.
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
  kill -KILL $victim
  wait $job
  code=$?
}

killed restarted 3 "${grpo[@]}" --model-max-restarts 1
((code == 0)) || { tail -n 20 restarted.log; fail "with --model-max-restarts 1 the job exited $code"; }
grep -q "the model group lost node 1 .*restarting the run from its newest checkpoint (restart 1 of 1)" restarted.log \
  || { cat restarted.log; fail "no restart of the model group in the log"; }
grep -q "resumed at step [2-8]" restarted.log || { cat restarted.log; fail "the second try did not resume from a checkpoint"; }
why=$(same_metrics reference/metrics.jsonl restarted/metrics.jsonl) || fail "metrics after the restart: $why"
why=$(tensors reference/last/adapter_model.safetensors restarted/last/adapter_model.safetensors) \
  || fail "the final adapter after the restart: $why"
echo "model_restart: process 1 killed after step 3: $(grep -o 'resumed at step [0-9]*' restarted.log | head -1); the same metrics and final adapter ($why)"

# Killed before its first checkpoint, with a validation set: the second try
# starts afresh, its step-0 evaluation row written once.
early=("${base[@]}" --val-split 0.1 --eval-every 100 --save-every 100)
"$glint" run --nproc 2 -- "$glint" "${early[@]}" --output early_reference > early_reference.log 2>&1 \
  || { cat early_reference.log; fail "the uninterrupted run with a validation set"; }
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
"$glint" run --nproc 2 -- "$glint" "${sft[@]}" --output sft_reference > sft_reference.log 2>&1 \
  || { cat sft_reference.log; fail "the uninterrupted sft run"; }
killed sft_restarted 8 "${sft[@]}" --model-max-restarts 1
((code == 0)) || { tail -n 20 sft_restarted.log; fail "sft with --model-max-restarts 1 exited $code"; }
grep -q "the model group lost node 1 .*restarting the run from its newest checkpoint" sft_restarted.log \
  || { cat sft_restarted.log; fail "sft: no restart of the model group in the log"; }
why=$(same_metrics sft_reference/metrics.jsonl sft_restarted/metrics.jsonl) || fail "sft metrics after the restart: $why"
why=$(tensors sft_reference/last/model.safetensors sft_restarted/last/model.safetensors) \
  || fail "sft: the final model after the restart: $why"
echo "model_restart: sft, process 1 killed after step 8: $(grep -o 'resumed at step [0-9]*' sft_restarted.log | head -1); the same metrics and final model ($why)"
