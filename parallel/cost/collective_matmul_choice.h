// Collective-matmul chunk count: whether a sequence-parallel linear of the auto mode gathers (or
// reduce-scatters) its activation around a ring of tp chunks, each transfer under a chunk's matmul
// (parallel/tensor/collective_matmul.h), or in one collective beside one matmul — by the cost model.
//
// Ring: P - 1 steps, each as long as the slower of a chunk's exchange with the neighbours and a
// chunk's matmul, then the last chunk's matmul; each chunk pays the op overhead. One collective:
// the whole all-gather (or reduce-scatter), then the whole matmul. The ring wins where the matmul
// is long enough to hide the transfers; one collective where latency and small chunks dominate.
#pragma once

#include <string>

#include "parallel/cost/cost_model.h"

namespace weft {

struct CollectiveMatmulChoice {
  int chunks = 0;          // TensorParallelGroup::ring_chunks: tp (the ring) or 1
  double ring_ms = 0.0;    // predicted time of one collective matmul, each way
  double single_ms = 0.0;
  std::string explanation; // "ring of 4 chunks: predicted 0.31 ms per collective matmul against 0.45 ms ..."
};

// For a linear whose activation is `activation_bytes` (the whole gathered [B, T, C]) and whose
// matmul on this rank is `matmul_flops`, over `tp` ranks on `link`. tp must be at least 2.
CollectiveMatmulChoice choose_collective_matmul_chunks(double activation_bytes, double matmul_flops, int tp,
                                                       LinkClass link, const CostModel& model);

}  // namespace weft
