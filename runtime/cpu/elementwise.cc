// CPU kernels: fill, copy (with dtype conversion), random fill, unary, binary and affine ops.
#include <cmath>
#include <type_traits>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/random.h"

namespace weft {
namespace {

constexpr double kSqrtTwoOverPi = 0.79788456080286535587989211986876;
constexpr double kGeluCubic = 0.044715;

// tanh for GELU. In f32 through one exp: tanh(u) = sign(u) (1 - 2 / (exp(2|u|) + 1)); glibc's tanhf
// goes through expm1f and took about a fifth of a small model's CPU step (GELU forward and
// backward). This form is within about 1e-7 of it in absolute terms, which is what GELU's 1 + tanh
// sees, and saturates to +-1 for large |u|. f64 (the gradient checks) keeps std::tanh.
template <class C>
C gelu_tanh(C u) {
  if constexpr (std::is_same_v<C, float>) {
    const float magnitude = 1.0f - 2.0f / (std::exp(2.0f * std::fabs(u)) + 1.0f);
    return std::copysign(magnitude, u);
  } else {
    return std::tanh(u);
  }
}

template <class C>
C apply_unary(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kRelu: return x > C(0) ? x : C(0);
    case UnaryOp::kGelu: {
      const C inner = C(kSqrtTwoOverPi) * (x + C(kGeluCubic) * x * x * x);
      return C(0.5) * x * (C(1) + gelu_tanh(inner));
    }
    case UnaryOp::kSilu: return x / (C(1) + std::exp(-x));
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kLog: return std::log(x);
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kSquare: return x * x;
    case UnaryOp::kReciprocal: return C(1) / x;
  }
  return x;
}

// d op(x) / dx.
template <class C>
C unary_derivative(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::kNeg: return C(-1);
    case UnaryOp::kRelu: return x > C(0) ? C(1) : C(0);
    case UnaryOp::kGelu: {
      const C inner = C(kSqrtTwoOverPi) * (x + C(kGeluCubic) * x * x * x);
      const C tanh_inner = gelu_tanh(inner);
      const C inner_derivative = C(kSqrtTwoOverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
      return C(0.5) * (C(1) + tanh_inner) + C(0.5) * x * (C(1) - tanh_inner * tanh_inner) * inner_derivative;
    }
    case UnaryOp::kSilu: {
      const C sigmoid = C(1) / (C(1) + std::exp(-x));
      return sigmoid * (C(1) + x * (C(1) - sigmoid));
    }
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kLog: return C(1) / x;
    case UnaryOp::kTanh: {
      const C t = std::tanh(x);
      return C(1) - t * t;
    }
    case UnaryOp::kSqrt: return C(0.5) / std::sqrt(x);
    case UnaryOp::kSquare: return C(2) * x;
    case UnaryOp::kReciprocal: return C(-1) / (x * x);
  }
  return C(0);
}

// The largest value of stored type T that is below `limit`.
template <class T>
T largest_below(double limit) {
  if constexpr (std::is_same_v<T, double>) {
    return std::nextafter(limit, -INFINITY);
  } else if constexpr (std::is_same_v<T, float>) {
    const float rounded = static_cast<float>(limit);
    return static_cast<double>(rounded) < limit ? rounded : std::nextafter(rounded, -INFINITY);
  } else {
    // 16-bit formats: step the bit pattern toward -inf until the value is below the limit.
    T value = store_element<T>(limit);
    while (static_cast<double>(static_cast<float>(value)) >= limit) {
      const bool negative = (value.bits & 0x8000u) != 0;
      if ((value.bits & 0x7fffu) == 0) {
        value.bits = 0x8001u;  // from +-0 to the smallest negative subnormal
      } else {
        value.bits = static_cast<uint16_t>(negative ? value.bits + 1 : value.bits - 1);
      }
    }
    return value;
  }
}

}  // namespace

void CpuBackend::fill(const Tensor& out, double value) {
  cpu::dispatch_all(out.dtype(), "fill", [&]<class T>() {
    T* data = out.data<T>();
    const T stored = store_element<T>(value);
    cpu::for_each_index<1>(out.shape(), {&out.strides()}, [&](int64_t o) { data[o] = stored; });
  });
}

