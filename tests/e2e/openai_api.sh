#!/usr/bin/env bash
# The OpenAI-compatible endpoint of `glint serve` (/v1 on the Tinker port),
# driven by OpenAI's own Node.js client (the npm package openai, which
# scripts/setup_openai.sh installs; tests/tinker/openai_node.mjs) and by a
# hand-written OpenAI-protocol client (tests/tinker/openai_check.py: chat and
# text completions, n, seeds, logprobs, stop, tools, server-sent events, a
# tenant's own tinker:// weights, isolation, refused fields).
#   openai_api.sh GLINT_BINARY SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/serve_lib.sh"
glint=$1 src=$2
temp_root openai-api
cd "$root"
tiny_base "$glint" rows.jsonl qwen3 tools  # a chat template that renders tools and tool calls
start_server "$glint" "$root" "$(printf '[tinker]\nport = 0\nbase_model = "test/tiny-qwen3"\n')"
tport=$(grep -o 'Tinker-compatible API on http://127.0.0.1:[0-9]*' serve.out | grep -o '[0-9]*$')
[[ -n $tport ]] || { echo "no Tinker API port in:"; cat serve.out; exit 1; }
protoc --python_out="$root" -I"$src/rpc/tinker" tinker_public.proto  # tinker_client.py makes the sampler weights
alice=$(new_key "$glint" "$root" alice)
bob=$(new_key "$glint" "$root" bob)
PYTHONPATH="$root:$src/tests/tinker" timeout 300 /usr/bin/python3 "$src/tests/tinker/openai_check.py" \
  "http://127.0.0.1:$tport" "$alice" "$bob" test/tiny-qwen3 || { tail -30 serve.err; exit 1; }
if openai_node=$(bash "$src/scripts/setup_openai.sh" --installed) && command -v node > /dev/null; then
  NODE_PATH="$openai_node/node_modules" timeout 120 node "$src/tests/tinker/openai_node.mjs" \
    "http://127.0.0.1:$tport" "$alice" test/tiny-qwen3 || { tail -30 serve.err; exit 1; }
else
  echo "openai.endpoint: the npm openai client is not installed (scripts/setup_openai.sh): its part is skipped"
fi
