// CollectiveRecorder and TracedProcessGroup (traced_process_group.h).
#include "parallel/comm/traced_process_group.h"

#include "runtime/clock.h"

namespace weft {

void CollectiveRecorder::begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = true;
  step_ = {};
}

CollectiveRecorder::Step CollectiveRecorder::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = false;
  return std::move(step_);
}

void CollectiveRecorder::add(const std::string& description, int64_t bytes, const CollectiveHandlePtr& handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_) step_.collectives.push_back({description, bytes, handle});
}

void CollectiveRecorder::add_wait(double start_ms, double end_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_) step_.waits.push_back({start_ms, end_ms});
}

namespace {

// Forwards to the inner handle; a wait that blocks the host (the CPU's) is told to the recorder.
class TracedHandle final : public CollectiveHandle {
 public:
  TracedHandle(CollectiveHandlePtr inner, std::shared_ptr<CollectiveRecorder> recorder, bool host_waits)
      : CollectiveHandle(inner->description(), inner->bytes()),
        inner_(std::move(inner)),
        recorder_(std::move(recorder)),
        host_waits_(host_waits) {}

  void wait() override { timed([&] { inner_->wait(); }); }
  void wait(const CommStream& stream) override { inner_->wait(stream); }
  void synchronize() override { timed([&] { inner_->synchronize(); }); }
  bool is_done() override { return inner_->is_done(); }
  double start_ms() override { return inner_->start_ms(); }
  double end_ms() override { return inner_->end_ms(); }

 private:
  template <class Function>
  void timed(Function&& function) {
    if (!host_waits_ || inner_->is_done()) {
      function();
      return;
    }
    const double start = clock_ms();
    function();
    recorder_->add_wait(start, clock_ms());
  }

  CollectiveHandlePtr inner_;
  std::shared_ptr<CollectiveRecorder> recorder_;
  bool host_waits_;
};

}  // namespace

template <class Issue>
CollectiveHandlePtr TracedProcessGroup::traced(const CommStream& stream, Issue&& issue) {
  const bool host_waits = inner_->device().is_cpu();
  const double start = clock_ms();
  CollectiveHandlePtr handle = issue();
  // On the caller stream a CPU collective runs inside the call: the call is the wait.
  if (host_waits && stream.is_caller()) recorder_->add_wait(start, clock_ms());
  recorder_->add(handle->description(), handle->bytes(), handle);
  return std::make_shared<TracedHandle>(std::move(handle), recorder_, host_waits);
}

CollectiveHandlePtr TracedProcessGroup::all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) {
  return traced(stream, [&] { return inner_->all_reduce(tensor, reduction, stream); });
}
CollectiveHandlePtr TracedProcessGroup::reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                                       const CommStream& stream) {
  return traced(stream, [&] { return inner_->reduce_scatter(input, output, reduction, stream); });
}
CollectiveHandlePtr TracedProcessGroup::all_gather(const Tensor& input, const Tensor& output, const CommStream& stream) {
  return traced(stream, [&] { return inner_->all_gather(input, output, stream); });
}
CollectiveHandlePtr TracedProcessGroup::broadcast(const Tensor& tensor, int root, const CommStream& stream) {
  return traced(stream, [&] { return inner_->broadcast(tensor, root, stream); });
}
CollectiveHandlePtr TracedProcessGroup::send(const Tensor& tensor, int peer, const CommStream& stream) {
  return traced(stream, [&] { return inner_->send(tensor, peer, stream); });
}
CollectiveHandlePtr TracedProcessGroup::recv(const Tensor& tensor, int peer, const CommStream& stream) {
  return traced(stream, [&] { return inner_->recv(tensor, peer, stream); });
}
CollectiveHandlePtr TracedProcessGroup::exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor,
                                                 int recv_peer, const CommStream& stream) {
  return traced(stream, [&] { return inner_->exchange(send_tensor, send_peer, recv_tensor, recv_peer, stream); });
}
CollectiveHandlePtr TracedProcessGroup::barrier(const CommStream& stream) { return traced(stream, [&] { return inner_->barrier(stream); }); }

}  // namespace weft
