# Shared by the recipe tests (sft_recipe.sh, grpo_recipe.sh, dpo_recipe.sh):
# set $glint and $recipe (sft, grpo or dpo), then source this file.
fail() { echo "FAIL: $*"; exit 1; }
#   expect_refusal NAME PATTERN ARGS...
# runs `glint $recipe ARGS... --output runs/NAME` and checks that it is
# refused as bad input: exit code 2, one error line that says PATTERN, and
# no run directory written.
expect_refusal() {
  local name=$1 pattern=$2; shift 2
  local code=0
  "$glint" "$recipe" "$@" --output "runs/$name" > "$name.out" 2> "$name.err" || code=$?
  [[ $code == 2 ]] || { cat "$name.err"; fail "$name: exit $code, not 2"; }
  [[ $(wc -l < "$name.err") == 1 ]] || { cat "$name.err"; fail "$name: not one error line"; }
  grep -q -- "$pattern" "$name.err" || { cat "$name.err"; fail "$name: the error does not say '$pattern'"; }
  [[ ! -e runs/$name ]] || fail "$name: runs/$name was written"
}
# mean METRICS KEY FROM TO: the mean of KEY over the steps FROM..TO of a
# metrics.jsonl (rows without KEY, as evaluation rows, left out).
mean() {
  python3 -c "import json,sys
rows=[json.loads(l) for l in open('$1')]
rows=[r for r in rows if $3 <= r['step'] <= $4 and '$2' in r]
print('%.6f' % (sum(r['$2'] for r in rows)/len(rows)))"
}
