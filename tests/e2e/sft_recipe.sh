#!/usr/bin/env bash
# `glint sft` end to end on a tiny model and data made here: LoRA on two
# mixed datasets with a validation split (the loss falls, last/ and best/
# are PEFT adapter directories), the config file and the flags are
# interchangeable, a resumed run writes the same metrics as an uninterrupted
# one, packing (the default) gives the padded batch's loss, full training writes a Hugging
# Face model directory, and bad input ends with one error line, a non-zero
# exit and no run directory.
#   sft_recipe.sh GLINT_BINARY
set -euo pipefail
glint=$1 recipe=sft
source "$(dirname "$0")/recipe_lib.sh"
root=$(mktemp -d /tmp/glint-sft-recipe-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"
awk 'BEGIN{srand(1); for(i=0;i<200;i++){a=int(rand()*20);b=int(rand()*20);
  printf("{\"query\": \"What is %d plus %d?\", \"response\": \"%d plus %d is %d.\"}\n",a,b,a,b,a+b)}}' > qr.jsonl
awk 'BEGIN{srand(2); for(i=0;i<100;i++){a=int(rand()*20);b=int(rand()*20);
  printf("{\"instruction\": \"Add the numbers.\", \"input\": \"%d and %d\", \"output\": \"%d\"}\n",a,b,a+b)}}' > alpaca.jsonl
cat qr.jsonl alpaca.jsonl > all.jsonl
"$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 400 \
  --max-positions 256 --tokenizer-from all.jsonl > init.log 2>&1 || { cat init.log; exit 1; }
# same_metrics A B N: two metrics.jsonl of N steps with the same rows, every
# number equal to the last bit (runs are deterministic: docs/architecture.md).
same_metrics() {
  python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == int(sys.argv[3]), (len(a), len(b))
for x, y in zip(a, b):
    assert x.keys() == y.keys(), (x, y)
    for k in x:
        assert x[k] == y[k], (x["step"], k, x[k], y[k])
EOF
}
mean() { awk -v from="$2" -v to="$3" -F'"loss": ' 'NR>=from && NR<=to {split($2,v,/[,}]/); s+=v[1]; n++} END {printf "%.6f", s/n}' "$1"; }

# 1. LoRA on a mix, with a validation split and evaluation.
"$glint" sft --model model --dataset qr.jsonl --dataset alpaca.jsonl:0.5 --val-split 0.1 --lr 3e-3 --max-steps 40 \
  --eval-every 10 --output runs/lora > lora.log 2>&1 || { cat lora.log; fail "the LoRA run"; }
for f in last/adapter_config.json last/adapter_model.safetensors best/adapter_model.safetensors config.toml \
         data/train.jsonl data/val.jsonl metrics.jsonl report.html checkpoint-40/model/adapter_model.safetensors; do
  [[ -f runs/lora/$f ]] || fail "runs/lora/$f is missing"
done
[[ $(wc -l < runs/lora/data/train.jsonl) == 225 && $(wc -l < runs/lora/data/val.jsonl) == 25 ]] \
  || fail "200 + 50 rows split 0.1 should give 225 + 25"
first=$(mean runs/lora/metrics.jsonl 1 5) last=$(mean runs/lora/metrics.jsonl 36 40)
awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < a - 0.3)}' || fail "the loss did not fall: $first -> $last"
grep -q '"eval_loss"' runs/lora/metrics.jsonl || fail "no evaluation was recorded"
grep -q 'best validation loss' lora.log || fail "no best checkpoint was named"
# The saved adapter, loaded by a new process, gives the logprobs it had in training.
best=$(sed -n 's/^best validation loss \([0-9.]*\) .*/\1/p' lora.log)
"$glint" sft --model model --adapter-from runs/lora/best --val-dataset runs/lora/data/val.jsonl --eval-only > eval.log 2>&1 \
  || { cat eval.log; fail "--eval-only"; }
again=$(sed -n 's/^eval_loss: //p' eval.log)
awk -v a="$best" -v b="$again" 'BEGIN {d = a - b; exit !(d < 1e-5 && d > -1e-5)}' \
  || fail "the reloaded adapter's validation loss $again is not the trained one's $best"
# --model naming the adapter directory trains (here: evaluates) it on the base
# its adapter_config.json names, as --adapter-from does.
"$glint" sft --model runs/lora/best --val-dataset runs/lora/data/val.jsonl --eval-only > eval2.log 2>&1 \
  || { cat eval2.log; fail "--model ADAPTER_DIR"; }
