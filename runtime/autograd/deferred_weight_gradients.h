// Deferred weight gradients: a backward pass split into B (input gradients) and W (weight gradients),
// as zero-bubble pipeline schedules want (Qi et al. 2023, "Zero Bubble Pipeline Parallelism").
//
// The previous pipeline stage waits only for the input gradient, so a stage runs B at once and keeps
// W for later, when it would otherwise sit idle:
//
//   autograd::DeferredWeightGradients weight_work;
//   {
//     autograd::DeferWeightGradients defer(weight_work);
//     input_gradient = autograd::backward_to_inputs({output}, {output_gradient}, {input})[0];  // B
//   }
//   send(input_gradient);
//   ...
//   weight_work.run();  // W: parameters' .grad accumulate and their grad-ready hooks fire now
//
// Invariants:
// - Only ops that know how to defer (today: linear, with or without a bias, and linear_gelu;
//   runtime/ops/matmul.cc), and only when the weight (and the bias, if it requires grad) is a leaf: its gradient edge leads
//   straight to its AccumulateGrad. Everything else computes every gradient during the backward.
// - A deferring backward returns no gradient for the weight and bias, so the engine skips their
//   AccumulateGrad: .grad is untouched and grad-ready hooks do not fire until run().
// - run() computes each gradient with the same kernels as an undeferred backward (bitwise equal
//   results) and hands it to the leaf's AccumulateGrad, in the order the work was deferred.
// - A parameter used by several deferred ops (or by a deferred op and an undeferred one) gets one
//   AccumulateGrad call per use, so its hooks fire once per use, not once per backward.
// - Do not defer while a backward_to_inputs stops at a parameter: the deferred work accumulates into
//   .grad and cannot see the stop.
// - Work items own the tensors they need (the engine frees a node's saved tensors after its
//   backward), so memory a deferred op's backward would have freed stays held until run().
// - The target is per thread; the engine runs a backward on the calling thread.
// - BiasGradients::kWithInputGradients (weight gradients on a second stream,
//   parallel/step/weight_gradient_overlap.h) keeps the bias gradients where an undeferred backward
//   takes them, with dX's product or from the op that wrote dY (runtime/ops/bias_gradient_handoff.h),
//   so that only the weight's product waits: the work item then carries the sums and hands them to
//   the bias's AccumulateGrad when it runs. kDeferred (zero-bubble pipelines) computes them in the
//   work item too.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

namespace weft::autograd {

// The weight-gradient work a backward left for later, in the order it was deferred. Destroying it
// with work pending drops that work: those weights never receive those gradients.
class DeferredWeightGradients {
 public:
  // Where a deferring linear's bias gradient is computed (see the invariants above).
  enum class BiasGradients { kDeferred, kWithInputGradients };

  explicit DeferredWeightGradients(BiasGradients bias = BiasGradients::kDeferred) : bias_(bias) {}
  // Copying would run the same accumulation twice. Moving is allowed, but not while a
  // DeferWeightGradients targets this object.
  DeferredWeightGradients(const DeferredWeightGradients&) = delete;
  DeferredWeightGradients& operator=(const DeferredWeightGradients&) = delete;
  DeferredWeightGradients(DeferredWeightGradients&&) = default;
  DeferredWeightGradients& operator=(DeferredWeightGradients&&) = default;

  bool empty() const { return work_.empty(); }
  size_t size() const { return work_.size(); }
  // Runs every deferred item in order, with grad mode off, then forgets them. Each computes a
  // weight's (and its bias's) gradient and hands it to the leaf's AccumulateGrad, so .grad
  // accumulates and the grad-ready hooks fire as an undeferred backward would have. An item is
  // forgotten before it runs: if one throws, it is lost and the items after it stay deferred.
  // With `ran`, each item that ran is moved there instead of being destroyed, so that the tensors it
  // owns stay held until the caller drops them: work queued on another stream than the one that
  // frees them must not give their memory back before the freeing stream is ordered after it.
  void run(std::vector<std::function<void()>>* ran = nullptr);
  // Called by ops' backward when current_weight_gradient_deferral() is this object.
  void add(std::function<void()> work);
  BiasGradients bias_gradients() const { return bias_; }

 private:
  BiasGradients bias_ = BiasGradients::kDeferred;
  std::deque<std::function<void()>> work_;
};

// While a DeferWeightGradients is alive on a thread, linear layers' backward on that thread
// computes the input gradient only and adds its weight (and bias) gradient work to `deferred`.
// Guards nest: destroying one restores the target that was current when it was made.
class DeferWeightGradients {
 public:
  explicit DeferWeightGradients(DeferredWeightGradients& deferred);
  ~DeferWeightGradients();
  DeferWeightGradients(const DeferWeightGradients&) = delete;
  DeferWeightGradients& operator=(const DeferWeightGradients&) = delete;

 private:
  DeferredWeightGradients* previous_;
};

// The thread's current target, or null when weight gradients are computed during the backward.
DeferredWeightGradients* current_weight_gradient_deferral();

// Whether a linear's backward on this thread leaves its bias gradient to the deferred work: a
// current target that defers them (BiasGradients::kDeferred).
bool bias_gradients_deferred();

}  // namespace weft::autograd
