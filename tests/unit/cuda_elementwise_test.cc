// CUDA backend against the CPU backend: fill, copies (host <-> device, strided, converting,
// broadcast), Philox random fills (bit-identical in f32), unary / unary_backward / binary / affine
// on contiguous, unaligned, transposed and broadcast views, reductions (sum, mean, max with indices,
// ties and NaN), the caching allocator (statistics, per-stream reuse, out-of-memory message), and
// stream identity: ids never reused, a destroyed stream's pool given back and never handed to a
// new stream that CUDA gave the old handle.
//
// Each test draws fresh random inputs on the CPU, runs the same kernel on both backends, and
// compares ||cuda - cpu|| / ||cpu|| with 1e-5 for f32 and 1e-2 for bf16; outputs are poisoned with
// NaN first, so an element a kernel forgot to write fails. Without a GPU (or in a CPU-only build)
// every test is skipped with a message.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/backend.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/weft.h"
#include "tests/support/cuda_expectations.h"

#ifdef WEFT_HAVE_CUDA
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft {
namespace {

using testing::bitwise_equal;
using testing::expect_close;
using testing::poisoned;
using testing::relative_l2_error;
using testing::tolerance_for;

// Why a test of this program skips: this file's tests also compile in a build without CUDA.
#ifdef WEFT_HAVE_CUDA
constexpr char kSkipMessage[] = "no CUDA device";
#else
constexpr char kSkipMessage[] = "weft was built without CUDA";
#endif

// Errors in the L2 norm; where the CPU gives NaN or an infinity (a reduction of NaN or -inf), the
// GPU must give the same in the same place.
const testing::Comparison kComparison = {testing::ErrorNorm::kL2, testing::NonFinite::kMustMatch};

const Device kGpu = Device::cuda(0);
const Device kHost = Device::cpu();

Backend& gpu() { return backend_for(kGpu); }
Backend& cpu() { return backend_for(kHost); }

// Fresh values in [low, high) (a different seed per call).
Tensor random_host(absl::Span<const int64_t> shape, DType dtype, double low = -2.0, double high = 2.0) {
  static uint64_t seed = 20261130;
  return Tensor::uniform(shape, ++seed, 0, low, high, dtype, kHost);
}

// A view of `base` (same on either device): the kinds of views ops pass to kernels.
enum class View { kContiguous, kUnaligned, kTransposed, kSliced };
const View kAllViews[] = {View::kContiguous, View::kUnaligned, View::kTransposed, View::kSliced};

const char* view_name(View view) {
  switch (view) {
    case View::kContiguous: return "contiguous";
    case View::kUnaligned: return "unaligned";
    case View::kTransposed: return "transposed";
    case View::kSliced: return "sliced";
  }
  return "?";
}

// Logical shape of every view below: [rows, columns].
constexpr int64_t kRows = 37, kColumns = 129;

// The storage `base` needs for `view`.
std::vector<int64_t> base_shape(View view) {
  switch (view) {
    case View::kContiguous: return {kRows, kColumns};
    case View::kUnaligned: return {kRows * kColumns + 1};
    case View::kTransposed: return {kColumns, kRows};
    case View::kSliced: return {kRows + 3, kColumns + 5};
  }
  return {};
}

Tensor make_view(const Tensor& base, View view) {
  switch (view) {
    case View::kContiguous: return base;
    case View::kUnaligned: return base.narrow(0, 1, kRows * kColumns).view({kRows, kColumns});
    case View::kTransposed: return base.transpose(0, 1);
    case View::kSliced: return base.narrow(0, 2, kRows).narrow(1, 3, kColumns);
  }
  return base;
}

// --- Fill ---------------------------------------------------------------------------------------

TEST(CudaFill, MatchesCpuForEveryDtypeContiguousAndStrided) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kFloat64, kInt32, kInt64}) {
    for (double value : {0.0, 1.5, -3.25, 0.1}) {
      for (View view : kAllViews) {
        // The base keeps other values around the view, so a fill that strays outside it shows.
        const Tensor host_base = Tensor::full(base_shape(view), 9.0, dtype, kHost);
        const Tensor device_base = host_base.to(kGpu);
        cpu().fill(make_view(host_base, view), value);
        gpu().fill(make_view(device_base, view), value);
        EXPECT_TRUE(bitwise_equal(device_base, host_base))
            << "fill " << value << " " << dtype_name(dtype) << " " << view_name(view);
      }
    }
  }
  // A size with a vector body and a tail.
  const Tensor device = poisoned({(1 << 20) + 3}, kBFloat16, kGpu);
  gpu().fill(device, 0.3);
  const Tensor host = poisoned({(1 << 20) + 3}, kBFloat16, kHost);
  cpu().fill(host, 0.3);
  EXPECT_TRUE(bitwise_equal(device, host));
}

// --- Copies ----------------------------------------------------------------------------------

