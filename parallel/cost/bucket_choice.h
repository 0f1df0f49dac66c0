// Bucket choice: the data-parallel gradient bucket size that the cost model predicts hides the
// most communication under backward (the auto comm mode's default).
//
// Gradients become ready segment by segment during the last micro-batch's backward (the head's
// first). Buckets are filled in that order, each closed once it holds `bucket_bytes` (as
// GradientBuffer does), and each is reduced on the dp stream as soon as its last gradient is ready
// and the previous reduction is done. The exposed time is how long the last reduction ends after
// backward ends. Small buckets start early but pay a latency each; large ones pay few latencies but
// start late. Among the candidates (powers of two from 64 KB to 256 MB, and everything in one
// bucket) the one with the least predicted exposed time wins; a tie (within 1% of the least) goes
// to the larger bucket, which issues fewer collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/model_segment.h"
#include "parallel/cost/cost_model.h"
#include "runtime/named_parameter.h"

namespace weft {

// One segment's share of backward, in the order backward runs them.
struct BackwardSegment {
  double backward_ms = 0.0;   // predicted duration of its backward (one micro-batch)
  int64_t gradient_bytes = 0; // bytes of the gradients it completes
  // The same bytes as the gradient buffer lays them out: one entry per parameter, or per gradient
  // group (NamedParameter::gradient_group: never split over two buckets), in the buffer's order.
  // A bucket then closes only between entries, as GradientBuffer closes it. Empty (the analytic
  // workloads of step_simulator.h): the bytes are one stream that buckets cut anywhere.
  std::vector<int64_t> gradient_units;
};

struct BucketCandidate {
  int64_t bucket_bytes = 0;
  int buckets = 0;
  double exposed_ms = 0.0;    // predicted reduction time after backward ends
  double reduce_ms = 0.0;     // predicted time of all reductions together
};

struct BucketChoice {
  int64_t bucket_bytes = 0;
  std::vector<BucketCandidate> candidates;  // every one considered, smallest first
  // "bucket 4 MB: predicted exposed 0.8 ms, 12 all_reduce(s) of 3.1 ms in all (1 MB: 1.0 ms, 25 MB: 2.6 ms)".
  std::string explanation;
};

// A model's segments in backward order, each with its modelled backward (twice its forward
// FLOPs, stage_partition.h's count, for `tokens` tokens at the model's matmul rate) and the bytes
// of the gradients it completes: those of `trained` (this rank's parameters) that no earlier
// segment reads (a parameter read twice, as a tied embedding, is complete at its first reader),
// with their gradient_units. `all` holds every parameter the segments read.
std::vector<BackwardSegment> backward_segments(const std::vector<ModelSegment>& segments,
                                               const std::vector<NamedParameter>& all,
                                               const std::vector<NamedParameter>& trained, int64_t seq_len,
                                               int64_t tokens, const CostModel& model);

// The index of the candidate choose_bucket_bytes keeps: the largest bucket whose exposed time is
// within 1% of the least exposed time among `candidates` (not empty).
size_t chosen_candidate(const std::vector<BucketCandidate>& candidates);

// The predicted reduction of buckets of `bucket_bytes` over `segments` (backward order), reduced by
// `kind` (all_reduce, or reduce_scatter for ZeRO) over `ranks` ranks on `link`.
BucketCandidate predict_buckets(const std::vector<BackwardSegment>& segments, int64_t bucket_bytes,
                                const CostModel& model, CollectiveKind kind, int ranks, LinkClass link);

// The candidate with the least exposed time (file comment). Throws weft::Error when `segments` is
// empty or ranks < 2.
BucketChoice choose_bucket_bytes(const std::vector<BackwardSegment>& segments, const CostModel& model,
                                 CollectiveKind kind, int ranks, LinkClass link);

}  // namespace weft
