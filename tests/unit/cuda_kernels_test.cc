// CUDA row kernels (softmax, layer/RMS norm, embedding, cross-entropy, dropout) against the CPU
// kernels on fresh random inputs.
//
// Each case builds inputs on the CPU in f32, rounds them to the dtype under test, and runs the CPU
// backend on the rounded values in f32 as the reference, so a bf16 case measures only the GPU
// kernel's error. Tolerances, as max |out - ref| / max |ref|: 1e-5 for f32 outputs and for f32
// statistics (mean, rstd, lse, losses), 1e-2 for bf16 outputs; never NaN. Every output is filled
// with NaN before the kernel runs, so an element a kernel forgets to write fails the case. Dropout
// must match the CPU bit for bit. Shapes follow GPT-2 (C = 768, V = 50304) plus odd sizes (C = 37,
// V = 1001), a row too long for the register paths, and views at odd offsets (no 16-byte packs).
//
// Built without CUDA, or run where no GPU is visible, every test is skipped with a message.
#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/weft.h"
#include "tests/support/cuda_expectations.h"

namespace weft {
namespace {

#ifndef WEFT_HAVE_CUDA

TEST(CudaKernels, SkippedWithoutCuda) { GTEST_SKIP() << "weft was built without CUDA (WEFT_HAVE_CUDA is not defined)"; }

#else

using testing::describe;
using testing::expect_close;
using testing::poisoned;
using testing::random_input;
using testing::RoundedInput;
using testing::tolerance_for;

const Device kGpu = Device::cuda(0);

// Ids or targets in [0, bound), as i64 or i32; every `ignore_every`-th one (if > 0) is `ignore`.
Tensor random_ids(int64_t count, int64_t bound, uint64_t seed, DType dtype, int ignore_every = 0,
                  int64_t ignore = -100) {
  const std::vector<double> draws = Tensor::uniform({count}, seed, 0, 0.0, 1.0, kFloat64).to_vector();
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    ids[i] = std::min<int64_t>(bound - 1, static_cast<int64_t>(draws[i] * static_cast<double>(bound)));
    if (ignore_every > 0 && i % ignore_every == 3) ids[i] = ignore;
  }
  return Tensor::from_vector(absl::MakeConstSpan(ids), {count}, kInt64).to(dtype);
}

void expect_identical(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const std::vector<double> got = actual.to(Device::cpu()).to_vector();
  const std::vector<double> want = expected.to(Device::cpu()).to_vector();
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t different = 0;
  for (size_t i = 0; i < got.size(); ++i) different += got[i] == want[i] ? 0 : 1;
  EXPECT_EQ(different, 0) << what << ": " << different << " of " << got.size() << " elements differ";
}

Backend& cpu_backend() { return backend_for(Device::cpu()); }
Backend& gpu_backend() { return backend_for(kGpu); }

const std::vector<DType> kDtypes = {kFloat32, kBFloat16};

// --- Softmax -----------------------------------------------------------------------------------

// Rows of C <= 1024 take the warp kernel; packed rows up to 8192 the row-block kernel (4 packs per
// thread: 64 threads at C = 2048 bf16, 256 at 8192 bf16, 512 at 8192 f32; C = 3000 leaves pack slots
// past the row's end); longer or unpacked rows the block kernel.
const std::vector<std::vector<int64_t>> kSoftmaxShapes = {{64, 768}, {4096, 768}, {33, 37}, {7, 1024}, {16, 2048},
                                                          {4, 8192}, {3, 3000},   {5, 50304}, {3, 1001}};

TEST(CudaKernels, SoftmaxForwardAndBackwardMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 100;
  for (DType dtype : kDtypes) {
    for (const auto& shape : kSoftmaxShapes) {
      for (bool log : {false, true}) {
        const std::string what = describe(shape, dtype) + (log ? " log_softmax" : " softmax");
        SCOPED_TRACE(what);
        const RoundedInput x = random_input(shape, ++seed, dtype, 0.0, 3.0);
        const Tensor expected = Tensor::empty(shape);
        cpu_backend().softmax(x.reference, expected, log);
        const Tensor out = poisoned(shape, dtype);
        gpu_backend().softmax(x.gpu, out, log);
        expect_close(out, expected, tolerance_for(dtype), what + " forward");

        // Backward from the same (rounded) forward output on both sides.
        const Tensor y = expected.to(dtype);
        const RoundedInput gy = random_input(shape, ++seed, dtype);
        const Tensor expected_grad = Tensor::empty(shape);
        cpu_backend().softmax_backward(y.to(kFloat32), gy.reference, expected_grad, log);
        const Tensor grad = poisoned(shape, dtype);
        gpu_backend().softmax_backward(y.to(kGpu), gy.gpu, grad, log);
        expect_close(grad, expected_grad, tolerance_for(dtype), what + " backward");
      }
    }
  }
}

TEST(CudaKernels, SoftmaxOfAViewAtAnOddOffsetUsesTheScalarPath) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const int64_t rows = 64, columns = 768;
  const RoundedInput flat = random_input({rows * columns + 1}, 7, kBFloat16);
  const Tensor x = flat.gpu.narrow(0, 1, rows * columns).view({rows, columns});  // not 16-byte aligned
  const Tensor expected = Tensor::empty({rows, columns});
  cpu_backend().softmax(flat.reference.narrow(0, 1, rows * columns).contiguous().view({rows, columns}), expected,
                        false);
  const Tensor out = poisoned({rows * columns + 1}, kBFloat16).narrow(0, 1, rows * columns).view({rows, columns});
  gpu_backend().softmax(x, out, false);
  expect_close(out, expected, tolerance_for(kBFloat16), "softmax of an unaligned view");
}

