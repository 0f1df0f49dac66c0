// WeightGradientOverlap (weight_gradient_overlap.h).
#include "parallel/step/weight_gradient_overlap.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>

#if defined(WEFT_HAVE_CUDA)
#include "runtime/cuda/stream.h"
#endif

namespace weft {

bool weight_gradient_stream_setting() {
  static const bool on = [] {
    const char* value = std::getenv("WEFT_WEIGHT_GRADIENT_STREAM");
    if (value == nullptr || std::string_view(value) == "0") return false;
    if (std::string_view(value) == "1") return true;
    std::fprintf(stderr, "weft: WEFT_WEIGHT_GRADIENT_STREAM=%s is not one of 0, 1; using 0\n", value);
    return false;
  }();
  return on;
}

namespace {
std::atomic<int64_t> items_launched{0};
}  // namespace

int64_t weight_gradient_items_launched_for_testing() { return items_launched.load(); }

// One segment's launched items: the closures that ran (holding their tensors) and, on CUDA, the
// event after their products on the second stream.
struct WeightGradientOverlap::Launch {
  int segment = -1;
  std::vector<std::function<void()>> ran;
#if defined(WEFT_HAVE_CUDA)
  std::unique_ptr<cuda::Event> done;  // made on first use on CUDA (none exists on the CPU)
#endif
};

#if defined(WEFT_HAVE_CUDA)
struct WeightGradientOverlap::DeviceStreams {
  explicit DeviceStreams(int device) : stream(device) {}
  cuda::Stream stream;
  cuda::Event compute_ready{false};  // recorded on the compute stream before each launch
};
#else
struct WeightGradientOverlap::DeviceStreams {};
#endif

WeightGradientOverlap::WeightGradientOverlap(Device device, std::vector<std::vector<std::string>> segment_parameters)
    : device_(device) {
  for (std::vector<std::string>& names : segment_parameters) {
    segment_parameters_.emplace_back(std::make_move_iterator(names.begin()), std::make_move_iterator(names.end()));
  }
#if defined(WEFT_HAVE_CUDA)
  if (device_.is_cuda()) streams_ = std::make_unique<DeviceStreams>(device_.index);
#endif
}

WeightGradientOverlap::~WeightGradientOverlap() {
#if defined(WEFT_HAVE_CUDA)
  // The held tensors may be freed only once the products reading them are done.
  if (streams_ != nullptr) streams_->stream.synchronize();
#endif
  pending_.clear();
}

autograd::DeferredWeightGradients& WeightGradientOverlap::deferral() { return deferral_; }

void WeightGradientOverlap::before_backward(int segment) {
  if (pending_.empty()) return;
  const std::set<std::string>& reads = segment_parameters_.at(segment);
  for (const std::unique_ptr<Launch>& launch : pending_) {
    const std::set<std::string>& launched = segment_parameters_.at(launch->segment);
    const bool shared = std::any_of(reads.begin(), reads.end(),
                                    [&](const std::string& name) { return launched.count(name) > 0; });
    if (shared) {
      // Both would accumulate into one .grad from two streams.
      join();
      return;
    }
  }
  // The newest launch runs beside this backward; older ones have had a whole segment's time.
  retire(pending_.size() - 1);
}

void WeightGradientOverlap::launch(int segment) {
  if (deferral_.empty()) return;
  items_launched.fetch_add(static_cast<int64_t>(deferral_.size()));
  std::unique_ptr<Launch> launch;
  if (!spare_.empty()) {
    launch = std::move(spare_.back());
    spare_.pop_back();
  } else {
    launch = std::make_unique<Launch>();
  }
  launch->segment = segment;
#if defined(WEFT_HAVE_CUDA)
  if (streams_ != nullptr) {
    const int device = device_.index;
    streams_->compute_ready.record(cuda::current_stream(device));
    streams_->compute_ready.wait(streams_->stream.get());
    {
      cuda::StreamGuard guard(device, streams_->stream.get());
      deferral_.run(&launch->ran);
    }
    if (launch->done == nullptr) launch->done = std::make_unique<cuda::Event>(false);
    launch->done->record(streams_->stream.get());
    pending_.push_back(std::move(launch));
    return;
  }
#endif
  // No second stream: the products ran in line, and their tensors may go now.
  deferral_.run();
  spare_.push_back(std::move(launch));
}

void WeightGradientOverlap::join() { retire(pending_.size()); }

void WeightGradientOverlap::retire(size_t count) {
  if (count == 0) return;
#if defined(WEFT_HAVE_CUDA)
  // One stream's events complete in order: waiting for the newest retired launch waits for all.
  if (streams_ != nullptr) pending_[count - 1]->done->wait(cuda::current_stream(device_.index));
#endif
  for (size_t i = 0; i < count; ++i) {
    // Freed with the compute stream current, after its wait: their memory returns to its cache.
    pending_[i]->ran.clear();
    spare_.push_back(std::move(pending_[i]));
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(count));
}

}  // namespace weft