TEST(CudaCopy, RoundTripsEveryDtype) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kFloat64, kInt32, kInt64}) {
    for (int64_t size : {1, 7, 1000, 100003}) {
      const Tensor host = random_host({size}, kFloat64, -1000.0, 1000.0).to(dtype);
      const Tensor back = host.to(kGpu).to(kHost);
      EXPECT_TRUE(back.device().is_cpu());
      EXPECT_TRUE(bitwise_equal(back, host)) << dtype_name(dtype) << " size " << size;
    }
  }
}

TEST(CudaCopy, StridedConvertingAndBroadcastCopiesMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  const DType dtypes[] = {kFloat32, kBFloat16, kFloat16, kFloat64, kInt32, kInt64};
  for (DType from : dtypes) {
    for (DType to : dtypes) {
      for (View source_view : kAllViews) {
        for (View out_view : {View::kContiguous, View::kTransposed, View::kSliced}) {
          const std::string what = str(dtype_name(from), " ", view_name(source_view), " -> ", dtype_name(to), " ",
                                       view_name(out_view));
          const Tensor host_source_base = random_host(base_shape(source_view), kFloat64, -300.0, 300.0).to(from);
          const Tensor host_source = make_view(host_source_base, source_view);
          const Tensor device_source = make_view(host_source_base.to(kGpu), source_view);
          const Tensor expected_base = poisoned(base_shape(out_view), to, kHost);
          cpu().copy(host_source, make_view(expected_base, out_view));

          // device -> device (kernel), host -> device and device -> host (staged).
          const Tensor on_device = poisoned(base_shape(out_view), to, kGpu);
          gpu().copy(device_source, make_view(on_device, out_view));
          EXPECT_TRUE(bitwise_equal(make_view(on_device, out_view), make_view(expected_base, out_view)))
              << "device->device " << what;
          const Tensor uploaded = poisoned(base_shape(out_view), to, kGpu);
          gpu().copy(host_source, make_view(uploaded, out_view));
          EXPECT_TRUE(bitwise_equal(make_view(uploaded, out_view), make_view(expected_base, out_view)))
              << "host->device " << what;
          const Tensor downloaded = poisoned(base_shape(out_view), to, kHost);
          gpu().copy(device_source, make_view(downloaded, out_view));
          EXPECT_TRUE(bitwise_equal(make_view(downloaded, out_view), make_view(expected_base, out_view)))
              << "device->host " << what;
        }
      }
    }
  }
  // Broadcast through Tensor::copy_ (a stride-0 source), host and device sources.
  const Tensor row = random_host({1, kColumns}, kFloat32);
  Tensor expected = Tensor::empty({kRows, kColumns}, kFloat32, kHost);
  expected.copy_(row);
  Tensor from_device = poisoned({kRows, kColumns}, kFloat32, kGpu);
  from_device.copy_(row.to(kGpu));
  EXPECT_TRUE(bitwise_equal(from_device, expected));
  Tensor from_host = poisoned({kRows, kColumns}, kFloat32, kGpu);
  from_host.copy_(row);
  EXPECT_TRUE(bitwise_equal(from_host, expected));
}

TEST(CudaCopy, CopiesBetweenDevices) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  if (testing::cuda_device_count() < 2) GTEST_SKIP() << "fewer than two CUDA devices";
  const Tensor host = random_host({kColumns, kRows}, kFloat32);
  const Tensor on_first = host.to(Device::cuda(0));
  Tensor on_second = poisoned({kRows, kColumns}, kBFloat16, Device::cuda(1));
  on_second.copy_(on_first.transpose(0, 1));
  Tensor expected = poisoned({kRows, kColumns}, kBFloat16, kHost);
  expected.copy_(host.transpose(0, 1));
  EXPECT_TRUE(bitwise_equal(on_second, expected));
}

// --- Random ----------------------------------------------------------------------------------

TEST(CudaRandom, UniformAndNormalAreBitIdenticalToCpuInF32) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (uint64_t seed : {0ull, 42ull, 0x123456789abcdefull}) {
    for (uint64_t offset : {0ull, 12345ull, 0xfffffffffull}) {
      const std::vector<int64_t> shape = {100003};
      EXPECT_TRUE(bitwise_equal(Tensor::uniform(shape, seed, offset, -0.5, 3.0, kFloat32, kGpu),
                                Tensor::uniform(shape, seed, offset, -0.5, 3.0, kFloat32, kHost)))
          << "uniform seed " << seed << " offset " << offset;
      EXPECT_TRUE(bitwise_equal(Tensor::normal(shape, seed, offset, 0.25, 0.02, kFloat32, kGpu),
                                Tensor::normal(shape, seed, offset, 0.25, 0.02, kFloat32, kHost)))
          << "normal seed " << seed << " offset " << offset;
    }
  }
}