// --- Layer norm and RMS norm -------------------------------------------------------------------

// The paths of runtime/cuda/normalization.cu. Forward: a warp per row holding 1..4 packs per lane
// (C = 200, 768, 1000 at bf16; 200 at f32), groups of 64..512 threads (768, 1000, 2048, 8192 at f32;
// 2048, 8192 and 16384 at bf16), single elements (37, 1001, 3001), the streaming fallback (16384 and
// 20000 at f32; 20000 and 40000 at bf16). Backward, pipelined: a warp per row with 1..3 packs per
// lane (200 and 768 at bf16, 200 at f32), groups of 64..512 threads with 2 packs each (1000, with
// packs past the row's end, 2048 and 8192 at bf16; 768..2048 at f32), 512 threads with 4 packs
// (16384 at bf16, 8192 at f32); the register kernel for rows without packs, with groups of 32, 128
// and 512 threads (37, 1001, 3001); the streaming fallback (16384 and 20000 at f32, 20000 and 40000
// at bf16). 4096 x 768 and 1024 x 2048: many blocks at once, and each group of the persistent
// backward grid walks several rows.
const std::vector<std::vector<int64_t>> kNormShapes = {{64, 768}, {4096, 768},  {17, 37},  {33, 200},   {9, 1000},
                                                       {6, 1001}, {4, 3001},    {8, 2048}, {1024, 2048}, {5, 8192},
                                                       {3, 16384}, {3, 20000}, {2, 40000}};

// The CPU reference of the norm tests runs in f64 on the rounded inputs: its f32 kernel sums a row
// left to right, which over 20000-40000 columns is itself off by about 1e-5, the f32 tolerance.
Tensor in_f64(const Tensor& tensor) { return tensor.defined() ? tensor.to(kFloat64) : Tensor(); }

// One norm backward case, plain or folded: with NormBackwardExtras, an addend for grad_x, the
// parameter gradients added into earlier values (drawn here), and on the GPU grad_x's column sums,
// on the CPU reference (f64) and the GPU.
struct NormBackwardCase {
  NormBackwardCase(bool folded, const std::vector<int64_t>& shape, uint64_t& seed, DType dtype)
      : folded(folded), dtype(dtype) {
    const RoundedInput addend = random_input(shape, ++seed, dtype);
    earlier_weight = random_input({shape[1]}, ++seed, dtype);
    earlier_bias = random_input({shape[1]}, ++seed, dtype);
    if (folded) {
      cpu_extras = {in_f64(addend.reference), true};
      gpu_extras = {addend.gpu, true, poisoned({shape[1]}, dtype)};
    }
  }
  // Folded: the GPU's column sums of grad_x against the f64 sums of the grad_x it wrote (the linear's
  // bias gradient, runtime/ops/bias_gradient_handoff.h: the sums of grad_x as stored). The warp rows
  // take them in the pass, other rows in a pass after it.
  void expect_grad_x_column_sums(const Tensor& gx, const std::string& what) const {
    if (!folded) return;
    const int64_t dims[] = {0};
    const Tensor expected = Tensor::empty({1, gx.size(1)}, kFloat64);
    cpu_backend().reduce(ReduceOp::kSum, gx.to(Device::cpu()).to(kFloat64), dims, expected, Tensor());
    expect_close(gpu_extras.grad_x_column_sums, expected.view({gx.size(1)}), tolerance_for(dtype),
                 what + " grad_x column sums");
  }
  // The CPU's and the GPU's grad_weight (or grad_bias, from `earlier`): the earlier values when
  // folded, else fresh (the GPU's poisoned).
  Tensor cpu_parameter_gradient(const RoundedInput& earlier) const {
    return folded ? in_f64(earlier.reference) : Tensor::empty(earlier.reference.shape(), kFloat64);
  }
  Tensor gpu_parameter_gradient(const RoundedInput& earlier) const {
    return folded ? earlier.gpu.clone() : poisoned(earlier.reference.shape(), dtype);
  }
  std::string name(const std::string& what) const {
    return what + (folded ? " backward with an addend, accumulating" : " backward");
  }

  bool folded;
  DType dtype;
  RoundedInput earlier_weight, earlier_bias;
  NormBackwardExtras cpu_extras, gpu_extras;
};

