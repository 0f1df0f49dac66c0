// Step simulator: the predicted time and memory of one optimizer step of a layout, from the cost
// model — what weft-plan ranks layouts by, and what weft-train prints next to each measured step.
//
// It runs the step's structure with modelled durations rather than the step graph itself (which
// needs the ranks): per micro-batch the forward and backward of each pipeline stage's segments
// (embedding, blocks, head, from the model's shapes: matmul FLOPs at the matmul rate, attention
// FLOPs at the attention rate, element-wise bytes at the memory bandwidth, each op's fixed cost
// added on the CPU and hidden under the kernels queued before it on a GPU), the tensor-parallel
// collectives of every block, the pipeline schedule (simulate_pipeline over the stages' durations,
// with the p2p transfers over the layout's route: send_recv's fit for parallel.pp_transport direct,
// host_send_recv's for the host route, copies included, none of which holds the sender's compute),
// the data-parallel bucket reductions against the last backward, and the
// optimizer. The comm mode decides what hides: `manual` waits for every collective where it is
// called (tensor-parallel ones inside compute, gradient buckets after backward, receives on
// compute: a transfer counts once, inside the receiving action, not also on the pipeline's edge);
// `auto` overlaps the gradient buckets with backward, pipelines the sequence-parallel
// collective matmuls (all but one chunk of each ring under its matmul) and posts receives ahead.
//
// Memory per rank: weights, gradients and optimizer state (ZeRO shards them over dp), the master
// weights under bf16 (2 bytes a parameter of low halves; ZeRO's f32 shard), and the activations
// kept in flight (Megatron-LM's per-layer estimate, sbh(10 + 24/t) bytes at 16 bits, 34sbh/t with
// sequence parallelism, scaled by the dtype; cuDNN and fused attention keep no T x T scores) times
// the most micro-batches a stage holds at once.
//
// Shared compute: where a host's ranks outnumber its compute slots (CostModel::compute_slots_per_host,
// CPU ranks on fewer cores), the host's compute divided over its slots bounds the step from below,
// and every collective or receive that ranks reach from compute pays the loaded wait of its group
// size (CostModel::loaded_wait_ms): each tensor-parallel collective, each pipeline receive (with
// its transfer, in the receiving action), the loss all-reduces, the data-parallel reduction that ends
// backward and ZeRO's gather after the update; the buckets that follow it back to back do not.
// There auto mode hides nothing either: overlap needs a free slot to progress the communication
// while compute runs, and every slot is computing, so it is exposed as in manual mode.
//
// Link classes come from the placement: ranks are laid out tp innermost, then pp, then dp (the
// Mesh's order), `ranks_per_host` to a host; a group whose ranks span two hosts uses the
// across-hosts fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/model_config.h"
#include "parallel/cost/cost_model.h"

namespace weft {

struct ParallelLayout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero = 0;
  int micro_batches = 1;
  std::string schedule = "1f1b";  // with pp > 1: gpipe | 1f1b | interleaved | zero_bubble
  int virtual_stages = 1;         // parallel.pp_virtual
  std::string pp_transport = "host";  // parallel.pp_transport: host | direct
  bool sequence_parallel = false;
  std::string comm_mode = "auto";
  int64_t bucket_bytes = 0;       // 0: auto chooses by the model, manual takes default_bucket_bytes
  // comm.dp_all_reduce: auto (the auto mode takes two levels where the model predicts them faster;
  // the manual mode keeps flat, as its run does), flat, hierarchical
  std::string dp_all_reduce = "auto";
  int ranks() const { return dp * tp * pp; }
  // "dp 2 x tp 2 x pp 1, zero 0, 4 micro-batches, 1f1b, sp" (", direct" for that pipeline route)
  std::string describe() const;
};

struct Workload {
  ModelConfig model;
  int64_t batch_size = 8;        // sequences per optimizer step (global)
  std::string dtype = "f32";     // compute dtype
  std::string optimizer = "adamw";
};

struct StepPrediction {
  double step_ms = 0.0;
  double compute_ms = 0.0;          // compute stream busy time of the busiest rank
  double comm_ms = 0.0;             // communication time of that rank (all streams)
  double exposed_comm_ms = 0.0;     // communication that nothing hides
  double tp_comm_ms = 0.0;
  double dp_comm_ms = 0.0;
  double pp_comm_ms = 0.0;
  double optimizer_ms = 0.0;
  double bubble = 0.0;              // pipelines: mean idle share of the stages
  double tokens_per_s = 0.0;
  double memory_bytes = 0.0;        // peak per rank (the busiest stage)
  double weights_bytes = 0.0;       // of which weights, gradients, optimizer state
  double activation_bytes = 0.0;    // of which activations in flight
  int64_t bucket_bytes = 0;         // the bucket size it assumed
  bool dp_hierarchical = false;     // the dp all-reduce taken in two levels (across hosts)
};

// Throws weft::Error when the layout cannot run the workload (sizes that do not divide, too few
// micro-batches for the pipeline), naming what does not fit.
StepPrediction predict_step(const Workload& workload, const ParallelLayout& layout, const CostModel& model, int ranks_per_host);

// The reason `layout` cannot run `workload`, or "" when it can.
std::string layout_problem(const Workload& workload, const ParallelLayout& layout);

// Why comm.dp_all_reduce: hierarchical cannot run `layout` with `ranks_per_host` consecutive ranks
// to a host (the run refuses it: parallel/strategy.cc), or "" when it can: it needs zero 0 and a dp
// group spanning hosts with the same two or more of its ranks on each.
std::string hierarchical_all_reduce_problem(const ParallelLayout& layout, int ranks_per_host);

}  // namespace weft
