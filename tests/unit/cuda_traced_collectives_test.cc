// TracedProcessGroup on CUDA (parallel/comm/traced_process_group.h): a collective given the tp_comm
// stream is ordered after the compute queued before it, and a step's timeline counts it as
// communication and the compute stream's wait for it as exposed: all of it where compute waits at
// once (the manual mode's way), none of it where compute ran on under it (the auto mode's), all of
// it where it ran on the compute stream itself or where the call blocked the host until it was done
// (the compute stream ran dry meanwhile). Skipped without a GPU.
//
// "Compute" is a chain of bf16 matmuls on the compute stream; the "collective" is a fake group's
// all-reduce that copies its tensor to pinned host memory on the stream it is given (a DMA engine,
// so it can truly run beside the matmuls), long enough to measure.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/traced_process_group.h"
#include "runtime/error.h"
#include "runtime/graph/step_timeline.h"
#include "runtime/ops/matmul.h"
#include "runtime/tensor.h"
#include "tests/support/cuda_expectations.h"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "parallel/comm/cuda_collective_handle.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft {
namespace {

#ifdef WEFT_HAVE_CUDA

const Device kGpu = Device::cuda(0);

// `count` 4096^3 bf16 matmuls on the current stream (about 0.2 ms each on an H200).
void matmuls(const Tensor& a, int count) {
  Tensor out = a;
  for (int i = 0; i < count; ++i) out = matmul(a, a);
}

// A group of one whose all_reduce copies the tensor into `host` on the given stream (the caller's
// current stream where none is given); with `blocks_host`, the call returns once the copy is done,
// as the host-staged group's do. Nothing else is called here.
class CopyingGroup final : public ProcessGroup {
 public:
  explicit CopyingGroup(void* host, bool blocks_host = false) : host_(host), blocks_host_(blocks_host) {}
  int size() const override { return 1; }
  int rank() const override { return 0; }
  const std::string& name() const override { return name_; }
  Device device() const override { return kGpu; }
  const std::vector<int>& world_ranks() const override { return ranks_; }

  CollectiveHandlePtr all_reduce(const Tensor& tensor, Reduction, const CommStream& stream) override {
    cudaStream_t cuda_stream = stream.is_cuda() && stream.cuda_stream() ? stream.cuda_stream() : cuda::current_stream(0);
    const int64_t bytes = tensor.numel() * tensor.element_size();
    auto handle = std::make_shared<CudaCollectiveHandle>("all_reduce(copy) on test", bytes, 0, cuda_stream,
                                                         std::vector<Tensor>{tensor});
    WEFT_CUDA_CHECK(cudaMemcpyAsync(host_, tensor.raw_data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                    cuda_stream));
    handle->record_end();
    if (blocks_host_) WEFT_CUDA_CHECK(cudaStreamSynchronize(cuda_stream));
    return handle;
  }
  CollectiveHandlePtr reduce_scatter(const Tensor&, const Tensor&, Reduction, const CommStream&) override { return fail(); }
  CollectiveHandlePtr all_gather(const Tensor&, const Tensor&, const CommStream&) override { return fail(); }
  CollectiveHandlePtr broadcast(const Tensor&, int, const CommStream&) override { return fail(); }
  CollectiveHandlePtr send(const Tensor&, int, const CommStream&) override { return fail(); }
  CollectiveHandlePtr recv(const Tensor&, int, const CommStream&) override { return fail(); }
  CollectiveHandlePtr exchange(const Tensor&, int, const Tensor&, int, const CommStream&) override { return fail(); }
  CollectiveHandlePtr barrier(const CommStream&) override { return fail(); }

 private:
  static CollectiveHandlePtr fail() { WEFT_FAIL("CopyingGroup: only all_reduce is implemented"); }
  void* host_;
  bool blocks_host_;
  std::string name_ = "test";
  std::vector<int> ranks_ = {0};
};

struct Fixture {
  explicit Fixture(bool blocks_host = false) : blocks_host(blocks_host) {}
  bool blocks_host;
  static constexpr int64_t kElements = int64_t(64) << 20;  // f32: 256 MB, some ms over the DMA engine
  Tensor a = Tensor::normal({4096, 4096}, 1, 0, 0.0, 0.01, kBFloat16).to(kGpu);
  Tensor data = Tensor::zeros({kElements}, kFloat32, kGpu);
  cuda::PinnedBuffer host{static_cast<size_t>(kElements) * 4};
  std::shared_ptr<CollectiveRecorder> recorder = std::make_shared<CollectiveRecorder>();
  TracedProcessGroup group{std::make_shared<CopyingGroup>(host.data(), blocks_host), recorder};
  cuda::Stream tp_stream{0};
  cuda::Event start{true};
  cuda::Event end{true};

  CommStream tp() const { return CommStream::cuda(tp_stream.get(), 0); }