TEST(CudaKernels, LayerNormForwardAndBackwardMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 200;
  for (DType dtype : kDtypes) {
    for (const auto& shape : kNormShapes) {
      for (bool with_bias : {true, false}) {
        const std::string what = describe(shape, dtype) + (with_bias ? " layer_norm" : " layer_norm (no bias)");
        SCOPED_TRACE(what);
        const int64_t rows = shape[0], columns = shape[1];
        const RoundedInput x = random_input(shape, ++seed, dtype, 0.5, 2.0);
        const RoundedInput weight = random_input({columns}, ++seed, dtype, 1.0, 0.5);
        const RoundedInput bias = random_input({columns}, ++seed, dtype);
        const double eps = 1e-5;
        const Tensor expected = Tensor::empty(shape, kFloat64), expected_mean = Tensor::empty({rows}, kFloat64);
        const Tensor expected_rstd = Tensor::empty({rows}, kFloat64);
        cpu_backend().layer_norm(in_f64(x.reference), in_f64(weight.reference),
                                 with_bias ? in_f64(bias.reference) : Tensor(), eps, expected, expected_mean,
                                 expected_rstd);
        const Tensor out = poisoned(shape, dtype), mean = poisoned({rows}, kFloat32), rstd = poisoned({rows}, kFloat32);
        gpu_backend().layer_norm(x.gpu, weight.gpu, with_bias ? bias.gpu : Tensor(), eps, out, mean, rstd);
        expect_close(out, expected, tolerance_for(dtype), what + " out");
        expect_close(mean, expected_mean, tolerance_for(kFloat32), what + " mean");
        expect_close(rstd, expected_rstd, tolerance_for(kFloat32), what + " rstd");

        const RoundedInput gy = random_input(shape, ++seed, dtype);
        // Plain, then with NormBackwardExtras: an addend for grad_x and parameter gradients added
        // into existing values.
        for (bool folded : {false, true}) {
          const NormBackwardCase c(folded, shape, seed, dtype);
          const std::string backward = c.name(what);
          const Tensor expected_gx = Tensor::empty(shape, kFloat64);
          const Tensor expected_gw = c.cpu_parameter_gradient(c.earlier_weight);
          const Tensor expected_gb = with_bias ? c.cpu_parameter_gradient(c.earlier_bias) : Tensor();
          cpu_backend().layer_norm_backward(in_f64(x.reference), in_f64(weight.reference), expected_mean,
                                            expected_rstd, in_f64(gy.reference), expected_gx, expected_gw,
                                            expected_gb, c.cpu_extras);
          const Tensor gx = poisoned(shape, dtype);
          const Tensor gw = c.gpu_parameter_gradient(c.earlier_weight);
          const Tensor gb = with_bias ? c.gpu_parameter_gradient(c.earlier_bias) : Tensor();
          gpu_backend().layer_norm_backward(x.gpu, weight.gpu, expected_mean.to(kFloat32).to(kGpu),
                                            expected_rstd.to(kFloat32).to(kGpu), gy.gpu, gx, gw, gb, c.gpu_extras);
          expect_close(gx, expected_gx, tolerance_for(dtype), backward + " grad_x");
          expect_close(gw, expected_gw, tolerance_for(dtype), backward + " grad_weight");
          if (with_bias) expect_close(gb, expected_gb, tolerance_for(dtype), backward + " grad_bias");
          c.expect_grad_x_column_sums(gx, backward);
        }
      }
    }
  }
}

TEST(CudaKernels, RmsNormForwardAndBackwardMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 300;
  for (DType dtype : kDtypes) {
    for (const auto& shape : kNormShapes) {
      const std::string what = describe(shape, dtype) + " rms_norm";
      SCOPED_TRACE(what);
      const int64_t rows = shape[0], columns = shape[1];
      const RoundedInput x = random_input(shape, ++seed, dtype, 0.5, 2.0);
      const RoundedInput weight = random_input({columns}, ++seed, dtype, 1.0, 0.5);
      const double eps = 1e-6;
      const Tensor expected = Tensor::empty(shape, kFloat64), expected_rstd = Tensor::empty({rows}, kFloat64);
      cpu_backend().rms_norm(in_f64(x.reference), in_f64(weight.reference), eps, expected, expected_rstd);
      const Tensor out = poisoned(shape, dtype), rstd = poisoned({rows}, kFloat32);
      gpu_backend().rms_norm(x.gpu, weight.gpu, eps, out, rstd);
      expect_close(out, expected, tolerance_for(dtype), what + " out");
      expect_close(rstd, expected_rstd, tolerance_for(kFloat32), what + " rstd");

      const RoundedInput gy = random_input(shape, ++seed, dtype);
      for (bool folded : {false, true}) {
        const NormBackwardCase c(folded, shape, seed, dtype);
        const std::string backward = c.name(what);
        const Tensor expected_gx = Tensor::empty(shape, kFloat64);
        const Tensor expected_gw = c.cpu_parameter_gradient(c.earlier_weight);
        cpu_backend().rms_norm_backward(in_f64(x.reference), in_f64(weight.reference), expected_rstd,
                                        in_f64(gy.reference), expected_gx, expected_gw, c.cpu_extras);
        const Tensor gx = poisoned(shape, dtype);
        const Tensor gw = c.gpu_parameter_gradient(c.earlier_weight);
        gpu_backend().rms_norm_backward(x.gpu, weight.gpu, expected_rstd.to(kFloat32).to(kGpu), gy.gpu, gx, gw,
                                        c.gpu_extras);
        expect_close(gx, expected_gx, tolerance_for(dtype), backward + " grad_x");
        expect_close(gw, expected_gw, tolerance_for(dtype), backward + " grad_weight");
        c.expect_grad_x_column_sums(gx, backward);
      }
    }
  }
}

// Where the norm backward's kernel takes grad_x's column sums in its own pass (its warp rows: up to
// 96 packs of 16 bytes, C = 768 at bf16, 384 at f32), so that a norm offers the linear before it its
// bias gradient (runtime/ops/bias_gradient_handoff.h); elsewhere they would cost a pass.
TEST(CudaKernels, NormBackwardSumsGradXColumnsInItsPassForWarpRowsOnly) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const auto in_pass = [](std::vector<int64_t> shape, DType dtype) {
    return gpu_backend().norm_backward_sums_columns_in_pass(Tensor::empty(shape, dtype, kGpu));
  };
  EXPECT_TRUE(in_pass({4, 768}, kBFloat16));
  EXPECT_TRUE(in_pass({4, 200}, kBFloat16));
  EXPECT_TRUE(in_pass({4, 384}, kFloat32));
  EXPECT_FALSE(in_pass({4, 2048}, kBFloat16));
  EXPECT_FALSE(in_pass({4, 768}, kFloat32));
  EXPECT_FALSE(in_pass({4, 37}, kBFloat16));
}

