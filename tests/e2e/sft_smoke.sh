#!/usr/bin/env bash
# SFT example smoke test: a short LoRA run saves its best checkpoint, lists
# it, and the synced adapter answers; --adapter-from starts a run from the
# saved adapter, which scores as it did when saved.
# mesh: the same with the base sharded over two ranks (--mesh fsdp=2).
#   sft_smoke.sh SFT_BINARY GLINT_BINARY local|cluster|mesh
set -euo pipefail
sft=$1 glint=$2 mode=$3
root=$(mktemp -d /tmp/glint-sft-smoke-XXXXXX)
trap 'rm -rf "$root"' EXIT
args=(--out "$root/sft" --steps 40 --eval-every 10)
if [[ $mode == mesh ]]; then
  args+=(--mesh fsdp=2)
  # tp and pp train the full model: refused before anything runs.
  code=0; "$sft" --out "$root/tp" --mesh tp=2 > "$root/tp.log" 2>&1 || code=$?
  [[ $code == 2 ]] && grep -q "train the full model" "$root/tp.log" || { echo "--mesh tp=2 was not refused"; cat "$root/tp.log"; exit 1; }
fi
if [[ $mode == cluster ]]; then cmd=("$glint" run --nproc 2 -- "$sft" "${args[@]}"); else cmd=("$sft" "${args[@]}"); fi
"${cmd[@]}" > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
grep -q "best held-out loss" "$root/log" || { cat "$root/log"; exit 1; }
grep -q "with the adapter: " "$root/log" || { cat "$root/log"; exit 1; }
[[ $(grep -c '"eval_loss"' "$root/sft/metrics.jsonl") == 4 ]] || { echo "expected 4 evaluations"; exit 1; }
"$glint" checkpoints sft --root "$root" | grep -q "checkpoint-" || { "$glint" checkpoints sft --root "$root"; exit 1; }
if [[ $mode == local ]]; then
  # A step directory deleted by hand is listed as gone, not as a checkpoint.
  cp -r "$root/sft/checkpoint-10" "$root/kept-10"
  rm -rf "$root/sft/checkpoint-10"
  "$glint" checkpoints sft --root "$root" > "$root/listing"
  grep -q "checkpoint-10 .*GONE" "$root/listing" && grep -q "1 of these are gone" "$root/listing" ||
    { cat "$root/listing"; echo "a deleted checkpoint was listed as there"; exit 1; }
  mv "$root/kept-10" "$root/sft/checkpoint-10"
fi
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
  # A run shorter than the usual warm-up runs (it failed on a warmup_steps nobody set).
  "$sft" --out "$root/short" --steps 4 --eval-every 2 > "$root/short.log" 2>&1 || { cat "$root/short.log"; exit 1; }
fi
# --adapter-from: the best checkpoint's adapter names its base and, loaded
# into a new run, scores the held-out rows exactly as when it was saved.
last=$root/log
[[ $mode == local ]] && last=$root/fresh  # --fresh above replaced the first run's checkpoints
best=$(grep -o 'best held-out loss [0-9.]*: [^ ]*' "$last" | head -1)
best_loss=$(echo "$best" | cut -d' ' -f4 | tr -d :)
best_dir=$(echo "$best" | cut -d' ' -f5)/model
grep -q "\"base_model_name_or_path\": \"$root/sft/model\"" "$best_dir/adapter_config.json" \
  || { echo "the adapter does not name its base"; cat "$best_dir/adapter_config.json"; exit 1; }
cp -r "$best_dir" "$root/adapter"
from=(--out "$root/sft" --steps 10 --eval-every 10 --fresh --adapter-from "$root/adapter")
if [[ $mode == cluster ]]; then cmd=("$glint" run --nproc 2 -- "$sft" "${from[@]}"); else cmd=("$sft" "${from[@]}"); fi
"${cmd[@]}" > "$root/from" 2>&1 || { cat "$root/from"; exit 1; }
grep -q "held-out loss of the adapter from $root/adapter: $best_loss\$" "$root/from" \
  || { echo "expected the loaded adapter's held-out loss to be $best_loss"; cat "$root/from"; exit 1; }
grep -q "with the adapter: " "$root/from" || { cat "$root/from"; exit 1; }
# A directory that is not an adapter is an error naming the file, before any step.
code=0
"$sft" --out "$root/sft" --steps 10 --fresh --adapter-from "$root/nope" > "$root/bad" 2>&1 || code=$?
[[ $code == 1 ]] || { echo "--adapter-from a missing directory exited $code, not 1"; cat "$root/bad"; exit 1; }
grep -q "$root/nope/adapter_config.json" "$root/bad" || { cat "$root/bad"; exit 1; }
echo "sft smoke ($mode): ok"
