#!/usr/bin/env bash
# The installed glint works away from its build and source trees:
# `cmake --install` into a fresh prefix, then, from a directory outside both,
# `glint info` and `glint bench actors` (local) run and print what they should,
# and the Python baselines of `glint bench` are installed where it looks.
#   install.sh BUILD_DIR
set -euo pipefail
build=$1
prefix=$(mktemp -d /tmp/glint-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > "$prefix.log" 2>&1 || { cat "$prefix.log"; rm -f "$prefix.log"; exit 1; }
rm -f "$prefix.log"
[[ -x $prefix/bin/glint ]] || { echo "no $prefix/bin/glint"; exit 1; }
for f in train_baseline.py sample_baseline.py; do
  [[ -f $prefix/share/glint/python/$f ]] || { echo "no $prefix/share/glint/python/$f"; exit 1; }
done
cd "$prefix"
out=$("$prefix/bin/glint" info) || { echo "$out"; exit 1; }
grep -q "glint.model" <<<"$out" || { echo "glint info lists no actor types:"; echo "$out"; exit 1; }
out=$("$prefix/bin/glint" bench actors --mode local --repeats 1) || { echo "$out"; exit 1; }
grep -Eq '^typed_call_overhead_us: -?[0-9.]+$' <<<"$out" || { echo "no typed_call_overhead_us line:"; echo "$out"; exit 1; }
echo "install: ok"
