// CUDA causal attention at any head dim and with grouped-query attention (k, v with KV < H heads),
// on each path against the CPU backend: cuDNN (called directly, so a silent fallback cannot pass
// for it), the flash kernels (bf16, through CudaBackend with the switch set to flash; head dims
// that are not tile widths run zero-padded), and the f32 simple kernels. Forward (out, lse) and
// backward (dq, dk, dv; dk, dv summed over each kv head's group) on the same inputs, which are
// rounded to the dtype under test so that the CPU reference in f32 measures only the GPU's error.
// Then the limits (head dim above 256 is a clear error; cuDNN refuses a head dim that is no
// multiple of 8 and the backend falls back), and llama-tiny's shape (head dim 16, GQA 4/2) training
// a few steps on CUDA bf16. Skipped without a GPU (and the cuDNN cases without cuDNN).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/trainer.h"
#include "runtime/backend.h"
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
using testing::random_input;
using testing::relative_l2_error;

const Device kGpu = Device::cuda(0);

// The head dims of issue #16's list: GPT-2's 64, Llama's 128, llama-tiny's 16, and the others.
const std::vector<int64_t> kHeadDims = {16, 32, 64, 80, 96, 128, 256};

// Restores the attention implementation a test changed.
struct ImplGuard {
  cuda::AttentionImpl saved = cuda::attention_impl();
  ~ImplGuard() { cuda::set_attention_impl(saved); }
};

struct Case {
  int64_t batch, heads, kv_heads, seq, head_dim;
};

std::string describe(const Case& c, DType dtype) {
  return "B " + std::to_string(c.batch) + " H " + std::to_string(c.heads) + " KV " + std::to_string(c.kv_heads) +
         " T " + std::to_string(c.seq) + " D " + std::to_string(c.head_dim) + " " + std::string(dtype_name(dtype));
}

// One call's results: out [B, H, T, D], lse [B, H, T], dq [B, H, T, D], dk, dv [B, KV, T, D].
struct Results {
  Tensor out, lse, grad_q, grad_k, grad_v;
};

enum class Path { kCudnn, kFlash, kBackend };

// The inputs of one case (rounded to dtype, held as f32 on the CPU and as dtype on the GPU), the
// CPU's results on them, and the GPU's through `path`.
struct Comparison {
  Results cpu, gpu;
};

Comparison run_case(const Case& c, DType dtype, Path path, uint64_t seed) {
  const std::vector<int64_t> q_shape = {c.batch, c.heads, c.seq, c.head_dim};
  const std::vector<int64_t> kv_shape = {c.batch, c.kv_heads, c.seq, c.head_dim};
  const std::vector<int64_t> stat_shape = {c.batch, c.heads, c.seq};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const testing::RoundedInput q = random_input(q_shape, seed, dtype), k = random_input(kv_shape, seed + 1, dtype),
                              v = random_input(kv_shape, seed + 2, dtype),
                              grad_out = random_input(q_shape, seed + 3, dtype);
  Comparison result;
  Backend& cpu = backend_for(Device::cpu());
  Results& r = result.cpu;
  r = {Tensor::empty(q_shape), Tensor::empty(stat_shape), Tensor::empty(q_shape), Tensor::empty(kv_shape),
       Tensor::empty(kv_shape)};
  cpu.attention(q.reference, k.reference, v.reference, scale, r.out, r.lse);
  cpu.attention_backward(q.reference, k.reference, v.reference, r.out, r.lse, grad_out.reference, scale, r.grad_q,
                         r.grad_k, r.grad_v);

  Results& g = result.gpu;
  g = {poisoned(q_shape, dtype), poisoned(stat_shape, kFloat32), poisoned(q_shape, dtype), poisoned(kv_shape, dtype),
       poisoned(kv_shape, dtype)};
  // The backward gets the CPU's out and lse (rounded to dtype), so that it is compared alone.
  const Tensor out_for_backward = r.out.to(dtype).to(kGpu), lse_for_backward = r.lse.to(kGpu);
  if (path == Path::kCudnn) {
    EXPECT_TRUE(cuda::cudnn_attention_forward(q.gpu, k.gpu, v.gpu, scale, g.out, g.lse))
        << "cuDNN refused the forward: " << cuda::cudnn_attention_last_error();
    EXPECT_TRUE(cuda::cudnn_attention_backward(q.gpu, k.gpu, v.gpu, out_for_backward, lse_for_backward, grad_out.gpu,
                                               scale, g.grad_q, g.grad_k, g.grad_v))
        << "cuDNN refused the backward: " << cuda::cudnn_attention_last_error();
  } else {
    ImplGuard guard;
    if (path == Path::kFlash) cuda::set_attention_impl(cuda::AttentionImpl::kFlash);
    Backend& gpu = backend_for(kGpu);
    gpu.attention(q.gpu, k.gpu, v.gpu, scale, g.out, g.lse);
    gpu.attention_backward(q.gpu, k.gpu, v.gpu, out_for_backward, lse_for_backward, grad_out.gpu, scale, g.grad_q,
                           g.grad_k, g.grad_v);
  }
  return result;
}

