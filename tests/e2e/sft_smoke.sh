#!/usr/bin/env bash
# SFT example smoke test: a short LoRA run saves its best checkpoint, lists
# it, and the synced adapter answers.
#   sft_smoke.sh SFT_BINARY GLINT_BINARY local|cluster
set -euo pipefail
sft=$1 glint=$2 mode=$3
root=$(mktemp -d /tmp/glint-sft-smoke-XXXXXX)
trap 'rm -rf "$root"' EXIT
args=(--out "$root/sft" --steps 40 --eval-every 10)
if [[ $mode == cluster ]]; then cmd=("$glint" run --nproc 2 -- "$sft" "${args[@]}"); else cmd=("$sft" "${args[@]}"); fi
"${cmd[@]}" > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
grep -q "best held-out loss" "$root/log" || { cat "$root/log"; exit 1; }
grep -q "with the adapter: " "$root/log" || { cat "$root/log"; exit 1; }
[[ $(grep -c '"eval_loss"' "$root/sft/metrics.jsonl") == 4 ]] || { echo "expected 4 evaluations"; exit 1; }
"$glint" checkpoints sft --root "$root" | grep -q "checkpoint-" || { "$glint" checkpoints sft --root "$root"; exit 1; }
ls "$root"/sft/checkpoint-*/model/adapter_model.safetensors > /dev/null
# The held-out loss falls.
first=$(grep -o '"eval_loss": [0-9.]*' "$root/sft/metrics.jsonl" | head -1 | cut -d' ' -f2)
last=$(grep -o '"eval_loss": [0-9.]*' "$root/sft/metrics.jsonl" | tail -1 | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "eval loss did not fall: $first -> $last"; exit 1; }
# The same --out again is refused, and the checkpoints stay; --fresh starts it over.
if [[ $mode == local ]]; then
  code=0
  "$sft" "${args[@]}" > "$root/again" 2>&1 || code=$?
  [[ $code == 2 ]] || { echo "reusing the run directory exited $code, not 2"; cat "$root/again"; exit 1; }
  grep -q "has checkpoints already" "$root/again" || { cat "$root/again"; exit 1; }
  ls "$root"/sft/checkpoint-*/model/adapter_model.safetensors > /dev/null
  "$sft" --out "$root/sft" --steps 10 --eval-every 10 --fresh > "$root/fresh" 2>&1 || { cat "$root/fresh"; exit 1; }
fi
echo "sft smoke ($mode): ok"
