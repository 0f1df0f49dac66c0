// The CPU backend's threading and vectorization (runtime/cpu/parallel_for.h, thread_pool.h,
// vectorized.h): weft's own kernels give bit-for-bit the same results on one thread as on several
// (each row or head is one thread's), strided and broadcast views through the row walker give what
// an element-by-element loop gives, the pool size set once holds on every thread, and the
// vectorizable exp stays within 2 ulp of std::exp, and signals handled while GEMMs run do not
// corrupt the heap (runtime/cpu/deferred_signals.h). OpenBLAS's GEMMs, which run on the calling
// thread (gemm.cc), give the same bits at every pool size too. Shapes are large enough that the kernels do
// split their work (parallel_for skips the split below about 32k operations per thread).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/parallel_for.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/cpu/vectorized.h"
#include "runtime/error.h"
#include "runtime/optimizer_update.h"
#include "runtime/tensor.h"

namespace weft {
namespace {

// Restores the pool size a test changed.
class CpuKernelThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override { original_threads_ = cpu::thread_count(); }
  void TearDown() override { cpu::set_thread_count(original_threads_); }

  // Runs `kernels` (which writes into the tensors it returns) at `threads` threads.
  static std::vector<Tensor> run_at(int threads, const std::function<std::vector<Tensor>()>& kernels) {
    cpu::set_thread_count(threads);
    return kernels();
  }

  static void expect_bitwise_equal(const std::vector<Tensor>& one, const std::vector<Tensor>& several) {
    ASSERT_EQ(one.size(), several.size());
    for (size_t i = 0; i < one.size(); ++i) {
      const Tensor a = one[i].contiguous(), b = several[i].contiguous();
      ASSERT_EQ(a.shape(), b.shape()) << "output " << i;
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel() * a.element_size())), 0)
          << "output " << i << " (" << a.describe() << ") differs between one thread and four";
    }
  }

 private:
  int original_threads_ = 1;
};

TEST_F(CpuKernelThreadsTest, AttentionForwardAndBackwardDoNotDependOnTheThreadCount) {
  // [B, H, T, D] with grouped kv heads, T not a multiple of the query block.
  const Tensor q = Tensor::normal({2, 4, 150, 24}, 1), k = Tensor::normal({2, 2, 150, 24}, 2),
               v = Tensor::normal({2, 2, 150, 24}, 3), grad_out = Tensor::normal({2, 4, 150, 24}, 4);
  auto kernels = [&] {
    Tensor out = Tensor::empty(q.shape()), lse = Tensor::empty({2, 4, 150});
    Tensor grad_q = Tensor::empty(q.shape()), grad_k = Tensor::empty(k.shape()), grad_v = Tensor::empty(v.shape());
    cpu_backend().attention(q, k, v, 0.2, out, lse);
    cpu_backend().attention_backward(q, k, v, out, lse, grad_out, 0.2, grad_q, grad_k, grad_v);
    return std::vector<Tensor>{out, lse, grad_q, grad_k, grad_v};
  };
  expect_bitwise_equal(run_at(1, kernels), run_at(4, kernels));
}

