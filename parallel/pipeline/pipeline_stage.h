// PipelineStage: what one rank of a pipeline needs besides its step graph.
//
// Built once per run (make_strategy) when parallel.pp > 1. It cuts the model's segments into
// pp * pp_virtual virtual stages (by cost, or by parallel.pp_layers: stage_partition.h), places
// virtual stage j on rank j % pp, and owns this rank's PipelineTransport and pp process group. It
// answers the strategy's questions that depend on the cut:
//
// - which segments and parameters this rank trains (the model is built whole on every rank, from
//   the same seed, so every stage starts from the one-process weights; a rank trains, reduces and
//   updates only the parameters its segments read);
// - shared parameters: a parameter read by segments of two stages (GPT's tied embedding: the
//   first stage's lookup and the last stage's head) is a copy on each. Their gradients are summed
//   between the two before the data-parallel reduction, so both copies take the same update and
//   stay equal; the gradient norm counts it once (on the lower stage);
// - sums over the stages (the loss, which only the last stage computes; the squared gradient norm);
// - evaluation, which hands the activations down the stages once per batch;
// - checkpoints in the global layout: every stage's tensors gathered on stage 0, so a checkpoint
//   saved at one pp resumes at any other (loading needs nothing: every rank has every parameter).
//
// Every method marked collective is called by every rank of the pp group in the same order.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "layers/model_segment.h"
#include "parallel/comm/process_group.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "parallel/pipeline/pipeline_step_builder.h"
#include "parallel/pipeline/pipeline_transport.h"
#include "runtime/graph/step_timeline.h"

namespace weft {

struct PipelineOptions {
  std::string schedule = "1f1b";     // parallel.pp_schedule
  int64_t chunks = 1;                // parallel.pp_virtual
  std::vector<int64_t> layers;       // parallel.pp_layers: blocks per virtual stage; empty: by cost
  std::string transport = "host";    // parallel.pp_transport: host | direct (PipelineTransport::Route)
  int64_t seq_len = 0;               // model.seq_len, for the attention term of the cost
};

class PipelineStage {
 public:
  // Collective over the world (the transport's and the group's communicators).
  PipelineStage(const Mesh& mesh, int world_rank, const std::vector<ModelSegment>& segments,
                const std::vector<NamedParameter>& parameters, const PipelineOptions& options, Device device,
                int64_t micro_batches);

  const PipelinePlacement& placement() const { return placement_; }
  PipelineSchedule schedule() const { return schedule_; }
  PipelineTransport& transport() { return *transport_; }
  int stage() const { return placement_.stage; }
  int stages() const { return placement_.stages; }

  // `segments` (all of the model's) with those of other ranks emptied: no forward, no parameters.
  std::vector<ModelSegment> local_segments(std::vector<ModelSegment> segments) const;
  // Those of `parameters` this rank trains: read by its segments (the first stage also takes those
  // that no segment names).
  std::vector<NamedParameter> local_parameters(const std::vector<NamedParameter>& parameters) const;
  // Shared with another stage (read by segments of two stages).
  bool is_shared(const std::string& name) const { return shared_peer_.count(name) > 0; }
  // This rank's copy of a shared parameter whose norm the lower stage counts.
  bool is_second_copy(const std::string& name) const;

  // Sums `gradient` of shared parameter `name` with the other stage's copy's, in place. Blocks
  // until the other stage has sent its own (collective over the two stages).
  void sum_shared_gradient(const std::string& name, const Tensor& gradient);
  // In place, the sum over the stages (on `tensor`'s device, the caller's stream). Collective.
  void sum_over_stages(const Tensor& tensor);
  // Every stage's `value`, stage 0 first. Collective.
  std::vector<double> gather_over_stages(double value);
  // In place, the largest value over the stages, element by element (any device: the result comes
  // back to `tensor`'s). Collective.
  void max_over_stages(Tensor& tensor);

  // The logits of `ids` [B, T] through every stage: this rank runs its chunks, receiving each
  // chunk's input from the stage before and sending its output on. Returns the logits on the
  // rank holding the head, an undefined tensor elsewhere. Collective.
  Tensor forward_through_stages(const std::vector<ModelSegment>& local_segments, const Tensor& ids);
  // Every stage's `tensors` merged on stage 0 (other stages get theirs back unchanged). Names must
  // not collide between stages. Collective.
  std::map<std::string, Tensor> gather_to_first_stage(const std::map<std::string, Tensor>& tensors);

  // The measured bubble of a step, as the papers count it: the pipeline's span runs from the step's
  // start (the stages leave the previous step's collectives together) to the end of the last
  // forward or backward node on any stage; a stage's bubble is the share of that span in which it
  // ran none; the mean over the stages. Collective.
  double measured_bubble(const graph::StepTimeline& timeline);
  // The schedule's bubble from its paper's formula, and the most micro-batches whose activations
  // this stage keeps at once (from the schedule's simulation).
  double theoretical_bubble() const { return theoretical_bubble_; }
  int activations_in_flight() const { return in_flight_; }
  // Start-up lines: the cut (segments, FLOPs and parameters per stage), the schedule, its bubble
  // and the activations in flight per stage.
  const std::vector<std::string>& description() const { return description_; }

 private:
  PipelinePlacement placement_;
  PipelineSchedule schedule_;
  int64_t micro_batches_;
  std::shared_ptr<PipelineTransport> transport_;
  std::shared_ptr<ProcessGroup> group_;
  std::set<std::string> local_names_;             // parameters this rank's segments read
  std::set<std::string> unnamed_;                 // parameters no segment reads (first stage's)
  std::map<std::string, int> shared_peer_;        // shared parameter -> the other stage
  std::map<std::string, int64_t> shared_tag_;     // its message tag
  double theoretical_bubble_ = 0.0;
  int in_flight_ = 0;
  std::vector<std::string> description_;
  int64_t evaluation_tag_ = 0;
};

}  // namespace weft
