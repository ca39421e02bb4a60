// kernels::attention on the CPU: per (row, kv head), blocks of query rows
// of the heads that share it, stacked, against the span of keys their mask
// allows; probabilities live only in a
// thread's block buffer, and the backward pass computes them again from the
// saved logsumexps (FlashAttention's recomputation, with whole key spans per
// block instead of key tiles: a block's [rows, keys] fits in cache-sized
// buffers at the lengths a CPU trains, and needs no running rescale).
#include "components/kernels/cpu/common.hpp"
#include "components/kernels/fused.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace glint::components::kernels {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kBlockRows = 64;  // query rows per block
// Query heads stacked into one product, at most (their blocks' rows and
// probabilities stay cache-sized).
constexpr int64_t kStackedHeads = 4;

// A strided [rows, cols] matrix over memory owned elsewhere (row stride ld),
// for at::mm_out: no copy, no allocation.
at::Tensor view_of(const void* p, int64_t rows, int64_t cols, int64_t ld, const at::TensorOptions& o) {
  return at::from_blob(const_cast<void*>(p), {rows, cols}, {ld, 1}, o);
}

// The query heads that share a kv head read the same keys and values: their
// blocks are stacked, [group * n, D], so that each product is one call of
// group * n rows (OpenBLAS runs a 64-row product well below its rate, and
// each call has its own overhead). rows(h) is head h's [n, D] block of a
// [T, heads * D] matrix (row stride ld); stack copies the group's blocks in,
// unstack copies a stacked result out.
template <typename T>
void stack(T* dst, const T* src, int64_t group, int64_t n, int64_t D, int64_t ld) {
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < n; ++i) std::copy_n(src + i * ld + g * D, D, dst + (g * n + i) * D);
}
template <typename T>
void unstack(T* dst, const T* src, int64_t group, int64_t n, int64_t D, int64_t ld) {
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < n; ++i) std::copy_n(src + (g * n + i) * D, D, dst + i * ld + g * D);
}

// The heads' blocks at src as one [heads * n, D] matrix: src's own rows for
// one head, else stacked into buf.
template <typename T>
at::Tensor stacked_rows(T* buf, const T* src, int64_t heads, int64_t n, int64_t D, int64_t ld,
                        const at::TensorOptions& o) {
  if (heads == 1) return view_of(src, n, D, ld, o);
  stack(buf, src, heads, n, D, ld);
  return view_of(buf, heads * n, D, D, o);
}

// Where a product for the heads' blocks at dst goes: dst's own rows for one
// head, else buf (unstack then copies it to dst).
template <typename T>
at::Tensor stacked_target(T* buf, T* dst, int64_t heads, int64_t n, int64_t D, int64_t ld,
                          const at::TensorOptions& o) {
  return heads == 1 ? view_of(dst, n, D, ld, o) : view_of(buf, heads * n, D, D, o);
}

// The shapes of one call, and the key span [k0, k1) each (row, block) may
// attend to: the union of its query rows' allowed keys.
struct Layout {
  int64_t B, T, heads, kv_heads, D, blocks;
  std::vector<int64_t> span;  // [B, blocks, 2]

  Layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& allowed)
      : B(q.size(0)), T(q.size(1)), heads(q.size(2)), kv_heads(k.size(2)), D(q.size(3)),
        blocks((T + kBlockRows - 1) / kBlockRows), span(static_cast<size_t>(B * blocks * 2)) {
    const bool* m = allowed.data_ptr<bool>();
    at::parallel_for(0, B * blocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t row = i / blocks, r0 = (i % blocks) * kBlockRows, r1 = std::min(T, r0 + kBlockRows);
        int64_t lo = T, hi = 0;
        for (int64_t r = r0; r < r1; ++r) {
          const bool* a = m + (row * T + r) * T;
          int64_t j = 0;
          while (j < T && !a[j]) ++j;
          TORCH_CHECK(j < T, "attention: query ", r, " of row ", row, " may attend to no key");
          lo = std::min(lo, j);
          int64_t l = T;
          while (l > j && !a[l - 1]) --l;
          hi = std::max(hi, l);
        }
        span[static_cast<size_t>(2 * i)] = lo;
        span[static_cast<size_t>(2 * i + 1)] = hi;
      }
    });
  }
  int64_t k0(int64_t row, int64_t blk) const { return span[static_cast<size_t>(2 * (row * blocks + blk))]; }
  int64_t k1(int64_t row, int64_t blk) const { return span[static_cast<size_t>(2 * (row * blocks + blk) + 1)]; }
};

