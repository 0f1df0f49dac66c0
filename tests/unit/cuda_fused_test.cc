// The fused ops on CUDA against the CPU: add_layer_norm and add_rms_norm (runtime/cuda/normalization.cu)
// and linear_gelu (Backend::matmul_bias_gelu, cuBLASLt's GELU_AUX_BIAS epilogue), forward and
// backward, the GELU backward in the next linear's dX GEMM (Backend::matmul_gelu_backward,
// DGELU), and linear_add (Backend::matmul_bias_add: the residual read as cuBLASLt's C); and
// linear_gelu's product, GELU's backward product, a linear's dX product with its bias gradient and
// SwiGLU's gate and up products and its backward on weft's own Hopper kernels where the GPU has them
// (runtime/cuda/hopper_products.h).
//
// Inputs are drawn on the CPU in f32 and rounded to the dtype under test; the CPU reference runs in
// f32 on the rounded values, so a bf16 case measures only the GPU's error. Tolerances, as
// max |out - ref| / max |ref|: 1e-5 for f32 (and f32 statistics), 1e-2 for bf16. Backend outputs are
// filled with NaN before the kernel runs, so an element left unwritten fails the case. Shapes: GPT-2
// rows (16 x 64 tokens, C = 768), C = 200, an odd C (37: packs of one element), a row that needs
// several warps (13000), one too long for the register path (40000), and for linear_gelu an N that is not a multiple of 8 (the unfused path).
//
// Built without CUDA, or run where no GPU is visible, every test is skipped with a message.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/weft.h"
#include "tests/support/cuda_expectations.h"
#if defined(WEFT_HAVE_SM90A)
#include <cuda_runtime.h>

#include "runtime/cuda/hopper_products.h"
#endif

