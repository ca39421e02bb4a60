#!/usr/bin/env bash
# `glint dpo` end to end on a tiny model and preference pairs made here: with
# a fresh LoRA adapter the first step's loss is exactly ln 2 (the policy is
# the reference), the chosen-minus-rejected margin grows and the validation
# accuracy rises; both data layouts mix; the config file replays the run; a
# resumed run writes the same metrics as an uninterrupted one; full training
# with IPO against a frozen copy writes a Hugging Face model directory; a
# 2-process job slices 3 pairs over 2 ranks in whole pairs; two adapters train
# on one base in one run (multi-LoRA); bad input ends
# with one error line, exit 2 and no run directory.
#   dpo_recipe.sh GLINT_BINARY
set -euo pipefail
glint=$1 recipe=dpo
source "$(dirname "$0")/recipe_lib.sh"
root=$(mktemp -d /tmp/glint-dpo-recipe-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"
# The chosen answer states the sum; the rejected one dodges ("I do not know.", or a guess).
awk 'BEGIN{srand(1); for(i=0;i<160;i++){a=int(rand()*20);b=int(rand()*20);w=int(rand()*40);r=(i%2==0)?"I do not know.":sprintf("Maybe %d?",w);
  printf("{\"prompt\": \"What is %d plus %d?\", \"chosen\": \"%d plus %d is %d.\", \"rejected\": \"%s\"}\n",a,b,a,b,a+b,r)}}' > pairs.jsonl
awk 'BEGIN{srand(2); for(i=0;i<60;i++){a=int(rand()*20);b=int(rand()*20);
  printf("{\"messages\": [{\"role\": \"user\", \"content\": \"What is %d plus %d?\"}, {\"role\": \"assistant\", \"content\": \"%d plus %d is %d.\"}], \"rejected_response\": \"I do not know.\"}\n",a,b,a,b,a+b)}}' > swift.jsonl
awk 'BEGIN{srand(3); for(i=0;i<100;i++){a=int(rand()*20);b=int(rand()*20);
  printf("{\"query\": \"What is %d plus %d?\", \"response\": \"%d plus %d is %d.\"}\n",a,b,a,b,a+b)}}' > sft.jsonl
cat sft.jsonl pairs.jsonl > all.jsonl
"$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 400 \
  --max-positions 256 --tokenizer-from all.jsonl > init.log 2>&1 || { cat init.log; exit 1; }
field() {  # FILE LINE KEY: the value of KEY on line LINE of a metrics.jsonl
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[int(sys.argv[2])-1])[sys.argv[3]])' "$@"
}
mean() {  # FILE KEY FROM TO
  python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][int(sys.argv[3])-1:int(sys.argv[4])]; print(sum(x[sys.argv[2]] for x in r)/len(r))' "$@"
}

same_rows() {  # A B [TOLERANCE]: the same metrics rows, every number equal (runs are deterministic)
  # or, for two computations that differ (packed and padded batches), within TOLERANCE relative.
  python3 - "$1" "$2" "${3:-0}" <<'PY'
import json, sys
tol = float(sys.argv[3])
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) and a, (len(a), len(b))
for x, y in zip(a, b):
    assert x.keys() == y.keys(), (x, y)
    for k in x:
        close = x[k] == y[k] or (tol > 0 and isinstance(x[k], float) and abs(x[k] - y[k]) <= tol * max(1, abs(x[k])))
        assert close, (x["step"], k, x[k], y[k])
PY
}

# 1. LoRA on both layouts, with a validation split.
"$glint" dpo --model model --dataset pairs.jsonl --dataset swift.jsonl --val-split 0.1 --lr 5e-3 --beta 0.5 \
  --batch-size 4 --max-steps 40 --eval-every 10 --output runs/lora > lora.log 2>&1 || { cat lora.log; fail "the LoRA run"; }
for f in last/adapter_config.json last/adapter_model.safetensors best/adapter_model.safetensors config.toml \
         data/train.jsonl data/val.jsonl metrics.jsonl report.html checkpoint-40/model/adapter_model.safetensors; do
  [[ -f runs/lora/$f ]] || fail "runs/lora/$f is missing"
done
[[ $(wc -l < runs/lora/data/train.jsonl) == 198 && $(wc -l < runs/lora/data/val.jsonl) == 22 ]] \
  || fail "160 + 60 pairs split 0.1 should give 198 + 22"
