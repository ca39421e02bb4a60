#!/usr/bin/env bash
# The recipes on a Qwen3.5 base (Gated DeltaNet and gated attention layers,
# a Qwen3.5-MoE one too): `glint sft` with LoRA on the Gated DeltaNet's own
# projections and with full training (fsdp over two processes equal to one
# process), expert parallelism on Qwen3.5-MoE, `glint grpo` from the warm-up (the sampler's per-sequence
# states; asynchronous, and resumed), `glint dpo`, SFT through Qwen3.5's own
# chat template; each loss falls, and what is not built is refused
# naming the layer kind.
#   qwen35_recipes.sh GLINT_BINARY
set -euo pipefail
glint=$1 recipe=sft
source "$(dirname "$0")/recipe_lib.sh"
root=$(mktemp -d /tmp/glint-qwen35-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"
"$glint" init-data arithmetic arith.jsonl --rows 600 --max-operand 9 --seed 1 > /dev/null
for arch in qwen3_5 qwen3_5_moe; do
  experts=()
  [[ $arch == *_moe ]] && experts=(--experts 4 --experts-per-tok 2 --moe-intermediate 32 --shared-intermediate 32)
  "$glint" init-model $arch --arch $arch --hidden 64 --intermediate 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 16 \
    "${experts[@]}" --vocab 400 --max-positions 256 --tokenizer-from arith.jsonl \
    > init.log 2>&1 || { cat init.log; fail "init-model --arch $arch"; }
done
grep -q '"linear_attention"' qwen3_5/config.json || fail "no Gated DeltaNet layer in the config"
# first_last FILE KEY: the first and last value of KEY in a metrics.jsonl.
first_last() { python3 -c "import json; r=[json.loads(l) for l in open('$1')]; print(r[0]['$2'], r[-1]['$2'])"; }
falls() { read -r a b < <(first_last "$1" "$2"); python3 -c "import sys; sys.exit(0 if $b < $a else 1)" || fail "$3: $2 went from $a to $b"; }

# 1. LoRA on the Gated DeltaNet's projections (PEFT's names) and attention's.
for arch in qwen3_5 qwen3_5_moe; do
  "$glint" sft --model $arch --dataset arith.jsonl --lr 3e-3 --max-steps 20 \
    --target-modules in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj,q_proj,v_proj --output runs/lora-$arch \
    > lora.log 2>&1 || { cat lora.log; fail "LoRA sft on $arch"; }
  falls runs/lora-$arch/metrics.jsonl loss "LoRA sft on $arch"
  python3 - runs/lora-$arch/last/adapter_model.safetensors <<'EOF' || fail "the adapter lacks the Gated DeltaNet's modules"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; keys = json.loads(f.read(n))
assert any(".linear_attn.in_proj_qkv.lora_A.weight" in k for k in keys), list(keys)[:8]
assert any(".linear_attn.out_proj.lora_B.weight" in k for k in keys)
assert any(".self_attn.q_proj.lora_A.weight" in k for k in keys)
EOF
done

# 1b. Qwen3.5's own chat template (tests/data/chat_templates/qwen3.5.jinja, its
#     <think> generation prompt): `glint template` renders what Jinja2 renders,
#     and sft trains through glint's Jinja interpreter.
here=$(cd "$(dirname "$0")/.." && pwd)
cp -r qwen3_5 qwen3_5_own
cp "$here/data/chat_templates/qwen3.5.jinja" qwen3_5_own/chat_template.jinja
echo '[{"role": "system", "content": "Add."}, {"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]' > chat.json
for prompt in "" --add-generation-prompt; do
  "$glint" template --model qwen3_5_own --messages chat.json $prompt > own.txt 2> own.err || { cat own.err; fail "glint template $prompt"; }
  python3 - "$here/support" qwen3_5_own chat.json own.txt "$prompt" <<'EOF' || fail "glint template $prompt is not Jinja2's render"
import json, sys
sys.path.insert(0, sys.argv[1])
import jinja_reference
cfg = json.load(open(sys.argv[2] + "/tokenizer_config.json"))
variables = {k: v for k, v in cfg.items() if k.endswith("_token") and isinstance(v, str)}
variables.update(messages=json.load(open(sys.argv[3])), tools=None, documents=None, add_generation_prompt=bool(sys.argv[5]))
want = jinja_reference.render_all(open(sys.argv[2] + "/chat_template.jinja").read(), [variables])[0]["text"]
got = open(sys.argv[4]).read()
assert got == want, (got, want)
EOF
done
"$glint" sft --model qwen3_5_own --dataset arith.jsonl --lr 3e-3 --max-steps 20 --output runs/own > own.log 2>&1 ||
  { cat own.log; fail "sft through Qwen3.5's own chat template"; }
falls runs/own/metrics.jsonl loss "sft through Qwen3.5's own chat template"

# 2. Full training, one process and fsdp over two: the same first loss.
"$glint" sft --model qwen3_5 --dataset arith.jsonl --train-type full --lr 3e-3 --batch-size 32 --max-steps 60 \
  --lr-scheduler constant --output runs/sft > sft.log 2>&1 || { cat sft.log; fail "full sft"; }
falls runs/sft/metrics.jsonl loss "full sft"
"$glint" run --nproc 2 -- "$glint" sft --model qwen3_5 --dataset arith.jsonl --train-type full --lr 3e-3 --batch-size 32 \
  --max-steps 2 --lr-scheduler constant --mesh fsdp=2 --output runs/fsdp > fsdp.log 2>&1 || { cat fsdp.log; fail "fsdp sft"; }
python3 - runs/sft/metrics.jsonl runs/fsdp/metrics.jsonl <<'EOF' || fail "fsdp's first loss is not one process's"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert abs(a[0]["loss"] - b[0]["loss"]) < 1e-4 * abs(a[0]["loss"]), (a[0]["loss"], b[0]["loss"])
EOF

# Expert parallelism on Qwen3.5-MoE: the first loss and gradient norm are one process's.
"$glint" sft --model qwen3_5_moe --dataset arith.jsonl --train-type full --batch-size 8 --max-steps 1 \
  --lr-scheduler constant --output runs/ep1 > ep1.log 2>&1 || { cat ep1.log; fail "qwen3_5_moe sft"; }
"$glint" run --nproc 2 -- "$glint" sft --model qwen3_5_moe --dataset arith.jsonl --train-type full --batch-size 8 \
  --max-steps 1 --lr-scheduler constant --mesh ep=2 --output runs/ep2 > ep2.log 2>&1 || { cat ep2.log; fail "ep=2 sft"; }
python3 - runs/ep1/metrics.jsonl runs/ep2/metrics.jsonl <<'EOF' || fail "ep=2's first step is not one process's"
import json, sys
a, b = (json.loads(open(p).readline()) for p in sys.argv[1:3])
for k in ("loss", "grad_norm"):
    assert abs(a[k] - b[k]) <= 1e-4 * abs(a[k]), (k, a[k], b[k])
EOF

# 3. GRPO from the warm-up: the sampler carries each sequence's states.
"$glint" grpo --model runs/sft/last --dataset arith.jsonl --max-tokens 16 --max-prompt-length 64 --prompts-per-step 8 \
  --num-generations 4 --lr 1e-3 --max-steps 4 --output runs/grpo > grpo.log 2>&1 || { cat grpo.log; fail "grpo"; }
[[ -f runs/grpo/last/adapter_model.safetensors ]] || fail "grpo wrote no adapter"

# 3b. Asynchronous GRPO (a step stale, decoupled PPO) over the per-sequence
#     states, and a resume from its last checkpoint.
async=(--model runs/sft/last --dataset arith.jsonl --max-tokens 16 --max-prompt-length 64 --prompts-per-step 8
       --num-generations 4 --lr 1e-3 --max-steps 4 --save-every 2 --max-staleness 1 --loss decoupled_ppo)
"$glint" grpo "${async[@]}" --output runs/async > async.log 2>&1 || { cat async.log; fail "asynchronous grpo"; }
python3 - runs/async/metrics.jsonl <<'EOF' || fail "the asynchronous run's rows"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["step"] > 0]
assert len(rows) == 4, rows
for r in rows:
    assert r["staleness/max"] == min(r["step"] - 1, 1), r
