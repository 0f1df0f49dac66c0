// predict_buckets and choose_bucket_bytes (bucket_choice.h).
#include "parallel/cost/bucket_choice.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"
#include "parallel/pipeline/stage_partition.h"
#include "runtime/error.h"

namespace weft {
namespace {

std::string megabytes(int64_t bytes) {
  const double mb = static_cast<double>(bytes) / (1024.0 * 1024.0);
  return mb >= 1.0 ? absl::StrFormat("%g MB", mb) : absl::StrFormat("%g KB", mb * 1024.0);
}

}  // namespace

std::vector<BackwardSegment> backward_segments(const std::vector<ModelSegment>& segments,
                                               const std::vector<NamedParameter>& all,
                                               const std::vector<NamedParameter>& trained, int64_t seq_len,
                                               int64_t tokens, const CostModel& model) {
  const std::vector<double> flops = segment_flops_per_token(segments, all, seq_len);
  std::map<std::string, const NamedParameter*> trained_by_name;
  for (const NamedParameter& parameter : trained) trained_by_name[parameter.name] = &parameter;
  std::map<std::string, size_t> first_reader;
  for (size_t i = 0; i < segments.size(); ++i) {
    for (const std::string& name : segments[i].parameters) first_reader.emplace(name, i);
  }
  std::vector<BackwardSegment> order;
  for (size_t i = segments.size(); i-- > 0;) {
    BackwardSegment segment;
    segment.backward_ms = model.matmul_ms(2.0 * flops[i] * static_cast<double>(tokens));
    // The buffer places gradients in reverse registration order, which within a segment is the
    // reverse of its parameter list; a gradient group's members stay one unit.
    std::string last_group;
    for (auto name = segments[i].parameters.rbegin(); name != segments[i].parameters.rend(); ++name) {
      const auto found = trained_by_name.find(*name);
      if (found == trained_by_name.end() || first_reader[*name] != i) continue;
      const NamedParameter& parameter = *found->second;
      const int64_t bytes = parameter.tensor.numel() * parameter.tensor.element_size();
      segment.gradient_bytes += bytes;
      if (!parameter.gradient_group.empty() && parameter.gradient_group == last_group) {
        segment.gradient_units.back() += bytes;
      } else {
        segment.gradient_units.push_back(bytes);
      }
      last_group = parameter.gradient_group;
    }
    order.push_back(segment);
  }
  return order;
}

BucketCandidate predict_buckets(const std::vector<BackwardSegment>& segments, int64_t bucket_bytes,
                                const CostModel& model, CollectiveKind kind, int ranks, LinkClass link) {
  BucketCandidate candidate;
  candidate.bucket_bytes = bucket_bytes;
  double now = 0.0;        // backward's clock
  double comm_free = 0.0;  // when the dp stream is next free
  int64_t filled = 0;
  auto reduce = [&](double ready_ms) {
    const double duration = model.collective_ms(kind, static_cast<double>(filled), ranks, link);
    comm_free = std::max(comm_free, ready_ms) + duration;
    candidate.reduce_ms += duration;
    ++candidate.buckets;
    filled = 0;
  };
  for (const BackwardSegment& segment : segments) {
    now += segment.backward_ms;
    if (!segment.gradient_units.empty()) {
      // As GradientBuffer: a bucket closes after the parameter (or group) that fills it.
      for (const int64_t unit : segment.gradient_units) {
        filled += unit;
        if (filled >= bucket_bytes && bucket_bytes > 0) reduce(now);
      }
      continue;
    }
    filled += segment.gradient_bytes;
    // A segment larger than a bucket fills several at once, all ready at its end.
    while (filled >= bucket_bytes && bucket_bytes > 0) {
      const int64_t rest = filled - bucket_bytes;
      filled = bucket_bytes;
      reduce(now);
      filled = rest;
    }
  }
  if (filled > 0) reduce(now);
  candidate.exposed_ms = std::max(0.0, comm_free - now);
  return candidate;
}

size_t chosen_candidate(const std::vector<BucketCandidate>& candidates) {
  WEFT_CHECK(!candidates.empty(), "chosen_candidate: no candidates");
  double least_ms = candidates.front().exposed_ms;
  for (const BucketCandidate& candidate : candidates) least_ms = std::min(least_ms, candidate.exposed_ms);
  // Ties are measured against the least, not against the best so far: a run of candidates each
  // within 1% of the one before would otherwise carry the choice to one several percent worse.
  size_t chosen = candidates.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    const bool tie = candidates[i].exposed_ms <= least_ms * 1.01 + 1e-9;
    if (tie && (chosen == candidates.size() || candidates[i].bucket_bytes > candidates[chosen].bucket_bytes)) chosen = i;
  }
  return chosen;  // the least's own index at worst: it ties with itself
}

BucketChoice choose_bucket_bytes(const std::vector<BackwardSegment>& segments, const CostModel& model,
                                 CollectiveKind kind, int ranks, LinkClass link) {
  WEFT_CHECK(!segments.empty(), "choose_bucket_bytes: no segments");
  WEFT_CHECK(ranks >= 2, "choose_bucket_bytes: ", ranks, " rank(s) reduce nothing");
  int64_t total = 0;
  for (const BackwardSegment& segment : segments) total += segment.gradient_bytes;
  std::vector<int64_t> sizes;
  for (int64_t size = int64_t{64} << 10; size <= (int64_t{256} << 20); size *= 2) {
    if (size < total) sizes.push_back(size);
  }
  sizes.push_back(std::max<int64_t>(total, 1));  // one bucket for everything
  BucketChoice choice;
  for (int64_t size : sizes) choice.candidates.push_back(predict_buckets(segments, size, model, kind, ranks, link));
  const BucketCandidate* best = &choice.candidates[chosen_candidate(choice.candidates)];
  choice.bucket_bytes = best->bucket_bytes;
  std::string others;
  for (const BucketCandidate& candidate : choice.candidates) {
    if (&candidate == best) continue;
    // The neighbours of the choice and the extremes say enough.
    const size_t index = &candidate - choice.candidates.data();
    const size_t chosen = best - choice.candidates.data();
    if (index + 1 == chosen || index == chosen + 1 || index == 0 || index + 1 == choice.candidates.size()) {
      others += absl::StrFormat("%s%s: %.2f ms", others.empty() ? "" : ", ", megabytes(candidate.bucket_bytes),
                                candidate.exposed_ms);
    }
  }
  choice.explanation = absl::StrFormat(
      "bucket %s: predicted exposed %.2f ms after backward, %d %s(s) of %.2f ms in all over %d ranks (%s)%s",
      megabytes(best->bucket_bytes), best->exposed_ms, best->buckets, collective_kind_name(kind), best->reduce_ms, ranks,
      link_class_name(link), others.empty() ? "" : " (" + others + ")");
  return choice;
}

}  // namespace weft
