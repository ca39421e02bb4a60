#!/usr/bin/env bash
# `glint grpo` end to end on a tiny model and GSM8K-style data made here:
# a `glint sft` warm-up, then GRPO with the accuracy and format rewards and
# greedy evaluation (best/ and last/ written, the rewards and a greedy
# reward before training recorded); a reward command gets the prompts'
# fields and its scores match the built-in reward's completion by
# completion; a reward command's reward rises under training; a resumed
# run samples and scores what an uninterrupted one does; --max-staleness 2
# keeps its rows within the bound and resumes; the config file replays the
# flags; a 2-process run with --sync-every 2; bad input ends
# with one error line, a non-zero exit and no run directory.
#   grpo_recipe.sh GLINT_BINARY
set -euo pipefail
glint=$1 recipe=grpo
source "$(dirname "$0")/recipe_lib.sh"
root=$(mktemp -d /tmp/glint-grpo-recipe-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"

"$glint" init-data arithmetic arith.jsonl --rows 600 --max-operand 9 --seed 1 > /dev/null
"$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 400 \
  --max-positions 256 --tokenizer-from arith.jsonl > init.log 2>&1 || { cat init.log; exit 1; }

# 1. The warm-up (glint sft reads the question/answer rows too), then GRPO
#    from its model with the default rewards and evaluation.
"$glint" sft --model model --dataset arith.jsonl --train-type full --lr 3e-3 --batch-size 32 --max-steps 150 \
  --lr-scheduler constant --output runs/sft > sft.log 2>&1 || { cat sft.log; fail "the SFT warm-up"; }
common=(--dataset arith.jsonl --max-tokens 16 --max-prompt-length 64)
"$glint" grpo --model runs/sft/last "${common[@]}" --prompts-per-step 8 --num-generations 4 --lr 1e-3 --max-steps 10 \
  --val-split 0.05 --eval-every 5 --output runs/lora > lora.log 2>&1 || { cat lora.log; fail "the LoRA GRPO run"; }
for f in last/adapter_config.json last/adapter_model.safetensors best/adapter_model.safetensors config.toml \
         data/train.jsonl data/val.jsonl metrics.jsonl report.html checkpoint-10/model/adapter_model.safetensors; do
  [[ -f runs/lora/$f ]] || fail "runs/lora/$f is missing"
done
grep -q "greedy validation reward before training" lora.log || fail "no evaluation before training"
grep -q '"solution"' runs/lora/data/train.jsonl || fail "the prompts lost their solutions"
for k in reward/accuracy/mean reward/format/mean reward/total/mean loss grad_norm completion_length/mean; do
  grep -q "\"$k\"" runs/lora/metrics.jsonl || fail "metrics.jsonl has no $k"
done
[[ $(grep -c '"eval_reward"' runs/lora/metrics.jsonl) == 3 ]] || fail "expected evaluations at steps 0, 5 and 10"
format=$(mean runs/lora/metrics.jsonl reward/format/mean 1 10)
awk -v f="$format" 'BEGIN {exit !(f > 0.5)}' || fail "the warmed-up model should mostly answer in format (format reward $format)"

# 2. A reward command gets each prompt's fields: one that scores accuracy
#    itself, weighted -1 against the built-in one, leaves a total of 0 for
#    every completion.
cat > accuracy.py <<'EOF'
import json, sys
for line in sys.stdin:
    row = json.loads(line)
    c = row["completion"]
    try:
        right = "####" in c and float(c.rsplit("####", 1)[1].strip()) == float(row["solution"])
    except ValueError:  # no number after the marks
        right = False
    print(1 if right else 0)
EOF
"$glint" grpo --model runs/sft/last "${common[@]}" --train-type full --prompts-per-step 8 --num-generations 4 --max-steps 3 \
  --reward accuracy --reward-command "python3 accuracy.py" --reward-weights 1,-1 --output runs/cmd > cmd.log 2>&1 \
  || { cat cmd.log; fail "the reward command run"; }
python3 - runs/cmd/metrics.jsonl <<'EOF' || fail "the command's scores differ from the accuracy reward's"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3 and all(r["reward/total/std"] == 0 and r["reward/total/mean"] == 0 for r in rows), rows
assert any(r["reward/accuracy/mean"] > 0 for r in rows), "no right answer at all: the check would prove nothing"
EOF

# 2b. The model cut over two ranks (--mesh): full training on pipeline stages
#     and LoRA on an FSDP base, the weights synced to the sampler each step.
for m in "--train-type full --mesh pp=2" "--mesh fsdp=2"; do
  # shellcheck disable=SC2086
  "$glint" grpo --model runs/sft/last "${common[@]}" $m --prompts-per-step 4 --num-generations 4 --max-steps 2 \
    --output "runs/mesh-${m##* }" > mesh.log 2>&1 || { cat mesh.log; fail "grpo with $m"; }
  [[ $(wc -l < "runs/mesh-${m##* }/metrics.jsonl") == 2 ]] || fail "grpo with $m did not write 2 steps"
done

# 3. Training raises a reward: the share of digits in the completions of
#    the untrained model (a reward command, full training).
cat > digits.py <<'EOF'
import json, sys
for line in sys.stdin:
    c = json.loads(line)["completion"]
    print(sum(ch.isdigit() for ch in c) / max(len(c), 1))
EOF
"$glint" grpo --model model "${common[@]/16/12}" --train-type full --lr 3e-3 --prompts-per-step 8 --num-generations 8 \
  --max-steps 25 --reward-command "python3 digits.py" --output runs/digits > digits.log 2>&1 \
  || { cat digits.log; fail "the digits run"; }
first=$(mean runs/digits/metrics.jsonl reward/total/mean 1 5) last=$(mean runs/digits/metrics.jsonl reward/total/mean 21 25)
awk -v a="$first" -v b="$last" 'BEGIN {exit !(b > a + 0.05)}' || fail "the reward did not rise: $first -> $last"

# 4. A resumed run samples and scores what an uninterrupted one does.
args=(--model runs/sft/last "${common[@]}" --train-type full --prompts-per-step 8 --num-generations 4 --lr 1e-4
      --max-steps 8 --save-every 4 --sync-every 2)
"$glint" grpo "${args[@]}" --output runs/whole > /dev/null 2>&1 || fail "the uninterrupted run"
"$glint" grpo "${args[@]}" --output runs/cut > /dev/null 2>&1 || fail "the run to cut"
rm -rf runs/cut/checkpoint-8 runs/cut/last   # as if killed after step 7
# (1e-4 written 0.0001 is the same value: the resume takes it.)
"$glint" grpo "${args[@]/1e-4/0.0001}" --output runs/cut --resume > resume.log 2>&1 || { cat resume.log; fail "--resume"; }
grep -q "resumed at step 4" resume.log || fail "the run did not resume at step 4"
python3 - runs/whole/metrics.jsonl runs/cut/metrics.jsonl <<'EOF' || fail "the resumed run's rows differ"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 8, (len(a), len(b))
for x, y in zip(a, b):
    # Every number but the timings, to the last bit (runs are deterministic).
    for k in x:
        if not (k.endswith("_seconds") or k.endswith("per_second")):
            assert x[k] == y[k], (x["step"], k, x[k], y[k])
EOF

# 4a. Packing (the default) trains as padded batches: the first step's rows agree.
one=(--model runs/sft/last "${common[@]}" --train-type full --prompts-per-step 8 --num-generations 4 --lr 1e-4 --max-steps 1)
"$glint" grpo "${one[@]}" --output runs/packed > /dev/null 2>&1 || fail "the packed step"
"$glint" grpo "${one[@]}" --no-packing --output runs/padded > /dev/null 2>&1 || fail "the --no-packing step"
python3 - runs/packed/metrics.jsonl runs/padded/metrics.jsonl <<'EOF' || fail "a packed step differs from a padded one"
import json, sys
(a,), (b,) = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
for k in a:
    if k.startswith("reward/") or k.startswith("completion_length/"):
        assert a[k] == b[k], (k, a[k], b[k])
for k in ("loss", "grad_norm"):
    assert abs(a[k] - b[k]) <= 1e-4 * max(1, abs(b[k])), (k, a[k], b[k])
EOF

# 4b. Asynchronous: --max-staleness 2 with decoupled_ppo, evaluations in
#     between; every row within the bound; a resume continues the run.
async=(--model runs/sft/last "${common[@]}" --train-type full --prompts-per-step 8 --num-generations 4 --lr 1e-4
       --max-steps 6 --save-every 3 --val-split 0.05 --eval-every 3 --max-staleness 2 --loss decoupled_ppo)
"$glint" grpo "${async[@]}" --output runs/async > async.log 2>&1 || { cat async.log; fail "the asynchronous run"; }
python3 - runs/async/metrics.jsonl <<'EOF' || fail "the asynchronous run's rows"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["step"] > 0]
assert len(rows) == 6, rows
for r in rows:
    assert r["staleness/max"] == min(r["step"] - 1, 2), r
