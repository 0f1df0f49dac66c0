// Executor (see executor.h): the CPU threads and the CUDA stream/event issue loop.
//
// CPU: one mutex and condition variable per step guard the nodes' completion flags; a step has
// hundreds of nodes at most and a stream touches the lock twice per node, so one lock costs
// nothing measurable next to the work. Comm threads persist across steps and take one job (run
// this list of this step) at a time.
//
// CUDA: every list is issued from the caller's thread by a round-robin loop that advances each
// stream until it meets a wait for a node not yet issued. An event must be recorded before another
// stream waits on it (waiting on an unrecorded event is a no-op in CUDA), which that rule
// guarantees. Signals re-enter the loop from inside their producer's work; the producer's own
// stream is marked busy so that the loop never issues past the node being issued. A blocks_host
// node goes to its list's host worker instead; the loop waits for reports only when nothing else moves.
#include "runtime/graph/executor.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/nvtx_range.h"

#if defined(WEFT_HAVE_CUDA)
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft::graph {
namespace {

void check_plan_fits(const StepGraph& graph, const ExecutionPlan& plan) {
  WEFT_CHECK(static_cast<int>(plan.stream_of.size()) == graph.size(), "Executor: the plan places ",
             plan.stream_of.size(), " nodes but the graph has ", graph.size(),
             " (was the graph changed after Scheduler::plan?)");
}

StepTimeline make_timeline(const StepGraph& graph, const ExecutionPlan& plan, const std::vector<double>& start,
                           const std::vector<double>& end, double step_ms) {
  StepTimeline timeline;
  timeline.nodes.reserve(graph.size());
  for (const Node& node : graph.nodes()) {
    NodeTiming timing;
    timing.node = node.id;
    timing.name = node.name;
    timing.kind = node.kind;
    timing.stream = plan.stream_of[node.id];
    timing.micro_batch = node.micro_batch;
    timing.bytes = node.bytes;
    timing.signal = node.is_signal();
    timing.start_ms = start[node.id];
    timing.end_ms = end[node.id];
    timeline.nodes.push_back(std::move(timing));
  }
  timeline.step_ms = step_ms;
  timeline.compute_metrics();
  return timeline;
}

void check_signal(const StepGraph& graph, NodeId producer, NodeId signal) {
  WEFT_CHECK(signal >= 0 && signal < graph.size(), "NodeContext::fire: ", signal, " is not a node");
  const Node& node = graph.node(signal);
  WEFT_CHECK(node.signal_of == producer, "NodeContext::fire: node '", graph.node(producer).name,
             "' fired '", node.name, "', ",
             node.is_signal() ? "whose producer is '" + graph.node(node.signal_of).name + "'"
                              : std::string("which is not a signal node"));
}

// A thread that runs posted jobs in order until destroyed.
class Worker {
 public:
  explicit Worker(const std::string& name) : thread_([this] { loop(); }) {
    pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_one();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    ready_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stop_ and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();  // never throws: the step catches everything a node raises
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the members it uses exist
};

// --- one CPU step ------------------------------------------------------------------------------

struct CpuStep {
  const StepGraph& graph;
  const ExecutionPlan& plan;
  double origin_ms;  // clock_ms() at the step's start

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<char> done;
  std::vector<double> start;
  std::vector<double> end;
  bool aborted = false;
  std::exception_ptr error;
  int lists_running = 0;

  CpuStep(const StepGraph& g, const ExecutionPlan& p)
      : graph(g), plan(p), origin_ms(clock_ms()), done(g.size(), 0), start(g.size(), 0.0), end(g.size(), 0.0) {}

  // Marks `id` complete over [begin, finish] (step-relative) unless it already is. Lock held.
  void complete_locked(NodeId id, double begin, double finish) {
    if (done[id]) return;
    done[id] = 1;
    start[id] = begin;
    end[id] = finish;
  }

  static void fire(void* state, NodeId producer, NodeId signal) {
    auto* step = static_cast<CpuStep*>(state);
    check_signal(step->graph, producer, signal);
    const double now = clock_ms() - step->origin_ms;
    {
      std::lock_guard<std::mutex> lock(step->mutex);
      step->complete_locked(signal, now, now);
    }
    step->changed.notify_all();
  }

  void fail(std::exception_ptr exception) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = exception;
      aborted = true;
    }
    changed.notify_all();
  }

  // Runs list `stream` to its end, or until the step is aborted. Never throws.
  void run_list(StreamClass stream) {
    try {
      for (const Instruction& instruction : plan.list(stream)) {
        const NodeId id = instruction.node;
        if (instruction.op == Instruction::Op::kWait) {
          std::unique_lock<std::mutex> lock(mutex);
          changed.wait(lock, [&] { return done[id] || aborted; });
          if (aborted) return;
          continue;
        }
        const Node& node = graph.node(id);
        {
          std::lock_guard<std::mutex> lock(mutex);
          if (aborted) return;
        }
        double begin = clock_ms();
        CompletionPtr completion;
        {
          NvtxRange range(node.name.c_str());  // the node on the NVTX timeline (its thread's row)
          if (node.work) {
            completion = node.work(NodeContext(id, stream, Device::cpu(), nullptr, &CpuStep::fire, this));
          }
          if (completion) completion->synchronize();
        }
        double finish = clock_ms();
        if (completion && completion->start_ms() >= 0.0 && completion->end_ms() >= completion->start_ms()) {
          begin = completion->start_ms();  // when the work itself ran (it may have been queued)
          finish = completion->end_ms();
        }
        {
          std::lock_guard<std::mutex> lock(mutex);
          complete_locked(id, begin - origin_ms, finish - origin_ms);
          // Signals the work did not fire are fired by its end.
          for (NodeId dependent : node.dependents) {
            if (graph.node(dependent).signal_of == id) complete_locked(dependent, end[id], end[id]);
          }
        }
        changed.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }
};

}  // namespace

// A step issued and not yet finished. On the CPU its results are already here; on CUDA they are
// read at finish() from its slot's events and pinned buffers.
struct Executor::InFlight {
  FinishedStep results;                   // CPU: complete at issue
  const StepGraph* graph = nullptr;       // CUDA from here on
  const ExecutionPlan* plan = nullptr;
  int slot = 0;
  double issued_clock_ms = 0.0;           // clock_ms() when issue() began
  std::vector<CompletionPtr> completions;
  std::vector<Tensor> device_reads;       // kept alive until their copies have run
};

// --- CPU ---------------------------------------------------------------------------------------

struct Executor::CpuState {
  std::array<std::unique_ptr<Worker>, kStreamClassCount> workers;  // [compute] unused: the caller
};

Executor::InFlight Executor::issue_cpu(const StepGraph& graph, const ExecutionPlan& plan,
                                        const ReadBack& read_back) {
  if (!cpu_) cpu_ = std::make_unique<CpuState>();
  CpuStep step(graph, plan);
  for (StreamClass stream : kAllStreamClasses) {
    const int s = static_cast<int>(stream);
    if (stream == StreamClass::kCompute || plan.streams[s].empty()) continue;
    if (!cpu_->workers[s]) cpu_->workers[s] = std::make_unique<Worker>(std::string("weft ") + stream_class_name(stream));
  }
  {
    std::lock_guard<std::mutex> lock(step.mutex);
    for (StreamClass stream : kAllStreamClasses) {
      if (stream != StreamClass::kCompute && !plan.list(stream).empty()) ++step.lists_running;
    }
  }
  for (StreamClass stream : kAllStreamClasses) {
    if (stream == StreamClass::kCompute || plan.list(stream).empty()) continue;
    cpu_->workers[static_cast<int>(stream)]->post([&step, stream] {
      step.run_list(stream);
      // Notify under the lock: once it is released the caller may return and destroy `step`.
      std::lock_guard<std::mutex> lock(step.mutex);
      --step.lists_running;
      step.changed.notify_all();
    });
  }
  step.run_list(StreamClass::kCompute);
  {
    // `step` lives on this frame: no comm thread may still use it when we return or throw.
    std::unique_lock<std::mutex> lock(step.mutex);
    step.changed.wait(lock, [&] { return step.lists_running == 0; });
  }
  if (step.error) std::rethrow_exception(step.error);
  InFlight issued;
  const double end_ms = clock_ms();
  issued.results.timeline = make_timeline(graph, plan, step.start, step.end, end_ms - step.origin_ms);
  issued.results.timeline.origin_clock_ms = step.origin_ms;
  issued.results.timeline.start_clock_ms = step.origin_ms;
  issued.results.timeline.end_clock_ms = end_ms;
  // Copies: the next step may change these tensors in place before this one is finished.
  if (read_back) {
    for (const Tensor& tensor : read_back()) issued.results.read_back.push_back(tensor.to(Device::cpu()).clone());
  }
  return issued;
}

// --- CUDA --------------------------------------------------------------------------------------

#if defined(WEFT_HAVE_CUDA)

// What one step in flight uses on the device; a step takes the slot of its issue count modulo
// kMaxStepsInFlight, so a slot is reused only once the step before in it has been finished.
struct CudaSlot {
  std::vector<std::unique_ptr<cuda::Event>> events;  // 2 per node, reused across steps
  cuda::Event step_start{true};
  cuda::Event step_end{true};
  std::vector<Tensor> host_reads;                    // pinned, reused while shapes and dtypes match

  cuda::Event& event(size_t index) {
    while (events.size() <= index) events.push_back(std::make_unique<cuda::Event>(true));
    return *events[index];
  }
};

struct Executor::CudaState {
  std::array<std::unique_ptr<cuda::Stream>, kStreamClassCount> streams;  // [compute] unused: the caller's
  std::array<std::unique_ptr<Worker>, kStreamClassCount> host_workers;  // per list: its blocks_host nodes
  std::array<CudaSlot, kMaxStepsInFlight> slots;
  std::array<std::unique_ptr<cuda::Event>, kStreamClassCount> joins;
  double last_end_clock_ms = 0.0;  // estimated clock_ms() at which the last finished step ended
};

namespace {

// What a host worker tells the issuing thread: a signal its node fired (events already recorded),
// or that its node's work has returned (or thrown).
struct WorkerReport {
  NodeId node = -1;
  NodeId signal = -1;  // >= 0: only this signal was fired
  CompletionPtr completion;
  std::exception_ptr error;
};

struct CudaStep {
  const StepGraph& graph;
  const ExecutionPlan& plan;
  int device;
  std::array<cudaStream_t, kStreamClassCount> streams{};
  std::array<Worker*, kStreamClassCount> host_workers{};  // set for the lists with blocks_host nodes
  std::vector<cuda::Event*> start_events;
  std::vector<cuda::Event*> end_events;
  std::vector<char> issued;
  std::vector<char> fired_on_worker;  // signals recorded by a host worker (each written by one worker only)
  std::array<size_t, kStreamClassCount> position{};
  std::array<bool, kStreamClassCount> busy{};
  std::vector<CompletionPtr> completions;
  int on_workers = 0;            // nodes handed to a host worker whose end is not yet taken
  std::exception_ptr error;      // the first failure of a node run by a host worker

  std::mutex reports_mutex;
  std::condition_variable reports_changed;
  std::deque<WorkerReport> reports;

  CudaStep(const StepGraph& g, const ExecutionPlan& p, int d)
      : graph(g), plan(p), device(d), issued(g.size(), 0), fired_on_worker(g.size(), 0) {}

  // Records a signal's events on its producer's stream, at this point of the producer's work.
  void issue_signal(NodeId signal) {
    if (issued[signal]) return;
    const cudaStream_t stream = streams[static_cast<int>(plan.stream_of[graph.node(signal).signal_of])];
    start_events[signal]->record(stream);
    end_events[signal]->record(stream);
    issued[signal] = 1;
  }

  static void fire(void* state, NodeId producer, NodeId signal) {
    auto* step = static_cast<CudaStep*>(state);
    check_signal(step->graph, producer, signal);
    step->issue_signal(signal);
    step->drive();  // issue what the other streams waited for
  }

  // fire() of a node run by a host worker: the events are recorded here, on the producer's stream
  // at this point of its work; the issuing thread learns of it from the report.
  static void fire_on_worker(void* state, NodeId producer, NodeId signal) {
    auto* step = static_cast<CudaStep*>(state);
    check_signal(step->graph, producer, signal);
    if (step->fired_on_worker[signal]) return;
    step->fired_on_worker[signal] = 1;
    const cudaStream_t stream = step->streams[static_cast<int>(step->plan.stream_of[producer])];
    step->start_events[signal]->record(stream);
    step->end_events[signal]->record(stream);
    WorkerReport report;
    report.signal = signal;
    step->report(std::move(report));
  }

  void report(WorkerReport report) {
    {
      std::lock_guard<std::mutex> lock(reports_mutex);
      reports.push_back(std::move(report));
    }
    reports_changed.notify_one();
  }

  // On list s's host worker: node `id`'s work, with the device and the list's stream current.
  void run_on_worker(NodeId id, int s) {
    WorkerReport report;
    report.node = id;
    try {
      cuda::set_device(device);
      cuda::StreamGuard guard(device, streams[s]);
      const Node& node = graph.node(id);
      NvtxRange range(node.name.c_str());
      start_events[id]->record(streams[s]);
      if (node.work) {
        report.completion = node.work(NodeContext(id, kAllStreamClasses[s], Device::cuda(device), streams[s],
                                                  &CudaStep::fire_on_worker, this));
      }
      end_events[id]->record(streams[s]);
    } catch (...) {
      report.error = std::current_exception();
    }
    this->report(std::move(report));
  }

  // Issuing thread: waits for the next report and takes it in. A node's end frees its list and
  // issues the signals it did not fire (fired at its end, as elsewhere).
  void take_report() {
    WorkerReport report;
    {
      std::unique_lock<std::mutex> lock(reports_mutex);
      reports_changed.wait(lock, [&] { return !reports.empty(); });
      report = std::move(reports.front());
      reports.pop_front();
    }
    if (report.signal >= 0) {
      issued[report.signal] = 1;
      return;
    }
    --on_workers;
    const Node& node = graph.node(report.node);
    busy[static_cast<int>(plan.stream_of[node.id])] = false;
    if (report.error) {
      if (!error) error = report.error;
      return;
    }
    issued[node.id] = 1;
    if (report.completion) completions.push_back(std::move(report.completion));
    for (NodeId dependent : node.dependents) {
      if (graph.node(dependent).signal_of == node.id) issue_signal(dependent);
    }
  }

  // Issuing thread: lets every node handed to a host worker end (they use this step's state).
  void wait_for_workers() {
    while (on_workers > 0) take_report();
  }

  // Issues list s as far as completed issues allow; returns whether it moved.
  bool advance(int s) {
    if (busy[s] || error) return false;
    const StreamClass stream = kAllStreamClasses[s];
    const auto& list = plan.streams[s];
    bool moved = false;
    while (position[s] < list.size()) {
      const Instruction& instruction = list[position[s]];
      const NodeId id = instruction.node;
      if (instruction.op == Instruction::Op::kWait) {
        if (!issued[id]) break;
        if (plan.stream_of[id] != stream) end_events[id]->wait(streams[s]);
        ++position[s];
        moved = true;
        continue;
      }
      const Node& node = graph.node(id);
      ++position[s];  // before the work runs: a re-entrant drive() must not run this node again
      moved = true;
      if (node.is_signal()) {
        issue_signal(id);
        continue;
      }
      busy[s] = true;
      if (node.blocks_host && host_workers[s] != nullptr) {
        // The list stays busy until the worker's report: its next instruction comes after this node.
        ++on_workers;
        host_workers[s]->post([this, id, s] { run_on_worker(id, s); });
        break;
      }
      {
        cuda::StreamGuard guard(device, streams[s]);
        // Host-side issue of the node's work, named on the NVTX timeline; its kernels run later.
        NvtxRange range(node.name.c_str());
        start_events[id]->record(streams[s]);
        if (node.work) {
          CompletionPtr completion = node.work(
              NodeContext(id, stream, Device::cuda(device), streams[s], &CudaStep::fire, this));
          if (completion) completions.push_back(std::move(completion));
        }
        end_events[id]->record(streams[s]);
      }
      busy[s] = false;
      issued[id] = 1;
      for (NodeId dependent : node.dependents) {
        if (graph.node(dependent).signal_of == id) issue_signal(dependent);
      }
    }
    return moved;
  }

  void drive() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int s = 0; s < kStreamClassCount; ++s) moved = advance(s) || moved;
    }
  }
};

}  // namespace

