#!/usr/bin/env python3
"""glint bench template's baseline: Jinja2 rendering chat templates in
transformers' environment (tests/support/jinja_reference.py), timed as glint
times its own interpreter: each template parsed once, then every
conversation rendered `rounds` times; the median over `repeats` of the
microseconds per conversation, for each template.

stdin: {"support": DIR, "templates": {name: source}, "cases": [...], "rounds": N, "repeats": R}
stdout: {name: microseconds per conversation}
"""
import json
import statistics
import sys
import time


def main():
    job = json.load(sys.stdin)
    sys.path.insert(0, job["support"])
    import jinja_reference

    env = jinja_reference.environment()
    out = {}
    for name, source in job["templates"].items():
        template = env.from_string(source)
        times = []
        for _ in range(job["repeats"]):
            t0 = time.perf_counter()
            for _ in range(job["rounds"]):
                for case in job["cases"]:
                    try:
                        template.render(**case)
                    except Exception:
                        pass
            times.append((time.perf_counter() - t0) / (job["rounds"] * len(job["cases"])) * 1e6)
        out[name] = statistics.median(times)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