assert sum("eval_reward" in r for r in rows) == 2, "evaluations at steps 3 and 6"
EOF
rm -rf runs/async/checkpoint-6 runs/async/last
"$glint" grpo "${async[@]}" --output runs/async --resume > async-resume.log 2>&1 || { cat async-resume.log; fail "resuming the asynchronous run"; }
grep -q "resumed at step 3" async-resume.log || { cat async-resume.log; fail "the asynchronous run did not resume at step 3"; }
[[ -d runs/async/last ]] || fail "the resumed asynchronous run wrote no last/"

# 5. The recorded config replays the run, strings with newlines, quotes and
#    '#' included.
"$glint" grpo --model runs/sft/last "${common[@]}" --prompts-per-step 2 --num-generations 2 --max-steps 1 \
  --stop $'\n\n' --stop '#### 1 "x"' --stop 2.50 --reward accuracy,format --reward-weights 1,0.5 --output runs/tricky > tricky.log 2>&1 \
  || { cat tricky.log; fail "the run with stop strings"; }
grep -qF 'stop = ["\n\n", "#### 1 \"x\"", "2.50"]' runs/tricky/config.toml || { cat runs/tricky/config.toml; fail "stop strings recorded wrong"; }
"$glint" grpo --config runs/tricky/config.toml --output runs/again > again.log 2>&1 || { cat again.log; fail "--config"; }
diff <(grep -v '^output =' runs/tricky/config.toml) <(grep -v '^output =' runs/again/config.toml) \
  || fail "the config file did not give the same flags"

