"""The Python baseline of `glint bench sample`: sampling from the same Qwen3
(or Llama/Qwen2) model as glint's, written as a user writes a generate loop in
plain PyTorch 1.13 without vLLM: the prompts batched together with left
padding, each repeated --samples times so that one batch holds every sample,
one prefill over the padded batch, then one decode step per new token against
a preallocated contiguous KV cache per layer, the next token drawn with
torch.multinomial from softmax(logits) (temperature 1, no top-k/top-p) and no
stop tokens, so every row generates exactly --max-new-tokens tokens.

    /usr/bin/python3 sample_baseline.py MODEL_DIR PROMPTS --threads N --samples S
        --max-new-tokens M [--batch-rows R] [--seed X]

MODEL_DIR holds config.json and model.safetensors (Hugging Face layout);
PROMPTS is a safetensors file with "input_ids" i64 [P, Lmax], right-padded
with 0, and "lengths" i64 [P], the real length of each prompt. The model, its
loader and its layers are train_baseline.py's (imported from it); only the
cached forward that generation needs is written here, with the same modules
and the same math. --batch-rows R (0: everything in one batch) splits the
P*S rows into batches of at most R rows, whole prompts' sample groups,
generated one after another.

It is driven over stdin/stdout, one line each way, so that glint can
interleave its own timed runs with these in one process:

    -> ready: PARAMETERS THREADS           after loading
    <- check K T                           greedy (argmax) generation of T new
                                           tokens for the first K prompts, one
                                           sample each, in one batch
    -> checked: a b c ...;d e f ...;...    the K token-id lists
    <- run                                 one generation of all P prompts x S
                                           samples x M new tokens
    -> ran: SECONDS TOKENS                 its wall time, prefill included, and
                                           the number of tokens generated (P*S*M)
    (end of input, or "quit", ends it)

Errors go to stdout as `error: ...` (exit code 3 when torch is missing).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# train_baseline imports torch itself and exits 3, with the install hint, when it cannot.
from train_baseline import CausalLM, Config, commands, load_safetensors  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def rope_tables(c, positions):
    """cos and sin [rows, 1, T, head_dim] for per-row positions [rows, T], as
    CausalLM.forward builds them for positions 0..T-1."""
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
    freqs = (positions.float() / c.rope_factor).unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)


def cached_forward(model, ids, positions, mask, caches, start):
    """Logits [rows, vocab] of the last of the T tokens ids [rows, T] at the
    given positions, their keys and values written to caches (one (k, v) pair
    per layer) from position start on."""
    c = model.c
    cos, sin = rope_tables(c, positions)
    x = model.model.embed_tokens(ids)
    for layer, cache in zip(model.model.layers, caches):
        x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, mask, cache, start)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = model.model.norm(x[:, -1])
    head = model.model.embed_tokens.weight if c.tie_word_embeddings else model.lm_head.weight
    return F.linear(x, head)


def generate(model, ids, lengths, new_tokens, pick):
    """new_tokens tokens [rows, new_tokens] after each prompt, chosen by
    pick(logits [rows, vocab]) -> [rows]. ids [rows, >= max(lengths)] holds
    the prompts right-padded; they run left-padded to the longest one, pad
    keys masked out and positions counting real tokens only."""
    c = model.c
    rows = ids.shape[0]
    width = int(lengths.max())
    total = width + new_tokens
    pad = width - lengths
    cols = torch.arange(width)
    source = cols - pad[:, None]  # column of ids each left-padded column holds, negative on padding
    real = source >= 0
    prompt = ids.gather(1, source.clamp(min=0)).masked_fill(~real, 0)
    positions = source.clamp(min=0)
    key_real = torch.ones(rows, total, dtype=torch.bool)
    key_real[:, :width] = real
    # A padding query sees itself alone: it needs some key, or softmax makes NaN that its cached values would spread.
    allowed = (cols[None, :] <= cols[:, None]) & (real[:, None, :] | torch.eye(width, dtype=torch.bool))
    mask = torch.zeros(rows, 1, width, width).masked_fill(~allowed[:, None], float("-inf"))
    shape = (rows, c.num_key_value_heads, total, c.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in model.model.layers]

    logits = cached_forward(model, prompt, positions, mask, caches, 0)
    out = torch.empty(rows, new_tokens, dtype=torch.long)
    for step in range(new_tokens):
        token = pick(logits)
        out[:, step] = token
        if step + 1 == new_tokens:
            break
        start = width + step
        mask = torch.zeros(rows, 1, 1, start + 1).masked_fill(~key_real[:, None, None, : start + 1], float("-inf"))
        logits = cached_forward(model, token[:, None], (lengths + step)[:, None], mask, caches, start)
    return out


def greedy(logits):
    return logits.argmax(dim=-1)


def sample(logits):
    return torch.multinomial(F.softmax(logits, dim=-1), 1).squeeze(1)


def fail(message, code=2):
    print(f"error: {message}".replace("\n", " "), flush=True)
    sys.exit(code)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("prompts")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--max-new-tokens", type=int, required=True)
    ap.add_argument("--batch-rows", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads < 1 or args.samples < 1 or args.max_new_tokens < 1:
        fail("--threads, --samples and --max-new-tokens must be at least 1")
    if args.batch_rows != 0 and args.batch_rows < args.samples:
        fail(f"--batch-rows {args.batch_rows} cannot hold the {args.samples} samples of one prompt; use 0 or >= --samples")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        with open(f"{args.model_dir}/config.json") as f:
            model = CausalLM(Config(json.load(f)))
        model.load_state_dict(load_safetensors(f"{args.model_dir}/model.safetensors"), strict=True)
    except (OSError, ValueError, RuntimeError, KeyError, AssertionError) as e:
        fail(f"cannot load {args.model_dir}: {e}")
    model.float().eval().requires_grad_(False)
    try:
        tensors = load_safetensors(args.prompts)
        ids, lengths = tensors["input_ids"].long(), tensors["lengths"].long()
    except (OSError, KeyError, AssertionError, ValueError) as e:
        fail(f"cannot load prompts {args.prompts}: {e}")
    if ids.dim() != 2 or lengths.shape != (ids.shape[0],) or ids.shape[0] == 0:
        fail(f"prompts: input_ids {list(ids.shape)} and lengths {list(lengths.shape)} should be [P, Lmax] and [P], P >= 1")
    if int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]:
        fail(f"prompts: lengths must lie in 1..{ids.shape[1]}")
    prompt_count = ids.shape[0]
    prompts_per_batch = args.batch_rows // args.samples if args.batch_rows else prompt_count

    def run():
        for first in range(0, prompt_count, prompts_per_batch):
            chosen = slice(first, first + prompts_per_batch)
            generate(model, ids[chosen].repeat_interleave(args.samples, dim=0),
                     lengths[chosen].repeat_interleave(args.samples, dim=0), args.max_new_tokens, sample)

    print(f"ready: {sum(p.numel() for p in model.parameters())} {torch.get_num_threads()}", flush=True)
    with torch.no_grad():
        for words in commands():
            if words[0] == "run" and len(words) == 1:
                t0 = time.perf_counter()
                run()
                seconds = time.perf_counter() - t0
                print(f"ran: {seconds:.6f} {prompt_count * args.samples * args.max_new_tokens}", flush=True)
            elif (words[0] == "check" and len(words) == 3 and all(w.isdigit() for w in words[1:])
                  and 1 <= int(words[1]) <= prompt_count and int(words[2]) >= 1):
                count, new_tokens = int(words[1]), int(words[2])
                tokens = generate(model, ids[:count], lengths[:count], new_tokens, greedy)
                print("checked: " + ";".join(" ".join(str(t) for t in row) for row in tokens.tolist()), flush=True)
            else:
                print(f"error: unknown command {' '.join(words)!r}; expected 'check K T' (1 <= K <= {prompt_count}, "
                      "T >= 1), 'run' or 'quit'", flush=True)


if __name__ == "__main__":
    main()