TEST(CudaRandom, SixteenBitAndDoubleDrawsMatchCpuAndStayBelowHigh) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kBFloat16, kFloat16, kFloat64}) {
    const std::vector<int64_t> shape = {65537};
    const Tensor device_uniform = Tensor::uniform(shape, 7, 99, 0.0, 1.0, dtype, kGpu);
    const Tensor host_uniform = Tensor::uniform(shape, 7, 99, 0.0, 1.0, dtype, kHost);
    EXPECT_TRUE(bitwise_equal(device_uniform, host_uniform)) << dtype_name(dtype);
    for (double value : device_uniform.to_vector()) {
      ASSERT_GE(value, 0.0);
      ASSERT_LT(value, 1.0) << dtype_name(dtype) << ": uniform reached high";
    }
    EXPECT_LE(relative_l2_error(Tensor::normal(shape, 8, 5, -1.0, 2.0, dtype, kGpu),
                                Tensor::normal(shape, 8, 5, -1.0, 2.0, dtype, kHost), testing::NonFinite::kMustMatch),
              tolerance_for(dtype))
        << dtype_name(dtype);
  }
  // A range narrower than one f32 step near high: every draw must still be below high.
  const Tensor narrow = Tensor::uniform({4099}, 3, 0, 1.0, 1.0 + 1e-9, kFloat32, kGpu);
  EXPECT_TRUE(bitwise_equal(narrow, Tensor::uniform({4099}, 3, 0, 1.0, 1.0 + 1e-9, kFloat32, kHost)));
  for (double value : narrow.to_vector()) ASSERT_LT(value, 1.0 + 1e-9);
}

// --- Unary, binary, affine -------------------------------------------------------------------

const UnaryOp kUnaryOps[] = {UnaryOp::kNeg,  UnaryOp::kRelu, UnaryOp::kGelu, UnaryOp::kSilu,   UnaryOp::kExp,
                             UnaryOp::kLog,  UnaryOp::kTanh, UnaryOp::kSqrt, UnaryOp::kSquare, UnaryOp::kReciprocal};

bool needs_positive(UnaryOp op) {
  return op == UnaryOp::kLog || op == UnaryOp::kSqrt || op == UnaryOp::kReciprocal;
}

TEST(CudaElementwise, UnaryAndBackwardMatchCpuOnEveryView) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (UnaryOp op : kUnaryOps) {
      for (View view : kAllViews) {
        const double low = needs_positive(op) ? 0.25 : -3.0;
        const Tensor x_base = random_host(base_shape(view), dtype, low, 3.0);
        const Tensor grad_base = random_host(base_shape(view), dtype);
        const Tensor x_cpu = make_view(x_base, view), x_gpu = make_view(x_base.to(kGpu), view);
        const Tensor grad_cpu = make_view(grad_base, view), grad_gpu = make_view(grad_base.to(kGpu), view);
        const std::string what = str("unary op ", static_cast<int>(op), " ", view_name(view));

        Tensor expected = poisoned({kRows, kColumns}, dtype, kHost);
        cpu().unary(op, x_cpu, expected);
        Tensor got = poisoned({kRows, kColumns}, dtype, kGpu);
        gpu().unary(op, x_gpu, got);
        expect_close(got, expected, dtype, what, kComparison);
        // Into a strided output too.
        Tensor got_strided_base = poisoned({kColumns, kRows}, dtype, kGpu);
        gpu().unary(op, x_gpu, got_strided_base.transpose(0, 1));
        expect_close(got_strided_base.transpose(0, 1), expected, dtype, what + " into a transposed output",
                     kComparison);

        cpu().unary_backward(op, x_cpu, grad_cpu, expected);
        got = poisoned({kRows, kColumns}, dtype, kGpu);
        gpu().unary_backward(op, x_gpu, grad_gpu, got);
        expect_close(got, expected, dtype, what + " backward", kComparison);
      }
    }
  }
}

TEST(CudaElementwise, BinaryMatchesCpuWithBroadcastAndTransposedOperands) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
      for (View view : kAllViews) {
        const Tensor a_base = random_host(base_shape(view), dtype);
        const Tensor a_cpu = make_view(a_base, view), a_gpu = make_view(a_base.to(kGpu), view);
        // b: away from zero so that division is well conditioned.
        const Tensor b_full = random_host({kRows, kColumns}, dtype, 0.5, 2.0);
        const Tensor b_row = random_host({1, kColumns}, dtype, 0.5, 2.0);
        const Tensor b_column = random_host({kRows, 1}, dtype, 0.5, 2.0);
        const std::pair<Tensor, const char*> operands[] = {
            {b_full, "same shape"},
            {b_row.expand({kRows, kColumns}), "row broadcast"},
            {b_column.expand({kRows, kColumns}), "column broadcast"}};
        for (const auto& [b_cpu, kind] : operands) {
          Tensor b_gpu = b_cpu.to(kGpu);  // a contiguous copy of the expanded values...
          if (b_cpu.stride(0) == 0) b_gpu = b_row.to(kGpu).expand({kRows, kColumns});   // ...or a stride-0 view
          if (b_cpu.stride(1) == 0) b_gpu = b_column.to(kGpu).expand({kRows, kColumns});
          Tensor expected = poisoned({kRows, kColumns}, dtype, kHost);
          cpu().binary(op, a_cpu, b_cpu, expected);
          Tensor got = poisoned({kRows, kColumns}, dtype, kGpu);
          gpu().binary(op, a_gpu, b_gpu, got);
          expect_close(got, expected, dtype, str("binary op ", static_cast<int>(op), " ", view_name(view), " ", kind),
                       kComparison);
        }
      }
    }
  }
}

