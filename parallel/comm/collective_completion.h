// The step graph's view of a collective: a CollectiveHandle as a runtime/graph Completion, so that
// the executor (which may not name parallel/ types) waits on collectives and reads their timings.
//
// wait() blocks the host (CollectiveHandle::synchronize) and rethrows the collective's failure;
// start_ms()/end_ms() are the handle's timing once done (on clock_ms(), runtime/clock.h), -1
// before.
#pragma once

#include "parallel/comm/process_group.h"
#include "runtime/graph/completion.h"

namespace weft {

// Null for a null handle (the graph's "done when the work returned").
graph::CompletionPtr to_completion(CollectiveHandlePtr handle);

}  // namespace weft