TEST(CudaKernels, NormBackwardGivesTheSameBitsEveryRun) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const RoundedInput x = random_input({4096, 768}, 11, kFloat32);
  const RoundedInput weight = random_input({768}, 12, kFloat32, 1.0, 0.5);
  const RoundedInput gy = random_input({4096, 768}, 13, kFloat32);
  const Tensor mean = Tensor::empty({4096}, kFloat32, kGpu), rstd = Tensor::empty({4096}, kFloat32, kGpu);
  gpu_backend().layer_norm(x.gpu, weight.gpu, Tensor(), 1e-5, Tensor::empty({4096, 768}, kFloat32, kGpu), mean, rstd);
  std::vector<Tensor> grad_weights;
  for (int run = 0; run < 2; ++run) {
    const Tensor gx = poisoned({4096, 768}, kFloat32), gw = poisoned({768}, kFloat32), gb = poisoned({768}, kFloat32);
    gpu_backend().layer_norm_backward(x.gpu, weight.gpu, mean, rstd, gy.gpu, gx, gw, gb, {});
    grad_weights.push_back(gw);
  }
  expect_identical(grad_weights[0], grad_weights[1], "layer_norm grad_weight, two runs");
}

// --- Embedding ---------------------------------------------------------------------------------

// The GPU's embedding backward against the CPU's from the same non-zero grad_weight (it
// accumulates), and twice on the GPU bit for bit (no atomics: the same bits every time).
void expect_embedding_backward_matches(const Tensor& ids, int64_t vocabulary, int64_t columns, DType dtype,
                                       uint64_t& seed, const std::string& what) {
  const RoundedInput start = random_input({vocabulary, columns}, ++seed, dtype, 0.0, 0.1);
  const RoundedInput gy = random_input({ids.numel(), columns}, ++seed, dtype);
  const Tensor expected_gw = start.reference.clone();
  cpu_backend().embedding_backward(ids, gy.reference, expected_gw);
  const Tensor gw = start.gpu.clone();
  gpu_backend().embedding_backward(ids.to(kGpu), gy.gpu, gw);
  expect_close(gw, expected_gw, tolerance_for(dtype), what + " backward");
  const Tensor again = start.gpu.clone();
  gpu_backend().embedding_backward(ids.to(kGpu), gy.gpu, again);
  expect_identical(again.to(Device::cpu()).to(kFloat32), gw.to(Device::cpu()).to(kFloat32), what + " rerun");
}

TEST(CudaKernels, EmbeddingForwardAndBackwardMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  struct Case {
    int64_t count, vocabulary, columns, id_bound;  // ids drawn from [0, id_bound): small bounds repeat ids
  };
  // The backward sorts the ids: GPT-2's batch of 16384 over its whole vocabulary (runs of one or two),
  // runs of about 80 and of about 5000 (three ids; the run's end found 32 keys a ballot), one id
  // repeated 301 times (rows left over after four at a time), and rows that take no packs.
  const std::vector<Case> cases = {{16384, 50304, 768, 50304}, {64, 50304, 768, 50304}, {4096, 1000, 768, 50},
                                   {16384, 50304, 768, 3},      {301, 7, 64, 1},        {100, 1001, 37, 1001}};
  uint64_t seed = 400;
  for (DType dtype : kDtypes) {
    for (DType id_dtype : {kInt64, kInt32}) {
      for (const Case& c : cases) {
        const std::string what = describe({c.count, c.vocabulary, c.columns}, dtype) + " ids " +
                                 std::string(dtype_name(id_dtype)) + " bound " + std::to_string(c.id_bound);
        SCOPED_TRACE(what);
        const Tensor ids = random_ids(c.count, c.id_bound, ++seed, id_dtype);
        const RoundedInput weight = random_input({c.vocabulary, c.columns}, ++seed, dtype);
        const Tensor expected = Tensor::empty({c.count, c.columns});
        cpu_backend().embedding(ids, weight.reference, expected);
        const Tensor out = poisoned({c.count, c.columns}, dtype);
        gpu_backend().embedding(ids.to(kGpu), weight.gpu, out);
        expect_identical(out.to(Device::cpu()).to(kFloat32), expected, what + " forward");

        expect_embedding_backward_matches(ids, c.vocabulary, c.columns, dtype, seed, what);
      }
    }
  }
}

// The backward cuts runs of equal ids into parts of 64 sorted rows and adds the parts' sums in a
// second kernel: runs that end on a part boundary, start on one, cross one or many, a run of one
// right after a long one, and a long run that holds the last part.
TEST(CudaKernels, EmbeddingBackwardSplitsLongRunsIntoParts) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const std::vector<int64_t> run_lengths = {64, 64, 1, 63, 128, 65, 200, 1, 2, 640, 3000, 127, 129, 1, 700};
  const int64_t vocabulary = 40, columns = 768;
  std::vector<int64_t> ordered;
  for (size_t r = 0; r < run_lengths.size(); ++r) {
    // Ids rising with the runs, so that sorted they keep this order (64 | 64 | 1, 63 | 128 | 65 ...).
    const int64_t id = static_cast<int64_t>(2 * r + 1);
    ordered.insert(ordered.end(), static_cast<size_t>(run_lengths[r]), id);
  }
  const int64_t count = static_cast<int64_t>(ordered.size());
  // Positions shuffled by a fixed permutation (a multiplier coprime to the count walks every index),
  // so that the sort, not the input, makes the runs.
  int64_t step = 7919;
  while (std::gcd(step, count) != 1) ++step;
  std::vector<int64_t> shuffled(ordered.size());
  for (int64_t i = 0; i < count; ++i) shuffled[static_cast<size_t>((i * step) % count)] = ordered[static_cast<size_t>(i)];
  uint64_t seed = 450;
  for (DType dtype : kDtypes) {
    const std::string what = describe({count, vocabulary, columns}, dtype) + " split runs";
    SCOPED_TRACE(what);
    const Tensor ids = Tensor::from_vector(absl::MakeConstSpan(shuffled), {count}, kInt64);
    expect_embedding_backward_matches(ids, vocabulary, columns, dtype, seed, what);
  }
}

