#pragma once
/// Decode attention straight from the paged KV cache: one query token per
/// sequence against the keys and values of its context, read in place
/// through its slots (no gather into a padded copy, no per-head matmul
/// calls). For components/ code and tests (it takes ATen tensors).
///
/// On this workload (hundreds of sequences of a few hundred tokens, head
/// dim 64) the time goes to reading the cache once; the gather-then-bmm
/// way reads and writes it three times more and calls the BLAS per head.

#include <ATen/ATen.h>

namespace glint::components {

/// q [S, heads, D] f32; k_cache and v_cache [slots, kv_heads, D] f32;
/// slots i64 [S, C]: the cache slot of each context position (entries at or
/// past a sequence's length are not read); lengths i64 [S], each in [1, C].
/// Returns softmax(q k^T * scale) v as [S, heads, D]; query head h reads
/// kv head h / (heads / kv_heads). With `window` > 0 (a sliding-window
/// layer) a sequence of length n reads only its last min(n, window)
/// positions.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& slots, const at::Tensor& lengths, double scale,
                                  int64_t window = 0);

}  // namespace glint::components
