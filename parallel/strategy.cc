// make_strategy (strategy.h).
#include "parallel/strategy.h"

#include "parallel/comm/process_group.h"
#include "parallel/data/data_parallel_strategy.h"
#include "runtime/error.h"

namespace weft {

int64_t default_bucket_bytes(Device device) { return device.is_cpu() ? (int64_t{1} << 20) : (int64_t{25} << 20); }

std::unique_ptr<Strategy> make_strategy(const Mesh& mesh, int world_rank, LanguageModel& model,
                                        const StrategyOptions& given) {
  StrategyOptions options = given;
  WEFT_CHECK(mesh.tp() == 1 && mesh.pp() == 1, "parallel.tp = ", mesh.tp(), " and parallel.pp = ", mesh.pp(),
             ": tensor and pipeline parallelism are not available yet; set both to 1 (data parallelism, "
             "parallel.dp, is)");
  const std::vector<NamedParameter> parameters = model.named_parameters();
  WEFT_CHECK(!parameters.empty(), "strategy: the model has no parameters");
  const Device device = parameters[0].tensor.device();
  if (options.bucket_bytes == 0) options.bucket_bytes = default_bucket_bytes(device);
  return std::make_unique<DataParallelStrategy>(make_process_group(mesh, Axis::kData, device), world_rank, model,
                                                options);
}

}  // namespace weft
