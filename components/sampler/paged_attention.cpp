#include "components/sampler/paged_attention.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace glint::components {

namespace {

// The two inner loops, for every head of a group at once: dot products of
// the group's queries with one key row, and accumulation of one value row.
struct Kernels {
  void (*dots)(const float* q, int64_t g, int64_t d, const float* k, float* out);
  void (*axpy)(float* acc, int64_t g, int64_t d, const float* p, const float* v);
};

void dots_scalar(const float* q, int64_t g, int64_t d, const float* k, float* out) {
  for (int64_t h = 0; h < g; ++h) {
    float s = 0;
    for (int64_t i = 0; i < d; ++i) s += q[h * d + i] * k[i];
    out[h] = s;
  }
}

void axpy_scalar(float* acc, int64_t g, int64_t d, const float* p, const float* v) {
  for (int64_t h = 0; h < g; ++h)
    for (int64_t i = 0; i < d; ++i) acc[h * d + i] += p[h] * v[i];
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// d is a multiple of 8 here.
__attribute__((target("avx2,fma"))) void dots_avx2(const float* q, int64_t g, int64_t d, const float* k, float* out) {
  for (int64_t h = 0; h < g; ++h) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + i), _mm256_loadu_ps(k + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + i + 8), _mm256_loadu_ps(k + i + 8), s1);
    }
    for (; i < d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * d + i), _mm256_loadu_ps(k + i), s0);
    out[h] = hsum(_mm256_add_ps(s0, s1));
  }
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float* acc, int64_t g, int64_t d, const float* p, const float* v) {
  for (int64_t h = 0; h < g; ++h) {
    const __m256 w = _mm256_set1_ps(p[h]);
    for (int64_t i = 0; i < d; i += 8)
      _mm256_storeu_ps(acc + h * d + i, _mm256_fmadd_ps(w, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + h * d + i)));
  }
}
#endif

Kernels pick(int64_t d) {
#if defined(__x86_64__)
  if (d % 8 == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {dots_avx2, axpy_avx2};
#endif
  return {dots_scalar, axpy_scalar};
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& slots_in, const at::Tensor& lengths_in, double scale,
                                  int64_t window) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "paged_decode_attention: shapes");
  TORCH_CHECK(q_in.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat, "paged_decode_attention: f32 only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "paged_decode_attention: the cache must be contiguous");
  const auto q = q_in.contiguous();
  const auto slots = slots_in.contiguous();
  const auto lengths = lengths_in.contiguous();
  const int64_t S = q.size(0), nh = q.size(1), D = q.size(2), nkv = k_cache.size(1), C = slots.size(1);
  TORCH_CHECK(k_cache.size(2) == D && nh % nkv == 0 && slots.size(0) == S && lengths.size(0) == S,
              "paged_decode_attention: shapes");
  const int64_t g = nh / nkv, row = nkv * D;
  auto out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const auto kern = pick(D);
  const auto fscale = static_cast<float>(scale);
  // One task per (sequence, kv head): its group of query heads shares every
  // key and value row it reads.
  at::parallel_for(0, S * nkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc(static_cast<size_t>(g * D)), p(static_cast<size_t>(g)), dots(static_cast<size_t>(g)),
        best(static_cast<size_t>(g)), total(static_cast<size_t>(g));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / nkv, h = task % nkv;
      const int64_t full = std::clamp<int64_t>(lp[s], 1, C);
      // A window reads the last `window` positions: the first skipped.
      const int64_t first = window > 0 ? std::max<int64_t>(0, full - window) : 0;
      const int64_t len = full - first;
      const float* qh = qp + (s * nh + h * g) * D;
      const int64_t* slot = sp + s * C + first;
      scores.resize(static_cast<size_t>(g * len));
      std::fill(best.begin(), best.end(), -INFINITY);
      for (int64_t j = 0; j < len; ++j) {
        kern.dots(qh, g, D, kp + slot[j] * row + h * D, dots.data());
        for (int64_t k = 0; k < g; ++k) {
          const float v = dots[static_cast<size_t>(k)] * fscale;
          scores[static_cast<size_t>(k * len + j)] = v;
          best[static_cast<size_t>(k)] = std::max(best[static_cast<size_t>(k)], v);
        }
      }
      std::fill(total.begin(), total.end(), 0.0f);
      for (int64_t k = 0; k < g; ++k)
        for (int64_t j = 0; j < len; ++j) {
          auto& e = scores[static_cast<size_t>(k * len + j)];
          e = std::exp(e - best[static_cast<size_t>(k)]);
          total[static_cast<size_t>(k)] += e;
        }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < len; ++j) {
        for (int64_t k = 0; k < g; ++k) p[static_cast<size_t>(k)] = scores[static_cast<size_t>(k * len + j)];
        kern.axpy(acc.data(), g, D, p.data(), vp + slot[j] * row + h * D);
      }
      for (int64_t k = 0; k < g; ++k) {
        const float inv = 1.0f / total[static_cast<size_t>(k)];
        float* o = op + (s * nh + h * g + k) * D;
        for (int64_t i = 0; i < D; ++i) o[i] = acc[static_cast<size_t>(k * D + i)] * inv;
      }
    }
  });
  return out;
}

}  // namespace glint::components
