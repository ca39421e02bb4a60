"""A hostile tenant's load cannot starve another (docs/remote.md, "Security"):
with `hog` sending forward_backward calls in a tight loop (four in flight at
all times, each a larger batch than alice's), alice's p99 call latency stays
within 2x her unloaded p99 plus one of hog's steps. Bounded: 200 timed calls
of alice's each way, hog's loop stops with them.

    fairness.py TINKER_URL KEY_ALICE KEY_HOG BASE_MODEL"""

import sys
import threading
import time

from tinker_client import Client

url, key_a, key_h, base_model = sys.argv[1:5]
CALLS = 200


def fb(client, model, seq, rows, length):
    datum = {"model_input": {"chunks": [{"tokens": list(range(1, length + 1))}]},
             "loss_fn_inputs": {"target_tokens": {"data": list(range(2, length + 2)), "dtype": "int64",
                                                  "shape": [length]},
                                "weights": {"data": [1.0] * length, "dtype": "float32", "shape": [length]}}}
    return client.post("/api/v1/forward_backward", {
        "forward_backward_input": {"data": [datum] * rows, "loss_fn": "cross_entropy"},
        "model_id": model, "seq_id": seq})


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


alice, hog = Client(url, key_a), Client(url, key_h)
a_model = alice.create_model(base_model, alice.create_session(), rank=4)
h_model = hog.create_model(base_model, hog.create_session(), rank=4)
seq = {"a": 0}


def alice_calls():
    out = []
    for _ in range(CALLS):
        seq["a"] += 1
        t0 = time.time()
        alice.result(fb(alice, a_model, seq["a"], 2, 32), "fwdbwd")
        out.append(time.time() - t0)
    return out


alice_calls()  # warm-up: the first calls allocate
unloaded = alice_calls()
# One of hog's steps, alone: its p99 over 10, as alice's latencies are p99s.
solo = []
for s in range(1, 11):
    t0 = time.time()
    hog.result(fb(hog, h_model, s, 8, 200), "fwdbwd")
    solo.append(time.time() - t0)
step = p99(solo)

stop = threading.Event()
hog_steps = []


def hog_loop():
    h = Client(url, key_h)
    s, pending = 10, []
    while not stop.is_set() and s < 2000:
        while len(pending) < 4:
            s += 1
            pending.append((time.time(), fb(h, h_model, s, 8, 200)))
        t0, f = pending.pop(0)
        h.result(f, "fwdbwd")
        hog_steps.append(time.time() - t0)


hog_thread = threading.Thread(target=hog_loop, daemon=True)
hog_thread.start()
time.sleep(2)  # hog's queue is full before alice starts
loaded = alice_calls()
stop.set()
hog_thread.join(timeout=120)
bound = 2 * p99(unloaded) + step
print(f"fairness: alice p99 {p99(unloaded) * 1e3:.0f} ms unloaded, {p99(loaded) * 1e3:.0f} ms beside hog "
      f"(hog's step {step * 1e3:.0f} ms, {len(hog_steps)} calls); bound {bound * 1e3:.0f} ms")
if p99(loaded) > bound:
    raise SystemExit("FAILED: a tenant's load starved another")