TEST_F(CpuKernelThreadsTest, RowKernelsDoNotDependOnTheThreadCount) {
  const Tensor x = Tensor::normal({300, 257}, 5), grad = Tensor::normal({300, 257}, 6);
  const Tensor weight = Tensor::normal({257}, 7), bias = Tensor::normal({257}, 8);
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>(300, 3), {300});
  auto kernels = [&] {
    Tensor norm = Tensor::empty(x.shape()), mean = Tensor::empty({300}), rstd = Tensor::empty({300});
    Tensor grad_x = Tensor::empty(x.shape()), grad_weight = Tensor::empty({257}), grad_bias = Tensor::empty({257});
    cpu_backend().layer_norm(x, weight, bias, 1e-5, norm, mean, rstd);
    cpu_backend().layer_norm_backward(x, weight, mean, rstd, grad, grad_x, grad_weight, grad_bias, {});
    Tensor rms = Tensor::empty(x.shape()), rms_rstd = Tensor::empty({300});
    Tensor rms_grad_x = Tensor::empty(x.shape()), rms_grad_weight = Tensor::empty({257});
    cpu_backend().rms_norm(x, weight, 1e-5, rms, rms_rstd);
    cpu_backend().rms_norm_backward(x, weight, rms_rstd, grad, rms_grad_x, rms_grad_weight, {});
    Tensor gelu = Tensor::empty(x.shape()), gelu_grad = Tensor::empty(x.shape());
    cpu_backend().unary(UnaryOp::kGelu, x, gelu);
    cpu_backend().unary_backward(UnaryOp::kGelu, x, grad, gelu_grad);
    Tensor softmax = Tensor::empty(x.shape()), softmax_grad = Tensor::empty(x.shape());
    cpu_backend().softmax(x, softmax, false);
    cpu_backend().softmax_backward(softmax, grad, softmax_grad, false);
    Tensor losses = Tensor::empty({300}), lse = Tensor::empty({300}), logits_grad = Tensor::empty(x.shape());
    cpu_backend().cross_entropy(x, targets, -100, losses, lse);
    cpu_backend().cross_entropy_backward(x, targets, lse, -100, Tensor::ones({300}), logits_grad);
    return std::vector<Tensor>{norm, mean, rstd, grad_x, grad_weight, grad_bias, rms, rms_rstd, rms_grad_x,
                               rms_grad_weight, gelu, gelu_grad, softmax, softmax_grad, losses, lse, logits_grad};
  };
  expect_bitwise_equal(run_at(1, kernels), run_at(4, kernels));
}

TEST_F(CpuKernelThreadsTest, AdamWDoesNotDependOnTheThreadCount) {
  const Tensor start = Tensor::normal({70000}, 9), grad = Tensor::normal({70000}, 10);
  auto kernels = [&] {
    AdamWTensorUpdate update;
    update.parameter = start.clone();
    update.grad = grad;
    update.exp_avg = Tensor::full({70000}, 0.01);
    update.exp_avg_sq = Tensor::full({70000}, 0.02);
    update.step_size = 1e-3;
    update.bias_correction2_sqrt = 0.3;
    update.decay = 0.999;
    cpu_backend().adamw_update({update}, AdamWHyperparameters{});
    return std::vector<Tensor>{update.parameter, update.exp_avg, update.exp_avg_sq};
  };
  expect_bitwise_equal(run_at(1, kernels), run_at(4, kernels));
}

