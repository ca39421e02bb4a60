"""The Python baseline of `glint bench train`: the same Qwen3 (or Llama/Qwen2,
or Qwen3-MoE / Qwen2-MoE, whose sparse block is written as transformers 4
writes it: a loop over the experts, each taking its tokens by index and
adding its output back with index_add_; or Qwen3.5, whose Gated DeltaNet
layers run the chunked delta rule as transformers' torch fallback does:
chunks of 64, each chunk's unit lower-triangular system solved row by row,
the state carried chunk to chunk) model and training step as glint's,
written as a user writes it in plain
PyTorch 1.13 (torch.nn, torch.nn.functional, torch.optim.AdamW; no
torch.compile, which 1.13 lacks, and no scaled_dot_product_attention, which
came in 2.0).

    /usr/bin/python3 train_baseline.py MODEL_DIR TOKENS --threads 2

MODEL_DIR holds config.json and model.safetensors (Hugging Face layout, as
`CausalLM::save` writes it); TOKENS is a safetensors file with one i64
tensor "input_ids" [batch, seq]. Both are read here without the safetensors
package (Debian has none): an 8-byte little-endian header length, a JSON
header, then the raw bytes.

It is driven over stdin/stdout, one line each way, so that glint can
interleave its own timed runs with these in one process (the machines are
noisy; interleaving puts both sides under the same load):

    -> ready: PARAMETERS THREADS           after loading
    <- run N [S]                           S untimed steps (default 0), then N timed ones
    -> ran: SECONDS FIRST_LOSS LAST_LOSS PEAK
                                           wall time of the N timed steps, losses of the first
                                           and last step run, and the resident bytes all of them
                                           added at their peak (VmHWM after clear_refs - VmRSS
                                           before); an untimed step after the reset faults the
                                           step's memory back in, so the timed ones run as a
                                           training loop's steps do
    (end of input, or "quit", ends it)

Errors go to stdout as `error: ...` (exit code 3 when torch is missing).
"""

import argparse
import json
import math
import struct
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print(f"error: cannot import torch ({e}); install python3-torch (scripts/setup.sh does)", flush=True)
    sys.exit(3)


DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def load_safetensors(path):
    """Every tensor of a safetensors file, as a dict of owned tensors."""
    with open(path, "rb") as f:
        data = bytearray(f.read())  # writable: torch.frombuffer warns on read-only buffers
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        shape = entry["shape"]
        count = math.prod(shape)
        if count == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        t = torch.frombuffer(data, dtype=dtype, count=count, offset=base + begin)
        assert t.numel() * t.element_size() == end - begin, name
        out[name] = t.reshape(shape).clone()
    return out


