// Executor on the CPU: real overlap in the auto mode (a comm thread), none in the manual mode,
// dependencies respected in the recorded times, signals fired from inside a node, Completions that
// finish after their work returns, and an exception in any node leaving execute() on the caller's
// thread without a hang; steps in flight finished in order with their own read-backs. Bounds on
// times are generous: CI machines are loaded.
#include "runtime/graph/executor.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "runtime/error.h"
#include "runtime/tensor.h"
#include "tests/support/node_specs.h"

namespace weft::graph {
namespace {

using namespace std::chrono_literals;

using testing::node_spec;

NodeWork sleep_for(std::chrono::milliseconds duration, std::thread::id* ran_on = nullptr) {
  return task([duration, ran_on] {
    if (ran_on != nullptr) *ran_on = std::this_thread::get_id();
    std::this_thread::sleep_for(duration);
  });
}

// A collective on dp_comm and an independent compute node, 50 ms each.
struct OverlapGraph {
  StepGraph graph;
  std::thread::id collective_thread;
  std::thread::id compute_thread;
  OverlapGraph() {
    graph.add_node(node_spec(NodeKind::kCollective, "all_reduce bucket 0", StreamClass::kDpComm,
                        sleep_for(50ms, &collective_thread)));
    graph.add_node(node_spec(NodeKind::kBackward, "backward mb0", StreamClass::kCompute, sleep_for(50ms, &compute_thread)));
  }
};

// Whether overlap happened is at the mercy of the OS scheduler on a loaded machine (a comm thread
// that gets no core for 50 ms overlaps nothing), so the timing claims get three attempts; what must
// hold on every attempt (threads, order) is checked on each.
constexpr int kTimingAttempts = 3;

TEST(Executor, AutoModeOverlapsCommunicationWithCompute) {
  Executor executor;
  std::string last;
  for (int attempt = 0; attempt < kTimingAttempts; ++attempt) {
    OverlapGraph g;
    const StepTimeline timeline = executor.execute(g.graph, Scheduler::plan(g.graph, CommMode::kAuto));
    EXPECT_NE(g.collective_thread, std::this_thread::get_id());  // on the dp_comm thread
    EXPECT_EQ(g.compute_thread, std::this_thread::get_id());     // compute is the caller's thread
    EXPECT_EQ(timeline.nodes[0].stream, StreamClass::kDpComm);
    EXPECT_GE(timeline.step_ms, 49.0);
    EXPECT_GE(timeline.comm_ms, 49.0);
    EXPECT_GE(timeline.compute_ms, 49.0);
    if (timeline.step_ms < 85.0 && timeline.exposed_comm_ms < 20.0 && timeline.overlap_ratio > 0.6) return;
    last = "step_ms " + std::to_string(timeline.step_ms) + ", exposed_comm_ms " +
           std::to_string(timeline.exposed_comm_ms) + ", overlap_ratio " + std::to_string(timeline.overlap_ratio);
  }
  ADD_FAILURE() << "no overlap in " << kTimingAttempts << " attempts; last: " << last;
}

TEST(Executor, ManualModeWaitsForEachCollective) {
  OverlapGraph g;
  Executor executor;
  const StepTimeline timeline = executor.execute(g.graph, Scheduler::plan(g.graph, CommMode::kManual));
  EXPECT_EQ(g.collective_thread, std::this_thread::get_id());  // inline on compute
  EXPECT_GE(timeline.step_ms, 99.0);
  EXPECT_GE(timeline.exposed_comm_ms, 49.0);
  EXPECT_LT(timeline.overlap_ratio, 0.1);
  EXPECT_EQ(timeline.nodes[0].stream, StreamClass::kCompute);
  // Program order: the collective (added first) ran first.
  EXPECT_LE(timeline.nodes[0].end_ms, timeline.nodes[1].start_ms);
}

// Every node of a random DAG over all streams records [start, end]; no node starts before each of
// its dependencies has ended, in both modes and over repeated steps of one executor.
TEST(Executor, DependenciesAreRespected) {
  std::mt19937 random(7);
  StepGraph graph;
  std::atomic<int> runs{0};
  const NodeKind kinds[] = {NodeKind::kForward, NodeKind::kCollective, NodeKind::kSend, NodeKind::kBackward};
  for (int i = 0; i < 40; ++i) {
    const StreamClass stream = kAllStreamClasses[random() % kStreamClassCount];
    const NodeKind kind = stream == StreamClass::kCompute ? kinds[random() % 4] : NodeKind::kCollective;
    const auto duration = std::chrono::microseconds(200 + random() % 1500);
    std::vector<NodeId> dependencies;
    for (int j = 0; j < i; ++j) {
      if (random() % 6 == 0) dependencies.push_back(j);
    }
    graph.add_node(node_spec(kind, "n" + std::to_string(i), stream, task([duration, &runs] {
                          std::this_thread::sleep_for(duration);
                          ++runs;
                        })),
                   dependencies);
  }
  Executor executor;
  for (CommMode mode : {CommMode::kAuto, CommMode::kManual, CommMode::kAuto}) {
    runs = 0;
    const ExecutionPlan plan = Scheduler::plan(graph, mode);
    const StepTimeline timeline = executor.execute(graph, plan);
    EXPECT_EQ(runs.load(), graph.size());
    for (const Node& node : graph.nodes()) {
      const NodeTiming& timing = timeline.nodes[node.id];
      EXPECT_GE(timing.end_ms, timing.start_ms);
      EXPECT_GE(timing.start_ms, 0.0);
      EXPECT_LE(timing.end_ms, timeline.step_ms);
      for (NodeId dependency : node.dependencies) {
        EXPECT_GE(timing.start_ms, timeline.nodes[dependency].end_ms)
            << comm_mode_name(mode) << ": " << node.name << " started before " << graph.node(dependency).name;
      }
    }
  }
}

// Backward fires "bucket 1 ready" halfway (as a grad hook would); the bucket's all-reduce runs on
// dp_comm during the rest of backward, and the optimizer waits for both all-reduces.
TEST(Executor, SignalLetsCommunicationStartInsideItsProducer) {
  StepGraph graph;
  std::vector<NodeId> signals;  // filled below, read when backward runs
  const NodeId backward = graph.add_node(
      node_spec(NodeKind::kBackward, "backward mb0", StreamClass::kCompute, [&signals](const NodeContext& ctx) -> CompletionPtr {
        std::this_thread::sleep_for(30ms);
        ctx.fire(signals[0]);  // layer 1's gradients are ready
        std::this_thread::sleep_for(60ms);
        return nullptr;  // bucket 0's signal is fired by the executor at the end
      }));
  signals.push_back(graph.add_signal("bucket 1 ready", backward));
  signals.push_back(graph.add_signal("bucket 0 ready", backward));
  const NodeId reduce1 = graph.add_node(
      node_spec(NodeKind::kCollective, "all_reduce bucket 1", StreamClass::kDpComm, sleep_for(30ms)), {signals[0]});
  const NodeId reduce0 = graph.add_node(
      node_spec(NodeKind::kCollective, "all_reduce bucket 0", StreamClass::kDpComm, sleep_for(5ms)), {signals[1]});
  const NodeId optimizer =
      graph.add_node(node_spec(NodeKind::kOptimizer, "optimizer", StreamClass::kCompute, nullptr), {reduce1, reduce0});

  Executor executor;
  std::string last;
  bool overlapped = false;
  for (int attempt = 0; attempt < kTimingAttempts && !overlapped; ++attempt) {
    const StepTimeline timeline = executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));
    const auto& t = timeline.nodes;
    // Order, on every attempt.
    EXPECT_GE(t[reduce1].start_ms, t[signals[0]].end_ms);
    EXPECT_GE(t[signals[0]].start_ms, 29.0);
    EXPECT_GE(t[signals[1]].start_ms, t[backward].end_ms - 0.001);  // fired at backward's end
    EXPECT_GE(t[reduce0].start_ms, t[backward].end_ms);
    EXPECT_GE(t[optimizer].start_ms, t[reduce0].end_ms);
    EXPECT_GE(t[optimizer].start_ms, t[reduce1].end_ms);
    // Overlap: bucket 1 starts during backward and is hidden by it. Serial would be the sum of the
    // measured durations (about 125 ms), so stretched sleeps do not matter.
    const double serial = t[backward].duration_ms() + t[reduce1].duration_ms() + t[reduce0].duration_ms();
    overlapped = t[signals[0]].start_ms < t[backward].end_ms - 30.0 && t[reduce1].start_ms < t[backward].end_ms &&
                 timeline.step_ms < serial - 15.0 && timeline.exposed_comm_ms < timeline.comm_ms - 15.0;
    last = "bucket 1 at " + std::to_string(t[reduce1].start_ms) + " ms, backward ends at " +
           std::to_string(t[backward].end_ms) + " ms; step_ms " + std::to_string(timeline.step_ms) +
           " (serial " + std::to_string(serial) + "), exposed_comm_ms " + std::to_string(timeline.exposed_comm_ms);
  }
  EXPECT_TRUE(overlapped) << "bucket 1 did not overlap backward in " << kTimingAttempts << " attempts; last: " << last;

