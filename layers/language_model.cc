// build_model and loss (language_model.h).
#include "layers/language_model.h"

#include "layers/registry.h"
#include "runtime/error.h"
#include "runtime/ops/loss.h"

namespace weft {

std::vector<ModelSegment> LanguageModel::segments() {
  ModelSegment whole{"model", [this](const Tensor& ids) { return logits(ids); }, {}};
  for (const NamedParameter& parameter : named_parameters()) whole.parameters.push_back(parameter.name);
  return {whole};
}

std::shared_ptr<LanguageModel> build_model(const ModelConfig& config) {
  validate_model_config(config);
  uint64_t offset = 0;  // every build starts at counter 0: same seed, same weights
  const LayerContext context{config, &offset};
  std::shared_ptr<Module> module = LayerRegistry::global().create(config.type, context);
  auto model = std::dynamic_pointer_cast<LanguageModel>(module);
  WEFT_CHECK(model != nullptr, "model.type = '", config.type, "' builds a ", module->type_name(),
             ", which is not a language model (its class must derive from weft::LanguageModel)");
  return model;
}

Tensor loss(LanguageModel& model, const Tensor& ids, const Tensor& targets, int64_t ignore_index) {
  WEFT_CHECK(ids.dim() == 2 && targets.shape() == ids.shape(), "loss: ids ", ids.describe(), " and targets ",
             targets.describe(), " must both be [B, T]");
  const Tensor logits = model.logits(ids);  // [B, T, V]
  return cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), ignore_index);
}

}  // namespace weft
