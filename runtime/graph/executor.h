// Executor: runs an ExecutionPlan of a StepGraph, one step per execute(), and times every node.
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
// device at execute(); each communication class gets a stream of the executor. One host thread
// issues every list: a node's work is called with its stream current (StreamGuard) and enqueues its
// kernels or collectives there; `wait n` across streams is an event recorded after n and waited for
// by the stream (never by the host). A signal fired during a node's work records its event at that
// point and immediately issues whatever other streams were waiting for it, so a bucket's all-reduce
// is enqueued on the dp_comm stream while backward is still being issued. Node times come from
// timing events read after the step: execute() synchronizes once, at the step's end. Every comm
// stream starts after the work already queued on the compute stream and the compute stream waits for
// every comm stream at the end, so a step is ordered like one kernel on the caller's stream.
// A Completion returned by CUDA work is kept until the step's end, then synchronize()d (to surface
// its failure); the work must have ordered itself on the given stream.
//
// Errors: the first exception a node throws (or its Completion's synchronize() rethrows) stops every
// stream at its next instruction (a stream blocked in `wait` wakes up), and execute() rethrows it
// on the caller's thread after all streams have stopped. Work that never returns (a collective
// whose peer died) is parallel/'s to time out; the executor does not interrupt running work.
//
// NVTX (runtime/nvtx_range.h): every node's work runs inside a range named after the node, on the
// thread that calls it, so Nsight Systems shows the step graph's names over its kernels.
//
// One step at a time: execute() is not reentrant and an Executor is used by one thread.
#pragma once

#include <memory>

#include "runtime/device.h"
#include "runtime/graph/scheduler.h"
#include "runtime/graph/step_graph.h"
#include "runtime/graph/step_timeline.h"

namespace weft::graph {

class Executor {
 public:
  // `device`: cpu (threads) or cuda:N (streams and events; only in CUDA builds).
  explicit Executor(Device device = Device::cpu());
  // Stops the communication threads (none is running a step: execute() has returned).
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  Device device() const { return device_; }

  // Runs every node of `graph` once, as `plan` orders them (plan from Scheduler::plan or checked by
  // validate_plan), and returns when all are complete. Throws what a node threw (see above), or
  // weft::Error if `plan` does not fit `graph`.
  StepTimeline execute(const StepGraph& graph, const ExecutionPlan& plan);

 private:
  struct CpuState;
  struct CudaState;
  StepTimeline execute_cpu(const StepGraph& graph, const ExecutionPlan& plan);
  StepTimeline execute_cuda(const StepGraph& graph, const ExecutionPlan& plan);

  Device device_;
  std::unique_ptr<CpuState> cpu_;
  std::unique_ptr<CudaState> cuda_;
};

}  // namespace weft::graph
