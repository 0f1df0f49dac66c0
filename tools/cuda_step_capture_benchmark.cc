// cuda_step_capture_benchmark: what replaying a captured CUDA graph would save over issuing the same
// forward and backward op by op, for the models of run configs (by default configs/gpt2-124m.yaml
// and configs/llama-1b.yaml: GPT-2 124M at batch 16, Llama 1B at batch 8), in bf16.
//
// Each model runs the training step's forward (its segments, the fused cross-entropy that writes
// its gradient over the logits) and backward, without the optimizer. One pass is captured into a
// CUDA graph (cudaStreamCaptureModeThreadLocal) and then, in rounds (a clock that moves during the
// run moves under every way alike), passes run four ways, in ms per pass:
//   issued b2b    the passes issued op by op on fixed device inputs, back to back (the host runs
//                 ahead of the GPU; events around all of them);
//   replay b2b    the graph launched back to back;
//   issued loop   as a training loop issues a step: the batch uploaded from host tensors, the pass,
//                 the loss read back before the next (wall time), with the GPU's own time from the
//                 pass's first work to its last in brackets;
//   replay loop   the same loop around the graph: the batch copied into the buffers it reads.
// The loop's two ways differ by what a step that waits for its loss loses to the host at its start.
// Gradients accumulate across passes (the timing does not depend on their values). Where capture
// fails, it prints the CUDA error, which names what in a pass cannot be captured yet.
//   usage: cuda_step_capture_benchmark [--iters N] [CONFIG.yaml ...]   (from the repository root)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "launcher/config_loader.h"
#include "layers/language_model.h"
#include "runtime/autograd/engine.h"
#include "runtime/cuda/stream.h"
#include "runtime/ops/loss.h"
#include "runtime/weft.h"

