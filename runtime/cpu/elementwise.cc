// CPU kernels: fill, copy (with dtype conversion), random fill, unary, binary and affine ops.
//
// Each kernel walks its operands a row at a time (cpu::for_each_row: contiguous operands are one
// row, split over the thread pool) and hands each row to a row loop built for the CPU's vector
// width (WEFT_CPU_VECTORIZED); the op is chosen once per call, outside the loop (with_unary_op,
// with_binary_op), so that the loop body is straight-line arithmetic the compiler vectorizes.
#include <cmath>
#include <type_traits>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/cpu/vectorized.h"
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
WEFT_CPU_INLINE C gelu_tanh(C u) {
  if constexpr (std::is_same_v<C, float>) {
    const float magnitude = 1.0f - 2.0f / (cpu::kernel_exp(2.0f * std::fabs(u)) + 1.0f);
    return std::copysign(magnitude, u);
  } else {
    return std::tanh(u);
  }
}

template <class C>
WEFT_CPU_INLINE C apply_unary(UnaryOp op, C x) {
  switch (op) {
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kRelu: return x > C(0) ? x : C(0);
    case UnaryOp::kGelu: {
      const C inner = C(kSqrtTwoOverPi) * (x + C(kGeluCubic) * x * x * x);
      return C(0.5) * x * (C(1) + gelu_tanh(inner));
    }
    case UnaryOp::kSilu: return x / (C(1) + cpu::kernel_exp(-x));
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
WEFT_CPU_INLINE C unary_derivative(UnaryOp op, C x) {
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
      const C sigmoid = C(1) / (C(1) + cpu::kernel_exp(-x));
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

// Calls body(std::integral_constant<UnaryOp, op>{}): the op becomes a compile-time constant in the
// row loop, and apply_unary's switch folds away.
template <class Body>
void with_unary_op(UnaryOp op, Body&& body) {
  switch (op) {
#define WEFT_UNARY_CASE(name) \
  case UnaryOp::name: body(std::integral_constant<UnaryOp, UnaryOp::name>{}); return;
    WEFT_UNARY_CASE(kNeg) WEFT_UNARY_CASE(kRelu) WEFT_UNARY_CASE(kGelu) WEFT_UNARY_CASE(kSilu)
    WEFT_UNARY_CASE(kExp) WEFT_UNARY_CASE(kLog) WEFT_UNARY_CASE(kTanh) WEFT_UNARY_CASE(kSqrt)
    WEFT_UNARY_CASE(kSquare) WEFT_UNARY_CASE(kReciprocal)
#undef WEFT_UNARY_CASE
  }
  WEFT_FAIL("unary: unknown op ", static_cast<int>(op));
}

template <class Body>
void with_binary_op(BinaryOp op, Body&& body) {
  switch (op) {
    case BinaryOp::kAdd: body(std::integral_constant<BinaryOp, BinaryOp::kAdd>{}); return;
    case BinaryOp::kSub: body(std::integral_constant<BinaryOp, BinaryOp::kSub>{}); return;
    case BinaryOp::kMul: body(std::integral_constant<BinaryOp, BinaryOp::kMul>{}); return;
    case BinaryOp::kDiv: body(std::integral_constant<BinaryOp, BinaryOp::kDiv>{}); return;
  }
  WEFT_FAIL("binary: unknown op ", static_cast<int>(op));
}

// Row loops: out[i] = f(a[i]) and out[i] = f(a[i], b[i]) over `length` elements with the given
// strides. Unit strides (and a broadcast operand's stride 0) get loops of their own, which vectorize.
template <class T, class A, class F>
WEFT_CPU_VECTORIZED void map_row(T* out, int64_t out_stride, const A* a, int64_t a_stride, int64_t length, F f) {
  if (out_stride == 1 && a_stride == 1) {
    for (int64_t i = 0; i < length; ++i) out[i] = f(a[i]);
  } else if (out_stride == 1 && a_stride == 0) {  // fill, and broadcast sources
    const T value = f(a[0]);
    for (int64_t i = 0; i < length; ++i) out[i] = value;
  } else {
    for (int64_t i = 0; i < length; ++i) out[i * out_stride] = f(a[i * a_stride]);
  }
}

template <class T, class F>
WEFT_CPU_VECTORIZED void map_row(T* out, int64_t out_stride, const T* a, int64_t a_stride, const T* b,
                                 int64_t b_stride, int64_t length, F f) {
  if (out_stride == 1 && a_stride == 1 && b_stride == 1) {
    for (int64_t i = 0; i < length; ++i) out[i] = f(a[i], b[i]);
  } else if (out_stride == 1 && a_stride == 1 && b_stride == 0) {
    const T b_value = b[0];
    for (int64_t i = 0; i < length; ++i) out[i] = f(a[i], b_value);
  } else if (out_stride == 1 && a_stride == 0 && b_stride == 1) {
    const T a_value = a[0];
    for (int64_t i = 0; i < length; ++i) out[i] = f(a_value, b[i]);
  } else {
    for (int64_t i = 0; i < length; ++i) out[i * out_stride] = f(a[i * a_stride], b[i * b_stride]);
  }
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
    cpu::for_each_row<1>(out.shape(), {&out.strides()}, 1, [&](auto offsets, auto strides, int64_t length) {
      map_row(data + offsets[0], strides[0], &stored, 0, length, [](T x) { return x; });
    });
  });
}

void CpuBackend::copy(const Tensor& source, const Tensor& out) {
  WEFT_CHECK(source.device().is_cpu() && out.device().is_cpu(), "copy: the CPU backend copies between CPU tensors "
             "only, got ", source.describe(), " -> ", out.describe());
  cpu::dispatch_all(source.dtype(), "copy", [&]<class S>() {
    cpu::dispatch_all(out.dtype(), "copy", [&]<class T>() {
      const S* in = source.data<S>();
      T* data = out.data<T>();
      cpu::for_each_row<2>(out.shape(), {&source.strides(), &out.strides()}, 1,
                           [&](auto offsets, auto strides, int64_t length) {
        map_row(data + offsets[1], strides[1], in + offsets[0], strides[0], length, [](S x) {
          if constexpr (std::is_same_v<S, T>) {
            return x;
          } else if constexpr (std::is_integral_v<T>) {
            return static_cast<T>(static_cast<double>(load_element(x)));
          } else {
            // Float to float through double keeps f64 exact and rounds once for 16-bit targets.
            return store_element<T>(static_cast<double>(load_element(x)));
          }
        });
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
    // Element i draws from counter offset + i, so splitting the elements over threads draws the same.
    cpu::parallel_for(count, 40, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t counter = offset + static_cast<uint64_t>(i);
        if (distribution == RandomDistribution::kUniform) {
          const T stored = store_element<T>(a + (b - a) * philox_uniform(seed, counter));
          data[i] = static_cast<double>(load_element(stored)) >= b ? below_high : stored;
        } else {
          data[i] = store_element<T>(a + b * philox_normal(seed, counter));
        }
      }
    });
  });
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  cpu::dispatch_floating(x.dtype(), "unary", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* data = out.data<T>();
    with_unary_op(op, [&](auto constant) {
      cpu::for_each_row<2>(out.shape(), {&x.strides(), &out.strides()}, 16, [&](auto offsets, auto strides, int64_t length) {
        map_row(data + offsets[1], strides[1], in + offsets[0], strides[0], length,
                [](T value) { return store_element<T>(apply_unary<C>(decltype(constant)::value, load_element(value))); });
      });
    });
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, const Tensor& grad_x) {
  cpu::dispatch_floating(x.dtype(), "unary_backward", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    const T* gy = grad_out.data<T>();
    T* gx = grad_x.data<T>();
    with_unary_op(op, [&](auto constant) {
      cpu::for_each_row<3>(grad_x.shape(), {&x.strides(), &grad_out.strides(), &grad_x.strides()}, 24,
                           [&](auto offsets, auto strides, int64_t length) {
        map_row(gx + offsets[2], strides[2], in + offsets[0], strides[0], gy + offsets[1], strides[1], length,
                [](T value, T grad) {
                  return store_element<T>(load_element(grad) *
                                          unary_derivative<C>(decltype(constant)::value, load_element(value)));
                });
      });
    });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu::dispatch_floating(out.dtype(), "binary", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in_a = a.data<T>();
    const T* in_b = b.data<T>();
    T* data = out.data<T>();
    with_binary_op(op, [&](auto constant) {
      cpu::for_each_row<3>(out.shape(), {&a.strides(), &b.strides(), &out.strides()}, 1,
                           [&](auto offsets, auto strides, int64_t length) {
        map_row(data + offsets[2], strides[2], in_a + offsets[0], strides[0], in_b + offsets[1], strides[1], length,
                [](T x, T y) {
                  return store_element<T>(
                      apply_binary_op<C>(decltype(constant)::value, load_element(x), load_element(y)));
                });
      });
    });
  });
}

void CpuBackend::affine(const Tensor& x, double scale, double shift, const Tensor& out) {
  cpu::dispatch_floating(x.dtype(), "affine", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* data = out.data<T>();
    const C scale_c = static_cast<C>(scale), shift_c = static_cast<C>(shift);
    cpu::for_each_row<2>(out.shape(), {&x.strides(), &out.strides()}, 2, [&](auto offsets, auto strides, int64_t length) {
      map_row(data + offsets[1], strides[1], in + offsets[0], strides[0], length,
              [=](T value) { return store_element<T>(load_element(value) * scale_c + shift_c); });
    });
  });
}

void CpuBackend::scale_in_place(absl::Span<const Tensor> tensors, double factor) {
  for (const Tensor& tensor : tensors) affine(tensor, factor, 0.0, tensor);  // elementwise: in place is safe
}

namespace {

// clip_to_norm's factor from squares ([k] f64 on the CPU): max_norm / (norm + 1e-6) where it clips, else 1.
double clip_factor_of(const Tensor& squares, double max_norm, const char* op) {
  WEFT_CHECK(squares.dim() == 1 && squares.is_contiguous() && squares.dtype() == kFloat64 && squares.device().is_cpu(),
             op, ": squares must be [k] f64, contiguous, on the CPU; got ", squares.describe());
  double sum_of_squares = 0.0;
  for (int64_t i = 0; i < squares.size(0); ++i) sum_of_squares += squares.data<double>()[i];
  const double norm = std::sqrt(sum_of_squares);
  return max_norm > 0.0 && std::isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace

void CpuBackend::clip_to_norm(absl::Span<const Tensor> tensors, const Tensor& squares, double max_norm) {
  const double factor = clip_factor_of(squares, max_norm, "clip_to_norm");
  if (factor != 1.0) scale_in_place(tensors, factor);
}

void CpuBackend::clip_factor(const Tensor& squares, double max_norm, const Tensor& factor) {
  WEFT_CHECK(factor.numel() == 1 && factor.dtype() == kFloat64 && factor.device().is_cpu(),
             "clip_factor: factor must be one f64 element on the CPU; got ", factor.describe());
  fill(factor, clip_factor_of(squares, max_norm, "clip_factor"));
}

}  // namespace weft