  // Manual: signals change nothing, everything in program order on compute.
  const StepTimeline manual = executor.execute(graph, Scheduler::plan(graph, CommMode::kManual));
  EXPECT_GE(manual.nodes[reduce1].start_ms, manual.nodes[backward].end_ms);
  EXPECT_GE(manual.step_ms, 124.0);
}

TEST(Executor, FiringAnotherNodesSignalFails) {
  StepGraph graph;
  NodeId foreign = -1;
  const NodeId a = graph.add_node(node_spec(NodeKind::kBackward, "a", StreamClass::kCompute, nullptr));
  graph.add_node(node_spec(NodeKind::kBackward, "b", StreamClass::kCompute, [&foreign](const NodeContext& ctx) {
                   ctx.fire(foreign);
                   return CompletionPtr();
                 }));
  foreign = graph.add_signal("a's signal", a);
  Executor executor;
  try {
    executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));
    FAIL() << "firing another node's signal was accepted";
  } catch (const weft::Error& error) {
    EXPECT_NE(std::string(error.what()).find("whose producer is 'a'"), std::string::npos) << error.what();
  }
}

// A Completion finished by another thread 40 ms after the work returned (a queued collective).
class ThreadCompletion : public Completion {
 public:
  explicit ThreadCompletion(std::chrono::milliseconds delay) {
    thread_ = std::thread([this, delay] {
      const double begin = clock_ms();
      std::this_thread::sleep_for(delay);
      std::lock_guard<std::mutex> lock(mutex_);
      start_ = begin;
      end_ = clock_ms();
      done_ = true;
      changed_.notify_all();
    });
  }
  ~ThreadCompletion() override { thread_.join(); }
  void synchronize() override {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_; });
  }
  bool is_done() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  double start_ms() override { return start_; }
  double end_ms() override { return end_; }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;
  double start_ = -1.0;
  double end_ = -1.0;
  std::thread thread_;
};

