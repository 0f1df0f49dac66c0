// NodeSpec in one call for the step-graph, scheduler and executor tests: the kind, the name, the
// stream class (compute by default) and the work (none by default: a node that only orders others).
#pragma once

#include <string>
#include <utility>

#include "runtime/graph/step_graph.h"

namespace weft::testing {

inline graph::NodeSpec node_spec(graph::NodeKind kind, std::string name,
                                 graph::StreamClass stream = graph::StreamClass::kCompute, graph::NodeWork work = {}) {
  graph::NodeSpec spec;
  spec.kind = kind;
  spec.name = std::move(name);
  spec.stream = stream;
  spec.work = std::move(work);
  return spec;
}

}  // namespace weft::testing
