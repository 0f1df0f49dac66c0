// cuda_attention_benchmark: weft's causal attention (bf16) on the GPU, forward and forward +
// backward, through both of CudaBackend's implementations (runtime/cuda/cudnn_attention.h): weft's
// flash kernels and cuDNN's fused attention (when weft was built with cuDNN and cuDNN finds an
// engine; otherwise the cuDNN rows say why they are missing), and a bf16 8192^3 cuBLASLt matmul as
// the machine's matrix ceiling. Shapes: GPT-2's (D 64) and the D 128 ones, then a Llama-style
// grouped-query one (16 query heads on 8 kv heads, k and v not expanded) and head dims 80 and 256
// (cuDNN, and flash's zero-padded / wide tiles). GQA costs the same FLOPs as multi-head attention.
//
// TFLOP/s count causal FLOPs as half of the full T x T products: forward = 4*B*H*T*T*D / 2 (two
// products, QK^T and PV); backward = 2.5x forward (five products, the usual convention), so
// forward + backward = 3.5 * forward FLOPs. Times are medians over --iters runs (CUDA events on the
// current stream) after warm-up runs.
//
// --peer FILE reads PyTorch's numbers written by tools/attention_peer.py (lines "backend B H T D
// fwd_ms fwd_tflops fwdbwd_ms fwdbwd_tflops") and prints weft / best-PyTorch ratios last, for each
// weft implementation.
// tools/cuda_attention_benchmark.sh runs both in one go.
//
// Usage: cuda_attention_benchmark [--peer FILE] [--iters N] [--device N]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cuda/cudnn_attention.h"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace {

using weft::Device;
using weft::Tensor;

struct Shape {
  int64_t batch, heads, seq, head_dim;
  int64_t kv_heads = 0;  // 0: heads (multi-head attention)
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
};

std::string shape_name(const Shape& s) {
  char name[64];
  std::snprintf(name, sizeof(name), "B%lld H%lld T%lld D%lld", static_cast<long long>(s.batch),
                static_cast<long long>(s.heads), static_cast<long long>(s.seq), static_cast<long long>(s.head_dim));
  std::string text = name;
  if (s.kv() != s.heads) text += " KV" + std::to_string(s.kv());
  return text;
}

struct PeerResult {
  std::string backend;
  double fwd_tflops = NAN, fwdbwd_tflops = NAN;
};

using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int64_t>;

double causal_forward_flops(const Shape& s) {
  return 4.0 * s.batch * s.heads * static_cast<double>(s.seq) * s.seq * s.head_dim / 2.0;
}

