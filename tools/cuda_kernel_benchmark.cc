// cuda_kernel_benchmark: the kernels of the CUDA backend on transformer shapes, against measured
// ceilings: the memory-bound row kernels (layer norm, RMS norm, softmax, cross-entropy) against the
// device's copy bandwidth, and the matmuls of a transformer's linear layers (cuBLASLt, bf16) in
// TFLOP/s against a bf16 8192^3 matmul measured in the same run (about 766 TFLOP/s on an H200).
//
// Matmul shapes, forward (x [B*T, in] @ W^T [in, out]) and the two backward products (dX = dY W,
// dW = dY^T X), for GPT-2 124M (B*T = 16*1024, C = 768: qkv, attention projection, MLP up and down,
// the 50304-wide output head) and a 1.3B model (B*T = 8*1024, C = 2048); and the MLP's fused GELU
// products (bias + GELU in the up projection's epilogue or as a pass after it, gelu' in the down
// projection's dX epilogue or as a pass after it).
//
// Shapes: [B*T, C] = [16*1024, 768] (GPT-2 124M at sequence 1024) and [8*1024, 2048] (a 1.3B model),
// bf16 (the norm backwards also as a training step runs them: with the residual stream's gradient
// added to grad_x and the parameters' gradients accumulated); bias gradients (column sums over
// 16*1024 rows of 768 and 3072); cross-entropy on [8*1024, 50304] bf16 logits; GPT-2's embedding
// backward; Llama 1B's rotary embedding (q heads of [8, 2048, 4096] qkv) and SwiGLU ([8*2048,
// 5504]); AdamW over 48 bf16 [2048, 2048] parameters with split masters (26 bytes a parameter).
// Each kernel is called through the backend (runtime/backend.h) with its outputs allocated once,
// warmed up, then timed with CUDA events over --iters back-to-back calls on the current stream; the
// time is the mean per call.
//
// Method. A 4 ms blocking kernel (tools/stream_blocker.h) goes in front of the timed calls, so that
// they are all queued before the first runs: a kernel shorter than its launch on the host is then
// timed on the GPU, not at the host's launch rate. Order: the copy ceiling first, then the row kernels
// right after it, then the matmuls. A GPU clocks down after seconds of sustained matmuls (~700
// TFLOP/s on an H200), and the same row kernels measured about 15% slower after the matmul section
// than before it, against a ceiling measured on a cool GPU; measured next to the ceiling, both see
// the same clocks. The row table is printed before the matmul table.
//
// GB/s counts each tensor the kernel must read or write once (inputs read, outputs written, the
// f32 statistics included; the backward's f32 partial sums are overhead, not counted). The ceiling
// is a device-to-device cudaMemcpy measured in the same run (bytes read + written, so 2x the copy
// size): about 4.25 TB/s on an H200. Issue #3 asks memory-bound kernels for >= 70% of it.
//
// Usage: cuda_kernel_benchmark [--iters N] [--device N]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime.h>

#include "optim/master_weights.h"
#include "runtime/backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#include "runtime/error.h"
#include "runtime/optimizer_update.h"
#include "runtime/tensor.h"
#include "tools/stream_blocker.h"