void CpuBackend::copy(const Tensor& source, const Tensor& out) {
  WEFT_CHECK(source.device().is_cpu() && out.device().is_cpu(), "copy: the CPU backend copies between CPU tensors "
             "only, got ", source.describe(), " -> ", out.describe());
  cpu::dispatch_all(source.dtype(), "copy", [&]<class S>() {
    cpu::dispatch_all(out.dtype(), "copy", [&]<class T>() {
      const S* in = source.data<S>();
      T* data = out.data<T>();
      cpu::for_each_index<2>(out.shape(), {&source.strides(), &out.strides()}, [&](int64_t s, int64_t o) {
        if constexpr (std::is_same_v<S, T>) {
          data[o] = in[s];
        } else if constexpr (std::is_integral_v<T>) {
          data[o] = static_cast<T>(static_cast<double>(load_element(in[s])));
        } else {
          // Float to float through double keeps f64 exact and rounds once for 16-bit targets.
          data[o] = store_element<T>(static_cast<double>(load_element(in[s])));
        }
      });
    });
  });
}

void CpuBackend::fill_random(const Tensor& out, RandomDistribution distribution, uint64_t seed, uint64_t offset,
                             double a, double b) {
  cpu::dispatch_floating(out.dtype(), "fill_random", [&]<class T>() {
    T* data = out.data<T>();
    const int64_t count = out.numel();
    // Rounding to the stored type can carry a + (b - a) u up to b; such draws become the largest
    // stored value below b, so uniform stays in [a, b) in every dtype.
    const T below_high = largest_below<T>(b);
    for (int64_t i = 0; i < count; ++i) {
      const uint64_t counter = offset + static_cast<uint64_t>(i);
      if (distribution == RandomDistribution::kUniform) {
        const T stored = store_element<T>(a + (b - a) * philox_uniform(seed, counter));
        data[i] = static_cast<double>(load_element(stored)) >= b ? below_high : stored;
      } else {
        data[i] = store_element<T>(a + b * philox_normal(seed, counter));
      }
    }
  });
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  cpu::dispatch_floating(x.dtype(), "unary", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* data = out.data<T>();
    cpu::for_each_index<2>(out.shape(), {&x.strides(), &out.strides()}, [&](int64_t i, int64_t o) {
      data[o] = store_element<T>(apply_unary<C>(op, load_element(in[i])));
    });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, const Tensor& grad_x) {
  cpu::dispatch_floating(x.dtype(), "unary_backward", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const T* gy = grad_out.data<T>();
    T* gx = grad_x.data<T>();
    cpu::for_each_index<3>(grad_x.shape(), {&x.strides(), &grad_out.strides(), &grad_x.strides()},
                           [&](int64_t i, int64_t g, int64_t o) {
                             gx[o] = store_element<T>(load_element(gy[g]) * unary_derivative<C>(op, load_element(in[i])));
                           });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu::dispatch_floating(out.dtype(), "binary", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in_a = a.data<T>();
    const T* in_b = b.data<T>();
    T* data = out.data<T>();
    cpu::for_each_index<3>(out.shape(), {&a.strides(), &b.strides(), &out.strides()},
                           [&](int64_t i, int64_t j, int64_t o) {
                             data[o] = store_element<T>(apply_binary_op<C>(op, load_element(in_a[i]), load_element(in_b[j])));
                           });
  });
}

void CpuBackend::affine(const Tensor& x, double scale, double shift, const Tensor& out) {
  cpu::dispatch_floating(x.dtype(), "affine", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* data = out.data<T>();
    const C scale_c = static_cast<C>(scale), shift_c = static_cast<C>(shift);
    cpu::for_each_index<2>(out.shape(), {&x.strides(), &out.strides()}, [&](int64_t i, int64_t o) {
      data[o] = store_element<T>(load_element(in[i]) * scale_c + shift_c);
    });
  });
}

void CpuBackend::scale_in_place(absl::Span<const Tensor> tensors, double factor) {
  for (const Tensor& tensor : tensors) affine(tensor, factor, 0.0, tensor);  // elementwise: in place is safe
}

void CpuBackend::clip_to_norm(absl::Span<const Tensor> tensors, const Tensor& squares, double max_norm) {
  WEFT_CHECK(squares.dim() == 1 && squares.is_contiguous() && squares.dtype() == kFloat64 && squares.device().is_cpu(),
             "clip_to_norm: squares must be [k] f64, contiguous, on the CPU; got ", squares.describe());
  double sum_of_squares = 0.0;
  for (int64_t i = 0; i < squares.size(0); ++i) sum_of_squares += squares.data<double>()[i];
  const double norm = std::sqrt(sum_of_squares);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) scale_in_place(tensors, max_norm / (norm + 1e-6));
}

}  // namespace weft
