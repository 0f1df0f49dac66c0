// Segment costs, the balanced and the user-given partitions, and their log lines (stage_partition.h).
#include "parallel/pipeline/stage_partition.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string_view>

#include "runtime/error.h"

namespace weft {
namespace {

// The parameter of each name, so that a segment's names can be looked up.
std::map<std::string_view, const Tensor*> parameters_by_name(const std::vector<NamedParameter>& parameters) {
  std::map<std::string_view, const Tensor*> by_name;
  for (const NamedParameter& parameter : parameters) by_name.emplace(parameter.name, &parameter.tensor);
  return by_name;
}

const Tensor& find_parameter(const std::map<std::string_view, const Tensor*>& by_name, const ModelSegment& segment,
                             const std::string& name) {
  const auto it = by_name.find(name);
  WEFT_CHECK(it != by_name.end(), "segment '", segment.name, "' reads parameter '", name,
             "', which is not among the model's parameters; the segment list and the parameters must come "
             "from the same model");
  return *it->second;
}

// "1.23M": three significant digits and a K, M, B or T suffix; plain below a thousand.
std::string format_count(int64_t count) {
  if (count < 1000) return std::to_string(count);
  static const char* const units[] = {"K", "M", "B", "T"};
  double value = static_cast<double>(count);
  for (size_t unit = 0; unit < std::size(units); ++unit) {
    value /= 1000.0;
    // Rounded to three digits first, so that 999,999 reads "1.00M", not "1000K".
    const int decimals = value < 9.995 ? 2 : value < 99.95 ? 1 : 0;
    char text[32];
    std::snprintf(text, sizeof(text), "%.*f", decimals, value);
    if (std::atof(text) < 1000.0 || unit + 1 == std::size(units)) return str(text, units[unit]);
  }
  return std::to_string(count);
}

// The block number of a segment named "block N", or nothing.
std::optional<int64_t> block_number(const std::string& name) {
  constexpr std::string_view prefix = "block ";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  int64_t number = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    number = number * 10 + (name[i] - '0');
  }
  return number;
}

// The names of segments [first, end), consecutive blocks as one range: "embedding, block 0-3".
std::string describe_segments(const std::vector<ModelSegment>& segments, int first, int end) {
  std::string text;
  auto append = [&text](const std::string& part) { text += (text.empty() ? "" : ", ") + part; };
  for (int index = first; index < end;) {
    const std::optional<int64_t> start = block_number(segments[index].name);
    if (!start) {
      append(segments[index].name);
      ++index;
      continue;
    }
    int64_t last = *start;
    ++index;
    while (index < end && block_number(segments[index].name) == last + 1) {
      ++last;
      ++index;
    }
    append(last == *start ? str("block ", *start) : str("block ", *start, "-", last));
  }
  return text;
}

}  // namespace

std::vector<double> segment_flops_per_token(const std::vector<ModelSegment>& segments,
                                            const std::vector<NamedParameter>& parameters, int64_t seq_len) {
  const std::map<std::string_view, const Tensor*> by_name = parameters_by_name(parameters);
  std::vector<double> flops;
  for (size_t index = 0; index < segments.size(); ++index) {
    const ModelSegment& segment = segments[index];
    // The first segment of a cut model turns token ids into rows of its tables: no matmul. Its names
    // are still checked, so that a wrong parameter list is caught whichever segment it hits.
    const bool lookup = index == 0 && segments.size() > 1;
    double total = 0;
    std::optional<int64_t> attention_dim;
    for (const std::string& name : segment.parameters) {
      const Tensor& tensor = find_parameter(by_name, segment, name);
      if (lookup || tensor.dim() != 2) continue;
      total += 2.0 * static_cast<double>(tensor.size(0)) * static_cast<double>(tensor.size(1));
      if (!attention_dim && name.find("attention") != std::string::npos) attention_dim = tensor.size(1);
    }
    // Scores q k^T and the weighted sum of values: 2 * T * C each per token, over all heads.
    if (attention_dim) total += 4.0 * static_cast<double>(seq_len) * static_cast<double>(*attention_dim);
    flops.push_back(total);
  }
  return flops;
}

