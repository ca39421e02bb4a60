#!/usr/bin/env python3
"""Finds Results dereferenced without a check: `*f(...)`, `*X::f(...)`,
`*x.f(...)` or `*x->f(...)` where f is declared somewhere in the tree to
return `Result<...>` (a `caf::expected`, whose operator* on an error is
undefined behaviour, an abort at best). Prints each as file:line and exits 1
when there is one.

  python3 scripts/check_results.py [ROOT] [--expect N]

With --expect N it succeeds when it finds exactly N (its own test, on a
fixture tree).

A deliberate dereference (one the lines above have checked) is spelled
`.value()` or `*checked` on a named variable, which this does not flag.
"""
import pathlib
import re
import sys

args = sys.argv[1:]
expect = None
if "--expect" in args:
    i = args.index("--expect")
    expect = int(args[i + 1])
    del args[i:i + 2]
ROOT = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent)
# Tests dereference freely: a test that aborts still fails.
DIRS = ["runtime", "placement", "components", "actors", "rpc", "launcher", "examples", "bench"]

decl = re.compile(r"\bResult<[^;{}()]*?>\s+(?:[A-Za-z_]\w*::)*([A-Za-z_]\w*)\s*\(")
files = [p for d in DIRS if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*") if p.suffix in (".hpp", ".cpp", ".h")]
names = set()
for p in files:
    names.update(decl.findall(p.read_text(errors="replace")))
# Names that are also common plain-value members (std containers, smart
# pointers, at::Tensor): not checked, or every `*v.begin()` would be flagged.
names -= {"begin", "end", "size", "get", "front", "back", "data", "tensor", "run"}
if not names:
    sys.exit("check_results: found no function returning Result under " + str(ROOT))
call = re.compile(r"\*\s*(?:[A-Za-z_][\w:]*(?:\([^()]*\))?(?:\.|->|::))*(" + "|".join(sorted(map(re.escape, names))) +
                  r")(?:<[^<>()]*>)?\s*\(")
bad = 0
for p in sorted(files):
    for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
        code = line.split("//", 1)[0]
        for m in call.finditer(code):
            before = code[:m.start()].rstrip()
            word = re.search(r"\w+$", before)
            if before and (before[-1] in ")]" or (word and word.group() not in ("return", "co_return", "throw"))):
                continue  # a multiplication
            print(f"{p.relative_to(ROOT)}:{n}: unchecked Result of {m.group(1)}(): {line.strip()}")
            bad += 1
if expect is not None:
    print(f"check_results: found {bad}, expected {expect}")
    sys.exit(0 if bad == expect else 1)
if bad:
    print(f"check_results: {bad} unchecked Result dereference(s); check the Result first "
          "(if (!r) return r.error();)", file=sys.stderr)
    sys.exit(1)
print(f"check_results: no unchecked Result dereference ({len(names)} functions returning Result, {len(files)} files)")
