// run_segments (model_segment.h).
#include "layers/model_segment.h"

#include "runtime/error.h"

namespace weft {

Tensor run_segments(const std::vector<ModelSegment>& segments, const Tensor& input) {
  WEFT_CHECK(!segments.empty(), "run_segments: a model needs at least one segment");
  Tensor x = input;
  for (const ModelSegment& segment : segments) x = segment.forward(x);
  return x;
}

}  // namespace weft
