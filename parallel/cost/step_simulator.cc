// predict_step and layout_problem (step_simulator.h).
#include "parallel/cost/step_simulator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "layers/mlp.h"
#include "parallel/cost/bucket_choice.h"
#include "parallel/cost/collective_matmul_choice.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/pipeline/stage_partition.h"
#include "parallel/strategy.h"
#include "runtime/error.h"

namespace weft {
namespace {

// The sizes of a GPT or Llama model that its cost follows.
struct ModelShape {
  int64_t layers, dim, heads, kv_heads, head_dim, hidden, vocab, seq_len;
  bool swiglu, tied, learned_positions;
  double block_matmul_parameters;  // weights a block's matmuls read
  double block_parameters;         // all of a block's parameters
  double embedding_parameters;     // token table (+ positions)
  double head_parameters;          // its own weight (0 when tied) + final norm
};

ModelShape shape_of(const ModelConfig& config) {
  ModelShape s{};
  s.layers = config.layers;
  s.dim = config.dim;
  s.heads = config.heads;
  s.kv_heads = config.kv_heads > 0 ? config.kv_heads : config.heads;
  s.head_dim = config.dim / std::max<int64_t>(config.heads, 1);
  s.swiglu = config.mlp == "swiglu_mlp" || config.type == "llama";
  s.hidden = mlp_hidden_width(config);
  s.vocab = config.vocab;
  s.seq_len = config.seq_len;
  s.tied = config.tie_embeddings;
  s.learned_positions = config.positions == "learned";
  const double c = static_cast<double>(s.dim);
  const double qkv = c * (c + 2.0 * static_cast<double>(s.kv_heads * s.head_dim));
  const double mlp = (s.swiglu ? 3.0 : 2.0) * c * static_cast<double>(s.hidden);
  s.block_matmul_parameters = qkv + c * c + mlp;
  s.block_parameters = s.block_matmul_parameters + 4.0 * c;  // two norms (weight and bias)
  s.embedding_parameters = static_cast<double>(s.vocab) * c + (s.learned_positions ? static_cast<double>(s.seq_len) * c : 0.0);
  s.head_parameters = (s.tied ? 0.0 : static_cast<double>(s.vocab) * c) + 2.0 * c;
  return s;
}

// Ops per micro-batch (forward; backward counts twice a block's): each pays the op overhead, so
// many small micro-batches or thin shards cost more than their FLOPs say. A block: two norms, the
// q/k/v matmul and its split, attention, the projection, two residual adds, two dropouts, the MLP's
// two or three matmuls and its activation, and the reshapes between them.
constexpr double kBlockOps = 20.0;
constexpr double kEmbeddingOps = 4.0;
constexpr double kHeadOps = 6.0;

double dtype_bytes(const std::string& dtype) { return dtype == "bf16" ? 2.0 : 4.0; }

LinkClass link_of_axis(int size, int stride, int ranks_per_host) {
  if (size <= 1 || ranks_per_host <= 0) return LinkClass::kSameHost;
  // Ranks r0, r0 + stride, ..., from a host boundary: within a host when the span fits in one.
  return static_cast<int64_t>(size - 1) * stride + 1 > ranks_per_host ? LinkClass::kAcrossHosts : LinkClass::kSameHost;
}

// The dp ranks on one host: those of its tp x pp blocks (at least one).
int dp_ranks_per_host(const ParallelLayout& layout, int ranks_per_host) {
  return std::max(1, ranks_per_host / (layout.tp * layout.pp));
}

// One segment's modelled work per micro-batch on one rank: what its compute stream is busy with
// (including collectives it waits for there) and what it communicates.
struct SegmentWork {
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double tp_comm_ms = 0.0;      // all of its tensor-parallel communication
  double tp_exposed_ms = 0.0;   // the part of it on the compute stream's critical path
  double parameters = 0.0;      // this rank's parameters of the segment
};

}  // namespace

std::string ParallelLayout::describe() const {
  std::string text = absl::StrFormat("dp %d x tp %d x pp %d, zero %d, %d micro-batch%s", dp, tp, pp, zero,
                                     micro_batches, micro_batches == 1 ? "" : "es");
  if (pp > 1) text += ", " + schedule + (virtual_stages > 1 ? absl::StrFormat(" (%d chunks)", virtual_stages) : "");
  if (pp > 1 && pp_transport == "direct") text += ", direct";
  if (sequence_parallel) text += ", sp";
  return text;
}

std::string layout_problem(const Workload& workload, const ParallelLayout& layout) {
  const ModelShape s = shape_of(workload.model);
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) return "dp, tp and pp must be at least 1";
  if (workload.batch_size % layout.dp != 0) {
    return absl::StrFormat("train.batch_size %d does not split over dp %d", workload.batch_size, layout.dp);
  }
  if (layout.micro_batches < 1 || (workload.batch_size / layout.dp) % layout.micro_batches != 0) {
    return absl::StrFormat("%d sequences per dp rank do not split into %d micro-batches",
                           workload.batch_size / layout.dp, layout.micro_batches);
  }
  if (layout.sequence_parallel && layout.tp == 1) return "sequence parallelism needs tp > 1";
  for (const auto& [name, size] : tensor_parallel_splits(workload.model, layout.sequence_parallel)) {
    if (size % layout.tp != 0) return absl::StrFormat("tp %d does not divide %s = %d", layout.tp, name, size);
  }
  if (layout.zero > 0 && layout.dp == 1) return "ZeRO shards over dp: it needs dp > 1";
  if (layout.pp_transport != "host" && layout.pp_transport != "direct") {
    return "parallel.pp_transport '" + layout.pp_transport + "' is not host or direct";
  }
  if (layout.pp > 1) {
    if (s.layers + 2 < static_cast<int64_t>(layout.pp) * layout.virtual_stages) {
      return absl::StrFormat("%d segments cannot fill %d pipeline stages", s.layers + 2, layout.pp * layout.virtual_stages);
    }
    try {
      check_pipeline_shape(parse_pipeline_schedule(layout.schedule),
                           {layout.pp, layout.micro_batches, layout.virtual_stages});
    } catch (const Error& error) {
      return error.what();
    }
  } else if (layout.virtual_stages != 1) {
    return "pp_virtual needs a pipeline";
  }
  return "";
}