// cpu::gemm over OpenBLAS (f64 always; f32 where weft was built without oneDNN) runs on the calling
// thread whatever the pool's size (an OpenBLAS pool beside it spun against it; splitting a call
// over the pool changed bits with the size): every transpose, a wide C and a tall one, leading
// dimensions above the widths, and beta on an existing C give the same bits at 1, 2 and 3 threads,
// and a triple loop's result to rounding.
template <class Scalar>
void expect_split_gemms_match(double tolerance) {
  struct Case {
    bool transpose_a, transpose_b;
    int64_t m, n, k;
  };
  const Case cases[] = {{false, false, 97, 40, 33}, {true, false, 64, 70, 19}, {false, true, 5, 300, 48},
                        {true, true, 150, 9, 65}, {false, false, 1, 257, 31}};
  for (const Case& c : cases) {
    const int64_t pad = 3;  // leading dimensions wider than the matrices
    const int64_t a_rows = c.transpose_a ? c.k : c.m, a_columns = c.transpose_a ? c.m : c.k;
    const int64_t b_rows = c.transpose_b ? c.n : c.k, b_columns = c.transpose_b ? c.k : c.n;
    const int64_t lda = a_columns + pad, ldb = b_columns + pad, ldc = c.n + pad;
    std::vector<Scalar> a(static_cast<size_t>(a_rows * lda)), b(static_cast<size_t>(b_rows * ldb)),
        start(static_cast<size_t>(c.m * ldc));
    uint32_t state = 12345;
    auto next = [&] {
      state = state * 1664525u + 1013904223u;
      return static_cast<Scalar>(static_cast<double>(state >> 8) / (1 << 24) - 0.5);
    };
    for (Scalar& x : a) x = next();
    for (Scalar& x : b) x = next();
    for (Scalar& x : start) x = next();
    std::vector<std::vector<Scalar>> results;
    for (int threads : {1, 2, 3}) {
      cpu::set_thread_count(threads);
      std::vector<Scalar> out = start;
      cpu::gemm(c.transpose_a, c.transpose_b, c.m, c.n, c.k, Scalar(0.75), a.data(), lda, b.data(), ldb, Scalar(0.5),
                out.data(), ldc);
      results.push_back(out);
    }
    const std::string name = str(c.transpose_a ? "A^T" : "A", " x ", c.transpose_b ? "B^T" : "B", ", ", c.m, " x ", c.n,
                                 " x ", c.k);
    EXPECT_EQ(results[0], results[1]) << name << ": 1 and 2 threads differ";
    EXPECT_EQ(results[0], results[2]) << name << ": 1 and 3 threads differ";
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double x = c.transpose_a ? a[p * lda + i] : a[i * lda + p];
          const double y = c.transpose_b ? b[j * ldb + p] : b[p * ldb + j];
          sum += x * y;
        }
        const double expected = 0.75 * sum + 0.5 * start[i * ldc + j];
        ASSERT_NEAR(results[1][i * ldc + j], expected, tolerance) << name << " at (" << i << ", " << j << ")";
      }
      // The padding between rows is never written.
      for (int64_t j = c.n; j < ldc; ++j) ASSERT_EQ(results[2][i * ldc + j], start[i * ldc + j]) << name;
    }
  }
}

TEST_F(CpuKernelThreadsTest, OpenBlasGemmsDoNotDependOnTheThreadCount) {
  expect_split_gemms_match<double>(1e-12);
  if (std::string(cpu::f32_gemm_library()) == "OpenBLAS") expect_split_gemms_match<float>(1e-4);
}

TEST_F(CpuKernelThreadsTest, StridedAndBroadcastElementwiseMatchesAnElementLoop) {
  cpu::set_thread_count(4);
  // a: a transposed [400, 300] view; b: a [300] row broadcast over the 400 rows; out contiguous.
  const Tensor a = Tensor::normal({300, 400}, 11).transpose(0, 1);
  const Tensor b = Tensor::normal({300}, 12).expand({400, 300});
  Tensor out = Tensor::empty({400, 300});
  cpu_backend().binary(BinaryOp::kMul, a, b, out);
  Tensor gelu = Tensor::empty({400, 300});
  cpu_backend().unary(UnaryOp::kGelu, a, gelu);
  const Tensor a_copy = a.contiguous(), b_copy = b.contiguous();
  for (int64_t r = 0; r < 400; r += 37) {
    for (int64_t c = 0; c < 300; c += 13) {
      const float x = a_copy.data<float>()[r * 300 + c];
      const float y = b_copy.data<float>()[r * 300 + c];
      EXPECT_EQ(out.data<float>()[r * 300 + c], x * y) << "at [" << r << ", " << c << "]";
      const double expected_gelu = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
      EXPECT_NEAR(gelu.data<float>()[r * 300 + c], expected_gelu, 1e-6 * (1.0 + std::fabs(expected_gelu)));
    }
  }
}

TEST_F(CpuKernelThreadsTest, AnErrorInOneChunkReachesTheCaller) {
  cpu::set_thread_count(4);
  std::atomic<int> chunks{0};
  EXPECT_THROW(cpu::parallel_for(1000, 1000, [&](int64_t begin, int64_t end) {
                 ++chunks;
                 if (begin == 0) WEFT_FAIL("the first chunk fails");
               }),
               Error);
  EXPECT_EQ(chunks.load(), 4) << "every chunk runs to its end before the error is rethrown";
}

