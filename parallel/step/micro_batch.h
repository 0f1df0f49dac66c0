// MicroBatch: what a training step takes from the data, one micro-batch at a time.
//
// Token ids and next-token targets, [B, T] each, i32 or i64, on the host: the step counts the
// targets there (so cross-entropy needs no read back from a device) and uploads both to the
// model's device itself. The trainer hands the strategy a source that returns the next one.
#pragma once

#include <functional>

#include "runtime/tensor.h"

namespace weft {

struct MicroBatch {
  Tensor inputs;   // [B, T] token ids
  Tensor targets;  // [B, T] the ids that follow them
};
using MicroBatchSource = std::function<MicroBatch()>;

}  // namespace weft
