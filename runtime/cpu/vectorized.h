// What the CPU kernels' inner loops need to vectorize: a dispatch on the CPU's vector width and an
// exp the compiler can vectorize.
//
// WEFT_CPU_VECTORIZED on a function builds it three times (AVX-512, AVX2 + FMA, and the x86-64
// baseline) and picks one at load time from the CPU's features (GCC's target_clones; elsewhere it
// expands to nothing and the baseline is built). The kernel files are compiled with
// -ffp-contract=off (runtime/cpu in CMakeLists.txt), so no clone fuses a multiply and an add the
// others do not: every clone computes bit for bit the same results, and the choice of clone never
// changes a loss.
//
// vectorizable_exp(float) is exp by range reduction (x = n ln 2 + r, |r| <= ln 2 / 2) and a
// degree-7 Taylor polynomial in r, scaled by 2^n through the exponent bits: branch-free and
// call-free, so loops around it vectorize, within 2 ulp of std::exp over [-87, 88] (tested), 0
// below -87.3 and saturating at exp(88) above 88. f64 code keeps std::exp.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define WEFT_CPU_VECTORIZED __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define WEFT_CPU_VECTORIZED
#endif
// GCC inlines a function built for the baseline into a clone built for another -march only when it
// must: the helpers a vectorized loop calls are forced inline, or the loop calls them one element
// at a time (the profile showed vectorizable_exp called out of line from GELU's backward loop).
#if defined(__GNUC__)
#define WEFT_CPU_INLINE inline __attribute__((always_inline))
#else
#define WEFT_CPU_INLINE inline
#endif

namespace weft::cpu {

WEFT_CPU_INLINE float vectorizable_exp(float x) {
  constexpr float kLog2E = 1.44269504088896341f;
  constexpr float kLn2High = 0.693359375f;  // ln 2 split in two so that n * kLn2High is exact
  constexpr float kLn2Low = -2.12194440e-4f;
  constexpr float kRoundingShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const bool underflows = x < -87.3f;
  x = std::min(std::max(x, -87.3f), 88.0f);
  const float n = (x * kLog2E + kRoundingShift) - kRoundingShift;
  const float r = (x - n * kLn2High) - n * kLn2Low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<int32_t>((static_cast<int32_t>(n) + 127) << 23));
  return underflows ? 0.0f : p * scale;
}

// exp in the kernels' f32 math (GELU's tanh, SiLU's sigmoid, attention's softmax): vectorizable_exp,
// whose saturation at exp(88) neither a 1 + exp(...) in a denominator nor a softmax's arguments
// (at most 0 after the row maximum is taken off) notice; f64 (the gradient checks) keeps std::exp.
// elementwise.cc and swiglu.cc both use it, so the fused SwiGLU equals silu then mul bit for bit.
template <class C>
WEFT_CPU_INLINE C kernel_exp(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return vectorizable_exp(x);
  } else {
    return std::exp(x);
  }
}

}  // namespace weft::cpu