again2=$(sed -n 's/^eval_loss: //p' eval2.log)
[[ -n $again2 && $again2 == "$again" ]] || fail "--model ADAPTER_DIR gave eval_loss '$again2', --adapter-from $again"
# A base that is not a directory here is refused, saying what to give.
cp -r runs/lora/best elsewhere
/usr/bin/python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c["base_model_name_or_path"] = "Qwen/Qwen2.5-0.5B"; json.dump(c, open(p, "w"))' elsewhere/adapter_config.json
code=0; "$glint" sft --model elsewhere --val-dataset runs/lora/data/val.jsonl --eval-only > elsewhere.log 2>&1 || code=$?
[[ $code != 0 ]] && grep -q "is not a model directory here; give the base and the adapter: --model BASE --adapter-from elsewhere" elsewhere.log \
  || { cat elsewhere.log; fail "an adapter whose base is not here was not refused clearly"; }

# 2. The recorded config runs the same job (flags given too win).
"$glint" sft --config runs/lora/config.toml --output runs/again --max-steps 10 > again.log 2>&1 || { cat again.log; fail "--config"; }
diff <(grep -vE '^(output|max-steps|config) =' runs/lora/config.toml) \
     <(grep -vE '^(output|max-steps|config) =' runs/again/config.toml) || fail "the config file did not give the same flags"
# A run from a saved adapter, replayed from its config.toml.
"$glint" sft --model model --adapter-from runs/lora/best --dataset qr.jsonl --max-steps 2 --output runs/from > from.log 2>&1 \
  || { cat from.log; fail "--adapter-from"; }
"$glint" sft --config runs/from/config.toml --output runs/from2 > from2.log 2>&1 || { cat from2.log; fail "replaying an --adapter-from run"; }
echo 'not-a-flag = 1' > bad.toml
code=0; "$glint" sft --config bad.toml --model model --dataset qr.jsonl --output runs/bad > bad.log 2>&1 || code=$?
[[ $code != 0 ]] && grep -q "unknown key 'not-a-flag'" bad.log || fail "an unknown config key was not refused"

# 3. A resumed run writes what an uninterrupted one does.
args=(--model model --dataset qr.jsonl --lr 3e-3 --max-steps 20 --save-every 10)
"$glint" sft "${args[@]}" --output runs/whole > /dev/null 2>&1 || fail "the uninterrupted run"
"$glint" sft "${args[@]}" --output runs/cut > /dev/null 2>&1 || fail "the run to cut"
rm -rf runs/cut/checkpoint-20 runs/cut/last   # as if killed after step 19
"$glint" sft "${args[@]}" --output runs/cut --resume > resume.log 2>&1 || { cat resume.log; fail "--resume"; }
grep -q "resumed at step 10" resume.log || fail "the run did not resume at step 10"
same_metrics runs/whole/metrics.jsonl runs/cut/metrics.jsonl 20 || fail "the resumed run's metrics differ"
code=0; "$glint" sft "${args[@]/3e-3/1e-2}" --output runs/cut --resume > changed.log 2>&1 || code=$?
[[ $code != 0 ]] && grep -q "other values of lr" changed.log || fail "a resume with another --lr was not refused"
code=0; "$glint" sft "${args[@]}" --output runs/cut > again.log 2>&1 || code=$?
[[ $code != 0 ]] && grep -q -- "--overwrite" again.log || fail "a second run into the same --output was not refused"

# 4. Packing (the default): the same rows, the same loss as padded ones.
"$glint" sft "${args[@]/20/1}" --no-packing --output runs/padded > /dev/null 2>&1 || fail "--no-packing"
a=$(mean runs/padded/metrics.jsonl 1 1) b=$(mean runs/whole/metrics.jsonl 1 1)
awk -v a="$a" -v b="$b" 'BEGIN {d = a - b; exit !(d < 1e-4 && d > -1e-4)}' || fail "packed loss $b != padded $a"
# config.toml records what ran (a replay with --config must pack as the run did).
grep -qx "packing = true" runs/whole/config.toml || fail "the packed run's config.toml does not say packing = true"
grep -qx "packing = false" runs/padded/config.toml || fail "the padded run's config.toml does not say packing = false"

# 4b. A 2-process job, one model rank in each, packed batches split over the ranks.
"$glint" run --nproc 2 -- "$glint" sft --model model --dataset qr.jsonl --val-split 0.1 --lr 3e-3 --max-steps 6 \
  --eval-every 3 --dp 2 --packing --output runs/cluster > cluster.log 2>&1 || { cat cluster.log; fail "a 2-process run"; }
