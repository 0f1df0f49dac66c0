// DataParallel: the gradient exchange and the sharded optimizer of data-parallel training.
//
// Every dp rank holds the whole model and computes gradients on its own rows of the global batch.
// DataParallel turns those per-rank gradients into one update that is identical on every rank:
//
//   zero 0  gradients are packed into flat buckets, in the order backward produces them (the
//           reverse of registration order), averaged with all-reduce, unpacked; every rank then
//           runs the whole optimizer.
//   zero 1  the optimizer state is sharded: the parameters, flattened in registration order and
//           padded to a multiple of dp, are split into dp equal shards; each rank keeps the
//           optimizer state (and f32 master weights) of its shard only. Gradients are all-reduced
//           as for zero 0, each rank updates its shard, and the shards are all-gathered back into
//           every rank's parameters.
//   zero 2  as zero 1, but gradients are reduce-scattered: each rank only ever holds the averaged
//           gradient of its shard, and the full gradients are freed as soon as they are packed.
//
// In every stage the update equals the single-process update on the same global batch, up to the
// order of the f32 reduction. The optimizer built by `make_optimizer` sees "shard parameters":
// f32 views of the rank's shard buffer, one per piece of a model parameter, with that parameter's
// weight decay group; in zero 0 it sees the model parameters themselves.
//
// Collectives run on the CommStream given at construction and are waited for at once (the manual
// comm mode: a hand-written program's behaviour). The buffers are filled on the caller's stream
// without an event, so on CUDA that stream must be the caller's (CommStream()); the constructor
// refuses another CUDA stream. The timings of every collective are kept for the step metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"
#include "optim/optimizer.h"
#include "parallel/comm/process_group.h"

namespace weft {

struct DataParallelOptions {
  int64_t zero_stage = 0;           // 0, 1 or 2
  int64_t bucket_bytes = 25 << 20;  // gradient bucket size (zero 0 and 1)
  double weight_decay = 0.0;        // for the decayed group (2-D and larger parameters)
};

// Timing of the collectives of one step, in clock_ms() (runtime/clock.h).
struct CommunicationRecord {
  std::string description;
  double start_ms = 0;
  double end_ms = 0;
  int64_t bytes = 0;
};

class DataParallel {
 public:
  DataParallel(const Module& model, std::shared_ptr<ProcessGroup> group, CommStream stream,
               const DataParallelOptions& options);

  // The optimizer over what this rank updates (see the header comment); `make(groups)` builds it
  // (make_adamw / make_sgd with the run's options).
  std::unique_ptr<Optimizer> make_optimizer(
      const std::function<std::unique_ptr<Optimizer>(std::vector<ParameterGroup>)>& make);

  // After backward (all micro-batches): averages the gradients across the dp group. zero 0 and 1:
  // every model parameter's .grad holds the average; zero 2: the shard gradients do, and the model
  // parameters' .grad are released.
  void reduce_gradients();
  // The global L2 norm of the averaged gradients (a scalar all-reduce in zero 1 and 2), and, when
  // max_norm > 0 and the norm exceeds it, scales them to max_norm (as clip_grad_norm does).
  double clip_gradients(double max_norm);
  // After optimizer.step(): zero 1 and 2 all-gather the updated shards into every model parameter.
  void finish_step();
  // Drops every gradient (model parameters and shards).
  void zero_grad();
  // Copies the model parameters' current values into this rank's shard (zero 1 and 2), after they
  // were loaded from a checkpoint: the shard holds the f32 weights the optimizer updates.
  void load_shard_from_parameters();

  // The mean over the dp group of a per-rank scalar (the loss), for logging.
  double average(double value);
  // Collectives of the step so far; take_records() hands them over and starts a new list.
  std::vector<CommunicationRecord> take_records();

  // For checkpoints: the optimizer state is per rank in zero 1 and 2. gather_optimizer_state
  // returns, on every rank, the full state in the layout of the unsharded flat parameters
  // ("<state>.flat" tensors of N elements, "master.flat" for the shards' f32 weights, and "step"),
  // and scatter_optimizer_state restores it (the optimizer state and this rank's shard).
  // zero 0 returns the optimizer's own state_dict.
  std::map<std::string, Tensor> gather_optimizer_state(const Optimizer& optimizer);
  void scatter_optimizer_state(Optimizer& optimizer, const std::map<std::string, Tensor>& state);

  int64_t zero_stage() const { return options_.zero_stage; }
  const ProcessGroup& group() const { return *group_; }
  // Elements of this rank's shard (0 in zero 0) and of the padded flat parameters.
  int64_t shard_elements() const { return shard_elements_; }
  int64_t flat_elements() const { return flat_elements_; }

 private:
  struct Piece {             // the part of a model parameter that falls in this rank's shard
    size_t parameter;        // index into parameters_
    int64_t parameter_start; // first element of the parameter in the piece
    int64_t shard_start;     // its offset in the shard buffer
    int64_t count;
  };
  struct Bucket {
    std::vector<size_t> parameters;  // indices into parameters_, in backward order
    int64_t elements = 0;
  };

  void record(const CollectiveHandlePtr& handle);
  void wait(const CollectiveHandlePtr& handle);
  // Copies every parameter's gradient into `flat` [flat_elements_] at its flat offset (zeros for
  // parameters without a gradient and for the padding).
  void pack_gradients(const Tensor& flat);

  std::vector<NamedParameter> parameters_;  // the model's, in registration order
  std::vector<int64_t> flat_offsets_;       // of each parameter in the flat order
  std::shared_ptr<ProcessGroup> group_;
  CommStream stream_;
  DataParallelOptions options_;
  std::vector<Bucket> buckets_;             // zero 0 and 1
  int64_t flat_elements_ = 0;               // padded to a multiple of the dp size
  int64_t shard_elements_ = 0;
  Tensor shard_parameters_;                 // [shard_elements_] f32 (zero 1, 2)
  Tensor shard_gradients_;                  // [shard_elements_] f32 (zero 1, 2)
  std::vector<Piece> pieces_;
  std::vector<NamedParameter> shard_views_; // one f32 view of shard_parameters_ per piece
  std::vector<CommunicationRecord> records_;  // since the last take_records()
};

}  // namespace weft