namespace weft {
namespace {

#if !defined(WEFT_HAVE_CUDA)

TEST(CudaFused, SkippedWithoutCuda) { GTEST_SKIP() << "weft was built without CUDA (WEFT_HAVE_CUDA is not defined)"; }

#else

using testing::describe;
using testing::expect_close;
using testing::poisoned;
using testing::random_input;
using testing::RoundedInput;
using testing::tolerance_for;

const Device kGpu = Device::cuda(0);
const std::vector<DType> kDtypes = {kFloat32, kBFloat16};

Tensor leaf(const Tensor& tensor) { return tensor.detach().set_requires_grad(true); }

// --- add_layer_norm ----------------------------------------------------------------------------

const std::vector<std::vector<int64_t>> kNormShapes = {{16 * 64, 768}, {16 * 64, 200}, {33, 37}, {6, 13000}, {2, 40000}};

TEST(CudaFused, AddLayerNormKernelMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 100;
  for (DType dtype : kDtypes) {
    for (const auto& shape : kNormShapes) {
      for (bool with_bias : {true, false}) {
        const std::string what = describe(shape, dtype) + (with_bias ? " bias" : " no bias");
        SCOPED_TRACE(what);
        const int64_t rows = shape[0], c = shape[1];
        const RoundedInput x = random_input(shape, ++seed, dtype, 0.5, 2.0);
        const RoundedInput r = random_input(shape, ++seed, dtype);
        const RoundedInput w = random_input({c}, ++seed, dtype, 1.0, 0.2);
        const RoundedInput b = random_input({c}, ++seed, dtype);
        const Tensor b_ref = with_bias ? b.reference : Tensor();
        const Tensor b_gpu = with_bias ? b.gpu : Tensor();

        Backend& cpu = backend_for(Device::cpu());
        const Tensor sum_ref = Tensor::empty(shape), out_ref = Tensor::empty(shape);
        const Tensor mean_ref = Tensor::empty({rows}), rstd_ref = Tensor::empty({rows});
        cpu.add_layer_norm(x.reference, r.reference, w.reference, b_ref, 1e-5, sum_ref, out_ref, mean_ref, rstd_ref);

        const Tensor sum = poisoned(shape, dtype), out = poisoned(shape, dtype);
        const Tensor mean = poisoned({rows}, kFloat32), rstd = poisoned({rows}, kFloat32);
        backend_for(kGpu).add_layer_norm(x.gpu, r.gpu, w.gpu, b_gpu, 1e-5, sum, out, mean, rstd);
        expect_close(sum, sum_ref, tolerance_for(dtype), what + " sum");
        expect_close(out, out_ref, tolerance_for(dtype), what + " out");
        expect_close(mean, mean_ref, tolerance_for(dtype), what + " mean");
        expect_close(rstd, rstd_ref, tolerance_for(dtype), what + " rstd");

        // The fused kernel agrees with the unfused GPU kernels (add, then layer_norm) on the same input.
        const Tensor sum_unfused = poisoned(shape, dtype), out_unfused = poisoned(shape, dtype);
        const Tensor mean_unfused = poisoned({rows}, kFloat32), rstd_unfused = poisoned({rows}, kFloat32);
        backend_for(kGpu).binary(BinaryOp::kAdd, x.gpu, r.gpu, sum_unfused);
        backend_for(kGpu).layer_norm(sum_unfused, w.gpu, b_gpu, 1e-5, out_unfused, mean_unfused, rstd_unfused);
        expect_close(sum, sum_unfused, 0.0, what + " sum vs unfused");
        expect_close(out, out_unfused, tolerance_for(dtype), what + " out vs unfused");
      }
    }
  }
}

TEST(CudaFused, AddRmsNormKernelMatchesCpuAndTheUnfusedKernels) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 150;
  for (DType dtype : kDtypes) {
    for (const auto& shape : kNormShapes) {
      const std::string what = describe(shape, dtype);
      SCOPED_TRACE(what);
      const int64_t rows = shape[0], c = shape[1];
      const RoundedInput x = random_input(shape, ++seed, dtype, 0.5, 2.0);
      const RoundedInput r = random_input(shape, ++seed, dtype);
      const RoundedInput w = random_input({c}, ++seed, dtype, 1.0, 0.2);
      const Tensor sum_ref = Tensor::empty(shape), out_ref = Tensor::empty(shape), rstd_ref = Tensor::empty({rows});
      backend_for(Device::cpu()).add_rms_norm(x.reference, r.reference, w.reference, 1e-6, sum_ref, out_ref, rstd_ref);
      const Tensor sum = poisoned(shape, dtype), out = poisoned(shape, dtype), rstd = poisoned({rows}, kFloat32);
      backend_for(kGpu).add_rms_norm(x.gpu, r.gpu, w.gpu, 1e-6, sum, out, rstd);
      expect_close(sum, sum_ref, tolerance_for(dtype), what + " sum");
      expect_close(out, out_ref, tolerance_for(dtype), what + " out");
      expect_close(rstd, rstd_ref, tolerance_for(dtype), what + " rstd");
      const Tensor sum_unfused = poisoned(shape, dtype), out_unfused = poisoned(shape, dtype);
      const Tensor rstd_unfused = poisoned({rows}, kFloat32);
      backend_for(kGpu).binary(BinaryOp::kAdd, x.gpu, r.gpu, sum_unfused);
      backend_for(kGpu).rms_norm(sum_unfused, w.gpu, 1e-6, out_unfused, rstd_unfused);
      expect_close(sum, sum_unfused, 0.0, what + " sum vs unfused");
      expect_close(out, out_unfused, tolerance_for(dtype), what + " out vs unfused");
    }
  }
}

TEST(CudaFused, AddLayerNormOpBackwardMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 200;
  for (DType dtype : kDtypes) {
    for (const auto& shape : kNormShapes) {
      const std::string what = describe(shape, dtype);
      SCOPED_TRACE(what);
      const int64_t c = shape[1];
      const RoundedInput x = random_input(shape, ++seed, dtype, 0.5, 2.0);
      const RoundedInput r = random_input(shape, ++seed, dtype);
      const RoundedInput w = random_input({c}, ++seed, dtype, 1.0, 0.2);
      const RoundedInput b = random_input({c}, ++seed, dtype);
      const RoundedInput grad_sum = random_input(shape, ++seed, dtype);
      const RoundedInput grad_out = random_input(shape, ++seed, dtype);

      // Two backward passes: the second accumulates into the .grad the first created (the norms'
      // parameter gradients are then added in the kernel, NormBackwardExtras).
      for (const bool rms : {false, true}) {
        auto run = [&](const Tensor& xv, const Tensor& rv, const Tensor& wv, const Tensor& bv, const Tensor& gs,
                       const Tensor& go) {
          std::vector<Tensor> leaves = {leaf(xv), leaf(rv), leaf(wv), leaf(bv)};
          std::vector<Tensor> results;
          for (int pass = 0; pass < 2; ++pass) {
            auto [sum, out] = rms ? add_rms_norm(leaves[0], leaves[1], leaves[2])
                                  : add_layer_norm(leaves[0], leaves[1], leaves[2], leaves[3]);
            autograd::backward({sum, out}, {gs, go});
            if (pass == 0) results = {sum.detach(), out.detach()};
          }
          for (const Tensor& l : leaves) results.push_back(l.grad().defined() ? l.grad() : Tensor::zeros({1}));
          return results;
        };
        const std::vector<Tensor> want =
            run(x.reference, r.reference, w.reference, b.reference, grad_sum.reference, grad_out.reference);
        const std::vector<Tensor> got = run(x.gpu, r.gpu, w.gpu, b.gpu, grad_sum.gpu, grad_out.gpu);
        const char* names[] = {"sum", "out", "grad x", "grad residual", "grad weight", "grad bias"};
        for (size_t i = 0; i < want.size(); ++i) {
          expect_close(got[i], want[i], tolerance_for(dtype), what + (rms ? " rms " : " ") + names[i]);
        }
      }
    }
  }
}

// --- linear_gelu -------------------------------------------------------------------------------

struct LinearCase {
  int64_t rows, in, out;
};
// GPT-2's fc (768 -> 3072) on 16 x 64 tokens, an odd size, and N not a multiple of 8 (unfused path).
const std::vector<LinearCase> kLinearCases = {{16 * 64, 768, 3072}, {16 * 64, 200, 200}, {37, 200, 201}};

// One linear_gelu product on the GPU (Backend::matmul_bias_gelu, as the linear's forward calls it)
// against the CPU's, output and pre-activation; seed advances by three.
void expect_matmul_bias_gelu_matches_cpu(const LinearCase& c, DType dtype, uint64_t& seed) {
  const std::string what = describe({c.rows, c.in, c.out}, dtype);
  SCOPED_TRACE(what);
  const RoundedInput x = random_input({1, c.rows, c.in}, ++seed, dtype);
  const RoundedInput w = random_input({c.out, c.in}, ++seed, dtype, 0.0, 1.0 / std::sqrt(static_cast<double>(c.in)));
  const RoundedInput b = random_input({c.out}, ++seed, dtype);
  const Tensor out_ref = Tensor::empty({1, c.rows, c.out}), pre_ref = Tensor::empty({1, c.rows, c.out});
  backend_for(Device::cpu())
      .matmul_bias_gelu(x.reference, w.reference.transpose(0, 1).unsqueeze(0), b.reference, out_ref, pre_ref);
  const Tensor out = poisoned({1, c.rows, c.out}, dtype), pre = poisoned({1, c.rows, c.out}, dtype);
  backend_for(kGpu).matmul_bias_gelu(x.gpu, w.gpu.transpose(0, 1).unsqueeze(0), b.gpu, out, pre);
  expect_close(out, out_ref, tolerance_for(dtype), what + " out");
  expect_close(pre, pre_ref, tolerance_for(dtype), what + " pre_activation");
}

TEST(CudaFused, MatmulBiasGeluMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 300;
  for (DType dtype : kDtypes) {
    for (const LinearCase& c : kLinearCases) expect_matmul_bias_gelu_matches_cpu(c, dtype, seed);
  }
}

// The products of the own Hopper kernels' tests: GPT-2's fc and an odd size (the forward's 128-column
// tiling), and two products of N >= 4096 (the 192-column tiling in bands of 16 rows of tiles, which
// the backward products take at every width): N not a multiple of 192, K not a multiple of 64, and
// 18 rows of tiles (a last band of 2); and 136 inputs to 96 outputs, whose products have one column
// of tiles, where the dX products' bias sums take consecutive slices rather than one in four.
const std::vector<LinearCase> kHopperCases = {{16 * 64, 768, 3072}, {16 * 64, 200, 200}, {300, 136, 4104},
                                              {2200, 72, 4096},    {300, 136, 96}};

#if defined(WEFT_HAVE_SM90A)
bool compute_capability_9_0() {
  int major = 0, minor = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess && major == 9 &&
         minor == 0;
}

// Runs check on each of kHopperCases with only `product` of the own Hopper products switched on, and
// expects each case to have queued launches_per_case products on the own kernels; then switches on
// again the products that were on before.
void expect_each_case_on_the_own_kernel(unsigned product, int launches_per_case,
                                        const std::function<void(const LinearCase&)>& check) {
  const unsigned was = cuda::hopper_products();
  cuda::set_hopper_products(product);
  for (const LinearCase& c : kHopperCases) {
    const int64_t launches = cuda::hopper_gemm_launches();
    check(c);
    EXPECT_EQ(cuda::hopper_gemm_launches(), launches + launches_per_case)
        << c.rows << " x " << c.in << " -> " << c.out << ": the product did not run on the own kernel";
  }
  cuda::set_hopper_products(was);
}
#endif

// weft's own Hopper product (runtime/cuda/hopper_products.h) switched on in place of cuBLASLt's
// GELU_AUX_BIAS, on kHopperCases. Each must have run on the own kernel.
TEST(CudaFused, OwnHopperBiasGeluMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  uint64_t seed = 700;
  expect_each_case_on_the_own_kernel(cuda::kHopperBiasGelu, 1, [&](const LinearCase& c) {
    expect_matmul_bias_gelu_matches_cpu(c, kBFloat16, seed);
  });
#endif
}

// out = x W^T + b + residual with the residual as C (beta 1) and the bias in the epilogue, against
// the CPU's matmul_bias and add; then linear_add's backward, where the residual's gradient is dY.
TEST(CudaFused, MatmulBiasAddAndLinearAddMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 350;
  for (DType dtype : kDtypes) {
    for (const LinearCase& c : kLinearCases) {
      for (const bool with_bias : {true, false}) {
        const std::string what = describe({c.rows, c.in, c.out}, dtype) + (with_bias ? " bias" : " no bias");
        SCOPED_TRACE(what);
        const RoundedInput x = random_input({1, c.rows, c.in}, ++seed, dtype);
        const RoundedInput w =
            random_input({c.out, c.in}, ++seed, dtype, 0.0, 1.0 / std::sqrt(static_cast<double>(c.in)));
        const RoundedInput b = random_input({c.out}, ++seed, dtype);
        const RoundedInput r = random_input({1, c.rows, c.out}, ++seed, dtype);
        const Tensor want = Tensor::empty({1, c.rows, c.out});
        backend_for(Device::cpu())
            .matmul_bias_add(x.reference, w.reference.transpose(0, 1).unsqueeze(0),
                             with_bias ? b.reference : Tensor(), r.reference, want);
        const Tensor got = poisoned({1, c.rows, c.out}, dtype);
        backend_for(kGpu).matmul_bias_add(x.gpu, w.gpu.transpose(0, 1).unsqueeze(0), with_bias ? b.gpu : Tensor(),
                                          r.gpu, got);
        expect_close(got, want, tolerance_for(dtype), what + " out");
        expect_close(r.gpu.to(Device::cpu()).to(kFloat32), r.reference, 0.0, what + " the residual is only read");

        const RoundedInput grad = random_input({1, c.rows, c.out}, ++seed, dtype);
        auto run = [&](const Tensor& xv, const Tensor& wv, const Tensor& bv, const Tensor& rv, const Tensor& g) {
          std::vector<Tensor> leaves = {leaf(xv), leaf(wv), leaf(bv), leaf(rv)};
          linear_add(leaves[0], leaves[1], with_bias ? leaves[2] : Tensor(), leaves[3]).backward(g);
          std::vector<Tensor> results;
          for (const Tensor& l : leaves) results.push_back(l.grad().defined() ? l.grad() : Tensor::zeros({1}));
          return results;
        };
        const std::vector<Tensor> expected = run(x.reference, w.reference, b.reference, r.reference, grad.reference);
        const std::vector<Tensor> actual = run(x.gpu, w.gpu, b.gpu, r.gpu, grad.gpu);
        const char* names[] = {"grad x", "grad weight", "grad bias", "grad residual"};
        for (size_t i = 0; i < expected.size(); ++i) {
          expect_close(actual[i], expected[i], tolerance_for(dtype), what + " " + names[i]);
        }
      }
    }
  }
}

TEST(CudaFused, LinearGeluOpBackwardMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 400;
  for (DType dtype : kDtypes) {
    for (const LinearCase& c : kLinearCases) {
      const std::string what = describe({c.rows, c.in, c.out}, dtype);
      SCOPED_TRACE(what);
      const RoundedInput x = random_input({16, c.rows / 16 + (c.rows % 16 ? 1 : 0), c.in}, ++seed, dtype);
      const RoundedInput w =
          random_input({c.out, c.in}, ++seed, dtype, 0.0, 1.0 / std::sqrt(static_cast<double>(c.in)));
      const RoundedInput b = random_input({c.out}, ++seed, dtype);
      const RoundedInput grad = random_input({16, c.rows / 16 + (c.rows % 16 ? 1 : 0), c.out}, ++seed, dtype);
      auto run = [&](const Tensor& xv, const Tensor& wv, const Tensor& bv, const Tensor& g) {
        std::vector<Tensor> leaves = {leaf(xv), leaf(wv), leaf(bv)};
        const Tensor y = linear_gelu(leaves[0], leaves[1], leaves[2]);
        y.backward(g);
        std::vector<Tensor> results = {y.detach()};
        for (const Tensor& l : leaves) results.push_back(l.grad());
        return results;
      };
      const std::vector<Tensor> want = run(x.reference, w.reference, b.reference, grad.reference);
      const std::vector<Tensor> got = run(x.gpu, w.gpu, b.gpu, grad.gpu);
      const char* names[] = {"out", "grad x", "grad weight", "grad bias"};
      for (size_t i = 0; i < want.size(); ++i) {
        expect_close(got[i], want[i], tolerance_for(dtype), what + " " + names[i]);
      }
      // The fused op agrees with the unfused composition on the GPU.
      expect_close(got[0], gelu(linear(x.gpu, w.gpu, b.gpu)), tolerance_for(dtype), what + " vs unfused");
    }
  }
}

// One GELU backward product on the GPU (Backend::matmul_gelu_backward: dY [rows, in] @ W [in, out],
// the dX GEMM of a projection, times gelu'(pre)) against the CPU's; seed advances by three. The
// pre-activation is drawn from normal(0, pre_std).
void expect_matmul_gelu_backward_matches_cpu(const LinearCase& c, DType dtype, uint64_t& seed, double pre_std) {
  const std::string what = describe({c.rows, c.in, c.out}, dtype);
  SCOPED_TRACE(what);
  const RoundedInput g = random_input({1, c.rows, c.in}, ++seed, dtype);
  const RoundedInput w = random_input({c.in, c.out}, ++seed, dtype, 0.0, 1.0 / std::sqrt(static_cast<double>(c.in)));
  const RoundedInput pre = random_input({1, c.rows, c.out}, ++seed, dtype, 0.0, pre_std);
  const Tensor want = Tensor::empty({1, c.rows, c.out});
  backend_for(Device::cpu()).matmul_gelu_backward(g.reference, w.reference.unsqueeze(0), pre.reference, want);
  const Tensor got = poisoned({1, c.rows, c.out}, dtype);
  backend_for(kGpu).matmul_gelu_backward(g.gpu, w.gpu.unsqueeze(0), pre.gpu, got);
  expect_close(got, want, tolerance_for(dtype), what);
}

TEST(CudaFused, MatmulGeluBackwardMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 500;
  for (DType dtype : kDtypes) {
    for (const LinearCase& c : kLinearCases) expect_matmul_gelu_backward_matches_cpu(c, dtype, seed, 1.0);
  }
}

// GELU's backward product on weft's own Hopper kernel (W read N-major) in place of cuBLASLt's DGELU,
// on kHopperCases, with pre-activations out to GELU's tails (normal(0, 2)). Each must have run on the
// own kernel.
TEST(CudaFused, OwnHopperGeluBackwardMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  uint64_t seed = 800;
  expect_each_case_on_the_own_kernel(cuda::kHopperGeluBackward, 1, [&](const LinearCase& c) {
    expect_matmul_gelu_backward_matches_cpu(c, kBFloat16, seed, 2.0);
  });
#endif
}

// A linear's dX product with its bias gradient (Backend::matmul_and_column_sums) on weft's own Hopper
// kernel, plain and with gelu' (an MLP's projection), against the CPU's product and column sums, on
// kHopperCases (dY [rows, in] @ W [in, out]: the sums are dY's `in` columns). Each must have run on
// the own kernel.
TEST(CudaFused, OwnHopperInputGradientMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  uint64_t seed = 900;
  // Two products a case: plain, and with gelu'.
  expect_each_case_on_the_own_kernel(cuda::kHopperInputGradient, 2, [&](const LinearCase& c) {
    for (const bool gelu : {false, true}) {
      const std::string what = describe({c.rows, c.in, c.out}, kBFloat16) + (gelu ? " with gelu'" : " plain");
      SCOPED_TRACE(what);
      const RoundedInput g = random_input({1, c.rows, c.in}, ++seed, kBFloat16);
      const RoundedInput w =
          random_input({c.in, c.out}, ++seed, kBFloat16, 0.0, 1.0 / std::sqrt(static_cast<double>(c.in)));
      const RoundedInput pre = random_input({1, c.rows, c.out}, ++seed, kBFloat16, 0.0, 2.0);
      const Tensor want = Tensor::empty({1, c.rows, c.out}), want_sums = Tensor::empty({c.in});
      backend_for(Device::cpu())
          .matmul_and_column_sums(g.reference, w.reference.unsqueeze(0), gelu ? pre.reference : Tensor(), want,
                                  want_sums);
      const Tensor got = poisoned({1, c.rows, c.out}, kBFloat16), got_sums = poisoned({c.in}, kBFloat16);
      backend_for(kGpu).matmul_and_column_sums(g.gpu, w.gpu.unsqueeze(0), gelu ? pre.gpu : Tensor(), got, got_sums);
      expect_close(got, want, tolerance_for(kBFloat16), what + " out");
      expect_close(got_sums, want_sums, tolerance_for(kBFloat16), what + " column sums");
    }
  });
#endif
}

// With gelu_backward switched on too (every product: the default), a GELU backward that carries the
// bias sums still rides input_gradient's product, which takes them while it reads dY: its output and
// sums are bit for bit those of input_gradient alone, not gelu_backward's product and the column-sum
// pass (whose sums run in another order).
TEST(CudaFused, OwnHopperInputGradientTakesTheGeluBackwardWithSumsWhenEveryProductIsOn) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  const unsigned was = cuda::hopper_products();
  uint64_t seed = 970;
  for (const LinearCase& c : kHopperCases) {
    const std::string what = describe({c.rows, c.in, c.out}, kBFloat16);
    SCOPED_TRACE(what);
    const RoundedInput g = random_input({1, c.rows, c.in}, ++seed, kBFloat16);
    const RoundedInput w =
        random_input({c.in, c.out}, ++seed, kBFloat16, 0.0, 1.0 / std::sqrt(static_cast<double>(c.in)));
    const RoundedInput pre = random_input({1, c.rows, c.out}, ++seed, kBFloat16, 0.0, 2.0);
    std::vector<Tensor> outs, sums;
    for (const unsigned products : {unsigned{cuda::kHopperInputGradient}, cuda::kAllHopperProducts}) {
      cuda::set_hopper_products(products);
      outs.push_back(poisoned({1, c.rows, c.out}, kBFloat16));
      sums.push_back(poisoned({c.in}, kBFloat16));
      const int64_t launches = cuda::hopper_gemm_launches();
      backend_for(kGpu).matmul_and_column_sums(g.gpu, w.gpu.unsqueeze(0), pre.gpu, outs.back(), sums.back());
      EXPECT_EQ(cuda::hopper_gemm_launches(), launches + 1) << "the product did not run on the own kernel";
    }
    EXPECT_TRUE(testing::bitwise_equal(outs[1], outs[0])) << what << " out";
    EXPECT_TRUE(testing::bitwise_equal(sums[1], sums[0])) << what << " column sums";
  }
  cuda::set_hopper_products(was);
#endif
}