TEST(Executor, WaitsForCompletionsThatFinishLater) {
  for (CommMode mode : {CommMode::kAuto, CommMode::kManual}) {
    StepGraph graph;
    std::shared_ptr<ThreadCompletion> handle;
    const NodeId collective = graph.add_node(
        node_spec(NodeKind::kCollective, "all_gather", StreamClass::kTpComm, [&handle](const NodeContext&) -> CompletionPtr {
          handle = std::make_shared<ThreadCompletion>(40ms);
          return handle;
        }));
    const NodeId consumer = graph.add_node(node_spec(NodeKind::kForward, "forward", StreamClass::kCompute, nullptr), {collective});
    Executor executor;
    const StepTimeline timeline = executor.execute(graph, Scheduler::plan(graph, mode));
    ASSERT_TRUE(handle->is_done());
    EXPECT_GE(timeline.nodes[collective].duration_ms(), 39.0) << comm_mode_name(mode);
    EXPECT_GE(timeline.nodes[consumer].start_ms, timeline.nodes[collective].end_ms) << comm_mode_name(mode);
  }
}

struct NodeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(Executor, ExceptionOnComputePropagatesAndCommThreadStops) {
  // dp_comm waits for a compute node that never completes because compute throws first.
  StepGraph graph;
  std::atomic<bool> collective_ran{false};
  const NodeId bad = graph.add_node(node_spec(NodeKind::kForward, "forward mb0", StreamClass::kCompute,
                                         task([] { throw NodeFailure("bad batch"); })));
  graph.add_node(node_spec(NodeKind::kCollective, "all_reduce", StreamClass::kDpComm,
                      task([&collective_ran] { collective_ran = true; })),
                 {bad});
  Executor executor;
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  const auto begin = std::chrono::steady_clock::now();
  EXPECT_THROW(executor.execute(graph, plan), NodeFailure);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 5s);
  EXPECT_FALSE(collective_ran.load());
}