Executor::InFlight Executor::issue_cuda(const StepGraph& graph, const ExecutionPlan& plan,
                                         const ReadBack& read_back) {
  const int device = device_.index;
  cuda::set_device(device);  // first: the state's events belong to the device current at creation
  if (!cuda_) cuda_ = std::make_unique<CudaState>();
  CudaState& state = *cuda_;
  InFlight issued;
  issued.graph = &graph;
  issued.plan = &plan;
  issued.slot = static_cast<int>(issued_ % kMaxStepsInFlight);
  issued.issued_clock_ms = clock_ms();
  CudaSlot& slot = state.slots[issued.slot];
  CudaStep step(graph, plan, device);
  step.streams[0] = cuda::current_stream(device);
  for (int s = 1; s < kStreamClassCount; ++s) {
    if (plan.streams[s].empty()) continue;
    if (!state.streams[s]) state.streams[s] = std::make_unique<cuda::Stream>(device);
    if (!state.joins[s]) state.joins[s] = std::make_unique<cuda::Event>(false);
    step.streams[s] = state.streams[s]->get();
  }
  for (int s = 0; s < kStreamClassCount; ++s) {
    const bool blocks = std::any_of(plan.streams[s].begin(), plan.streams[s].end(), [&](const Instruction& instruction) {
      return instruction.op == Instruction::Op::kRun && graph.node(instruction.node).blocks_host;
    });
    if (!blocks) continue;
    if (!state.host_workers[s]) {
      state.host_workers[s] = std::make_unique<Worker>(std::string("weft host ") + stream_class_name(kAllStreamClasses[s]));
    }
    step.host_workers[s] = state.host_workers[s].get();
  }
  step.start_events.resize(graph.size());
  step.end_events.resize(graph.size());
  for (NodeId id = 0; id < graph.size(); ++id) {
    step.start_events[id] = &slot.event(2 * static_cast<size_t>(id));
    step.end_events[id] = &slot.event(2 * static_cast<size_t>(id) + 1);
  }

  // Comm streams start after what the caller queued on compute; compute ends after all of them.
  slot.step_start.record(step.streams[0]);
  for (int s = 1; s < kStreamClassCount; ++s) {
    if (step.streams[s] != nullptr) slot.step_start.wait(step.streams[s]);
  }
  auto join = [&] {
    for (int s = 1; s < kStreamClassCount; ++s) {
      if (step.streams[s] == nullptr) continue;
      state.joins[s]->record(step.streams[s]);
      state.joins[s]->wait(step.streams[0]);
    }
  };
  try {
    // Issue what can be issued; then wait for a host worker's report and go on from there.
    for (;;) {
      step.drive();
      if (step.on_workers == 0) break;
      step.take_report();
    }
    if (step.error) std::rethrow_exception(step.error);
    for (int s = 0; s < kStreamClassCount; ++s) {
      WEFT_CHECK(step.position[s] == plan.streams[s].size(), "Executor: stream ",
                 stream_class_name(kAllStreamClasses[s]), " cannot proceed past instruction ", step.position[s],
                 " (the plan deadlocks; validate_plan says why)");
    }
  } catch (...) {
    try {
      step.wait_for_workers();  // `step` lives on this frame
      join();                   // leave no stream running ahead of the caller's
    } catch (...) {
    }
    throw;
  }
  join();
  if (read_back) {
    // Copied behind the step's last work on the compute stream, into pinned buffers of the slot,
    // so that neither the copy nor finish()'s read waits for a step issued after this one.
    issued.device_reads = read_back();
    slot.host_reads.resize(issued.device_reads.size());
    for (size_t i = 0; i < issued.device_reads.size(); ++i) {
      Tensor& source = issued.device_reads[i];
      if (source.device().is_cpu()) {
        slot.host_reads[i] = source.clone();
        continue;
      }
      if (!source.is_contiguous()) source = source.contiguous();
      Tensor& host = slot.host_reads[i];
      if (!host.defined() || host.shape() != source.shape() || host.dtype() != source.dtype()) {
        host = Tensor::empty_pinned(source.shape(), source.dtype());
      }
      WEFT_CUDA_CHECK(cudaMemcpyAsync(host.raw_data(), source.raw_data(),
                                      static_cast<size_t>(source.numel() * source.element_size()),
                                      cudaMemcpyDeviceToHost, step.streams[0]));
    }
  }
  slot.step_end.record(step.streams[0]);
  issued.completions = std::move(step.completions);
  return issued;
}