// Relative L2 errors within `tolerance` (lse: max abs error within 1e-3, it is f32 in every dtype).
void expect_matches(const Comparison& result, double tolerance) {
  const Results &cpu = result.cpu, &gpu = result.gpu;
  EXPECT_LE(relative_l2_error(gpu.out, cpu.out), tolerance) << "out";
  const std::vector<double> lse = gpu.lse.to_vector(), expected = cpu.lse.to_vector();
  double worst = 0.0;
  for (size_t i = 0; i < lse.size(); ++i) worst = std::max(worst, std::abs(lse[i] - expected[i]));
  EXPECT_LE(worst, 1e-3) << "lse (max abs)";
  EXPECT_LE(relative_l2_error(gpu.grad_q, cpu.grad_q), tolerance) << "grad_q";
  EXPECT_LE(relative_l2_error(gpu.grad_k, cpu.grad_k), tolerance) << "grad_k";
  EXPECT_LE(relative_l2_error(gpu.grad_v, cpu.grad_v), tolerance) << "grad_v";
}

constexpr double kHalfTolerance = 2e-2;  // bf16 / f16 outputs, f32 accumulation
constexpr double kF32Tolerance = 1e-4;

#define SKIP_WITHOUT_CUDNN()                                                            \
  do {                                                                                  \
    WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");                         \
    if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "weft was built without cuDNN"; \
  } while (0)

TEST(AttentionHeadDims, CudnnBf16MatchesCpu) {
  SKIP_WITHOUT_CUDNN();
  uint64_t seed = 100;
  for (const int64_t dim : kHeadDims) {
    const Case c{2, 3, 3, 77, dim};
    SCOPED_TRACE(describe(c, kBFloat16));
    expect_matches(run_case(c, kBFloat16, Path::kCudnn, seed += 10), kHalfTolerance);
  }
}

TEST(AttentionHeadDims, FlashBf16MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 200;
  // The list, and head dims that are no tile width and no multiple of 8 (zero-padded).
  std::vector<int64_t> dims = kHeadDims;
  for (const int64_t dim : {1, 20, 200}) dims.push_back(dim);
  for (const int64_t dim : dims) {
    const Case c{2, 3, 3, 77, dim};
    SCOPED_TRACE(describe(c, kBFloat16));
    expect_matches(run_case(c, kBFloat16, Path::kFlash, seed += 10), kHalfTolerance);
  }
}

TEST(AttentionHeadDims, FlashF16MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  for (const int64_t dim : {80, 256}) {
    const Case c{1, 2, 2, 130, dim};
    SCOPED_TRACE(describe(c, kFloat16));
    expect_matches(run_case(c, kFloat16, Path::kFlash, 300 + dim), kHalfTolerance);
  }
}

TEST(AttentionHeadDims, F32MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 400;
  std::vector<int64_t> dims = kHeadDims;
  for (const int64_t dim : {1, 129, 200}) dims.push_back(dim);
  for (const int64_t dim : dims) {
    const Case c{2, 3, 3, 77, dim};
    SCOPED_TRACE(describe(c, kFloat32));
    expect_matches(run_case(c, kFloat32, Path::kBackend, seed += 10), kF32Tolerance);
  }
}

// Grouped-query attention on each path: H 8 with KV 2 and multi-query KV 1, at a tile width (64)
// and a padded head dim (80); T past one 64-row block and not a multiple of it.
const std::vector<Case> kGroupedCases = {{2, 8, 2, 100, 64}, {1, 8, 1, 100, 64}, {2, 8, 2, 70, 80}, {1, 8, 1, 70, 80}};

TEST(AttentionGroupedQuery, CudnnBf16MatchesCpu) {
  SKIP_WITHOUT_CUDNN();
  uint64_t seed = 500;
  for (const Case& c : kGroupedCases) {
    SCOPED_TRACE(describe(c, kBFloat16));
    expect_matches(run_case(c, kBFloat16, Path::kCudnn, seed += 10), kHalfTolerance);
  }
}

TEST(AttentionGroupedQuery, FlashBf16MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 600;
  std::vector<Case> cases = kGroupedCases;
  cases.push_back({1, 4, 2, 90, 256});  // the widest tile, single-buffered backward
  cases.push_back({1, 4, 2, 90, 16});   // llama-tiny's head dim
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c, kBFloat16));
    expect_matches(run_case(c, kBFloat16, Path::kFlash, seed += 10), kHalfTolerance);
  }
}

