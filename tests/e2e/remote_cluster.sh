#!/usr/bin/env bash
# `glint serve` as a 2-process cluster job (glint run --nproc 2): its model
# and sampler groups each span both processes (2 data-parallel ranks), and a
# driver in remote mode trains through them: the GRPO example, unchanged, in
# exclusive full-parameter mode. SIGTERM to the launcher stops the job.
#   remote_cluster.sh GRPO_BINARY GLINT_BINARY
set -euo pipefail
source "$(dirname "$0")/serve_lib.sh"
grpo=$1 glint=$2
temp_root remote-cluster
"$grpo" --out "$root/local" --sft-steps 0 --steps 1 --prompts 2 --generations 2 --save-every 0 > "$root/local.log" 2>&1 \
  || { cat "$root/local.log"; exit 1; }
start_server "$glint" "$root" "$(printf 'full_training = "exclusive"\n[groups]\nmodel_ranks = 2\nsampler_ranks = 2')" \
  run --nproc 2 --
grep -q "model group of 2 ranks on nodes 0,1, sampler group of 2 ranks on nodes 0,1" "$root/serve.out" \
  || { echo "the groups do not span the 2 processes"; cat "$root/serve.out" "$root/serve.err"; exit 1; }
key=$(new_key "$glint" "$root" alice)
GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$key "$grpo" --out "$root/remote" --sft-steps 10 --steps 3 --prompts 4 \
  --generations 4 --save-every 3 > "$root/remote.log" 2>&1 || { cat "$root/remote.log"; tail -20 "$root/serve.err"; exit 1; }
[[ $(grep -c '"phase": "grpo"' "$root/remote/metrics.jsonl") == 3 ]] || { cat "$root/remote/metrics.jsonl"; exit 1; }
ls "$root"/remote/step-3/model/{model,optimizer}.safetensors > /dev/null
kill -TERM "$server"
code=0
wait "$server" || code=$?
server=
[[ $code == 0 ]] || { echo "the job exited $code at SIGTERM"; tail "$root/serve.err"; exit 1; }
echo "remote cluster: ok"
