#!/usr/bin/env bash
# The same job run again gives the same bits (docs/architecture.md,
# "Deterministic by default"): one SFT job and one GRPO job, ten runs each,
# two at a time (a loaded machine must not change the answer), compared
# byte for byte: every checkpoint's weights and optimizer state, the last
# adapter, and every metric but the timings (tokens_per_second,
# *_seconds). compute.json records what decides the bits.
#   deterministic.sh GLINT_BINARY [RUNS]
set -euo pipefail
glint=$1 runs=${2:-10}
root=$(mktemp -d /tmp/glint-deterministic-XXXXXX)
trap 'rm -rf "$root"' EXIT
cd "$root"
fail() { echo "FAIL: $*"; exit 1; }
"$glint" init-data arithmetic arith.jsonl --rows 300 --max-operand 9 --seed 1 > /dev/null
"$glint" init-model model --arch qwen3 --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 400 \
  --max-positions 256 --tokenizer-from arith.jsonl > init.log 2>&1 || { cat init.log; exit 1; }
# A warm start for GRPO, so that its rewards, advantages and gradients are not all 0.
"$glint" sft --model model --dataset arith.jsonl --train-type full --lr 3e-3 --batch-size 32 --max-steps 60 \
  --lr-scheduler constant --output warm > warm.log 2>&1 || { cat warm.log; fail "the warm-up"; }
sft() { "$glint" sft --model model --dataset arith.jsonl --lr 3e-3 --batch-size 16 --max-steps 20 --save-every 10 \
          --output "sft/$1/run" > "sft-$1.log" 2>&1 || { cat "sft-$1.log"; fail "sft run $1"; }; }
grpo() { "$glint" grpo --model warm/last --dataset arith.jsonl --max-tokens 12 --max-prompt-length 64 --lr 1e-3 \
           --prompts-per-step 8 --num-generations 4 --max-steps 6 --save-every 3 --output "grpo/$1/run" \
           > "grpo-$1.log" 2>&1 || { cat "grpo-$1.log"; fail "grpo run $1"; }; }
for job in sft grpo; do
  for ((i = 1; i <= runs; i += 2)); do
    "$job" "$i" &
    a=$!
    ((i + 1 <= runs)) && { "$job" $((i + 1)) & b=$!; wait "$b"; }
    wait "$a"
  done
done
python3 - "$runs" <<'PY'
import glob, hashlib, json, sys
runs = int(sys.argv[1])
def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()
def metrics(path):
    rows = [json.loads(l) for l in open(path)]
    return [{k: v for k, v in r.items() if not (k.endswith("_seconds") or k.endswith("per_second"))} for r in rows]
for job in ("sft", "grpo"):
    first = None
    for i in range(1, runs + 1):
        d = f"{job}/{i}/run"
        files = sorted(p[len(d) + 1:] for p in glob.glob(d + "/**/*.safetensors", recursive=True))
        seen = {"files": files, "weights": {f: digest(f"{d}/{f}") for f in files}, "metrics": metrics(d + "/metrics.jsonl"),
                "compute": open(d + "/compute.json").read()}
        assert len(files) >= 3, (d, files)
        if first is None:
            first = seen
            if job == "grpo":
                rewards = {r["reward/total/mean"] for r in seen["metrics"]}
                norms = {r["grad_norm"] for r in seen["metrics"]}
                assert len(rewards) > 1 and norms != {0}, ("a GRPO run that learns nothing proves little", rewards, norms)
            continue
        for key in ("files", "compute", "metrics", "weights"):
            if seen[key] != first[key]:
                diff = [f for f in files if seen["weights"].get(f) != first["weights"].get(f)] if key == "weights" else ""
                raise SystemExit(f"FAIL: {job} run {i} differs from run 1 in its {key} {diff}")
    print(f"{job}: {runs} runs, {len(first['files'])} weight files and {len(first['metrics'])} steps, all identical")
PY
