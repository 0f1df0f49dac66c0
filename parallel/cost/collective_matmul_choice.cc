// choose_collective_matmul_chunks (collective_matmul_choice.h).
#include "parallel/cost/collective_matmul_choice.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/error.h"

namespace weft {

CollectiveMatmulChoice choose_collective_matmul_chunks(double activation_bytes, double matmul_flops, int tp,
                                                       LinkClass link, const CostModel& model) {
  WEFT_CHECK(tp >= 2, "choose_collective_matmul_chunks: tp = ", tp, " has nothing to gather");
  CollectiveMatmulChoice choice;
  const double chunk_exchange = model.collective_ms(CollectiveKind::kSendRecv, activation_bytes / tp, 2, link);
  const double chunk_matmul = model.matmul_ms(matmul_flops / tp) + model.ops_ms(1.0);
  choice.ring_ms = (tp - 1) * std::max(chunk_exchange, chunk_matmul) + chunk_matmul;
  choice.single_ms = model.collective_ms(CollectiveKind::kAllGather, activation_bytes, tp, link) +
                     model.matmul_ms(matmul_flops) + model.ops_ms(1.0);
  choice.chunks = choice.ring_ms <= choice.single_ms ? tp : 1;
  choice.explanation = absl::StrFormat(
      "collective matmuls: %s: predicted %.3f ms per sequence-parallel linear as a ring of %d chunks, %.3f ms as one "
      "collective then one matmul (%.2f MB gathered over %d ranks, %s)",
      choice.chunks == 1 ? "one collective" : absl::StrFormat("ring of %d chunks", tp), choice.ring_ms, tp,
      choice.single_ms, activation_bytes / 1048576.0, tp, link_class_name(link));
  return choice;
}

}  // namespace weft
