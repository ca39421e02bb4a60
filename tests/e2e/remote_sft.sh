#!/usr/bin/env bash
# The SFT example, unchanged, against `glint serve`: a server hosts the base
# model the example makes, a key is made for a tenant, and the example run
# in remote mode writes the same losses as the local run (within 1e-5),
# with its checkpoints on the driver's side. SIGTERM stops the server
# cleanly.
#   remote_sft.sh SFT_BINARY GLINT_BINARY
set -euo pipefail
source "$(dirname "$0")/serve_lib.sh"
sft=$1 glint=$2
temp_root remote-sft
args=(--steps 20 --eval-every 10)
"$sft" --out "$root/local" "${args[@]}" > "$root/local.log" 2>&1 || { cat "$root/local.log"; exit 1; }
start_server "$glint" "$root"
key=$(new_key "$glint" "$root" alice)
GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=$key "$sft" --out "$root/remote" "${args[@]}" > "$root/remote.log" 2>&1 \
  || { cat "$root/remote.log"; tail -20 "$root/serve.err"; exit 1; }
grep -q "with the adapter: " "$root/remote.log" || { cat "$root/remote.log"; exit 1; }
ls "$root"/remote/checkpoint-*/model/adapter_model.safetensors > /dev/null
# metrics.jsonl prints 6 significant digits: each printed value is within
# half a unit of its 6th digit of the real one, which the bound allows for.
# (Two local runs differ by about 1e-6 too: BLAS threads sum in any order.)
python3 - "$root/local/metrics.jsonl" "$root/remote/metrics.jsonl" <<'PY'
import json, math, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
def rounding(v):
    return 0.5 * 10 ** (math.floor(math.log10(abs(v))) - 5) if v else 0
for x, y in zip(a, b):
    for k in ("loss", "eval_loss", "grad_norm"):
        if k in x or k in y:
            assert abs(x[k] - y[k]) <= 1e-5 + rounding(x[k]) + rounding(y[k]), (x["step"], k, x[k], y[k])
print("remote SFT losses equal the local run's over", len(a), "steps")
PY
# A wrong key is refused, naming the key as the problem.
code=0
GLINT_REMOTE_URL=127.0.0.1:$port GLINT_API_KEY=tml-wrong "$sft" --out "$root/wrong" "${args[@]}" > "$root/wrong.log" 2>&1 || code=$?
[[ $code != 0 ]] && grep -q "API key is not valid" "$root/wrong.log" || { echo "a wrong key was not refused"; cat "$root/wrong.log"; exit 1; }
grep -q "tenant=alice method=forward_backward" "$root/serve.err" || { echo "no call log line"; tail "$root/serve.err"; exit 1; }
kill -TERM "$server"
code=0
wait "$server" || code=$?
server=
[[ $code == 0 ]] || { echo "the server exited $code at SIGTERM"; tail "$root/serve.err"; exit 1; }
grep -q "glint serve: stopped" "$root/serve.err" || { tail "$root/serve.err"; exit 1; }
