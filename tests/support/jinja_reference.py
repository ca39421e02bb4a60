#!/usr/bin/env python3
"""Renders a Jinja template with Jinja2 itself, in the environment
transformers' apply_chat_template sets up (an immutable sandbox with
trim_blocks and lstrip_blocks, loop controls, a {% generation %} tag, its
tojson, raise_exception and strftime_now), so glint's own interpreter can be
checked against it. strftime_now reads SOURCE_DATE_EPOCH (UTC) when it is
set, as glint's does, so the two agree on dates.

stdin: {"template": "...", "cases": [{variables}, ...]}
stdout: a JSON list, one per case: {"text": "...", "generation": [[b, e], ...]}
(byte ranges of {% generation %} blocks in the UTF-8 text) or {"error": "..."}.
Or stdin {"jobs": [{"template", "cases"}, ...]}: a list of such lists.

Usage: python3 jinja_reference.py < job.json
       python3 jinja_reference.py TEMPLATE CONVERSATIONS.json   (prints each render)
"""
import datetime
import json
import os
import sys

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders its body and records
    where it went, as transformers' AssistantTracker does."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller):
        text = caller()
        self.environment.generation_spans.append(text)
        return "\x00GEN\x01" + text + "\x00END\x01"


def raise_exception(message):
    raise TemplateError(message)


def strftime_now(fmt):
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime(fmt)
    return datetime.datetime.now().strftime(fmt)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.generation_spans = []
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def spans(marked):
    """The text without the markers, and the byte ranges between them."""
    out, ranges, stack = b"", [], []
    data = marked.encode("utf-8")
    i = 0
    while i < len(data):
        if data.startswith(b"\x00GEN\x01", i):
            stack.append(len(out))
            i += 5
        elif data.startswith(b"\x00END\x01", i):
            begin = stack.pop()
            if not stack:
                ranges.append([begin, len(out)])
            i += 5
        else:
            out += data[i : i + 1]
            i += 1
    return out.decode("utf-8"), ranges


def render_all(source, cases):
    env = environment()
    try:
        template = env.from_string(source)
    except Exception as e:  # a template Jinja2 cannot parse
        return [{"error": "parse: " + str(e)} for _ in cases]
    out = []
    for variables in cases:
        try:
            text, ranges = spans(template.render(**variables))
            out.append({"text": text, "generation": ranges})
        except Exception as e:
            out.append({"error": str(e)})
    return out


def main():
    if len(sys.argv) == 3:
        source = open(sys.argv[1], encoding="utf-8").read()
        cases = json.load(open(sys.argv[2], encoding="utf-8"))
        variables = []
        for case in cases:
            v = {k: case[k] for k in case if k != "name"}
            v.setdefault("add_generation_prompt", False)
            v.setdefault("bos_token", "<s>")
            v.setdefault("eos_token", "</s>")
            variables.append(v)
        for case, result in zip(cases, render_all(source, variables)):
            print("=== " + case.get("name", "?"))
            print(result.get("text", "ERROR: " + result.get("error", "")))
        return
    job = json.load(sys.stdin)
    if "jobs" in job:
        out = [render_all(j["template"], j["cases"]) for j in job["jobs"]]
    else:
        out = render_all(job["template"], job["cases"])
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
