// CUDA matmul (cuBLASLt) and causal attention (flash kernels) against the CPU backend.
//
// Inputs are drawn on the CPU in the test's dtype, so both backends see the same rounded values;
// CUDA outputs are poisoned with NaN first so that an unwritten element fails. Errors are
// ||out - ref|| / ||ref|| over all elements (NaN or Inf anywhere fails). A stream's cuBLASLt
// workspace goes when weft destroys the stream. Skipped without CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "tests/support/cuda_expectations.h"

#ifdef WEFT_HAVE_CUDA
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/hopper_products.h"
#include <unistd.h>

#include <cstdio>

#include "runtime/cuda/cudnn_attention.h"
#include "runtime/cuda/matmul.h"
#include "runtime/cuda/matmul_tuning_cache.h"
#include "runtime/cuda/stream.h"
#include "runtime/determinism.h"
#endif

namespace weft {
namespace {

#ifdef WEFT_HAVE_CUDA

using testing::bitwise_equal;
using testing::poisoned;
using testing::relative_l2_error;
using testing::tolerance_for;

const Device kGpu = Device::cuda(0);

// --- Matmul -------------------------------------------------------------------------------------

struct MatmulCase {
  int64_t batch, m, k, n;
  bool a_transposed = false, b_transposed = false;  // operand is a transposed (column-major) view
  bool a_shared = false, b_shared = false;          // stride-0 batch
  double alpha = 1.0, beta = 0.0;
};

std::string describe(const MatmulCase& c) {
  return "[" + std::to_string(c.batch) + ", " + std::to_string(c.m) + ", " + std::to_string(c.k) + "] @ [.., " +
         std::to_string(c.n) + "]" + (c.a_transposed ? " aT" : "") + (c.b_transposed ? " bT" : "") +
         (c.a_shared ? " a-shared" : "") + (c.b_shared ? " b-shared" : "") + " alpha " + std::to_string(c.alpha) +
         " beta " + std::to_string(c.beta);
}

// A [batch, rows, cols] operand: drawn as [batch or 1, rows, cols] (or its transpose), then viewed.
Tensor operand(const Tensor& base, bool transposed, bool shared, int64_t batch, int64_t rows, int64_t cols) {
  Tensor view = transposed ? base.transpose(1, 2) : base;
  return shared ? view.expand({batch, rows, cols}) : view;
}

void check_matmul(const MatmulCase& c, DType dtype, double tolerance, uint64_t seed) {
  SCOPED_TRACE(describe(c) + " " + std::string(dtype_name(dtype)));
  const int64_t a_batch = c.a_shared ? 1 : c.batch, b_batch = c.b_shared ? 1 : c.batch;
  const Tensor a_base = c.a_transposed ? Tensor::normal({a_batch, c.k, c.m}, seed, 0, 0.0, 1.0, dtype)
                                       : Tensor::normal({a_batch, c.m, c.k}, seed, 0, 0.0, 1.0, dtype);
  const Tensor b_base = c.b_transposed ? Tensor::normal({b_batch, c.n, c.k}, seed + 1, 0, 0.0, 1.0, dtype)
                                       : Tensor::normal({b_batch, c.k, c.n}, seed + 1, 0, 0.0, 1.0, dtype);
  const Tensor a_cpu = operand(a_base, c.a_transposed, c.a_shared, c.batch, c.m, c.k);
  const Tensor b_cpu = operand(b_base, c.b_transposed, c.b_shared, c.batch, c.k, c.n);
  const Tensor a_gpu = operand(a_base.to(kGpu), c.a_transposed, c.a_shared, c.batch, c.m, c.k);
  const Tensor b_gpu = operand(b_base.to(kGpu), c.b_transposed, c.b_shared, c.batch, c.k, c.n);

  Tensor out_cpu, out_gpu;
  if (c.beta != 0.0) {
    out_cpu = Tensor::normal({c.batch, c.m, c.n}, seed + 2, 0, 0.0, 1.0, dtype);
    out_gpu = out_cpu.to(kGpu);
  } else {
    out_cpu = Tensor::empty({c.batch, c.m, c.n}, dtype);
    out_gpu = poisoned({c.batch, c.m, c.n}, dtype);
  }
  backend_for(Device::cpu()).matmul(a_cpu, b_cpu, out_cpu, c.alpha, c.beta);
  backend_for(kGpu).matmul(a_gpu, b_gpu, out_gpu, c.alpha, c.beta);
  EXPECT_LE(relative_l2_error(out_gpu, out_cpu), tolerance);
}

std::vector<MatmulCase> matmul_cases() {
  std::vector<MatmulCase> cases;
  for (bool at : {false, true}) {
    for (bool bt : {false, true}) {
      cases.push_back({1, 13, 7, 33, at, bt});
      cases.push_back({3, 13, 7, 33, at, bt});
      cases.push_back({2, 64, 128, 96, at, bt, false, false, 0.5, 0.75});
      cases.push_back({4, 17, 40, 24, at, bt, false, true});  // bm shared
      cases.push_back({4, 17, 40, 24, at, bt, true, false});  // a shared
    }
  }
  cases.push_back({1, 1, 1, 1});
  cases.push_back({2, 1, 5, 9});
  cases.push_back({2, 9, 5, 1, true, true});
  cases.push_back({2, 5, 0, 3});                          // empty inner dimension
  cases.push_back({2, 5, 0, 3, false, false, false, false, 1.0, 2.0});
  // GPT-2 124M shapes at 1024 tokens: qkv (x @ W^T), mlp down, the weight gradient (x^T @ dy),
  // and batched attention-sized products.
  cases.push_back({1, 1024, 768, 2304, false, true});
  cases.push_back({4, 256, 3072, 768, false, true, false, true});
  cases.push_back({1, 768, 1024, 2304, true, false});
  cases.push_back({24, 128, 64, 128, false, true});
  return cases;
}

TEST(CudaMatmul, F32MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 100;
  for (const MatmulCase& c : matmul_cases()) check_matmul(c, kFloat32, 1e-5, seed += 3);
}

TEST(CudaMatmul, Bf16MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 200;
  for (const MatmulCase& c : matmul_cases()) check_matmul(c, kBFloat16, 1e-2, seed += 3);
}

TEST(CudaMatmul, F16MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 300;
  for (const MatmulCase& c : matmul_cases()) check_matmul(c, kFloat16, 1e-2, seed += 3);
}

TEST(CudaMatmul, RejectsF64) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const Tensor a = Tensor::empty({1, 2, 2}, kFloat64, kGpu);
  EXPECT_THROW(backend_for(kGpu).matmul(a, a, Tensor::empty({1, 2, 2}, kFloat64, kGpu), 1.0, 0.0), weft::Error);
}

// Each stream has its own 32 MiB workspace (keyed by the stream's id, never its reusable handle);
// destroying the stream lets it go.
TEST(CudaMatmul, AStreamsWorkspaceGoesWithTheStream) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const int64_t before = cuda::memory_stats(0).allocated_bytes;
  {
    cuda::Stream stream(0);
    cuda::StreamGuard guard(0, stream.get());
    const Tensor a = Tensor::normal({1, 64, 32}, 5, 0, 0.0, 1.0, kFloat32).to(kGpu);
    const Tensor b = Tensor::normal({1, 32, 48}, 6, 0, 0.0, 1.0, kFloat32).to(kGpu);
    Tensor out = Tensor::empty({1, 64, 48}, kFloat32, kGpu);
    backend_for(kGpu).matmul(a, b, out, 1.0, 0.0);
    EXPECT_GE(cuda::memory_stats(0).allocated_bytes, before + (int64_t{32} << 20)) << "the stream's workspace";
  }
  EXPECT_EQ(cuda::memory_stats(0).allocated_bytes, before) << "the workspace outlived its stream";
}