// --- Cross-entropy -----------------------------------------------------------------------------

TEST(CudaKernels, CrossEntropyForwardAndBackwardMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const std::vector<std::vector<int64_t>> shapes = {{256, 50304}, {64, 50304}, {1000, 1001}, {9, 37}};
  const int64_t ignore_index = -100;
  uint64_t seed = 500;
  for (DType dtype : kDtypes) {
    for (DType target_dtype : {kInt64, kInt32}) {
      for (const auto& shape : shapes) {
        const std::string what = describe(shape, dtype) + " targets " + std::string(dtype_name(target_dtype));
        SCOPED_TRACE(what);
        const int64_t rows = shape[0], vocabulary = shape[1];
        const RoundedInput logits = random_input(shape, ++seed, dtype, 0.0, 4.0);
        const Tensor targets = random_ids(rows, vocabulary, ++seed, target_dtype, /*ignore_every=*/7, ignore_index);
        const Tensor expected_losses = Tensor::empty({rows}), expected_lse = Tensor::empty({rows});
        cpu_backend().cross_entropy(logits.reference, targets, ignore_index, expected_losses, expected_lse);
        const Tensor losses = poisoned({rows}, kFloat32), lse = poisoned({rows}, kFloat32);
        gpu_backend().cross_entropy(logits.gpu, targets.to(kGpu), ignore_index, losses, lse);
        expect_close(losses, expected_losses, tolerance_for(kFloat32), what + " losses");
        expect_close(lse, expected_lse, tolerance_for(kFloat32), what + " lse");

        const Tensor grad_losses = Tensor::uniform({rows}, ++seed, 0, 0.5, 1.5, kFloat32);
        const Tensor expected_grad = Tensor::empty(shape);
        cpu_backend().cross_entropy_backward(logits.reference, targets, expected_lse, ignore_index, grad_losses,
                                             expected_grad);
        const Tensor grad = poisoned(shape, dtype);
        gpu_backend().cross_entropy_backward(logits.gpu, targets.to(kGpu), expected_lse.to(kGpu), ignore_index,
                                             grad_losses.to(kGpu), grad);
        expect_close(grad, expected_grad, tolerance_for(dtype), what + " grad_logits");
      }
    }
  }
}

// The CPU's losses, lse and gradient of the logits [rows, V] (its two calls), the reference of the
// fused kernel's three outputs.
std::tuple<Tensor, Tensor, Tensor> cpu_cross_entropy_with_gradient(const Tensor& logits, const Tensor& targets,
                                                                   int64_t ignore_index, const Tensor& grad_losses) {
  const int64_t rows = logits.size(0);
  const Tensor losses = Tensor::empty({rows}), lse = Tensor::empty({rows}), grad = Tensor::empty(logits.shape());
  cpu_backend().cross_entropy(logits, targets, ignore_index, losses, lse);
  cpu_backend().cross_entropy_backward(logits, targets, lse, ignore_index, grad_losses, grad);
  return {losses, lse, grad};
}

// Forward and backward in one kernel, in place over the logits, against the CPU's two calls; and
// the device-side correction for a seed other than the expected one.
TEST(CudaKernels, CrossEntropyWithGradientMatchesCpuInPlace) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  // Rows held in shared memory between the passes (packed rows of 4 KB to 112 KB: 50304 and 32000 in
  // bf16, 4096 in both dtypes; on Hopper two rows a block, copied in by the copy engine, where 600
  // rows give each block four or five, so each buffer's barriers go through several phases) and
  // rows read twice (50304 and 32000 in f32; 1001 and 37 take no packs).
  const std::vector<std::vector<int64_t>> shapes = {{600, 50304}, {64, 50304}, {300, 32000},
                                                    {200, 4096},  {1000, 1001}, {9, 37}};
  const int64_t ignore_index = -100;
  uint64_t seed = 900;
  for (DType dtype : kDtypes) {
    for (const auto& shape : shapes) {
      const std::string what = describe(shape, dtype);
      SCOPED_TRACE(what);
      const int64_t rows = shape[0], vocabulary = shape[1];
      const RoundedInput logits = random_input(shape, ++seed, dtype, 0.0, 4.0);
      const Tensor targets = random_ids(rows, vocabulary, ++seed, kInt64, /*ignore_every=*/7, ignore_index);
      const Tensor grad_losses = Tensor::uniform({rows}, ++seed, 0, 0.5, 1.5, kFloat32);
      const auto [expected_losses, expected_lse, expected_grad] =
          cpu_cross_entropy_with_gradient(logits.reference, targets, ignore_index, grad_losses);
      const Tensor in_place = logits.gpu.clone();
      const Tensor losses = poisoned({rows}, kFloat32), lse = poisoned({rows}, kFloat32);
      gpu_backend().cross_entropy_with_gradient(in_place, targets.to(kGpu), ignore_index, grad_losses.to(kGpu), losses,
                                                lse, in_place);
      expect_close(losses, expected_losses, tolerance_for(kFloat32), what + " losses");
      expect_close(lse, expected_lse, tolerance_for(kFloat32), what + " lse");
      expect_close(in_place, expected_grad, tolerance_for(dtype), what + " grad_logits");
      // The two CUDA kernels' result, up to the last bit of f32 (the fused kernel keeps the row's
      // lse in a register where the backward kernel loads it, and the compiler schedules the
      // exponent's arithmetic differently).
      const Tensor separate = poisoned(shape, dtype);
      gpu_backend().cross_entropy_backward(logits.gpu, targets.to(kGpu), lse, ignore_index, grad_losses.to(kGpu),
                                           separate);
      expect_close(in_place, separate, tolerance_for(dtype), what + " against cross_entropy_backward");

      const Tensor expected_seed = Tensor::full({1}, 0.25, kFloat32, kGpu);
      const Tensor kept = in_place.clone();
      gpu_backend().rescale_unless_expected(kept, expected_seed, 0.25);
      expect_identical(kept, in_place, what + " rescale with the expected seed");
      const Tensor other_seed = Tensor::full({1}, 0.75, kFloat32, kGpu);
      gpu_backend().rescale_unless_expected(kept, other_seed, 0.25);
      const Tensor expected_rescaled = in_place.to(Device::cpu()).to(kFloat32);
      cpu_backend().affine(expected_rescaled, 3.0, 0.0, expected_rescaled);
      expect_close(kept, expected_rescaled, tolerance_for(dtype), what + " rescale with another seed");
    }
  }
}

