// TracedProcessGroup: a ProcessGroup that tells a CollectiveRecorder of every collective it runs
// and of every wait for one, so that collectives issued inside a step-graph node (the
// tensor-parallel layers', on the tp group) appear in the step's timeline: on the tp_comm row of
// the trace, in comm_ms, and — through the waits, when the compute thread blocked on them — in
// exposed_comm_ms (runtime/graph/step_timeline.h).
//
// The recorder keeps entries only between begin() and take() (one step), so collectives outside
// steps (start-up barriers, checkpoint gathers) are not kept. Waits are host intervals: they say
// where the CPU compute thread blocked; on CUDA a wait orders streams without blocking, so there
// the recorder keeps the collectives but no waits. Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace weft {

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
  struct Step {
    std::vector<Collective> collectives;
    std::vector<Wait> waits;
  };

  void begin();
  Step take();  // what was recorded since begin(); stops recording
  void add(const std::string& description, int64_t bytes, const CollectiveHandlePtr& handle);
  void add_wait(double start_ms, double end_ms);

 private:
  std::mutex mutex_;
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

}  // namespace weft
