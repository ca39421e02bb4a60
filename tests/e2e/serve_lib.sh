# Shared by the remote-mode scripts: `glint serve` on a free loopback port.
#   temp_root NAME
# sets $root to a fresh directory, removed at exit with the server killed.
temp_root() {
  root=$(mktemp -d "/tmp/glint-$1-XXXXXX")
  server=
  trap '[[ -n $server ]] && kill -9 "$server" 2>/dev/null; rm -rf "$root"' EXIT
  # Under set -e a failed assignment ends the script without a word: say where.
  trap 'echo "${BASH_SOURCE[0]}:$LINENO: \`$BASH_COMMAND\` failed (exit $?)" >&2' ERR
}
#   tiny_base GLINT [ROWS [ARCH [CHAT_TEMPLATE]]]
# makes the tiny base model every remote-mode script serves, in ./local/model,
# with a tokenizer trained on ROWS (default: ./rows.jsonl, written here when
# absent: 40 lines of one sentence); ARCH qwen3 (default), an MoE family
# (qwen3_moe, qwen2_moe: 4 experts, 2 per token) or Qwen3.5 (qwen3_5: a
# Gated DeltaNet layer, then gated attention).
tiny_base() {
  local glint=$1 rows=${2:-rows.jsonl} arch=${3:-qwen3} template=${4:-chatml}
  local experts=()
  [[ $arch == *_moe ]] && experts=(--experts 4 --experts-per-tok 2)
  [[ $arch == qwen3_5* ]] && experts+=(--head-dim 16)
  mkdir -p local
  [[ -f $rows ]] || printf '{"text": "the quick brown fox jumps over the lazy dog %d times"}\n' $(seq 40) > "$rows"
  "$glint" init-model local/model --arch "$arch" "${experts[@]}" --hidden 64 --intermediate 128 --layers 2 --heads 4 \
    --kv-heads 2 --vocab 400 --max-positions 256 --tokenizer-from "$rows" --chat-template "$template" > init.log 2>&1 \
    || { cat init.log; exit 1; }
}
#   start_server GLINT ROOT [EXTRA_TOML [LAUNCHER_ARGS...]]
# writes ROOT/serve.toml (the base in ROOT/local/model, state in
# ROOT/state, EXTRA_TOML added after the top-level keys), starts the server
# (as `GLINT LAUNCHER_ARGS... GLINT serve ...` when LAUNCHER_ARGS are given,
# e.g. run --nproc 2 --) with its output in ROOT/serve.out and
# ROOT/serve.err, waits until it says where the groups run, and sets
# $server (its pid) and $port.
start_server() {
  local glint=$1 dir=$2 extra=${3:-}
  shift 3 || shift $#
  printf 'model = "local/model"\nstate_dir = "state"\n%s\n[listen]\nport = 0\n' "$extra" > "$dir/serve.toml"
  local prefix=()
  (($# > 0)) && prefix=("$glint" "$@")
  # A second server in the same directory: the shell truncates serve.out in
  # the child after the fork, so without this the wait below could read the
  # previous server's lines (and its port) before the new one starts.
  rm -f "$dir/serve.out" "$dir/serve.err"
  "${prefix[@]}" "$glint" serve --config "$dir/serve.toml" > "$dir/serve.out" 2> "$dir/serve.err" &
  server=$!
  for _ in $(seq 300); do
    grep -q "sampler group of" "$dir/serve.out" 2>/dev/null && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  port=$(grep -o '127.0.0.1:[0-9]*' "$dir/serve.out" 2>/dev/null | head -1 | cut -d: -f2 || true)
  [[ -n $port ]] || { echo "the server did not start"; cat "$dir/serve.err"; exit 1; }
}
# new_key GLINT ROOT TENANT: prints a key for TENANT (the config must exist).
new_key() { "$1" serve keys create --tenant "$3" --config "$2/serve.toml" 2> /dev/null; }
