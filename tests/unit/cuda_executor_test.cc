// Executor on CUDA streams: cross-stream dependencies are honoured through events (data checks),
// a copy on a comm stream overlaps matmuls on the compute stream in the auto mode and not in the
// manual mode, a signal fired inside a node lets a comm stream start before the node ends, and an
// exception in a node leaves execute() and the executor usable, two steps in flight run ahead of
// the host and read back their own values, and a node that blocks the host (a pipeline receive)
// runs off the issuing thread. Skipped without a GPU.
//
// "Compute" is a chain of bf16 matmuls on the compute stream; "communication" is a host<->device
// copy through pinned memory on a comm stream (a DMA engine, so it can truly run beside kernels).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/graph/executor.h"
#include "runtime/ops/matmul.h"
#include "runtime/tensor.h"
#include "tests/support/cuda_expectations.h"
#include "tests/support/node_specs.h"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft::graph {
namespace {

#ifdef WEFT_HAVE_CUDA

const Device kGpu = Device::cuda(0);

using testing::node_spec;

// `count` 4096^3 bf16 matmuls on the current stream (about 0.2 ms each on an H200).
void matmuls(const Tensor& a, int count) {
  Tensor out = a;
  for (int i = 0; i < count; ++i) out = matmul(a, a);
}

struct Buffers {
  static constexpr size_t kCopyBytes = size_t(1) << 30;  // about 20 ms over PCIe
  Tensor a = Tensor::normal({4096, 4096}, 1, 0, 0.0, 0.01, kBFloat16).to(kGpu);
  cuda::PinnedBuffer host{kCopyBytes};
  void* device = nullptr;
  Buffers() { WEFT_CUDA_CHECK(cudaMalloc(&device, kCopyBytes)); }
  ~Buffers() { cudaFree(device); }
  void upload(cudaStream_t stream) const {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), kCopyBytes, cudaMemcpyHostToDevice, stream));
  }
};

TEST(CudaExecutor, CopyOverlapsMatmulsInAutoModeOnly) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  StepGraph graph;
  const NodeId compute = graph.add_node(node_spec(NodeKind::kBackward, "backward", StreamClass::kCompute,
                                             task([&] { matmuls(buffers.a, 100); })));
  const NodeId comm = graph.add_node(node_spec(NodeKind::kCollective, "upload", StreamClass::kDpComm,
                                          [&](const NodeContext& ctx) -> CompletionPtr {
                                            buffers.upload(ctx.cuda_stream());
                                            return nullptr;
                                          }));
  Executor executor(kGpu);
  executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));  // warm-up: cuBLAS handles, caches
  const StepTimeline overlapped = executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));
  const StepTimeline serial = executor.execute(graph, Scheduler::plan(graph, CommMode::kManual));
  const auto& o = overlapped.nodes;
  std::printf("auto: step %.2f ms, compute %.2f, comm %.2f, exposed %.2f, overlap %.2f\n", overlapped.step_ms,
              overlapped.compute_ms, overlapped.comm_ms, overlapped.exposed_comm_ms, overlapped.overlap_ratio);
  std::printf("manual: step %.2f ms, compute %.2f, comm %.2f, exposed %.2f, overlap %.2f\n", serial.step_ms,
              serial.compute_ms, serial.comm_ms, serial.exposed_comm_ms, serial.overlap_ratio);
  EXPECT_GT(o[compute].duration_ms(), 5.0);
  EXPECT_GT(o[comm].duration_ms(), 5.0);
  EXPECT_LT(overlapped.step_ms, 0.85 * (o[compute].duration_ms() + o[comm].duration_ms()));
  EXPECT_LT(overlapped.exposed_comm_ms, overlapped.comm_ms);
  EXPECT_GE(serial.step_ms, 0.95 * (serial.nodes[compute].duration_ms() + serial.nodes[comm].duration_ms()));
  EXPECT_GE(serial.exposed_comm_ms, 0.95 * serial.comm_ms);
  EXPECT_GE(serial.nodes[comm].start_ms, serial.nodes[compute].end_ms - 0.01);
  const std::string trace = overlapped.to_chrome_trace_json();
  EXPECT_NE(trace.find("\"upload\""), std::string::npos);
}