TEST(Executor, ExceptionOnCommThreadPropagatesToCaller) {
  StepGraph graph;
  std::atomic<int> compute_runs{0};
  const NodeId reduce = graph.add_node(node_spec(NodeKind::kCollective, "all_reduce bucket 0", StreamClass::kDpComm,
                                            task([] {
                                              std::this_thread::sleep_for(10ms);
                                              throw NodeFailure("peer vanished");
                                            })));
  graph.add_node(node_spec(NodeKind::kBackward, "backward", StreamClass::kCompute, task([&compute_runs] { ++compute_runs; })));
  graph.add_node(node_spec(NodeKind::kOptimizer, "optimizer", StreamClass::kCompute, task([&compute_runs] { ++compute_runs; })),
                 {reduce});
  Executor executor;
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  try {
    executor.execute(graph, plan);
    FAIL() << "no exception";
  } catch (const NodeFailure& failure) {
    EXPECT_STREQ(failure.what(), "peer vanished");
  }
  EXPECT_EQ(compute_runs.load(), 1);  // backward ran; the optimizer never did

  // The executor (and its comm thread) is still usable for the next step.
  StepGraph healthy;
  healthy.add_node(node_spec(NodeKind::kCollective, "all_reduce", StreamClass::kDpComm, sleep_for(1ms)));
  EXPECT_NO_THROW(executor.execute(healthy, Scheduler::plan(healthy, CommMode::kAuto)));
}

TEST(Executor, CompletionFailureIsRethrown) {
  class Failed : public Completion {
   public:
    void synchronize() override { throw weft::Error("all_reduce(sum) on dp failed: rank 1 exited"); }
    bool is_done() override { return true; }
  };
  StepGraph graph;
  graph.add_node(node_spec(NodeKind::kCollective, "all_reduce", StreamClass::kDpComm,
                      [](const NodeContext&) -> CompletionPtr { return std::make_shared<Failed>(); }));
  Executor executor;
  EXPECT_THROW(executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto)), weft::Error);
}

TEST(Executor, ContextNamesStreamAndDevice) {
  StepGraph graph;
  StreamClass seen = StreamClass::kCompute;
  bool cpu = false;
  graph.add_node(node_spec(NodeKind::kSend, "send to stage 1", StreamClass::kP2p, [&](const NodeContext& ctx) {
                   seen = ctx.stream();
                   cpu = ctx.device().is_cpu() && ctx.cuda_stream() == nullptr;
                   return CompletionPtr();
                 }));
  Executor executor;
  executor.execute(graph, Scheduler::plan(graph, CommMode::kAuto));
  EXPECT_EQ(seen, StreamClass::kP2p);
  EXPECT_TRUE(cpu);
  executor.execute(graph, Scheduler::plan(graph, CommMode::kManual));
  EXPECT_EQ(seen, StreamClass::kCompute);
}