TEST(CudaElementwise, AffineMatchesCpuAndLargeSizesCoverVectorBodyAndTail) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (View view : kAllViews) {
      const Tensor x_base = random_host(base_shape(view), dtype);
      Tensor expected = poisoned({kRows, kColumns}, dtype, kHost);
      cpu().affine(make_view(x_base, view), 0.37, -1.25, expected);
      Tensor got = poisoned({kRows, kColumns}, dtype, kGpu);
      gpu().affine(make_view(x_base.to(kGpu), view), 0.37, -1.25, got);
      expect_close(got, expected, dtype, str("affine ", view_name(view)), kComparison);
      if (dtype == kFloat32) EXPECT_TRUE(bitwise_equal(got, expected)) << "affine is exact in f32";
    }
    for (int64_t size : {int64_t{1}, int64_t{3}, int64_t{9}, (int64_t{1} << 22) + 5}) {
      const Tensor a = random_host({size}, dtype), b = random_host({size}, dtype);
      Tensor expected = poisoned({size}, dtype, kHost);
      cpu().binary(BinaryOp::kMul, a, b, expected);
      Tensor got = poisoned({size}, dtype, kGpu);
      gpu().binary(BinaryOp::kMul, a.to(kGpu), b.to(kGpu), got);
      EXPECT_TRUE(bitwise_equal(got, expected)) << "mul is exact, size " << size << " " << dtype_name(dtype);
      cpu().unary(UnaryOp::kGelu, a, expected);
      got = poisoned({size}, dtype, kGpu);
      gpu().unary(UnaryOp::kGelu, a.to(kGpu), got);
      expect_close(got, expected, dtype, str("gelu size ", size), kComparison);
    }
  }
}

// Views whose innermost dim is contiguous everywhere take the vectorized strided kernels: a bias row
// broadcast over tokens, heads permuted [B, T, H, D] -> [B, H, T, D], a slice of the last dim.
TEST(CudaElementwise, VectorizedStridedPathsMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kFloat32, kBFloat16}) {
    // x [6, 40, 64] + bias [64] (stride-0 rows); also bias + x, and a slice of the last dim.
    const Tensor x = random_host({6, 40, 64}, dtype), bias = random_host({64}, dtype);
    const Tensor bias_cpu = bias.expand({6, 40, 64}), bias_gpu = bias.to(kGpu).expand({6, 40, 64});
    for (bool swapped : {false, true}) {
      Tensor expected = poisoned({6, 40, 64}, dtype, kHost);
      Tensor got = poisoned({6, 40, 64}, dtype, kGpu);
      if (swapped) {
        cpu().binary(BinaryOp::kAdd, bias_cpu, x, expected);
        gpu().binary(BinaryOp::kAdd, bias_gpu, x.to(kGpu), got);
      } else {
        cpu().binary(BinaryOp::kAdd, x, bias_cpu, expected);
        gpu().binary(BinaryOp::kAdd, x.to(kGpu), bias_gpu, got);
      }
      EXPECT_TRUE(bitwise_equal(got, expected)) << "bias add " << dtype_name(dtype) << (swapped ? " swapped" : "");
    }
    const Tensor wide = random_host({6, 40, 96}, dtype);
    const Tensor slice_cpu = wide.narrow(2, 16, 64), slice_gpu = wide.to(kGpu).narrow(2, 16, 64);
    Tensor expected = poisoned({6, 40, 64}, dtype, kHost);
    cpu().unary_backward(UnaryOp::kGelu, slice_cpu, x, expected);
    Tensor got = poisoned({6, 40, 64}, dtype, kGpu);
    gpu().unary_backward(UnaryOp::kGelu, slice_gpu, x.to(kGpu), got);
    expect_close(got, expected, dtype, "gelu backward of a last-dim slice", kComparison);
  }
  // Copies: heads permuted both ways, every dtype; an odd head size falls back to the element path.
  for (DType dtype : {kFloat32, kBFloat16, kFloat16, kFloat64, kInt32, kInt64}) {
    for (int64_t head : {int64_t{64}, int64_t{6}, int64_t{3}}) {
      const Tensor qkv = random_host({2, 9, 3 * 4 * head}, kFloat64, -300.0, 300.0).to(dtype);
      const Tensor part_cpu = qkv.narrow(2, 4 * head, 4 * head).reshape({2, 9, 4, head}).permute({0, 2, 1, 3});
      const Tensor part_gpu =
          qkv.to(kGpu).narrow(2, 4 * head, 4 * head).reshape({2, 9, 4, head}).permute({0, 2, 1, 3});
      Tensor expected = poisoned({2, 4, 9, head}, dtype, kHost);
      cpu().copy(part_cpu, expected);
      Tensor got = poisoned({2, 4, 9, head}, dtype, kGpu);
      gpu().copy(part_gpu, got);
      EXPECT_TRUE(bitwise_equal(got, expected)) << "heads first " << dtype_name(dtype) << " head " << head;
      // And back into a slice of a wider tensor (the gradient of a split).
      const Tensor back_cpu_base = poisoned({2, 9, 3 * 4 * head}, dtype, kHost);
      const Tensor back_gpu_base = poisoned({2, 9, 3 * 4 * head}, dtype, kGpu);
      cpu().copy(expected.permute({0, 2, 1, 3}).reshape({2, 9, 4 * head}), back_cpu_base.narrow(2, 4 * head, 4 * head));
      gpu().copy(got.permute({0, 2, 1, 3}).reshape({2, 9, 4 * head}), back_gpu_base.narrow(2, 4 * head, 4 * head));
      EXPECT_TRUE(bitwise_equal(back_gpu_base.narrow(2, 4 * head, 4 * head), back_cpu_base.narrow(2, 4 * head, 4 * head)))
          << "heads back " << dtype_name(dtype) << " head " << head;
    }
  }
}

