// Llama's fused ops on CUDA against the CPU: rotary_embedding (runtime/cuda/rotary_embedding.cu)
// and swiglu (runtime/cuda/swiglu.cu), kernels and ops, forward and backward; swiglu_linear
// (runtime/ops/swiglu_linear.h) with its two weight gradients in one batched product.
//
// The CPU reference runs on the same values in the same dtype. The rotation uses explicitly
// rounded products and sums on both sides, so it must agree bit for bit in every dtype; SwiGLU's
// exp differs between the CUDA and C libraries by an ulp, so it is held to 1e-5 (f32) and 1e-2
// (bf16, f16) of the largest value. Outputs are poisoned with NaN first, so an element left
// unwritten fails. Cases: the heads of a [B, T, H, D] projection (the layer's q and k) and
// contiguous [B, H, T, D] inputs; head dims 128, 64 and 16 (16-byte packs), 6 (D/2 = 3, one element
// at a time); a view at an odd offset (no packs); for SwiGLU, an element count that is not a
// multiple of the pack and an odd offset.
//
// Built without CUDA, or run where no GPU is visible, every test is skipped with a message.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/rope.h"
#include "runtime/weft.h"
#include "tests/support/cuda_expectations.h"

namespace weft {
namespace {

#if !defined(WEFT_HAVE_CUDA)

TEST(CudaLlamaFused, SkippedWithoutCuda) {
  GTEST_SKIP() << "weft was built without CUDA (WEFT_HAVE_CUDA is not defined)";
}

#else

using testing::describe;
using testing::expect_close;
using testing::poisoned;
using testing::random_input;
using testing::tolerance_for;

const Device kGpu = Device::cuda(0);
const std::vector<DType> kDtypes = {kFloat32, kBFloat16, kFloat16};

Tensor on_cpu(const Tensor& tensor) { return tensor.to(Device::cpu()); }
Tensor leaf(const Tensor& tensor) { return tensor.detach().set_requires_grad(true); }

struct RotaryCase {
  int64_t batch, heads, time, head_dim;
  bool projection_layout;  // x is the heads of a [B, T, H, D] tensor (permuted view)
  int64_t offset;          // elements before x's first one in its storage (odd: no 16-byte packs)
};

const std::vector<RotaryCase> kRotaryCases = {
    {2, 16, 64, 128, true, 0}, {2, 8, 33, 64, true, 0}, {3, 4, 17, 16, false, 0},
    {2, 3, 9, 6, true, 0},     {2, 4, 16, 64, true, 1}, {1, 2, 5, 128, false, 3},
};

// The case's x on the GPU: a [B, H, T, D] view of the given layout and offset, holding `values`.
Tensor rotary_input(const RotaryCase& c, const Tensor& values /* [B, H, T, D] on the GPU */) {
  const int64_t count = values.numel();
  const Tensor storage = Tensor::empty({count + c.offset}, values.dtype(), kGpu);
  Tensor x = c.projection_layout
                 ? storage.narrow(0, c.offset, count).view({c.batch, c.time, c.heads, c.head_dim}).permute({0, 2, 1, 3})
                 : storage.narrow(0, c.offset, count).view({c.batch, c.heads, c.time, c.head_dim});
  backend_for(kGpu).copy(values, x);
  return x;
}

// An output of the case's layout on the GPU, poisoned.
Tensor rotary_output(const RotaryCase& c, DType dtype) {
  if (!c.projection_layout) return poisoned({c.batch, c.heads, c.time, c.head_dim}, dtype);
  return poisoned({c.batch, c.time, c.heads, c.head_dim}, dtype).permute({0, 2, 1, 3});
}

std::string describe_case(const RotaryCase& c, DType dtype) {
  return describe(std::vector<int64_t>{c.batch, c.heads, c.time, c.head_dim}, dtype) +
         (c.projection_layout ? " heads of [B,T,H,D]" : "") + (c.offset ? " offset " + std::to_string(c.offset) : "");
}

TEST(CudaLlamaFused, RotaryKernelsMatchCpuBitForBit) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 300;
  for (DType dtype : kDtypes) {
    for (const RotaryCase& c : kRotaryCases) {
      const std::string what = describe_case(c, dtype);
      SCOPED_TRACE(what);
      const std::vector<int64_t> shape = {c.batch, c.heads, c.time, c.head_dim};
      const auto [cos64, sin64] = rotary_tables(c.time, c.head_dim, 10000.0);
      const Tensor cos = cos64.to(dtype).to(kGpu), sin = sin64.to(dtype).to(kGpu);
      const Tensor x = rotary_input(c, random_input(shape, ++seed, dtype).gpu);
      const Tensor grad = rotary_input(c, random_input(shape, ++seed, dtype).gpu);

      const Tensor out = rotary_output(c, dtype), grad_x = rotary_output(c, dtype);
      backend_for(kGpu).rotary_embedding(x, cos, sin, out);
      backend_for(kGpu).rotary_embedding_backward(grad, cos, sin, grad_x);

      Backend& cpu = backend_for(Device::cpu());
      const Tensor out_ref = Tensor::empty(shape, dtype), grad_x_ref = Tensor::empty(shape, dtype);
      cpu.rotary_embedding(on_cpu(x), on_cpu(cos), on_cpu(sin), out_ref);
      cpu.rotary_embedding_backward(on_cpu(grad), on_cpu(cos), on_cpu(sin), grad_x_ref);
      expect_close(out, out_ref, 0.0, what + " out");
      expect_close(grad_x, grad_x_ref, 0.0, what + " grad x");
    }
  }
}

// The op as the attention layer calls it (q and k: heads of one projection), through autograd.
TEST(CudaLlamaFused, RotaryOpMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 400;
  for (DType dtype : kDtypes) {
    const std::vector<int64_t> shape = {2, 64, 12, 128};  // [B, T, H, D]
    const std::string what = describe(shape, dtype);
    SCOPED_TRACE(what);
    const auto [cos64, sin64] = rotary_tables(64, 128, 500000.0);
    const Tensor projection = random_input(shape, ++seed, dtype).gpu;
    const Tensor grad = random_input({2, 12, 64, 128}, ++seed, dtype).gpu;
    auto run = [&](const Device& device) {
      const Tensor p = leaf(projection.to(device));
      const Tensor cos = cos64.to(dtype).to(device), sin = sin64.to(dtype).to(device);
      const Tensor y = rotary_embedding(p.permute({0, 2, 1, 3}), cos, sin);
      autograd::backward({y}, {grad.to(device)});
      return std::vector<Tensor>{y.detach(), p.grad()};
    };
    const std::vector<Tensor> got = run(kGpu), want = run(Device::cpu());
    EXPECT_EQ(got[0].strides(), projection.permute({0, 2, 1, 3}).strides());
    expect_close(got[0], want[0], 0.0, what + " out");
    expect_close(got[1], want[1], 0.0, what + " grad");
  }
}

const std::vector<std::vector<int64_t>> kSwigluShapes = {{8 * 256, 5632}, {33, 37}, {3, 1000}, {1, 7}};

TEST(CudaLlamaFused, SwigluKernelsMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 500;
  for (DType dtype : kDtypes) {
    for (const auto& shape : kSwigluShapes) {
      for (int64_t offset : {0, 1}) {
        const std::string what = describe(shape, dtype) + (offset ? " offset 1" : "");
        SCOPED_TRACE(what);
        const int64_t count = shape[0] * shape[1];
        // Operands at an odd offset in their storage take the one-element path.
        const auto input = [&](double mean, double std) {
          const Tensor storage = Tensor::empty({count + offset}, dtype, kGpu);
          const Tensor view = storage.narrow(0, offset, count).view(shape);
          backend_for(kGpu).copy(random_input(shape, ++seed, dtype, mean, std).gpu, view);
          return view;
        };
        const Tensor gate = input(0.0, 4.0), up = input(0.0, 1.0), grad = input(0.0, 1.0);
        const auto output = [&] { return poisoned({count + offset}, dtype).narrow(0, offset, count).view(shape); };
        const Tensor out = output(), grad_gate = output(), grad_up = output();
        backend_for(kGpu).swiglu(gate, up, out);
        backend_for(kGpu).swiglu_backward(gate, up, grad, grad_gate, grad_up);

        Backend& cpu = backend_for(Device::cpu());
        const Tensor out_ref = Tensor::empty(shape, dtype), grad_gate_ref = Tensor::empty(shape, dtype),
                     grad_up_ref = Tensor::empty(shape, dtype);
        cpu.swiglu(on_cpu(gate), on_cpu(up), out_ref);
        cpu.swiglu_backward(on_cpu(gate), on_cpu(up), on_cpu(grad), grad_gate_ref, grad_up_ref);
        expect_close(out, out_ref, tolerance_for(dtype), what + " out");
        expect_close(grad_gate, grad_gate_ref, tolerance_for(dtype), what + " grad gate");
        expect_close(grad_up, grad_up_ref, tolerance_for(dtype), what + " grad up");
      }
    }
  }
}

// The op through autograd against the unfused ops on the CPU in f32 (silu, then mul).
TEST(CudaLlamaFused, SwigluOpMatchesUnfusedCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 600;
  for (DType dtype : {kFloat32, kBFloat16}) {
    const std::vector<int64_t> shape = {4, 64, 352};
    const std::string what = describe(shape, dtype);
    SCOPED_TRACE(what);
    const auto gate = random_input(shape, ++seed, dtype, 0.0, 3.0), up = random_input(shape, ++seed, dtype);
    const auto grad = random_input(shape, ++seed, dtype);
    const Tensor gate_gpu = leaf(gate.gpu), up_gpu = leaf(up.gpu);
    const Tensor y = swiglu(gate_gpu, up_gpu);
    autograd::backward({y}, {grad.gpu});
    const Tensor gate_ref = leaf(gate.reference), up_ref = leaf(up.reference);
    const Tensor y_ref = mul(silu(gate_ref), up_ref);
    autograd::backward({y_ref}, {grad.reference});
    expect_close(y, y_ref, tolerance_for(dtype), what + " out");
    expect_close(gate_gpu.grad(), gate_ref.grad(), tolerance_for(dtype), what + " grad gate");
    expect_close(up_gpu.grad(), up_ref.grad(), tolerance_for(dtype), what + " grad up");
  }
}

// swiglu_linear on CUDA against the two linears and swiglu on the CPU in f32, with the weights'
// .grad next to each other in one buffer (up's first, as a gradient buffer lays them) so that the
// one batched product writes both: first over stale values that count as zero, then accumulating.
TEST(CudaLlamaFused, SwigluLinearMatchesUnfusedCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 700;
  const int64_t rows = 4 * 64, width = 96, hidden = 160;
  for (DType dtype : {kFloat32, kBFloat16}) {
    const std::string what = describe({rows, width, hidden}, dtype);
    SCOPED_TRACE(what);
    const auto x = random_input({4, 64, width}, ++seed, dtype);
    const auto gate = random_input({hidden, width}, ++seed, dtype, 0.0, 0.2);
    const auto up = random_input({hidden, width}, ++seed, dtype, 0.0, 0.2);
    const auto grad = random_input({4, 64, hidden}, ++seed, dtype);
    const Tensor x_gpu = leaf(x.gpu);
    Tensor gate_gpu = leaf(gate.gpu), up_gpu = leaf(up.gpu);
    const Tensor slots = Tensor::full({2 * hidden * width}, 1e4, dtype, kGpu);  // stale, never read
    up_gpu.set_grad(slots.narrow(0, 0, hidden * width).view({hidden, width}));
    gate_gpu.set_grad(slots.narrow(0, hidden * width, hidden * width).view({hidden, width}));
    up_gpu.mark_grad_zero();
    gate_gpu.mark_grad_zero();
    const Tensor x_ref = leaf(x.reference), gate_ref = leaf(gate.reference), up_ref = leaf(up.reference);
    Tensor y, y_ref;
    for (int pass = 0; pass < 2; ++pass) {
      y = swiglu_linear(x_gpu, gate_gpu, up_gpu);
      autograd::backward({y}, {grad.gpu});
      y_ref = mul(silu(linear(x_ref, gate_ref)), linear(x_ref, up_ref));
      autograd::backward({y_ref}, {grad.reference});
    }
    expect_close(y, y_ref, tolerance_for(dtype), what + " out");
    expect_close(x_gpu.grad(), x_ref.grad(), tolerance_for(dtype), what + " grad x");
    expect_close(gate_gpu.grad(), gate_ref.grad(), tolerance_for(dtype), what + " grad gate");
    expect_close(up_gpu.grad(), up_ref.grad(), tolerance_for(dtype), what + " grad up");
    EXPECT_EQ(gate_gpu.grad().raw_data(), slots.narrow(0, hidden * width, hidden * width).raw_data());
  }
}

#endif

}  // namespace
}  // namespace weft