// --- Dropout -----------------------------------------------------------------------------------

TEST(CudaKernels, DropoutMatchesCpuBitForBit) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  uint64_t seed = 600;
  for (DType dtype : kDtypes) {
    for (int64_t count : {int64_t{4096} * 768, int64_t{1001}, int64_t{7}}) {
      for (double p : {0.1, 0.5}) {
        const std::string what = describe({count}, dtype) + " p " + std::to_string(p);
        SCOPED_TRACE(what);
        const RoundedInput x = random_input({count}, ++seed, dtype);
        const Tensor stored = x.reference.to(dtype);
        const Tensor expected = Tensor::empty({count}, dtype);
        cpu_backend().dropout(stored, p, /*seed=*/++seed, /*offset=*/12345, expected);
        const Tensor out = poisoned({count}, dtype);
        gpu_backend().dropout(x.gpu, p, seed, 12345, out);
        expect_identical(out, expected, what);
        // Unaligned (scalar path): a view one element into its storage.
        if (count > 1) {
          const Tensor view = x.gpu.narrow(0, 1, count - 1);
          const Tensor expected_view = Tensor::empty({count - 1}, dtype);
          cpu_backend().dropout(stored.narrow(0, 1, count - 1).contiguous(), p, seed, 777, expected_view);
          const Tensor out_view = poisoned({count}, dtype).narrow(0, 1, count - 1);
          gpu_backend().dropout(view, p, seed, 777, out_view);
          expect_identical(out_view, expected_view, what + " unaligned view");
        }
      }
    }
  }
}

// --- Bad ids and targets (runtime/cuda/index_check.cuh) -----------------------------------------

// Sets WEFT_CHECK_IDS for the scope.
class CheckIdsScope {
 public:
  explicit CheckIdsScope(const char* value) {
    const char* previous = std::getenv("WEFT_CHECK_IDS");
    had_previous_ = previous != nullptr;
    if (had_previous_) previous_ = previous;
    if (value == nullptr) {
      unsetenv("WEFT_CHECK_IDS");
    } else {
      setenv("WEFT_CHECK_IDS", value, 1);
    }
  }
  ~CheckIdsScope() {
    if (had_previous_) {
      setenv("WEFT_CHECK_IDS", previous_.c_str(), 1);
    } else {
      unsetenv("WEFT_CHECK_IDS");
    }
  }

 private:
  bool had_previous_ = false;
  std::string previous_;
};

TEST(CudaKernels, BadIdsRaiseAtTheCallWithCheckIds) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const CheckIdsScope scope("1");
  const Tensor weight = Tensor::normal({10, 8}, 1, 0, 0.0, 1.0, kFloat32, kGpu);
  const Tensor bad_ids = Tensor::from_vector(std::vector<int64_t>{1, 10, 2}, {3}, kInt64, kGpu);
  EXPECT_THROW(gpu_backend().embedding(bad_ids, weight, Tensor::empty({3, 8}, kFloat32, kGpu)), Error);
  EXPECT_THROW(gpu_backend().embedding_backward(bad_ids, Tensor::zeros({3, 8}, kFloat32, kGpu),
                                                Tensor::zeros({10, 8}, kFloat32, kGpu)),
               Error);
  const Tensor logits = Tensor::normal({3, 10}, 2, 0, 0.0, 1.0, kFloat32, kGpu);
  const Tensor bad_targets = Tensor::from_vector(std::vector<int64_t>{1, -1, 2}, {3}, kInt64, kGpu);
  const Tensor losses = Tensor::empty({3}, kFloat32, kGpu), lse = Tensor::empty({3}, kFloat32, kGpu);
  EXPECT_THROW(gpu_backend().cross_entropy(logits, bad_targets, -100, losses, lse), Error);
  EXPECT_THROW(gpu_backend().cross_entropy_backward(logits, bad_targets, lse, -100, Tensor::ones({3}, kFloat32, kGpu),
                                                    Tensor::empty({3, 10}, kFloat32, kGpu)),
               Error);
  // The record was cleared: valid calls go on working.
  const Tensor good_ids = Tensor::from_vector(std::vector<int64_t>{1, 9, 2}, {3}, kInt64, kGpu);
  EXPECT_NO_THROW(gpu_backend().embedding(good_ids, weight, Tensor::empty({3, 8}, kFloat32, kGpu)));
}

