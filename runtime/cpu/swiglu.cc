// CPU kernels: SwiGLU's activation silu(gate) * up and its backward, one pass each.
//
// The reference for runtime/cuda/swiglu.cu. silu and its derivative are written exactly as
// elementwise.cc's UnaryOp::kSilu, and the products are rounded in the order of the unfused ops
// (silu, then mul; backward: grad * up, then * silu'), so f32 and f64 results equal silu then mul
// bit for bit (no fused multiply-add on baseline x86-64). 16-bit dtypes compute in f32 and round
// once, where the unfused ops rounded silu(gate) and grad * up to the dtype first. Elements are
// split over the thread pool, and the loops are built for the CPU's vector width (vectorized.h).
#include <cmath>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/cpu/parallel_for.h"
#include "runtime/cpu/vectorized.h"

namespace weft {
namespace {

template <class C>
WEFT_CPU_INLINE C sigmoid(C x) {
  return C(1) / (C(1) + cpu::kernel_exp(-x));
}

template <class C>
WEFT_CPU_INLINE C silu(C x) {
  return x / (C(1) + cpu::kernel_exp(-x));
}

// d silu(x) / dx = sigmoid(x) (1 + x (1 - sigmoid(x))).
template <class C>
WEFT_CPU_INLINE C silu_derivative(C x) {
  const C s = sigmoid(x);
  return s * (C(1) + x * (C(1) - s));
}

template <class T>
WEFT_CPU_VECTORIZED void swiglu_loop(const T* g, const T* u, T* o, int64_t count) {
  using C = ComputeType<T>;
  for (int64_t i = 0; i < count; ++i) {
    const C activated = silu(load_element(g[i]));
    o[i] = store_element<T>(activated * load_element(u[i]));
  }
}

template <class T>
WEFT_CPU_VECTORIZED void swiglu_backward_loop(const T* g, const T* u, const T* gy, T* gg, T* gu, int64_t count) {
  using C = ComputeType<T>;
  for (int64_t i = 0; i < count; ++i) {
    const C x = load_element(g[i]), grad = load_element(gy[i]);
    const C grad_activated = grad * load_element(u[i]);
    gu[i] = store_element<T>(grad * silu(x));
    gg[i] = store_element<T>(grad_activated * silu_derivative(x));
  }
}

}  // namespace

void CpuBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  cpu::dispatch_floating(gate.dtype(), "swiglu", [&]<class T>() {
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    T* o = out.data<T>();
    cpu::parallel_for(out.numel(), 24, [&](int64_t begin, int64_t end) {
      swiglu_loop(g + begin, u + begin, o + begin, end - begin);
    });
  });
}

void CpuBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out,
                                 const Tensor& grad_gate, const Tensor& grad_up) {
  cpu::dispatch_floating(gate.dtype(), "swiglu_backward", [&]<class T>() {
    const T* g = gate.data<T>();
    const T* u = up.data<T>();
    const T* gy = grad_out.data<T>();
    T* gg = grad_gate.data<T>();
    T* gu = grad_up.data<T>();
    cpu::parallel_for(gate.numel(), 40, [&](int64_t begin, int64_t end) {
      swiglu_backward_loop(g + begin, u + begin, gy + begin, gg + begin, gu + begin, end - begin);
    });
  });
}

}  // namespace weft