// A dY wider than kHopperInputGradientMaxColumns (where the own product measured slower) is left to
// cuBLASLt's product and the column-sum pass even with input_gradient on, and is still right.
TEST(CudaFused, OwnHopperInputGradientLeavesWideGradientsToCublasLt) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  const unsigned was = cuda::hopper_products();
  cuda::set_hopper_products(cuda::kHopperInputGradient);
  const int64_t rows = 256, wide = cuda::kHopperInputGradientMaxColumns + 8, out = 136;
  uint64_t seed = 950;
  for (const int64_t in : {cuda::kHopperInputGradientMaxColumns, wide}) {
    SCOPED_TRACE(describe({rows, in, out}, kBFloat16));
    const RoundedInput g = random_input({1, rows, in}, ++seed, kBFloat16);
    const RoundedInput w = random_input({in, out}, ++seed, kBFloat16, 0.0, 1.0 / std::sqrt(static_cast<double>(in)));
    const Tensor want = Tensor::empty({1, rows, out}), want_sums = Tensor::empty({in});
    backend_for(Device::cpu()).matmul_and_column_sums(g.reference, w.reference.unsqueeze(0), Tensor(), want, want_sums);
    const Tensor got = poisoned({1, rows, out}, kBFloat16), got_sums = poisoned({in}, kBFloat16);
    const int64_t launches = cuda::hopper_gemm_launches();
    backend_for(kGpu).matmul_and_column_sums(g.gpu, w.gpu.unsqueeze(0), Tensor(), got, got_sums);
    EXPECT_EQ(cuda::hopper_gemm_launches(), launches + (in == wide ? 0 : 1))
        << "K = " << in << ": the own product runs up to K = " << cuda::kHopperInputGradientMaxColumns;
    expect_close(got, want, tolerance_for(kBFloat16), "out");
    expect_close(got_sums, want_sums, tolerance_for(kBFloat16), "column sums");
  }
  cuda::set_hopper_products(was);
