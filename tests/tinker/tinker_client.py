"""A minimal client of the Tinker HTTP API that speaks as the official SDK does
(request bodies, headers, futures, both wire formats), for glint's
conformance tests. Debian packages only: python3-requests, python3-protobuf,
python3-zstandard; tinker_public_pb2 is generated from
rpc/tinker/tinker_public.proto by the test script (protoc)."""

import json
import struct
import time

import requests
import zstandard

import tinker_public_pb2 as pb

PROTO = "application/x-protobuf"


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class FutureFailed(Exception):
    def __init__(self, body):
        super().__init__(f"{body.get('category')}: {body.get('error')}")
        self.body = body


class Client:
    def __init__(self, base_url, key, proto=False, compress=False):
        self.base = base_url.rstrip("/")
        self.key = key
        self.proto = proto  # forward_backward bodies and results as protobuf (SDK 0.25)
        self.compress = compress
        self.http = requests.Session()

    # -- plumbing ---------------------------------------------------------
    def headers(self, extra=None):
        h = {"X-API-Key": self.key, "Content-Type": "application/json", "Accept": "application/json"}
        h.update(extra or {})
        return h

    def post_raw(self, path, data, headers):
        return self.http.post(self.base + path, data=data, headers=headers, timeout=60)

    def post(self, path, body):
        r = self.post_raw(path, json.dumps(body), self.headers())
        if r.status_code != 200:
            raise ApiError(r.status_code, r.text)
        return r.json()

    def get(self, path):
        r = self.http.get(self.base + path, headers=self.headers(), timeout=60)
        if r.status_code != 200:
            raise ApiError(r.status_code, r.text)
        return r.json()

    def result(self, future, kind=None, timeout=120):
        """Polls retrieve_future as the SDK does: try_again re-polls at once."""
        accept = PROTO if (self.proto and kind in ("fwdbwd", "sample")) else "application/json"
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.post_raw("/api/v1/retrieve_future",
                              json.dumps({"request_id": future["request_id"], "allow_metadata_only": True}),
                              self.headers({"Accept": accept}))
            if r.status_code != 200:
                raise ApiError(r.status_code, r.text)
            if PROTO in r.headers.get("content-type", ""):
                return decode_fwdbwd(r.content) if kind == "fwdbwd" else decode_sample(r.content)
            body = r.json()
            if body.get("type") == "try_again":
                continue
            if "error" in body:
                raise FutureFailed(body)
            return body
        raise TimeoutError(future)

    # -- the SDK's calls --------------------------------------------------------
    def create_session(self):
        return self.post("/api/v1/create_session",
                         {"tags": [], "user_metadata": {}, "sdk_version": "0.25.0", "type": "create_session"})["session_id"]

    def create_model(self, base_model, session_id, rank=8, seed=None, train_unembed=False, **flags):
        lora = {"rank": rank, "train_unembed": train_unembed, "train_mlp": flags.get("train_mlp", True),
                "train_attn": flags.get("train_attn", True)}
        if seed is not None:
            lora["seed"] = seed
        f = self.post("/api/v1/create_model", {"session_id": session_id, "model_seq_id": 0, "base_model": base_model,
                                               "lora_config": lora, "type": "create_model"})
        return self.result(f)["model_id"]

    def forward_backward_request(self, model_id, seq_id, data, loss_fn, config=None, forward=False):
        """Posts one forward_backward (or forward) call; answers its future."""
        if self.proto:
            msg = pb.ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, loss_fn=loss_fn,
                                            forward_only=forward)
            for k, v in (config or {}).items():
                msg.loss_fn_config[k] = float(v)
            for d in data:
                datum = msg.data.add()
                datum.model_input.add().encoded_text.tokens = struct.pack(f"<{len(d['tokens'])}i", *d["tokens"])
                for name, values in d["inputs"].items():
                    t = datum.loss_fn_inputs[name]
                    if name == "target_tokens":
                        t.dtype = pb.DTYPE_INT64
                        t.dense = struct.pack(f"<{len(values)}q", *values)
                    else:
                        t.dtype = pb.DTYPE_FLOAT32
                        t.dense = struct.pack(f"<{len(values)}f", *values)
                    t.shape.append(len(values))
            body = msg.SerializeToString()
            headers = self.headers({"Content-Type": PROTO})
            if self.compress:
                body = zstandard.ZstdCompressor().compress(body)
                headers["Content-Encoding"] = "zstd"
            r = self.post_raw("/api/v1/forward_backward", body, headers)
            if r.status_code != 200:
                raise ApiError(r.status_code, r.text)
            return r.json()
        key = "forward_input" if forward else "forward_backward_input"
        datums = []
        for d in data:
            inputs = {}
            for name, values in d["inputs"].items():
                inputs[name] = {"data": list(values), "dtype": "int64" if name == "target_tokens" else "float32",
                                "shape": [len(values)]}
            datums.append({"loss_fn_inputs": inputs,
                           "model_input": {"chunks": [{"tokens": list(d["tokens"]), "type": "encoded_text"}]}})
        body = {key: {"data": datums, "loss_fn": loss_fn}, "model_id": model_id, "seq_id": seq_id}
        if config:
            body[key]["loss_fn_config"] = config
        return self.post("/api/v1/forward" if forward else "/api/v1/forward_backward", body)

    def optim_step(self, model_id, seq_id, lr=1e-3, **adam):
        params = {"learning_rate": lr, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
                  "grad_clip_norm": 0.0}
        params.update(adam)
        return self.post("/api/v1/optim_step", {"adam_params": params, "model_id": model_id, "seq_id": seq_id,
                                                "type": "optim_step"})

    def asample(self, sampler_id, seq_id, prompt, num_samples=1, max_tokens=8, **extra):
        body = {"num_samples": num_samples, "prompt": {"chunks": [{"tokens": prompt, "type": "encoded_text"}]},
                "sampling_params": {"max_tokens": max_tokens, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
                "sampling_session_id": sampler_id, "seq_id": seq_id, "prompt_logprobs": False,
                "topk_prompt_logprobs": 0, "type": "sample"}
        for k, v in extra.items():
            if k in ("seed", "stop", "temperature"):
                body["sampling_params"][k] = v
            else:
                body[k] = v
        return self.post("/api/v1/asample", body)


def _unpack(fmt, data):
    n = len(data) // struct.calcsize(fmt)
    return list(struct.unpack(f"<{n}{fmt}", data))


def decode_fwdbwd(content):
    """A ForwardBackwardOutput as the SDK decodes it, in the JSON result's shape."""
    msg = pb.ForwardBackwardOutput()
    msg.ParseFromString(content)
    outputs = []
    for record in msg.loss_fn_outputs:
        per = [dict() for _ in range(record.num_datums)]
        for name, t in record.fields.items():
            assert t.dtype == pb.DTYPE_FLOAT32, t.dtype
            offsets = _unpack("q", t.offsets)
            assert len(offsets) == record.num_datums + 1 and offsets[0] == 0 and offsets[-1] == len(t.data)
            for i in range(record.num_datums):
                values = _unpack("f", t.data[offsets[i]:offsets[i + 1]])
                per[i][name] = {"data": values, "dtype": "float32", "shape": [len(values)] + list(t.trailing_shape)}
        outputs.extend(per)
    return {"loss_fn_output_type": msg.loss_fn_output_type, "loss_fn_outputs": outputs, "metrics": dict(msg.metrics)}


def decode_sample(content):
    msg = pb.SampleResponse()
    msg.ParseFromString(content)
    seqs = []
    for s in msg.sequences:
        assert s.stop_reason in (pb.STOP_REASON_STOP, pb.STOP_REASON_LENGTH)
        seqs.append({"stop_reason": "stop" if s.stop_reason == pb.STOP_REASON_STOP else "length",
                     "tokens": _unpack("i", s.tokens),
                     "logprobs": _unpack("f", s.logprobs) if s.logprobs else None})
    out = {"sequences": seqs, "prompt_logprobs": None, "topk_prompt_logprobs": None}
    if msg.prompt_logprobs:
        out["prompt_logprobs"] = [None if x != x else x for x in _unpack("f", msg.prompt_logprobs)]
    if msg.HasField("topk_prompt_logprobs") and msg.topk_prompt_logprobs.k:
        t = msg.topk_prompt_logprobs
        ids, lps = _unpack("i", t.token_ids), _unpack("f", t.logprobs)
        rows = []
        for i in range(t.prompt_length):
            row = [(ids[i * t.k + j], lps[i * t.k + j]) for j in range(t.k) if lps[i * t.k + j] > -99999.0]
            rows.append(row or None)
        out["topk_prompt_logprobs"] = rows
    return out