// out = gelu(a @ bm + bias) (tanh form) and the pre-gelu output, against CPU ops.
TEST(CudaMatmul, BiasGeluEpilogue) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  for (DType dtype : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const double tolerance = tolerance_for(dtype);
    const int64_t batch = 2, m = 48, k = 64, n = 96;
    const Tensor x = Tensor::normal({batch, m, k}, 7, 0, 0.0, 1.0, dtype);
    const Tensor w = Tensor::normal({n, k}, 8, 0, 0.0, 0.2, dtype);  // used as w^T
    const Tensor bias = Tensor::normal({n}, 9, 0, 0.0, 1.0, dtype);
    // CPU reference: pre = x @ w^T + bias, out = gelu(pre).
    Tensor pre_cpu = Tensor::empty({batch, m, n}, dtype);
    backend_for(Device::cpu()).matmul(x, w.unsqueeze(0).transpose(1, 2).expand({batch, k, n}), pre_cpu, 1.0, 0.0);
    Tensor pre_wide = pre_cpu.to(kFloat32);
    Tensor biased = Tensor::empty({batch, m, n}, kFloat32);
    backend_for(Device::cpu()).binary(BinaryOp::kAdd, pre_wide, bias.to(kFloat32).expand({batch, m, n}), biased);
    Tensor gelu_cpu = Tensor::empty({batch, m, n}, kFloat32);
    backend_for(Device::cpu()).unary(UnaryOp::kGelu, biased, gelu_cpu);

    const Tensor x_gpu = x.to(kGpu);
    const Tensor w_gpu = w.to(kGpu).unsqueeze(0).transpose(1, 2).expand({batch, k, n});
    const Tensor bias_gpu = bias.to(kGpu);
    Tensor out = poisoned({batch, m, n}, dtype), pre = poisoned({batch, m, n}, dtype);
    cuda::matmul_bias_gelu(x_gpu, w_gpu, bias_gpu, out, pre);
    EXPECT_LE(relative_l2_error(pre, biased), tolerance);
    EXPECT_LE(relative_l2_error(out, gelu_cpu), tolerance);
    Tensor out_no_aux = poisoned({batch, m, n}, dtype);
    cuda::matmul_bias_gelu(x_gpu, w_gpu, bias_gpu, out_no_aux);
    EXPECT_LE(relative_l2_error(out_no_aux, gelu_cpu), tolerance);
    Tensor plain = poisoned({batch, m, n}, dtype);
    cuda::matmul_bias(x_gpu, w_gpu, bias_gpu, plain);
    EXPECT_LE(relative_l2_error(plain, biased), tolerance);
  }
}