#endif
}

// SwiGLU's gate and up products with the activation (Backend::swiglu_products) on weft's own Hopper
// kernel, against the CPU's, on kHopperCases read as x [rows, in] and both weights [out, in]; the
// gate weight drawn wider so that gate values reach silu's curved part. out must also be the CUDA
// swiglu kernel's bits of the kernel's own gate and up: a layer that rebuilds its output from them
// (train.recompute: selective) gets what the forward stored. Each case must have run on the own
// kernel.
TEST(CudaFused, OwnHopperSwigluProductsMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  uint64_t seed = 1000;
  expect_each_case_on_the_own_kernel(cuda::kHopperSwiglu, 1, [&](const LinearCase& c) {
    const std::string what = describe({c.rows, c.in, c.out}, kBFloat16);
    SCOPED_TRACE(what);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.in));
    const RoundedInput x = random_input({c.rows, c.in}, ++seed, kBFloat16);
    const RoundedInput gate_weight = random_input({c.out, c.in}, ++seed, kBFloat16, 0.0, 3.0 * scale);
    const RoundedInput up_weight = random_input({c.out, c.in}, ++seed, kBFloat16, 0.0, scale);
    const Tensor want_gate = Tensor::empty({c.rows, c.out}), want_up = Tensor::empty({c.rows, c.out}),
                 want_out = Tensor::empty({c.rows, c.out});
    backend_for(Device::cpu())
        .swiglu_products(x.reference, gate_weight.reference, up_weight.reference, want_gate, want_up, want_out);
    const Tensor got_gate = poisoned({c.rows, c.out}, kBFloat16), got_up = poisoned({c.rows, c.out}, kBFloat16),
                 got_out = poisoned({c.rows, c.out}, kBFloat16);
    backend_for(kGpu).swiglu_products(x.gpu, gate_weight.gpu, up_weight.gpu, got_gate, got_up, got_out);
    expect_close(got_gate, want_gate, tolerance_for(kBFloat16), what + " gate");
    expect_close(got_up, want_up, tolerance_for(kBFloat16), what + " up");
    expect_close(got_out, want_out, tolerance_for(kBFloat16), what + " out");
    const Tensor rebuilt = poisoned({c.rows, c.out}, kBFloat16);
    backend_for(kGpu).swiglu(got_gate, got_up, rebuilt);
    EXPECT_TRUE(testing::bitwise_equal(got_out, rebuilt)) << what << ": out is not swiglu's bits of gate and up";
  });