// compute: matmuls, then sets a device buffer to 7s; dp_comm (depends on it): copies the buffer to
// the host; compute (depends on the copy): overwrites the buffer with 0s. The host sees 7s only if
// the comm stream waited for the first node and the last node waited for the copy.
TEST(CudaExecutor, CrossStreamDependenciesAreEvents) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  constexpr size_t kBytes = 64 << 20;
  std::memset(buffers.host.data(), 1, kBytes);
  WEFT_CUDA_CHECK(cudaMemset(buffers.device, 1, kBytes));
  StepGraph graph;
  const NodeId produce = graph.add_node(node_spec(NodeKind::kBackward, "produce", StreamClass::kCompute,
                                             [&](const NodeContext& ctx) -> CompletionPtr {
                                               matmuls(buffers.a, 50);
                                               WEFT_CUDA_CHECK(cudaMemsetAsync(buffers.device, 7, kBytes, ctx.cuda_stream()));
                                               return nullptr;
                                             }));
  const NodeId copy = graph.add_node(node_spec(NodeKind::kCollective, "download", StreamClass::kDpComm,
                                          [&](const NodeContext& ctx) -> CompletionPtr {
                                            WEFT_CUDA_CHECK(cudaMemcpyAsync(buffers.host.data(), buffers.device, kBytes,
                                                                            cudaMemcpyDeviceToHost, ctx.cuda_stream()));
                                            return nullptr;
                                          }),
                                     {produce});
  graph.add_node(node_spec(NodeKind::kOptimizer, "overwrite", StreamClass::kCompute, [&](const NodeContext& ctx) -> CompletionPtr {
                   WEFT_CUDA_CHECK(cudaMemsetAsync(buffers.device, 0, kBytes, ctx.cuda_stream()));
                   return nullptr;
                 }),
                 {copy});
  Executor executor(kGpu);
  const StepTimeline timeline = executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));
  const auto* bytes = buffers.host.data_as<unsigned char>();
  size_t wrong = 0;
  for (size_t i = 0; i < kBytes; ++i) wrong += bytes[i] != 7;
  EXPECT_EQ(wrong, 0u);
  for (const Node& node : graph.nodes()) {
    for (NodeId dependency : node.dependencies) {
      EXPECT_GE(timeline.nodes[node.id].start_ms, timeline.nodes[dependency].end_ms - 0.01) << node.name;
    }
  }
}

// backward: matmuls, buffer := 7, fire "bucket ready", more matmuls. The download (dp_comm) waits
// for the signal only: it must start before backward ends, and still see the 7s.
TEST(CudaExecutor, SignalStartsCommunicationInsideItsProducer) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  constexpr size_t kBytes = 256 << 20;
  WEFT_CUDA_CHECK(cudaMemset(buffers.device, 1, kBytes));
  StepGraph graph;
  NodeId ready = -1;
  const NodeId backward = graph.add_node(node_spec(NodeKind::kBackward, "backward", StreamClass::kCompute,
                                              [&](const NodeContext& ctx) -> CompletionPtr {
                                                matmuls(buffers.a, 30);
                                                WEFT_CUDA_CHECK(cudaMemsetAsync(buffers.device, 7, kBytes, ctx.cuda_stream()));
                                                ctx.fire(ready);
                                                matmuls(buffers.a, 100);
                                                return nullptr;
                                              }));
  ready = graph.add_signal("bucket ready", backward);
  const NodeId copy = graph.add_node(node_spec(NodeKind::kCollective, "download bucket", StreamClass::kDpComm,
                                          [&](const NodeContext& ctx) -> CompletionPtr {
                                            WEFT_CUDA_CHECK(cudaMemcpyAsync(buffers.host.data(), buffers.device, kBytes,
                                                                            cudaMemcpyDeviceToHost, ctx.cuda_stream()));
                                            return nullptr;
                                          }),
                                     {ready});
  graph.add_node(node_spec(NodeKind::kOptimizer, "optimizer", StreamClass::kCompute, nullptr), {copy});
  Executor executor(kGpu);
  executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));  // warm-up
  std::memset(buffers.host.data(), 1, kBytes);
  const StepTimeline timeline = executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));
  const auto& t = timeline.nodes;
  std::printf("backward [%.2f, %.2f], signal %.2f, download [%.2f, %.2f], step %.2f, exposed %.2f\n",
              t[backward].start_ms, t[backward].end_ms, t[ready].start_ms, t[copy].start_ms, t[copy].end_ms,
              timeline.step_ms, timeline.exposed_comm_ms);
  EXPECT_LT(t[copy].start_ms, t[backward].end_ms - 1.0);
  EXPECT_GE(t[copy].start_ms, t[ready].end_ms - 0.01);
  EXPECT_GT(t[ready].start_ms, t[backward].start_ms + 1.0);
  const auto* bytes = buffers.host.data_as<unsigned char>();
  size_t wrong = 0;
  for (size_t i = 0; i < kBytes; ++i) wrong += bytes[i] != 7;
  EXPECT_EQ(wrong, 0u);
}