  // Runs `body` as one step: the step's start and end events around it on the compute stream, the
  // recorder active, and returns the timeline of one compute node over the whole step with the
  // recorded collectives and waits added.
  template <class Body>
  graph::StepTimeline step(Body&& body) {
    const cudaStream_t compute = cuda::current_stream(0);
    recorder->begin();
    start.record(compute);
    body();
    end.record(compute);
    const CollectiveRecorder::Step recorded = recorder->take();
    end.synchronize();
    graph::StepTimeline timeline;
    graph::NodeTiming node;
    node.node = 0;
    node.name = "compute";
    node.end_ms = end.elapsed_since(start);
    timeline.nodes.push_back(node);
    timeline.step_ms = node.end_ms;
    add_recorded_collectives(recorded, &start, timeline);
    return timeline;
  }
  float first_host_value() const { return *static_cast<const float*>(host.data()); }
};

TEST(CudaTracedCollectives, TheTpStreamWaitsForComputeAndAnImmediateWaitIsExposed) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Fixture f;
  const graph::StepTimeline timeline = f.step([&] {
    matmuls(f.a, 30);
    f.data.fill_(7.0);  // the last compute before the collective: it must see these 7s
    f.group.all_reduce(f.data, Reduction::kSum, f.tp())->wait();
  });
  EXPECT_EQ(f.first_host_value(), 7.0f) << "the collective on the tp stream did not wait for the compute before it";
  ASSERT_EQ(timeline.nodes.size(), 2u);
  const graph::NodeTiming& collective = timeline.nodes[1];
  EXPECT_EQ(collective.stream, graph::StreamClass::kTpComm);
  EXPECT_EQ(collective.bytes, Fixture::kElements * 4);
  EXPECT_GT(collective.duration_ms(), 0.5);
  EXPECT_GT(timeline.comm_ms, 0.5);
  // The compute stream reached the wait as the copy began and stood still to its end.
  ASSERT_EQ(timeline.compute_waits.size(), 1u);
  EXPECT_NEAR(timeline.compute_waits[0].end_ms, collective.end_ms, 1e-3);
  EXPECT_GT(timeline.exposed_comm_ms, 0.9 * timeline.comm_ms);
  EXPECT_LT(timeline.compute_ms, timeline.step_ms - 0.9 * timeline.comm_ms);
}

TEST(CudaTracedCollectives, ComputeThatRunsOnUnderTheCollectiveHidesIt) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Fixture f;
  const graph::StepTimeline timeline = f.step([&] {
    CollectiveHandlePtr moving = f.group.all_reduce(f.data, Reduction::kSum, f.tp());
    matmuls(f.a, 150);  // tens of ms: far longer than the copy
    moving->wait();
  });
  ASSERT_EQ(timeline.nodes.size(), 2u);
  EXPECT_GT(timeline.comm_ms, 0.5);
  EXPECT_TRUE(timeline.compute_waits.empty()) << "the copy had ended when the compute stream reached its wait";
  EXPECT_LT(timeline.exposed_comm_ms, 0.1 * timeline.comm_ms);
  EXPECT_GT(timeline.overlap_ratio, 0.9);
}

TEST(CudaTracedCollectives, ACollectiveOnTheComputeStreamIsAllExposed) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Fixture f;
  const graph::StepTimeline timeline = f.step([&] {
    matmuls(f.a, 10);
    f.group.all_reduce(f.data, Reduction::kSum, CommStream())->wait();
    matmuls(f.a, 10);
  });
  ASSERT_EQ(timeline.nodes.size(), 2u);
  const graph::NodeTiming& collective = timeline.nodes[1];
  ASSERT_EQ(timeline.compute_waits.size(), 1u);
  EXPECT_NEAR(timeline.compute_waits[0].start_ms, collective.start_ms, 1e-3);
  EXPECT_NEAR(timeline.compute_waits[0].end_ms, collective.end_ms, 1e-3);
  EXPECT_NEAR(timeline.exposed_comm_ms, timeline.comm_ms, 1e-3);
}

TEST(CudaTracedCollectives, ACollectiveThatBlocksTheHostIsExposedFromItsCall) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Fixture f(/*blocks_host=*/true);
  const graph::StepTimeline timeline = f.step([&] {
    matmuls(f.a, 30);
    f.data.fill_(7.0);
    f.group.all_reduce(f.data, Reduction::kSum, f.tp())->wait();
    matmuls(f.a, 10);
  });
  EXPECT_EQ(f.first_host_value(), 7.0f);
  ASSERT_EQ(timeline.nodes.size(), 2u);
  const graph::NodeTiming& collective = timeline.nodes[1];
  // The compute stream ran dry while the host sat in the call: exposed from the end of the compute
  // before it (where the copy began) to the copy's end.
  ASSERT_FALSE(timeline.compute_waits.empty());
  EXPECT_LE(timeline.compute_waits[0].start_ms, collective.start_ms + 1e-3);
  EXPECT_NEAR(timeline.compute_waits[0].end_ms, collective.end_ms, 1e-3);
  EXPECT_GT(timeline.exposed_comm_ms, 0.9 * timeline.comm_ms);
}

TEST(CudaTracedCollectives, NothingIsRecordedOutsideAStep) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  Fixture f;
  f.group.all_reduce(f.data, Reduction::kSum, f.tp())->wait();
  const graph::StepTimeline timeline = f.step([] {});
  EXPECT_EQ(timeline.nodes.size(), 1u);
  EXPECT_TRUE(timeline.compute_waits.empty());
  EXPECT_EQ(timeline.comm_ms, 0.0);
}

#endif  // WEFT_HAVE_CUDA

}  // namespace
}  // namespace weft
