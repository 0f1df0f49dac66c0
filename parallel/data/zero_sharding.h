// ZeroSharding: the optimizer state of data parallelism split across the dp ranks (ZeRO 1 and 2).
//
// Each gradient bucket (gradient_buffer.h) of P padded elements is split into dp equal chunks of
// P / dp; dp rank r owns chunk r of every bucket. The rank's shard is its chunks laid end to end:
//
//   shard_parameters [shard_elements] f32   the f32 weights the optimizer updates (master weights)
//   shard_gradients  [shard_elements]       the averaged gradients of the shard, in the model's
//                                           dtype: zero 1 copies them out of the all-reduced
//                                           buckets, zero 2 receives them from a reduce-scatter
//
// The optimizer (make_optimizer) sees one f32 "shard parameter" per piece of a model parameter
// that falls in the shard (named "<parameter>[a:b]", in the parameter's weight-decay group), whose
// .grad is a view of shard_gradients. After its update every rank all-gathers bucket by bucket
// (gather_bucket) and writes the gathered f32 weights into its model parameters, rounded to their
// dtype. Per-bucket chunks are what lets the auto comm mode reduce-scatter a bucket as soon as
// backward has produced it and gather a bucket's parameters just before the forward that reads
// them.
//
// Checkpoints keep the optimizer state in the unsharded layout (gather_optimizer_state), so they do
// not depend on how buckets or ranks split it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "parallel/comm/process_group.h"
#include "parallel/data/gradient_buffer.h"
#include "parallel/tensor/tensor_parallel_group.h"

namespace weft {

class PipelineStage;

class ZeroSharding {
 public:
  // `stage` 1 or 2; `buffer` outlives this object; `group` is the dp group.
  ZeroSharding(int64_t stage, const GradientBuffer& buffer, std::shared_ptr<ProcessGroup> group);

  int64_t stage() const { return stage_; }
  int64_t shard_elements() const { return shard_elements_; }

  // The optimizer over the shard parameters; `make(groups)` builds it (adamw or sgd).
  std::unique_ptr<Optimizer> make_optimizer(
      const std::function<std::unique_ptr<Optimizer>(std::vector<ParameterGroup>)>& make, double weight_decay);

  // Averages bucket `bucket`'s gradients into this rank's shard_gradients: reduce-scatter (zero 2)
  // or all-reduce and copy of the rank's chunk (zero 1), on `stream`. The copy is queued after the
  // collective on the same stream, so the returned handle's completion covers both on CPU caller
  // streams and stream order covers them on CUDA.
  CollectiveHandlePtr reduce_bucket(size_t bucket, const CommStream& stream);
  // All-gathers bucket `bucket`'s updated f32 weights from every rank into the model parameters.
  CollectiveHandlePtr gather_bucket(size_t bucket, const CommStream& stream);

  // Clips the averaged gradients to a global L2 norm of max_norm (when max_norm > 0 and the norm
  // exceeds it) as clip_grad_norm does, on the device: the shards' squared norm, summed over the
  // ranks by a scalar all-reduce on `stream` (ordered, not waited for by the host), decides.
  // Returns that sum of squares ([1], on the device; the norm is its square root).
  Tensor clip_gradients(double max_norm, const CommStream& stream);
  // Tensor parallelism: the parameters are shards over `tp`; clip_gradients then sums split
  // parameters' squares over tp and counts replicated ones once.
  void set_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp);
  // A pipeline stage: the gradient norm is summed over the stages, and a parameter whose `counted`
  // entry (per buffer parameter) is 0 — a shared parameter's second copy — does not count.
  void set_pipeline(std::shared_ptr<PipelineStage> pipeline, const std::vector<double>& counted);
  // Copies the model parameters' values into the shard (after loading them from a checkpoint).
  void load_shard_from_parameters();

  // Checkpoints: the full state, on every rank, as "<kind>.flat" tensors over the parameters
  // flattened in registration order (padded to a multiple of dp), "master.flat", "parameter.step"
  // and "step"; scatter_optimizer_state restores it into the optimizer and this rank's shard.
  std::map<std::string, Tensor> gather_optimizer_state(const Optimizer& optimizer, const CommStream& stream);
  void scatter_optimizer_state(Optimizer& optimizer, const std::map<std::string, Tensor>& state);
  // The same state in the parameters' own layout, as an optimizer without ZeRO keeps it:
  // "<parameter>.<kind>" of each parameter's shape, "<parameter>.step" and "step" — independent of
  // dp, buckets and padding, so a checkpoint resumes at any dp and ZeRO stage. Collective.
  std::map<std::string, Tensor> gather_parameter_state(const Optimizer& optimizer, const CommStream& stream);
  // Restores gather_parameter_state's output (of any dp); a missing "<parameter>.master" keeps
  // the master weights load_shard_from_parameters took from the parameters.
  void scatter_parameter_state(Optimizer& optimizer, const std::map<std::string, Tensor>& state);

 private:
  struct Piece {               // the part of a model parameter in this rank's shard
    size_t parameter;          // index into the buffer's parameters
    int64_t parameter_start;   // first element of the parameter in the piece
    int64_t shard_start;       // its offset in the shard
    int64_t count;
  };

  // The chunk of bucket b this rank owns: [chunk_begin(b), chunk_begin(b) + chunk_elements(b)) of
  // the bucket, at shard_offsets_[b] in the shard.
  int64_t chunk_elements(size_t bucket) const;
  int64_t chunk_begin(size_t bucket) const { return group_->rank() * chunk_elements(bucket); }
  // The registration-order flat layout of checkpoints.
  int64_t flat_elements() const;

  int64_t stage_;
  const GradientBuffer& buffer_;
  std::shared_ptr<ProcessGroup> group_;
  std::vector<int64_t> shard_offsets_;      // per bucket
  std::vector<int64_t> flat_offsets_;       // per parameter, registration order
  int64_t shard_elements_ = 0;
  Tensor shard_parameters_;                 // [shard_elements_] f32
  Tensor shard_gradients_;                  // [shard_elements_] the buffer's dtype
  std::vector<Tensor> gathered_;            // per bucket [padded_elements] f32, the all-gather's output
  std::vector<Piece> pieces_;
  std::vector<std::vector<size_t>> pieces_of_bucket_;
  std::vector<NamedParameter> shard_views_; // one f32 view of shard_parameters_ per piece
  void make_piece_views();
  // [pieces]: value(the piece's parameter) per piece, on the device.
  Tensor piece_mask(const std::function<double(size_t parameter)>& value) const;

  std::shared_ptr<TensorParallelGroup> tp_;  // null: no tensor parallelism
  std::vector<Tensor> piece_gradients_;      // tp: per piece, its view of shard_gradients_
  Tensor piece_split_;                       // tp: [pieces] 1 where the piece's parameter is split
  std::shared_ptr<PipelineStage> pipeline_;  // null: no pipeline
  Tensor piece_counted_;                     // pipeline: [pieces] 0 where the norm leaves the piece out
};

}  // namespace weft
