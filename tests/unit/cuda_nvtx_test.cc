// NVTX ranges (runtime/nvtx_range.h) through NVTX's own injection mechanism, as Nsight Systems sees
// them: NVTX_INJECTION64_PATH names tests/nvtx/nvtx_name_recorder.cc's library, which records every
// pushed range name. A step graph run by the CPU executor pushes each node's name (this part needs no
// GPU, only a CUDA build); a training step on a GPU pushes its step-graph nodes' names and the CUDA
// backend's op names (matmul, layer_norm, attention, cross_entropy, adamw_update, ...). Skipped in a
// CPU build, where NvtxRange compiles to nothing, and the GPU part without a CUDA device.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "launcher/trainer.h"
#include "runtime/graph/executor.h"
#include "runtime/graph/scheduler.h"
#include "runtime/graph/step_graph.h"
#include "tests/support/cuda_expectations.h"

namespace weft {
namespace {

#if defined(WEFT_HAVE_CUDA) && defined(WEFT_NVTX_RECORDER_PATH)

// The recorder library: beside this program when it is there (tools/device/build-for-gpu packs the
// two together for the GPU machine, where the build folder's path does not exist), else where the
// build put it.
const std::string& recorder_path() {
  static const std::string path = [] {
    std::error_code error;
    const std::filesystem::path beside =
        std::filesystem::read_symlink("/proc/self/exe", error).parent_path() /
        std::filesystem::path(WEFT_NVTX_RECORDER_PATH).filename();
    return !error && std::filesystem::exists(beside) ? beside.string() : std::string(WEFT_NVTX_RECORDER_PATH);
  }();
  return path;
}

// Before any NVTX call of the process (NVTX reads the variable at its first call, per module).
const bool injection_configured = [] {
  setenv("NVTX_INJECTION64_PATH", recorder_path().c_str(), 1);
  return true;
}();

// Every range name pushed so far, in order (empty when the recorder was never loaded).
std::vector<std::string> recorded_names() {
  void* library = dlopen(recorder_path().c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return {};
  const auto count = reinterpret_cast<size_t (*)()>(dlsym(library, "weft_nvtx_recorded_count"));
  const auto name = reinterpret_cast<const char* (*)(size_t)>(dlsym(library, "weft_nvtx_recorded_name"));
  std::vector<std::string> names;
  for (size_t i = 0; count != nullptr && name != nullptr && i < count(); ++i) names.emplace_back(name(i));
  dlclose(library);
  return names;
}

std::vector<std::string> names_since(size_t first) {
  const std::vector<std::string> all = recorded_names();
  return std::vector<std::string>(all.begin() + static_cast<std::ptrdiff_t>(std::min(first, all.size())), all.end());
}

TEST(NvtxRanges, CpuExecutorPushesEveryNodeName) {
  ASSERT_TRUE(injection_configured);
  using namespace graph;
  StepGraph graph;
  int ran = 0;
  const auto work = [&ran](const NodeContext&) -> CompletionPtr {
    ++ran;
    return nullptr;
  };
  const NodeId forward = graph.add_node({.kind = NodeKind::kForward, .name = "forward mb0", .micro_batch = 0, .work = work});
  const NodeId backward =
      graph.add_node({.kind = NodeKind::kBackward, .name = "backward mb0", .micro_batch = 0, .work = work}, {forward});
  graph.add_node({.kind = NodeKind::kCollective, .name = "all_reduce bucket 0", .stream = StreamClass::kDpComm,
                  .work = work},
                 {backward});
  const size_t before = recorded_names().size();
  Executor executor(Device::cpu());
  executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));
  const std::vector<std::string> names = names_since(before);
  ASSERT_FALSE(recorded_names().empty()) << "NVTX did not load the recorder from NVTX_INJECTION64_PATH="
                                         << recorder_path();
  EXPECT_EQ(ran, 3);
  const std::set<std::string> pushed(names.begin(), names.end());
  for (const char* node : {"forward mb0", "backward mb0", "all_reduce bucket 0"}) {
    EXPECT_TRUE(pushed.count(node)) << "no NVTX range named '" << node << "'";
  }
}

TEST(NvtxRanges, GpuTrainingStepPushesNodeAndOpNames) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device: the training step's ranges need a GPU");
  const auto text_path = std::filesystem::temp_directory_path() / "weft-nvtx-text.txt";
  {
    std::ofstream text(text_path);
    for (int i = 0; i < 200; ++i) text << "the quick brown fox jumps over the lazy dog " << i % 7 << ".\n";
  }
  RunConfig config;
  config.model.layers = 1;
  config.model.dim = 64;
  config.model.heads = 1;
  config.model.seq_len = 64;
  config.train.batch_size = 4;
  config.train.steps = 1;
  config.train.warmup_steps = 0;
  config.data.train = text_path.string();
  config.data.val_every = 0;
  config.log.progress = "plain";
  // The CPU run gives the step graph's node names; the GPU run must push those and its ops'.
  config.train.device = "cpu";
  size_t before = recorded_names().size();
  Trainer(config).run();
  const std::vector<std::string> cpu_names = names_since(before);
  ASSERT_FALSE(cpu_names.empty()) << "no range pushed by the CPU step";
  config.train.device = "cuda";
  before = recorded_names().size();
  Trainer(config).run();
  const std::vector<std::string> gpu_names = names_since(before);
  const std::set<std::string> pushed(gpu_names.begin(), gpu_names.end());
  for (const std::string& node : cpu_names) EXPECT_TRUE(pushed.count(node)) << "node '" << node << "' not pushed on the GPU";
  for (const char* op : {"matmul_bias", "layer_norm", "attention", "cross_entropy_with_gradient", "rescale_unless_expected",
                         "attention_backward", "layer_norm_backward", "embedding_backward", "adamw_update"}) {
    EXPECT_TRUE(pushed.count(op)) << "no NVTX range for the op '" << op << "'";
  }
}

#else

TEST(NvtxRanges, NeedACudaBuild) { GTEST_SKIP() << "CPU build: NvtxRange compiles to nothing"; }

#endif

}  // namespace
}  // namespace weft