namespace {

using weft::Device;
using weft::Tensor;

// How long the stream is held before the timed calls: long enough for the host to queue --iters
// calls at the default 50 (a backend call takes microseconds to launch).
constexpr double kBlockMicroseconds = 4000;

// Mean milliseconds per call of body() over `iters` calls, after `warmup` untimed calls. The timed
// calls queue behind a blocking kernel, so host launch overhead cannot leave the GPU idle between them.
double mean_ms(int device, int warmup, int iters, const std::function<void()>& body) {
  const cudaStream_t stream = weft::cuda::current_stream(device);
  for (int i = 0; i < warmup; ++i) body();
  weft::cuda::Event start(true), stop(true);
  weft::tools::block_stream(stream, kBlockMicroseconds);
  start.record(stream);
  for (int i = 0; i < iters; ++i) body();
  stop.record(stream);
  stop.synchronize();
  return static_cast<double>(stop.elapsed_since(start)) / iters;
}

// Device-to-device copy bandwidth in GB/s (bytes read + written), from a 1 GiB copy.
double copy_bandwidth(int device, int iters) {
  const size_t bytes = size_t{1} << 30;
  const Device gpu = Device::cuda(device);
  const Tensor source = Tensor::zeros({static_cast<int64_t>(bytes / 4)}, weft::kFloat32, gpu);
  const Tensor target = Tensor::empty({static_cast<int64_t>(bytes / 4)}, weft::kFloat32, gpu);
  const cudaStream_t stream = weft::cuda::current_stream(device);
  const double ms = mean_ms(device, 3, iters, [&] {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(target.raw_data(), source.raw_data(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

struct Row {
  std::string op, shape;
  double ms, bytes;
};

struct MatmulRow {
  std::string layer, product, shape;
  double ms, flops;
};

// The three products of one linear layer, in, out wide, over `rows` tokens, bf16.
void time_linear(weft::Backend& backend, int device, int warmup, int iters, const std::string& layer, int64_t rows,
                 int64_t in, int64_t out, std::vector<MatmulRow>& table) {
  const Device gpu = Device::cuda(device);
  const weft::DType bf16 = weft::kBFloat16;
  const Tensor x = Tensor::normal({1, rows, in}, 11, 0, 0.0, 1.0, bf16, gpu);
  const Tensor weight = Tensor::normal({1, out, in}, 12, 0, 0.0, 0.02, bf16, gpu);
  const Tensor grad_y = Tensor::normal({1, rows, out}, 13, 0, 0.0, 1.0, bf16, gpu);
  const Tensor y = Tensor::empty({1, rows, out}, bf16, gpu);
  const Tensor grad_x = Tensor::empty({1, rows, in}, bf16, gpu);
  const Tensor grad_weight = Tensor::empty({1, out, in}, bf16, gpu);
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
  const std::string shape = std::to_string(rows) + "x" + std::to_string(in) + "x" + std::to_string(out);
  table.push_back({layer, "forward  X W^T", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(x, weight.transpose(1, 2), y, 1.0, 0.0);
                   }), flops});
  table.push_back({layer, "backward dY W", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_y, weight, grad_x, 1.0, 0.0);
                   }), flops});
  table.push_back({layer, "backward dY^T X", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_y.transpose(1, 2), x, grad_weight, 1.0, 0.0);
                   }), flops});
}

// An MLP's GELU products as training runs them, hidden = 4 * dim wide: the up projection with bias
// and GELU in the epilogue (also writing the pre-activation), and the down projection's input
// gradient with gelu' applied, by cuBLASLt's DGELU epilogue and by a plain product followed by
// the elementwise gelu' pass (what the epilogue saves, or costs, against its kernel choice).
void time_gelu_products(weft::Backend& backend, int device, int warmup, int iters, const std::string& model,
                        int64_t rows, int64_t dim, std::vector<MatmulRow>& table) {
  const Device gpu = Device::cuda(device);
  const weft::DType bf16 = weft::kBFloat16;
  const int64_t hidden = 4 * dim;
  const Tensor x = Tensor::normal({1, rows, dim}, 21, 0, 0.0, 1.0, bf16, gpu);
  const Tensor up = Tensor::normal({1, hidden, dim}, 22, 0, 0.0, 0.02, bf16, gpu);
  const Tensor bias = Tensor::normal({hidden}, 23, 0, 0.0, 0.02, bf16, gpu);
  const Tensor down = Tensor::normal({1, dim, hidden}, 24, 0, 0.0, 0.02, bf16, gpu);
  const Tensor grad_y = Tensor::normal({1, rows, dim}, 25, 0, 0.0, 1.0, bf16, gpu);
  const Tensor pre = Tensor::empty({1, rows, hidden}, bf16, gpu);
  const Tensor out = Tensor::empty({1, rows, hidden}, bf16, gpu);
  const Tensor product = Tensor::empty({1, rows, hidden}, bf16, gpu);
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(dim) * static_cast<double>(hidden);
  const std::string shape = std::to_string(rows) + "x" + std::to_string(dim) + "x" + std::to_string(hidden);
  table.push_back({model + " mlp up", "fwd +bias+GELU", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul_bias_gelu(x, up.transpose(1, 2), bias, out, pre);
                   }), flops});
  table.push_back({model + " mlp up", "fwd +bias", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul_bias(x, up.transpose(1, 2), bias, pre);
                   }), flops});
  table.push_back({model + " mlp up", "fwd +bias, GELU", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul_bias(x, up.transpose(1, 2), bias, pre);
                     backend.unary(weft::UnaryOp::kGelu, pre, out);
                   }), flops});
  table.push_back({model + " mlp down", "dY W, DGELU epi", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul_gelu_backward(grad_y, down, pre, out);
                   }), flops});
  table.push_back({model + " mlp down", "dY W, then gelu'", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_y, down, product, 1.0, 0.0);
                     backend.unary_backward(weft::UnaryOp::kGelu, pre, product, out);
                   }), flops});
}