Executor::FinishedStep Executor::finish_cuda(InFlight& issued) {
  CudaState& state = *cuda_;
  CudaSlot& slot = state.slots[issued.slot];
  const StepGraph& graph = *issued.graph;
  slot.step_end.synchronize();
  const double end_ms = clock_ms();
  for (const CompletionPtr& completion : issued.completions) completion->synchronize();
  std::vector<double> start(graph.size(), 0.0);
  std::vector<double> end(graph.size(), 0.0);
  for (NodeId id = 0; id < graph.size(); ++id) {
    start[id] = slot.event(2 * static_cast<size_t>(id)).elapsed_since(slot.step_start);
    end[id] = slot.event(2 * static_cast<size_t>(id) + 1).elapsed_since(slot.step_start);
  }
  FinishedStep finished;
  finished.timeline = make_timeline(graph, *issued.plan, start, end, slot.step_end.elapsed_since(slot.step_start));
  finished.device_start = &slot.step_start;
  // The device reached the step's start when the host had issued it and the step before had ended.
  finished.timeline.start_clock_ms = std::max(issued.issued_clock_ms, state.last_end_clock_ms);
  // The end as the device had it (the start plus the step's span on the device), not as the host
  // saw it: with steps in flight the host comes to finish() after issuing the next step, which may
  // be well after this one ended; a wall time measured to that moment is too long, the next step's
  // too short, and the last step of a run (read at once) too short by the same amount.
  finished.timeline.end_clock_ms = std::min(end_ms, finished.timeline.start_clock_ms + finished.timeline.step_ms);
  state.last_end_clock_ms = finished.timeline.end_clock_ms;
  for (size_t i = 0; i < issued.device_reads.size(); ++i) finished.read_back.push_back(slot.host_reads[i].clone());
  return finished;
}

