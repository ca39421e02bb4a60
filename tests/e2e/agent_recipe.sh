#!/usr/bin/env bash
# `glint grpo --env` end to end: a tiny model with a chat template that
# writes tool calls, an SFT warm-up on calculator episodes (some answers
# call the tool, some do not), then multi-turn GRPO in builtin:calculator.
# Under training the share of episodes that call the calculator well and
# the accuracy both rise (the curves are printed, and docs/rl.md shows a
# run of them); a command environment in Python runs the same loop, and
# one that crashes ends its episodes with a named error while the run goes
# on; --max-staleness 1 trains asynchronously; bad flags are refused with
# one line and no run directory.
#   agent_recipe.sh GLINT_BINARY
set -euo pipefail
glint=$1 recipe=grpo
source "$(dirname "$0")/recipe_lib.sh"
root=$(mktemp -d /tmp/glint-agent-recipe-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"

"$glint" init-data calculator calc.jsonl --rows 1200 --max-operand 99 --tool-share 0.5 --seed 1 > /dev/null
"$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 600 \
  --max-positions 512 --tokenizer-from calc.jsonl --chat-template tools > init.log 2>&1 || { cat init.log; exit 1; }

# 1. The warm-up: the assistant's turns, its tool calls included, are learned.
"$glint" sft --model model --dataset calc.jsonl --train-type full --lr 3e-3 --batch-size 32 --max-steps 300 \
  --lr-scheduler constant --max-length 384 --output runs/sft > sft.log 2>&1 || { cat sft.log; fail "the SFT warm-up"; }

# 2. Multi-turn GRPO in the built-in calculator.
common=(--dataset calc.jsonl --layout gsm8k --env builtin:calculator --max-turns 3 --max-tokens 64
        --max-prompt-length 256 --num-generations 8 --train-type full)
"$glint" grpo --model runs/sft/last "${common[@]}" --prompts-per-step 8 --lr 1e-3 --max-steps 40 \
  --output runs/calc > calc.log 2>&1 || { cat calc.log; fail "the calculator GRPO run"; }
m=runs/calc/metrics.jsonl
for k in reward/total/mean env/tool_calls_valid/mean turns/mean tool_calls/mean end/done prefix_cache/hit_rate \
         observation_tokens/mean; do
  grep -q "\"$k\"" $m || fail "metrics.jsonl has no $k"
done
echo "step  reward  tool_calls_valid  turns  (glint grpo --env builtin:calculator)"
python3 - $m <<'EOF'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "reward/total/mean" in r:
        print("%4d  %.3f   %.3f             %.2f" % (r["step"], r["reward/total/mean"], r["env/tool_calls_valid/mean"], r["turns/mean"]))
EOF
acc0=$(mean $m reward/total/mean 1 8) acc1=$(mean $m reward/total/mean 33 40)
tool0=$(mean $m env/tool_calls_valid/mean 1 8) tool1=$(mean $m env/tool_calls_valid/mean 33 40)
echo "accuracy $acc0 -> $acc1, valid tool calls per episode $tool0 -> $tool1"
awk -v a="$acc0" -v b="$acc1" 'BEGIN {exit !(b > a + 0.1)}' || fail "the accuracy did not rise ($acc0 -> $acc1)"
awk -v a="$tool0" -v b="$tool1" 'BEGIN {exit !(b > a + 0.1)}' || fail "the tool use did not rise ($tool0 -> $tool1)"
hit=$(mean $m prefix_cache/hit_rate 1 40)
awk -v h="$hit" 'BEGIN {exit !(h > 0.5)}' || fail "the prefix cache served too little of the later turns ($hit)"

# 3. A command environment in Python: the same calculator over JSON lines;
#    then one that crashes at its first step: every episode ends with the
#    error, reward 0, and the run goes on.
cat > env.py <<'EOF'
import json, sys
answer = None
for line in sys.stdin:
    req = json.loads(line)
    if req["type"] == "reset":
        answer = req["row"]["answer"].rsplit("####", 1)[1].strip()
        print(json.dumps({"messages": [{"role": "user", "content": req["row"]["question"]}]}), flush=True)
    else:
        content = req["message"]["content"]
        print(json.dumps({"messages": [], "reward": 1.0 if content.strip().endswith(answer) else 0.0, "done": True,
                          "metrics": {"chars": len(content)}}), flush=True)
EOF
"$glint" grpo --model runs/sft/last "${common[@]/builtin:calculator/python3 env.py}" --prompts-per-step 4 --max-steps 2 \
  --output runs/cmd > cmd.log 2>&1 || { cat cmd.log; fail "the command environment's run"; }
grep -q '"env/chars/mean"' runs/cmd/metrics.jsonl || fail "the environment's own metrics are not recorded"
grep -q '"role":"assistant"' runs/cmd/episodes.jsonl || fail "episodes.jsonl does not show the episodes"
echo 'import sys; sys.stdin.readline(); print("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", flush=True); sys.stdin.readline(); sys.exit(3)' > crash.py
"$glint" grpo --model runs/sft/last "${common[@]/builtin:calculator/python3 crash.py}" --prompts-per-step 4 --max-steps 2 \
  --output runs/crash > crash.log 2>&1 || { cat crash.log; fail "a crashing environment stopped the run"; }
python3 - runs/crash/metrics.jsonl <<'EOF' || fail "a crashing environment's episodes are not ended as errors"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "end/error" in l]
# Every episode whose turn ended (not cut at --max-tokens) met the crash.
assert len(rows) == 2 and all(r["end/error"] + r["end/length"] == 1 and r["end/error"] > 0.5 and
                              r["reward/total/mean"] == 0 for r in rows), rows