[[ -f runs/cluster/best/adapter_model.safetensors ]] || fail "the 2-process run wrote no best/"

# 4c. The model cut over two ranks (--mesh): LoRA on an FSDP base, evaluated
# (forward_only gathers the base), whose resume matches the uninterrupted
# run; full training on tensor-parallel ranks (this tokenizer's 283 rows of
# vocabulary split 142 and 141) and on pipeline stages, evaluated.
margs=(--model model --dataset qr.jsonl --val-split 0.1 --lr 3e-3 --max-steps 4 --save-every 2 --eval-every 2 --mesh fsdp=2)
"$glint" sft "${margs[@]}" --output runs/fsdp > fsdp.log 2>&1 || { cat fsdp.log; fail "an fsdp=2 run"; }
[[ -f runs/fsdp/best/adapter_model.safetensors ]] || fail "the fsdp=2 run wrote no best/"
[[ -f runs/fsdp/checkpoint-4/model/optimizer-fsdp1-of-2.safetensors ]] || fail "the fsdp=2 checkpoint has no per-part optimizer state"
if compgen -G 'runs/fsdp/best/optimizer*' > /dev/null; then fail "best/ holds optimizer state"; fi
"$glint" sft "${margs[@]}" --output runs/fsdp-cut > /dev/null 2>&1 || fail "the fsdp=2 run to cut"
rm -rf runs/fsdp-cut/checkpoint-4 runs/fsdp-cut/last   # as if killed after step 3
"$glint" sft "${margs[@]}" --output runs/fsdp-cut --resume > fsdp-resume.log 2>&1 || { cat fsdp-resume.log; fail "--resume on fsdp=2"; }
same_metrics runs/fsdp/metrics.jsonl runs/fsdp-cut/metrics.jsonl 4 || fail "the resumed fsdp=2 run's metrics differ"
for m in tp=2 pp=2; do
  "$glint" sft --model model --dataset qr.jsonl --val-split 0.1 --train-type full --lr 1e-3 --max-steps 3 --eval-every 3 \
    --mesh $m --output runs/full-$m > full-$m.log 2>&1 || { cat full-$m.log; fail "full training on --mesh $m"; }
  [[ -f runs/full-$m/last/model.safetensors ]] || fail "full training on --mesh $m wrote no last/model.safetensors"
  grep -q '"eval_loss"' runs/full-$m/metrics.jsonl || fail "no evaluation on --mesh $m"
done

# 5. Full training: a Hugging Face model directory with its tokenizer.
"$glint" sft --model model --dataset qr.jsonl --train-type full --lr 1e-3 --max-steps 5 --output runs/full > full.log 2>&1 \
  || { cat full.log; fail "full training"; }
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [[ -f runs/full/last/$f ]] || fail "runs/full/last/$f is missing"
done
"$glint" sft --model runs/full/last --dataset qr.jsonl --max-steps 1 --output runs/from-full > /dev/null 2>&1 \
  || fail "the fully trained model does not load as a model directory"

