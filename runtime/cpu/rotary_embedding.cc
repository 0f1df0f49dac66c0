// CPU kernels: the rotary position embedding (rotate-half form) and its transpose, one pass each.
//
// The reference for runtime/cuda/rotary_embedding.cu. Each product is rounded to the compute type
// before the sum, which is what the unfused ops did (mul, mul, then add, each a kernel of its own),
// so f32 and f64 results equal them bit for bit. That holds as long as the compiler does not
// contract a * b + c into a fused multiply-add: weft builds for baseline x86-64, which has no FMA.
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"

namespace weft {
namespace {

// out[b, h, t, :] = the rotation of in[b, h, t, :] by the angles of position t (or its transpose).
// in, out [B, H, T, D] strided with unit stride in D; cos, sin [T, D] contiguous.
template <class T, bool kTranspose>
void rotate_rows(const Tensor& in, const Tensor& cos, const Tensor& sin, const Tensor& out) {
  using C = ComputeType<T>;
  const int64_t batch = in.size(0), heads = in.size(1), time = in.size(2), head_dim = in.size(3);
  const int64_t half = head_dim / 2;
  const T* source = in.data<T>();
  T* target = out.data<T>();
  const T* cos_table = cos.data<T>();
  const T* sin_table = sin.data<T>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < time; ++t) {
        const T* row = source + b * in.stride(0) + h * in.stride(1) + t * in.stride(2);
        T* result = target + b * out.stride(0) + h * out.stride(1) + t * out.stride(2);
        const T* c = cos_table + t * head_dim;
        const T* s = sin_table + t * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const C first = load_element(row[i]), second = load_element(row[i + half]);
          const C cos_first = load_element(c[i]), cos_second = load_element(c[i + half]);
          const C sin_first = load_element(s[i]), sin_second = load_element(s[i + half]);
          if constexpr (kTranspose) {
            const C kept_first = first * cos_first, moved_first = second * sin_second;
            const C kept_second = second * cos_second, moved_second = first * sin_first;
            result[i] = store_element<T>(kept_first + moved_first);
            result[i + half] = store_element<T>(kept_second - moved_second);
          } else {
            const C kept_first = first * cos_first, moved_first = second * sin_first;
            const C kept_second = second * cos_second, moved_second = first * sin_second;
            result[i] = store_element<T>(kept_first - moved_first);
            result[i + half] = store_element<T>(kept_second + moved_second);
          }
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) {
  cpu::dispatch_floating(x.dtype(), "rotary_embedding",
                         [&]<class T>() { rotate_rows<T, /*kTranspose=*/false>(x, cos, sin, out); });
}

void CpuBackend::rotary_embedding_backward(const Tensor& grad_out, const Tensor& cos, const Tensor& sin,
                                           const Tensor& grad_x) {
  cpu::dispatch_floating(grad_out.dtype(), "rotary_embedding_backward",
                         [&]<class T>() { rotate_rows<T, /*kTranspose=*/true>(grad_out, cos, sin, grad_x); });
}

}  // namespace weft
