// apply_tensor_parallel_plan and tensor_parallel_segments (tensor_parallel_plan.h).
#include "parallel/tensor/tensor_parallel_plan.h"

#include "absl/strings/str_split.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "parallel/tensor/collective_matmul.h"
#include "parallel/tensor/layout_transition.h"
#include "parallel/tensor/sharding.h"
#include "parallel/tensor/vocab_parallel.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"

namespace weft {
namespace {

struct PlannedModule {
  Module* module;
  ParallelPlanEntry entry;  // module: the full name
};

std::string join_path(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  return name.empty() ? prefix : prefix + "." + name;
}

// Every module's declarations, by full name, in walk order (parents before children).
void collect_declared(Module& module, const std::string& path, std::vector<PlannedModule>& out) {
  for (const ParallelPlanEntry& declared : module.tensor_parallel_plan()) {
    Module* target = module.find_module(declared.module);
    const std::string full = join_path(path, declared.module);
    WEFT_CHECK(target != nullptr, module.type_name(), " (", path.empty() ? "the model" : path,
               ") declares a tensor-parallel style for '", declared.module, "', which is not one of its modules");
    ParallelPlanEntry entry = declared;
    entry.module = full;
    out.push_back({target, entry});
  }
  for (const auto& [name, child] : module.children()) collect_declared(*child, join_path(path, name), out);
}

void collect_names(Module& module, const std::string& path, std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(path, &module);
  for (const auto& [name, child] : module.children()) collect_names(*child, join_path(path, name), out);
}

bool matches(const std::string& pattern, const std::string& name) {
  const std::vector<std::string> wanted = absl::StrSplit(pattern, '.');
  const std::vector<std::string> parts = absl::StrSplit(name, '.');
  if (wanted.size() != parts.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (wanted[i] != "*" && wanted[i] != parts[i]) return false;
  }
  return true;
}

// The module's own parameter `name` replaced by this rank's shard of it.
void shard_own_parameter(Module& module, const std::string& full_name, const std::string& name, const Layout& layout,
                         const TensorParallelGroup& tp) {
  const Tensor full = module.parameter(name);
  check_shardable(full.shape(), layout, tp.size(),
                  str(full_name, ".", name, " (parallel.tp = ", tp.size(), ")"));
  module.shard_parameter(name, shard_of(full.detach(), layout, tp.rank(), tp.size()), layout);
}

LinearLayer& as_linear(const PlannedModule& planned) {
  auto* linear = dynamic_cast<LinearLayer*>(planned.module);
  WEFT_CHECK(linear != nullptr, "tensor-parallel plan: '", planned.entry.module, "' is a ",
             planned.module->type_name(), "; the ", parallel_style_name(planned.entry.style),
             " style applies to a Linear layer (weft::LinearLayer) only");
  return *linear;
}

void apply_column(const PlannedModule& planned, const TensorParallelGroup& tp, bool sequence_parallel) {
  LinearLayer& linear = as_linear(planned);
  const Layout layout = Layout::split(0, planned.entry.blocks);
  if (linear.owns_weight()) {
    shard_own_parameter(linear, planned.entry.module, "weight", layout, tp);
    if (linear.bias().defined()) shard_own_parameter(linear, planned.entry.module, "bias", layout, tp);
  }
  linear.wrap_forward([&linear, tp, sequence_parallel](const Tensor& x, const std::function<Tensor(const Tensor&)>&) {
    const Tensor y = sequence_parallel ? all_gather_linear(x, linear.weight(), linear.bias(), tp)
                                       : column_parallel_linear(x, linear.weight(), linear.bias(), tp);
    return linear.gelu() ? gelu(y) : y;
  });
}

void apply_row(const PlannedModule& planned, const TensorParallelGroup& tp, bool sequence_parallel) {
  LinearLayer& linear = as_linear(planned);
  WEFT_CHECK(linear.owns_weight() && !linear.gelu(), "tensor-parallel plan: '", planned.entry.module,
             "' cannot be split row-wise (a row-parallel layer owns its weight and has no activation)");
  shard_own_parameter(linear, planned.entry.module, "weight", Layout::split(1), tp);
  // The bias is added once, after the partial products are summed; on sequence chunks each rank
  // sums its rows only.
  if (sequence_parallel && linear.bias().defined()) linear.mark_partial_gradient("bias");
  linear.wrap_forward([&linear, tp, sequence_parallel](const Tensor& x, const std::function<Tensor(const Tensor&)>&) {
    return sequence_parallel ? linear_reduce_scatter(x, linear.weight(), linear.bias(), tp)
                             : row_parallel_linear(x, linear.weight(), linear.bias(), tp);
  });
}

void apply_vocabulary(const PlannedModule& planned, const TensorParallelGroup& tp) {
  auto* embedding = dynamic_cast<Embedding*>(planned.module);
  WEFT_CHECK(embedding != nullptr, "tensor-parallel plan: '", planned.entry.module, "' is a ",
             planned.module->type_name(), "; the vocabulary style applies to an Embedding only");
  shard_own_parameter(*embedding, planned.entry.module, "weight", Layout::split(0), tp);
  const int64_t vocabulary_start = tp.rank() * (embedding->vocab() / tp.size());
  embedding->wrap_forward([embedding, tp, vocabulary_start](const Tensor& ids, const std::function<Tensor(const Tensor&)>&) {
    const Tensor partial = vocab_parallel_embedding_partial(ids, embedding->weight(), vocabulary_start);  // [..., C]
    return redistribute(partial, Layout::partial(), Layout::replicate(), tp);
  });
}

void apply_sequence(const PlannedModule& planned, const TensorParallelGroup& tp) {
  Module& module = *planned.module;
  // Own parameters only: a child's are its own entry's business (a row-parallel weight is split).
  const std::vector<NamedParameter> all = module.named_parameters();
  for (const NamedParameter& parameter : all) {
    if (parameter.name.find('.') == std::string::npos && parameter.layout.is_replicate()) {
      module.mark_partial_gradient(parameter.name);
    }
  }
  module.set_random_sequence_shard(tp.rank(), tp.size());
}

}  // namespace

std::vector<AppliedPlanEntry> apply_tensor_parallel_plan(LanguageModel& model, const TensorParallelGroup& tp,
                                                         bool sequence_parallel,
                                                         const std::map<std::string, std::string>& overrides) {
  std::vector<PlannedModule> planned;
  collect_declared(model, "", planned);
  std::vector<std::pair<std::string, Module*>> names;
  collect_names(model, "", names);
  for (const auto& [pattern, style_name] : overrides) {
    const ParallelStyle style = parse_parallel_style(style_name);
    bool matched = false;
    for (const auto& [name, module] : names) {
      if (name.empty() || !matches(pattern, name)) continue;
      matched = true;
      bool replaced = false;
      for (PlannedModule& entry : planned) {
        if (entry.entry.module == name) {
          entry.entry.style = style;
          entry.entry.blocks.clear();
          replaced = true;
        }
      }
      if (!replaced) planned.push_back({module, {name, style, {}}});
    }
    WEFT_CHECK(matched, "parallel.tp_plan: '", pattern, "' names no module of the model (module names look like "
               "blocks.0.mlp.fc; '*' matches one part, as in blocks.*.mlp.fc)");
  }
  std::vector<AppliedPlanEntry> applied;
  if (tp.size() == 1) return applied;
  // Parameters are split on the host-side values the model was built with, under no autograd.
  autograd::NoGradGuard no_grad;
  // Splitting styles first, so that a sequence style sees which of its parameters stayed replicated.
  for (const ParallelStyle pass : {ParallelStyle::kVocabulary, ParallelStyle::kColumn, ParallelStyle::kRow,
                                   ParallelStyle::kSequence}) {
    for (const PlannedModule& entry : planned) {
      if (entry.entry.style != pass) continue;
      switch (pass) {
        case ParallelStyle::kColumn: apply_column(entry, tp, sequence_parallel); break;
        case ParallelStyle::kRow: apply_row(entry, tp, sequence_parallel); break;
        case ParallelStyle::kVocabulary: apply_vocabulary(entry, tp); break;
        case ParallelStyle::kSequence:
          if (!sequence_parallel) continue;
          apply_sequence(entry, tp);
          break;
      }
      applied.push_back({entry.entry.module, pass});
    }
  }
  return applied;
}

std::vector<ModelSegment> tensor_parallel_segments(std::vector<ModelSegment> segments, const TensorParallelGroup& tp,
                                                   bool sequence_parallel) {
  if (!sequence_parallel || tp.size() == 1) return segments;
  for (size_t s = 1; s < segments.size(); ++s) {
    const bool given = segments[s - 1].sequence_split_output, taken = segments[s].sequence_split_input;
    if (given == taken) continue;
    const Layout from = given ? Layout::split(1) : Layout::replicate();
    const Layout to = taken ? Layout::split(1) : Layout::replicate();
    segments[s].forward = [inner = segments[s].forward, from, to, tp](const Tensor& x) {
      return inner(redistribute(x, from, to, tp));
    };
  }
  WEFT_CHECK(!segments.front().sequence_split_input && !segments.back().sequence_split_output,
             "sequence parallelism: the model's first segment must take the whole sequence and its last give it");
  return segments;
}

}  // namespace weft
