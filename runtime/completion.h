// Completion: "this piece of work has finished", for work that finishes after the call that
// started it: a node of the step graph, a collective queued on a communication thread or stream.
//
// The step graph's NodeWork returns one (nullptr: done when the work returned) and the executor
// synchronizes on it before it counts the node as done. parallel/'s CollectiveHandle is a
// Completion (it adds the collective-only ordering calls), so a collective is returned from a
// node as it is. The interface lives in runtime/ because runtime/ may not name parallel/ types.
//
// Invariants:
// - synchronize() blocks the host until the work is done and rethrows its failure (weft::Error or
//   what the work threw); it may be called more than once and from any thread.
// - is_done() never blocks; it is true once the work has finished, successfully or not.
// - start_ms()/end_ms() are when the work began executing (not when it was queued) and when it
//   finished, on clock_ms() (runtime/clock.h), and are known once done; a negative value means
//   "unknown" (not done yet, or not measured), and the executor then uses the times it observed
//   itself (call and return of the work, return of synchronize()).
#pragma once

#include <memory>

#include "runtime/clock.h"

namespace weft {

class Completion {
 public:
  virtual ~Completion() = default;
  // Blocks the host until the work is done; rethrows its failure.
  virtual void synchronize() = 0;
  // Whether the work has finished (successfully or not); never blocks.
  virtual bool is_done() = 0;
  // On clock_ms(); negative when not known.
  virtual double start_ms() { return -1.0; }
  virtual double end_ms() { return -1.0; }
};
using CompletionPtr = std::shared_ptr<Completion>;

}  // namespace weft