// Median milliseconds of `iters` timed runs of body() after `warmup` untimed ones.
template <class Body>
double median_ms(int device, int warmup, int iters, Body&& body) {
  const cudaStream_t stream = weft::cuda::current_stream(device);
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    weft::cuda::Event start(true), stop(true);
    start.record(stream);
    body();
    stop.record(stream);
    stop.synchronize();
    times.push_back(stop.elapsed_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::map<ShapeKey, std::vector<PeerResult>> read_peer(const std::string& path) {
  std::map<ShapeKey, std::vector<PeerResult>> peers;
  std::ifstream file(path);
  WEFT_CHECK(file.good(), "cannot read peer file ", path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    PeerResult result;
    int64_t b, h, t, d;
    std::string fwd_ms, fwd_tf, fb_ms, fb_tf;
    if (!(fields >> result.backend >> b >> h >> t >> d >> fwd_ms >> fwd_tf >> fb_ms >> fb_tf)) continue;
    result.fwd_tflops = std::strtod(fwd_tf.c_str(), nullptr);  // strtod reads "nan"
    result.fwdbwd_tflops = std::strtod(fb_tf.c_str(), nullptr);
    peers[{b, h, t, d}].push_back(result);
  }
  return peers;
}

}  // namespace

int main(int argc, char** argv) {
  std::string peer_path;
  int iters = 20, device = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--peer" && i + 1 < argc) {
      peer_path = argv[++i];
    } else if (arg == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--device" && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--peer FILE] [--iters N] [--device N]\n", argv[0]);
      return 2;
    }
  }
  try {
    if (weft::cuda::device_count() == 0) {
      std::fprintf(stderr, "cuda_attention_benchmark: no CUDA device\n");
      return 1;
    }
    const Device gpu = Device::cuda(device);
    weft::cuda::set_device(device);
    weft::Backend& backend = weft::backend_for(gpu);
    cudaDeviceProp properties{};
    cudaGetDeviceProperties(&properties, device);
    std::printf("device %d: %s, %d SMs\n", device, properties.name, properties.multiProcessorCount);
    std::printf("FLOPs: causal forward = 4*B*H*T*T*D/2; forward+backward = 3.5x forward; medians of %d runs\n\n",
                iters);

    // The matrix ceiling: bf16 8192^3 through CudaBackend::matmul (cuBLASLt).
    double matmul_tflops = 0.0;
    {
      const int64_t n = 8192;
      const Tensor a = Tensor::normal({1, n, n}, 1, 0, 0.0, 1.0, weft::kBFloat16, gpu);
      const Tensor b = Tensor::normal({1, n, n}, 2, 0, 0.0, 1.0, weft::kBFloat16, gpu);
      const Tensor c = Tensor::empty({1, n, n}, weft::kBFloat16, gpu);
      const double ms = median_ms(device, 3, iters, [&] { backend.matmul(a, b, c, 1.0, 0.0); });
      matmul_tflops = 2.0 * n * n * n / ms / 1e9;
      std::printf("matmul bf16 8192^3 (cuBLASLt): %.3f ms, %.1f TFLOP/s\n\n", ms, matmul_tflops);
    }

    const std::vector<Shape> shapes = {{16, 12, 1024, 64},    {8, 16, 1024, 128},    {4, 16, 4096, 128},
                                       {4, 16, 2048, 128, 8}, {8, 20, 1024, 80},     {4, 8, 2048, 256}};
    struct Row {
      std::string impl;
      Shape shape;
      double fwd_ms, fwd_tflops, fb_ms, fb_tflops;
    };
    std::vector<Row> rows;
    std::printf("cuDNN: %s (library version %d)\n\n",
                weft::cuda::cudnn_attention_built() ? "built in" : "not built in", weft::cuda::cudnn_version());
    std::printf("%-6s %-26s %9s %9s %9s %9s %9s\n", "impl", "shape (bf16, causal)", "fwd ms", "fwd TF/s", "f+b ms",
                "f+b TF/s", "bwd TF/s");
    const weft::cuda::AttentionImpl saved_impl = weft::cuda::attention_impl();
    using weft::cuda::AttentionImpl;
    for (const AttentionImpl impl : {AttentionImpl::kFlash, AttentionImpl::kCudnn}) {
      const std::string impl_name = weft::cuda::attention_impl_name(impl);
      weft::cuda::set_attention_impl(impl);
      for (const Shape& s : shapes) {
        const std::vector<int64_t> dims = {s.batch, s.heads, s.seq, s.head_dim};
        const std::vector<int64_t> kv_dims = {s.batch, s.kv(), s.seq, s.head_dim};
        const Tensor q = Tensor::normal(dims, 11, 0, 0.0, 1.0, weft::kBFloat16, gpu);
        const Tensor k = Tensor::normal(kv_dims, 12, 0, 0.0, 1.0, weft::kBFloat16, gpu);
        const Tensor v = Tensor::normal(kv_dims, 13, 0, 0.0, 1.0, weft::kBFloat16, gpu);
        const Tensor grad_out = Tensor::normal(dims, 14, 0, 0.0, 1.0, weft::kBFloat16, gpu);
        const Tensor out = Tensor::empty(dims, weft::kBFloat16, gpu);
        const Tensor lse = Tensor::empty({s.batch, s.heads, s.seq}, weft::kFloat32, gpu);
        const Tensor gq = Tensor::empty(dims, weft::kBFloat16, gpu);
        const Tensor gk = Tensor::empty(kv_dims, weft::kBFloat16, gpu);
        const Tensor gv = Tensor::empty(kv_dims, weft::kBFloat16, gpu);
        const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
        const std::string shape_text = shape_name(s);
        const char* name = shape_text.c_str();
        if (impl == AttentionImpl::kCudnn) {
          // Only time cuDNN where it really runs (the backend would fall back to flash silently).
          const bool forward_ok = weft::cuda::cudnn_attention_forward(q, k, v, scale, out, lse);
          const bool backward_ok = forward_ok && weft::cuda::cudnn_attention_backward(q, k, v, out, lse, grad_out,
                                                                                      scale, gq, gk, gv);
          if (!backward_ok) {
            std::printf("%-6s %-26s unavailable: %s\n", impl_name.c_str(), name,
                        weft::cuda::cudnn_attention_last_error().c_str());
            continue;
          }
        }
        const double fwd_ms = median_ms(device, 3, iters, [&] { backend.attention(q, k, v, scale, out, lse); });
        const double fb_ms = median_ms(device, 3, iters, [&] {
          backend.attention(q, k, v, scale, out, lse);
          backend.attention_backward(q, k, v, out, lse, grad_out, scale, gq, gk, gv);
        });
        const double flops = causal_forward_flops(s);
        Row row{impl_name, s, fwd_ms, flops / fwd_ms / 1e9, fb_ms, 3.5 * flops / fb_ms / 1e9};
        const double bwd_tflops = fb_ms > fwd_ms ? 2.5 * flops / (fb_ms - fwd_ms) / 1e9 : NAN;
        std::printf("%-6s %-26s %9.3f %9.1f %9.3f %9.1f %9.1f\n", impl_name.c_str(), name, fwd_ms, row.fwd_tflops,
                    fb_ms, row.fb_tflops, bwd_tflops);
        rows.push_back(row);
      }
    }
    weft::cuda::set_attention_impl(saved_impl);

    if (!peer_path.empty()) {
      const auto peers = read_peer(peer_path);
      std::printf("\nweft vs PyTorch SDPA (best backend by forward+backward TFLOP/s), same call\n");
      std::printf("%-6s %-26s %9s %9s %14s %9s %9s %11s %9s\n", "impl", "shape", "weft fwd", "weft f+b", "peer",
                  "peer fwd", "peer f+b", "fwd ratio", "f+b ratio");
      for (const Row& row : rows) {
        const Shape& s = row.shape;
        const std::string shape_text = shape_name(s);
        const char* name = shape_text.c_str();
        auto found = peers.find({s.batch, s.heads, s.seq, s.head_dim});
        const PeerResult* best = nullptr;
        if (found != peers.end() && s.kv() == s.heads) {  // the peer file's rows are multi-head
          for (const PeerResult& p : found->second) {
            if (std::isfinite(p.fwdbwd_tflops) && (best == nullptr || p.fwdbwd_tflops > best->fwdbwd_tflops)) best = &p;
          }
        }
        if (best == nullptr) {
          std::printf("%-6s %-26s %9.1f %9.1f %14s\n", row.impl.c_str(), name, row.fwd_tflops, row.fb_tflops,
                      "(no peer)");
          continue;
        }
        std::printf("%-6s %-26s %9.1f %9.1f %14s %9.1f %9.1f %11.2f %9.2f\n", row.impl.c_str(), name, row.fwd_tflops,
                    row.fb_tflops, best->backend.c_str(), best->fwd_tflops, best->fwdbwd_tflops,
                    row.fwd_tflops / best->fwd_tflops, row.fb_tflops / best->fwdbwd_tflops);
      }
      std::printf("(target of issue 3: f+b ratio >= 0.90; matmul ceiling this run %.1f TFLOP/s)\n", matmul_tflops);
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuda_attention_benchmark: %s\n", error.what());
    return 1;
  }
}