EOF
rm -rf runs/async/checkpoint-4 runs/async/last
"$glint" grpo "${async[@]}" --output runs/async --resume > async-resume.log 2>&1 || { cat async-resume.log; fail "resuming asynchronous grpo"; }
grep -q "resumed at step 2" async-resume.log || { cat async-resume.log; fail "asynchronous grpo did not resume at step 2"; }

# 4. DPO on preference pairs.
awk 'BEGIN{srand(1); for(i=0;i<80;i++){a=int(rand()*9);b=int(rand()*9);
  printf("{\"prompt\": \"%d+%d=\", \"chosen\": \"%d\", \"rejected\": \"I do not know.\"}\n",a,b,a+b)}}' > pairs.jsonl
"$glint" dpo --model qwen3_5 --dataset pairs.jsonl --lr 5e-3 --beta 0.5 --max-steps 10 --output runs/dpo > dpo.log 2>&1 ||
  { cat dpo.log; fail "dpo"; }
falls runs/dpo/metrics.jsonl loss "dpo"

# 5. Tensor and pipeline parallelism refuse the layer kind.
for mesh in tp=2 pp=2; do
  code=0
  "$glint" run --nproc 2 -- "$glint" sft --model qwen3_5 --dataset arith.jsonl --train-type full --max-steps 1 --mesh $mesh \
    --output runs/$mesh > $mesh.log 2>&1 || code=$?
  [[ $code != 0 ]] || fail "--mesh $mesh ran"
  grep -q "Gated DeltaNet" $mesh.log || { cat $mesh.log; fail "--mesh $mesh: the error does not name the layer kind"; }
done
echo "qwen3.5 recipes: LoRA (also through Qwen3.5's own chat template), full, fsdp, ep, grpo (also asynchronous, resumed) and dpo ran; tp and pp refused"
