"""A hostile tenant's load cannot starve another (docs/remote.md, "Security"):
with `hog` sending forward_backward calls in a tight loop (one to each of its
four models in flight at all times, each a larger batch than alice's), alice's p99 call latency stays
within 2x her unloaded p99 plus one of hog's steps. Bounded: 200 timed calls
of alice's each way, hog's loop stops with them; at most three attempts.

    fairness.py TINKER_URL KEY_ALICE KEY_HOG BASE_MODEL"""

import sys
import multiprocessing
import time

from tinker_client import Client

url, key_a, key_h, base_model = sys.argv[1:5]
CALLS = 200
ATTEMPTS = 3


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
h_session = hog.create_session()
h_model = hog.create_model(base_model, h_session, rank=4)
# hog's calls to one model run in its order, one after another, so hog's loop
# trains four models at once: four of its calls wait together.
h_models = [hog.create_model(base_model, h_session, rank=4) for _ in range(4)]
mp = multiprocessing.get_context("fork")  # the child shares the clients' ids, not a re-run of this script
h_seqs = mp.Array("i", len(h_models))  # each model's last seq_id
seq = {"a": 0}


def alice_calls():
    out = []
    for _ in range(CALLS):
        seq["a"] += 1
        t0 = time.time()
        alice.result(fb(alice, a_model, seq["a"], 2, 32), "fwdbwd")
        out.append(time.time() - t0)
    return out


def hog_loop(stop, started, calls):
    """A call to each of hog's models in flight until `stop`, then the rest collected."""
    h, n, pending = Client(url, key_h), len(h_models), []
    for i in range(2000):
        if stop.is_set():
            break
        while len(pending) < n:
            k = (i + len(pending)) % n
            h_seqs[k] += 1
            pending.append(fb(h, h_models[k], h_seqs[k], 8, 200))
        started.set()
        h.result(pending.pop(0), "fwdbwd")
        calls.value += 1
    for f in pending:  # the next attempt starts with hog's queue empty
        h.result(f, "fwdbwd")


def measure():
    """One attempt: alice alone, hog's step alone, then alice beside hog's loop."""
    unloaded = alice_calls()
    # One of hog's steps, alone: its p99 over 20, as alice's latencies are p99s.
    solo = []
    for _ in range(20):
        seq["h"] += 1
        t0 = time.time()
        hog.result(fb(hog, h_model, seq["h"], 8, 200), "fwdbwd")
        solo.append(time.time() - t0)
    step = p99(solo)

    # hog's loop runs in a process of its own: in this one, its thread would
    # hold the interpreter's lock while it encodes its requests, and alice's
    # timings would measure that, not the server.
    stop, started, calls = mp.Event(), mp.Event(), mp.Value("i", 0)
    hog_proc = mp.Process(target=hog_loop, args=(stop, started, calls), daemon=True)
    hog_proc.start()
    if not started.wait(60):
        raise SystemExit("FAILED: hog's loop did not start within 60 s")
    time.sleep(2)  # hog's queue is full before alice starts
    loaded = alice_calls()
    stop.set()
    hog_proc.join(timeout=120)
    if hog_proc.is_alive():
        hog_proc.kill()
        raise SystemExit("FAILED: hog's loop did not stop within 120 s")
    if hog_proc.exitcode != 0:
        raise SystemExit(f"FAILED: hog's loop ended with {hog_proc.exitcode}")
    bound = 2 * p99(unloaded) + step
    print(f"fairness: alice p99 {p99(unloaded) * 1e3:.0f} ms unloaded, {p99(loaded) * 1e3:.0f} ms beside hog "
          f"(hog's step {step * 1e3:.0f} ms, {calls.value} calls); bound {bound * 1e3:.0f} ms", flush=True)
    return p99(loaded) <= bound


# A scheduler that starves alice (first come, first served) makes her wait
# behind hog's four queued steps
# on every call, in every attempt; a noisy machine (the CI's two cores run the
# server, both clients and ctest) can push one attempt's p99 a few ms past the
# bound. So: up to three attempts, each measuring all three quantities afresh.
alice_calls()  # warm-up: the first calls allocate
seq["h"] = 0
for attempt in range(1, ATTEMPTS + 1):
    if measure():
        break
    print(f"fairness: attempt {attempt} of {ATTEMPTS} over its bound", flush=True)
else:
    raise SystemExit("FAILED: a tenant's load starved another")
