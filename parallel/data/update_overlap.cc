// UpdateOverlap (update_overlap.h): one stream and an event per part.
#include "parallel/data/update_overlap.h"

#include <algorithm>
#include <vector>

#include "runtime/error.h"

#if WEFT_HAVE_CUDA
#include "runtime/cuda/stream.h"
#endif

namespace weft {

#if WEFT_HAVE_CUDA

struct UpdateOverlap::State {
  int device;
  cuda::Stream stream;
  cuda::Event compute_ready;            // the compute stream's work before an update
  std::vector<cuda::Event> part_ends;   // per part, recorded after its launches
  bool updated = false;                 // an update has been issued
  explicit State(int device_index, int parts) : device(device_index), stream(device_index), part_ends(parts) {}
};

bool UpdateOverlap::available(const Device& device) { return device.is_cuda(); }

UpdateOverlap::UpdateOverlap(const Device& device, int parts) {
  WEFT_CHECK(device.is_cuda(), "UpdateOverlap: ", device.to_string(), " is not a CUDA device");
  WEFT_CHECK(parts >= 1, "UpdateOverlap: at least one part, got ", parts);
  cuda::set_device(device.index);
  state_ = std::make_unique<State>(device.index, parts);
}

UpdateOverlap::~UpdateOverlap() = default;

void UpdateOverlap::run(const std::function<void()>& update) {
  cuda::set_device(state_->device);
  state_->compute_ready.record(cuda::current_stream(state_->device));
  state_->compute_ready.wait(state_->stream.get());
  {
    cuda::StreamGuard on_update_stream(state_->device, state_->stream.get());
    update();
  }
  state_->updated = true;
}

void UpdateOverlap::part_done(int part) {
  WEFT_CHECK(part >= 0 && part < static_cast<int>(state_->part_ends.size()), "UpdateOverlap: part ", part, " of ",
             state_->part_ends.size());
  state_->part_ends[part].record(state_->stream.get());
}

void UpdateOverlap::before_forward(int segment) {
  if (!state_->updated) return;
  // A segment beyond the parts (none today: parts are the segments) reads at most every part.
  const int part = std::min(segment, static_cast<int>(state_->part_ends.size()) - 1);
  state_->part_ends[part].wait(cuda::current_stream(state_->device));
}

void UpdateOverlap::join() {
  if (!state_->updated) return;
  state_->part_ends.back().wait(cuda::current_stream(state_->device));
}

#else  // no CUDA: never made

struct UpdateOverlap::State {};

bool UpdateOverlap::available(const Device&) { return false; }

UpdateOverlap::UpdateOverlap(const Device& device, int) {
  WEFT_FAIL("UpdateOverlap: this build of weft has no CUDA, so ", device.to_string(), " cannot overlap updates");
}

UpdateOverlap::~UpdateOverlap() = default;
void UpdateOverlap::run(const std::function<void()>& update) { update(); }
void UpdateOverlap::part_done(int) {}
void UpdateOverlap::before_forward(int) {}
void UpdateOverlap::join() {}

#endif

}  // namespace weft