// --- Reductions ------------------------------------------------------------------------------

// out's shape for reducing `shape` over `dims`.
std::vector<int64_t> reduced_shape(absl::Span<const int64_t> shape, absl::Span<const int64_t> dims) {
  std::vector<int64_t> out(shape.begin(), shape.end());
  for (int64_t d : dims) out[d] = 1;
  return out;
}

void check_reduce(ReduceOp op, const Tensor& x_cpu, const Tensor& x_gpu, std::vector<int64_t> dims, DType dtype,
                  const std::string& what) {
  const std::vector<int64_t> out_shape = reduced_shape(x_cpu.shape(), dims);
  const bool with_indices = op == ReduceOp::kMax && dims.size() == 1;
  Tensor expected = poisoned(out_shape, dtype, kHost);
  Tensor expected_indices = with_indices ? poisoned(out_shape, kInt64, kHost) : Tensor();
  cpu().reduce(op, x_cpu, dims, expected, expected_indices);
  Tensor got = poisoned(out_shape, dtype, kGpu);
  Tensor got_indices = with_indices ? poisoned(out_shape, kInt64, kGpu) : Tensor();
  gpu().reduce(op, x_gpu, dims, got, got_indices);
  if (op == ReduceOp::kMax) {
    EXPECT_TRUE(bitwise_equal(got, expected)) << what << ": max is exact";
  } else {
    expect_close(got, expected, dtype, what, kComparison);
  }
  if (with_indices) EXPECT_EQ(got_indices.to_vector(), expected_indices.to_vector()) << what << ": indices";
}

TEST(CudaReduce, SumMeanMaxOverEveryDimSetMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  const std::vector<std::vector<int64_t>> dim_sets = {{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (bool transposed : {false, true}) {
      // [7, 33, 517] logical shape; transposed: a permuted view of a [517, 7, 33] tensor.
      const Tensor base = transposed ? random_host({517, 7, 33}, dtype) : random_host({7, 33, 517}, dtype);
      const Tensor x_cpu = transposed ? base.permute({1, 2, 0}) : base;
      const Tensor x_gpu = transposed ? base.to(kGpu).permute({1, 2, 0}) : base.to(kGpu);
      for (const auto& dims : dim_sets) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
          std::string what = str("reduce op ", static_cast<int>(op), " dims {");
          for (int64_t d : dims) what += str(d, ",");
          what += str("} ", dtype_name(dtype), transposed ? " transposed" : "");
          check_reduce(op, x_cpu, x_gpu, dims, dtype, what);
        }
      }
    }
  }
  // Long rows (a vocabulary) and a single element.
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 50257}, std::vector<int64_t>{1, 1}}) {
    const Tensor x = random_host(shape, kFloat32);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax}) {
      check_reduce(op, x, x.to(kGpu), {1}, kFloat32, str("reduce op ", static_cast<int>(op), " long rows"));
      check_reduce(op, x, x.to(kGpu), {0}, kFloat32, str("reduce op ", static_cast<int>(op), " over rows"));
    }
  }
}