// A gated MLP's gate and up products (Llama's SwiGLU, hidden wide each) as two products, the way
// SwigluMlp runs them, against one product over the two weights stacked [2 hidden, dim]: what
// fusing gate and up into one matmul would save in forward, in the input gradient (two products
// summed against one of twice the depth) and in the weight gradients.
void time_gated_products(weft::Backend& backend, int device, int warmup, int iters, const std::string& model,
                         int64_t rows, int64_t dim, int64_t hidden, std::vector<MatmulRow>& table) {
  const Device gpu = Device::cuda(device);
  const weft::DType bf16 = weft::kBFloat16;
  const Tensor x = Tensor::normal({1, rows, dim}, 31, 0, 0.0, 1.0, bf16, gpu);
  const Tensor stacked = Tensor::normal({1, 2 * hidden, dim}, 32, 0, 0.0, 0.02, bf16, gpu);  // [gate; up]
  const Tensor gate = stacked.slice(1, 0, hidden), up = stacked.slice(1, hidden, 2 * hidden);
  const Tensor grad_stacked = Tensor::normal({1, rows, 2 * hidden}, 33, 0, 0.0, 1.0, bf16, gpu);
  const Tensor grad_gate = grad_stacked.slice(2, 0, hidden).contiguous();
  const Tensor grad_up = grad_stacked.slice(2, hidden, 2 * hidden).contiguous();
  const Tensor y_gate = Tensor::empty({1, rows, hidden}, bf16, gpu), y_up = Tensor::empty({1, rows, hidden}, bf16, gpu);
  const Tensor y_stacked = Tensor::empty({1, rows, 2 * hidden}, bf16, gpu);
  const Tensor grad_x = Tensor::empty({1, rows, dim}, bf16, gpu);
  const Tensor grad_w_stacked = Tensor::empty({1, 2 * hidden, dim}, bf16, gpu);
  const Tensor grad_w_gate = Tensor::empty({1, hidden, dim}, bf16, gpu), grad_w_up = Tensor::empty({1, hidden, dim}, bf16, gpu);
  const double flops = 2.0 * 2.0 * static_cast<double>(rows) * static_cast<double>(dim) * static_cast<double>(hidden);
  const std::string shape = std::to_string(rows) + "x" + std::to_string(dim) + "x2*" + std::to_string(hidden);
  const std::string layer = model + " gate+up";
  const Tensor gate_weight = gate.contiguous(), up_weight = up.contiguous();  // as two Linear layers hold them
  table.push_back({layer, "fwd two", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(x, gate_weight.transpose(1, 2), y_gate, 1.0, 0.0);
                     backend.matmul(x, up_weight.transpose(1, 2), y_up, 1.0, 0.0);
                   }), flops});
  table.push_back({layer, "fwd stacked", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(x, stacked.transpose(1, 2), y_stacked, 1.0, 0.0);
                   }), flops});
  table.push_back({layer, "dX two, summed", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_gate, gate_weight, grad_x, 1.0, 0.0);
                     backend.matmul(grad_up, up_weight, grad_x, 1.0, 1.0);
                   }), flops});
  table.push_back({layer, "dX stacked", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_stacked, stacked, grad_x, 1.0, 0.0);
                   }), flops});
  table.push_back({layer, "dW two", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_gate.transpose(1, 2), x, grad_w_gate, 1.0, 0.0);
                     backend.matmul(grad_up.transpose(1, 2), x, grad_w_up, 1.0, 0.0);
                   }), flops});
  table.push_back({layer, "dW stacked", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_stacked.transpose(1, 2), x, grad_w_stacked, 1.0, 0.0);
                   }), flops});
  // The two weight gradients as one batched product: dG and dU one after the other [2, rows, hidden],
  // x shared by both (batch stride 0), the two gradients one after the other [2, hidden, dim].
  const Tensor grad_pair = Tensor::normal({2, rows, hidden}, 34, 0, 0.0, 1.0, bf16, gpu);
  const Tensor grad_w_pair = Tensor::empty({2, hidden, dim}, bf16, gpu);
  const Tensor x_shared = x.expand({2, rows, dim});
  table.push_back({layer, "dW batched", shape, mean_ms(device, warmup, iters, [&] {
                     backend.matmul(grad_pair.transpose(1, 2), x_shared, grad_w_pair, 1.0, 0.0);
                   }), flops});
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50, device = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [--device N]\n", argv[0]);
      return 2;
    }
  }
  if (weft::cuda::device_count() == 0) {
    std::fprintf(stderr, "cuda_kernel_benchmark: no CUDA device is visible\n");
    return 1;
  }
  try {
    const Device gpu = Device::cuda(device);
    weft::Backend& backend = weft::backend_for(gpu);
    const int warmup = 5;
    cudaDeviceProp properties{};
    WEFT_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    const double ceiling = copy_bandwidth(device, 20);
    std::printf("device %d: %s, %d SMs; device-to-device copy %.0f GB/s (read + write)\n\n", device,
                properties.name, properties.multiProcessorCount, ceiling);

    // Row kernels right after the copy ceiling, on a GPU that the matmuls have not yet clocked down.
    std::vector<Row> rows;
    const weft::DType bf16 = weft::kBFloat16;
    constexpr double kElement = 2.0, kStatistic = 4.0;  // bytes of a bf16 element, an f32 statistic
    uint64_t seed = 1;
    for (const auto& [n, c] : std::vector<std::pair<int64_t, int64_t>>{{16 * 1024, 768}, {8 * 1024, 2048}}) {
      const std::string shape = "[" + std::to_string(n) + ", " + std::to_string(c) + "] bf16";
      const double rows_by_columns = static_cast<double>(n) * static_cast<double>(c);
      const Tensor x = Tensor::normal({n, c}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor weight = Tensor::normal({c}, ++seed, 0, 1.0, 0.1, bf16, gpu);
      const Tensor bias = Tensor::normal({c}, ++seed, 0, 0.0, 0.1, bf16, gpu);
      const Tensor grad_out = Tensor::normal({n, c}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor out = Tensor::empty({n, c}, bf16, gpu), grad_x = Tensor::empty({n, c}, bf16, gpu);
      const Tensor mean = Tensor::empty({n}, weft::kFloat32, gpu), rstd = Tensor::empty({n}, weft::kFloat32, gpu);
      const Tensor grad_weight = Tensor::empty({c}, bf16, gpu), grad_bias = Tensor::empty({c}, bf16, gpu);

      rows.push_back({"layer_norm forward", shape, mean_ms(device, warmup, iters, [&] {
                        backend.layer_norm(x, weight, bias, 1e-5, out, mean, rstd);
                      }),
                      2 * rows_by_columns * kElement + 2 * n * kStatistic + 2 * c * kElement});
      {
        // The residual add fused with the norm: reads x and residual, writes the sum and the output.
        const Tensor residual = Tensor::normal({n, c}, ++seed, 0, 0.0, 1.0, bf16, gpu);
        const Tensor sum = Tensor::empty({n, c}, bf16, gpu);
        rows.push_back({"add_layer_norm forward", shape, mean_ms(device, warmup, iters, [&] {
                          backend.add_layer_norm(x, residual, weight, bias, 1e-5, sum, out, mean, rstd);
                        }),
                        4 * rows_by_columns * kElement + 2 * n * kStatistic + 2 * c * kElement});
      }
      rows.push_back({"layer_norm backward", shape, mean_ms(device, warmup, iters, [&] {
                        backend.layer_norm_backward(x, weight, mean, rstd, grad_out, grad_x, grad_weight, grad_bias, {});
                      }),
                      3 * rows_by_columns * kElement + 2 * n * kStatistic + 3 * c * kElement});
      // As a training step runs it: the residual stream's gradient added to grad_x, the parameters'
      // gradients accumulated (one more read of an [n, c] tensor).
      weft::NormBackwardExtras with_addend;
      with_addend.grad_x_addend = Tensor::normal({n, c}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      with_addend.accumulate_parameter_gradients = true;
      rows.push_back({"layer_norm backward + addend", shape, mean_ms(device, warmup, iters, [&] {
                        backend.layer_norm_backward(x, weight, mean, rstd, grad_out, grad_x, grad_weight, grad_bias,
                                                    with_addend);
                      }),
                      4 * rows_by_columns * kElement + 2 * n * kStatistic + 5 * c * kElement});
      rows.push_back({"rms_norm forward", shape, mean_ms(device, warmup, iters, [&] {
                        backend.rms_norm(x, weight, 1e-6, out, rstd);
                      }),
                      2 * rows_by_columns * kElement + n * kStatistic + c * kElement});
      rows.push_back({"rms_norm backward", shape, mean_ms(device, warmup, iters, [&] {
                        backend.rms_norm_backward(x, weight, rstd, grad_out, grad_x, grad_weight, {});
                      }),
                      3 * rows_by_columns * kElement + n * kStatistic + 2 * c * kElement});
      rows.push_back({"rms_norm backward + addend", shape, mean_ms(device, warmup, iters, [&] {
                        backend.rms_norm_backward(x, weight, rstd, grad_out, grad_x, grad_weight, with_addend);
                      }),
                      4 * rows_by_columns * kElement + n * kStatistic + 3 * c * kElement});
      rows.push_back({"softmax forward", shape, mean_ms(device, warmup, iters, [&] {
                        backend.softmax(x, out, false);
                      }),
                      2 * rows_by_columns * kElement});
      rows.push_back({"softmax backward", shape, mean_ms(device, warmup, iters, [&] {
                        backend.softmax_backward(out, grad_out, grad_x, false);
                      }),
                      3 * rows_by_columns * kElement});
    }

    // Bias gradients as training takes them: the column sums of dY [tokens, C] over every token
    // (slices of rows into f32 partials, then a kernel that adds them in order), at GPT-2's widths.
    for (const int64_t c : {int64_t{768}, int64_t{3072}}) {
      const int64_t n = 16 * 1024;
      const std::string shape = "[" + std::to_string(n) + ", " + std::to_string(c) + "] bf16";
      const Tensor grad_out = Tensor::normal({n, c}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor grad_bias = Tensor::empty({1, c}, bf16, gpu);
      const int64_t dims[] = {0};
      rows.push_back({"bias gradient", shape, mean_ms(device, warmup, iters, [&] {
                        backend.reduce(weft::ReduceOp::kSum, grad_out, dims, grad_bias, Tensor());
                      }),
                      static_cast<double>(n) * static_cast<double>(c) * kElement + c * kElement});
    }

    {
      const int64_t n = 8 * 1024, v = 50304;
      const std::string shape = "[" + std::to_string(n) + ", " + std::to_string(v) + "] bf16";
      const double logits_bytes = static_cast<double>(n) * static_cast<double>(v) * kElement;
      const Tensor logits = Tensor::normal({n, v}, ++seed, 0, 0.0, 2.0, bf16, gpu);
      const Tensor targets = Tensor::zeros({n}, weft::kInt64, gpu);
      const Tensor losses = Tensor::empty({n}, weft::kFloat32, gpu), lse = Tensor::empty({n}, weft::kFloat32, gpu);
      const Tensor grad_losses = Tensor::full({n}, 1.0 / static_cast<double>(n), weft::kFloat32, gpu);
      const Tensor grad_logits = Tensor::empty({n, v}, bf16, gpu);
      const double forward_bytes = logits_bytes + n * (8.0 + 2 * kStatistic);
      const double backward_bytes = 2 * logits_bytes + n * (8.0 + 2 * kStatistic);
      const double forward_ms = mean_ms(device, warmup, iters, [&] {
        backend.cross_entropy(logits, targets, -100, losses, lse);
      });
      const double backward_ms = mean_ms(device, warmup, iters, [&] {
        backend.cross_entropy_backward(logits, targets, lse, -100, grad_losses, grad_logits);
      });
      const double fused_ms = mean_ms(device, warmup, iters, [&] {
        backend.cross_entropy_with_gradient(logits, targets, -100, grad_losses, losses, lse, grad_logits);
      });
      rows.push_back({"cross_entropy forward", shape, forward_ms, forward_bytes});
      rows.push_back({"cross_entropy backward", shape, backward_ms, backward_bytes});
      rows.push_back({"cross_entropy fwd+bwd", shape, forward_ms + backward_ms, forward_bytes + backward_bytes});
      // One kernel, each row read from memory once: the bytes are the backward's.
      rows.push_back({"cross_entropy with grad", shape, fused_ms, backward_bytes});
    }

    {
      // GPT-2's embedding backward: 16384 rows of [*, 768] added into a [50304, 768] gradient, with
      // ids spread evenly (what the random-token benchmarks train on) and drawn with probability
      // 1 / rank (Zipf: the most frequent id about 9% of the batch, more than real text's most
      // frequent token). Bytes: the rows read, and the named rows of the gradient read and written.
      const int64_t n = 16 * 1024, v = 50304, c = 768;
      const Tensor grad_out = Tensor::normal({n, c}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor grad_weight = Tensor::zeros({v, c}, bf16, gpu);
      std::vector<double> cumulative(static_cast<size_t>(v));
      double total = 0;
      for (int64_t i = 0; i < v; ++i) cumulative[i] = total += 1.0 / static_cast<double>(i + 1);
      for (const bool zipf : {false, true}) {
        std::vector<int64_t> ids(static_cast<size_t>(n));
        uint64_t state = 88172645463325252ull;
        std::vector<bool> named(static_cast<size_t>(v), false);
        int64_t distinct = 0;
        for (int64_t& id : ids) {
          state ^= state << 13, state ^= state >> 7, state ^= state << 17;  // xorshift64
          const double u = static_cast<double>(state >> 11) / 9007199254740992.0;
          id = zipf ? std::lower_bound(cumulative.begin(), cumulative.end(), u * total) - cumulative.begin()
                    : static_cast<int64_t>(u * static_cast<double>(v));
          id = std::min(id, v - 1);
          if (!named[id]) named[id] = true, ++distinct;
        }
        const Tensor id_tensor = Tensor::from_vector(absl::MakeConstSpan(ids), {n}, weft::kInt64).to(gpu);
        const double ms = mean_ms(device, warmup, iters, [&] {
          backend.embedding_backward(id_tensor, grad_out, grad_weight);
        });
        rows.push_back({zipf ? "embedding bwd, Zipf ids" : "embedding bwd, even ids", "[16384, 768] bf16", ms,
                        static_cast<double>(n * c) * kElement + 2.0 * static_cast<double>(distinct * c) * kElement});
      }
    }

    {
      // Llama at 1B (configs/llama-1b.yaml, batch 8 x 2048): rotary on the q heads of the qkv
      // projection's output, a [B, T, H, D] view of [B, T, (H + 2 KV) D] memory, written in
      // [B, T, H, D] order (what rotary_embedding does for the layer); SwiGLU on [B*T, 5504].
      const int64_t b = 8, t = 2048, h = 16, kv = 8, d = 128, hidden = 5504;
      const Tensor qkv = Tensor::normal({b, t, (h + 2 * kv) * d}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor q = qkv.narrow(2, 0, h * d).view({b, t, h, d}).permute({0, 2, 1, 3});
      const Tensor cos = Tensor::normal({t, d}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor sin = Tensor::normal({t, d}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor rotated = Tensor::empty({b, t, h, d}, bf16, gpu).permute({0, 2, 1, 3});
      const Tensor rotated_grad = Tensor::empty({b, t, h, d}, bf16, gpu).permute({0, 2, 1, 3});
      const std::string q_shape = "[8,16,2048,128] bf16";
      const double rotary_bytes = 2.0 * static_cast<double>(b * t * h * d) * kElement + 2.0 * t * d * kElement;
      rows.push_back({"rotary forward", q_shape, mean_ms(device, warmup, iters, [&] {
                        backend.rotary_embedding(q, cos, sin, rotated);
                      }),
                      rotary_bytes});
      rows.push_back({"rotary backward", q_shape, mean_ms(device, warmup, iters, [&] {
                        backend.rotary_embedding_backward(rotated, cos, sin, rotated_grad);
                      }),
                      rotary_bytes});
      const Tensor gate = Tensor::normal({b * t, hidden}, ++seed, 0, 0.0, 2.0, bf16, gpu);
      const Tensor up = Tensor::normal({b * t, hidden}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor grad = Tensor::normal({b * t, hidden}, ++seed, 0, 0.0, 1.0, bf16, gpu);
      const Tensor activated = Tensor::empty({b * t, hidden}, bf16, gpu);
      const Tensor grad_gate = Tensor::empty({b * t, hidden}, bf16, gpu);
      const Tensor grad_up = Tensor::empty({b * t, hidden}, bf16, gpu);
      const std::string swiglu_shape = "[16384, 5504] bf16";
      const double swiglu_tensor = static_cast<double>(b * t * hidden) * kElement;
      rows.push_back({"swiglu forward", swiglu_shape, mean_ms(device, warmup, iters, [&] {
                        backend.swiglu(gate, up, activated);
                      }),
                      3 * swiglu_tensor});
      rows.push_back({"swiglu backward", swiglu_shape, mean_ms(device, warmup, iters, [&] {
                        backend.swiglu_backward(gate, up, grad, grad_gate, grad_up);
                      }),
                      5 * swiglu_tensor});
    }

    {
      // AdamW as a bf16 model's step runs it: 48 parameters of [2048, 2048] (201M, a quarter of
      // Llama 1B) with low-half masters, bf16 gradients, f32 moments, a guard and a clipping factor.
      // Bytes: read the parameter, its low half and its gradient (2 each) and both moments (4
      // each); write the parameter, the low half and the moments: 26 a parameter.
      std::vector<Tensor> keep;
      std::vector<weft::AdamWTensorUpdate> updates;
      int64_t parameters = 0;
      for (int k = 0; k < 48; ++k) {
        const Tensor parameter = Tensor::normal({2048, 2048}, ++seed, 0, 0.0, 0.02, bf16, gpu);
        const Tensor grad = Tensor::normal({2048, 2048}, ++seed, 0, 0.0, 1e-3, bf16, gpu);
        const Tensor exp_avg = Tensor::zeros({2048, 2048}, weft::kFloat32, gpu);
        const Tensor exp_avg_sq = Tensor::zeros({2048, 2048}, weft::kFloat32, gpu);
        const Tensor master = weft::make_master_weights(parameter);
        keep.insert(keep.end(), {parameter, grad, exp_avg, exp_avg_sq, master});
        updates.push_back({.parameter = parameter, .grad = grad, .exp_avg = exp_avg, .exp_avg_sq = exp_avg_sq,
                           .master = master, .step_size = 1e-4, .bias_correction2_sqrt = 0.5, .decay = 0.99999});
        parameters += parameter.numel();
      }
      weft::AdamWHyperparameters hyperparameters;
      hyperparameters.beta1 = 0.9;
      hyperparameters.beta2 = 0.95;
      hyperparameters.guard = Tensor::full({1}, 1.0, weft::kFloat32, gpu);
      hyperparameters.gradient_scale = Tensor::full({1}, 0.5, weft::kFloat32, gpu);
      rows.push_back({"adamw bf16 split master", "48 x [2048, 2048]", mean_ms(device, 1, std::max(iters / 5, 2), [&] {
                        backend.adamw_update(updates, hyperparameters);
                      }),
                      26.0 * static_cast<double>(parameters)});
    }

    std::printf("%-28s %-22s %10s %10s %9s\n", "op", "shape", "time (us)", "GB/s", "of copy");
    for (const Row& row : rows) {
      const double gigabytes_per_second = row.bytes / (row.ms * 1e-3) / 1e9;
      std::printf("%-28s %-22s %10.1f %10.0f %8.0f%%\n", row.op.c_str(), row.shape.c_str(), row.ms * 1e3,
                  gigabytes_per_second, 100.0 * gigabytes_per_second / ceiling);
    }
    std::printf("\ntarget (issue #3): memory-bound kernels >= 70%% of copy bandwidth\n\n");
    std::fflush(stdout);  // the row table is out even if a caller stops the run during the matmuls

    // Matmuls last (they heat the GPU, which then clocks down): the bf16 8192^3 ceiling, then every
    // linear layer's three products.
    double ceiling_tflops = 0;
    {
      const Tensor a = Tensor::normal({1, 8192, 8192}, 1, 0, 0.0, 1.0, weft::kBFloat16, gpu);
      const Tensor b = Tensor::normal({1, 8192, 8192}, 2, 0, 0.0, 1.0, weft::kBFloat16, gpu);
      const Tensor c = Tensor::empty({1, 8192, 8192}, weft::kBFloat16, gpu);
      const double ms = mean_ms(device, 3, 20, [&] { backend.matmul(a, b, c, 1.0, 0.0); });
      ceiling_tflops = 2.0 * 8192.0 * 8192.0 * 8192.0 / (ms * 1e-3) / 1e12;
    }
    std::vector<MatmulRow> matmuls;
    for (const auto& [model, rows_, dim] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
             {"gpt2-124m", 16 * 1024, 768}, {"1.3b", 8 * 1024, 2048}}) {
      time_linear(backend, device, warmup, iters, model + " qkv", rows_, dim, 3 * dim, matmuls);
      time_linear(backend, device, warmup, iters, model + " attn proj", rows_, dim, dim, matmuls);
      time_linear(backend, device, warmup, iters, model + " mlp up", rows_, dim, 4 * dim, matmuls);
      time_linear(backend, device, warmup, iters, model + " mlp down", rows_, 4 * dim, dim, matmuls);
      time_linear(backend, device, warmup, iters, model + " lm head", rows_, dim, 50304, matmuls);
      time_gelu_products(backend, device, warmup, iters, model, rows_, dim, matmuls);
    }
    // Llama 1B's MLP (batch 8 x 2048 tokens, 2048 wide, hidden 5504).
    time_linear(backend, device, warmup, iters, "llama-1b qkv", 16 * 1024, 2048, 4096, matmuls);
    time_linear(backend, device, warmup, iters, "llama-1b attn out", 16 * 1024, 2048, 2048, matmuls);
    time_linear(backend, device, warmup, iters, "llama-1b mlp down", 16 * 1024, 5504, 2048, matmuls);
    time_linear(backend, device, warmup, iters, "llama-1b lm head", 16 * 1024, 2048, 32000, matmuls);
    time_gated_products(backend, device, warmup, iters, "llama-1b", 16 * 1024, 2048, 5504, matmuls);
    std::printf("bf16 8192^3 matmul (the ceiling): %.1f TFLOP/s\n\n", ceiling_tflops);
    std::printf("%-20s %-17s %-18s %10s %9s %9s\n", "layer", "product", "M x K x N", "time (us)", "TFLOP/s",
                "of ceil");
    for (const MatmulRow& row : matmuls) {
      const double tflops = row.flops / (row.ms * 1e-3) / 1e12;
      std::printf("%-20s %-17s %-18s %10.1f %9.1f %8.0f%%\n", row.layer.c_str(), row.product.c_str(),
                  row.shape.c_str(), row.ms * 1e3, tflops, 100.0 * tflops / ceiling_tflops);
    }
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "cuda_kernel_benchmark: %s\n", error.what());
    return 1;
  }
  return 0;
}
