"""The OpenAI-compatible endpoint of `glint serve`, driven as an OpenAI client
drives it: a hand-written client (urllib, Bearer keys, and a reader of the
server-sent events of stream=true), since neither Debian nor this project's
set-up installs the `openai` package. Chat and text completions, n, seeds,
logprobs, stop, tools in the request, streaming that adds up to the
non-streamed answer, a tenant's own tinker:// sampler weights as `model`
(another tenant's are not found), refused fields, and keys.

    openai_check.py BASE_URL KEY_ALICE KEY_BOB BASE_MODEL
"""

import json
import sys
import urllib.error
import urllib.request

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from tinker_client import Client  # noqa: E402  (the Tinker calls that make a sampler checkpoint)

base_url, key_a, key_b, base_model = sys.argv[1:5]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


def call(path, body=None, key=key_a, raw=False):
    """(status, parsed body or the raw text)."""
    req = urllib.request.Request(base_url + path, method="POST" if body is not None else "GET")
    if key is not None:
        req.add_header("Authorization", "Bearer " + key)
    if body is not None:
        req.add_header("Content-Type", "application/json")
        req.data = json.dumps(body).encode()
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, (text if raw else json.loads(text)), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text), ""
        except ValueError:
            return e.code, text, ""


def events(text):
    """The data of each server-sent event, and whether [DONE] ended them."""
    out, done = [], False
    for block in text.split("\n\n"):
        lines = [l[len("data: "):] for l in block.split("\n") if l.startswith("data: ")]
        if not lines:
            continue
        data = "\n".join(lines)
        if data == "[DONE]":
            done = True
            continue
        check(not done, "an event after [DONE]")
        out.append(json.loads(data))
    return out, done


def refused(body, needle, path="/v1/chat/completions", status=400, key=key_a):
    s, b, _ = call(path, body, key=key)
    check(s == status, f"HTTP {s} instead of {status} for {body}: {b}")
    check(isinstance(b, dict) and "error" in b and needle in b["error"]["message"], f"'{needle}' not in {b}")


chat = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "the quick brown fox"}]

# Keys: none, a wrong one.
s, b, _ = call("/v1/chat/completions", {"model": base_model, "messages": chat}, key=None)
check(s == 401, f"no key: HTTP {s}")
s, b, _ = call("/v1/chat/completions", {"model": base_model, "messages": chat}, key="glint-wrong")
check(s == 401, f"a wrong key: HTTP {s}")

# A chat completion: n choices, usage, logprobs per token.
body = {"model": base_model, "messages": chat, "max_tokens": 8, "n": 2, "seed": 11, "temperature": 1.0,
        "logprobs": True, "top_logprobs": 2}
s, a, ctype = call("/v1/chat/completions", body)
check(s == 200 and ctype.startswith("application/json"), f"chat: HTTP {s} {a}")
check(a["object"] == "chat.completion" and a["model"] == base_model and len(a["choices"]) == 2, a)
for i, c in enumerate(a["choices"]):
    check(c["index"] == i and c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str), c)
    check(c["finish_reason"] in ("stop", "length"), c)
    lp = c["logprobs"]["content"]
    check(1 <= len(lp) <= 8 and all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in lp), lp)
    check("".join(t["token"] for t in lp).strip() != "" or c["message"]["content"] == "", c)
u = a["usage"]
check(u["prompt_tokens"] > 0 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u)
# The same seed samples the same; streaming gives the same text, in chunks, then [DONE].
s, again, _ = call("/v1/chat/completions", body)
check([c["message"]["content"] for c in again["choices"]] == [c["message"]["content"] for c in a["choices"]],
      "the same seed sampled differently")
s, text, ctype = call("/v1/chat/completions", dict(body, stream=True, stream_options={"include_usage": True}), raw=True)
check(s == 200 and ctype.startswith("text/event-stream"), f"stream: HTTP {s} {ctype}")
chunks, done = events(text)
check(done, "the stream did not end with [DONE]")
streamed = {0: "", 1: ""}
finish = {}
for ch in chunks:
    check(ch["object"] == "chat.completion.chunk", ch)
    for c in ch["choices"]:
        streamed[c["index"]] += c["delta"].get("content") or ""
        if c["finish_reason"]:
            finish[c["index"]] = c["finish_reason"]