// Few outputs over many elements take the split path (partials, then a second pass): whole-tensor
// sums as in a gradient norm, and bias gradients over every token.
TEST(CudaReduce, SplitSumsAndMeansOfLargeReductionsMatchCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  for (DType dtype : {kFloat32, kBFloat16}) {
    const Tensor flat = random_host({3, 100003}, dtype);
    const Tensor tokens = random_host({8, 512, 96}, dtype);
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
      const std::string name = str(op == ReduceOp::kSum ? "sum" : "mean", " ", dtype_name(dtype));
      check_reduce(op, flat, flat.to(kGpu), {0, 1}, dtype, name + " of a whole tensor");
      check_reduce(op, flat, flat.to(kGpu), {1}, dtype, name + " of three long rows");
      check_reduce(op, tokens, tokens.to(kGpu), {0, 1}, dtype, name + " over tokens (bias gradient)");
      check_reduce(op, tokens.transpose(0, 2), tokens.to(kGpu).transpose(0, 2), {1, 2}, dtype,
                   name + " over tokens of a transposed view");
    }
    check_reduce(ReduceOp::kMax, flat, flat.to(kGpu), {1}, dtype, "max of long rows (never split)");
  }
}

// Bias gradients of GPT-2's widths over 16384 tokens (the contiguous-column kernel's split path):
// against the CPU, and the same bits on repeated calls, also on a second stream interleaved with
// the first; and a width of 33 column blocks ending in a partial one.
#ifdef WEFT_HAVE_CUDA
TEST(CudaReduce, BiasGradientColumnSumsMatchCpuTheSameEveryTime) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  cuda::Stream other(0);
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{16384, 768}, std::vector<int64_t>{16384, 2304}, std::vector<int64_t>{4096, 8200}}) {
      const Tensor x = random_host(shape, dtype);
      const Tensor x_gpu = x.to(kGpu);
      const std::string what = str("column sums ", shape[0], " x ", shape[1], " ", dtype_name(dtype));
      check_reduce(ReduceOp::kSum, x, x_gpu, {0}, dtype, what);
      check_reduce(ReduceOp::kMean, x, x_gpu, {0}, dtype, what + " (mean)");
      const Tensor first = Tensor::empty({1, shape[1]}, dtype, kGpu);
      gpu().reduce(ReduceOp::kSum, x_gpu, {0}, first, Tensor());
      for (int call = 0; call < 3; ++call) {
        const Tensor again = Tensor::empty({1, shape[1]}, dtype, kGpu);
        const Tensor elsewhere = Tensor::empty({1, shape[1]}, dtype, kGpu);
        gpu().reduce(ReduceOp::kSum, x_gpu, {0}, again, Tensor());
        {
          cuda::StreamGuard guard(0, other.get());
          gpu().reduce(ReduceOp::kSum, x_gpu, {0}, elsewhere, Tensor());
          gpu().synchronize(kGpu);
        }
        EXPECT_TRUE(bitwise_equal(again, first)) << what << ": call " << call;
        EXPECT_TRUE(bitwise_equal(elsewhere, first)) << what << ": call " << call << " on another stream";
      }
    }
  }
}
#endif  // WEFT_HAVE_CUDA

// The gradient norm's sums of squares (clip_grad_norm): tensors of one element, of exactly one and
// of just over one 64K chunk, of several chunks, empty, and a strided view, in f32, bf16 and f16;
// against the CPU's f64 sums, and the same bits on a second call.
TEST(CudaSquaredNorms, MatchCpuAcrossChunksDtypesAndViews) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  const Tensor base = random_host({300, 7}, kFloat32);  // viewed transposed below
  const std::vector<Tensor> host = {random_host({1}, kFloat32),       random_host({65536}, kBFloat16),
                                    random_host({65537}, kFloat16),   random_host({3, 100003}, kFloat32),
                                    Tensor::empty({0, 5}, kBFloat16), base.transpose(0, 1)};
  std::vector<Tensor> device;
  for (size_t i = 0; i + 1 < host.size(); ++i) device.push_back(host[i].to(kGpu));
  device.push_back(base.to(kGpu).transpose(0, 1));
  ASSERT_FALSE(device.back().is_contiguous());
  Tensor expected = Tensor::empty({6}, kFloat64);
  backend_for(Device::cpu()).squared_norms(host, expected);
  Tensor out = poisoned({6}, kFloat32);
  backend_for(kGpu).squared_norms(device, out);
  const std::vector<double> actual = out.to_vector(), reference = expected.to_vector();
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_NEAR(actual[i], reference[i], 1e-5 * reference[i] + 1e-30) << "tensor " << i << " " << host[i].describe();
  }
  EXPECT_EQ(actual[4], 0.0) << "empty tensor";
  Tensor again = poisoned({6}, kFloat32);
  backend_for(kGpu).squared_norms(device, again);
  EXPECT_EQ(again.to_vector(), actual) << "the same bits from run to run";
}