class Config:
    def __init__(self, j):
        arch = (j.get("architectures") or [j.get("model_type", "")])[0].lower()
        self.arch = "qwen3" if "qwen3" in arch else "qwen2" if "qwen2" in arch else "llama"
        # Qwen3.5 (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM): Gated DeltaNet
        # and gated attention layers, (1 + w) norms, partial RoPE.
        self.hybrid = "qwen3_5" in arch
        self.layer_types = j.get("layer_types") or []
        self.linear_num_key_heads = j.get("linear_num_key_heads", 0)
        self.linear_key_head_dim = j.get("linear_key_head_dim", 0)
        self.linear_num_value_heads = j.get("linear_num_value_heads", 0)
        self.linear_value_head_dim = j.get("linear_value_head_dim", 0)
        self.linear_conv_kernel_dim = j.get("linear_conv_kernel_dim", 0)
        self.partial_rotary_factor = (j.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                                        j.get("partial_rotary_factor", 1.0))
        self.vocab_size = j["vocab_size"]
        self.hidden_size = j["hidden_size"]
        self.intermediate_size = j.get("intermediate_size", 0)
        self.num_hidden_layers = j["num_hidden_layers"]
        self.num_attention_heads = j["num_attention_heads"]
        self.num_key_value_heads = j.get("num_key_value_heads") or self.num_attention_heads
        self.head_dim = j.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.rms_norm_eps = j.get("rms_norm_eps", 1e-6)
        self.rope_theta = j.get("rope_theta", 10000.0)
        scaling = j.get("rope_scaling") or {}
        self.rope_factor = scaling.get("factor", 1.0) if scaling.get("rope_type", scaling.get("type")) == "linear" else 1.0
        self.tie_word_embeddings = j.get("tie_word_embeddings", False)
        bias = j.get("attention_bias", False)
        self.qkv_bias = True if self.arch == "qwen2" else bias
        self.o_bias = False if self.arch == "qwen2" else bias
        self.mlp_bias = j.get("mlp_bias", False) if self.arch == "llama" else False
        self.qk_norm = self.arch == "qwen3"
        moe = "moe" in arch
        self.num_experts = j.get("num_experts", 0) if moe else 0
        self.top_k = j.get("num_experts_per_tok", 0)
        self.moe_intermediate_size = j.get("moe_intermediate_size", 0)
        self.shared_expert_intermediate_size = (j.get("shared_expert_intermediate_size", 0)
                                                if self.arch == "qwen2" or self.hybrid else 0)
        self.norm_topk_prob = j.get("norm_topk_prob", False) or self.hybrid  # Qwen3.5-MoE always renormalises
        self.decoder_sparse_step = j.get("decoder_sparse_step", 1)
        self.mlp_only_layers = j.get("mlp_only_layers") or []
        if moe and self.arch == "qwen2":
            self.qkv_bias = j.get("qkv_bias", True)

    def linear(self, layer):
        return self.hybrid and self.layer_types[layer] == "linear_attention"

    def sparse(self, layer):
        return (self.num_experts > 0 and (layer + 1) % self.decoder_sparse_step == 0
                and layer not in self.mlp_only_layers)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class OffsetRMSNorm(RMSNorm):
    """Qwen3.5's RMSNorm: scales by (1 + weight), the weight starting at 0."""

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return (1 + self.weight) * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, q, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, kv, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, kv, bias=c.qkv_bias)
        self.o_proj = nn.Linear(q, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache=None, start=0):
        """With a cache (a (k, v) pair of [B, kv_heads, max_len, head_dim]
        tensors, as sample_baseline.py generates with), the T positions of x
        go to cache positions start..start+T-1 and attend to every cached
        position before them, as mask [B, 1, T, start+T] allows."""
        c = self.c
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim)
        k = self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            cache_k, cache_v = cache
            cache_k[:, :, start : start + T] = k
            cache_v[:, :, start : start + T] = v
            k, v = cache_k[:, :, : start + T], cache_v[:, :, : start + T]
        groups = c.num_attention_heads // c.num_key_value_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(c.head_dim) + mask
        out = F.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class GatedAttention(nn.Module):
    """Qwen3.5's full attention: q_proj gives per head a query and a gate,
    q/k (1 + w) norms, RoPE on the first rot dimensions, the output times
    sigmoid(gate)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, 2 * q, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(q, c.hidden_size, bias=False)
        self.q_norm = OffsetRMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        c = self.c
        B, T, _ = x.shape
        query, gate = self.q_proj(x).view(B, T, c.num_attention_heads, 2 * c.head_dim).chunk(2, dim=-1)
        q = self.q_norm(query).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        rot = cos.shape[-1]
        q = torch.cat((q[..., :rot] * cos + rotate_half(q[..., :rot]) * sin, q[..., rot:]), dim=-1)
        k = torch.cat((k[..., :rot] * cos + rotate_half(k[..., :rot]) * sin, k[..., rot:]), dim=-1)
        groups = c.num_attention_heads // c.num_key_value_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(c.head_dim) + mask
        out = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(out * torch.sigmoid(gate.reshape(B, T, -1)))


def chunked_delta_rule(q, k, v, g, beta, chunk=64):
    """The gated delta rule over [B, H, T, d] inputs by chunks, as
    transformers' torch fallback evaluates it: within a chunk of n positions,
    with G the running sum of g, the writes u solve the unit lower-triangular
    system u_s + sum_{r<s} beta_s e^{G_s - G_r} (k_s . k_r) u_r = beta_s (v_s -
    e^{G_s} S^T k_s), by forward substitution one row after another; the
    outputs read the incoming state S and the chunk's writes; S moves on to
    the next chunk."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk - T % chunk) % chunk
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    q, k, v = (t.reshape(B, H, n, chunk, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(B, H, n, chunk).cumsum(-1), beta.reshape(B, H, n, chunk)
    kb, vb = k * beta[..., None], v * beta[..., None]
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # e^{G_s - G_r}, r <= s
    # A = -(beta_s k_s . k_r e^{G_s - G_r}) strictly below the diagonal; the
    # system's inverse (I - A)^{-1} is built row by row in place of A.
    a = -(kb @ k.transpose(-1, -2) * decay).masked_fill(lower.logical_not() | torch.eye(chunk, dtype=torch.bool), 0)
    for i in range(1, chunk):
        row, above = a[..., i, :i].clone(), a[..., :i, :i].clone()  # read before the row is written
        a[..., i, :i] = row + (row[..., None] * above).sum(-2)
    solve = a + torch.eye(chunk)
    w_v = solve @ vb                          # the writes without the incoming state
    w_k = solve @ (kb * g.exp()[..., None])   # what the incoming state takes off them
    state = q.new_zeros(B, H, dk, dv)
    out = []
    strict = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    for c in range(n):
        qc, kc = q[:, :, c], k[:, :, c]
        gc = g[:, :, c]
        u = w_v[:, :, c] - w_k[:, :, c] @ state
        inner = (qc @ kc.transpose(-1, -2) * decay[:, :, c]).masked_fill(strict, 0)
        out.append((qc * gc.exp()[..., None]) @ state + inner @ u)
        state = state * gc[..., -1, None, None].exp() + (kc * (gc[..., -1, None] - gc).exp()[..., None]).transpose(-1, -2) @ u
    return torch.stack(out, 2).reshape(B, H, n * chunk, dv)[:, :, :T]


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear attention: projections, a short causal depthwise conv
    with silu, l2-normed q and k, beta = sigmoid(b), g = -exp(A_log)
    softplus(a + dt_bias), the chunked delta rule, a gated RMSNorm, out_proj."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        nk, dk, nv, dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim
        self.conv_dim = 2 * nk * dk + nv * dv
        self.in_proj_qkv = nn.Linear(c.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, nv * dv, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, nv, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, nv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, c.linear_conv_kernel_dim, groups=self.conv_dim,
                                padding=c.linear_conv_kernel_dim - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = RMSNorm(dv, c.rms_norm_eps)
        self.out_proj = nn.Linear(nv * dv, c.hidden_size, bias=False)

    def forward(self, x):
        c = self.c
        B, T, _ = x.shape
        nk, dk, nv, dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim
        mixed = F.silu(self.conv1d(self.in_proj_qkv(x).transpose(1, 2))[..., :T]).transpose(1, 2)
        q, k, v = torch.split(mixed, [nk * dk, nk * dk, nv * dv], dim=-1)
        q, k, v = q.reshape(B, T, nk, dk), k.reshape(B, T, nk, dk), v.reshape(B, T, nv, dv)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.exp() * F.softplus(self.in_proj_a(x) + self.dt_bias)
        if nv > nk:
            q, k = q.repeat_interleave(nv // nk, dim=2), k.repeat_interleave(nv // nk, dim=2)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        o = chunked_delta_rule(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g.transpose(1, 2),
                               beta.transpose(1, 2)).transpose(1, 2)  # [B, T, nv, dv]
        z = self.in_proj_z(x).reshape(B, T, nv, dv)
        o = self.norm(o) * F.silu(z)
        return self.out_proj(o.reshape(B, T, nv * dv))


class MLP(nn.Module):
    def __init__(self, c, width=None):
        super().__init__()
        width = width or c.intermediate_size
        self.gate_proj = nn.Linear(c.hidden_size, width, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, width, bias=c.mlp_bias)
        self.down_proj = nn.Linear(width, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    """Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock as transformers 4
    writes them: softmax router, top k, optional renormalisation, then a loop
    over the experts that were hit, each on the tokens routed to it."""

    def __init__(self, c):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = c.num_experts, c.top_k, c.norm_topk_prob
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(c, c.moe_intermediate_size) for _ in range(c.num_experts))
        if c.shared_expert_intermediate_size > 0:
            self.shared_expert = MLP(c, c.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(c.hidden_size, 1, bias=False)
        else:
            self.shared_expert = None

    def forward(self, x):
        B, T, H = x.shape
        x = x.view(-1, H)
        routing_weights = F.softmax(self.gate(x), dim=1, dtype=torch.float)
        routing_weights, selected = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(x.dtype)
        out = torch.zeros_like(x)
        expert_mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)
        hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit.squeeze(-1).tolist():
            slot, token = torch.where(expert_mask[e])
            y = self.experts[e](x[token]) * routing_weights[token, slot, None]
            out.index_add_(0, token, y.to(x.dtype))
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.view(B, T, H)


class DecoderLayer(nn.Module):
    def __init__(self, c, index):
        super().__init__()
        norm = OffsetRMSNorm if c.hybrid else RMSNorm
        self.input_layernorm = norm(c.hidden_size, c.rms_norm_eps)
        if c.linear(index):
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = GatedAttention(c) if c.hybrid else Attention(c)
        self.post_attention_layernorm = norm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SparseMoeBlock(c) if c.sparse(index) else MLP(c)

    def forward(self, x, cos, sin, mask):
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h) if hasattr(self, "linear_attn") else self.self_attn(h, cos, sin, mask))
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c, l) for l in range(c.num_hidden_layers))
        self.norm = (OffsetRMSNorm if c.hybrid else RMSNorm)(c.hidden_size, c.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Backbone(c)
        if not c.tie_word_embeddings:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, ids):
        c = self.c
        T = ids.shape[1]
        rot = int(c.head_dim * c.partial_rotary_factor)  # the dimensions RoPE turns
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, rot, 2).float() / rot))
        freqs = torch.outer(torch.arange(T).float() / c.rope_factor, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        x = self.model.norm(x)
        head = self.model.embed_tokens.weight if c.tie_word_embeddings else self.lm_head.weight
        return F.linear(x, head)


class LoraLinear(nn.Module):
    """A frozen nn.Linear plus a LoRA update, as PEFT initialises it."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        bound = 1.0 / math.sqrt(base.in_features)
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features).uniform_(-bound, bound))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r))
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scaling


def add_lora(model, r, alpha):
    """Freezes the model and wraps every projection (PEFT's all-linear: on an
    MoE layer the router, every expert's and the shared expert's projections
    and the shared expert's gate)."""
    model.requires_grad_(False)
    mlp_names = ("gate_proj", "up_proj", "down_proj")
    for layer in model.model.layers:
        if hasattr(layer, "linear_attn"):
            parents = [(layer.linear_attn, ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"))]
        else:
            parents = [(layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj"))]
        if isinstance(layer.mlp, SparseMoeBlock):
            parents.append((layer.mlp, ("gate",)))
            parents += [(e, mlp_names) for e in layer.mlp.experts]
            if layer.mlp.shared_expert is not None:
                parents += [(layer.mlp.shared_expert, mlp_names), (layer.mlp, ("shared_expert_gate",))]
        else:
            parents.append((layer.mlp, mlp_names))
        for parent, names in parents:
            for name in names:
                setattr(parent, name, LoraLinear(getattr(parent, name), r, alpha))


def trainable_parameter_groups(model, mode, weight_decay):
    """AdamW groups: no decay on biases, normalisation weights and a Gated
    DeltaNet's A_log and dt_bias (as glint)."""
    if mode not in ("full", "lora"):
        raise ValueError(f"mode {mode!r} is not implemented")
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        quiet = name.endswith((".bias", ".A_log", ".dt_bias")) or "norm" in name
        (no_decay if quiet else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def commands():
    """The words of each command line on stdin, until end of input or "quit"
    (the line protocol both baselines speak)."""
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            return
        yield words


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("tokens")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--mode", default="full", choices=["full", "lora"])
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with open(f"{args.model_dir}/config.json") as f:
        cfg = Config(json.load(f))
    model = CausalLM(cfg)
    try:
        model.load_state_dict(load_safetensors(f"{args.model_dir}/model.safetensors"), strict=True)
    except (RuntimeError, KeyError, AssertionError) as e:
        print(f"error: cannot load {args.model_dir}: {e}".replace("\n", " "), flush=True)
        sys.exit(2)
    model.float().train()
    if args.mode == "lora":
        add_lora(model, args.lora_r, args.lora_alpha)
    ids = load_safetensors(args.tokens)["input_ids"].long()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable_parameter_groups(model, args.mode, args.weight_decay), lr=args.lr,
                                  betas=(0.9, 0.999), eps=1e-8)

    def train_step():
        logits = model(ids)
        vocab = logits.shape[-1]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        return loss.item()

    print(f"ready: {sum(p.numel() for p in params)} {torch.get_num_threads()}", flush=True)
    for words in commands():
        if (words[0] != "run" or len(words) not in (2, 3) or not all(w.isdigit() for w in words[1:])
                or int(words[1]) < 1):
            print(f"error: unknown command {' '.join(words)!r}; expected 'run N [S]' or 'quit'", flush=True)
            continue
        reset_peak()
        before = status_bytes("VmRSS:")
        losses = [train_step() for _ in range(int(words[2]) if len(words) == 3 else 0)]
        t0 = time.perf_counter()
        losses += [train_step() for _ in range(int(words[1]))]
        seconds = time.perf_counter() - t0
        peak = max(0, status_bytes("VmHWM:") - before)
        print(f"ran: {seconds:.6f} {losses[0]:.9g} {losses[-1]:.9g} {peak}", flush=True)


def status_bytes(field):
    """A /proc/self/status field in bytes (0 where it is not there)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak():
    """Hands freed memory back (glibc's malloc_trim), then resets VmHWM to
    the current resident size (Linux's clear_refs 5), as glint's side does."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


if __name__ == "__main__":
    main()