#endif
}

// SwiGLU's backward in a down-projection's dX product (Backend::matmul_swiglu_backward) on weft's own
// Hopper kernel, against the CPU's product and swiglu_backward, on kHopperCases read as dY [rows,
// in], the down weight [in, out] and gate, up [rows, out] (gate drawn wide, out to silu's tails).
// The gradients go into the halves of one [2, rows, out] buffer, as swiglu_linear's hand-off gives
// them. Each case must have run on the own kernel.
TEST(CudaFused, OwnHopperSwigluBackwardMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  uint64_t seed = 1100;
  expect_each_case_on_the_own_kernel(cuda::kHopperSwigluBackward, 1, [&](const LinearCase& c) {
    const std::string what = describe({c.rows, c.in, c.out}, kBFloat16);
    SCOPED_TRACE(what);
    const RoundedInput g = random_input({1, c.rows, c.in}, ++seed, kBFloat16);
    const RoundedInput w =
        random_input({c.in, c.out}, ++seed, kBFloat16, 0.0, 1.0 / std::sqrt(static_cast<double>(c.in)));
    const RoundedInput gate = random_input({c.rows, c.out}, ++seed, kBFloat16, 0.0, 3.0);
    const RoundedInput up = random_input({c.rows, c.out}, ++seed, kBFloat16);
    const Tensor want = Tensor::empty({2, c.rows, c.out});
    backend_for(Device::cpu())
        .matmul_swiglu_backward(g.reference, w.reference.unsqueeze(0), gate.reference, up.reference,
                                want.select(0, 0), want.select(0, 1));
    const Tensor got = poisoned({2, c.rows, c.out}, kBFloat16);
    backend_for(kGpu).matmul_swiglu_backward(g.gpu, w.gpu.unsqueeze(0), gate.gpu, up.gpu, got.select(0, 0),
                                             got.select(0, 1));
    expect_close(got.select(0, 0), want.select(0, 0), tolerance_for(kBFloat16), what + " grad gate");
    expect_close(got.select(0, 1), want.select(0, 1), tolerance_for(kBFloat16), what + " grad up");
  });
#endif
}