TEST(CudaReduce, MaxTakesTheFirstIndexOnTiesAndPropagatesNan) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  // Values from {0, 1, 2, 3}: every row has ties for its maximum.
  Tensor ties = random_host({67, 301}, kFloat32, 0.0, 4.0);
  for (int64_t i = 0; i < 67; ++i) {
    for (int64_t j = 0; j < 301; ++j) ties.set({i, j}, std::floor(ties.at({i, j})));
  }
  // NaN in some rows (twice in one), and a row of -inf.
  Tensor special = ties.clone();
  special.set({3, 10}, NAN);
  special.set({5, 200}, NAN);
  special.set({5, 20}, NAN);
  for (int64_t j = 0; j < 301; ++j) special.set({8, j}, -INFINITY);
  for (const Tensor& x : {ties, special}) {
    for (int64_t dim : {0, 1}) {
      check_reduce(ReduceOp::kMax, x, x.to(kGpu), {dim}, kFloat32, str("max ties/NaN over dim ", dim));
      check_reduce(ReduceOp::kMax, x.transpose(0, 1), x.to(kGpu).transpose(0, 1), {dim}, kFloat32,
                   str("max ties/NaN over dim ", dim, " transposed"));
      check_reduce(ReduceOp::kSum, x, x.to(kGpu), {dim}, kFloat32, str("sum with NaN over dim ", dim));
    }
  }
}

// --- Caching allocator -----------------------------------------------------------------------

#ifdef WEFT_HAVE_CUDA

TEST(CudaAllocator, RoundsToSizeClasses) {
  EXPECT_EQ(cuda::round_allocation_size(0), 0u);
  EXPECT_EQ(cuda::round_allocation_size(1), 512u);
  EXPECT_EQ(cuda::round_allocation_size(513), 1024u);
  EXPECT_EQ(cuda::round_allocation_size((1u << 20) - 1), size_t{1} << 20);
  EXPECT_EQ(cuda::round_allocation_size(1u << 20), size_t{2} << 20);
  EXPECT_EQ(cuda::round_allocation_size((size_t{2} << 20) + 1), size_t{4} << 20);
}

TEST(CudaAllocator, StatisticsRiseAndFallAndTrackThePeak) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  cuda::empty_cache();
  const cuda::MemoryStats before = cuda::memory_stats(0);
  cuda::reset_peak(0);
  {
    const Tensor a = Tensor::empty({(3 << 20) / 4}, kFloat32, kGpu);  // 3 MiB -> 4 MiB class
    const cuda::MemoryStats during = cuda::memory_stats(0);
    EXPECT_EQ(during.allocated_bytes - before.allocated_bytes, 4 << 20);
    EXPECT_GE(during.reserved_bytes, during.allocated_bytes);
    {
      const Tensor b = Tensor::empty({100}, kFloat32, kGpu);  // 400 B -> 512 B class
      EXPECT_EQ(cuda::memory_stats(0).allocated_bytes - before.allocated_bytes, (4 << 20) + 512);
    }
    EXPECT_EQ(cuda::memory_stats(0).allocated_bytes - before.allocated_bytes, 4 << 20);
  }
  const cuda::MemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.peak_allocated_bytes, before.allocated_bytes + (4 << 20) + 512);
  EXPECT_GT(after.reserved_bytes, after.allocated_bytes) << "freed blocks stay cached";
  cuda::reset_peak(0);
  EXPECT_EQ(cuda::memory_stats(0).peak_allocated_bytes, after.allocated_bytes);
  cuda::empty_cache();
  EXPECT_EQ(cuda::memory_stats(0).reserved_bytes, cuda::memory_stats(0).allocated_bytes);
}

TEST(CudaAllocator, AFreedBlockIsReusedOnItsStreamOnly) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  void* first = nullptr;
  {
    const Tensor a = Tensor::empty({12345}, kFloat32, kGpu);
    first = a.raw_data();
  }
  const int64_t hits = cuda::memory_stats(0).cache_hit_count;
  const int64_t mallocs = cuda::memory_stats(0).cuda_malloc_count;
  {
    const Tensor again = Tensor::empty({12345}, kFloat32, kGpu);
    EXPECT_EQ(again.raw_data(), first) << "same size, same stream: the cached block";
    EXPECT_EQ(cuda::memory_stats(0).cache_hit_count, hits + 1);
    EXPECT_EQ(cuda::memory_stats(0).cuda_malloc_count, mallocs);
  }
  // On another stream the block (cached on the default stream) is not handed out.
  cuda::Stream other(0);
  {
    cuda::StreamGuard guard(0, other.get());
    const Tensor elsewhere = Tensor::empty({12345}, kFloat32, kGpu);
    EXPECT_NE(elsewhere.raw_data(), first);
  }
  // Kernels on the other stream see correct data (the allocator and copies follow the current stream).
  {
    cuda::StreamGuard guard(0, other.get());
    const Tensor host = random_host({4099}, kFloat32);
    Tensor device = host.to(kGpu);
    gpu().affine(device, 2.0, 1.0, device);
    Tensor expected = host.clone();
    cpu().affine(host, 2.0, 1.0, expected);
    EXPECT_TRUE(bitwise_equal(device, expected));
  }
}