check(streamed == {i: c["message"]["content"] for i, c in enumerate(a["choices"])}, (streamed, a["choices"]))
check(finish == {i: c["finish_reason"] for i, c in enumerate(a["choices"])}, finish)
check(chunks[-1]["choices"] == [] and chunks[-1]["usage"] == a["usage"], chunks[-1])

# Greedy is greedy; a stop string cuts the text before it.
g = {"model": base_model, "messages": chat, "max_tokens": 12, "temperature": 0}
s, g1, _ = call("/v1/chat/completions", g)
s, g2, _ = call("/v1/chat/completions", dict(g, seed=5))
check(g1["choices"][0]["message"]["content"] == g2["choices"][0]["message"]["content"], "greedy differs by seed")
full = g1["choices"][0]["message"]["content"]
if len(full) > 3:
    cut = full[2:4]
    s, st, _ = call("/v1/chat/completions", dict(g, stop=[cut]))
    check(s == 200 and st["choices"][0]["message"]["content"] == full[:full.index(cut)] and
          st["choices"][0]["finish_reason"] == "stop", (full, cut, st))

# Tools in the request, and a conversation with a tool call and its result.
# (Short: the tiny base has 256 positions, and its tokenizer spells JSON out.)
tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
convo = [{"role": "user", "content": "fox"},
         {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"w\": 1}"}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "dog"}]
s, t, _ = call("/v1/chat/completions", {"model": base_model, "messages": convo, "tools": tools, "max_tokens": 4, "seed": 1})
check(s == 200 and len(t["choices"]) == 1, f"tools: HTTP {s} {t}")

# Text completions, with logprobs.
s, c, _ = call("/v1/completions", {"model": base_model, "prompt": "the quick", "max_tokens": 5, "logprobs": 2, "seed": 3})
check(s == 200 and c["object"] == "text_completion" and isinstance(c["choices"][0]["text"], str), c)
lp = c["choices"][0]["logprobs"]
check(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) and
      all(len(x) <= 2 for x in lp["top_logprobs"]), lp)
s, text, _ = call("/v1/completions", {"model": base_model, "prompt": "the quick", "max_tokens": 5, "seed": 3,
                                      "stream": True}, raw=True)
chunks, done = events(text)
check(done and "".join(ch["choices"][0]["text"] for ch in chunks) == c["choices"][0]["text"], (chunks, c))

# A tenant's own sampler weights by their tinker:// path; another's are not found.
alice = Client(base_url, key_a)
session = alice.create_session()
model = alice.create_model(base_model, session, rank=4, seed=2)
f = alice.post("/api/v1/save_weights_for_sampler", {"model_id": model, "path": "oa", "seq_id": 1,
                                                    "type": "save_weights_for_sampler"})
path = alice.result(f)["path"]
s, mine, _ = call("/v1/chat/completions", {"model": path, "messages": chat, "max_tokens": 4, "seed": 1})
check(s == 200 and mine["model"] == path, f"alice's own path: HTTP {s} {mine}")
s, listed, _ = call("/v1/models")
check(s == 200 and {base_model, path} <= {m["id"] for m in listed["data"]}, listed)
refused({"model": path, "messages": chat}, "no checkpoint", status=404, key=key_b)
s, theirs, _ = call("/v1/models", key=key_b)
check(path not in {m["id"] for m in theirs["data"]}, "bob lists alice's weights")

# Refused: what is not served, named.
refused({"model": base_model, "messages": chat, "frequency_penalty": 0.5}, "frequency_penalty")
refused({"model": base_model, "messages": chat, "logit_bias": {"5": 10}}, "logit_bias")
refused({"model": base_model, "messages": chat, "tool_choice": "required", "tools": tools}, "tool_choice")
refused({"model": base_model, "messages": chat, "n": 100}, "n must be")
refused({"model": base_model, "messages": chat, "best_effort": True}, "best_effort")
refused({"model": base_model, "messages": chat, "max_tokens": 10 ** 6}, "context")
refused({"model": base_model, "messages": []}, "messages")
refused({"model": base_model, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "text parts")
refused({"model": "some/other-model", "messages": chat}, "not served", status=404)
refused({"model": base_model, "prompt": "x", "echo": True}, "echo", path="/v1/completions")
s, b, _ = call("/v1/nothing", {})
check(s == 404, f"an unknown route: HTTP {s}")
print(f"openai: {checks} checks passed")