// Backend::matmul_bias: CUDA fuses the bias (a cuBLASLt epilogue) for one product, and takes the
// default (matmul, then add) for a batch; both against the CPU reference.
TEST(CudaMatmul, MatmulBiasMatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  for (DType dtype : {kFloat32, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const double tolerance = tolerance_for(dtype);
    for (int64_t batch : {int64_t{1}, int64_t{3}}) {
      const int64_t m = 40, k = 64, n = 96;
      const Tensor x = Tensor::normal({batch, m, k}, 17, 0, 0.0, 1.0, dtype);
      const Tensor w = Tensor::normal({n, k}, 18, 0, 0.0, 0.2, dtype);  // used as w^T, as linear does
      const Tensor bias = Tensor::normal({n}, 19, 0, 0.0, 1.0, dtype);
      Tensor expected = Tensor::empty({batch, m, n}, dtype);
      backend_for(Device::cpu()).matmul_bias(x, w.unsqueeze(0).transpose(1, 2).expand({batch, k, n}), bias, expected);
      Tensor got = poisoned({batch, m, n}, dtype);
      backend_for(kGpu).matmul_bias(x.to(kGpu), w.to(kGpu).unsqueeze(0).transpose(1, 2).expand({batch, k, n}),
                                    bias.to(kGpu), got);
      EXPECT_LE(relative_l2_error(got, expected), tolerance) << "batch " << batch;
    }
  }
}

// Sets the own Hopper products (runtime/cuda/hopper_products.h) for a test's scope, then puts back
// the ones that were on before.
class HopperProductsRestorer {
 public:
  explicit HopperProductsRestorer(unsigned products) : before_(cuda::hopper_products()) {
    cuda::set_hopper_products(products);
  }
  ~HopperProductsRestorer() { cuda::set_hopper_products(before_); }
  HopperProductsRestorer(const HopperProductsRestorer&) = delete;
  HopperProductsRestorer& operator=(const HopperProductsRestorer&) = delete;

 private:
  unsigned before_;
};

// The autotuning tests change process-wide settings: this puts them back as the process had them
// (the autotuning setting, the tuning cache's file as the environment names it, no choices kept),
// however the test ends, an ASSERT's early return included. `before` is what
// set_matmul_autotune_for_testing returned at the test's first change.
class AutotuneSettingsRestorer {
 public:
  explicit AutotuneSettingsRestorer(int before) : before_(before) {}
  ~AutotuneSettingsRestorer() {
    cuda::set_matmul_autotune_for_testing(before_);
    cuda::set_matmul_tuning_cache_for_testing(cuda::MatmulTuningCache::path_from_environment());
    cuda::forget_matmul_algorithms_for_testing();
  }
  AutotuneSettingsRestorer(const AutotuneSettingsRestorer&) = delete;
  AutotuneSettingsRestorer& operator=(const AutotuneSettingsRestorer&) = delete;

 private:
  int before_;
};

// Autotuning keeps the heuristic's bits (matmul.cu): every product autotuned gives exactly what the
// heuristic's first algorithm gives, for a plain product with a long K (where cuBLASLt offers
// split-K algorithms, whose other order of sums gives other bits), an accumulating one, and the bias,
// GELU (with its pre-activation output), GELU-backward and residual epilogues, and a product of an
// odd number of 16-bit elements. The records say each key was timed against its reference, and that
// other bits were seen and passed over.
TEST(CudaMatmul, AutotuningKeepsTheHeuristicsBits) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const DType dtype = kBFloat16;
  Backend& gpu = backend_for(kGpu);
  const Tensor long_a = Tensor::normal({1, 128, 8192}, 31, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor long_b = Tensor::normal({1, 8192, 128}, 32, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor x = Tensor::normal({1, 1024, 768}, 33, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor w = Tensor::normal({3072, 768}, 34, 0, 0.0, 0.05, dtype).to(kGpu).unsqueeze(0).transpose(1, 2);
  const Tensor bias = Tensor::normal({3072}, 35, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor dy = Tensor::normal({1, 1024, 768}, 36, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor w_down = Tensor::normal({768, 3072}, 37, 0, 0.0, 0.05, dtype).to(kGpu).unsqueeze(0);  // dY W
  const Tensor start = Tensor::normal({1, 128, 128}, 38, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor odd_a = Tensor::normal({1, 3, 8}, 39, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor odd_b = Tensor::normal({1, 8, 5}, 40, 0, 0.0, 1.0, dtype).to(kGpu);

  // Every output of one pass over the products, in a fixed order.
  auto products = [&] {
    std::vector<Tensor> outputs;
    Tensor plain = poisoned({1, 128, 128}, dtype);
    gpu.matmul(long_a, long_b, plain, 1.0, 0.0);
    outputs.push_back(plain);
    Tensor accumulated = start.clone();
    gpu.matmul(long_a, long_b, accumulated, 1.0, 1.0);
    outputs.push_back(accumulated);
    Tensor gelu = poisoned({1, 1024, 3072}, dtype), pre_gelu = poisoned({1, 1024, 3072}, dtype);
    cuda::matmul_bias_gelu(x, w, bias, gelu, pre_gelu);
    outputs.push_back(gelu);
    outputs.push_back(pre_gelu);
    Tensor biased = poisoned({1, 1024, 3072}, dtype);
    cuda::matmul_bias(x, w, bias, biased);
    outputs.push_back(biased);
    Tensor gelu_backward = poisoned({1, 1024, 3072}, dtype);
    cuda::matmul_gelu_backward(dy, w_down, pre_gelu, gelu_backward);
    outputs.push_back(gelu_backward);
    Tensor residual = poisoned({1, 1024, 3072}, dtype);
    cuda::matmul_bias_add(x, w, bias, biased, residual);
    outputs.push_back(residual);
    Tensor odd = poisoned({1, 3, 5}, dtype);  // 15 bf16 elements: words past the fingerprint's 16-byte loads
    gpu.matmul(odd_a, odd_b, odd, 1.0, 0.0);
    outputs.push_back(odd);
    return outputs;
  };

  // cuBLASLt's products only: the own Hopper products (by default every GELU product on a Hopper
  // GPU) are not autotuned, and would leave the epilogues this test is for untimed.
  const HopperProductsRestorer own_products_off(0);
  const AutotuneSettingsRestorer restorer(cuda::set_matmul_autotune_for_testing(0));
  cuda::set_matmul_tuning_cache_for_testing("");  // every key is timed here, none read from a file
  cuda::forget_matmul_algorithms_for_testing();
  const std::vector<Tensor> heuristic = products();
  const size_t records_before = cuda::matmul_autotune_records().size();
  cuda::set_matmul_autotune_for_testing(1);
  cuda::forget_matmul_algorithms_for_testing();
  const std::vector<Tensor> tuned = products();
  const std::vector<Tensor> tuned_again = products();  // the kept choices, from the cache

  ASSERT_EQ(tuned.size(), heuristic.size());
  for (size_t i = 0; i < heuristic.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(tuned[i], heuristic[i])) << "output " << i << " of the autotuned pass";
    EXPECT_TRUE(bitwise_equal(tuned_again[i], heuristic[i])) << "output " << i << " of the cached pass";
  }
  const std::vector<cuda::MatmulAutotuneRecord> records = cuda::matmul_autotune_records();
  ASSERT_GE(records.size(), records_before + 6) << "every product key with several candidates is autotuned once";
  int other_bits = 0;
  for (size_t r = records_before; r < records.size(); ++r) {
    const cuda::MatmulAutotuneRecord& record = records[r];
    SCOPED_TRACE("[" + std::to_string(record.m) + ", " + std::to_string(record.k) + "] @ [" +
                 std::to_string(record.k) + ", " + std::to_string(record.n) + "] epilogue " +
                 std::to_string(record.epilogue));
    ASSERT_FALSE(record.candidates.empty());
    EXPECT_EQ(record.candidates[0].index, 0);
    EXPECT_TRUE(record.candidates[0].same_bits) << "the heuristic's algorithm repeats itself";
    bool chosen_seen = false;
    for (const cuda::MatmulAutotuneRecord::Candidate& candidate : record.candidates) {
      if (!candidate.same_bits && !candidate.cut_short) ++other_bits;
      if (candidate.index == record.chosen) {
        chosen_seen = true;
        EXPECT_TRUE(candidate.same_bits) << "candidate " << candidate.index << " was kept with other bits";
        EXPECT_FALSE(candidate.cut_short) << "candidate " << candidate.index << " was kept after one run";
      }
    }
    EXPECT_TRUE(chosen_seen) << "the kept candidate " << record.chosen << " was timed";
  }
  EXPECT_GT(other_bits, 0) << "no candidate wrote other bits: the comparison may not compare";
}

// WEFT_MATMUL_AUTOTUNE=fastest (matmul.cu): a candidate that sums in another order may be kept, but
// only one that repeats its own bits, so the process computes the same thing at every product of
// the key; its result is the heuristic's to rounding. The choices go into the tuning cache apart
// from the default setting's: a later process of the default setting does not take them (it
// computes the heuristic's bits), a later "fastest" process does, untimed. Weight-gradient-like
// products (a long sum over rows), where split-K and stream-K candidates are offered.
TEST(CudaMatmul, FastestAutotuningKeepsACandidateThatRepeatsItsBits) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const DType dtype = kBFloat16;
  Backend& gpu = backend_for(kGpu);
  // dW = dYᵀ X at GPT-2's widths over 8,192 rows: [768, 8192] @ [8192, 768] and [768, 8192] @ [8192, 3072].
  const Tensor dy_t = Tensor::normal({1, 8192, 768}, 71, 0, 0.0, 1.0, dtype).to(kGpu).transpose(1, 2);
  const Tensor x = Tensor::normal({1, 8192, 768}, 72, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor h = Tensor::normal({1, 8192, 3072}, 73, 0, 0.0, 1.0, dtype).to(kGpu);
  auto products = [&] {
    Tensor square = poisoned({1, 768, 768}, dtype), wide = poisoned({1, 768, 3072}, dtype);
    gpu.matmul(dy_t, x, square, 1.0, 0.0);
    gpu.matmul(dy_t, h, wide, 1.0, 0.0);
    return std::vector<Tensor>{square, wide};
  };
  const std::string path = ::testing::TempDir() + "/weft_matmul_fastest_" + std::to_string(::getpid()) + ".txt";
  std::remove(path.c_str());

  const AutotuneSettingsRestorer restorer(cuda::set_matmul_autotune_for_testing(0));
  cuda::set_matmul_tuning_cache_for_testing("");
  cuda::forget_matmul_algorithms_for_testing();
  const std::vector<Tensor> heuristic = products();

  cuda::set_matmul_autotune_for_testing(3);
  cuda::set_matmul_tuning_cache_for_testing(path);  // as a first process: an empty file
  cuda::forget_matmul_algorithms_for_testing();
  const size_t records_before = cuda::matmul_autotune_records().size();
  const std::vector<Tensor> tuned = products();
  const std::vector<Tensor> tuned_again = products();  // the kept choices
  const std::vector<cuda::MatmulAutotuneRecord> records = cuda::matmul_autotune_records();
  ASSERT_EQ(records.size(), records_before + 2) << "each key is timed once";
  int repeatable_other_bits = 0;  // candidates only this setting may keep
  for (size_t r = records_before; r < records.size(); ++r) {
    const cuda::MatmulAutotuneRecord& record = records[r];
    SCOPED_TRACE("[" + std::to_string(record.m) + ", " + std::to_string(record.k) + "] @ [" +
                 std::to_string(record.k) + ", " + std::to_string(record.n) + "]");
    ASSERT_FALSE(record.candidates.empty());
    EXPECT_TRUE(record.candidates[0].same_bits && record.candidates[0].repeats);
    bool chosen_seen = false;
    for (const cuda::MatmulAutotuneRecord::Candidate& candidate : record.candidates) {
      if (!candidate.same_bits && candidate.repeats && !candidate.cut_short) ++repeatable_other_bits;
      if (candidate.index != record.chosen) continue;
      chosen_seen = true;
      EXPECT_TRUE(candidate.repeats) << "candidate " << candidate.index << " was kept without repeating its bits";
      EXPECT_FALSE(candidate.cut_short) << "candidate " << candidate.index << " was kept after one run";
    }
    EXPECT_TRUE(chosen_seen) << "the kept candidate " << record.chosen << " was timed";
  }
  EXPECT_GT(repeatable_other_bits, 0) << "no candidate with other bits was eligible: the setting changed nothing";

  cuda::set_matmul_autotune_for_testing(1);  // a later process of the default setting, same file
  cuda::set_matmul_tuning_cache_for_testing(path);
  cuda::forget_matmul_algorithms_for_testing();
  const std::vector<Tensor> keeping_bits = products();
  EXPECT_EQ(cuda::matmul_autotune_records().size(), records.size() + 2) << "the default setting times its own";

  cuda::set_matmul_autotune_for_testing(3);  // a later "fastest" process: the file's choices, untimed
  cuda::set_matmul_tuning_cache_for_testing(path);
  cuda::forget_matmul_algorithms_for_testing();
  const size_t records_reused = cuda::matmul_autotune_records().size();
  const std::vector<Tensor> reused = products();
  EXPECT_EQ(cuda::matmul_autotune_records().size(), records_reused) << "the choices came from the file";
  cuda::set_matmul_tuning_cache_for_testing("");
  std::remove(path.c_str());

  for (size_t i = 0; i < heuristic.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    EXPECT_TRUE(bitwise_equal(tuned_again[i], tuned[i])) << "the kept candidate repeats itself";
    EXPECT_TRUE(bitwise_equal(reused[i], tuned[i])) << "the file's choice is the one tuned";
    EXPECT_TRUE(bitwise_equal(keeping_bits[i], heuristic[i])) << "the default setting keeps the heuristic's bits";
    EXPECT_LE(relative_l2_error(tuned[i], heuristic[i]), 1e-2) << "the same product, summed in another order";
  }
}

// The tuning cache (matmul_tuning_cache.h): a process that finds a shape's choice in the file takes
// it without timing (no record is added) and computes the same bits as the process that tuned it
// and as the heuristic's first; a process without the file tunes again. The head-like product is
// large enough that cuBLASLt offers many candidates.
TEST(CudaMatmul, TuningCacheSkipsTheTimingAndKeepsTheBits) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const DType dtype = kBFloat16;
  Backend& gpu = backend_for(kGpu);
  const Tensor a = Tensor::normal({1, 2048, 768}, 51, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor b = Tensor::normal({1, 768, 4096}, 52, 0, 0.0, 0.05, dtype).to(kGpu);
  auto product = [&] {
    Tensor out = poisoned({1, 2048, 4096}, dtype);
    gpu.matmul(a, b, out, 1.0, 0.0);
    return out;
  };
  const std::string path = ::testing::TempDir() + "/weft_matmul_tuning_" + std::to_string(::getpid()) + ".txt";
  std::remove(path.c_str());

  const AutotuneSettingsRestorer restorer(cuda::set_matmul_autotune_for_testing(0));
  cuda::forget_matmul_algorithms_for_testing();
  const Tensor heuristic = product();
  cuda::set_matmul_autotune_for_testing(1);

  cuda::set_matmul_tuning_cache_for_testing(path);  // as a first process: an empty file
  cuda::forget_matmul_algorithms_for_testing();
  size_t records = cuda::matmul_autotune_records().size();
  const Tensor tuned = product();
  EXPECT_EQ(cuda::matmul_autotune_records().size(), records + 1) << "the first process times the candidates";

  cuda::set_matmul_tuning_cache_for_testing(path);  // as a second process: the file read anew
  cuda::forget_matmul_algorithms_for_testing();
  records = cuda::matmul_autotune_records().size();
  const Tensor reused = product();
  EXPECT_EQ(cuda::matmul_autotune_records().size(), records) << "the choice came from the file, untimed";

  cuda::set_matmul_tuning_cache_for_testing("");  // no file: timed again
  cuda::forget_matmul_algorithms_for_testing();
  records = cuda::matmul_autotune_records().size();
  const Tensor tuned_again = product();
  EXPECT_EQ(cuda::matmul_autotune_records().size(), records + 1);

  std::remove(path.c_str());
  EXPECT_TRUE(bitwise_equal(tuned, heuristic));
  EXPECT_TRUE(bitwise_equal(reused, heuristic));
  EXPECT_TRUE(bitwise_equal(tuned_again, heuristic));
}

// A product that changes nothing in its output (a zero operand: a layer initialised to zero, a zero
// gradient) cannot rank candidates by their bits, so its tuning is put off to the key's next product
// (matmul.cu), which times them on real data; after eight such products the heuristic's first stays.
// Plain and accumulating (the residual's addend as C: the output is not zero, yet the product added
// nothing to it). Every output is the heuristic's bits.
TEST(CudaMatmul, AutotuningWaitsForAProductThatChangesItsOutput) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const DType dtype = kBFloat16;
  Backend& gpu = backend_for(kGpu);
  const Tensor zero_a = Tensor::zeros({1, 2048, 768}, dtype, kGpu);
  const Tensor real_a = Tensor::normal({1, 2048, 768}, 61, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor b = Tensor::normal({1, 768, 4096}, 62, 0, 0.0, 0.05, dtype).to(kGpu);
  const Tensor w = Tensor::normal({4096, 768}, 63, 0, 0.0, 0.05, dtype).to(kGpu);  // used as w^T
  const Tensor bias = Tensor::normal({4096}, 64, 0, 0.0, 1.0, dtype).to(kGpu);
  const Tensor addend = Tensor::normal({1, 2048, 4096}, 65, 0, 0.0, 1.0, dtype).to(kGpu);
  auto product = [&](const Tensor& a) {
    Tensor out = poisoned({1, 2048, 4096}, dtype);
    gpu.matmul(a, b, out, 1.0, 0.0);
    return out;
  };
  auto residual = [&](const Tensor& a) {
    Tensor out = poisoned({1, 2048, 4096}, dtype);
    cuda::matmul_bias_add(a, w.unsqueeze(0).transpose(1, 2), bias, addend, out);
    return out;
  };
  auto new_records = [](size_t since) {
    const std::vector<cuda::MatmulAutotuneRecord> all = cuda::matmul_autotune_records();
    return std::vector<cuda::MatmulAutotuneRecord>(all.begin() + static_cast<std::ptrdiff_t>(since), all.end());
  };

  const AutotuneSettingsRestorer restorer(cuda::set_matmul_autotune_for_testing(0));
  cuda::set_matmul_tuning_cache_for_testing("");  // nothing from, nor into, a file
  cuda::forget_matmul_algorithms_for_testing();
  const Tensor heuristic_zero = product(zero_a), heuristic_real = product(real_a);
  const Tensor heuristic_residual_zero = residual(zero_a), heuristic_residual_real = residual(real_a);
  cuda::set_matmul_autotune_for_testing(1);

  for (const bool accumulating : {false, true}) {
    SCOPED_TRACE(accumulating ? "residual (beta 1)" : "plain");
    auto run = [&](const Tensor& a) { return accumulating ? residual(a) : product(a); };
    const Tensor& expected_zero = accumulating ? heuristic_residual_zero : heuristic_zero;
    const Tensor& expected_real = accumulating ? heuristic_residual_real : heuristic_real;
    cuda::forget_matmul_algorithms_for_testing();
    size_t since = cuda::matmul_autotune_records().size();
    const Tensor first_zero = run(zero_a), second_zero = run(zero_a);
    std::vector<cuda::MatmulAutotuneRecord> records = new_records(since);
    ASSERT_EQ(records.size(), 2u) << "each zero product puts the tuning off again";
    for (const cuda::MatmulAutotuneRecord& record : records) {
      EXPECT_TRUE(record.inconclusive);
      EXPECT_TRUE(record.candidates.empty());
    }
    since = cuda::matmul_autotune_records().size();
    const Tensor real = run(real_a), real_again = run(real_a);
    records = new_records(since);
    ASSERT_EQ(records.size(), 1u) << "the first real product tunes the key, once";
    EXPECT_FALSE(records[0].inconclusive);
    EXPECT_GT(records[0].candidates.size(), 1u);
    EXPECT_TRUE(bitwise_equal(first_zero, expected_zero));
    EXPECT_TRUE(bitwise_equal(second_zero, expected_zero));
    EXPECT_TRUE(bitwise_equal(real, expected_real));
    EXPECT_TRUE(bitwise_equal(real_again, expected_real));
  }

  // Eight zero products in a row: the heuristic's first stays, and real data tunes nothing more.
  cuda::set_matmul_tuning_cache_for_testing("");  // a new, empty cache: the loop above's choice forgotten
  cuda::forget_matmul_algorithms_for_testing();
  size_t since = cuda::matmul_autotune_records().size();
  for (int i = 0; i < 8; ++i) product(zero_a);
  EXPECT_EQ(new_records(since).size(), 8u);
  since = cuda::matmul_autotune_records().size();
  const Tensor settled = product(real_a);
  EXPECT_TRUE(new_records(since).empty()) << "the key settled on the heuristic's first";
  EXPECT_TRUE(bitwise_equal(settled, heuristic_real));
}

// --- Attention ----------------------------------------------------------------------------------

struct AttentionCase {
  int64_t batch, heads, seq, head_dim;
};

void check_attention(const AttentionCase& c, DType dtype, double tolerance, uint64_t seed) {
  SCOPED_TRACE("B " + std::to_string(c.batch) + " H " + std::to_string(c.heads) + " T " + std::to_string(c.seq) +
               " D " + std::to_string(c.head_dim) + " " + std::string(dtype_name(dtype)));
  const std::vector<int64_t> shape = {c.batch, c.heads, c.seq, c.head_dim};
  const std::vector<int64_t> stat_shape = {c.batch, c.heads, c.seq};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const Tensor q = Tensor::normal(shape, seed, 0, 0.0, 1.0, dtype);
  const Tensor k = Tensor::normal(shape, seed + 1, 0, 0.0, 1.0, dtype);
  const Tensor v = Tensor::normal(shape, seed + 2, 0, 0.0, 1.0, dtype);
  const Tensor grad_out = Tensor::normal(shape, seed + 3, 0, 0.0, 1.0, dtype);
  Backend& cpu = backend_for(Device::cpu());
  Backend& gpu = backend_for(kGpu);

  // Forward.
  Tensor out_cpu = Tensor::empty(shape, dtype), lse_cpu = Tensor::empty(stat_shape, kFloat32);
  cpu.attention(q, k, v, scale, out_cpu, lse_cpu);
  const Tensor q_gpu = q.to(kGpu), k_gpu = k.to(kGpu), v_gpu = v.to(kGpu);
  Tensor out_gpu = poisoned(shape, dtype), lse_gpu = poisoned(stat_shape, kFloat32);
  gpu.attention(q_gpu, k_gpu, v_gpu, scale, out_gpu, lse_gpu);
  EXPECT_LE(relative_l2_error(out_gpu, out_cpu), tolerance) << "out";
  EXPECT_LE(relative_l2_error(lse_gpu, lse_cpu), dtype == kFloat32 ? 1e-5 : 1e-3) << "lse";

  // Backward from the same out and lse (the CPU's), so that only the backward is compared.
  Tensor gq_cpu = Tensor::empty(shape, dtype), gk_cpu = Tensor::empty(shape, dtype), gv_cpu = Tensor::empty(shape, dtype);
  cpu.attention_backward(q, k, v, out_cpu, lse_cpu, grad_out, scale, gq_cpu, gk_cpu, gv_cpu);
  Tensor gq = poisoned(shape, dtype), gk = poisoned(shape, dtype), gv = poisoned(shape, dtype);
  gpu.attention_backward(q_gpu, k_gpu, v_gpu, out_cpu.to(kGpu), lse_cpu.to(kGpu), grad_out.to(kGpu), scale, gq, gk,
                         gv);
  EXPECT_LE(relative_l2_error(gq, gq_cpu), tolerance) << "grad_q";
  EXPECT_LE(relative_l2_error(gk, gk_cpu), tolerance) << "grad_k";
  EXPECT_LE(relative_l2_error(gv, gv_cpu), tolerance) << "grad_v";
}

TEST(CudaAttention, Bf16MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 1000;
  for (const AttentionCase& c : {AttentionCase{2, 3, 77, 64}, AttentionCase{1, 2, 128, 128},
                                 AttentionCase{2, 2, 200, 64}, AttentionCase{1, 1, 17, 64}, AttentionCase{1, 2, 65, 128}}) {
    check_attention(c, kBFloat16, 2e-2, seed += 10);
  }
}

TEST(CudaAttention, F16MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  check_attention({1, 2, 128, 64}, kFloat16, 2e-2, 2000);
  check_attention({2, 1, 99, 128}, kFloat16, 2e-2, 2010);
}

TEST(CudaAttention, F32MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 3000;
  for (const AttentionCase& c : {AttentionCase{2, 3, 77, 64}, AttentionCase{1, 2, 128, 128},
                                 AttentionCase{2, 2, 200, 64}, AttentionCase{1, 2, 50, 40}, AttentionCase{1, 1, 33, 1}}) {
    check_attention(c, kFloat32, 1e-4, seed += 10);
  }
}

// The flash kernels' bf16 backward under deterministic kernels (runtime/determinism.h): each key
// block's share of dQ goes to a slice of its own and the slices are summed in order, so five runs
// on the same inputs give the first run's bits; the gradients are the atomic path's up to rounding,
// and the CPU's. At GPT-2's attention shape and a grouped-query one with a padded head dim (80 in
// the 96-wide kernels, T not a multiple of the 64-row blocks).
TEST(CudaAttention, FlashBackwardUnderDeterministicKernelsGivesTheSameBitsEveryRun) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  struct Restore {
    cuda::AttentionImpl impl = cuda::attention_impl();
    bool deterministic = deterministic_kernels();
    ~Restore() {
      cuda::set_attention_impl(impl);
      set_deterministic_kernels(deterministic);
    }
  } restore;
  cuda::set_attention_impl(cuda::AttentionImpl::kFlash);
  constexpr int kRuns = 5;
  struct GroupedCase {
    int64_t batch, heads, kv_heads, seq, head_dim;
    bool against_cpu;
  };
  Backend& cpu = backend_for(Device::cpu());
  Backend& gpu = backend_for(kGpu);
  uint64_t seed = 4000;
  for (const GroupedCase& c : {GroupedCase{8, 12, 12, 1024, 64, false}, GroupedCase{2, 8, 2, 300, 80, true}}) {
    SCOPED_TRACE("B " + std::to_string(c.batch) + " H " + std::to_string(c.heads) + " KV " +
                 std::to_string(c.kv_heads) + " T " + std::to_string(c.seq) + " D " + std::to_string(c.head_dim));
    const std::vector<int64_t> shape = {c.batch, c.heads, c.seq, c.head_dim};
    const std::vector<int64_t> kv_shape = {c.batch, c.kv_heads, c.seq, c.head_dim};
    const std::vector<int64_t> stat_shape = {c.batch, c.heads, c.seq};
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    const Tensor q = Tensor::normal(shape, seed += 10, 0, 0.0, 1.0, kBFloat16);         // [B, H, T, D]
    const Tensor k = Tensor::normal(kv_shape, seed + 1, 0, 0.0, 1.0, kBFloat16);        // [B, KV, T, D]
    const Tensor v = Tensor::normal(kv_shape, seed + 2, 0, 0.0, 1.0, kBFloat16);        // [B, KV, T, D]
    const Tensor grad_out = Tensor::normal(shape, seed + 3, 0, 0.0, 1.0, kBFloat16);    // [B, H, T, D]
    const Tensor q_gpu = q.to(kGpu), k_gpu = k.to(kGpu), v_gpu = v.to(kGpu), grad_out_gpu = grad_out.to(kGpu);
    Tensor out = poisoned(shape, kBFloat16), lse = poisoned(stat_shape, kFloat32);
    gpu.attention(q_gpu, k_gpu, v_gpu, scale, out, lse);
    const auto backward = [&] {
      std::vector<Tensor> gradients = {poisoned(shape, kBFloat16), poisoned(kv_shape, kBFloat16),
                                       poisoned(kv_shape, kBFloat16)};  // dQ, dK, dV
      gpu.attention_backward(q_gpu, k_gpu, v_gpu, out, lse, grad_out_gpu, scale, gradients[0], gradients[1],
                             gradients[2]);
      return gradients;
    };
    set_deterministic_kernels(false);
    const std::vector<Tensor> atomic = backward();
    set_deterministic_kernels(true);
    const std::vector<Tensor> first = backward();
    const char* names[] = {"grad_q", "grad_k", "grad_v"};
    for (int run = 1; run < kRuns; ++run) {
      const std::vector<Tensor> again = backward();
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_TRUE(bitwise_equal(again[i], first[i])) << names[i] << ", run " << run;
      }
    }
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_LE(relative_l2_error(first[i], atomic[i]), 1e-2) << names[i] << " against the atomic path";
    }
    if (!c.against_cpu) continue;
    const Tensor out_cpu = out.to(Device::cpu()), lse_cpu = lse.to(Device::cpu());
    std::vector<Tensor> expected = {Tensor::empty(shape, kBFloat16), Tensor::empty(kv_shape, kBFloat16),
                                    Tensor::empty(kv_shape, kBFloat16)};
    cpu.attention_backward(q, k, v, out_cpu, lse_cpu, grad_out, scale, expected[0], expected[1], expected[2]);
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_LE(relative_l2_error(first[i], expected[i]), 2e-2) << names[i] << " against the CPU";
    }
  }
}

// Every head dim 1..256 runs (cuda_attention_head_dim_test); above that the error names the limit.
TEST(CudaAttention, UnsupportedHeadDimNamesTheLimit) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const Tensor q = Tensor::zeros({1, 1, 8, 320}, kBFloat16, kGpu);
  const Tensor lse = Tensor::empty({1, 1, 8}, kFloat32, kGpu);
  try {
    backend_for(kGpu).attention(q, q, q, 1.0, Tensor::empty({1, 1, 8, 320}, kBFloat16, kGpu), lse);
    FAIL() << "expected weft::Error";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("head dim 320"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("at most 256"), std::string::npos) << error.what();
  }
}

#else  // !WEFT_HAVE_CUDA

TEST(CudaMatmulAttention, SkippedWithoutCuda) { GTEST_SKIP() << "weft was built without CUDA"; }

#endif

}  // namespace
}  // namespace weft