std::vector<int64_t> segment_parameter_counts(const std::vector<ModelSegment>& segments,
                                              const std::vector<NamedParameter>& parameters) {
  const std::map<std::string_view, const Tensor*> by_name = parameters_by_name(parameters);
  std::vector<int64_t> counts;
  for (const ModelSegment& segment : segments) {
    int64_t count = 0;
    for (const std::string& name : segment.parameters) count += find_parameter(by_name, segment, name).numel();
    counts.push_back(count);
  }
  return counts;
}

std::vector<double> segment_balance_costs(const std::vector<double>& flops, const std::vector<int64_t>& parameter_counts) {
  WEFT_CHECK(flops.size() == parameter_counts.size(), "segment_balance_costs: ", flops.size(), " FLOP estimates for ",
             parameter_counts.size(), " parameter counts; give one of each per segment");
  std::vector<double> costs;
  for (size_t i = 0; i < flops.size(); ++i) costs.push_back(flops[i] + static_cast<double>(parameter_counts[i]));
  return costs;
}

int StagePartition::segments(int stage) const {
  WEFT_CHECK(stage >= 0 && stage < stages(), "StagePartition::segments: stage ", stage, " of ", stages());
  return first_segment[stage + 1] - first_segment[stage];
}

int StagePartition::stage_of(int segment) const {
  WEFT_CHECK(stages() > 0 && segment >= 0 && segment < first_segment.back(), "StagePartition::stage_of: segment ",
             segment, " is outside the ", stages() > 0 ? first_segment.back() : 0, " segments of the partition");
  int stage = 0;
  while (first_segment[stage + 1] <= segment) ++stage;
  return stage;
}

StagePartition balanced_partition(const std::vector<double>& costs, int stages) {
  const int count = static_cast<int>(costs.size());
  WEFT_CHECK(stages >= 1 && stages <= count, "cannot split ", count, " model segments into ", stages,
             " pipeline stages: every stage needs at least one segment (the embedding, a block or the head); "
             "use between 1 and ", count, " virtual stages (parallel.pp * parallel.pp_virtual)");
  for (int i = 0; i < count; ++i) {
    WEFT_CHECK(std::isfinite(costs[i]) && costs[i] >= 0, "balanced_partition: segment ", i, " has cost ", costs[i],
               "; costs must be finite and not negative");
  }
  // largest[parts][i]: the smallest possible largest part when segments [i, count) go into `parts`
  // parts. Parts are summed left to right as they grow, so every part's cost is the same double
  // whichever split it belongs to, and the comparisons below are exact.
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> largest(stages + 1, std::vector<double>(count + 1, kInfinity));
  for (int i = count - 1; i >= 0; --i) {
    double sum = 0;
    for (int j = i; j < count; ++j) sum += costs[j];
    largest[1][i] = sum;
  }
  for (int parts = 2; parts <= stages; ++parts) {
    for (int i = count - parts; i >= 0; --i) {
      double sum = 0;
      double best = kInfinity;
      for (int end = i + 1; end <= count - (parts - 1); ++end) {  // first part: [i, end)
        sum += costs[end - 1];
        best = std::min(best, std::max(sum, largest[parts - 1][end]));
      }
      largest[parts][i] = best;
    }
  }
  // Earliest boundaries: each stage ends at the first place from which the rest still fits.
  const double target = largest[stages][0];
  StagePartition partition;
  partition.first_segment.push_back(0);
  int begin = 0;
  for (int stage = 0; stage + 1 < stages; ++stage) {
    const int rest = stages - stage - 1;
    double sum = 0;
    int end = begin + 1;
    for (; end <= count - rest; ++end) {  // the same sums, in the same order, as the table's
      sum += costs[end - 1];
      if (sum <= target && largest[rest][end] <= target) break;
    }
    WEFT_CHECK(end <= count - rest, "balanced_partition: no stage end found for stage ", stage, " (an internal error)");
    partition.first_segment.push_back(end);
    begin = end;
  }
  partition.first_segment.push_back(count);
  return partition;
}

