// make_strategy (strategy.h).
#include "parallel/strategy.h"

#include "parallel/comm/process_group.h"
#include "parallel/data/data_parallel_strategy.h"
#include "runtime/error.h"

namespace weft {

std::unique_ptr<Strategy> make_strategy(const Mesh& mesh, int world_rank, LanguageModel& model,
                                        const StrategyOptions& options) {
  WEFT_CHECK(mesh.tp() == 1 && mesh.pp() == 1, "parallel.tp = ", mesh.tp(), " and parallel.pp = ", mesh.pp(),
             ": tensor and pipeline parallelism are not available yet; set both to 1 (data parallelism, "
             "parallel.dp, is)");
  const std::vector<NamedParameter> parameters = model.named_parameters();
  WEFT_CHECK(!parameters.empty(), "strategy: the model has no parameters");
  const Device device = parameters[0].tensor.device();
  return std::make_unique<DataParallelStrategy>(make_process_group(mesh, Axis::kData, device), world_rank, model,
                                                options);
}

}  // namespace weft
