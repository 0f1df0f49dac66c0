// Deferred weight gradients (deferred_weight_gradients.h).
#include "runtime/autograd/deferred_weight_gradients.h"

#include <utility>

#include "runtime/autograd/grad_mode.h"

namespace weft::autograd {
namespace {
thread_local DeferredWeightGradients* current_deferral = nullptr;
}  // namespace

void DeferredWeightGradients::run(std::vector<std::function<void()>>* ran) {
  // The engine runs AccumulateGrad (and the hooks it fires) with grad mode off; so does this.
  NoGradGuard no_grad;
  // Popped before running, so that an item that throws is not run again by a later run().
  while (!work_.empty()) {
    std::function<void()> work = std::move(work_.front());
    work_.pop_front();
    work();
    if (ran != nullptr) ran->push_back(std::move(work));
  }
}

void DeferredWeightGradients::add(std::function<void()> work) { work_.push_back(std::move(work)); }

DeferWeightGradients::DeferWeightGradients(DeferredWeightGradients& deferred) : previous_(current_deferral) {
  current_deferral = &deferred;
}

DeferWeightGradients::~DeferWeightGradients() { current_deferral = previous_; }

DeferredWeightGradients* current_weight_gradient_deferral() { return current_deferral; }

bool bias_gradients_deferred() {
  return current_deferral != nullptr &&
         current_deferral->bias_gradients() == DeferredWeightGradients::BiasGradients::kDeferred;
}

}  // namespace weft::autograd
