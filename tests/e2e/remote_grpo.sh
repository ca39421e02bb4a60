#!/usr/bin/env bash
# The GRPO example, unchanged, against `glint serve`: it trains the whole
# model, which a server allows one tenant at a time (full_training =
# "exclusive"). The server hosts the base the example makes; the remote run
# completes with rising reward, its checkpoints (full weights and optimizer
# state, fetched from the server) on the driver's side, and a second tenant
# is refused while it trains.
#   remote_grpo.sh GRPO_BINARY GLINT_BINARY
set -euo pipefail
source "$(dirname "$0")/serve_lib.sh"
grpo=$1 glint=$2
temp_root remote-grpo
# A short warm-up leaves the answer format half learned, so GRPO's rise is
# large (reward about 0.2 -> 0.75 over 40 steps locally, three seeds) next to
# the noise of 10-step means; after 60 warm-up steps the format was learned
# and the rise (about +0.04) was within the noise.
args=(--sft-steps 20 --steps 40 --prompts 8 --generations 8 --lr 5e-4 --save-every 20)
# The base model: what the example makes on its first run (no steps needed).
"$grpo" --out "$root/local" --sft-steps 0 --steps 1 --prompts 2 --generations 2 --save-every 0 > "$root/local.log" 2>&1 \
  || { cat "$root/local.log"; exit 1; }
start_server "$glint" "$root" 'full_training = "exclusive"'
key=$(new_key "$glint" "$root" alice)
other=$(new_key "$glint" "$root" bob)
GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$key "$grpo" --out "$root/remote" "${args[@]}" > "$root/remote.log" 2>&1 &
driver=$!
# While Alice trains the full model, Bob's driver is refused, saying why.
for _ in $(seq 300); do grep -q "tenant alice trains the full model" "$root/serve.err" && break; sleep 0.1; done
code=0
GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$other "$grpo" --out "$root/b/bob" --sft-steps 1 --steps 1 --prompts 2 \
  --generations 2 --save-every 0 > "$root/bob.log" 2>&1 || code=$?
[[ $code != 0 ]] && grep -q "another tenant is training the full model" "$root/bob.log" \
  || { echo "a second tenant was not refused"; cat "$root/bob.log"; exit 1; }
wait "$driver" || { cat "$root/remote.log"; tail -20 "$root/serve.err"; exit 1; }
grep -q "after GRPO" "$root/remote.log" || { cat "$root/remote.log"; exit 1; }
ls "$root"/remote/step-{20,40}/model/{model,optimizer}.safetensors > /dev/null
python3 - "$root/remote/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
grpo = [r["reward/total/mean"] for r in rows if r["phase"] == "grpo"]
assert len(grpo) == 40, len(grpo)
first, last = sum(grpo[:10]) / 10, sum(grpo[-10:]) / 10
print(f"remote GRPO reward: {first:.3f} over the first 10 steps, {last:.3f} over the last 10")
assert last > first, "the reward did not rise"
PY
# The driver gone, the base is restored and Bob is served.
for _ in $(seq 300); do grep -q "the base model is restored" "$root/serve.err" && break; sleep 0.1; done
GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$other "$grpo" --out "$root/b/bob" --sft-steps 2 --steps 1 --prompts 2 \
  --generations 2 --save-every 0 > "$root/bob.log" 2>&1 || { cat "$root/bob.log"; tail "$root/serve.err"; exit 1; }
grep -q "the base model is restored" "$root/serve.err" || { tail "$root/serve.err"; exit 1; }
kill -TERM "$server"
wait "$server"
server=