TEST(CudaStream, IdsAreNeverReusedEvenWhenHandlesAre) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  cudaStream_t first_handle = nullptr;
  uint64_t first_id = 0;
  {
    cuda::Stream first(0);
    first_handle = first.get();
    first_id = first.id();
    EXPECT_EQ(cuda::stream_id(first.get()), first.id());
  }
  bool handle_reused = false;
  for (int i = 0; i < 8; ++i) {
    cuda::Stream later(0);
    EXPECT_NE(later.id(), first_id);
    handle_reused = handle_reused || later.get() == first_handle;
  }
  // Informative: whether this driver handed the handle out again (the case the ids exist for).
  RecordProperty("handle_reused", handle_reused ? "yes" : "no");
  // The current stream's id follows StreamGuard, and is back when the guard ends.
  cuda::Stream guarded(0);
  const uint64_t outside = cuda::current_stream_id(0);
  EXPECT_EQ(outside, cuda::stream_id(cuda::current_stream(0)));
  {
    cuda::StreamGuard guard(0, guarded.get());
    EXPECT_EQ(cuda::current_stream_id(0), guarded.id());
    EXPECT_EQ(cuda::current_stream_key(0), guarded.key());
  }
  EXPECT_EQ(cuda::current_stream_id(0), outside);
}

TEST(CudaAllocator, ADestroyedStreamsBlocksGoBackAndNeverReachANewStream) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  const int64_t count = 777777;  // a size class no other test of this program uses
  const cuda::MemoryStats before = cuda::memory_stats(0);
  Tensor survivor;  // allocated on the stream, freed after it is gone
  {
    cuda::Stream stream(0);
    cuda::StreamGuard guard(0, stream.get());
    { const Tensor cached = Tensor::empty({count}, kFloat32, kGpu); }  // freed into the stream's pool
    EXPECT_EQ(cuda::memory_stats(0).cached_blocks, before.cached_blocks + 1);
    survivor = Tensor::full({count}, 3.0, kFloat32, kGpu);
  }
  // The stream's work was finished when it went, so its cached block was given back to CUDA.
  const cuda::MemoryStats after_stream = cuda::memory_stats(0);
  EXPECT_EQ(after_stream.cached_blocks, before.cached_blocks);
  EXPECT_EQ(after_stream.reserved_bytes, before.reserved_bytes + after_stream.allocated_bytes - before.allocated_bytes)
      << "only the survivor is still reserved";
  EXPECT_EQ(survivor.to(kHost).at({count - 1}), 3.0);
  // Freed on the default stream, the survivor's block goes to that stream's pool (no event on the
  // dead stream) and is reused there.
  survivor = Tensor();
  const int64_t hits = cuda::memory_stats(0).cache_hit_count;
  { const Tensor reused = Tensor::empty({count}, kFloat32, kGpu); }
  EXPECT_EQ(cuda::memory_stats(0).cache_hit_count, hits + 1);
  // A new stream, which may have the old one's handle, gets no block of the old stream.
  cuda::Stream next(0);
  cuda::StreamGuard guard(0, next.get());
  const int64_t hits_before_next = cuda::memory_stats(0).cache_hit_count;
  { const Tensor fresh = Tensor::empty({count}, kFloat32, kGpu); }
  EXPECT_EQ(cuda::memory_stats(0).cache_hit_count, hits_before_next) << "a new stream starts with an empty pool";
}

TEST(CudaAllocator, OutOfMemoryNamesTheRequestAndRecovers) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE(kSkipMessage);
  const int64_t absurd_bytes = 1000000000000000;  // 1e15 bytes, about 909 TiB
  try {
    [[maybe_unused]] const Tensor huge = Tensor::empty({absurd_bytes / 4}, kFloat32, kGpu);
    FAIL() << "allocating 1e15 bytes succeeded";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
    EXPECT_NE(message.find("1000000000000000 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("allocated"), std::string::npos) << message;
    EXPECT_NE(message.find("reserved"), std::string::npos) << message;
    EXPECT_NE(message.find("train.micro_batches"), std::string::npos) << message;  // the keys that lower it
    EXPECT_NE(message.find("train.recompute"), std::string::npos) << message;
  }
  // The device is usable afterwards.
  const Tensor host = random_host({1000}, kFloat32);
  EXPECT_TRUE(bitwise_equal(host.to(kGpu), host));
}

// The other side: a CUDA build on a machine without a GPU (or driver) loads and runs CPU code, and
// only a request for a CUDA tensor fails, saying why.
TEST(CudaWithoutDevice, RequestingACudaTensorSaysNoDeviceIsAvailable) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    [[maybe_unused]] const Tensor tensor = Tensor::empty({4}, kFloat32, kGpu);
    FAIL() << "a CUDA tensor was created without a CUDA device";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("no CUDA device is available (cudaGetDeviceCount: "), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(Tensor::ones({3}, kFloat32, kHost).to_vector(), (std::vector<double>{1.0, 1.0, 1.0}));
}

#endif  // WEFT_HAVE_CUDA

}  // namespace
}  // namespace weft