TEST(CudaKernels, BadIdsRaiseAtTheNextCallByDefault) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const CheckIdsScope scope(nullptr);
  const Tensor weight = Tensor::normal({10, 8}, 1, 0, 0.0, 1.0, kFloat32, kGpu);
  const Tensor bad_ids = Tensor::from_vector(std::vector<int64_t>{1, 10, 2}, {3}, kInt64, kGpu);
  const Tensor good_ids = Tensor::from_vector(std::vector<int64_t>{1, 9, 2}, {3}, kInt64, kGpu);
  const Tensor out = Tensor::empty({3, 8}, kFloat32, kGpu);
  EXPECT_NO_THROW(gpu_backend().embedding(bad_ids, weight, out));  // no synchronization here
  // The bad row is zero, the others are the weight's rows.
  const std::vector<double> values = out.to(Device::cpu()).to_vector();  // synchronizes
  for (int c = 0; c < 8; ++c) EXPECT_EQ(values[8 + c], 0.0);
  EXPECT_EQ(values[0], weight.to(Device::cpu()).at({1, 0}));
  try {
    gpu_backend().embedding(good_ids, weight, out);
    ADD_FAILURE() << "the next embedding call did not raise";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("id 10 at position 1"), std::string::npos) << message;
    EXPECT_NE(message.find("[0, 10)"), std::string::npos) << message;
  }
  EXPECT_NO_THROW(gpu_backend().embedding(good_ids, weight, out));
  // Backward: the rows of bad ids are skipped (they sort after every valid id), the others added;
  // the next call raises.
  const Tensor mixed = Tensor::from_vector(std::vector<int64_t>{1, 10, 1, -3, 2}, {5}, kInt64, kGpu);
  const Tensor grad = Tensor::zeros({10, 8}, kFloat32, kGpu);
  EXPECT_NO_THROW(gpu_backend().embedding_backward(mixed, Tensor::ones({5, 8}, kFloat32, kGpu), grad));
  const std::vector<double> sums = grad.to(Device::cpu()).to_vector();
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(sums[c], 0.0);
    EXPECT_EQ(sums[8 + c], 2.0);
    EXPECT_EQ(sums[16 + c], 1.0);
    EXPECT_EQ(sums[72 + c], 0.0);
  }
  EXPECT_THROW(gpu_backend().embedding(good_ids, weight, out), Error);
  EXPECT_NO_THROW(gpu_backend().embedding(good_ids, weight, out));
  out.to(Device::cpu());
}

// The fused cross-entropy with targets outside [0, V): the call itself does not synchronize; the
// bad rows get a NaN loss and a zero gradient, every other row the CPU's result (as if the bad
// targets were ignored), and the next call raises naming the target. Rows of 16 KB in bf16 (two a
// block on Hopper, brought in by the copy engine), of 50304 in f32 (read twice) and of 37 (no packs).
TEST(CudaKernels, CrossEntropyWithGradientBadTargetsGiveNanLossesAndZeroRows) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  const CheckIdsScope scope(nullptr);
  const int64_t ignore_index = -100;
  uint64_t seed = 1900;
  for (const auto& [dtype, rows, vocabulary] :
       std::vector<std::tuple<DType, int64_t, int64_t>>{{kBFloat16, 300, 8192}, {kFloat32, 40, 50304},
                                                        {kFloat32, 20, 37}}) {
    const std::vector<int64_t> shape = {rows, vocabulary};
    const std::string what = describe(shape, dtype);
    SCOPED_TRACE(what);
    const RoundedInput logits = random_input(shape, ++seed, dtype, 0.0, 4.0);
    std::vector<double> drawn = random_ids(rows, vocabulary, ++seed, kInt64, 7, ignore_index).to_vector();
    const int64_t bad_row = rows / 2, negative_row = rows - 1;
    drawn[static_cast<size_t>(bad_row)] = static_cast<double>(vocabulary);
    drawn[static_cast<size_t>(negative_row)] = -3.0;
    std::vector<int64_t> targets_with_bad(drawn.begin(), drawn.end()), targets_ignored = targets_with_bad;
    targets_ignored[static_cast<size_t>(bad_row)] = ignore_index;
    targets_ignored[static_cast<size_t>(negative_row)] = ignore_index;
    const Tensor bad_targets = Tensor::from_vector(absl::MakeConstSpan(targets_with_bad), {rows}, kInt64);
    const Tensor ignored_targets = Tensor::from_vector(absl::MakeConstSpan(targets_ignored), {rows}, kInt64);
    const Tensor grad_losses = Tensor::uniform({rows}, ++seed, 0, 0.5, 1.5, kFloat32);
    const auto [expected_losses, expected_lse, expected_grad] =
        cpu_cross_entropy_with_gradient(logits.reference, ignored_targets, ignore_index, grad_losses);
    const Tensor in_place = logits.gpu.clone();
    const Tensor losses = poisoned({rows}, kFloat32), lse = poisoned({rows}, kFloat32);
    EXPECT_NO_THROW(gpu_backend().cross_entropy_with_gradient(in_place, bad_targets.to(kGpu), ignore_index,
                                                              grad_losses.to(kGpu), losses, lse, in_place));
    std::vector<double> got_losses = losses.to(Device::cpu()).to_vector();  // synchronizes
    EXPECT_TRUE(std::isnan(got_losses[static_cast<size_t>(bad_row)]));
    EXPECT_TRUE(std::isnan(got_losses[static_cast<size_t>(negative_row)]));
    got_losses[static_cast<size_t>(bad_row)] = 0.0;  // the CPU's loss for an ignored row
    got_losses[static_cast<size_t>(negative_row)] = 0.0;
    expect_close(Tensor::from_vector(absl::MakeConstSpan(got_losses), {rows}, kFloat32), expected_losses,
                 tolerance_for(kFloat32), what + " losses");
    expect_close(lse, expected_lse, tolerance_for(kFloat32), what + " lse");
    expect_close(in_place, expected_grad, tolerance_for(dtype), what + " grad_logits (zero rows for bad targets)");
    // The next call raises, naming the first bad target; the one after runs.
    const Tensor good = Tensor::zeros({rows}, kInt64, kGpu);
    try {
      gpu_backend().cross_entropy(logits.gpu, good, ignore_index, losses, lse);
      ADD_FAILURE() << "the next call did not raise";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("[0, " + std::to_string(vocabulary) + ")"), std::string::npos) << message;
    }
    EXPECT_NO_THROW(gpu_backend().cross_entropy(logits.gpu, good, ignore_index, losses, lse));
    losses.to(Device::cpu());
  }
}