// Every own Hopper product gives the same bits on every run of the same inputs (hopper_products.h
// means them to; a race between a tile's epilogue and the next tile's loads or stores would show as
// a few elements that move from run to run). Products of 512 to 768 tiles, four to six a CTA, so
// that both consumer warpgroups take many turns; five runs each, into poisoned outputs at other
// addresses, against the first run's bits. Each run must have been on the own kernel.
TEST(CudaFused, OwnHopperProductsGiveTheSameBitsEveryRun) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
#if !defined(WEFT_HAVE_SM90A)
  GTEST_SKIP() << "weft was built without sm_90a (CMAKE_CUDA_ARCHITECTURES has no 90)";
#else
  if (!compute_capability_9_0()) GTEST_SKIP() << "the own Hopper product needs compute capability 9.0";
  constexpr int kRuns = 5;
  const int64_t rows = 4096, in = 768, out = 3072;
  const double scale = 1.0 / std::sqrt(static_cast<double>(in));
  uint64_t seed = 1200;
  const RoundedInput x = random_input({1, rows, in}, ++seed, kBFloat16);      // also dY [rows, in]
  const RoundedInput w = random_input({out, in}, ++seed, kBFloat16, 0.0, scale);  // [out, in]
  const RoundedInput w2 = random_input({out, in}, ++seed, kBFloat16, 0.0, 3.0 * scale);
  const RoundedInput down = random_input({in, out}, ++seed, kBFloat16, 0.0, scale);  // a dX product's W [in, out]
  const RoundedInput bias = random_input({out}, ++seed, kBFloat16);
  const RoundedInput pre = random_input({1, rows, out}, ++seed, kBFloat16, 0.0, 2.0);
  const RoundedInput up = random_input({1, rows, out}, ++seed, kBFloat16);
  Backend& gpu = backend_for(kGpu);
  // Each product: which own product it is, and a run that returns its outputs.
  struct Product {
    const char* name;
    unsigned product;
    std::function<std::vector<Tensor>()> run;
  };
  const auto fresh = [&](const std::vector<int64_t>& shape) { return poisoned(shape, kBFloat16); };
  const std::vector<Product> products = {
      {"bias_gelu", cuda::kHopperBiasGelu,
       [&] {
         const Tensor y = fresh({1, rows, out}), p = fresh({1, rows, out});
         gpu.matmul_bias_gelu(x.gpu, w.gpu.transpose(0, 1).unsqueeze(0), bias.gpu, y, p);
         return std::vector<Tensor>{y, p};
       }},
      {"gelu_backward", cuda::kHopperGeluBackward,
       [&] {
         const Tensor y = fresh({1, rows, out});
         gpu.matmul_gelu_backward(x.gpu, down.gpu.unsqueeze(0), pre.gpu, y);
         return std::vector<Tensor>{y};
       }},
      {"input_gradient", cuda::kHopperInputGradient,
       [&] {
         const Tensor y = fresh({1, rows, out}), sums = fresh({in});
         gpu.matmul_and_column_sums(x.gpu, down.gpu.unsqueeze(0), Tensor(), y, sums);
         return std::vector<Tensor>{y, sums};
       }},
      {"input_gradient with gelu'", cuda::kHopperInputGradient,
       [&] {
         const Tensor y = fresh({1, rows, out}), sums = fresh({in});
         gpu.matmul_and_column_sums(x.gpu, down.gpu.unsqueeze(0), pre.gpu, y, sums);
         return std::vector<Tensor>{y, sums};
       }},
      {"swiglu", cuda::kHopperSwiglu,
       [&] {
         const Tensor x2 = x.gpu.squeeze(0);
         const Tensor gate = fresh({rows, out}), up_out = fresh({rows, out}), y = fresh({rows, out});
         gpu.swiglu_products(x2, w2.gpu, w.gpu, gate, up_out, y);
         return std::vector<Tensor>{gate, up_out, y};
       }},
      {"swiglu_backward", cuda::kHopperSwigluBackward,
       [&] {
         const Tensor both = fresh({2, rows, out});
         gpu.matmul_swiglu_backward(x.gpu, down.gpu.unsqueeze(0), pre.gpu.squeeze(0), up.gpu.squeeze(0),
                                    both.select(0, 0), both.select(0, 1));
         return std::vector<Tensor>{both};
       }},
  };
  const unsigned was = cuda::hopper_products();
  for (const Product& product : products) {
    SCOPED_TRACE(product.name);
    cuda::set_hopper_products(product.product);
    const int64_t launches = cuda::hopper_gemm_launches();
    const std::vector<Tensor> first = product.run();
    for (int run = 1; run < kRuns; ++run) {
      const std::vector<Tensor> again = product.run();
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_TRUE(testing::bitwise_equal(again[i], first[i]))
            << product.name << ", output " << i << ": run " << run << " wrote other bits than the first";
      }
    }
    EXPECT_EQ(cuda::hopper_gemm_launches(), launches + kRuns) << product.name << " did not run on the own kernel";
  }
  cuda::set_hopper_products(was);
