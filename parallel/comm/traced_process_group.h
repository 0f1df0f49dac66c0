// TracedProcessGroup: a ProcessGroup that tells a CollectiveRecorder of every collective it runs
// and of every wait for one, so that collectives issued inside a step-graph node (the
// tensor-parallel layers', on the tp group) appear in the step's timeline: on the tp_comm row of
// the trace, in comm_ms, and — through the waits, where compute stood still for them — in
// exposed_comm_ms (runtime/graph/step_timeline.h).
//
// The recorder keeps entries only between begin() and take() (one step), so collectives outside
// steps (start-up barriers, checkpoint gathers) are not kept. Thread-safe.
//
// Waits. On the CPU a wait is a host interval: where the compute thread blocked. On CUDA a wait
// blocks no thread; the compute stream stands still instead, from the moment it reaches the wait
// (an event recorded on it just before the wait) until the collective's end event. A collective
// that runs on the compute stream itself (the caller stream) holds the compute stream for all of
// its span; so does one that has ended when its call returns (a group that blocks the host, as the
// host-staged one does): nothing could be queued on the compute stream meanwhile. add_recorded_
// collectives turns both kinds into the timeline's compute_waits.
//
// Streams. On CUDA each collective given a stream other than the caller's current one (the tp_comm
// stream) is first ordered after the caller's work so far (parallel/comm/stream_order.h): every
// caller of the tp group may hand it tp.stream without ordering it itself.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "runtime/graph/step_timeline.h"

namespace weft {

namespace cuda {
class Event;
}  // namespace cuda

class CollectiveRecorder {
 public:
  struct Collective {
    std::string description;
    int64_t bytes = 0;
    CollectiveHandlePtr handle;  // its start_ms()/end_ms() once done
  };
  struct Wait {
    double start_ms = 0.0;  // clock_ms()
    double end_ms = 0.0;
  };
  // CUDA: the compute stream waited from `reached` (a timing event recorded on it just before the
  // wait) to the end of `collective`; a null `reached` means from the collective's start (it ran
  // on the compute stream, or held the host until it was done).
  struct DeviceWait {
    std::shared_ptr<cuda::Event> reached;
    CollectiveHandlePtr collective;
  };
  struct Step {
    std::vector<Collective> collectives;
    std::vector<Wait> waits;
    std::vector<DeviceWait> device_waits;
  };

  void begin();
  Step take();  // what was recorded since begin(); stops recording
  void add(const std::string& description, int64_t bytes, const CollectiveHandlePtr& handle);
  void add_wait(double start_ms, double end_ms);
  void add_device_wait(std::shared_ptr<cuda::Event> reached, const CollectiveHandlePtr& collective);
  bool active() const;

 private:
  mutable std::mutex mutex_;
  bool active_ = false;
  Step step_;
};

class TracedProcessGroup final : public ProcessGroup {
 public:
  TracedProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<CollectiveRecorder> recorder)
      : inner_(std::move(inner)), recorder_(std::move(recorder)) {}

  int size() const override { return inner_->size(); }
  int rank() const override { return inner_->rank(); }
  const std::string& name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }

  CollectiveHandlePtr all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) override;
  CollectiveHandlePtr reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                     const CommStream& stream) override;
  CollectiveHandlePtr all_gather(const Tensor& input, const Tensor& output, const CommStream& stream) override;
  CollectiveHandlePtr broadcast(const Tensor& tensor, int root, const CommStream& stream) override;
  CollectiveHandlePtr send(const Tensor& tensor, int peer, const CommStream& stream) override;
  CollectiveHandlePtr recv(const Tensor& tensor, int peer, const CommStream& stream) override;
  CollectiveHandlePtr exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor, int recv_peer,
                               const CommStream& stream) override;
  CollectiveHandlePtr barrier(const CommStream& stream) override;

 private:
  // Runs `issue` (the inner group's call) and records the collective it returns.
  template <class Issue>
  CollectiveHandlePtr traced(const CommStream& stream, Issue&& issue);
  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<CollectiveRecorder> recorder_;
};

// Adds what `recorded` holds to `timeline` (one step's): each collective that has completed as a
// node of the tp_comm row (node -1), each wait as a compute wait; then recomputes its metrics.
// Times are ms since the step's start: on the CPU from timeline.origin_clock_ms; on CUDA from
// `device_start`, the step's start event (Executor::FinishedStep::device_start). Without either
// (a CUDA step given no start event) nothing is added.
void add_recorded_collectives(const CollectiveRecorder::Step& recorded, const cuda::Event* device_start,
                              graph::StepTimeline& timeline);

}  // namespace weft
