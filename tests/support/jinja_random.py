#!/usr/bin/env python3
"""Random Jinja templates for glint's interpreter to be checked against
Jinja2 on: expressions, filters, tests, loops, conditions, macros and
namespaces over a fixed context, drawn from a seeded grammar, each rendered
by Jinja2 in transformers' environment (jinja_reference.py).

Usage: python3 jinja_random.py SEED COUNT
stdout: a JSON list of {"template", "variables", "result"}, the result as
jinja_reference.render_all gives it ({"text", ...} or {"error"}).
"""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_reference  # noqa: E402

VARIABLES = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Héllo, wörld!  "},
        {"role": "assistant", "content": "<think>plan</think>Hi", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [1, 2.5, None]}}}]},
        {"role": "tool", "content": "42"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {"type": "object"}}}],
    "n": 7, "f": 2.5, "neg": -3, "s": "a,b,,c", "u": "日本語 😀", "e": "", "t": True, "z": 0, "none_value": None,
    "items": [3, 1, 2], "words": ["b", "A", "c"], "d": {"k": "v", "n": 1, "list": [1, 2]},
}

NAMES = ["n", "f", "neg", "s", "u", "e", "t", "z", "none_value", "items", "words", "d", "missing"]
STRINGS = ["'x'", "'a b'", "\"q'uote\"", "'\\n'", "'é'", "''", "'12'", "' pad '"]
NUMBERS = ["0", "1", "2", "-1", "3.5", "10", "1e3", "0.1"]


class Gen:
    def __init__(self, rng):
        self.r = rng

    def pick(self, xs):
        return self.r.choice(xs)

    def atom(self):
        k = self.r.random()
        if k < 0.35:
            return self.pick(NAMES)
        if k < 0.55:
            return self.pick(STRINGS)
        if k < 0.7:
            return self.pick(NUMBERS)
        if k < 0.78:
            return self.pick(["true", "false", "none"])
        if k < 0.86:
            return "messages[%d].%s" % (self.r.randrange(-2, 4), self.pick(["role", "content", "tool_calls", "name"]))
        if k < 0.92:
            return "[%s]" % ", ".join(self.atom() for _ in range(self.r.randrange(0, 3)))
        return "d['%s']" % self.pick(["k", "n", "list", "nope"])

    def expr(self, depth=0):
        if depth > 2:
            return self.atom()
        k = self.r.random()
        if k < 0.25:
            return self.atom()
        if k < 0.45:
            return "%s | %s" % (self.expr(depth + 1), self.filter())
        if k < 0.6:
            op = self.pick(["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "and", "or", "in", "not in"])
            return "(%s %s %s)" % (self.expr(depth + 1), op, self.expr(depth + 1))
        if k < 0.7:
            return "(%s is %s%s)" % (self.expr(depth + 1), self.pick(["", "not "]), self.test())
        if k < 0.78:
            return "(%s if %s else %s)" % (self.expr(depth + 1), self.expr(depth + 1), self.expr(depth + 1))
        if k < 0.86:
            return "%s%s" % (self.pick(NAMES[:6] + STRINGS[:4]), self.method())
        if k < 0.93:
            return "%s[%s:%s]" % (self.pick(["s", "u", "items", "words", "'abcdef'"]), self.pick(["", "1", "-2"]),
                                  self.pick(["", "2", "-1"]))
        return "not %s" % self.expr(depth + 1)

    def filter(self):
        return self.pick([
            "length", "upper", "lower", "trim", "first", "last", "list", "string", "int", "float", "abs",
            "tojson", "tojson(indent=2)", "join(',')", "join", "default('D')", "default('D', true)", "reverse",
            "sort", "unique", "capitalize", "title", "length > 2", "replace('a', 'Z')", "items", "sum", "min", "max",
            "selectattr('role', 'equalto', 'user') | list", "map(attribute='role') | list", "select | list",
            "reject('none') | list", "indent(2)", "round(1)", "wordcount", "center(9)", "dictsort", "e",
        ])

    def test(self):
        return self.pick(["defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                          "iterable", "sequence", "odd", "even", "true", "false", "boolean", "divisibleby 2",
                          "in [1, 'x']", "eq 7", "lower", "upper"])

    def method(self):
        return self.pick([".strip()", ".split(',')", ".split()", ".upper()", ".startswith('a')", ".endswith(' ')",
                          ".replace('a', 'b')", ".lstrip('a ')", ".rstrip()", ".title()", ".find('b')",
                          ".count('a')", ".splitlines()", ".isdigit()"])

    def stmt(self, depth=0):
        k = self.r.random()
        if depth > 1 or k < 0.3:
            return "{{ %s }}" % self.expr()
        if k < 0.45:
            return "{%% if %s %%}%s{%% elif %s %%}%s{%% else %%}%s{%% endif %%}" % (
                self.expr(), self.stmt(depth + 1), self.expr(), self.stmt(depth + 1), self.stmt(depth + 1))
        if k < 0.62:
            body = self.stmt(depth + 1) + self.pick(["{{ loop.index }}", "{{ loop.first }}", "{{ loop.last }}",
                                                     "{{ loop.revindex0 }}", "{{ loop.length }}", ""])
            return "{%% for x in %s %%}[{{ x }}]%s{%% else %%}E{%% endfor %%}" % (
                self.pick(["items", "words", "messages", "s", "d", "range(3)", "missing", "d.items()"]), body)
        if k < 0.72:
            return "{%% set v = %s %%}{{ v }}" % self.expr()
        if k < 0.8:
            return ("{%% set ns = namespace(c=0) %%}{%% for m in messages %%}{%% if %s %%}{%% set ns.c = ns.c + 1 %%}"
                    "{%% endif %%}{%% endfor %%}{{ ns.c }}" % self.expr())
        if k < 0.88:
            return "{%% macro m(a, b='B') %%}<{{ a }}|{{ b }}>{%% endmacro %%}{{ m(%s) }}{{ m(%s, b=%s) }}" % (
                self.expr(), self.expr(), self.expr())
        if k < 0.94:
            ws = self.pick(["-", "", "+"])
            return "\n  {%%%s if %s %s%%}\n  y\n  {%%%s endif %s%%}\n" % (ws, self.expr(), "-" if ws == "-" else "",
                                                                       ws, self.pick(["-", ""]))
        return "{%% set b %%}%s{%% endset %%}{{ b | trim }}" % self.stmt(depth + 1)


def main():
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    gen = Gen(random.Random(seed))
    templates = [" ".join(gen.stmt() for _ in range(gen.r.randrange(1, 4))) for _ in range(count)]
    out = []
    for t in templates:
        # A copy per case: Jinja2's indent filter extends a list given to it in place.
        result = jinja_reference.render_all(t, [json.loads(json.dumps(VARIABLES))])[0]
        out.append({"template": t, "variables": VARIABLES, "result": result})
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
