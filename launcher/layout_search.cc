// search_layouts, layout_table and layout_settings (layout_search.h).
#include "launcher/layout_search.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace weft {
namespace {

std::vector<int> divisors(int64_t value, int64_t limit) {
  std::vector<int> out;
  for (int64_t d = 1; d <= std::min(value, limit); ++d) {
    if (value % d == 0) out.push_back(static_cast<int>(d));
  }
  return out;
}

}  // namespace

LayoutSearch search_layouts(const Workload& workload, const CostModel& model, const LayoutSearchOptions& options) {
  LayoutSearch search;
  for (int tp : divisors(options.ranks, options.ranks)) {
    for (int pp : divisors(options.ranks / tp, options.ranks / tp)) {
      const int dp = options.ranks / tp / pp;
      if (workload.batch_size % dp != 0) continue;
      const std::vector<int> zeros = dp > 1 ? std::vector<int>{0, 1, 2} : std::vector<int>{0};
      const std::vector<std::pair<std::string, int>> schedules =
          pp > 1 ? std::vector<std::pair<std::string, int>>{{"1f1b", 1}, {"gpipe", 1}, {"zero_bubble", 1}, {"interleaved", 2}}
                 : std::vector<std::pair<std::string, int>>{{"1f1b", 1}};
      const std::vector<bool> sequence_parallel = tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false};
      for (int micro_batches : divisors(workload.batch_size / dp, options.max_micro_batches)) {
        for (int zero : zeros) {
          for (const auto& [schedule, chunks] : schedules) {
            for (bool sp : sequence_parallel) {
              ParallelLayout layout;
              layout.dp = dp;
              layout.tp = tp;
              layout.pp = pp;
              layout.zero = zero;
              layout.micro_batches = micro_batches;
              layout.schedule = schedule;
              layout.virtual_stages = chunks;
              layout.sequence_parallel = sp;
              layout.comm_mode = options.comm_mode;
              layout.dp_all_reduce = options.dp_all_reduce;
              // Pipelines on GPUs in the auto mode take NCCL's send/recv between stages; the manual
              // mode (and the CPU, where both routes are MPI's) the host route, the default.
              layout.pp_transport = options.on_gpus && options.comm_mode == "auto" ? "direct" : "host";
              if (!layout_problem(workload, layout).empty()) continue;
              if (options.dp_all_reduce == "hierarchical" &&
                  !hierarchical_all_reduce_problem(layout, options.ranks_per_host).empty()) {
                ++search.refused_hierarchical;
                continue;
              }
              LayoutCandidate candidate;
              candidate.layout = layout;
              candidate.prediction = predict_step(workload, layout, model, options.ranks_per_host);
              candidate.fits = options.memory_limit_bytes <= 0 ||
                               candidate.prediction.memory_bytes <= options.memory_limit_bytes;
              ++search.considered;
              if (!candidate.fits) ++search.too_large;
              search.candidates.push_back(candidate);
            }
          }
        }
      }
    }
  }
  std::stable_sort(search.candidates.begin(), search.candidates.end(),
                   [](const LayoutCandidate& a, const LayoutCandidate& b) {
                     if (a.fits != b.fits) return a.fits;
                     // Equal times: the smaller memory leaves more room.
                     if (a.prediction.step_ms != b.prediction.step_ms) return a.prediction.step_ms < b.prediction.step_ms;
                     return a.prediction.memory_bytes < b.prediction.memory_bytes;
                   });
  return search;
}

std::vector<const LayoutCandidate*> shown_layouts(const LayoutSearch& search, int rows) {
  std::vector<const LayoutCandidate*> shown;
  for (const LayoutCandidate& candidate : search.candidates) {
    if (!candidate.fits || static_cast<int>(shown.size()) == rows) break;
    shown.push_back(&candidate);
  }
  return shown;
}

std::string layout_table(const LayoutSearch& search, int rows) {
  std::string out = absl::StrFormat("%4s %4s %4s %4s %5s %6s %-12s %3s %10s %11s %10s %10s %7s\n", "#", "dp", "tp",
                                    "pp", "zero", "micro", "schedule", "sp", "step ms", "tokens/s", "MB/rank",
                                    "exposed", "bubble");
  int shown = 0;
  for (const LayoutCandidate* candidate : shown_layouts(search, rows)) {
    const ParallelLayout& l = candidate->layout;
    const StepPrediction& p = candidate->prediction;
    const std::string schedule =
        l.pp > 1 ? (l.virtual_stages > 1 ? absl::StrFormat("%s x%d", l.schedule, l.virtual_stages) : l.schedule) : "-";
    out += absl::StrFormat("%4d %4d %4d %4d %5d %6d %-12s %3s %10.2f %11.0f %10.1f %10.2f %7s\n", ++shown, l.dp, l.tp,
                           l.pp, l.zero, l.micro_batches, schedule, l.tp > 1 ? (l.sequence_parallel ? "on" : "off") : "-",
                           p.step_ms, p.tokens_per_s, p.memory_bytes / 1048576.0, p.exposed_comm_ms,
                           l.pp > 1 ? absl::StrFormat("%.0f%%", 100.0 * p.bubble) : "-");
  }
  return out;
}

std::vector<std::string> layout_settings(const ParallelLayout& layout) {
  std::vector<std::string> settings = {
      absl::StrFormat("parallel.dp=%d", layout.dp), absl::StrFormat("parallel.tp=%d", layout.tp),
      absl::StrFormat("parallel.pp=%d", layout.pp), absl::StrFormat("parallel.zero=%d", layout.zero),
      absl::StrFormat("train.micro_batches=%d", layout.micro_batches), "comm.mode=" + layout.comm_mode};
  if (layout.pp > 1) {
    settings.push_back("parallel.pp_schedule=" + layout.schedule);
    settings.push_back(absl::StrFormat("parallel.pp_virtual=%d", layout.virtual_stages));
    if (layout.pp_transport == "direct") settings.push_back("parallel.pp_transport=direct");
  }
  if (layout.tp > 1) settings.push_back(layout.sequence_parallel ? "parallel.sp=true" : "parallel.sp=false");
  return settings;
}

}  // namespace weft
