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

std::vector<ModelSegment> decoder_segments(const std::vector<NamedParameter>& parameters, size_t blocks, bool tied,
                                           const std::function<Tensor(size_t, const Tensor&)>& run) {
  auto names_under = [&parameters](const std::vector<std::string>& prefixes) {
    std::vector<std::string> names;
    for (const NamedParameter& parameter : parameters) {
      for (const std::string& prefix : prefixes) {
        if (parameter.name.rfind(prefix, 0) == 0) names.push_back(parameter.name);
      }
    }
    return names;
  };
  auto forward_of = [&run](size_t index) {
    return [run, index](const Tensor& x) { return run(index, x); };
  };
  std::vector<ModelSegment> out;
  out.push_back({"embedding", forward_of(0), names_under({"token_embedding.", "position_embedding."})});
  for (size_t layer = 0; layer < blocks; ++layer) {
    out.push_back({str("block ", layer), forward_of(layer + 1), names_under({str("blocks.", layer, ".")}), true, true});
  }
  out.push_back({"head", forward_of(blocks + 1), names_under({"final_norm.", tied ? "token_embedding." : "head."}),
                 true, false});
  return out;
}

}  // namespace weft