TEST(Executor, ExecutedTimelineAsChromeTrace) {
  OverlapGraph g;
  Executor executor;
  const StepTimeline timeline = executor.execute(g.graph, Scheduler::plan(g.graph, CommMode::kAuto));
  const nlohmann::json trace = nlohmann::json::parse(timeline.to_chrome_trace_json());
  int complete = 0;
  for (const auto& event : trace["traceEvents"]) complete += event["ph"] == "X";
  EXPECT_EQ(complete, 2);
}

TEST(Executor, EmptyGraphAndMismatchedPlan) {
  StepGraph empty;
  Executor executor;
  const StepTimeline timeline = executor.execute(empty, Scheduler::plan(empty, CommMode::kAuto));
  EXPECT_TRUE(timeline.nodes.empty());
  OverlapGraph g;
  EXPECT_THROW(executor.execute(g.graph, Scheduler::plan(empty, CommMode::kAuto)), weft::Error);
#if !defined(WEFT_HAVE_CUDA)
  EXPECT_THROW(Executor(Device::cuda(0)), weft::Error);
#endif
}

// Two steps in flight: each step's node writes its own value into one tensor, in place; each
// finish() must hand back the value of its own step (a copy taken at that step's end), in issue
// order, with the later step's times after the earlier one's.
TEST(Executor, StepsInFlightFinishInOrderWithTheirOwnReadBacks) {
  Tensor counter = Tensor::zeros({4});  // [4] f32, on the host
  double value = 0.0;
  StepGraph graph;
  graph.add_node(node_spec(NodeKind::kForward, "write", StreamClass::kCompute, task([&] { counter.fill_(value); })));
  graph.add_node(node_spec(NodeKind::kCollective, "all_reduce", StreamClass::kDpComm, sleep_for(5ms)));
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  Executor executor;
  const Executor::ReadBack read_counter = [&] { return std::vector<Tensor>{counter}; };
  value = 1.0;
  executor.issue(graph, plan, read_counter);
  value = 2.0;
  executor.issue(graph, plan, read_counter);
  EXPECT_EQ(executor.steps_in_flight(), 2);
  const Executor::FinishedStep first = executor.finish();
  const Executor::FinishedStep second = executor.finish();
  EXPECT_EQ(executor.steps_in_flight(), 0);
  ASSERT_EQ(first.read_back.size(), 1u);
  ASSERT_EQ(second.read_back.size(), 1u);
  EXPECT_EQ(first.read_back[0].to_vector(), std::vector<double>(4, 1.0));
  EXPECT_EQ(second.read_back[0].to_vector(), std::vector<double>(4, 2.0));
  EXPECT_TRUE(first.read_back[0].device().is_cpu());
  EXPECT_GE(first.timeline.nodes[1].duration_ms(), 4.0);
  EXPECT_LE(first.timeline.start_clock_ms, first.timeline.end_clock_ms);
  EXPECT_GE(second.timeline.start_clock_ms, first.timeline.end_clock_ms);
  EXPECT_GE(first.timeline.end_clock_ms - first.timeline.start_clock_ms, 4.0);
}

TEST(Executor, RefusesAStepBeyondTheLimitAndAFinishWithNoneInFlight) {
  StepGraph graph;
  graph.add_node(node_spec(NodeKind::kForward, "forward"));
  const ExecutionPlan plan = Scheduler::plan(graph, CommMode::kAuto);
  Executor executor;
  EXPECT_THROW(
      {
        try {
          executor.finish();
        } catch (const weft::Error& error) {
          EXPECT_NE(std::string(error.what()).find("no step is in flight"), std::string::npos) << error.what();
          throw;
        }
      },
      weft::Error);
  for (int i = 0; i < Executor::kMaxStepsInFlight; ++i) executor.issue(graph, plan);
  EXPECT_THROW(executor.issue(graph, plan), weft::Error);
  EXPECT_THROW(executor.execute(graph, plan), weft::Error);  // execute() needs none in flight
  EXPECT_EQ(executor.steps_in_flight(), Executor::kMaxStepsInFlight);
  for (int i = 0; i < Executor::kMaxStepsInFlight; ++i) executor.finish();
  EXPECT_EQ(executor.execute(graph, plan).nodes.size(), 1u);
}

}  // namespace
}  // namespace weft::graph