first=$(field runs/lora/metrics.jsonl 1 loss)
python3 -c "import math,sys; sys.exit(abs($first - math.log(2)) > 1e-6)" || fail "the first step's loss $first is not ln 2"
is_zero() { python3 -c "import sys; sys.exit(float(sys.argv[1]) != 0)" "$1"; }
is_zero "$(field runs/lora/metrics.jsonl 1 reward_margin)" || fail "the first step's margin is not 0"
m0=$(mean runs/lora/metrics.jsonl reward_margin 2 6) m1=$(mean runs/lora/metrics.jsonl reward_margin 36 40)
python3 -c "import sys; sys.exit(not ($m1 > $m0 + 0.5))" || fail "the margin did not grow: $m0 -> $m1"
acc=$(python3 -c 'import json; r=[json.loads(l) for l in open("runs/lora/metrics.jsonl") if "eval_reward_accuracy" in l]; print(r[-1]["eval_reward_accuracy"])')
python3 -c "import sys; sys.exit(not ($acc >= 0.8))" || fail "the validation accuracy is $acc"
grep -q 'best validation loss' lora.log || fail "no best checkpoint was named"

# 2. The recorded config runs the same job.
"$glint" dpo --config runs/lora/config.toml --output runs/again --max-steps 2 > again.log 2>&1 || { cat again.log; fail "--config"; }
diff <(grep -vE '^(output|max-steps|config) =' runs/lora/config.toml) \
     <(grep -vE '^(output|max-steps|config) =' runs/again/config.toml) || fail "the config file did not give the same flags"

# 3. A resumed run writes what an uninterrupted one does.
args=(--model model --dataset pairs.jsonl --lr 5e-3 --batch-size 4 --max-steps 12 --save-every 6)
"$glint" dpo "${args[@]}" --output runs/whole > /dev/null 2>&1 || fail "the uninterrupted run"
"$glint" dpo "${args[@]}" --output runs/cut > /dev/null 2>&1 || fail "the run to cut"
rm -rf runs/cut/checkpoint-12 runs/cut/last
# A flag that does not change what was computed (--model-max-restarts) may change on resume.
"$glint" dpo "${args[@]}" --output runs/cut --resume --model-max-restarts 1 > resume.log 2>&1 \
  || { cat resume.log; fail "--resume"; }
grep -q "resumed at step 6" resume.log || fail "the run did not resume at step 6"
[[ $(wc -l < runs/cut/metrics.jsonl) == 12 ]] || fail "the resumed run has not 12 rows"
same_rows runs/whole/metrics.jsonl runs/cut/metrics.jsonl || fail "the resumed run's metrics differ"

# 3a. Packing (the default, each pair whole in a row) trains as padded pairs: the same rows.
"$glint" dpo "${args[@]/12/4}" --no-packing --output runs/padded > /dev/null 2>&1 || fail "the --no-packing run"
"$glint" dpo "${args[@]/12/4}" --output runs/packed > /dev/null 2>&1 || fail "the packed run"
same_rows runs/padded/metrics.jsonl runs/packed/metrics.jsonl 1e-4 || fail "packed pairs train otherwise than padded ones"
# A run from before the flag (no packing key in its config.toml) trained padded: it resumes so.
sed -i '/^packing/d' runs/padded/config.toml
code=0; "$glint" dpo "${args[@]/12/4}" --output runs/padded --resume > old.log 2>&1 || code=$?
[[ $code != 0 ]] && grep -q "other values of packing" old.log || { cat old.log; fail "an older padded run resumed packed"; }
"$glint" dpo "${args[@]/12/4}" --no-packing --output runs/padded --resume > old.log 2>&1 \
  || { cat old.log; fail "an older padded run did not resume with --no-packing"; }

# 4. Full training with IPO against a frozen copy: a Hugging Face model directory.
"$glint" dpo --model model --dataset pairs.jsonl --train-type full --loss ipo --beta 0.5 --lr 1e-4 --max-steps 4 \
  --output runs/full > full.log 2>&1 || { cat full.log; fail "full training"; }
for f in config.json model.safetensors tokenizer.json; do [[ -f runs/full/last/$f ]] || fail "runs/full/last/$f is missing"; done
is_zero "$(field runs/full/metrics.jsonl 1 reward_margin)" || fail "the full run's reference is not its start"

# 5. Two processes, one model rank each: 3 pairs per batch go 2 and 1.
"$glint" run --nproc 2 -- "$glint" dpo --model model --dataset pairs.jsonl --lr 5e-3 --batch-size 3 --max-steps 3 --dp 2 \
  --output runs/cluster > cluster.log 2>&1 || { cat cluster.log; fail "a 2-process run"; }
c1=$(field runs/cluster/metrics.jsonl 1 loss)
python3 -c "import math,sys; sys.exit(abs($c1 - math.log(2)) > 1e-6)" || fail "the 2-process run's first loss $c1 is not ln 2"