TEST(CudaExecutor, ExceptionPropagatesAndExecutorStaysUsable) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  StepGraph graph;
  const NodeId compute = graph.add_node(node_spec(NodeKind::kForward, "forward", StreamClass::kCompute,
                                             task([&] { matmuls(buffers.a, 5); })));
  graph.add_node(node_spec(NodeKind::kCollective, "broken", StreamClass::kDpComm,
                      task([] { throw std::runtime_error("collective failed"); })),
                 {compute});
  Executor executor(kGpu);
  EXPECT_THROW(executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto)), std::runtime_error);
  StepGraph healthy;
  healthy.add_node(node_spec(NodeKind::kForward, "forward", StreamClass::kCompute, task([&] { matmuls(buffers.a, 2); })));
  healthy.add_node(node_spec(NodeKind::kCollective, "upload", StreamClass::kDpComm, [&](const NodeContext& ctx) -> CompletionPtr {
                     WEFT_CUDA_CHECK(cudaMemcpyAsync(buffers.device, buffers.host.data(), 1 << 20,
                                                     cudaMemcpyHostToDevice, ctx.cuda_stream()));
                     return nullptr;
                   }));
  const StepTimeline timeline = executor.execute(healthy, Scheduler::plan(healthy, CommMode::kAuto));
  EXPECT_GT(timeline.step_ms, 0.0);
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
}

// Two steps in flight: each writes its own value into one device tensor after about 10 ms of
// matmuls. The second issue() returns while the GPU still runs (the point of issuing ahead), and
// each finish() hands back its own step's value, copied at that step's end.
TEST(CudaExecutor, StepsInFlightRunAheadOfTheHostAndReadBackTheirOwnValues) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  Tensor counter = Tensor::zeros({1024}, kFloat32, kGpu);  // [1024] f32
  double value = 0.0;
  StepGraph graph;
  const NodeId write = graph.add_node(node_spec(NodeKind::kForward, "matmuls, then write", StreamClass::kCompute,
                                                task([&] {
                                                  matmuls(buffers.a, 50);
                                                  counter.fill_(value);
                                                })));
  graph.add_node(node_spec(NodeKind::kCollective, "upload", StreamClass::kDpComm, [&](const NodeContext& ctx) -> CompletionPtr {
                   WEFT_CUDA_CHECK(cudaMemcpyAsync(buffers.device, buffers.host.data(), 1 << 20,
                                                   cudaMemcpyHostToDevice, ctx.cuda_stream()));
                   return nullptr;
                 }),
                 {write});
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  Executor executor(kGpu);
  executor.execute(graph, plan);  // warm-up: cuBLAS handles, caches
  const Executor::ReadBack read_counter = [&] { return std::vector<Tensor>{counter}; };
  value = 1.0;
  executor.issue(graph, plan, read_counter);
  value = 2.0;
  executor.issue(graph, plan, read_counter);
  EXPECT_EQ(cudaStreamQuery(cuda::current_stream(0)), cudaErrorNotReady);  // the GPU is still busy
  cudaGetLastError();
  EXPECT_THROW(executor.issue(graph, plan, read_counter), weft::Error);
  const Executor::FinishedStep first = executor.finish();
  const Executor::FinishedStep second = executor.finish();
  EXPECT_EQ(first.read_back[0].to_vector(), std::vector<double>(1024, 1.0));
  EXPECT_EQ(second.read_back[0].to_vector(), std::vector<double>(1024, 2.0));
  EXPECT_TRUE(first.read_back[0].device().is_cpu());
  EXPECT_GT(first.timeline.nodes[write].duration_ms(), 3.0);
  EXPECT_GT(second.timeline.nodes[write].duration_ms(), 3.0);
  EXPECT_GE(second.timeline.end_clock_ms, first.timeline.end_clock_ms);
  // The second step was issued before the first ended, so it is laid out from the first's end.
  EXPECT_GE(second.timeline.start_clock_ms, first.timeline.start_clock_ms + first.timeline.step_ms - 0.01);
  std::printf("steps of %.2f and %.2f ms, ends %.2f ms apart\n", first.timeline.step_ms, second.timeline.step_ms,
              second.timeline.end_clock_ms - first.timeline.end_clock_ms);
}