TEST(AttentionGroupedQuery, F32MatchesCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  uint64_t seed = 700;
  std::vector<Case> cases = kGroupedCases;
  cases.push_back({1, 4, 2, 90, 200});  // the f32 kernels' wide variant
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c, kFloat32));
    expect_matches(run_case(c, kFloat32, Path::kBackend, seed += 10), kF32Tolerance);
  }
}

// The layer's layout with GQA: q, k, v are the heads of one [B, T, (H + 2 KV) D] projection
// (strided views), outputs in [B, T, heads, D] order. Each path's results equal its contiguous
// call's (flash: bitwise, it copies views to contiguous tensors; cuDNN: within bf16 tolerance).
TEST(AttentionGroupedQuery, ProjectionViewsMatchContiguousTensors) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  ImplGuard guard;
  Backend& gpu = backend_for(kGpu);
  const int64_t batch = 2, heads = 8, kv_heads = 2, seq = 77, dim = 64;
  const double scale = 0.125;
  const Tensor qkv = random_input({batch, seq, (heads + 2 * kv_heads) * dim}, 800, kBFloat16).gpu;
  const auto part = [&](int64_t offset, int64_t count) {  // -> [B, count, T, D] view
    return qkv.narrow(2, offset * dim, count * dim).reshape({batch, seq, count, dim}).permute({0, 2, 1, 3});
  };
  const Tensor q = part(0, heads), k = part(heads, kv_heads), v = part(heads + kv_heads, kv_heads);
  const Tensor grad_out = random_input({batch, seq, heads, dim}, 801, kBFloat16).gpu.permute({0, 2, 1, 3});
  const auto heads_last = [&](int64_t count) {
    return poisoned({batch, seq, count, dim}, kBFloat16).permute({0, 2, 1, 3});
  };
  std::vector<cuda::AttentionImpl> impls = {cuda::AttentionImpl::kFlash};
  if (cuda::cudnn_attention_built()) impls.push_back(cuda::AttentionImpl::kCudnn);
  for (const cuda::AttentionImpl impl : impls) {
    SCOPED_TRACE(cuda::attention_impl_name(impl));
    cuda::set_attention_impl(impl);
    Results contiguous{poisoned({batch, heads, seq, dim}, kBFloat16), poisoned({batch, heads, seq}, kFloat32),
                       poisoned({batch, heads, seq, dim}, kBFloat16), poisoned({batch, kv_heads, seq, dim}, kBFloat16),
                       poisoned({batch, kv_heads, seq, dim}, kBFloat16)};
    gpu.attention(q.contiguous(), k.contiguous(), v.contiguous(), scale, contiguous.out, contiguous.lse);
    gpu.attention_backward(q.contiguous(), k.contiguous(), v.contiguous(), contiguous.out, contiguous.lse,
                           grad_out.contiguous(), scale, contiguous.grad_q, contiguous.grad_k, contiguous.grad_v);
    Results views{heads_last(heads), poisoned({batch, heads, seq}, kFloat32), heads_last(heads),
                  heads_last(kv_heads), heads_last(kv_heads)};
    gpu.attention(q, k, v, scale, views.out, views.lse);
    gpu.attention_backward(q, k, v, views.out, views.lse, grad_out, scale, views.grad_q, views.grad_k, views.grad_v);
    const double tolerance = impl == cuda::AttentionImpl::kFlash ? 0.0 : kHalfTolerance;
    EXPECT_LE(relative_l2_error(views.out, contiguous.out), tolerance) << "out";
    EXPECT_LE(relative_l2_error(views.grad_q, contiguous.grad_q), tolerance) << "grad_q";
    EXPECT_LE(relative_l2_error(views.grad_k, contiguous.grad_k), tolerance) << "grad_k";
    EXPECT_LE(relative_l2_error(views.grad_v, contiguous.grad_v), tolerance) << "grad_v";
  }
  if (cuda::cudnn_attention_built()) {
    Tensor out = heads_last(heads), lse = poisoned({batch, heads, seq}, kFloat32);
    EXPECT_TRUE(cuda::cudnn_attention_forward(q, k, v, scale, out, lse))
        << "cuDNN refused GQA views: " << cuda::cudnn_attention_last_error();
  }
}

