#!/usr/bin/env bash
# Resume equality: a run stopped after a checkpoint and resumed with
# --resume latest logs the same reward, loss and grad norm at every later
# step as an uninterrupted run with the same seed; glint runs and glint
# checkpoints list what was saved.
#   grpo_resume.sh GRPO_BINARY GLINT_BINARY
set -euo pipefail
grpo=$1 glint=$2
# Each process picks its matmul backend by timing both (kernels.cpp); on a
# loaded machine two runs can pick differently and round differently. Pin it:
# what is compared here is the resume, not the backend.
export GLINT_MATMUL=aten
root=$(mktemp -d /tmp/glint-grpo-resume-XXXXXX)
trap 'rm -rf "$root"' EXIT
args=(--sft-steps 60 --prompts 4 --generations 4 --save-every 3)
run() { "$grpo" "$@" > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }; }
run --out "$root/whole" --steps 6 "${args[@]}"
run --out "$root/split" --steps 3 "${args[@]}"
run --out "$root/split" --steps 6 "${args[@]}" --resume latest
grep -q "resumed run split at GRPO step 3" "$root/log" || { cat "$root/log"; exit 1; }
# Timings differ between runs; everything else must not.
strip() { grep '"phase": "grpo"' "$1" | sed -E 's/"(tokens_per_second|[a-z_]*_seconds)": [^,}]*,? ?//g'; }
if ! diff <(strip "$root/whole/metrics.jsonl") <(strip "$root/split/metrics.jsonl"); then
  echo "the resumed run differs from the uninterrupted one"; exit 1
fi
[[ $(strip "$root/split/metrics.jsonl" | wc -l) == 6 ]] || { echo "expected 6 grpo steps"; exit 1; }
grep -q '"reward/accuracy/mean": 0\.[0-9]*[1-9]' "$root/whole/metrics.jsonl" || { echo "no reward to compare"; exit 1; }
"$glint" runs --root "$root" | grep -Eq '^split +.* 2  step-6 \(step 6\)' || { "$glint" runs --root "$root"; exit 1; }
"$glint" checkpoints split --root "$root" | grep -q "step-3" || exit 1
# --resume latest on a run with no checkpoint yet (a job killed before its
# first save) starts afresh, SFT warm-up included.
run --out "$root/new" --steps 1 --sft-steps 2 --prompts 2 --generations 2 --resume latest
grep -q "run new has no checkpoint yet: starting afresh" "$root/log" || { cat "$root/log"; exit 1; }
echo "grpo resume: ok"
