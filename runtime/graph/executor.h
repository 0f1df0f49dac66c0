// Executor: runs an ExecutionPlan of a StepGraph, one step per execute(), and times every node.
//
// A step is issued and then finished: issue() calls every node's work in the plan's order and
// returns once all is issued; finish() waits for the oldest issued step and returns its timeline
// and the host copies of the tensors issue() was asked to read back. execute() is the two in a row.
// On CUDA, issue() leaves the step running on the device, so a caller can issue the next step
// before it finishes this one (at most kMaxStepsInFlight at once): the GPU then never waits for the
// host between steps while the host reads the last step's loss, logs it and loads the next batch.
// Steps run on the device in the order issued. Each step in flight has its own timing events and
// host buffers. On the CPU the step has run when issue() returns; finish() only hands its results over.
//
// CPU: the compute list runs on the caller's thread; each communication stream class with work in
// the plan has a thread of the executor (started at first use, kept across steps) that runs its list
// in order. A node is complete when its work has returned and its Completion (if any) has finished
// (the stream calls synchronize()); a stream waits for that before its next instruction, and
// `wait n` blocks until node n is complete. So overlap is real on the CPU: a collective on the
// dp_comm thread proceeds while the caller computes. A node's times are its Completion's
// start_ms()/end_ms() where known (a collective queued on a comm stream runs later than its call),
// else the call of its work and the return of synchronize(), all on clock_ms().
//
// CUDA (WEFT_HAVE_CUDA, an executor made for cuda:N): compute is the caller's current stream of the
// device at issue(); each communication class gets a stream of the executor. One host thread
// issues every list: a node's work is called with its stream current (StreamGuard) and enqueues its
// kernels or collectives there; `wait n` across streams is an event recorded after n and waited for
// by the stream (never by the host). A signal fired during a node's work records its event at that
// point and immediately issues whatever other streams were waiting for it, so a bucket's all-reduce
// is enqueued on the dp_comm stream while backward is still being issued. Node times come from
// timing events read after the step: finish() synchronizes once, on the step's end event. Every comm
// stream starts after the work already queued on the compute stream and the compute stream waits for
// every comm stream at the end, so a step is ordered like one kernel on the caller's stream.
// A Completion returned by CUDA work is kept until the step's end, then synchronize()d (to surface
// its failure); the work must have ordered itself on the given stream.
// Host-blocking nodes (NodeSpec::blocks_host: a pipeline receive waits in MPI for another rank)
// would hold that one thread, and with it every list, while the peer may be waiting for work still
// to be issued here (a send after a backward): a deadlock across ranks. The executor hands such a
// node to a host worker of its list (a thread per stream class, kept across steps, with the device
// and the list's stream current), marks the list busy, and goes on issuing the other lists; when
// no list can move it waits for a worker's report, and the node's end event is recorded by the
// worker after its work, so the node's list and its dependents are ordered exactly as before. A
// signal such a node fires is recorded by the worker and reported. The work of a blocks_host node
// runs beside the issuing thread: it may touch only what no node issued meanwhile touches (a
// receive writes its own message's tensor) and must not call a collective of a group the issuing
// thread may be calling at the same time.
//
// Errors: the first exception a node throws (or its Completion's synchronize() rethrows) stops every
// stream at its next instruction (a stream blocked in `wait` wakes up), and issue() rethrows it
// on the caller's thread after all streams (and, on CUDA, all host workers) have stopped. Work that never returns (a collective
// whose peer died) is parallel/'s to time out; the executor does not interrupt running work.
//
// NVTX (runtime/nvtx_range.h): every node's work runs inside a range named after the node, on the
// thread that calls it, so Nsight Systems shows the step graph's names over its kernels.
//
// Not reentrant: an Executor is used by one thread, and a node's work may not issue a step.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/device.h"
#include "runtime/tensor.h"
#include "runtime/graph/scheduler.h"
#include "runtime/graph/step_graph.h"
#include "runtime/graph/step_timeline.h"

namespace weft::cuda {
class Event;
}  // namespace weft::cuda

namespace weft::graph {

class Executor {
 public:
  // `device`: cpu (threads) or cuda:N (streams and events; only in CUDA builds).
  explicit Executor(Device device = Device::cpu());
  // Stops the communication threads (none is running a step: issue() has returned). Waits for a
  // CUDA step still in flight to end on the device; its results are dropped.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  Device device() const { return device_; }

  static constexpr int kMaxStepsInFlight = 2;
  // Called once a step's last node is issued: the tensors whose values at the step's end finish()
  // returns on the host (the loss, the gradient norm's squares). Small tensors; any device.
  using ReadBack = std::function<std::vector<Tensor>()>;

  struct FinishedStep {
    StepTimeline timeline;
    std::vector<Tensor> read_back;  // host tensors, in the order ReadBack named them
    // CUDA: the step's start event, from which the timeline's times are measured, so that work
    // timed by other events of the device during the step (collectives issued inside nodes) can be
    // placed on it exactly. Valid until the next issue(); null on the CPU.
    const cuda::Event* device_start = nullptr;
  };

  // Runs every node of `graph` once, as `plan` orders them (plan from Scheduler::plan or checked by
  // validate_plan), and returns when all are complete. Throws what a node threw (see above), or
  // weft::Error if `plan` does not fit `graph`. No step may be in flight.
  StepTimeline execute(const StepGraph& graph, const ExecutionPlan& plan);

  // Issues a step (see the top of this file). `graph` and `plan` must live until its finish().
  // Throws what a node threw (the step is then not in flight; on CUDA every stream has been joined
  // to the caller's), or weft::Error with kMaxStepsInFlight steps already in flight.
  void issue(const StepGraph& graph, const ExecutionPlan& plan, const ReadBack& read_back = nullptr);
  // Waits for the oldest step in flight and hands over its results; it is no longer in flight, even
  // when this throws (the failure of a collective it returned). weft::Error with none in flight.
  FinishedStep finish();
  int steps_in_flight() const { return static_cast<int>(in_flight_.size()); }

 private:
  struct CpuState;
  struct CudaState;
  struct InFlight;
  InFlight issue_cpu(const StepGraph& graph, const ExecutionPlan& plan, const ReadBack& read_back);
  InFlight issue_cuda(const StepGraph& graph, const ExecutionPlan& plan, const ReadBack& read_back);
  FinishedStep finish_cuda(InFlight& step);

  Device device_;
  std::unique_ptr<CpuState> cpu_;
  std::unique_ptr<CudaState> cuda_;
  std::deque<std::unique_ptr<InFlight>> in_flight_;  // oldest first
  int64_t issued_ = 0;                               // steps issued so far: picks a step's CUDA slot
};

}  // namespace weft::graph
