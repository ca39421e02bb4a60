# Shared by the fault tests (scripts/chaos.sh, tests/e2e/netns_grpo.sh,
# tests/e2e/model_restart.sh). Source it; it defines:
#
#   same_metrics A B      0 when two metrics.jsonl agree row by row (timing
#                         fields aside; loss to 1e-5, grad_norm to 1e-4, other
#                         floats to 1e-9); else prints the first difference.
#                         A run whose sampler process died has its rows
#                         sampled by another rank, batched with other rows:
#                         the same tokens, log-probs that round differently,
#                         and a gradient norm that moves by up to 1.3e-5
#                         (seen once in six runs); a different token would
#                         move the loss by far more.
#   tiny_setup GLINT ROWS STEPS  in the current directory: arith.jsonl (ROWS
#                         generated rows), a tiny Qwen3 model in model/ and a
#                         copy trained by STEPS of full SFT in sft/last; 1
#                         (its log shown) when a step fails.
#   find_rank OUT RANK JOB  the pid of process RANK of the `glint run` job
#                         whose command has `--output OUT` (found by its
#                         GLINT_RANK in /proc: procps is not on every
#                         machine), waiting up to 30 s while JOB runs.

same_metrics() {
  python3 - "$1" "$2" << 'PY'
import json, math, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
timing = ("tokens_per_second", "weight_sync_seconds", "step_seconds", "seconds")
def differs(x, y, key):
    if isinstance(x, float) or isinstance(y, float):
        if x is None or y is None: return True
        rel = {"loss": 1e-5, "grad_norm": 1e-4}.get(key, 1e-9)
        tol = rel * max(1.0, abs(x), abs(y)) if key in ("loss", "grad_norm") else rel * max(1.0, abs(x))
        return not math.isclose(x, y, rel_tol=0, abs_tol=tol)
    return x != y
if len(a) != len(b):
    print(f"{len(b)} rows against {len(a)}"); sys.exit(1)
for ra, rb in zip(a, b):
    for k in sorted(set(ra) | set(rb)):
        if k in timing or any(k.endswith(t) for t in timing):
            continue
        if k not in ra or k not in rb or differs(ra[k], rb[k], k):
            print(f"step {ra.get('step')}: {k} {ra.get(k)} against {rb.get(k)}"); sys.exit(1)
PY
}

find_rank() {
  local out=$1 rank=$2 job=$3 t d
  for ((t = 0; t < 600; t++)); do
    for d in /proc/[0-9]*; do
      { tr '\0' ' ' < "$d/cmdline"; } 2> /dev/null | grep -q -- "--output $out " || continue
      if { tr '\0' '\n' < "$d/environ"; } 2> /dev/null | grep -qx "GLINT_RANK=$rank"; then
        echo "${d#/proc/}"
        return 0
      fi
    done
    kill -0 "$job" 2> /dev/null || return 1
    sleep 0.05
  done
  return 1
}

tiny_setup() {
  local glint=$1 rows=$2 steps=$3
  "$glint" init-data arithmetic arith.jsonl --rows "$rows" --max-operand 9 --seed 1 > setup.log 2>&1 \
    && "$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 \
      --vocab 400 --max-positions 256 --tokenizer-from arith.jsonl >> setup.log 2>&1 \
    && "$glint" sft --model model --dataset arith.jsonl --train-type full --lr 3e-3 --batch-size 32 \
      --max-steps "$steps" --lr-scheduler constant --output sft >> setup.log 2>&1 \
    || { cat setup.log; return 1; }
}
