// LanguageModel: what a training loop needs from a model, and build_model, which makes one from the
// `model` section of a run's config.
//
//   std::shared_ptr<LanguageModel> model = build_model(config);   // config.type through the registry
//   Tensor logits = model->logits(ids);                            // ids [B, T] -> [B, T, V]
//   loss(*model, ids, targets).backward();                         // mean cross-entropy
//   for (ModelSegment& segment : model->segments()) ...            // the pieces the step graph runs
//
// Weights are drawn from Philox(config.seed) in construction order, each layer at its own offsets,
// so two builds of one config are identical on every backend. A custom model registers a factory
// that returns a LanguageModel subclass (build_model refuses anything else); it need not cut itself
// into segments: by default the whole model is one segment (layers/model_segment.h).
#pragma once

#include <memory>

#include <vector>

#include "layers/model_config.h"
#include "layers/model_segment.h"
#include "layers/module.h"

namespace weft {

class LanguageModel : public Module {
 public:
  // ids [B, T] (i32 or i64, T <= seq_len) -> logits [B, T, V]
  virtual Tensor logits(const Tensor& ids) = 0;
  // forward is logits, so a model also works where a plain Module is expected.
  Tensor forward(const Tensor& ids) override { return logits(ids); }
  // The model cut into pieces whose composition is logits() (model_segment.h). The default is one
  // segment, logits itself, reading every parameter: a model that cannot be cut still trains.
  virtual std::vector<ModelSegment> segments();
};

// Validates `config` (validate_model_config) and builds config.type through LayerRegistry::global().
std::shared_ptr<LanguageModel> build_model(const ModelConfig& config);

// Mean next-token cross-entropy: logits(ids) [B, T, V] against targets [B, T] (ignore_index skipped).
Tensor loss(LanguageModel& model, const Tensor& ids, const Tensor& targets, int64_t ignore_index = -100);

}  // namespace weft
