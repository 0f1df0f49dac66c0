// cuDNN's fused causal attention (runtime/cuda/cudnn_attention.h) against the CPU reference and
// against weft's flash kernels, and the WEFT_ATTENTION switch of CudaBackend::attention.
//
// The cuDNN entry points are called directly, so a silent fallback to the flash kernels cannot pass
// for cuDNN: a call that cuDNN refuses fails the test with the reason. Outputs are poisoned with NaN
// first. Skipped without a GPU, and without cuDNN in the build.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/determinism.h"
#include "runtime/error.h"
#include "runtime/tensor.h"
#include "tests/support/cuda_expectations.h"

#ifdef WEFT_HAVE_CUDA
#include "runtime/cuda/cudnn_attention.h"
#endif

namespace weft {
namespace {

#ifdef WEFT_HAVE_CUDA

using testing::poisoned;
using testing::relative_l2_error;

#define SKIP_WITHOUT_CUDNN()                                                                      \
  do {                                                                                            \
    WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");                                   \
    if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "weft was built without cuDNN";           \
  } while (0)

const Device kGpu = Device::cuda(0);

double max_abs_error(const Tensor& actual, const Tensor& expected) {
  const std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  EXPECT_EQ(a.size(), e.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < e.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::abs(a[i] - e[i]));
  }
  return worst;
}

// Restores the attention implementation a test changed.
struct ImplGuard {
  cuda::AttentionImpl saved = cuda::attention_impl();
  ~ImplGuard() { cuda::set_attention_impl(saved); }
};

// Restores the deterministic-kernels setting a test changed.
struct DeterministicGuard {
  bool saved = deterministic_kernels();
  ~DeterministicGuard() { set_deterministic_kernels(saved); }
};

struct Case {
  int64_t batch, heads, seq, head_dim;
};

std::string describe(const Case& c, DType dtype) {
  return "B " + std::to_string(c.batch) + " H " + std::to_string(c.heads) + " T " + std::to_string(c.seq) + " D " +
         std::to_string(c.head_dim) + " " + std::string(dtype_name(dtype));
}

struct Inputs {
  std::vector<int64_t> shape, stat_shape;
  double scale;
  Tensor q, k, v, grad_out;              // CPU
  Tensor q_gpu, k_gpu, v_gpu, grad_out_gpu;
};

Inputs make_inputs(const Case& c, DType dtype, uint64_t seed) {
  Inputs in;
  in.shape = {c.batch, c.heads, c.seq, c.head_dim};
  in.stat_shape = {c.batch, c.heads, c.seq};
  in.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  in.q = Tensor::normal(in.shape, seed, 0, 0.0, 1.0, dtype);
  in.k = Tensor::normal(in.shape, seed + 1, 0, 0.0, 1.0, dtype);
  in.v = Tensor::normal(in.shape, seed + 2, 0, 0.0, 1.0, dtype);
  in.grad_out = Tensor::normal(in.shape, seed + 3, 0, 0.0, 1.0, dtype);
  in.q_gpu = in.q.to(kGpu);
  in.k_gpu = in.k.to(kGpu);
  in.v_gpu = in.v.to(kGpu);
  in.grad_out_gpu = in.grad_out.to(kGpu);
  return in;
}

// cuDNN forward and backward (called directly) against the CPU backend.
void check_against_cpu(const Case& c, DType dtype, uint64_t seed) {
  SCOPED_TRACE(describe(c, dtype));
  const Inputs in = make_inputs(c, dtype, seed);
  Backend& cpu = backend_for(Device::cpu());
  const DType io = dtype;

  Tensor out_cpu = Tensor::empty(in.shape, io), lse_cpu = Tensor::empty(in.stat_shape, kFloat32);
  cpu.attention(in.q, in.k, in.v, in.scale, out_cpu, lse_cpu);
  Tensor out = poisoned(in.shape, io), lse = poisoned(in.stat_shape, kFloat32);
  ASSERT_TRUE(cuda::cudnn_attention_forward(in.q_gpu, in.k_gpu, in.v_gpu, in.scale, out, lse))
      << "cuDNN refused the forward: " << cuda::cudnn_attention_last_error();
  EXPECT_LE(relative_l2_error(out, out_cpu), 2e-2) << "out";
  EXPECT_LE(max_abs_error(lse, lse_cpu), 1e-3) << "lse (max abs)";

  // Backward from the CPU's out and lse, so that only the backward is compared.
  Tensor gq_cpu = Tensor::empty(in.shape, io), gk_cpu = Tensor::empty(in.shape, io),
         gv_cpu = Tensor::empty(in.shape, io);
  cpu.attention_backward(in.q, in.k, in.v, out_cpu, lse_cpu, in.grad_out, in.scale, gq_cpu, gk_cpu, gv_cpu);
  Tensor gq = poisoned(in.shape, io), gk = poisoned(in.shape, io), gv = poisoned(in.shape, io);
  ASSERT_TRUE(cuda::cudnn_attention_backward(in.q_gpu, in.k_gpu, in.v_gpu, out_cpu.to(kGpu), lse_cpu.to(kGpu),
                                             in.grad_out_gpu, in.scale, gq, gk, gv))
      << "cuDNN refused the backward: " << cuda::cudnn_attention_last_error();
  EXPECT_LE(relative_l2_error(gq, gq_cpu), 2e-2) << "grad_q";
  EXPECT_LE(relative_l2_error(gk, gk_cpu), 2e-2) << "grad_k";
  EXPECT_LE(relative_l2_error(gv, gv_cpu), 2e-2) << "grad_v";
}

TEST(CudnnAttention, Bf16MatchesCpu) {
  SKIP_WITHOUT_CUDNN();
  DeterministicGuard guard;
  for (const bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic selection" : "default selection");
    set_deterministic_kernels(deterministic);
    uint64_t seed = 5000;
    for (const Case& c : {Case{2, 3, 77, 64}, Case{1, 2, 128, 128}, Case{2, 2, 200, 64}}) {
      check_against_cpu(c, kBFloat16, seed += 10);
    }
  }
}

TEST(CudnnAttention, F16MatchesCpu) {
  SKIP_WITHOUT_CUDNN();
  check_against_cpu({1, 2, 128, 64}, kFloat16, 6000);
  check_against_cpu({2, 1, 99, 128}, kFloat16, 6010);
}

// The cuDNN path and the flash path, each through CudaBackend with WEFT_ATTENTION's switch set.
TEST(CudnnAttention, MatchesFlashThroughTheBackend) {
  SKIP_WITHOUT_CUDNN();
  ImplGuard guard;
  Backend& gpu = backend_for(kGpu);
  uint64_t seed = 7000;
  for (const Case& c : {Case{2, 3, 77, 64}, Case{1, 2, 128, 128}, Case{2, 2, 200, 64}}) {
    SCOPED_TRACE(describe(c, kBFloat16));
    const Inputs in = make_inputs(c, kBFloat16, seed += 10);
    struct Result {
      Tensor out, lse, gq, gk, gv;
    };
    auto run = [&](cuda::AttentionImpl impl) {
      cuda::set_attention_impl(impl);
      Result r{poisoned(in.shape, kBFloat16), poisoned(in.stat_shape, kFloat32), poisoned(in.shape, kBFloat16),
               poisoned(in.shape, kBFloat16), poisoned(in.shape, kBFloat16)};
      gpu.attention(in.q_gpu, in.k_gpu, in.v_gpu, in.scale, r.out, r.lse);
      gpu.attention_backward(in.q_gpu, in.k_gpu, in.v_gpu, r.out, r.lse, in.grad_out_gpu, in.scale, r.gq, r.gk, r.gv);
      return r;
    };
    const Result flash = run(cuda::AttentionImpl::kFlash);
    const Result cudnn = run(cuda::AttentionImpl::kCudnn);
    EXPECT_LE(relative_l2_error(cudnn.out, flash.out), 2e-2) << "out";
    EXPECT_LE(max_abs_error(cudnn.lse, flash.lse), 1e-3) << "lse (max abs)";
    EXPECT_LE(relative_l2_error(cudnn.gq, flash.gq), 2e-2) << "grad_q";
    EXPECT_LE(relative_l2_error(cudnn.gk, flash.gk), 2e-2) << "grad_k";
    EXPECT_LE(relative_l2_error(cudnn.gv, flash.gv), 2e-2) << "grad_v";

    // The backend's cuDNN dispatch ran cuDNN: the same call made directly gives the same bits.
    Tensor out = poisoned(in.shape, kBFloat16), lse = poisoned(in.stat_shape, kFloat32);
    ASSERT_TRUE(cuda::cudnn_attention_forward(in.q_gpu, in.k_gpu, in.v_gpu, in.scale, out, lse))
        << cuda::cudnn_attention_last_error();
    EXPECT_EQ(relative_l2_error(out, cudnn.out), 0.0) << "backend dispatch did not run cuDNN";
  }
}

// The layer's layout (layers/attention.cc): q, k, v are the heads of one [B, T, 3 * H * D]
// projection and the output and gradients are stored in [B, T, H, D] order. cuDNN reads and writes
// these views in place (called directly here, so a refusal fails); flash runs on contiguous copies,
// so its results must be the contiguous call's bits.
TEST(CudnnAttention, StridedViewsMatchContiguousTensors) {
  SKIP_WITHOUT_CUDNN();
  ImplGuard guard;
  Backend& gpu = backend_for(kGpu);
  for (const Case& c : {Case{2, 3, 77, 64}, Case{1, 2, 130, 128}}) {
    SCOPED_TRACE(describe(c, kBFloat16));
    const int64_t batch = c.batch, heads = c.heads, seq = c.seq, dim = c.head_dim;
    const std::vector<int64_t> shape = {batch, heads, seq, dim}, stat_shape = {batch, heads, seq};
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    const Tensor qkv = Tensor::normal({batch, seq, 3 * heads * dim}, 8100, 0, 0.0, 1.0, kBFloat16).to(kGpu);
    const auto part = [&](int index) {  // [B, H, T, D] view with strides (T * 3HD, D, 3HD, 1)
      return qkv.narrow(2, index * heads * dim, heads * dim).reshape({batch, seq, heads, dim}).permute({0, 2, 1, 3});
    };
    const Tensor q = part(0), k = part(1), v = part(2);
    ASSERT_FALSE(q.is_contiguous());
    ASSERT_EQ(q.stride(2), 3 * heads * dim);
    const Tensor grad_out =
        Tensor::normal({batch, seq, heads, dim}, 8101, 0, 0.0, 1.0, kBFloat16).to(kGpu).permute({0, 2, 1, 3});
    const auto heads_last = [&] { return poisoned({batch, seq, heads, dim}, kBFloat16).permute({0, 2, 1, 3}); };

    for (const cuda::AttentionImpl impl : {cuda::AttentionImpl::kFlash, cuda::AttentionImpl::kCudnn}) {
      SCOPED_TRACE(cuda::attention_impl_name(impl));
      cuda::set_attention_impl(impl);
      Tensor out = poisoned(shape, kBFloat16), lse = poisoned(stat_shape, kFloat32);
      Tensor gq = poisoned(shape, kBFloat16), gk = poisoned(shape, kBFloat16), gv = poisoned(shape, kBFloat16);
      gpu.attention(q.contiguous(), k.contiguous(), v.contiguous(), scale, out, lse);
      gpu.attention_backward(q.contiguous(), k.contiguous(), v.contiguous(), out, lse, grad_out.contiguous(), scale,
                             gq, gk, gv);
      Tensor out_view = heads_last(), lse_view = poisoned(stat_shape, kFloat32);
      Tensor gq_view = heads_last(), gk_view = heads_last(), gv_view = heads_last();
      gpu.attention(q, k, v, scale, out_view, lse_view);
      gpu.attention_backward(q, k, v, out_view, lse_view, grad_out, scale, gq_view, gk_view, gv_view);
      // cuDNN may pick another engine for other strides; flash sees the same contiguous bits.
      const double tolerance = impl == cuda::AttentionImpl::kFlash ? 0.0 : 2e-2;
      EXPECT_LE(relative_l2_error(out_view, out), tolerance) << "out";
      EXPECT_LE(max_abs_error(lse_view, lse), impl == cuda::AttentionImpl::kFlash ? 0.0 : 1e-3) << "lse";
      EXPECT_LE(relative_l2_error(gq_view, gq), tolerance) << "grad_q";
      EXPECT_LE(relative_l2_error(gk_view, gk), tolerance) << "grad_k";
      EXPECT_LE(relative_l2_error(gv_view, gv), tolerance) << "grad_v";
    }
    Tensor out_view = heads_last(), lse_view = poisoned(stat_shape, kFloat32);
    EXPECT_TRUE(cuda::cudnn_attention_forward(q, k, v, scale, out_view, lse_view))
        << "cuDNN refused the strided views: " << cuda::cudnn_attention_last_error();
    Tensor gq_view = heads_last(), gk_view = heads_last(), gv_view = heads_last();
    EXPECT_TRUE(cuda::cudnn_attention_backward(q, k, v, out_view, lse_view, grad_out, scale, gq_view, gk_view, gv_view))
        << "cuDNN refused the strided views: " << cuda::cudnn_attention_last_error();
  }
}

// The deterministic selection (runtime/determinism.h): the engine that runs the backward
// carries no NONDETERMINISTIC note, five runs on the same inputs give the first run's bits, and
// they are the default selection's gradients up to rounding, at GPT-2's attention shape and a
// grouped-query one. How many of the default selection's runs differed is printed beside: its dQ
// is summed with atomics, and cuDNN does not mark its engine (on an H100 with cuDNN 9.19, engine 6
// had no note and 1 run in 4 differed at GPT-2's shape), so nothing is asserted of it.
TEST(CudnnAttention, DeterministicBackwardGivesTheSameBitsEveryRun) {
  SKIP_WITHOUT_CUDNN();
  DeterministicGuard guard;
  constexpr int kRuns = 5;
  struct GroupedCase {
    int64_t batch, heads, kv_heads, seq, head_dim;
  };
  uint64_t seed = 9000;
  for (const GroupedCase& c : {GroupedCase{8, 12, 12, 1024, 64}, GroupedCase{2, 16, 8, 512, 128}}) {
    const std::string name = "B " + std::to_string(c.batch) + " H " + std::to_string(c.heads) + " KV " +
                             std::to_string(c.kv_heads) + " T " + std::to_string(c.seq) + " D " +
                             std::to_string(c.head_dim);
    SCOPED_TRACE(name);
    const std::vector<int64_t> shape = {c.batch, c.heads, c.seq, c.head_dim};
    const std::vector<int64_t> kv_shape = {c.batch, c.kv_heads, c.seq, c.head_dim};
    const std::vector<int64_t> stat_shape = {c.batch, c.heads, c.seq};
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    const Tensor q = Tensor::normal(shape, seed += 10, 0, 0.0, 1.0, kBFloat16).to(kGpu);     // [B, H, T, D]
    const Tensor k = Tensor::normal(kv_shape, seed + 1, 0, 0.0, 1.0, kBFloat16).to(kGpu);    // [B, KV, T, D]
    const Tensor v = Tensor::normal(kv_shape, seed + 2, 0, 0.0, 1.0, kBFloat16).to(kGpu);    // [B, KV, T, D]
    const Tensor grad_out = Tensor::normal(shape, seed + 3, 0, 0.0, 1.0, kBFloat16).to(kGpu);  // [B, H, T, D]
    const Tensor out = poisoned(shape, kBFloat16), lse = poisoned(stat_shape, kFloat32);
    ASSERT_TRUE(cuda::cudnn_attention_forward(q, k, v, scale, out, lse)) << cuda::cudnn_attention_last_error();
    std::vector<Tensor> default_gradients;
    for (const bool deterministic : {false, true}) {
      set_deterministic_kernels(deterministic);
      std::vector<Tensor> first;
      int differed = 0;
      cuda::CudnnEngineChoice engine;
      for (int run = 0; run < kRuns; ++run) {
        const std::vector<Tensor> gradients = {poisoned(shape, kBFloat16), poisoned(kv_shape, kBFloat16),
                                               poisoned(kv_shape, kBFloat16)};  // dQ, dK, dV
        ASSERT_TRUE(cuda::cudnn_attention_backward(q, k, v, out, lse, grad_out, scale, gradients[0], gradients[1],
                                                   gradients[2]))
            << (deterministic ? "deterministic" : "default") << " selection: " << cuda::cudnn_attention_last_error();
        engine = cuda::cudnn_attention_last_engine();
        if (run == 0) {
          first = gradients;
          continue;
        }
        bool same = true;
        for (size_t i = 0; i < gradients.size(); ++i) same = same && testing::bitwise_equal(gradients[i], first[i]);
        differed += same ? 0 : 1;
      }
      std::printf("  %s, %s selection: engine %lld (%s%s): %d of %d runs differed from the first\n", name.c_str(),
                  deterministic ? "deterministic" : "default", static_cast<long long>(engine.engine),
                  engine.chosen.c_str(), engine.nondeterministic ? ", nondeterministic" : "", differed, kRuns - 1);
      if (!deterministic) {
        default_gradients = first;
        continue;
      }
      EXPECT_FALSE(engine.nondeterministic) << "the deterministic selection ran engine " << engine.engine;
      EXPECT_EQ(differed, 0) << "deterministic selection, engine " << engine.engine;
      const char* names[] = {"grad_q", "grad_k", "grad_v"};
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_LE(relative_l2_error(first[i], default_gradients[i]), 1e-2) << names[i] << " against the default";
      }
    }
  }
}

TEST(CudnnAttention, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_CUDNN();
  const Tensor q = Tensor::zeros({1, 1, 8, 64}, kFloat32, kGpu);
  const Tensor lse = Tensor::empty({1, 1, 8}, kFloat32, kGpu);
  EXPECT_FALSE(cuda::cudnn_attention_forward(q, q, q, 1.0, Tensor::empty({1, 1, 8, 64}, kFloat32, kGpu), lse));
  EXPECT_NE(cuda::cudnn_attention_last_error().find("f32"), std::string::npos) << cuda::cudnn_attention_last_error();
}

TEST(AttentionSwitch, NamesAndOverride) {
  ImplGuard guard;
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::kFlash), "flash");
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::kCudnn), "cudnn");
  EXPECT_STREQ(cuda::attention_impl_name(cuda::AttentionImpl::kAuto), "auto");
  cuda::set_attention_impl(cuda::AttentionImpl::kFlash);
  EXPECT_EQ(cuda::attention_impl(), cuda::AttentionImpl::kFlash);
}

#else  // !WEFT_HAVE_CUDA

TEST(CudnnAttention, SkippedWithoutCuda) { GTEST_SKIP() << "weft was built without CUDA"; }

#endif

}  // namespace
}  // namespace weft