# 6. Bad input: one error line, a non-zero exit, no run directory.
mkdir notok && cp model/config.json model/model.safetensors notok/
mkdir gpt2 && cp model/* gpt2/ && sed -i 's/Qwen3ForCausalLM/GPT2LMHeadModel/' gpt2/config.json
echo '{"foo": "bar"}' > nolayout.jsonl
echo 'not json' > broken.jsonl
expect_refusal no-tokenizer "has no tokenizer.json" --model notok --dataset qr.jsonl
expect_refusal no-rows "no usable row" --model model --dataset broken.jsonl
expect_refusal no-layout "first row has keys: foo" --model model --dataset nolayout.jsonl
expect_refusal wrong-layout "no usable row in the alpaca layout" --model model --dataset qr.jsonl --layout alpaca
expect_refusal architecture "GPT2LMHeadModel" --model gpt2 --dataset qr.jsonl
expect_refusal missing-data "is not a file" --model model --dataset nothere.jsonl
expect_refusal typo-module "'v_projj' is not a module" --model model --dataset qr.jsonl --target-modules q_proj,v_projj
expect_refusal warmup "warmup" --model model --dataset qr.jsonl --max-steps 5 --warmup-steps 9
expect_refusal too-long "beyond the model's max_position_embeddings" --model model --dataset qr.jsonl --max-length 100000
expect_refusal both "pick one" --model model --dataset qr.jsonl --resume --overwrite
expect_refusal mesh-typo "no dimension 'tq'" --model model --dataset qr.jsonl --mesh tq=2
expect_refusal mesh-lora "train-type full" --model model --dataset qr.jsonl --mesh tp=2
expect_refusal mesh-mix "combines tp or pp with another cut" --model model --dataset qr.jsonl --train-type full --mesh fsdp=2,tp=2
expect_refusal mesh-dp "two data-parallel sizes" --model model --dataset qr.jsonl --dp 2 --mesh fsdp=2,dp=3
# 6. A mixture-of-experts base trains unchanged: LoRA on every projection
# (the routers and every expert's too), full training on one rank and over
# fsdp; init-model refuses expert options on a dense family.
"$glint" init-model moe --arch qwen3_moe --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 400 \
  --max-positions 256 --experts 4 --experts-per-tok 2 --norm-topk --tokenizer-from all.jsonl > moe-init.log 2>&1 \
  || { cat moe-init.log; fail "init-model --arch qwen3_moe"; }
grep -q '"num_experts": 4' moe/config.json || fail "moe/config.json has no num_experts 4"
"$glint" sft --model moe --dataset qr.jsonl --lr 3e-3 --max-steps 30 --target-modules all-linear --output runs/moe-lora \
  > moe-lora.log 2>&1 || { cat moe-lora.log; fail "LoRA on an MoE base"; }
grep -aq 'model.layers.1.mlp.experts.3.down_proj.lora_A.weight' runs/moe-lora/last/adapter_model.safetensors \
  || fail "the MoE adapter has no expert modules"
moe_first=$(mean runs/moe-lora/metrics.jsonl 1 5) moe_last=$(mean runs/moe-lora/metrics.jsonl 26 30)
awk -v a="$moe_first" -v b="$moe_last" 'BEGIN {exit !(b < a - 0.3)}' || fail "the MoE loss did not fall: $moe_first -> $moe_last"
for m in one fsdp=2 ep=2 fsdp=2,ep=2; do
  mesh=(); [[ $m == one ]] || mesh=(--mesh "$m")
  "$glint" sft --model moe --dataset qr.jsonl --train-type full --lr 1e-3 --max-steps 3 "${mesh[@]}" \
    --output "runs/moe-full-$m" > moe-full.log 2>&1 || { cat moe-full.log; fail "full training of an MoE base on $m"; }
  grep -q Qwen3MoeForCausalLM "runs/moe-full-$m/last/config.json" || fail "the saved MoE model's config.json ($m)"
done
# Expert parallelism: the experts split over 2 ranks (and with fsdp, each
# part sharded over 2), the same first loss as one rank (the same rows,
# summed over the ranks), one optimizer file per part.
[[ -f runs/moe-full-ep=2/last/model.safetensors || -f runs/moe-full-ep=2/last/model.safetensors.index.json ]] \
  || fail "the ep=2 run wrote no whole model"
one_loss=$(mean runs/moe-full-one/metrics.jsonl 1 1)
for m in ep=2 fsdp=2,ep=2; do
  ep_loss=$(mean "runs/moe-full-$m/metrics.jsonl" 1 1)
  awk -v a="$ep_loss" -v b="$one_loss" 'BEGIN {d = a - b; exit !(d < 1e-4 && d > -1e-4)}' \
    || fail "the $m run's first loss $ep_loss is not one rank's $one_loss"
done
[[ -f "runs/moe-full-fsdp=2,ep=2/checkpoint-3/model/optimizer-fsdp1-of-2-ep1-of-2.safetensors" ]] \
  || fail "the fsdp=2,ep=2 run wrote no optimizer file for its part fsdp 1, ep 1"
expect_refusal ep-dense "has none; use dp or fsdp" --model model --dataset qr.jsonl --train-type full --mesh ep=2
expect_refusal ep-lora "LoRA on an expert-parallel model" --model moe --dataset qr.jsonl --mesh ep=2
expect_refusal ep-odd "does not divide by ep 3" --model moe --dataset qr.jsonl --train-type full --mesh ep=3
code=0
"$glint" init-model dense --arch qwen3 --experts 4 > dense.out 2> dense.err || code=$?
[[ $code == 2 ]] && grep -q "mixture-of-experts" dense.err || { cat dense.err; fail "--experts on a dense --arch"; }
echo "sft recipe: ok (loss $first -> $last; MoE $moe_first -> $moe_last)"