#endif
}

// An MLP's two linears: the projection's backward hands the GELU linear dPre from one GEMM with gelu'
// in its epilogue. With a second use of the hidden activation it must not (the sum of both uses'
// gradients goes through gelu' instead).
TEST(CudaFused, GeluMlpBackwardMatchesCpuWithOneAndTwoUsesOfTheHidden) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 600;
  for (DType dtype : kDtypes) {
    for (const bool second_use : {false, true}) {
      const std::string what = std::string(dtype_name(dtype)) + (second_use ? " two uses" : " one use");
      SCOPED_TRACE(what);
      const RoundedInput x = random_input({4, 64, 256}, ++seed, dtype);
      const RoundedInput w1 = random_input({1024, 256}, ++seed, dtype, 0.0, 1.0 / 16.0);
      const RoundedInput b1 = random_input({1024}, ++seed, dtype);
      const RoundedInput w2 = random_input({256, 1024}, ++seed, dtype, 0.0, 1.0 / 32.0);
      const RoundedInput b2 = random_input({256}, ++seed, dtype);
      const RoundedInput grad = random_input({4, 64, 256}, ++seed, dtype);
      auto run = [&](const std::vector<Tensor>& values, const Tensor& g) {
        std::vector<Tensor> leaves;
        for (const Tensor& value : values) leaves.push_back(leaf(value));
        const Tensor hidden = linear_gelu(leaves[0], leaves[1], leaves[2]);  // [4, 64, 1024]
        Tensor y = linear(hidden, leaves[3], leaves[4]);                       // [4, 64, 256]
        if (second_use) y = y + hidden.narrow(2, 0, 256);
        y.backward(g);
        std::vector<Tensor> results;
        for (const Tensor& l : leaves) results.push_back(l.grad());
        return results;
      };
      const std::vector<Tensor> want =
          run({x.reference, w1.reference, b1.reference, w2.reference, b2.reference}, grad.reference);
      const std::vector<Tensor> got = run({x.gpu, w1.gpu, b1.gpu, w2.gpu, b2.gpu}, grad.gpu);
      const char* names[] = {"grad x", "grad w1", "grad b1", "grad w2", "grad b2"};
      for (size_t i = 0; i < want.size(); ++i) {
        expect_close(got[i], want[i], tolerance_for(dtype), what + " " + names[i]);
      }
    }
  }
}

#endif

}  // namespace
}  // namespace weft