TEST_F(CpuKernelThreadsTest, ThePoolSizeHoldsOnEveryThread) {
  cpu::set_thread_count(3);
  int seen_elsewhere = 0;
  std::thread other([&] { seen_elsewhere = cpu::thread_count(); });
  other.join();
  EXPECT_EQ(cpu::thread_count(), 3);
  EXPECT_EQ(seen_elsewhere, 3);
}

std::atomic<int> signals_handled{0};
void count_signal(int) { signals_handled.fetch_add(1, std::memory_order_relaxed); }

// oneDNN 2.x's AVX-512 GEMM kernel keeps its stack pointer in a heap buffer: a signal handled on a
// thread running it wrote the handler's frame over the heap, and a later free aborted. Thousands of
// handled signals sent to the process while two threads multiply; the products must be right and
// the allocator intact afterwards.
TEST_F(CpuKernelThreadsTest, SignalsHandledDuringGemmsLeaveTheHeapIntact) {
  cpu::set_thread_count(2);
  struct sigaction action {}, previous {};
  action.sa_handler = count_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ASSERT_EQ(sigaction(SIGUSR1, &action, &previous), 0);
  const Tensor a = Tensor::normal({384, 256}, 13), b = Tensor::normal({256, 320}, 14);
  Tensor expected = Tensor::empty({1, 384, 320});
  cpu_backend().matmul(a.view({1, 384, 256}), b.view({1, 256, 320}), expected, 1.0, 0.0);
  std::atomic<bool> done{false};
  std::thread sender([&] {
    while (!done.load()) {
      kill(getpid(), SIGUSR1);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  int mismatches = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1500)) {
    Tensor product = Tensor::empty({1, 384, 320});
    cpu_backend().matmul(a.view({1, 384, 256}), b.view({1, 256, 320}), product, 1.0, 0.0);
    if (std::memcmp(product.raw_data(), expected.raw_data(), 384 * 320 * sizeof(float)) != 0) ++mismatches;
    std::vector<std::vector<char>> churn(64);  // allocations the corrupted heap would fail on
    for (auto& block : churn) block.resize(4096 + 17);
  }
  done.store(true);
  sender.join();
  sigaction(SIGUSR1, &previous, nullptr);
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(signals_handled.load(), 1000) << "too few signals were handled for the test to mean anything";
}

TEST(VectorizableExp, IsWithinTwoUlpOfStdExpAndSaturatesAtTheEnds) {
  double worst = 0.0;
  float worst_at = 0.0f;
  // About 1.75 million points over the whole range, plus the integers and the points near 0.
  std::vector<float> points;
  for (double x = -87.0; x <= 88.0; x += 1e-4) points.push_back(static_cast<float>(x));
  for (int x = -87; x <= 88; ++x) points.push_back(static_cast<float>(x));
  for (float x = -1e-3f; x <= 1e-3f; x += 1e-6f) points.push_back(x);
  for (const float x : points) {
    const float expected = std::exp(x), got = cpu::vectorizable_exp(x);
    const double ulp = std::nextafter(expected, INFINITY) - expected;
    const double error = std::fabs(static_cast<double>(got) - static_cast<double>(expected)) / ulp;
    if (error > worst) {
      worst = error;
      worst_at = x;
    }
  }
  EXPECT_LE(worst, 2.0) << "worst at x = " << worst_at;
  EXPECT_EQ(cpu::vectorizable_exp(0.0f), 1.0f);
  EXPECT_EQ(cpu::vectorizable_exp(-100.0f), 0.0f);
  EXPECT_EQ(cpu::vectorizable_exp(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::vectorizable_exp(100.0f), cpu::vectorizable_exp(88.0f));
  EXPECT_TRUE(std::isfinite(cpu::vectorizable_exp(100.0f)));
}

}  // namespace
}  // namespace weft
