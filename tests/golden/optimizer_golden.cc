// Golden test, weft side: AdamW and SGD over several steps, written to JSON so that
// tests/golden/optimizer_golden.py can replay the same steps with torch.optim and compare.
//
// Parameters (f64): "weight" [4, 5] (decayed) and "bias" [4] (not decayed), drawn from weft's
// Philox generator. Each step sets every .grad to fixed synthetic values (also Philox, distinct
// counters per step and parameter), takes one optimizer step and records every parameter.
//   adamw: 5 steps, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the weight and 0 on the bias,
//          lr from LearningRateSchedule(1e-2, warmup 2, total 5, cosine, min ratio 0.1).
//   sgd:   5 steps, momentum 0.9, nesterov off, weight decay 0.01 on the weight (L2, PyTorch's SGD
//          convention), same lr schedule.
// Usage: optimizer_golden OUTPUT.json
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/weft.h"
#include "tests/golden/tensor_json.h"

namespace {

using nlohmann::ordered_json;
using weft::NamedParameter;
using weft::Tensor;
using weft::golden::tensor_json;

constexpr uint64_t kSeed = 20240612;
constexpr int kSteps = 5;
constexpr double kPeakLr = 1e-2;
constexpr int64_t kWarmupSteps = 2;
constexpr double kMinLrRatio = 0.1;

std::vector<NamedParameter> make_parameters() {
  std::vector<NamedParameter> parameters;
  uint64_t offset = 0;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"weight", {4, 5}}, {"bias", {4}}}) {
    Tensor tensor = Tensor::normal(shape, kSeed, offset, 0.0, 1.0, weft::kFloat64);
    offset += static_cast<uint64_t>(tensor.numel());
    tensor.set_requires_grad(true);
    parameters.push_back(NamedParameter{.name = name, .tensor = tensor, .layout = weft::Layout::replicate()});
  }
  return parameters;
}

// The gradient of parameter `index` at `step`: scaled so the updates are of the usual size.
Tensor synthetic_gradient(const Tensor& parameter, int step, int index) {
  const uint64_t offset = 1000000 + 10000 * static_cast<uint64_t>(step) + 1000 * static_cast<uint64_t>(index);
  return Tensor::normal(parameter.shape(), kSeed, offset, 0.0, 0.5, weft::kFloat64);
}

// Runs `optimizer` over fresh parameters for kSteps steps and records everything torch needs.
ordered_json run(const std::string& name, const std::function<std::unique_ptr<weft::Optimizer>(
                                                   std::vector<weft::ParameterGroup>)>& make_optimizer,
                 double weight_decay, const ordered_json& options) {
  std::vector<NamedParameter> parameters = make_parameters();
  std::vector<weft::ParameterGroup> groups = weft::default_parameter_groups(parameters, weight_decay);
  std::unique_ptr<weft::Optimizer> optimizer = make_optimizer(groups);
  const weft::LearningRateSchedule schedule(kPeakLr, kWarmupSteps, kSteps, weft::ScheduleKind::kCosine,
                                            kMinLrRatio);

  ordered_json record;
  record["optimizer"] = name;
  record["options"] = options;
  ordered_json group_records = ordered_json::array();
  for (const weft::ParameterGroup& group : groups) {
    ordered_json names = ordered_json::array();
    for (const NamedParameter& parameter : group.parameters) names.push_back(parameter.name);
    group_records.push_back({{"parameters", names}, {"weight_decay", group.weight_decay}});
  }
  record["groups"] = group_records;
  ordered_json initial;
  for (const NamedParameter& parameter : parameters) initial[parameter.name] = tensor_json(parameter.tensor);
  record["initial"] = initial;

  ordered_json steps = ordered_json::array();
  for (int step = 0; step < kSteps; ++step) {
    ordered_json step_record;
    step_record["lr"] = schedule.at(step);
    ordered_json gradients, after;
    for (size_t i = 0; i < parameters.size(); ++i) {
      Tensor tensor = parameters[i].tensor;
      const Tensor gradient = synthetic_gradient(tensor, step, static_cast<int>(i));
      tensor.set_grad(gradient.clone());  // a copy: the optimizer must not see the recorded values move
      gradients[parameters[i].name] = tensor_json(gradient);
    }
    optimizer->step(schedule.at(step));
    for (const NamedParameter& parameter : parameters) after[parameter.name] = tensor_json(parameter.tensor);
    step_record["gradients"] = gradients;
    step_record["parameters_after"] = after;
    steps.push_back(step_record);
  }
  record["steps"] = steps;
  return record;
}

}  // namespace

int main(int argc, char** argv) {
  return weft::golden::golden_main(argc, argv, "optimizer_golden", [] {
    ordered_json output;
    output["schedule"] = {{"peak_lr", kPeakLr}, {"warmup_steps", kWarmupSteps}, {"total_steps", kSteps},
                          {"kind", "cosine"}, {"min_lr_ratio", kMinLrRatio}};
    const weft::AdamWOptions adamw{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    const weft::SgdOptions sgd{.momentum = 0.9, .nesterov = false};
    output["runs"] = ordered_json::array({
        run("adamw", [&](auto groups) { return weft::make_adamw(std::move(groups), adamw); }, 0.1,
            {{"beta1", adamw.beta1}, {"beta2", adamw.beta2}, {"eps", adamw.eps}}),
        run("sgd", [&](auto groups) { return weft::make_sgd(std::move(groups), sgd); }, 0.01,
            {{"momentum", sgd.momentum}, {"nesterov", sgd.nesterov}}),
    });
    return output;
  });
}