EOF

# 4. Asynchronous: the pipeline runs the episodes of the next step while this one trains.
"$glint" grpo --model runs/sft/last "${common[@]}" --prompts-per-step 4 --max-steps 4 --max-staleness 1 \
  --loss decoupled_ppo --output runs/async > async.log 2>&1 || { cat async.log; fail "the asynchronous run"; }
python3 - runs/async/metrics.jsonl <<'EOF' || fail "the asynchronous run's staleness is out of bounds"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "staleness/max" in l]
assert len(rows) == 4 and all(r["staleness/max"] <= 1 for r in rows) and all(r["turns/mean"] >= 1 for r in rows), rows
EOF

# 4b. A resume continues an episode run from its checkpoint.
"$glint" grpo --model runs/sft/last "${common[@]}" --prompts-per-step 4 --max-steps 2 --output runs/resume > r1.log 2>&1 \
  || { cat r1.log; fail "the run to resume"; }
"$glint" grpo --model runs/sft/last "${common[@]}" --prompts-per-step 4 --max-steps 3 --resume --output runs/resume \
  > r2.log 2>&1 || { cat r2.log; fail "the resumed run"; }
[[ $(grep -c '"turns/mean"' runs/resume/metrics.jsonl) == 3 ]] || fail "the resumed run did not add step 3"

# 5. Bad flags: one line, a non-zero exit, no run directory.
expect_refusal env-and-reward "leave out --reward" --model runs/sft/last "${common[@]}" --reward accuracy
expect_refusal turns-without-env "give --env too" --model runs/sft/last --dataset calc.jsonl --layout gsm8k --max-prompt-length 256 \
  --max-tokens 64 --max-turns 2
expect_refusal unknown-builtin "builtin" --model runs/sft/last "${common[@]/builtin:calculator/builtin:chess}"
expect_refusal env-and-stop "does not apply with --env" --model runs/sft/last "${common[@]}" --stop "####"
expect_refusal env-and-weights "does not apply with --env" --model runs/sft/last "${common[@]}" --reward-weights 2
echo "agent recipe: ok"