// --- Through the differentiable ops ------------------------------------------------------------

// The op on the GPU, forward and backward with a given output gradient, against the same on the CPU.
void expect_op_matches_cpu(const std::function<Tensor(const std::vector<Tensor>&)>& op,
                           const std::vector<Tensor>& cpu_inputs, DType dtype, const std::string& what) {
  std::vector<Tensor> cpu_leaves, gpu_leaves;
  for (const Tensor& input : cpu_inputs) {
    const bool floating = input.dtype() != kInt64 && input.dtype() != kInt32;
    // Fresh leaves every call: .to() of an f32 input to f32 is the input itself, which must not be
    // marked as requiring grad for the next call.
    Tensor stored = (floating ? input.to(dtype) : input).detach();
    Tensor cpu_leaf = floating ? stored.to(kFloat32).detach() : stored;
    Tensor gpu_leaf = stored.to(kGpu);
    if (floating) {
      cpu_leaf.set_requires_grad(true);
      gpu_leaf.set_requires_grad(true);
    }
    cpu_leaves.push_back(cpu_leaf);
    gpu_leaves.push_back(gpu_leaf);
  }
  const Tensor cpu_out = op(cpu_leaves);
  const Tensor gpu_out = op(gpu_leaves);
  expect_close(gpu_out, cpu_out.detach(), tolerance_for(dtype), what + " forward");
  const Tensor gradient = Tensor::normal(cpu_out.shape(), 99, 0, 0.0, 1.0, kFloat32).to(gpu_out.dtype());
  cpu_out.backward(gradient.to(kFloat32));
  gpu_out.backward(gradient.to(kGpu));
  for (size_t i = 0; i < cpu_leaves.size(); ++i) {
    if (!cpu_leaves[i].requires_grad()) continue;
    ASSERT_TRUE(gpu_leaves[i].grad().defined()) << what << " input " << i;
    expect_close(gpu_leaves[i].grad(), cpu_leaves[i].grad(), tolerance_for(dtype), what + " grad " + std::to_string(i));
  }
}

TEST(CudaKernels, DifferentiableOpsMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is visible");
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = Tensor::normal({4, 16, 768}, 1, 0, 0.0, 1.0);
    const Tensor weight = Tensor::normal({768}, 2, 0, 1.0, 0.5);
    const Tensor bias = Tensor::normal({768}, 3);
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return softmax(in[0]); }, {x}, dtype, "softmax");
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return log_softmax(in[0]); }, {x}, dtype,
                          "log_softmax");
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); },
                          {x, weight, bias}, dtype, "layer_norm");
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); }, {x, weight}, dtype,
                          "rms_norm");
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return dropout(in[0], 0.1, 5, 77); }, {x}, dtype,
                          "dropout");
    const Tensor ids = random_ids(64, 1000, 4, kInt64);
    const Tensor table = Tensor::normal({1000, 768}, 5);
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); }, {ids, table}, dtype,
                          "embedding");
    const Tensor logits = Tensor::normal({64, 1001}, 6, 0, 0.0, 3.0);
    const Tensor targets = random_ids(64, 1001, 7, kInt64, /*ignore_every=*/5);
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); },
                          {logits, targets}, dtype, "cross_entropy");
    // linear with a bias: the fused product (Backend::matmul_bias) and its gradients, 3-D and 2-D
    // inputs; without a bias: the plain product whose weight gradient is computed in the weight's layout.
    const Tensor linear_weight = Tensor::normal({96, 768}, 8, 0, 0.0, 0.05);
    const Tensor linear_bias = Tensor::normal({96}, 9);
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                          {x, linear_weight, linear_bias}, dtype, "linear with bias");
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                          {x.reshape({64, 768}), linear_weight, linear_bias}, dtype, "linear with bias, 2-D");
    expect_op_matches_cpu([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {x, linear_weight},
                          dtype, "linear without bias");
  }
}

#endif  // WEFT_HAVE_CUDA

}  // namespace
}  // namespace weft