# 6. Multi-LoRA: two adapters on one base in one run, one preferring the right sums and one (its
# pairs swapped) the wrong ones; each starts at ln 2 and its own margin grows.
python3 -c '
import json
for l in open("pairs.jsonl"):
    r = json.loads(l); r["chosen"], r["rejected"] = r["rejected"], r["chosen"]; print(json.dumps(r))' > wrong.jsonl
"$glint" dpo --model model --adapter right=pairs.jsonl --adapter wrong=wrong.jsonl --lr 5e-3 --beta 0.5 --batch-size 4 \
  --max-steps 20 --val-split 0.1 --eval-every 10 --output runs/multi > multi.log 2>&1 || { cat multi.log; fail "the multi-LoRA run"; }
for name in right wrong; do
  for f in last/adapter_model.safetensors best/adapter_model.safetensors metrics.jsonl config.toml data/train.jsonl; do
    [[ -f runs/multi/$name/$f ]] || fail "runs/multi/$name/$f is missing"
  done
  l1=$(field runs/multi/$name/metrics.jsonl 1 loss)
  python3 -c "import math,sys; sys.exit(abs($l1 - math.log(2)) > 1e-6)" || fail "adapter $name: the first loss $l1 is not ln 2"
  a0=$(mean runs/multi/$name/metrics.jsonl reward_margin 2 4) a1=$(mean runs/multi/$name/metrics.jsonl reward_margin 18 20)
  python3 -c "import sys; sys.exit(not ($a1 > $a0 + 0.3))" || fail "adapter $name: the margin did not grow: $a0 -> $a1"
done
cmp -s runs/multi/right/last/adapter_model.safetensors runs/multi/wrong/last/adapter_model.safetensors \
  && fail "the two adapters are the same"
# Adapters of different lengths (--epochs over 160 and 60 pairs: 20 and 8 steps) resume each from
# its own latest checkpoint and write what an uninterrupted run does.
margs=(--model model --adapter big=pairs.jsonl --adapter small=swift.jsonl --lr 5e-3 --batch-size 8 --save-every 3)
"$glint" dpo "${margs[@]}" --output runs/mwhole > /dev/null 2>&1 || fail "the uninterrupted multi-LoRA run"
"$glint" dpo "${margs[@]}" --output runs/mcut > /dev/null 2>&1 || fail "the multi-LoRA run to cut"
[[ $(wc -l < runs/mcut/big/metrics.jsonl) == 20 && $(wc -l < runs/mcut/small/metrics.jsonl) == 8 ]] \
  || fail "the adapters did not run 20 and 8 steps"
rm -rf runs/mcut/big/checkpoint-20 runs/mcut/big/checkpoint-18 runs/mcut/big/last runs/mcut/small/checkpoint-8 runs/mcut/small/last
"$glint" dpo "${margs[@]}" --output runs/mcut --resume > mresume.log 2>&1 || { cat mresume.log; fail "the multi-LoRA resume"; }
grep -q "dpo big: resumed at step 15" mresume.log && grep -q "dpo small: resumed at step 6" mresume.log \
  || { cat mresume.log; fail "the adapters did not resume at their own steps"; }
for name in big small; do
  same_rows "runs/mwhole/$name/metrics.jsonl" "runs/mcut/$name/metrics.jsonl" || fail "adapter $name's resumed metrics differ"
done

# 7. Bad input: one error line, exit 2, no run directory.
mkdir notok && cp model/config.json model/model.safetensors notok/
mkdir gpt2 && cp model/* gpt2/ && sed -i 's/Qwen3ForCausalLM/GPT2LMHeadModel/' gpt2/config.json
expect_refusal no-tokenizer "has no tokenizer.json" --model notok --dataset pairs.jsonl
expect_refusal sft-rows "no usable row in the auto layout" --model model --dataset sft.jsonl
expect_refusal wrong-layout "no usable row in the messages layout" --model model --dataset pairs.jsonl --layout messages
expect_refusal architecture "GPT2LMHeadModel" --model gpt2 --dataset pairs.jsonl
expect_refusal too-long "0 usable pairs" --model model --dataset pairs.jsonl --max-length 8
expect_refusal smoothing "applies to --loss sigmoid only" --model model --dataset pairs.jsonl --loss ipo --label-smoothing 0.1
expect_refusal dp "every data-parallel rank trains whole pairs" --model model --dataset pairs.jsonl --batch-size 1 --dp 2
expect_refusal adapter-and-dataset "leave out --dataset" --model model --dataset pairs.jsonl --adapter a=pairs.jsonl
expect_refusal adapter-name "must be letters" --model model --adapter 'a/b=pairs.jsonl'
expect_refusal adapter-full "not with --train-type full" --model model --adapter a=pairs.jsonl --train-type full
echo "dpo recipe: ok (margin $m0 -> $m1, validation accuracy $acc)"
