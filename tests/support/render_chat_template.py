#!/usr/bin/env python3
"""Renders chat templates with Jinja2 the way Hugging Face's
apply_chat_template does (a sandboxed environment with trim_blocks and
lstrip_blocks, tojson, raise_exception), as the reference glint's own
rendering is checked against.

stdin: {"template": "...", "bos_token": "...", "cases": [{"messages": [...],
"add_generation_prompt": bool, "enable_thinking": bool or absent}]}
stdout: a JSON list of the rendered texts, or of {"error": "..."}.
"""
import json
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols


def raise_exception(message):
    raise ValueError(message)


def main():
    job = json.load(sys.stdin)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(job["template"])
    out = []
    for case in job["cases"]:
        kwargs = {"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"],
                  "bos_token": job.get("bos_token", ""), "eos_token": job.get("eos_token", "")}
        if "enable_thinking" in case:
            kwargs["enable_thinking"] = case["enable_thinking"]
        try:
            out.append(template.render(**kwargs))
        except Exception as e:  # the case's error, for the test to show
            out.append({"error": str(e)})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
