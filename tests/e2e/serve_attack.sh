#!/usr/bin/env bash
# `glint serve` under attack (tests/tinker/attack.py): deep nesting, keyless
# and slow bodies, a compression bomb, garbage protobuf, JSON and Cap'n
# Proto frames, bodies that would expand, queues that would grow, path
# tricks, a revoked key, and a flood of connections past the open-file
# limit (the server runs with a hard limit of 512 descriptors). After each,
# a well-behaved tenant is served and the server's memory stays bounded.
#   serve_attack.sh GLINT_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/serve_lib.sh"
glint=$1 src=$2
temp_root serve-attack
cd "$root"
tiny_base "$glint"
protoc --python_out="$root" -I"$src/rpc/tinker" tinker_public.proto
openssl rand -hex 32 > metrics.token
extra=$(printf '[metrics]\nport = 0\ntoken_file = "metrics.token"\n[tinker]\nport = 0\nbase_model = "test/tiny-qwen3"\nbody_seconds = 2\nseq_gap_seconds = 30\nconnections = 2000\n[limits]\nmessage_mib = 32\nrequest_mib = 32\nmemory_mib = 1\n')
# A low open-file limit, hard too (the server raises its soft limit to the
# hard one), so that the flood runs the server out of descriptors.
(ulimit -Hn 512 -Sn 512; start_server "$glint" "$root" "$extra"; echo "$server $port" > started)
read -r server port < started
tport=$(grep -o 'Tinker-compatible API on http://127.0.0.1:[0-9]*' serve.out | grep -o '[0-9]*$')
[[ -n $tport ]] || { echo "no Tinker API port in:"; cat serve.out; exit 1; }
alice=$(new_key "$glint" "$root" alice)
mallory=$(new_key "$glint" "$root" mallory)
revoked=$(new_key "$glint" "$root" eve)
"$glint" serve keys revoke "$revoked" --config serve.toml > /dev/null 2>&1
mport=$(grep -o 'metrics on http://127.0.0.1:[0-9]*' serve.out | grep -o '[0-9]*$')
[[ -n $mport ]] || { echo "no metrics port in:"; cat serve.out; exit 1; }
PYTHONPATH="$root:$src/tests/tinker" timeout 300 /usr/bin/python3 "$src/tests/tinker/attack.py" \
  "http://127.0.0.1:$tport" "$port" "$server" "$alice" "$mallory" test/tiny-qwen3 "$revoked" \
  "$mport" "$(cat metrics.token)" ||
  { tail -30 serve.err; exit 1; }
kill -0 "$server" || { echo "the server died"; tail -30 serve.err; exit 1; }
kill "$server"
for _ in $(seq 300); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
cp serve.err attack.err
# Fairness, on a server of default limits: a tenant's tight loop of
# forward_backward calls does not starve another's.
rm -rf state
start_server "$glint" "$root" "$(printf '[tinker]\nport = 0\nbase_model = "test/tiny-qwen3"\n')"
tport=$(grep -o 'Tinker-compatible API on http://127.0.0.1:[0-9]*' serve.out | grep -o '[0-9]*$')
alice=$(new_key "$glint" "$root" alice)
hog=$(new_key "$glint" "$root" hog)
PYTHONPATH="$root:$src/tests/tinker" timeout 300 /usr/bin/python3 "$src/tests/tinker/fairness.py" \
  "http://127.0.0.1:$tport" "$alice" "$hog" test/tiny-qwen3 || { tail -30 serve.err; exit 1; }
mv attack.err serve.err
# Refusals were logged, but rate-limited: a flood does not fill the disk.
lines=$(wc -l < serve.err)
echo "serve.err: $lines lines:"; cat serve.err
((lines < 400)) || { echo "the server logged $lines lines under attack"; tail -20 serve.err; exit 1; }