# 6. Two processes: the model and sampler groups spread over them, synced every 2 steps.
#    65 validation prompts: a last batch of one, fewer than the sampler ranks.
head -65 arith.jsonl > val65.jsonl
"$glint" run --nproc 2 -- "$glint" grpo --model runs/sft/last "${common[@]}" --prompts-per-step 8 --num-generations 4 \
  --max-steps 4 --dp 2 --sampler-dp 2 --sync-every 2 --val-dataset val65.jsonl --eval-every 2 \
  --output runs/cluster > cluster.log 2>&1 \
  || { cat cluster.log; fail "a 2-process run"; }
grep -q "on node 0,1" cluster.log || { cat cluster.log; fail "the groups did not span the two processes"; }
[[ -f runs/cluster/last/adapter_model.safetensors ]] || fail "the 2-process run wrote no last/"

# 7. A failing reward command stops the run and says why.
code=0; "$glint" grpo --model model "${common[@]}" --max-steps 2 --prompts-per-step 2 --num-generations 2 \
  --reward-command "cat > /dev/null; exit 3" --output runs/badcmd > badcmd.log 2>&1 || code=$?
[[ $code != 0 ]] && grep -q "exited with status 3" badcmd.log || { cat badcmd.log; fail "a failing reward command"; }

# 7b. A model with experts, trained on the sampler's routes (routing replay),
#     packed and padded; the flag is recorded and replayed by --config.
"$glint" init-model moe --arch qwen3_moe --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 400 \
  --max-positions 256 --experts 4 --experts-per-tok 2 --norm-topk --tokenizer-from arith.jsonl > moe-init.log 2>&1 \
  || { cat moe-init.log; fail "init-model --arch qwen3_moe"; }
# A reward that tells the random model's completions apart, so that the
# replayed steps have gradients.
cat > distinct.py <<'EOF'
import json, sys
for line in sys.stdin:
    print(len(set(json.loads(line)["completion"])) % 3)