std::string hierarchical_all_reduce_problem(const ParallelLayout& layout, int ranks_per_host) {
  if (layout.zero > 0) return absl::StrFormat("parallel.zero %d reduce-scatters the gradients", layout.zero);
  if (layout.dp < 2) return "parallel.dp is 1";
  if (link_of_axis(layout.dp, layout.tp * layout.pp, ranks_per_host) != LinkClass::kAcrossHosts) {
    return "the dp group is on one host";
  }
  const int dp_per_host = dp_ranks_per_host(layout, ranks_per_host);
  if (dp_per_host < 2) return "one dp rank per host";
  if (layout.dp % dp_per_host != 0) {
    return absl::StrFormat("dp %d does not split into hosts of %d dp ranks", layout.dp, dp_per_host);
  }
  return "";
}

StepPrediction predict_step(const Workload& workload, const ParallelLayout& layout, const CostModel& model, int ranks_per_host) {
  const std::string problem = layout_problem(workload, layout);
  WEFT_CHECK(problem.empty(), "layout ", layout.describe(), ": ", problem);
  const ModelShape s = shape_of(workload.model);
  const bool manual = layout.comm_mode == "manual";
  // A host whose ranks outnumber its compute slots (step_simulator.h, "Shared compute"): each
  // collective and receive reached from compute pays the loaded wait of its group size.
  const int host_ranks = std::min(std::max(ranks_per_host, 1), layout.ranks());
  const bool oversubscribed = model.compute_slots_per_host > 0 && host_ranks > model.compute_slots_per_host;
  auto loaded_wait = [&](int ranks) { return oversubscribed ? model.loaded_wait_ms(ranks) : 0.0; };
  // What auto mode hides behind compute needs a slot to progress it; with every slot computing
  // there is none, so there it is exposed as in manual mode.
  const bool hides = !manual && !oversubscribed;
  const double e = dtype_bytes(workload.dtype);
  const double tp = layout.tp;
  const double c = static_cast<double>(s.dim);
  const double tokens = static_cast<double>(workload.batch_size / layout.dp / layout.micro_batches * s.seq_len);
  const double activation_bytes = tokens * c * e;  // one [b, T, C] activation of a micro-batch
  const LinkClass tp_link = link_of_axis(layout.tp, 1, ranks_per_host);
  const LinkClass pp_link = link_of_axis(layout.pp, layout.tp, ranks_per_host);
  const LinkClass dp_link = link_of_axis(layout.dp, layout.tp * layout.pp, ranks_per_host);
  auto tp_collective = [&](CollectiveKind kind, double bytes) { return model.collective_ms(kind, bytes, layout.tp, tp_link); };
  // The ops' fixed costs: on the CPU each op runs when it is called, so they add up; a GPU queues
  // kernels ahead, so launches hide under the kernels before them unless those are shorter.
  const bool queued = model.device != "cpu";
  auto with_overhead = [&](double work_ms, double ops) {
    return queued ? std::max(work_ms, model.ops_ms(ops)) : work_ms + model.ops_ms(ops);
  };

  // --- Segments: embedding, blocks, head ---
  std::vector<SegmentWork> segments;
  {
    SegmentWork embedding;
    embedding.parameters = s.embedding_parameters / tp;
    embedding.forward_ms = with_overhead(model.memory_ms(3.0 * tokens * c * e), kEmbeddingOps);
    embedding.backward_ms = with_overhead(model.memory_ms(3.0 * tokens * c * e), kEmbeddingOps);
    if (layout.tp > 1) {
      // The partial lookups summed over tp (with sp, then cut along the sequence: a reduce-scatter).
      embedding.tp_comm_ms = tp_collective(layout.sequence_parallel ? CollectiveKind::kReduceScatter
                                                                     : CollectiveKind::kAllReduce, activation_bytes) +
                             loaded_wait(layout.tp);
      embedding.tp_exposed_ms = embedding.tp_comm_ms;
    }
    segments.push_back(embedding);
  }
  for (int64_t layer = 0; layer < s.layers; ++layer) {
    SegmentWork block;
    block.parameters = s.block_matmul_parameters / tp + 4.0 * c;
    const double matmul_forward = model.matmul_ms(2.0 * tokens * s.block_matmul_parameters / tp);
    const double attention_forward = model.attention_ms(4.0 * tokens * static_cast<double>(s.seq_len) * c / tp);
    // Norms, residual adds, dropout (on [b, T, C], cut by sp) and the activation (on [b, T, hidden/tp]).
    const double replicated = layout.sequence_parallel ? c / tp : c;
    // Passes over [b, T, C] (two norms, two residual adds, the attention's reshapes) and over the
    // MLP's [b, T, hidden] (its activation), each a read and a write.
    const double elementwise =
        model.memory_ms(e * tokens * (12.0 * replicated + (s.swiglu ? 3.0 : 2.0) * s.hidden / tp + 6.0 * c / tp));
    block.forward_ms = with_overhead(matmul_forward + attention_forward + elementwise, kBlockOps);
    block.backward_ms = with_overhead(2.0 * matmul_forward + 2.0 * attention_forward + 2.0 * elementwise, 2 * kBlockOps);
    if (layout.tp > 1) {
      // Each direction: the attention and MLP entries and exits (two all-reduces, or with sp two
      // all-gathers and two reduce-scatters of the same activation).
      const double direction = layout.sequence_parallel
                                   ? 2.0 * (tp_collective(CollectiveKind::kAllGather, activation_bytes) +
                                            tp_collective(CollectiveKind::kReduceScatter, activation_bytes))
                                   : 2.0 * tp_collective(CollectiveKind::kAllReduce, activation_bytes);
      block.tp_comm_ms = 2.0 * direction;
      // Every one of them follows compute (a linear or attention): two all-reduces each way, or two
      // all-gathers and two reduce-scatters; the waits are idle time wherever the collective runs.
      const double waits = (layout.sequence_parallel ? 8.0 : 4.0) * loaded_wait(layout.tp);
      if (!hides) {
        block.tp_exposed_ms = block.tp_comm_ms;
      } else if (layout.sequence_parallel) {
        // Four collective matmuls each way (q/k/v and MLP entries, projection and MLP exits), each
        // a ring or one collective as the auto mode chooses (collective_matmul_choice.h); what
        // runs beyond its matmul is exposed. Backward's matmuls are twice as long.
        const double linear_flops = 2.0 * tokens * s.block_matmul_parameters / tp / 4.0;
        for (double factor : {1.0, 2.0}) {
          const CollectiveMatmulChoice choice =
              choose_collective_matmul_chunks(activation_bytes, factor * linear_flops, layout.tp, tp_link, model);
          block.tp_exposed_ms +=
              4.0 * std::max(0.0, std::min(choice.ring_ms, choice.single_ms) - model.matmul_ms(factor * linear_flops));
        }
      } else {
        // Forward all-reduces wait; backward's input-gradient all-reduces run under the weight
        // gradients' matmuls (half of backward's matmul work).
        block.tp_exposed_ms = direction + std::max(0.0, direction - matmul_forward);
      }
      block.tp_comm_ms += waits;
      block.tp_exposed_ms += waits;
    }
    segments.push_back(block);
  }
  {
    SegmentWork head;
    head.parameters = s.head_parameters / tp;
    const double matmul_forward = model.matmul_ms(2.0 * tokens * static_cast<double>(s.vocab) * c / tp);
    const double loss = model.memory_ms(8.0 * tokens * static_cast<double>(s.vocab) / tp * e);
    head.forward_ms = with_overhead(matmul_forward + loss, kHeadOps);
    head.backward_ms = with_overhead(2.0 * matmul_forward + loss, kHeadOps);
    if (layout.tp > 1) {
      // Vocabulary-parallel loss: three small all-reduces; backward: the input gradient's.
      head.tp_comm_ms = 3.0 * tp_collective(CollectiveKind::kAllReduce, tokens * 4.0) +
                        tp_collective(CollectiveKind::kAllReduce, activation_bytes) + 4.0 * loaded_wait(layout.tp);
      head.tp_exposed_ms = head.tp_comm_ms;
    }
    segments.push_back(head);
  }
  // A tied head reads the embedding's table: the last stage holds a copy when they are apart.
  if (s.tied && layout.pp > 1) segments.back().parameters += s.embedding_parameters / tp;

  // --- Stages ---
  const int stages = layout.pp * layout.virtual_stages;
  std::vector<double> costs;
  for (const SegmentWork& segment : segments) costs.push_back(segment.forward_ms + segment.backward_ms + segment.tp_exposed_ms);
  const StagePartition partition = balanced_partition(costs, stages);
  struct StageWork {
    double forward = 0, backward = 0, tp_comm = 0, tp_exposed = 0, parameters = 0;
    int blocks = 0;
    std::vector<BackwardSegment> backward_order;
  };
  std::vector<StageWork> stage_work(static_cast<size_t>(layout.pp));
  for (int stage = 0; stage < stages; ++stage) {
    StageWork& work = stage_work[static_cast<size_t>(stage_rank(stage, layout.pp))];
    for (int i = partition.first_segment[stage]; i < partition.first_segment[stage + 1]; ++i) {
      const SegmentWork& segment = segments[static_cast<size_t>(i)];
      // tp exposure splits between forward and backward as the communication does (half each).
      work.forward += segment.forward_ms + segment.tp_exposed_ms / 2.0;
      work.backward += segment.backward_ms + segment.tp_exposed_ms / 2.0;
      work.tp_comm += segment.tp_comm_ms;
      work.tp_exposed += segment.tp_exposed_ms;
      work.parameters += segment.parameters;
      if (i > 0 && i <= s.layers) ++work.blocks;
    }
    // Backward runs the rank's segments last to first.
    for (int i = partition.first_segment[stage + 1] - 1; i >= partition.first_segment[stage]; --i) {
      const SegmentWork& segment = segments[static_cast<size_t>(i)];
      work.backward_order.push_back({segment.backward_ms + segment.tp_exposed_ms / 2.0,
                                     static_cast<int64_t>(segment.parameters * e), {}});  // bytes cut anywhere
    }
  }
  // Chunks of one rank run one after the other in the schedule, each a (1 / chunks) share.
  const StageWork* busiest = &stage_work[0];
  for (const StageWork& work : stage_work) {
    if (work.forward + work.backward > busiest->forward + busiest->backward) busiest = &work;
  }
  double heaviest_parameters = 0.0;
  for (const StageWork& work : stage_work) heaviest_parameters = std::max(heaviest_parameters, work.parameters);

  StepPrediction prediction;
  const double m = layout.micro_batches;
  double pipeline_ms = 0.0;
  double pp_comm = 0.0;
  double pp_exposed = 0.0;
  int peak_in_flight = 1;
  double pp_rank_exposed = 0.0;  // the busiest rank's own receive time that nothing hides
  if (layout.pp > 1) {
    // A receive reached from compute waits for its sender as a collective of two does; posted
    // ahead (auto) it still waits for the data, so the wait is on the transfer's edge either way.
    const double wait = loaded_wait(2);
    const bool host_route = layout.pp_transport == "host";
    const CollectiveKind route = host_route ? CollectiveKind::kHostSendRecv : CollectiveKind::kSendRecv;
    // The host route's copies are in its fit, end to end; none holds the sender's compute (its copy
    // to host memory runs on a copy stream: parallel/pipeline/pipeline_transport.h).
    const double transfer = model.collective_ms(route, activation_bytes, 2, pp_link) + wait;
    const double chunks = layout.virtual_stages;
    PipelineDurations durations;
    durations.forward = busiest->forward / chunks + (hides ? 0.0 : transfer);
    const double backward = busiest->backward / chunks + (hides ? 0.0 : transfer);
    // The weight-gradient half of backward (every linear's dW; zero bubble runs it apart).
    durations.backward_input = backward / 2.0;
    durations.backward_weight = backward / 2.0;
    // Where the transfer hides it is the edge's latency: the receive is posted ahead and the data
    // moves while both sides compute. Where it does not (the manual mode posts each receive on the
    // compute stream right where its data is needed; the auto mode on a host with no slot free to
    // progress it), MPI moves the message once the receive is posted, so the transfer is inside
    // the receiving action's duration (above) and the edge adds nothing; the send itself never
    // waits (pipeline_step_builder.h). Counting it on the edge too paid each transfer twice.
    durations.transfer = hides ? transfer : 0.0;
    const PipelineSchedule schedule = parse_pipeline_schedule(layout.schedule);
    const PipelineShape shape{layout.pp, layout.micro_batches, layout.virtual_stages};
    const PipelineSimulation simulation = simulate_pipeline(pipeline_actions(schedule, shape), shape, durations);
    pipeline_ms = simulation.makespan;
    prediction.bubble = simulation.bubble;
    peak_in_flight = *std::max_element(simulation.peak_in_flight.begin(), simulation.peak_in_flight.end());
    // Each micro-batch and chunk crosses each boundary forward and back.
    pp_comm = 2.0 * m * chunks * transfer;
    pp_exposed = hides ? 0.0 : pp_comm;
    // Receives per micro-batch of the busiest rank: a forward and a backward one per chunk, less
    // the first chunk's forward and the last chunk's backward, which two stages split between them.
    const double receives = m * (2.0 * chunks - (layout.pp == 2 ? 1.0 : 0.0));
    pp_rank_exposed = receives * (hides ? wait : transfer);
  } else {
    pipeline_ms = m * (busiest->forward + busiest->backward);
  }

  // --- Data parallelism: the gradient buckets against the last backward ---
  double dp_comm = 0.0;
  double dp_exposed = 0.0;
  const double gradient_bytes = busiest->parameters * e;
  if (layout.dp > 1) {
    const CollectiveKind kind = layout.zero > 0 ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
    int64_t bucket = layout.bucket_bytes;
    if (bucket == 0) {
      bucket = manual ? (model.device == "cpu" ? (int64_t{1} << 20) : (int64_t{25} << 20))
                      : choose_bucket_bytes(busiest->backward_order, model, kind, layout.dp, dp_link).bucket_bytes;
    }
    prediction.bucket_bytes = bucket;
    BucketCandidate buckets = predict_buckets(busiest->backward_order, bucket, model, kind, layout.dp, dp_link);
    // Two levels when the dp group spans hosts with several of its ranks on each, if the model says so.
    const int dp_per_host = dp_ranks_per_host(layout, ranks_per_host);
    if (layout.dp_all_reduce != "flat" && hierarchical_all_reduce_problem(layout, ranks_per_host).empty()) {
      const double flat = model.collective_ms(kind, gradient_bytes, layout.dp, dp_link);
      const double two_level = model.hierarchical_all_reduce_ms(gradient_bytes, dp_per_host, layout.dp / dp_per_host);
      // As the run decides (parallel/strategy.cc): forced by comm.dp_all_reduce, or chosen by the
      // model in the auto mode only (hand-written code fixes its path in advance).
      if (layout.dp_all_reduce == "hierarchical" || (!manual && two_level < flat)) {
        prediction.dp_hierarchical = true;
        buckets.reduce_ms *= two_level / flat;
        buckets.exposed_ms *= two_level / flat;
      }
    }
    dp_comm = buckets.reduce_ms;
    dp_exposed = hides ? buckets.exposed_ms : buckets.reduce_ms;
    // The bucket that ends backward waits for the slowest peer's backward (the others follow it
    // with no compute between, at the fit's pace).
    dp_comm += loaded_wait(layout.dp);
    dp_exposed += loaded_wait(layout.dp);
    if (layout.zero > 0) {
      // The updated shards gathered back: after the update (manual), or under the next step's first
      // forward (auto), where the first bucket's gather waits.
      const double gather = model.collective_ms(CollectiveKind::kAllGather, gradient_bytes, layout.dp, dp_link);
      dp_comm += gather + loaded_wait(layout.dp);
      dp_exposed += (hides ? gather / std::max(buckets.buckets, 1) : gather) + loaded_wait(layout.dp);
    }
  }
  // The loss averaged over dp (and summed over stages): one small all-reduce each.
  const double loss_comm = model.collective_ms(CollectiveKind::kAllReduce, 8.0, layout.dp, dp_link) +
                           model.collective_ms(CollectiveKind::kAllReduce, 8.0, layout.pp, pp_link) +
                           loaded_wait(layout.dp) + loaded_wait(layout.pp);

  // --- Optimizer: AdamW reads p, g, m, v and writes p, m, v in f32 (SGD: p, g, momentum) ---
  const double optimizer_bytes_per_parameter = (workload.optimizer == "adamw" ? 28.0 : 20.0) + (e < 4.0 ? 8.0 : 0.0);
  const double updated = busiest->parameters / (layout.zero > 0 ? layout.dp : 1);
  prediction.optimizer_ms = model.memory_ms(updated * optimizer_bytes_per_parameter);

  prediction.tp_comm_ms = m * busiest->tp_comm;
  prediction.dp_comm_ms = dp_comm;
  prediction.pp_comm_ms = pp_comm;
  prediction.compute_ms = m * (busiest->forward + busiest->backward - busiest->tp_exposed) + prediction.optimizer_ms;
  prediction.comm_ms = prediction.tp_comm_ms + dp_comm + pp_comm + loss_comm;
  prediction.exposed_comm_ms = m * busiest->tp_exposed + dp_exposed + pp_exposed + loss_comm;
  prediction.step_ms = pipeline_ms + dp_exposed + loss_comm + prediction.optimizer_ms;
  // Ranks that share fewer compute units than they are (CPU ranks on few cores) cannot all compute
  // at full speed at once: the host's compute, spread over its slots, bounds the step from below.
  // A pipeline's idle stages leave their share to the busy ones, so its bubble costs less there;
  // its receives do not (the rank waits in them).
  if (oversubscribed) {
    double stage_compute = 0.0;
    for (const StageWork& work : stage_work) stage_compute += work.forward + work.backward - work.tp_exposed;
    const double rank_compute = m * stage_compute / layout.pp + prediction.optimizer_ms;
    const double shared = host_ranks * rank_compute / model.compute_slots_per_host;
    prediction.step_ms =
        std::max(prediction.step_ms, shared + m * busiest->tp_exposed + pp_rank_exposed + dp_exposed + loss_comm);
  }
  prediction.tokens_per_s = static_cast<double>(workload.batch_size * s.seq_len) / prediction.step_ms * 1000.0;

  // --- Memory per rank ---
  const double parameters = heaviest_parameters;
  const double optimizer_state = (workload.optimizer == "adamw" ? 8.0 : 4.0) * parameters / (layout.zero > 0 ? layout.dp : 1);
  const double gradients = parameters * e / (layout.zero >= 2 ? layout.dp : 1);
  // Master weights under 16-bit weights: the optimizer's i16 low halves beside each parameter
  // (optim/master_weights.h), or with ZeRO the f32 shard the update keeps.
  const double masters = e < 4.0 ? (layout.zero > 0 ? 4.0 * parameters / layout.dp : 2.0 * parameters) : 0.0;
  prediction.weights_bytes = parameters * e + masters + gradients + optimizer_state;
  const double per_layer = tokens * c * (layout.sequence_parallel ? 34.0 / tp : 10.0 + 24.0 / tp) * (e / 2.0);
  int most_blocks = 0;
  for (const StageWork& work : stage_work) most_blocks = std::max(most_blocks, work.blocks);
  const double logits = tokens * static_cast<double>(s.vocab) / tp * 4.0 * 2.0;
  prediction.activation_bytes =
      static_cast<double>(peak_in_flight) * (per_layer * most_blocks / layout.virtual_stages) + logits;
  prediction.memory_bytes = prediction.weights_bytes + prediction.activation_bytes;
  return prediction;
}

}  // namespace weft