// A head dim above 256 is an error naming the limit and what to change, on every dtype.
TEST(AttentionHeadDims, AboveTheLimitIsAClearError) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  for (const DType dtype : {kBFloat16, kFloat32}) {
    const Tensor q = Tensor::zeros({1, 2, 8, 264}, dtype, kGpu);
    Tensor out = Tensor::empty({1, 2, 8, 264}, dtype, kGpu), lse = Tensor::empty({1, 2, 8}, kFloat32, kGpu);
    try {
      backend_for(kGpu).attention(q, q, q, 1.0, out, lse);
      ADD_FAILURE() << "head dim 264 ran in " << dtype_name(dtype);
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("head dim 264"), std::string::npos) << message;
      EXPECT_NE(message.find("at most 256"), std::string::npos) << message;
    }
  }
  // k's heads must divide q's.
  const Tensor q = Tensor::zeros({1, 3, 8, 64}, kBFloat16, kGpu), k = Tensor::zeros({1, 2, 8, 64}, kBFloat16, kGpu);
  Tensor out = Tensor::empty({1, 3, 8, 64}, kBFloat16, kGpu), lse = Tensor::empty({1, 3, 8}, kFloat32, kGpu);
  EXPECT_THROW(backend_for(kGpu).attention(q, k, k, 1.0, out, lse), Error);
}

// cuDNN takes multiples of 8: head dim 20 is refused with the reason, and the backend's default
// path falls back to the flash kernels (padded to 32), whose results match the CPU.
TEST(AttentionHeadDims, CudnnRefusalFallsBackToFlash) {
  SKIP_WITHOUT_CUDNN();
  const Tensor q = Tensor::zeros({1, 2, 8, 20}, kBFloat16, kGpu);
  Tensor out = poisoned({1, 2, 8, 20}, kBFloat16), lse = poisoned({1, 2, 8}, kFloat32);
  EXPECT_FALSE(cuda::cudnn_attention_forward(q, q, q, 1.0, out, lse));
  EXPECT_NE(cuda::cudnn_attention_last_error().find("head dim 20"), std::string::npos)
      << cuda::cudnn_attention_last_error();
  ImplGuard guard;
  cuda::set_attention_impl(cuda::AttentionImpl::kAuto);
  const Case c{1, 4, 2, 50, 20};
  SCOPED_TRACE(describe(c, kBFloat16));
  expect_matches(run_case(c, kBFloat16, Path::kBackend, 900), kHalfTolerance);
}

// configs/llama-tiny-cpu.yaml's model (head dim 16, GQA 4 / 2 heads, RMSNorm, rotary, SwiGLU) on
// CUDA in bf16: it stopped at the head dim before; now a few steps train and follow the CPU's f32.
RunConfig llama_tiny_run(const std::string& text_path, const std::string& device, const std::string& dtype) {
  RunConfig config;
  config.model.type = "llama";
  config.model.layers = 2;
  config.model.dim = 64;
  config.model.heads = 4;
  config.model.kv_heads = 2;
  config.model.vocab = 256;
  config.model.seq_len = 64;
  config.train.device = device;
  config.train.dtype = dtype;
  config.train.batch_size = 4;
  config.train.steps = 6;
  config.train.lr = 3e-3;
  config.train.warmup_steps = 1;
  config.data.train = text_path;
  config.data.val_every = 0;
  config.log.every = 1;
  config.log.progress = "plain";
  return config;
}

TEST(AttentionHeadDims, LlamaTinyTrainsOnCudaInBf16) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  const auto text_path = std::filesystem::temp_directory_path() / "weft-llama-tiny-cuda-text.txt";
  {
    std::ofstream text(text_path);
    for (int i = 0; i < 300; ++i) text << "the weft passes through the warp, row " << i << ".\n";
  }
  const TrainResult cpu = Trainer(llama_tiny_run(text_path, "cpu", "f32")).run();
  const TrainResult gpu = Trainer(llama_tiny_run(text_path, "cuda", "bf16")).run();
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 3e-2 * std::fabs(cpu.losses[i])) << "bf16 step " << i + 1;
  }
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
  std::filesystem::remove(text_path);
}

#else  // !WEFT_HAVE_CUDA

TEST(AttentionHeadDims, SkippedWithoutCuda) { GTEST_SKIP() << "weft was built without CUDA"; }

#endif

}  // namespace
}  // namespace weft