StagePartition partition_from_layers(const std::vector<int64_t>& layers, int blocks, int stages) {
  auto listed = [&layers] {
    std::string text = "[";
    for (size_t i = 0; i < layers.size(); ++i) text += str(i > 0 ? ", " : "", layers[i]);
    return text + "]";
  };
  WEFT_CHECK(static_cast<int64_t>(layers.size()) == stages, "parallel.pp_layers = ", listed(), " has ",
             layers.size(), " entries for ", stages,
             " virtual stages (parallel.pp * parallel.pp_virtual); give one block count per virtual stage, or "
             "leave it empty to balance the stages by cost");
  int64_t sum = 0;
  for (size_t stage = 0; stage < layers.size(); ++stage) {
    WEFT_CHECK(layers[stage] >= 0, "parallel.pp_layers = ", listed(), ": entry ", stage + 1, " is ", layers[stage],
               "; block counts cannot be negative");
    const bool holds_more = stage == 0 || stage + 1 == layers.size();  // the embedding or the head
    WEFT_CHECK(layers[stage] > 0 || holds_more, "parallel.pp_layers = ", listed(), ": entry ", stage + 1,
               " (virtual stage ", stage, ") is 0, and that stage would hold nothing: only the first stage "
               "(with the embedding) and the last (with the head) may have 0 blocks; move a block to it");
    sum += layers[stage];
  }
  WEFT_CHECK(sum == blocks, "parallel.pp_layers = ", listed(), " places ", sum, " blocks, but the model has ", blocks,
             " (model.layers); make the entries add up to model.layers");
  StagePartition partition;
  partition.first_segment.push_back(0);
  int64_t next = 1;  // the embedding is segment 0
  for (int stage = 0; stage + 1 < stages; ++stage) {
    next += layers[stage];
    partition.first_segment.push_back(static_cast<int>(next));
  }
  partition.first_segment.push_back(blocks + 2);
  return partition;
}

StagePartition partition_model(const std::vector<ModelSegment>& segments, const std::vector<NamedParameter>& parameters,
                               int64_t seq_len, const std::vector<int64_t>& pp_layers, int stages) {
  if (!pp_layers.empty()) {
    WEFT_CHECK(segments.size() >= 2, "parallel.pp_layers counts transformer blocks, but this model is one segment "
               "(it does not cut itself into embedding, blocks and head); leave parallel.pp_layers empty");
    return partition_from_layers(pp_layers, static_cast<int>(segments.size()) - 2, stages);
  }
  const std::vector<double> costs = segment_balance_costs(segment_flops_per_token(segments, parameters, seq_len),
                                                          segment_parameter_counts(segments, parameters));
  return balanced_partition(costs, stages);
}

std::vector<std::string> describe_partition(const StagePartition& partition, const std::vector<ModelSegment>& segments,
                                            const std::vector<double>& flops,
                                            const std::vector<int64_t>& parameter_counts, int pp) {
  WEFT_CHECK(partition.stages() >= 1 && partition.first_segment.front() == 0 &&
                 partition.first_segment.back() == static_cast<int>(segments.size()) &&
                 flops.size() == segments.size() && parameter_counts.size() == segments.size(),
             "describe_partition: a partition of ", partition.first_segment.empty() ? 0 : partition.first_segment.back(),
             " segments, ", segments.size(), " segments, ", flops.size(), " FLOP estimates and ",
             parameter_counts.size(), " parameter counts; they must describe the same model");
  double total_flops = 0;
  for (const double value : flops) total_flops += value;
  std::vector<std::string> lines;
  for (int stage = 0; stage < partition.stages(); ++stage) {
    const int first = partition.first_segment[stage];
    const int end = partition.first_segment[stage + 1];
    double stage_flops = 0;
    int64_t stage_parameters = 0;
    for (int index = first; index < end; ++index) {
      stage_flops += flops[index];
      stage_parameters += parameter_counts[index];
    }
    char share[32];
    std::snprintf(share, sizeof(share), "%.1f%%", total_flops > 0 ? 100.0 * stage_flops / total_flops : 0.0);
    const std::string name =
        pp > 0 ? str("stage ", stage, " (rank ", stage_rank(stage, pp), ", chunk ", stage_chunk(stage, pp), ")")
               : str("stage ", stage);
    lines.push_back(str(name, ": ", describe_segments(segments, first, end), " — ", share, " of forward FLOPs, ",
                        format_count(stage_parameters), " parameters"));
  }
  return lines;
}

}  // namespace weft
