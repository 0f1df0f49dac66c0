#include "parallel/comm/collective_completion.h"

namespace weft {
namespace {

class CollectiveCompletion final : public graph::Completion {
 public:
  explicit CollectiveCompletion(CollectiveHandlePtr handle) : handle_(std::move(handle)) {}
  void wait() override { handle_->synchronize(); }
  bool is_done() override { return handle_->is_done(); }
  double start_ms() override {
    std::optional<CollectiveTiming> timing = handle_->timing();
    return timing ? timing->start_ms : -1.0;
  }
  double end_ms() override {
    std::optional<CollectiveTiming> timing = handle_->timing();
    return timing ? timing->end_ms : -1.0;
  }

 private:
  CollectiveHandlePtr handle_;
};

}  // namespace

graph::CompletionPtr to_completion(CollectiveHandlePtr handle) {
  if (!handle) return nullptr;
  return std::make_shared<CollectiveCompletion>(std::move(handle));
}

}  // namespace weft