#else

struct Executor::CudaState {};

Executor::InFlight Executor::issue_cuda(const StepGraph&, const ExecutionPlan&, const ReadBack&) {
  WEFT_FAIL("Executor: ", device_.to_string(), " requested, but weft was built without CUDA");
}

Executor::FinishedStep Executor::finish_cuda(InFlight&) {
  WEFT_FAIL("Executor: ", device_.to_string(), " requested, but weft was built without CUDA");
}

#endif

// --- common ------------------------------------------------------------------------------------

Executor::Executor(Device device) : device_(device) {
#if !defined(WEFT_HAVE_CUDA)
  WEFT_CHECK(device.is_cpu(), "Executor: ", device.to_string(), " requested, but weft was built without CUDA");
#endif
}

Executor::~Executor() {
#if defined(WEFT_HAVE_CUDA)
  // A step still in flight copies into its slot's pinned buffers and reads its tensors on the
  // device: wait for it before they are freed. (The executor is going away, often on an error path:
  // a failure here has nowhere to go.)
  if (cuda_) {
    for (const std::unique_ptr<InFlight>& step : in_flight_) {
      try {
        cuda_->slots[step->slot].step_end.synchronize();
      } catch (...) {
      }
    }
  }
#endif
}

StepTimeline Executor::execute(const StepGraph& graph, const ExecutionPlan& plan) {
  WEFT_CHECK(in_flight_.empty(), "Executor::execute: ", in_flight_.size(),
             " step(s) issued and not finished; finish() them first");
  issue(graph, plan);
  return finish().timeline;
}

void Executor::issue(const StepGraph& graph, const ExecutionPlan& plan, const ReadBack& read_back) {
  WEFT_CHECK(static_cast<int>(in_flight_.size()) < kMaxStepsInFlight, "Executor::issue: ", in_flight_.size(),
             " steps are in flight already (at most ", kMaxStepsInFlight, "); finish() one first");
  check_plan_fits(graph, plan);
  validate_plan(graph, plan);
  auto issued = std::make_unique<InFlight>(device_.is_cpu() ? issue_cpu(graph, plan, read_back)
                                                            : issue_cuda(graph, plan, read_back));
  ++issued_;
  in_flight_.push_back(std::move(issued));
}

Executor::FinishedStep Executor::finish() {
  WEFT_CHECK(!in_flight_.empty(), "Executor::finish: no step is in flight; issue() one first");
  const std::unique_ptr<InFlight> oldest = std::move(in_flight_.front());
  in_flight_.pop_front();
  return device_.is_cpu() ? std::move(oldest->results) : finish_cuda(*oldest);
}

}  // namespace weft::graph