namespace weft {
namespace {

// A model and its batch, from a run config (configs/gpt2-124m.yaml, configs/llama-1b.yaml).
struct Shape {
  std::string name;
  ModelConfig config;
  int64_t batch;
};

Shape shape_from(const std::string& path) {
  const RunConfig run = load_config({path}, {});
  return {path + " b" + std::to_string(run.train.batch_size), run.model, run.train.batch_size};
}

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

// One forward and backward pass over the model's segments, as the step graph runs them with one
// micro-batch (parallel/step/step_builder.cc), without the per-segment detach: one backward.
Tensor pass(LanguageModel& model, const Tensor& ids, const Tensor& targets) {
  Tensor output = ids;
  for (ModelSegment& segment : model.segments()) output = segment.forward(output);
  const int64_t vocabulary = output.size(-1);
  const Tensor loss = cross_entropy_overwriting_logits(output.reshape({-1, vocabulary}), targets.reshape({-1}), -100,
                                                       targets.numel(), 1.0);
  autograd::backward_to_inputs({loss}, {Tensor()}, {});
  return loss;
}

double time_passes(const std::function<void()>& one, int iterations, cudaStream_t stream) {
  cuda::Event start(true), end(true);
  start.record(stream);
  for (int i = 0; i < iterations; ++i) one();
  end.record(stream);
  end.synchronize();
  return end.elapsed_since(start) / iterations;
}

void run(const Shape& shape, int iterations) {
  const Device device = Device::cuda(0);
  std::shared_ptr<LanguageModel> model = build_model(shape.config);
  model->to(kBFloat16);
  model->to(device);
  model->train();
  const int64_t tokens = shape.batch * shape.config.seq_len;
  const Tensor ids = Tensor::uniform({shape.batch, shape.config.seq_len}, 7, 0, 0.0,
                                     static_cast<double>(shape.config.vocab) - 1.0, kFloat64)
                         .to(kInt64)
                         .to(device);
  const Tensor targets = Tensor::uniform({shape.batch, shape.config.seq_len}, 8, 0, 0.0,
                                         static_cast<double>(shape.config.vocab) - 1.0, kFloat64)
                             .to(kInt64)
                             .to(device);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda::StreamGuard guard(0, stream);
  for (int i = 0; i < 3; ++i) pass(*model, ids, targets);  // every cache warm, every .grad made
  check(cudaStreamSynchronize(stream), "warm-up");

  // One pass captured; `captured_loss` is where each replay leaves its loss.
  cudaGraph_t graph = nullptr;
  Tensor captured_loss;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    captured_loss = pass(*model, ids, targets);
  } catch (const std::exception& error) {
    cudaStreamEndCapture(stream, &graph);
    std::printf("%-16s capture failed in the pass: %s\n", shape.name.c_str(), error.what());
    return;
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) {
    std::printf("%-16s capture failed: %s\n", shape.name.c_str(), cudaGetErrorString(ended));
    cudaGetLastError();
    return;
  }
  size_t nodes = 0;
  check(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes");
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");  // the first launch uploads the graph
  check(cudaStreamSynchronize(stream), "first replay");

  // As a training loop: the batch uploaded from host tensors and the loss read back every pass;
  // returns the wall ms per pass, and `gpu_ms` the GPU's from each pass's first work to its last.
  const Tensor host_ids = ids.to(Device::cpu()), host_targets = targets.to(Device::cpu());
  cuda::Event pass_start(true), pass_end(true);
  auto loop = [&](bool replay, double& gpu_ms) {
    gpu_ms = 0.0;
    const auto loop_start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) {
      if (replay) {
        Tensor(ids).copy_(host_ids);  // into the buffers the graph reads
        Tensor(targets).copy_(host_targets);
        pass_start.record(stream);
        check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
        pass_end.record(stream);
        captured_loss.item();
      } else {
        const Tensor uploaded_ids = host_ids.to(device), uploaded_targets = host_targets.to(device);
        pass_start.record(stream);
        const Tensor loss = pass(*model, uploaded_ids, uploaded_targets);
        pass_end.record(stream);
        loss.item();
      }
      gpu_ms += pass_end.elapsed_since(pass_start) / iterations;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - loop_start).count() /
           iterations;
  };
  // Rounds of every way, so that a clock that moves during the run moves under all of them.
  std::printf("%s (%zu graph nodes), ms per pass:\n", shape.name.c_str(), nodes);
  std::printf("  round  issued b2b  replay b2b  issued loop (GPU)   replay loop (GPU)   loop replay/issued\n");
  for (int round = 0; round < 3; ++round) {
    const double issued = time_passes([&] { pass(*model, ids, targets); }, iterations, stream);
    const double replayed =
        time_passes([&] { check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); }, iterations, stream);
    double issued_gpu = 0.0, replayed_gpu = 0.0;
    const double issued_loop = loop(false, issued_gpu);
    const double replayed_loop = loop(true, replayed_gpu);
    std::printf("  %5d  %10.3f  %10.3f  %8.3f (%7.3f)  %8.3f (%7.3f)  %.3f (%.0f vs %.0f tokens/s)\n", round, issued,
                replayed, issued_loop, issued_gpu, replayed_loop, replayed_gpu, replayed_loop / issued_loop,
                tokens / issued_loop * 1e3, tokens / replayed_loop * 1e3);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  check(cudaStreamSynchronize(stream), "end");
}

}  // namespace
}  // namespace weft

int main(int argc, char** argv) {
  int iterations = 20;
  std::vector<std::string> configs;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iterations = std::max(2, std::atoi(argv[++i]));  // the gap needs two passes
    } else if (argv[i][0] != '-') {
      configs.push_back(argv[i]);
    } else {
      std::fprintf(stderr, "usage: %s [--iters N] [CONFIG.yaml ...]\n", argv[0]);
      return 2;
    }
  }
  if (configs.empty()) configs = {"configs/gpt2-124m.yaml", "configs/llama-1b.yaml"};
  try {
    for (const std::string& config : configs) weft::run(weft::shape_from(config), iterations);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuda_step_capture_benchmark: %s\n", error.what());
    return 1;
  }
  return 0;
}
