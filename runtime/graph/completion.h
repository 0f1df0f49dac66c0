// Completion: "this piece of step work has finished", as the step graph sees it.
//
// A StepGraph node's work runs when the executor calls it; work that finishes later (a collective
// queued on a communication thread or stream) returns a Completion, and the executor waits on it
// before it counts the node as done. This is the runtime's side of the contract; parallel/ adapts
// its CollectiveHandle to it (runtime/ may not name parallel/ types, so the interface lives here).
//
// Invariants:
// - wait() blocks the host until the work is done and rethrows its failure; it may be called more
//   than once and from any thread. is_done() never blocks.
// - start_ms()/end_ms() are on clock_ms() (runtime/clock.h) and valid once done; a negative value means "unknown", and the executor then uses the
//   times it observed itself (call and return of the work, return of wait()).
// - A null Completion means "done when the work returned".
#pragma once

#include <memory>

#include "runtime/clock.h"

namespace weft::graph {

class Completion {
 public:
  virtual ~Completion() = default;
  // Blocks until the work is done; rethrows its failure.
  virtual void wait() = 0;
  // Whether the work has finished (successfully or not); never blocks.
  virtual bool is_done() = 0;
  // When the work began executing (not when it was queued) and when it finished, on clock_ms();
  // negative when not known.
  virtual double start_ms() { return -1.0; }
  virtual double end_ms() { return -1.0; }
};
using CompletionPtr = std::shared_ptr<Completion>;

}  // namespace weft::graph
