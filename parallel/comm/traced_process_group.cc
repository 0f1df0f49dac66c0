// CollectiveRecorder and TracedProcessGroup (traced_process_group.h).
#include "parallel/comm/traced_process_group.h"

#include "parallel/comm/stream_order.h"
#include "runtime/clock.h"

#if WEFT_HAVE_CUDA
#include "parallel/comm/cuda_collective_handle.h"
#include "runtime/cuda/stream.h"
#endif

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

void CollectiveRecorder::add_device_wait(std::shared_ptr<cuda::Event> reached, const CollectiveHandlePtr& collective) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_) step_.device_waits.push_back({std::move(reached), collective});
}

bool CollectiveRecorder::active() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_;
}

namespace {

// A timing event recorded now on the calling thread's current stream of `device`: it completes when
// that stream reaches this point. Null while the recorder is not recording (no step).
std::shared_ptr<cuda::Event> compute_stream_arrival(const CollectiveRecorder& recorder, Device device) {
#if WEFT_HAVE_CUDA
  if (!recorder.active()) return nullptr;
  cuda::set_device(device.index);
  auto arrival = std::make_shared<cuda::Event>(true);
  arrival->record(cuda::current_stream(device.index));
  return arrival;
#else
  (void)recorder;
  (void)device;
  return nullptr;
#endif
}

// Forwards to the inner handle; tells the recorder of each wait: a host interval where the wait
// blocks the host (the CPU's), the waiting stream's arrival where it orders a CUDA stream.
class TracedHandle final : public CollectiveHandle {
 public:
  TracedHandle(CollectiveHandlePtr inner, std::shared_ptr<CollectiveRecorder> recorder, Device device)
      : CollectiveHandle(inner->description(), inner->bytes()),
        inner_(std::move(inner)),
        recorder_(std::move(recorder)),
        device_(device) {}

  void wait() override {
    if (device_.is_cuda()) {
      device_wait(CommStream());
      inner_->wait();
      return;
    }
    timed([&] { inner_->wait(); });
  }
  void wait(const CommStream& stream) override {
    if (device_.is_cuda() && !stream.is_cpu_thread()) device_wait(stream);
    inner_->wait(stream);
  }
  void synchronize() override {
    if (device_.is_cuda()) {
      inner_->synchronize();
      return;
    }
    timed([&] { inner_->synchronize(); });
  }
  bool is_done() override { return inner_->is_done(); }
  double start_ms() override { return inner_->start_ms(); }
  double end_ms() override { return inner_->end_ms(); }

 private:
  template <class Function>
  void timed(Function&& function) {
    if (inner_->is_done()) {
      function();
      return;
    }
    const double start = clock_ms();
    function();
    recorder_->add_wait(start, clock_ms());
  }

  // Records where `stream` (the caller stream: the current one) reaches this wait. Only the compute
  // stream's waits count: a wait on another stream (one ring exchange's stream waiting for the
  // last) stalls no compute.
  void device_wait(const CommStream& stream) {
    if (!runs_on_current_stream(stream, device_)) return;
    std::shared_ptr<cuda::Event> reached = compute_stream_arrival(*recorder_, device_);
    if (reached) recorder_->add_device_wait(std::move(reached), inner_);
  }

  CollectiveHandlePtr inner_;
  std::shared_ptr<CollectiveRecorder> recorder_;
  Device device_;
};

}  // namespace

template <class Issue>
CollectiveHandlePtr TracedProcessGroup::traced(const CommStream& stream, Issue&& issue) {
  const Device device = inner_->device();
  if (device.is_cuda()) order_after_current_stream(stream);
  const double start = clock_ms();
  CollectiveHandlePtr handle = issue();
  if (device.is_cpu()) {
    // On the caller stream a CPU collective runs inside the call: the call is the wait.
    if (stream.is_caller()) recorder_->add_wait(start, clock_ms());
  } else if (runs_on_current_stream(stream, device) || handle->is_done()) {
    // In line with the compute, the compute stream stands still for all of it. So it does for one
    // done before the call returned (a group that blocks the host, as the host-staged one does):
    // nothing could be queued on the compute stream meanwhile, and the collective's stream, ordered
    // after the compute, began it where the compute ran dry.
    recorder_->add_device_wait(nullptr, handle);
  }
  recorder_->add(handle->description(), handle->bytes(), handle);
  return std::make_shared<TracedHandle>(std::move(handle), recorder_, device);
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

namespace {

// [start, end] of `handle` in ms since `device_start`; false where it has not completed or is not a
// CUDA handle.
bool device_interval(const CollectiveHandlePtr& handle, const cuda::Event& device_start, graph::Interval& interval) {
#if WEFT_HAVE_CUDA
  auto* cuda_handle = dynamic_cast<CudaCollectiveHandle*>(handle.get());
  if (cuda_handle == nullptr || !cuda_handle->is_done()) return false;
  interval.start_ms = cuda_handle->start_event().elapsed_since(device_start);
  interval.end_ms = cuda_handle->end_event().elapsed_since(device_start);
  return true;
#else
  (void)handle;
  (void)device_start;
  (void)interval;
  return false;
#endif
}

}  // namespace

void add_recorded_collectives(const CollectiveRecorder::Step& recorded, const cuda::Event* device_start,
                              graph::StepTimeline& timeline) {
  const bool on_host = timeline.origin_clock_ms >= 0.0;
  if (!on_host && device_start == nullptr) return;
  const double origin = timeline.origin_clock_ms;
  for (const CollectiveRecorder::Collective& collective : recorded.collectives) {
    graph::Interval interval;
    if (on_host) {
      if (!collective.handle->is_done() || collective.handle->start_ms() < 0.0) continue;
      interval = {collective.handle->start_ms() - origin, collective.handle->end_ms() - origin};
    } else if (!device_interval(collective.handle, *device_start, interval)) {
      continue;
    }
    graph::NodeTiming timing;
    timing.name = collective.description;
    timing.kind = graph::NodeKind::kCollective;
    timing.stream = graph::StreamClass::kTpComm;
    timing.bytes = collective.bytes;
    timing.start_ms = interval.start_ms;
    timing.end_ms = interval.end_ms;
    timeline.nodes.push_back(timing);
  }
  if (on_host) {
    for (const CollectiveRecorder::Wait& wait : recorded.waits) {
      timeline.compute_waits.push_back({wait.start_ms - origin, wait.end_ms - origin});
    }
  } else {
#if WEFT_HAVE_CUDA
    for (const CollectiveRecorder::DeviceWait& wait : recorded.device_waits) {
      graph::Interval collective;
      if (!device_interval(wait.collective, *device_start, collective)) continue;
      const double reached = wait.reached ? wait.reached->elapsed_since(*device_start) : collective.start_ms;
      // A collective that had ended when the compute stream reached its wait cost compute nothing.
      if (collective.end_ms > reached) timeline.compute_waits.push_back({reached, collective.end_ms});
    }
#endif
  }
  timeline.compute_metrics();
}

}  // namespace weft