EOF
for p in --packing --no-packing; do
  "$glint" grpo --model moe "${common[@]}" --prompts-per-step 2 --num-generations 4 --max-steps 2 --routing-replay $p \
    --reward-command "python3 distinct.py" --output "runs/replay$p" > "replay$p.log" 2>&1 \
    || { cat "replay$p.log"; fail "GRPO with --routing-replay $p"; }
  grep -q '^routing-replay = true' "runs/replay$p/config.toml" || fail "config.toml does not record routing-replay"
  [[ $(grep -c '"loss"' "runs/replay$p/metrics.jsonl") == 2 ]] || fail "the replayed run did not train 2 steps"
  grep -q '"grad_norm": [1-9]\|"grad_norm": 0\.[0-9]' "runs/replay$p/metrics.jsonl" || fail "the replayed steps had no gradient"
done
# ... and with its experts split over 2 ranks (--mesh ep=2): the sampler syncs every expert from
# the cut model group, and the replayed routes reach each rank's rows.
"$glint" grpo --model moe "${common[@]}" --prompts-per-step 2 --num-generations 4 --max-steps 2 --routing-replay \
  --train-type full --lr 1e-4 --mesh ep=2 --reward-command "python3 distinct.py" --output runs/replay-ep > replay-ep.log 2>&1 \
  || { cat replay-ep.log; fail "GRPO with --routing-replay on --mesh ep=2"; }
[[ $(grep -c '"loss"' runs/replay-ep/metrics.jsonl) == 2 ]] || fail "the ep=2 run did not train 2 steps"
[[ -f runs/replay-ep/last/config.json ]] && grep -q Qwen3MoeForCausalLM runs/replay-ep/last/config.json \
  || fail "the ep=2 run saved no whole model"

# 8. Bad input: one error line, a non-zero exit, no run directory.
echo '{"prompt": "Say hi."}' > nosolution.jsonl
small=(--max-prompt-length 64 --max-tokens 16)
expect_refusal no-solution "has no solution, which the accuracy reward needs" --model model "${small[@]}" --dataset nosolution.jsonl
expect_refusal weights "2 weights for 3 rewards" --model model "${small[@]}" --dataset arith.jsonl --reward accuracy,format \
  --reward-command "cat" --reward-weights 1,2
expect_refusal async-sync "does not combine with --sync-every 2" --model model "${small[@]}" --dataset arith.jsonl \
  --max-staleness 1 --sync-every 2
expect_refusal multiple "not a multiple of --sync-every" --model model "${small[@]}" --dataset arith.jsonl --sync-every 2 --save-every 3
expect_refusal too-long "beyond the model's max_position_embeddings" --model model --dataset arith.jsonl \
  --max-prompt-length 64 --max-tokens 250
expect_refusal greedy "no spread to learn from" --model model "${small[@]}" --dataset arith.jsonl --temperature 0
expect_refusal few "fewer than --prompts-per-step" --model model "${small[@]}" --dataset nosolution.jsonl --reward format --prompts-per-step 2
expect_refusal no-layout "no usable row in the gsm8k layout" --model model "${small[@]}" --dataset nosolution.jsonl --layout gsm8k
expect_refusal sampler-ranks "every sampler rank needs a prompt" --model model "${small[@]}" --dataset arith.jsonl \
  --prompts-per-step 1 --sampler-dp 2
expect_refusal dropout "lora-dropout does not apply" --model model "${small[@]}" --dataset arith.jsonl --lora-dropout 0.1
expect_refusal cispo "does not apply to --loss cispo" --model model "${small[@]}" --dataset arith.jsonl --loss cispo \
  --epsilon 0.2
expect_refusal replay-dense "has none; leave it out" --model model "${small[@]}" --dataset arith.jsonl --routing-replay
expect_refusal replay-pp "not built for pipeline parallelism" --model moe "${small[@]}" --dataset arith.jsonl --routing-replay \
  --train-type full --mesh pp=2
expect_refusal missing "is not a file" --model model "${small[@]}" --dataset nothere.jsonl
expect_refusal both "pick one" --model model "${small[@]}" --dataset arith.jsonl --resume --overwrite
echo "grpo recipe: ok (command reward $first -> $last)"
