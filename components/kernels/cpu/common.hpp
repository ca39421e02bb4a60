#pragma once
// What the CPU kernels share: argument checks and the float/double dispatch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

/// A kernel's row or span loop compiled twice, for x86-64-v3 (AVX2, FMA)
/// and for the baseline the rest of the build targets, the one this CPU
/// runs chosen once at load (GCC's function multiversioning): the build
/// stays runnable on any x86-64 while the loops use 8-wide vectors where
/// there are. The loops' files build with -fno-trapping-math so that GCC
/// if-converts their selects (components/CMakeLists.txt). Not under TSan:
/// the clones' ifunc resolvers run while the dynamic loader relocates, before
/// TSan's runtime is set up, and instrumented they crash the program there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define GLINT_KERNEL_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define GLINT_KERNEL_CLONES
#endif

namespace glint::components::kernels::cpu {

/// Throws c10::Error (LibTorch's way: these run inside autograd) unless t is
/// a CPU tensor of f32 or f64.
inline void check_floating_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": no kernel for ", t.device(), " yet (components/kernels/cpu only); ", name,
              " is there");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, op, ": ", name, " is ",
              t.scalar_type(), "; the kernel takes float32 or float64");
}

/// A bool tensor's elements as bytes (0 or 1): GCC vectorises no loop that
/// loads a bool (it has no vector type for one), so the kernels' loops read
/// masks through this.
inline const uint8_t* bool_bytes(const at::Tensor& t) {
  static_assert(sizeof(bool) == 1);
  return reinterpret_cast<const uint8_t*>(t.data_ptr<bool>());
}

/// Rows per at::parallel_for task so that each task touches about `work`
/// elements: small tensors stay on one thread.
inline int64_t grain_rows(int64_t row_elems, int64_t work = 32768) {
  return std::max<int64_t>(1, work / std::max<int64_t>(row_elems, 1));
}

/// e^x in float32 without a call, so that the loops around it vectorise
/// (libm's expf is one call per element: 6% of a `glint bench train` step went
/// to the SwiGLU and attention kernels' exps). Cephes' method: x = k ln 2 +
/// r with |r| <= ln 2 / 2, a degree-7 polynomial for e^r, and 2^k applied in
/// two halves so that results down to the subnormals come out as IEEE's do;
/// within 2 ulp of e^x over [-104, 88.7] (tested against std::exp), 0 below,
/// inf above, NaN for NaN.
inline float exp_f32(float x) {
  // Selects, not branches or std::min's references, so that GCC if-converts.
  const bool number = x == x;
  float c = x < -104.0f ? -104.0f : x;
  c = c > 88.8f ? 88.8f : c;
  c = number ? c : 0.0f;
  constexpr float shifter = 12582912.0f;  // 1.5 x 2^23: adding it rounds to an integer
  const float kf = (c * 1.44269504088896341f + shifter) - shifter;
  float r = c - kf * 0.693359375f;  // ln 2 in two parts, the first exact in few bits
  r = r - kf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const auto k = static_cast<int32_t>(kf);
  const int32_t k1 = k >> 1, k2 = k - k1;  // each in [-75, 64]: 2^k1 and 2^k2 are normal floats
  const float s1 = std::bit_cast<float>(static_cast<int32_t>((k1 + 127) << 23));
  const float s2 = std::bit_cast<float>(static_cast<int32_t>((k2 + 127) << 23));
  const float out = y * s1 * s2;
  return number ? out : x;
}

/// e^x: exp_f32 for float, std::exp for double (the reference precision).
template <typename T>
inline T exp(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}

}  // namespace glint::components::kernels::cpu
