#!/usr/bin/env bash
# End-to-end GRPO smoke test: a few SFT and GRPO steps of examples/grpo, in
# local mode or as a 2-process cluster job; checks the metrics and the plot.
#   grpo_smoke.sh GRPO_BINARY GLINT_BINARY local|cluster
set -euo pipefail
grpo=$1 glint=$2 mode=$3
root=$(mktemp -d /tmp/glint-grpo-smoke-XXXXXX)
trap 'rm -rf "$root"' EXIT
out=$root/grpo  # the run; its index lives in $root, private to this test
args=(--out "$out" --sft-steps 5 --steps 3 --prompts 4 --generations 4)
if [[ $mode == cluster ]]; then
  "$glint" run --nproc 2 -- "$grpo" "${args[@]}" > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
  grep -q "cluster mode: the model group runs on node 0, the sampler group on node 1" "$root/log" || { cat "$root/log"; exit 1; }
else
  "$grpo" "${args[@]}" > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
fi
[[ $(grep -c '"phase": "grpo"' "$out/metrics.jsonl") == 3 ]] || { echo "expected 3 grpo lines"; cat "$out/metrics.jsonl"; exit 1; }
[[ $(grep -c '"phase": "sft"' "$out/metrics.jsonl") == 5 ]] || { echo "expected 5 sft lines"; exit 1; }
grep -q '"reward/total/mean"' "$out/metrics.jsonl"
grep -q '"loss"' "$out/metrics.jsonl"
grep -q "<svg" "$out/report.html"
grep -q "after GRPO" "$root/log"
echo "grpo smoke ($mode): ok"