// An executor destroyed with a step in flight (a run that fails at the step before) waits for it:
// the stream is idle as soon as the destructor returns (the step's 50 matmuls take about 10 ms, so
// a destructor that did not wait leaves it busy), no error is left on the device, and a new
// executor works.
TEST(CudaExecutor, DestroyedWithAStepInFlightLeavesTheDeviceUsable) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  Tensor counter = Tensor::zeros({1024}, kFloat32, kGpu);  // [1024] f32
  StepGraph graph;
  graph.add_node(node_spec(NodeKind::kForward, "matmuls, then write", StreamClass::kCompute, task([&] {
                             matmuls(buffers.a, 50);
                             counter.fill_(3.0);
                           })));
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  {
    Executor executor(kGpu);
    executor.issue(graph, plan, [&] { return std::vector<Tensor>{counter}; });
  }
  EXPECT_EQ(cudaStreamQuery(cuda::current_stream(0)), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter.to(Device::cpu()).to_vector(), std::vector<double>(1024, 3.0));
  Executor executor(kGpu);
  EXPECT_GT(executor.execute(graph, plan).step_ms, 0.0);
}

// A pipeline stage in miniature: "recv" (p2p, blocks_host) waits on the host for a message that
// only "send" (compute, issued after the compute list has waited for "posted" on p2p) produces, as
// a receive waits for a peer that needs this rank's send first. Issued from one thread the step
// would hang in "recv" before reaching "send"; the executor runs "recv" on a host worker. The
// receive then writes the message to the device on its stream and fires "message in", which the
// dp_comm download waits for; "consume" on compute waits for the whole receive and reads the
// second buffer it wrote after the signal. Both must see the values, and the receive's time on
// the timeline covers its wait for the send.
TEST(CudaExecutor, AHostBlockingNodeRunsOffTheIssuingThread) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  constexpr size_t kBytes = 16 << 20;
  Tensor second = Tensor::zeros({1024}, kFloat32, kGpu);  // [1024] f32
  std::vector<float> downloaded(1024, 0.0f);
  std::mutex mutex;
  std::condition_variable changed;
  bool sent = false;
  std::thread::id receive_thread;
  StepGraph graph;
  const NodeId warm = graph.add_node(node_spec(NodeKind::kForward, "forward", StreamClass::kCompute,
                                               task([&] { matmuls(buffers.a, 20); })));
  const NodeId posted = graph.add_node(node_spec(NodeKind::kOther, "posted", StreamClass::kP2p, nullptr));
  NodeId message_in = -1;
  graph::NodeSpec receive_spec = node_spec(
      NodeKind::kRecv, "recv", StreamClass::kP2p, [&](const NodeContext& ctx) -> CompletionPtr {
        receive_thread = std::this_thread::get_id();
        {
          std::unique_lock<std::mutex> lock(mutex);
          if (!changed.wait_for(lock, std::chrono::seconds(20), [&] { return sent; })) {
            throw std::runtime_error("recv: the send never came (the issuing thread is held)");
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the message's transfer
        WEFT_CUDA_CHECK(cudaMemsetAsync(buffers.device, 5, kBytes, ctx.cuda_stream()));
        ctx.fire(message_in);
        second.fill_(9.0);  // on the current stream: the p2p stream
        return nullptr;
      });
  receive_spec.blocks_host = true;
  const NodeId receive = graph.add_node(std::move(receive_spec), {posted});
  message_in = graph.add_signal("message in", receive);
  const NodeId send = graph.add_node(node_spec(NodeKind::kSend, "send", StreamClass::kCompute, task([&] {
                                                 {
                                                   std::lock_guard<std::mutex> lock(mutex);
                                                   sent = true;
                                                 }
                                                 changed.notify_all();
                                               })),
                                     {warm, posted});
  const NodeId download = graph.add_node(
      node_spec(NodeKind::kCollective, "download", StreamClass::kDpComm, [&](const NodeContext& ctx) -> CompletionPtr {
        WEFT_CUDA_CHECK(cudaMemcpyAsync(buffers.host.data(), buffers.device, kBytes, cudaMemcpyDeviceToHost,
                                        ctx.cuda_stream()));
        return nullptr;
      }),
      {message_in});
  const NodeId consume = graph.add_node(
      node_spec(NodeKind::kBackward, "consume", StreamClass::kCompute, [&](const NodeContext& ctx) -> CompletionPtr {
        WEFT_CUDA_CHECK(cudaMemcpyAsync(downloaded.data(), second.raw_data(), 1024 * sizeof(float),
                                        cudaMemcpyDeviceToHost, ctx.cuda_stream()));
        return nullptr;
      }),
      {receive, send});
  graph.add_node(node_spec(NodeKind::kOptimizer, "optimizer", StreamClass::kCompute, nullptr), {download, consume});
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  // The plan makes one issuing thread meet the receive first: compute waits for "posted" before
  // "send", so the loop has gone over to the p2p list, whose next node is the receive.
  const std::vector<Instruction>& compute = plan.list(StreamClass::kCompute);
  ASSERT_GE(compute.size(), 3u);
  EXPECT_EQ(compute[1].op, Instruction::Op::kWait);
  EXPECT_EQ(compute[1].node, posted);
  Executor executor(kGpu);
  for (int round = 0; round < 2; ++round) {  // the worker is kept across steps
    sent = false;
    std::memset(buffers.host.data(), 1, kBytes);
    second.fill_(0.0);
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
    const StepTimeline timeline = executor.execute(graph, plan);
    const auto* bytes = buffers.host.data_as<unsigned char>();
    size_t wrong = 0;
    for (size_t i = 0; i < kBytes; ++i) wrong += bytes[i] != 5;
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(std::vector<double>(downloaded.begin(), downloaded.end()), std::vector<double>(1024, 9.0));
    EXPECT_NE(receive_thread, std::this_thread::get_id());
    const auto& t = timeline.nodes;
    EXPECT_GE(t[download].start_ms, t[message_in].end_ms - 0.01);
    EXPECT_GE(t[consume].start_ms, t[receive].end_ms - 0.01);
    EXPECT_GT(t[receive].duration_ms(), 15.0);  // the wait and the transfer's 20 ms
    std::printf("round %d: recv [%.2f, %.2f], message in %.2f, send [%.2f, %.2f], consume %.2f, step %.2f ms\n",
                round, t[receive].start_ms, t[receive].end_ms, t[message_in].start_ms, t[send].start_ms,
                t[send].end_ms, t[consume].start_ms, timeline.step_ms);
  }
}

// A host-blocking node that throws: execute() rethrows it once the other lists have stopped, and
// the executor (and its host worker) runs the next step.
TEST(CudaExecutor, AHostBlockingNodeThatThrowsLeavesTheExecutorUsable) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Buffers buffers;
  bool fail = true;
  StepGraph graph;
  graph.add_node(node_spec(NodeKind::kForward, "forward", StreamClass::kCompute, task([&] { matmuls(buffers.a, 5); })));
  graph::NodeSpec receive = node_spec(NodeKind::kRecv, "recv", StreamClass::kP2p, task([&] {
                                        if (fail) throw std::runtime_error("the peer is gone");
                                      }));
  receive.blocks_host = true;
  const NodeId received = graph.add_node(std::move(receive));
  graph.add_node(node_spec(NodeKind::kBackward, "backward", StreamClass::kCompute, task([&] { matmuls(buffers.a, 5); })),
                 {received});
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  Executor executor(kGpu);
  EXPECT_THROW(executor.execute(graph, plan), std::runtime_error);
  fail = false;
  EXPECT_GT(executor.execute(graph, plan).step_ms, 0.0);
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
}

#else

TEST(CudaExecutor, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace weft::graph