// P = softmax(S * scale, masked) in place over a block's [n, kn] scores;
// returns each row's logsumexp of the scaled, masked scores in lse.
template <typename T>
GLINT_KERNEL_CLONES void softmax_block(T* S, int64_t n, int64_t kn, const uint8_t* mask, int64_t mask_ld, T scale,
                                       T* lse) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    T* s = S + i * kn;
    const uint8_t* a = mask + i * mask_ld;
    T mx = neg_inf;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < kn; ++j) {
      const T v = a[j] ? s[j] * scale : neg_inf;
      s[j] = v;
      mx = v > mx ? v : mx;
    }
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < kn; ++j) {
      const T e = a[j] ? cpu::exp(s[j] - mx) : T{0};
      s[j] = e;
      sum += e;
    }
    const T inv = T{1} / sum;
#pragma omp simd
    for (int64_t j = 0; j < kn; ++j) s[j] *= inv;
    lse[i] = mx + std::log(sum);
  }
}

// The rows of a block in the backward pass: p holds their scores q.k, d
// their dP = dO.v. P again from the saved logsumexps; then with delta =
// sum_j P dP (= dO . O), dS = P (dP - delta) scale, into d.
template <typename T>
GLINT_KERNEL_CLONES void score_gradients_block(T* P, T* D, int64_t n, int64_t kn, const uint8_t* mask, int64_t mask_ld,
                                               T scale, const T* lse) {
  for (int64_t i = 0; i < n; ++i) {
    T* p = P + i * kn;
    T* d = D + i * kn;
    const uint8_t* a = mask + i * mask_ld;
    const T l = lse[i];
    T delta = 0;
#pragma omp simd reduction(+ : delta)
    for (int64_t j = 0; j < kn; ++j) {
      const T e = a[j] ? cpu::exp(p[j] * scale - l) : T{0};
      p[j] = e;
      delta += e * d[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < kn; ++j) d[j] = p[j] * (d[j] - delta) * scale;
  }
}

struct AttentionFn : torch::autograd::Function<AttentionFn> {
  // q [B, T, H, D], k and v [B, T, KV, D], allowed [B, T, T] -> [B, T, H, D].
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& allowed, double scale) {
    Layout L{q, k, allowed};
    const int64_t group = L.heads / L.kv_heads, stacked = std::min(group, kStackedHeads);
    auto out = at::empty_like(q);
    auto lse = at::empty({L.B, L.heads, L.T}, q.options());
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention", [&] {
      const auto* qp = q.data_ptr<scalar_t>();
      const auto* kp = k.data_ptr<scalar_t>();
      const auto* vp = v.data_ptr<scalar_t>();
      auto* op = out.data_ptr<scalar_t>();
      auto* lp = lse.data_ptr<scalar_t>();
      const uint8_t* mp = cpu::bool_bytes(allowed);
      const int64_t ldq = L.heads * L.D, ldk = L.kv_heads * L.D;
      const auto o = q.options();
      // One task per (row, kv head, block): the group's query heads stacked,
      // kStackedHeads at a time (one head reads and writes q and out in
      // place).
      at::parallel_for(0, L.B * L.kv_heads * L.blocks, 1, [&](int64_t b, int64_t e) {
        std::vector<scalar_t> buf(static_cast<size_t>(stacked * kBlockRows * L.T));
        const size_t rows = stacked > 1 ? static_cast<size_t>(stacked * kBlockRows * L.D) : 0;
        std::vector<scalar_t> qbuf(rows), obuf(rows);
        for (int64_t t = b; t < e; ++t) {
          const int64_t row = t / (L.kv_heads * L.blocks), kh = t / L.blocks % L.kv_heads, blk = t % L.blocks;
          const int64_t r0 = blk * kBlockRows, n = std::min(L.T, r0 + kBlockRows) - r0;
          const int64_t k0 = L.k0(row, blk), kn = L.k1(row, blk) - k0;
          for (int64_t h0 = kh * group; h0 < (kh + 1) * group; h0 += stacked) {
            const int64_t heads = std::min(stacked, (kh + 1) * group - h0);  // in this product
            const scalar_t* qs = qp + (row * L.T + r0) * ldq + h0 * L.D;
            scalar_t* os = op + (row * L.T + r0) * ldq + h0 * L.D;
            auto Q = stacked_rows(qbuf.data(), qs, heads, n, L.D, ldq, o);
            auto K = view_of(kp + (row * L.T + k0) * ldk + kh * L.D, kn, L.D, ldk, o);
            auto V = view_of(vp + (row * L.T + k0) * ldk + kh * L.D, kn, L.D, ldk, o);
            auto S = view_of(buf.data(), heads * n, kn, kn, o);
            at::mm_out(S, Q, K.t());
            for (int64_t g = 0; g < heads; ++g)
              softmax_block(buf.data() + g * n * kn, n, kn, mp + (row * L.T + r0) * L.T + k0, L.T,
                            static_cast<scalar_t>(scale), lp + (row * L.heads + h0 + g) * L.T + r0);
            auto O = stacked_target(obuf.data(), os, heads, n, L.D, ldq, o);
            at::mm_out(O, S, V);
            if (heads > 1) unstack(os, obuf.data(), heads, n, L.D, ldq);
          }
        }
      });
    });
    ctx->save_for_backward({q, k, v, allowed, lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &allowed = saved[3], &lse = saved[4];
    const double scale = ctx->saved_data["scale"].toDouble();
    auto dout = grads[0].contiguous();
    Layout L{q, k, allowed};
    const int64_t group = L.heads / L.kv_heads, stacked = std::min(group, kStackedHeads);
    // dQ is written whole block by block; dK and dV sum over the query
    // blocks and the heads that share them, so each task owns one kv head of
    // one row and everything that adds into it.
    auto dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "attention_backward", [&] {
      const auto* qp = q.data_ptr<scalar_t>();
      const auto* kp = k.data_ptr<scalar_t>();
      const auto* vp = v.data_ptr<scalar_t>();
      const auto* gp = dout.data_ptr<scalar_t>();
      const auto* lp = lse.data_ptr<scalar_t>();
      const uint8_t* mp = cpu::bool_bytes(allowed);
      auto *dqp = dq.data_ptr<scalar_t>(), *dkp = dk.data_ptr<scalar_t>(), *dvp = dv.data_ptr<scalar_t>();
      const int64_t ldq = L.heads * L.D, ldk = L.kv_heads * L.D;
      const auto o = q.options();
      const auto sc = static_cast<scalar_t>(scale);
      at::parallel_for(0, L.B * L.kv_heads, 1, [&](int64_t b, int64_t e) {
        std::vector<scalar_t> pbuf(static_cast<size_t>(stacked * kBlockRows * L.T)), dbuf(pbuf.size());
        // The heads' q, dO and dQ blocks stacked (one head in place).
        const size_t rows = stacked > 1 ? static_cast<size_t>(stacked * kBlockRows * L.D) : 0;
        std::vector<scalar_t> qbuf(rows), gbuf(rows), dqbuf(rows);
        for (int64_t t = b; t < e; ++t) {
          const int64_t row = t / L.kv_heads, kh = t % L.kv_heads;
          for (int64_t h0 = kh * group; h0 < (kh + 1) * group; h0 += stacked) {
            const int64_t heads = std::min(stacked, (kh + 1) * group - h0);
            for (int64_t blk = 0; blk < L.blocks; ++blk) {
              const int64_t r0 = blk * kBlockRows, n = std::min(L.T, r0 + kBlockRows) - r0, m = heads * n;
              const int64_t k0 = L.k0(row, blk), kn = L.k1(row, blk) - k0;
              const scalar_t* Qp = qp + (row * L.T + r0) * ldq + h0 * L.D;
              const scalar_t* Gp = gp + (row * L.T + r0) * ldq + h0 * L.D;
              scalar_t* dQp = dqp + (row * L.T + r0) * ldq + h0 * L.D;
              auto Q = stacked_rows(qbuf.data(), Qp, heads, n, L.D, ldq, o);
              auto G = stacked_rows(gbuf.data(), Gp, heads, n, L.D, ldq, o);
              auto K = view_of(kp + (row * L.T + k0) * ldk + kh * L.D, kn, L.D, ldk, o);
              auto V = view_of(vp + (row * L.T + k0) * ldk + kh * L.D, kn, L.D, ldk, o);
              auto dK = view_of(dkp + (row * L.T + k0) * ldk + kh * L.D, kn, L.D, ldk, o);
              auto dV = view_of(dvp + (row * L.T + k0) * ldk + kh * L.D, kn, L.D, ldk, o);
              auto P = view_of(pbuf.data(), m, kn, kn, o), dP = view_of(dbuf.data(), m, kn, kn, o);
              at::mm_out(P, Q, K.t());
              at::mm_out(dP, G, V.t());
              const uint8_t* mask = mp + (row * L.T + r0) * L.T + k0;
              for (int64_t g = 0; g < heads; ++g)
                score_gradients_block(pbuf.data() + g * n * kn, dbuf.data() + g * n * kn, n, kn, mask, L.T, sc,
                                      lp + (row * L.heads + h0 + g) * L.T + r0);
              at::addmm_out(dV, dV, P.t(), G);
              auto dQ = stacked_target(dqbuf.data(), dQp, heads, n, L.D, ldq, o);
              at::mm_out(dQ, dP, K);
              if (heads > 1) unstack(dQp, dqbuf.data(), heads, n, L.D, ldq);
              at::addmm_out(dK, dK, dP.t(), Q);
            }
          }
        }
      });
    });
    return {dq, dk, dv, at::Tensor{}, at::Tensor{}};
  }
};

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& allowed,
                     double scale) {
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) cpu::check_floating_cpu(*t, "attention", name);
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: q, k, v must be [B, T, heads, D], not ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), "attention: k is ", k.sizes(), ", v ", v.sizes());
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  TORCH_CHECK(k.size(0) == B && k.size(1) == T && k.size(3) == D, "attention: q is ", q.sizes(), ", k ", k.sizes());
  TORCH_CHECK(k.size(2) > 0 && H % k.size(2) == 0, "attention: ", H, " query heads are not a multiple of ", k.size(2),
              " kv heads");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "attention: q is ",
              q.scalar_type(), ", k ", k.scalar_type(), ", v ", v.scalar_type());
  TORCH_CHECK(allowed.defined() && allowed.scalar_type() == at::kBool && allowed.dim() == 3 && allowed.size(0) == B &&
                  allowed.size(1) == T && allowed.size(2) == T,
              "attention: allowed must be bool [", B, ", ", T, ", ", T, "]");
  auto out = AttentionFn::apply(q.contiguous(), k.contiguous(), v.contiguous(), allowed.contiguous(), scale);
  return out.view({B, T, H * D});
}

}  // namespace glint::components::kernels
