#!/usr/bin/env bash
# End-to-end GRPO smoke test: a few SFT and GRPO steps of examples/grpo, in
# local mode or as a 2-process cluster job; checks the metrics and the plot.
# async: --max-staleness 2 twice gives the same rows (finish_old: a batch's
# samples do not depend on timing), every row within the bound, and a
# resume continues the run.
# mesh: the model cut into 2 pipeline stages (--mesh pp=2); tp=2 and fsdp=2
# run their steps too, fsdp=2 also as a 2-process job.
#   grpo_smoke.sh GRPO_BINARY GLINT_BINARY local|cluster|async|mesh
set -euo pipefail
grpo=$1 glint=$2 mode=$3
root=$(mktemp -d /tmp/glint-grpo-smoke-XXXXXX)
trap 'rm -rf "$root"' EXIT
out=$root/grpo  # the run; its index lives in $root, private to this test
args=(--out "$out" --sft-steps 5 --steps 3 --prompts 4 --generations 4)
if [[ $mode == async ]]; then
  args=(--sft-steps 5 --prompts 4 --generations 4 --max-staleness 2 --save-every 2)
  "$grpo" --out "$out" "${args[@]}" --steps 4 > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
  "$grpo" --out "$root/again" "${args[@]}" --steps 4 > "$root/log2" 2>&1 || { cat "$root/log2"; exit 1; }
  grep -q "asynchronous GRPO: up to 2 steps of staleness, loss decoupled_ppo, policy finish_old" "$root/log" ||
    { cat "$root/log"; exit 1; }
  grep -q "grpo phase: 4 steps in" "$root/log" || { cat "$root/log"; exit 1; }
  /usr/bin/python3 - "$out/metrics.jsonl" "$root/again/metrics.jsonl" <<'PY' || exit 1
import json, sys
def rows(path):
    out = []
    for line in open(path):
        r = json.loads(line)
        out.append({k: v for k, v in r.items() if "second" not in k and k != "time"})
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
# The same samples and numbers, up to the last bits BLAS may change when
# batches share engine steps in one run and not in the other.
assert len(a) == len(b), "two runs of --max-staleness 2 wrote different row counts"
for x, y in zip(a, b):
    assert x.keys() == y.keys(), (x, y)
    for k in x:
        same = x[k] == y[k] or (isinstance(x[k], float) and isinstance(y[k], float)
                                and abs(x[k] - y[k]) <= 1e-4 * max(1.0, abs(x[k])))
        assert same, "two runs of --max-staleness 2 differ at step %s: %s %s vs %s" % (x["step"], k, x[k], y[k])
grpo = [r for r in a if r["phase"] == "grpo"]
assert len(grpo) == 4, grpo
for r in grpo:
    assert r["staleness/max"] == min(r["step"] - 1, 2), r
    assert "capped_fraction" in r and "loss" in r, r
PY
  "$grpo" --out "$out" "${args[@]}" --steps 5 --resume step-2 > "$root/log3" 2>&1 || { cat "$root/log3"; exit 1; }
  grep -q "resumed run grpo at GRPO step 2" "$root/log3" || { cat "$root/log3"; exit 1; }
  [[ $(grep -c '"phase": "grpo"' "$out/metrics.jsonl") == 5 ]] || { echo "expected 5 grpo lines after the resume"; cat "$out/metrics.jsonl"; exit 1; }
  "$grpo" --out "$root/bad" --max-staleness 9 > "$root/log4" 2>&1 && { echo "--max-staleness 9 was accepted"; exit 1; }
  grep -q "max-staleness" "$root/log4" || { cat "$root/log4"; exit 1; }
  echo "grpo smoke (async): ok"
  exit 0
elif [[ $mode == mesh ]]; then
  for m in tp=2 fsdp=2; do
    "$grpo" --out "$root/${m%=*}" --sft-steps 5 --steps 2 --prompts 4 --generations 4 --mesh $m > "$root/log" 2>&1 \
      || { cat "$root/log"; exit 1; }
    [[ $(grep -c '"phase": "grpo"' "$root/${m%=*}/metrics.jsonl") == 2 ]] || { echo "--mesh $m: expected 2 grpo lines"; exit 1; }
  done
  # fsdp=2 as a 2-process job: a model rank in each process, their Gloo groups across them.
  "$glint" run --nproc 2 -- "$grpo" --out "$root/cluster" --sft-steps 5 --steps 2 --prompts 4 --generations 4 \
    --mesh fsdp=2 > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
  grep -q "cluster mode: the model group runs on node 0,1 (mesh fsdp=2 (2 ranks))" "$root/log" || { cat "$root/log"; exit 1; }
  "$grpo" "${args[@]}" --mesh pp=2 > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
elif [[ $mode == cluster ]]; then
  "$glint" run --nproc 2 -- "$grpo" "${args[@]}" > "$root/log" 2>&1 || { cat "$root/log"; exit 1; }
  grep -q "cluster mode: the model group runs on node 0 (mesh single rank (1 rank)), the sampler group on node 1" "$root/log" || { cat "$root/log"; exit 1; }
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
