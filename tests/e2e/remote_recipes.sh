#!/usr/bin/env bash
# The recipes against `glint serve`: `glint sft`, `glint dpo` and `glint grpo`
# run with GLINT_REMOTE_URL attach to the server's base model instead of
# spawning one (LoRA, the data and checkpoints on the driver's side) and
# write the metrics rows of the same run in local mode (to rounding; not
# the timings), last/ is a PEFT adapter directory, and the run's adapter is
# removed from the server at the end (a second run of each reuses the name).
#   remote_recipes.sh GLINT_BINARY
set -euo pipefail
source "$(dirname "$0")/serve_lib.sh"
glint=$1
temp_root remote-recipes
cd "$root"
mkdir local
awk 'BEGIN{srand(1); for(i=0;i<60;i++){a=int(rand()*20);b=int(rand()*20);w=a+b+1;
  printf("{\"prompt\": \"What is %d plus %d?\", \"chosen\": \"%d plus %d is %d.\", \"rejected\": \"%d plus %d is %d.\", \"question\": \"What is %d plus %d?\", \"answer\": \"%d plus %d is %d. #### %d\"}\n",a,b,a,b,a+b,a,b,w,a,b,a,b,a+b,a+b)}}' > rows.jsonl
tiny_base "$glint"
fail() { echo "FAIL: $*"; exit 1; }
declare -A cmds=(
  [sft]="sft --layout gsm8k --lr 3e-3 --max-steps 6 --batch-size 4"
  [dpo]="dpo --layout prompt --lr 5e-3 --beta 0.5 --max-steps 6 --batch-size 4"
  [grpo]="grpo --layout gsm8k --lr 1e-4 --max-steps 2 --max-prompt-length 64 --prompts-per-step 2 --num-generations 4 --max-tokens 16"
)
for r in sft dpo grpo; do
  # shellcheck disable=SC2086
  "$glint" ${cmds[$r]} --model local/model --dataset rows.jsonl --output "runs/local-$r" > "local-$r.log" 2>&1 \
    || { cat "local-$r.log"; fail "the local $r run"; }
done
start_server "$glint" "$root"
key=$(new_key "$glint" "$root" alice)
for r in sft dpo grpo; do
  # shellcheck disable=SC2086
  GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$key "$glint" ${cmds[$r]} --model local/model --dataset rows.jsonl \
    --output "runs/remote-$r" > "remote-$r.log" 2>&1 || { cat "remote-$r.log"; tail -20 serve.err; fail "the remote $r run"; }
  [[ -f runs/remote-$r/last/adapter_model.safetensors ]] || fail "the remote $r run wrote no last/ adapter"
  python3 - "runs/local-$r/metrics.jsonl" "runs/remote-$r/metrics.jsonl" "$r" <<'PY' || fail "the remote $r run's metrics differ"
import json, math, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) and a, (len(a), len(b))
def rounding(v):
    return 0.5 * 10 ** (math.floor(math.log10(abs(v))) - 5) if v else 0
for x, y in zip(a, b):
    assert x.keys() == y.keys(), (x.keys(), y.keys())
    for k in x:
        timing = "per_second" in k or "seconds" in k or k.endswith("_s") or k.endswith("_ms")
        if isinstance(x[k], (int, float)) and not timing:
            assert abs(x[k] - y[k]) <= 1e-5 + rounding(x[k]) + rounding(y[k]), (sys.argv[3], x["step"], k, x[k], y[k])
print(sys.argv[3], "remote rows equal the local run's over", len(a), "steps")
PY
done
grep -q "tenant=alice method=remove_adapter .*outcome=ok" serve.err || fail "no run removed its adapter from the server"
# A run killed mid-way leaves its adapter on the server; the rerun of that run replaces it.
remote() { GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$key "$glint" "$@"; }
(export GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$key
 exec "$glint" sft --layout gsm8k --model local/model --dataset rows.jsonl --max-steps 500 --output runs/killed) > killed.log 2>&1 &
driver=$!
for _ in $(seq 300); do [[ -s runs/killed/metrics.jsonl ]] && break; sleep 0.1; done
kill -9 "$driver"; wait "$driver" 2>/dev/null || true
[[ -s runs/killed/metrics.jsonl ]] || fail "the run to kill did not start"
remote sft --layout gsm8k --model local/model --dataset rows.jsonl --max-steps 2 --output runs/killed --overwrite > rerun.log 2>&1 \
  || { cat rerun.log; fail "the rerun of a killed run"; }
grep -q "replacing the adapter glint-killed-[0-9a-f]\{8\} " rerun.log || { cat rerun.log; fail "the rerun did not replace the killed run's adapter"; }
grep -q "tenant=alice method=forward_backward" serve.err || { echo "no call log line"; tail serve.err; exit 1; }
echo "remote recipes: ok"
