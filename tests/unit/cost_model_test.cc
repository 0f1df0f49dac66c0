// The cost model (parallel/cost/): the ring-model fit, bucket choice, the step simulator (with the
// loaded wait of oversubscribed hosts), calibration files and the compute anchor
// (launcher/compute_anchor.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "launcher/calibration_file.h"
#include "launcher/compute_anchor.h"
#include "launcher/config_loader.h"
#include "launcher/cost_model_setup.h"
#include "launcher/layout_search.h"
#include "layers/language_model.h"
#include "parallel/cost/bucket_choice.h"
#include "parallel/cost/calibration.h"
#include "parallel/cost/cost_model.h"
#include "parallel/cost/step_simulator.h"
#include "parallel/data/gradient_buffer.h"
#include "parallel/pipeline/pipeline_schedule.h"
#include "runtime/error.h"
#include "tests/support/small_model_config.h"

namespace weft {
namespace {

CostModel model_with(double latency_ms, double bytes_per_ms, double matmul_flops_per_ms = 1e6) {
  CostModel model;
  model.device = "cpu";
  for (auto& by_link : model.fits) by_link.fill({latency_ms, bytes_per_ms, 2});
  model.compute = {matmul_flops_per_ms, matmul_flops_per_ms, 1e6};
  return model;
}

// model_with's links, with all-reduces across hosts ten times slower to start and a hundred times
// slower to move bytes: where the two-level all-reduce pays.
CostModel model_with_slow_links_across_hosts() {
  CostModel model = model_with(0.01, 1e6);
  model.fits[static_cast<size_t>(CollectiveKind::kAllReduce)][static_cast<size_t>(LinkClass::kAcrossHosts)] = {0.1, 1e4, 2};
  return model;
}

TEST(CostModel, RingStepsAndTraffic) {
  EXPECT_DOUBLE_EQ(collective_steps(CollectiveKind::kAllReduce, 4), 6.0);
  EXPECT_DOUBLE_EQ(collective_traffic(CollectiveKind::kAllReduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(collective_traffic(CollectiveKind::kAllGather, 4), 0.75);
  EXPECT_DOUBLE_EQ(collective_steps(CollectiveKind::kSendRecv, 8), 1.0);
  const CollectiveFit fit{0.01, 1000.0, 2};
  // 6 steps of 0.01 ms, 1.5 * 4000 bytes at 1000 bytes/ms.
  EXPECT_DOUBLE_EQ(fit.time_ms(CollectiveKind::kAllReduce, 4000.0, 4), 0.06 + 6.0);
  EXPECT_EQ(model_with(1, 1).collective_ms(CollectiveKind::kAllReduce, 1e6, 1, LinkClass::kSameHost), 0.0);
}

TEST(CostModel, FitRecoversLatencyAndBandwidth) {
  const CollectiveFit truth{0.02, 5e5, 4};
  std::vector<CollectiveSample> samples;
  for (double bytes : {1e4, 1e5, 1e6, 4e6}) samples.push_back({bytes, truth.time_ms(CollectiveKind::kAllGather, bytes, 4)});
  const CollectiveFit fit = fit_collective(CollectiveKind::kAllGather, 4, samples);
  EXPECT_NEAR(fit.latency_ms, 0.02, 1e-9);
  EXPECT_NEAR(fit.bytes_per_ms, 5e5, 1e-3);
  EXPECT_EQ(fit.measured_ranks, 4);
  // A fit at 4 ranks predicts 64 by the ring model.
  EXPECT_NEAR(fit.time_ms(CollectiveKind::kAllGather, 1e6, 64), 63 * 0.02 + (63.0 / 64.0) * 1e6 / 5e5, 1e-6);
}

TEST(CostModel, FitClampsNoise) {
  // Times that fall with size: no negative bandwidth, the largest sample's rate instead.
  const CollectiveFit fit = fit_collective(CollectiveKind::kSendRecv, 2, {{1e3, 2.0}, {1e6, 1.0}});
  EXPECT_GT(fit.bytes_per_ms, 0.0);
  EXPECT_GE(fit.latency_ms, 0.0);
  EXPECT_THROW(fit_collective(CollectiveKind::kAllReduce, 1, {{1e3, 1.0}}), Error);
  EXPECT_THROW(fit_collective(CollectiveKind::kAllReduce, 2, {}), Error);
}

TEST(CostModel, UnmeasuredLinksTakeTheMeasuredFit) {
  CostModel model = default_cost_model(Device::cpu());
  model.fits[0][1] = {0.5, 123.0, 8};
  model.measured[0][1] = true;
  model.fill_unmeasured();
  EXPECT_DOUBLE_EQ(model.fit(CollectiveKind::kAllReduce, LinkClass::kSameHost).bytes_per_ms, 123.0);
  EXPECT_EQ(link_class_of({0, 0, 0}), LinkClass::kSameHost);
  EXPECT_EQ(link_class_of({0, 0, 1}), LinkClass::kAcrossHosts);
}

TEST(BucketChoice, PredictsOverlapAgainstBackward) {
  // Three segments of 10 ms backward, 1000 bytes each; all-reduce over 2 ranks: 2 steps of 1 ms +
  // bytes / 1000 per ms (traffic 1 at 2 ranks).
  const CostModel model = model_with(1.0, 1000.0);
  const std::vector<BackwardSegment> segments = {{10, 1000}, {10, 1000}, {10, 1000}};
  // Buckets of 1000 bytes: each reduce takes 3 ms and starts at its segment's end: the last at 30.
  const BucketCandidate small = predict_buckets(segments, 1000, model, CollectiveKind::kAllReduce, 2, LinkClass::kSameHost);
  EXPECT_EQ(small.buckets, 3);
  EXPECT_DOUBLE_EQ(small.exposed_ms, 3.0);
  EXPECT_DOUBLE_EQ(small.reduce_ms, 9.0);
  // One bucket: 2 + 3 = 5 ms, all after backward.
  const BucketCandidate whole = predict_buckets(segments, 3000, model, CollectiveKind::kAllReduce, 2, LinkClass::kSameHost);
  EXPECT_EQ(whole.buckets, 1);
  EXPECT_DOUBLE_EQ(whole.exposed_ms, 5.0);
}

// The predicted buckets of a real model are the gradient buffer's, bucket for bucket in number, at
// sizes that cut inside blocks, between a SwiGLU MLP's gate and up (a gradient group, which the
// buffer never splits), and that hold everything.
TEST(BucketChoice, CutsBucketsWhereTheGradientBufferDoes) {
  ModelConfig config = testing::small_model_config();
  config.type = "llama";
  config.layers = 3;
  config.dim = 16;
  config.heads = 4;
  std::shared_ptr<LanguageModel> model = build_model(config);
  const std::vector<NamedParameter> parameters = model->named_parameters();
  const CostModel cost = model_with(1.0, 1000.0);
  const std::vector<BackwardSegment> segments =
      backward_segments(model->segments(), parameters, parameters, config.seq_len, 64, cost);
  int64_t total = 0, gate_bytes = 0;
  for (const NamedParameter& parameter : parameters) {
    total += parameter.tensor.numel() * parameter.tensor.element_size();
    if (!parameter.gradient_group.empty()) gate_bytes = parameter.tensor.numel() * parameter.tensor.element_size();
  }
  ASSERT_GT(gate_bytes, 0) << "the llama MLP declares no gradient group";
  int64_t unit_total = 0;
  for (const BackwardSegment& segment : segments) {
    for (int64_t unit : segment.gradient_units) unit_total += unit;
    EXPECT_FALSE(segment.gradient_units.empty());
  }
  EXPECT_EQ(unit_total, total);
  for (const int64_t bucket : {gate_bytes / 2, gate_bytes + 1, total / 9, total / 4, total / 2, total}) {
    const GradientBuffer buffer(parameters, bucket, /*pad_multiple=*/1);
    const BucketCandidate predicted =
        predict_buckets(segments, bucket, cost, CollectiveKind::kAllReduce, 2, LinkClass::kSameHost);
    EXPECT_EQ(predicted.buckets, static_cast<int>(buffer.buckets().size())) << "bucket " << bucket << " bytes";
  }
}

TEST(BucketChoice, ChoosesSmallBucketsForSlowLinksAndOneForFastOnes) {
  std::vector<BackwardSegment> segments(12, BackwardSegment{1.0, 4 << 20});  // 48 MB over 12 ms
  // Bandwidth-bound (no latency): small buckets overlap more.
  const BucketChoice bandwidth = choose_bucket_bytes(segments, model_with(0.0, 1e7), CollectiveKind::kAllReduce, 2,
                                                     LinkClass::kSameHost);
  EXPECT_LE(bandwidth.bucket_bytes, int64_t{4} << 20);
  // Latency-bound (1 s per collective): one bucket.
  const BucketChoice latency = choose_bucket_bytes(segments, model_with(1000.0, 1e12), CollectiveKind::kAllReduce, 2,
                                                   LinkClass::kSameHost);
  EXPECT_EQ(latency.bucket_bytes, int64_t{48} << 20);
  EXPECT_NE(latency.explanation.find("bucket 48 MB"), std::string::npos) << latency.explanation;
}

// Ties are within 1% of the least exposed time, not of the best so far: exposed times that each
// stay within 1% of the one before do not carry the choice past the tie.
TEST(BucketChoice, TiesAreMeasuredAgainstTheLeastExposedTime) {
  auto candidates = [](std::vector<double> exposed_ms) {
    std::vector<BucketCandidate> list;
    int64_t bytes = int64_t{64} << 10;
    for (double ms : exposed_ms) {
      list.push_back(BucketCandidate{bytes, 1, ms, ms});
      bytes *= 2;
    }
    return list;
  };
  EXPECT_EQ(chosen_candidate(candidates({1.0, 1.009, 1.018, 1.027})), 1u);  // chained: 3
  EXPECT_EQ(chosen_candidate(candidates({1.2, 1.0, 1.005, 2.0})), 2u);      // the larger of a tie
  EXPECT_EQ(chosen_candidate(candidates({3.0, 2.0, 1.0})), 2u);
  EXPECT_EQ(chosen_candidate(candidates({0.0, 0.0, 0.0})), 2u);            // all hidden: fewest collectives
  EXPECT_EQ(chosen_candidate(candidates({0.5})), 0u);
}

Workload small_gpt() {
  Workload workload;
  workload.model.layers = 4;
  workload.model.dim = 64;
  workload.model.heads = 4;
  workload.model.vocab = 256;
  workload.model.seq_len = 64;
  workload.batch_size = 16;
  return workload;
}

TEST(StepSimulator, PipelineBubbleFollowsTheSchedule) {
  Workload workload = small_gpt();
  workload.model.layers = 8;
  ParallelLayout layout;
  layout.pp = 4;
  layout.micro_batches = 8;
  const CostModel model = model_with(0.0, 1e12);  // free communication
  const StepPrediction gpipe = predict_step(workload, [&] { auto l = layout; l.schedule = "gpipe"; return l; }(), model, 8);
  const StepPrediction one_f_one_b = predict_step(workload, layout, model, 8);
  // With free transfers the simulated bubble is near the formula (stages are not exactly equal).
  const double theory = theoretical_bubble(PipelineSchedule::kOneForwardOneBackward, {4, 8, 1});
  EXPECT_NEAR(one_f_one_b.bubble, theory, 0.12);
  EXPECT_NEAR(gpipe.step_ms, one_f_one_b.step_ms, 1e-6 * gpipe.step_ms);
  // 1F1B keeps fewer micro-batches in flight than GPipe.
  EXPECT_LT(one_f_one_b.activation_bytes, gpipe.activation_bytes);
  ParallelLayout zero_bubble = layout;
  zero_bubble.schedule = "zero_bubble";
  EXPECT_LT(predict_step(workload, zero_bubble, model, 8).bubble, one_f_one_b.bubble);
}

TEST(StepSimulator, AutoHidesWhatManualWaitsFor) {
  const Workload workload = small_gpt();
  const CostModel model = model_with(0.05, 1e5);
  ParallelLayout layout;
  layout.dp = 2;
  layout.tp = 2;
  layout.micro_batches = 2;
  layout.comm_mode = "manual";
  const StepPrediction manual = predict_step(workload, layout, model, 8);
  layout.comm_mode = "auto";
  const StepPrediction automatic = predict_step(workload, layout, model, 8);
  EXPECT_GT(manual.comm_ms, 0.0);
  EXPECT_NEAR(manual.exposed_comm_ms, manual.comm_ms, 1e-9);
  EXPECT_LT(automatic.exposed_comm_ms, manual.exposed_comm_ms);
  EXPECT_LT(automatic.step_ms, manual.step_ms);
  EXPECT_GT(automatic.tokens_per_s, manual.tokens_per_s);
}

TEST(StepSimulator, ZeroShardsMemoryAndTensorParallelismSplitsWeights) {
  const Workload workload = small_gpt();
  const CostModel model = model_with(0.0, 1e9);
  ParallelLayout layout;
  layout.dp = 4;
  const double replicated = predict_step(workload, layout, model, 8).weights_bytes;
  layout.zero = 1;
  const double zero1 = predict_step(workload, layout, model, 8).weights_bytes;
  layout.zero = 2;
  const double zero2 = predict_step(workload, layout, model, 8).weights_bytes;
  EXPECT_LT(zero1, replicated);
  EXPECT_LT(zero2, zero1);
  ParallelLayout tensor;
  tensor.tp = 4;
  EXPECT_LT(predict_step(workload, tensor, model, 8).weights_bytes, replicated);
}

TEST(StepSimulator, LinksAcrossHostsCostMore) {
  const Workload workload = small_gpt();
  const CostModel model = model_with_slow_links_across_hosts();
  ParallelLayout layout;
  layout.dp = 8;
  layout.comm_mode = "manual";
  // Eight dp ranks on one host, or on eight hosts of one rank.
  const StepPrediction one_host = predict_step(workload, layout, model, 8);
  const StepPrediction eight_hosts = predict_step(workload, layout, model, 1);
  EXPECT_GT(eight_hosts.dp_comm_ms, 10 * one_host.dp_comm_ms);
  // With four hosts of two ranks the two-level all-reduce moves most bytes over the fast links:
  // the auto mode takes it; the manual mode keeps the flat path unless comm.dp_all_reduce says so.
  EXPECT_FALSE(predict_step(workload, layout, model, 2).dp_hierarchical);
  layout.dp_all_reduce = "hierarchical";
  const StepPrediction forced = predict_step(workload, layout, model, 2);
  EXPECT_TRUE(forced.dp_hierarchical);
  layout.comm_mode = "auto";
  layout.dp_all_reduce = "auto";
  const StepPrediction two_per_host = predict_step(workload, layout, model, 2);
  EXPECT_TRUE(two_per_host.dp_hierarchical);
  EXPECT_LT(two_per_host.dp_comm_ms, predict_step(workload, layout, model, 1).dp_comm_ms);
  layout.dp_all_reduce = "flat";
  EXPECT_FALSE(predict_step(workload, layout, model, 2).dp_hierarchical);
}

// The pipeline's two routes (parallel.pp_transport): the direct route costs send_recv's fit, the host
// route host_send_recv's, its copies included. Where the auto mode hides the one it hides the
// other: the host route's sender copies on a copy stream and sends from a thread of its own, so
// nothing of its message holds compute (parallel/pipeline/pipeline_transport.h).
TEST(StepSimulator, TheHostRouteOnGpusPaysItsCopiesInItsTransfer) {
  const Workload workload = small_gpt();
  CostModel model = model_with(0.01, 1e6);
  model.device = "cuda";
  model.fits[static_cast<size_t>(CollectiveKind::kHostSendRecv)].fill({0.05, 2e5, 2});
  ParallelLayout layout;
  layout.pp = 2;
  layout.micro_batches = 4;
  const double activation_bytes = 16.0 / 4 * 64 * 64 * 4;  // [4, 64, 64] f32 per micro-batch
  for (const std::string mode : {"auto", "manual"}) {
    SCOPED_TRACE(mode);
    layout.comm_mode = mode;
    layout.pp_transport = "direct";
    const StepPrediction direct = predict_step(workload, layout, model, 8);
    layout.pp_transport = "host";
    const StepPrediction host = predict_step(workload, layout, model, 8);
    // Each micro-batch crosses the boundary forward and back.
    EXPECT_NEAR(direct.pp_comm_ms, 2 * 4 * (0.01 + activation_bytes / 1e6), 1e-9);
    EXPECT_NEAR(host.pp_comm_ms, 2 * 4 * (0.05 + activation_bytes / 2e5), 1e-9);
    if (mode == "auto") {
      // The transfers hide, copies and all.
      EXPECT_NEAR(host.exposed_comm_ms, direct.exposed_comm_ms, 1e-9);
    } else {
      EXPECT_NEAR(host.exposed_comm_ms - direct.exposed_comm_ms, host.pp_comm_ms - direct.pp_comm_ms, 1e-9);
    }
    EXPECT_GT(host.step_ms, direct.step_ms);
  }
  // On the CPU both routes are MPI's messages: with the same fit they predict the same step.
  CostModel cpu = model_with(0.01, 1e6);
  layout.comm_mode = "auto";
  layout.pp_transport = "direct";
  const double direct_ms = predict_step(workload, layout, cpu, 8).step_ms;
  layout.pp_transport = "host";
  EXPECT_DOUBLE_EQ(predict_step(workload, layout, cpu, 8).step_ms, direct_ms);
  layout.pp_transport = "nccl";
  EXPECT_NE(layout_problem(workload, layout).find("pp_transport"), std::string::npos);
}

// A pipeline's transfer costs once: on the edge where the auto mode hides it (the receive is
// posted ahead), inside the receiving action where the manual mode waits for it (its receive is
// posted where the data is needed, and MPI moves the message then). GPipe over 2 stages, uniform
// stages: the last backward ends at (m+1)(F+B) plus, in the auto mode, one transfer each way.
TEST(StepSimulator, PipelinesPayEachTransferOnce) {
  const Workload workload = small_gpt();
  ParallelLayout layout;
  layout.pp = 2;
  layout.micro_batches = 4;
  layout.schedule = "gpipe";
  const double m = layout.micro_batches;
  auto step_with_transfer_latency = [&](const std::string& mode, double latency_ms) {
    CostModel model = model_with(0.01, 1e9);
    for (CollectiveKind kind : {CollectiveKind::kSendRecv, CollectiveKind::kHostSendRecv}) {
      model.fits[static_cast<size_t>(kind)].fill({latency_ms, 1e9, 2});
    }
    layout.comm_mode = mode;
    return predict_step(workload, layout, model, 8).step_ms;
  };
  const double delta = 0.05;  // shorter than a stage's forward: no receive queues behind another
  // Manual: every forward and backward of the stage waits for one transfer.
  EXPECT_NEAR(step_with_transfer_latency("manual", 0.01 + delta) - step_with_transfer_latency("manual", 0.01),
              2.0 * (m + 1.0) * delta, 1e-9);
  // Auto: the transfers hide under compute, but for the first activation and the first gradient.
  EXPECT_NEAR(step_with_transfer_latency("auto", 0.01 + delta) - step_with_transfer_latency("auto", 0.01),
              2.0 * delta, 1e-9);
}

// weft-plan predicts each pipeline layout over the route its command runs: GPU to GPU in the auto
// mode on GPUs, the host route otherwise.
TEST(LayoutSearch, PipelinesTakeTheRouteTheirSettingsName) {
  const Workload workload = small_gpt();
  CostModel model = model_with(0.01, 1e6);
  model.device = "cuda";
  model.fits[static_cast<size_t>(CollectiveKind::kHostSendRecv)].fill({0.05, 2e5, 2});
  for (const bool on_gpus : {true, false}) {
    for (const std::string mode : {"auto", "manual"}) {
      SCOPED_TRACE(std::string(on_gpus ? "gpus " : "cpu ") + mode);
      LayoutSearchOptions options;
      options.ranks = 4;
      options.comm_mode = mode;
      options.on_gpus = on_gpus;
      const LayoutSearch search = search_layouts(workload, model, options);
      const std::string expected = on_gpus && mode == "auto" ? "direct" : "host";
      int pipelines = 0;
      for (const LayoutCandidate& candidate : search.candidates) {
        if (candidate.layout.pp == 1) continue;
        ++pipelines;
        EXPECT_EQ(candidate.layout.pp_transport, expected) << candidate.layout.describe();
        const std::vector<std::string> settings = layout_settings(candidate.layout);
        const bool names_direct =
            std::find(settings.begin(), settings.end(), "parallel.pp_transport=direct") != settings.end();
        EXPECT_EQ(names_direct, expected == "direct") << candidate.layout.describe();
        EXPECT_DOUBLE_EQ(candidate.prediction.step_ms, predict_step(workload, candidate.layout, model, 8).step_ms);
      }
      EXPECT_GT(pipelines, 0);
    }
  }
}

// Under comm.dp_all_reduce: hierarchical weft-plan offers only the layouts the run takes it for: a
// dp group over hosts with two or more of its ranks on each, without ZeRO. Each offered layout is
// predicted with two levels; the others are counted, not shown as flat.
TEST(LayoutSearch, HierarchicalAllReduceOffersOnlyLayoutsItFits) {
  const Workload workload = small_gpt();
  const CostModel model = model_with_slow_links_across_hosts();
  LayoutSearchOptions options;
  options.ranks = 8;
  options.ranks_per_host = 4;
  options.comm_mode = "manual";
  const LayoutSearch every = search_layouts(workload, model, options);
  options.dp_all_reduce = "hierarchical";
  const LayoutSearch hierarchical = search_layouts(workload, model, options);
  EXPECT_EQ(every.refused_hierarchical, 0);
  EXPECT_GT(hierarchical.refused_hierarchical, 0);
  EXPECT_EQ(hierarchical.considered + hierarchical.refused_hierarchical, every.considered);
  ASSERT_GT(hierarchical.considered, 0);
  for (const LayoutCandidate& candidate : hierarchical.candidates) {
    const ParallelLayout& layout = candidate.layout;
    EXPECT_EQ(layout.zero, 0) << layout.describe();
    EXPECT_GE(layout.dp, 4) << layout.describe();  // 8 ranks, 4 a host: dp spans hosts only from 4 on with 2 a host
    EXPECT_TRUE(candidate.prediction.dp_hierarchical) << layout.describe();
  }
  ParallelLayout layout;
  layout.dp = 8;
  EXPECT_EQ(hierarchical_all_reduce_problem(layout, 4), "");
  EXPECT_EQ(hierarchical_all_reduce_problem(layout, 8), "the dp group is on one host");
  EXPECT_EQ(hierarchical_all_reduce_problem(layout, 1), "one dp rank per host");
  layout.zero = 1;
  EXPECT_EQ(hierarchical_all_reduce_problem(layout, 4), "parallel.zero 1 reduce-scatters the gradients");
  layout = {};
  layout.dp = 6;
  EXPECT_EQ(hierarchical_all_reduce_problem(layout, 4), "dp 6 does not split into hosts of 4 dp ranks");
  layout.dp = 1;
  EXPECT_EQ(hierarchical_all_reduce_problem(layout, 4), "parallel.dp is 1");
}

TEST(StepSimulator, RefusesLayoutsThatDoNotFit) {
  const Workload workload = small_gpt();
  ParallelLayout layout;
  layout.tp = 3;
  EXPECT_NE(layout_problem(workload, layout).find("tp 3 does not divide model.heads"), std::string::npos);
  layout = {};
  layout.pp = 4;
  layout.micro_batches = 2;
  EXPECT_NE(layout_problem(workload, layout), "");
  layout = {};
  layout.dp = 3;
  EXPECT_NE(layout_problem(workload, layout).find("batch_size"), std::string::npos);
  EXPECT_THROW(predict_step(workload, layout, model_with(0, 1), 8), Error);
  EXPECT_EQ(layout_problem(workload, ParallelLayout{}), "");
}

// Four ranks on two slots, waiting 0.5 ms per collective over 2 ranks and 1 ms over 4.
CostModel oversubscribed_model() {
  CostModel model = model_with(0.01, 1e6);
  model.ranks_per_host = 4;
  model.compute_slots_per_host = 2;
  model.loaded_waits = {{2, 0.5}, {4, 1.0}};
  return model;
}

CostModel without_waits(CostModel model) {
  model.loaded_waits.clear();
  return model;
}

TEST(CostModel, LoadedWaitFollowsTheGroupSize) {
  const CostModel model = oversubscribed_model();
  EXPECT_EQ(model.loaded_wait_ms(1), 0.0) << "one rank waits for nobody";
  EXPECT_DOUBLE_EQ(model.loaded_wait_ms(2), 0.5);
  EXPECT_DOUBLE_EQ(model.loaded_wait_ms(3), 0.75);
  EXPECT_DOUBLE_EQ(model.loaded_wait_ms(4), 1.0);
  EXPECT_DOUBLE_EQ(model.loaded_wait_ms(64), 1.0) << "no figure beyond the measured sizes";
  EXPECT_EQ(without_waits(model).loaded_wait_ms(4), 0.0);
  bool described = false;
  for (const std::string& line : model.describe()) described = described || line.find("0.500 ms over 2 ranks") != std::string::npos;
  EXPECT_TRUE(described);
}

// tp 4 of the small GPT, 4 micro-batches: per micro-batch the embedding's all-reduce, four per
// block (two each way) and the head's four, 21 in all, each on the critical path and each waiting
// 1 ms over 4 ranks.
TEST(StepSimulator, LoadedWaitCostsEveryTensorParallelCollective) {
  const Workload workload = small_gpt();
  ParallelLayout layout;
  layout.tp = 4;
  layout.micro_batches = 4;
  for (const std::string mode : {"auto", "manual"}) {
    layout.comm_mode = mode;
    const StepPrediction with = predict_step(workload, layout, oversubscribed_model(), 4);
    const StepPrediction without = predict_step(workload, layout, without_waits(oversubscribed_model()), 4);
    EXPECT_NEAR(with.step_ms - without.step_ms, 4 * 21 * 1.0, 1e-6) << mode;
    EXPECT_NEAR(with.tp_comm_ms - without.tp_comm_ms, 4 * 21 * 1.0, 1e-6) << mode;
  }
  // tp 2 x dp 2 waits as groups of 2 do, and once more for the dp reduction and the loss.
  layout.tp = 2;
  layout.dp = 2;
  layout.comm_mode = "auto";
  const double with = predict_step(workload, layout, oversubscribed_model(), 4).step_ms;
  const double without = predict_step(workload, layout, without_waits(oversubscribed_model()), 4).step_ms;
  EXPECT_NEAR(with - without, 4 * 21 * 0.5 + 2 * 0.5, 1e-6);
}

TEST(StepSimulator, LoadedWaitCostsPipelineReceivesAndDataParallelReductions) {
  const Workload workload = small_gpt();
  ParallelLayout pipeline;
  pipeline.pp = 4;
  pipeline.micro_batches = 4;
  const double with = predict_step(workload, pipeline, oversubscribed_model(), 4).step_ms;
  const double without = predict_step(workload, pipeline, without_waits(oversubscribed_model()), 4).step_ms;
  // A middle stage receives twice per micro-batch (8 receives of 0.5 ms), and the loss's
  // all-reduce over the 4 stages waits 1 ms.
  EXPECT_GE(with - without, 8 * 0.5 + 1.0 - 1e-6);
  ParallelLayout data;
  data.dp = 4;
  data.micro_batches = 4;
  EXPECT_NEAR(predict_step(workload, data, oversubscribed_model(), 4).step_ms -
                  predict_step(workload, data, without_waits(oversubscribed_model()), 4).step_ms,
              2 * 1.0, 1e-6)
      << "the reduction that ends backward and the loss all-reduce";
}

TEST(StepSimulator, LoadedWaitIsFreeWhereSlotsSuffice) {
  const Workload workload = small_gpt();
  ParallelLayout layout;
  layout.dp = 2;
  layout.tp = 2;
  layout.micro_batches = 4;
  CostModel enough_slots = oversubscribed_model();
  enough_slots.compute_slots_per_host = 4;
  EXPECT_DOUBLE_EQ(predict_step(workload, layout, enough_slots, 4).step_ms,
                   predict_step(workload, layout, without_waits(enough_slots), 4).step_ms);
  CostModel devices = oversubscribed_model();
  devices.compute_slots_per_host = 0;  // a device per rank
  EXPECT_DOUBLE_EQ(predict_step(workload, layout, devices, 4).step_ms,
                   predict_step(workload, layout, without_waits(devices), 4).step_ms);
  // Two ranks per host on two slots: the four ranks of the layout are not all on one host.
  EXPECT_DOUBLE_EQ(predict_step(workload, layout, oversubscribed_model(), 2).step_ms,
                   predict_step(workload, layout, without_waits(oversubscribed_model()), 2).step_ms);
}

TEST(CalibrationFile, RoundTripsAndRejectsDamage) {
  const std::string path = ::testing::TempDir() + "/calibration_test.json";
  CostModel model = model_with(0.03, 7e5, 2e7);
  model.measured[1][0] = true;
  model.ranks_per_host = 4;
  model.source = "test";
  model.compute.scale = 1.7;
  write_calibration_file(path, model);
  const CostModel read = read_calibration_file(path, default_cost_model(Device::cpu()));
  EXPECT_DOUBLE_EQ(read.fit(CollectiveKind::kReduceScatter, LinkClass::kSameHost).latency_ms, 0.03);
  EXPECT_DOUBLE_EQ(read.compute.matmul_flops_per_ms, 2e7);
  EXPECT_DOUBLE_EQ(read.compute.scale, 1.7);
  EXPECT_TRUE(read.measured[1][0]);
  EXPECT_FALSE(read.measured[0][0]);
  EXPECT_EQ(read.ranks_per_host, 4);
  EXPECT_TRUE(read.loaded_waits.empty());
  model.loaded_waits = {{2, 0.25}, {4, 0.5}};
  model.compute_slots_per_host = 2;
  write_calibration_file(path, model);
  const CostModel loaded = read_calibration_file(path, default_cost_model(Device::cpu()));
  ASSERT_EQ(loaded.loaded_waits.size(), 2u);
  EXPECT_EQ(loaded.loaded_waits[1].ranks, 4);
  EXPECT_DOUBLE_EQ(loaded.loaded_waits[1].wait_ms, 0.5);
  EXPECT_DOUBLE_EQ(loaded.loaded_wait_ms(2), 0.25);
  EXPECT_DOUBLE_EQ(loaded.compute_slots_per_host, 2.0);
  {
    // A file written before the loaded wait: no "loaded_waits" key, no wait.
    std::ofstream old(path);
    old << "{\"format\": \"weft-calibration\", \"version\": 1, \"device\": \"cpu\", \"compute_slots_per_host\": 2,"
           " \"compute\": {\"matmul_flops_per_ms\": 1e7, \"attention_flops_per_ms\": 1e7, \"memory_bytes_per_ms\": 1e6}}";
  }
  CostModel defaults = default_cost_model(Device::cpu());
  defaults.loaded_waits = {{2, 9.0}};
  const CostModel older = read_calibration_file(path, defaults);
  EXPECT_TRUE(older.loaded_waits.empty());
  EXPECT_EQ(older.loaded_wait_ms(2), 0.0);
  {
    std::ofstream unsorted(path);
    unsorted << "{\"format\": \"weft-calibration\", \"compute\": {\"matmul_flops_per_ms\": 1, "
                "\"attention_flops_per_ms\": 1, \"memory_bytes_per_ms\": 1}, \"loaded_waits\": "
                "[{\"ranks\": 4, \"wait_ms\": 1}, {\"ranks\": 2, \"wait_ms\": 1}]}";
  }
  EXPECT_THROW(read_calibration_file(path, default_cost_model(Device::cpu())), Error);
  {
    std::ofstream damaged(path);
    damaged << "{\"format\": \"weft-calibration\", \"compute\": {\"matmul_flops_per_ms\": -1}}";
  }
  try {
    read_calibration_file(path, default_cost_model(Device::cpu()));
    FAIL() << "a negative rate was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
  EXPECT_THROW(read_calibration_file(path + ".missing", default_cost_model(Device::cpu())), Error);
  std::filesystem::remove(path);
}

// The host route's figures: kept through a file; older CPU files without them get send_recv's (the
// same MPI messages); older GPU files' copy figure is left unread.
TEST(CalibrationFile, KeepsTheHostRoutesFigures) {
  const std::string path = ::testing::TempDir() + "/calibration_host_route_test.json";
  CostModel model = model_with(0.03, 7e5, 2e7);
  model.device = "cuda";
  model.fits[static_cast<size_t>(CollectiveKind::kHostSendRecv)][0] = {0.2, 3e6, 2};
  model.measured[static_cast<size_t>(CollectiveKind::kHostSendRecv)][0] = true;
  write_calibration_file(path, model);
  const CostModel read = read_calibration_file(path, default_cost_model(Device::cpu()));
  EXPECT_DOUBLE_EQ(read.fit(CollectiveKind::kHostSendRecv, LinkClass::kSameHost).latency_ms, 0.2);
  EXPECT_DOUBLE_EQ(read.fit(CollectiveKind::kHostSendRecv, LinkClass::kSameHost).bytes_per_ms, 3e6);
  EXPECT_TRUE(read.measured[static_cast<size_t>(CollectiveKind::kHostSendRecv)][0]);
  const std::string older_cpu =
      "{\"format\": \"weft-calibration\", \"device\": \"cpu\", \"collectives\": [{\"kind\": \"send_recv\", "
      "\"link\": \"same_host\", \"latency_ms\": 0.125, \"bytes_per_ms\": 4e6, \"measured\": true}], "
      "\"compute\": {\"matmul_flops_per_ms\": 1e7, \"attention_flops_per_ms\": 1e7, \"memory_bytes_per_ms\": 1e6}}";
  std::ofstream(path) << older_cpu;
  const CostModel cpu = read_calibration_file(path, default_cost_model(Device::cpu()));
  EXPECT_DOUBLE_EQ(cpu.fit(CollectiveKind::kHostSendRecv, LinkClass::kSameHost).latency_ms, 0.125);
  EXPECT_DOUBLE_EQ(cpu.fit(CollectiveKind::kHostSendRecv, LinkClass::kSameHost).bytes_per_ms, 4e6);
  EXPECT_TRUE(cpu.measured[static_cast<size_t>(CollectiveKind::kHostSendRecv)][0]);
  // A GPU file of 2026-12-05 or before, with the sender's copy as a figure of its own: read as
  // before, the copy left unread (it is in the route's fit).
  std::string older_gpu = older_cpu;
  older_gpu.replace(older_gpu.find("\"cpu\""), 5, "\"cuda\"");
  older_gpu.replace(older_gpu.find("\"compute\""), 0,
                    "\"device_to_host\": {\"latency_ms\": 0.02, \"bytes_per_ms\": 5.5e7, \"measured\": true}, ");
  std::ofstream(path) << older_gpu;
  const CostModel gpu = read_calibration_file(path, default_cost_model(Device::cpu()));
  EXPECT_EQ(gpu.device, "cuda");
  EXPECT_DOUBLE_EQ(gpu.fit(CollectiveKind::kSendRecv, LinkClass::kSameHost).latency_ms, 0.125);
  const CostModel defaults = default_cost_model(Device::cuda());
  // A GPU's host route is the slower one: two copies and MPI, against NCCL's send/recv.
  EXPECT_GT(defaults.collective_ms(CollectiveKind::kHostSendRecv, 64e6, 2, LinkClass::kSameHost),
            defaults.collective_ms(CollectiveKind::kSendRecv, 64e6, 2, LinkClass::kSameHost));
  EXPECT_GT(defaults.collective_ms(CollectiveKind::kHostSendRecv, 64e6, 2, LinkClass::kAcrossHosts),
            defaults.collective_ms(CollectiveKind::kHostSendRecv, 64e6, 2, LinkClass::kSameHost));
  std::filesystem::remove(path);
}

// What weft-train keeps in a checkpoint's state.json, and a resumed run chooses by: every figure
// must come back bit for bit through the text, or the resumed run could choose otherwise.
TEST(CalibrationFile, TheJsonObjectRoundTripsEveryFigureBitForBit) {
  CostModel model = model_with(1.0 / 3.0, 7.123456789012345e5, 0.1 + 0.2);
  model.fits[2][1].latency_ms = 2.0 / 7.0;
  model.fits[2][1].bytes_per_ms = 1e-3 / 3.0;
  model.measured[2][1] = true;
  model.compute.attention_flops_per_ms = 123456789.98765432;
  model.compute.memory_bytes_per_ms = 3.0e12 / 7.0;
  model.compute.op_overhead_ms = 1.0 / 9.0;
  model.compute.scale = 1.4142135623730951;
  model.compute_slots_per_host = 2.5;
  model.loaded_waits = {{2, 1.0 / 7.0}, {8, 0.3}};
  const nlohmann::json text = nlohmann::json::parse(calibration_json(model).dump(2));
  const CostModel back = calibration_from_json(text, default_cost_model(Device::cpu()), "test", "unused");
  for (size_t kind = 0; kind < model.fits.size(); ++kind) {
    for (size_t link = 0; link < model.fits[kind].size(); ++link) {
      EXPECT_EQ(back.fits[kind][link].latency_ms, model.fits[kind][link].latency_ms);
      EXPECT_EQ(back.fits[kind][link].bytes_per_ms, model.fits[kind][link].bytes_per_ms);
      EXPECT_EQ(back.measured[kind][link], model.measured[kind][link]);
    }
  }
  EXPECT_EQ(back.compute.matmul_flops_per_ms, model.compute.matmul_flops_per_ms);
  EXPECT_EQ(back.compute.attention_flops_per_ms, model.compute.attention_flops_per_ms);
  EXPECT_EQ(back.compute.memory_bytes_per_ms, model.compute.memory_bytes_per_ms);
  EXPECT_EQ(back.compute.op_overhead_ms, model.compute.op_overhead_ms);
  EXPECT_EQ(back.compute.scale, model.compute.scale);
  EXPECT_EQ(back.compute_slots_per_host, model.compute_slots_per_host);
  ASSERT_EQ(back.loaded_waits.size(), 2u);
  EXPECT_EQ(back.loaded_waits[0].wait_ms, model.loaded_waits[0].wait_ms);
  EXPECT_EQ(back.loaded_waits[1].ranks, 8);
  EXPECT_EQ(back.device, model.device);
  EXPECT_EQ(back.source, model.source);
}

TEST(Calibration, OneProcessMeasuresCompute) {
  CalibrationShapes shapes;
  const CalibrationResult result = calibrate(Device::cpu(), kFloat32, shapes, {0});
  EXPECT_GT(result.model.compute.matmul_flops_per_ms, 0.0);
  EXPECT_GT(result.model.compute.attention_flops_per_ms, 0.0);
  EXPECT_GT(result.model.compute.memory_bytes_per_ms, 0.0);
  EXPECT_FALSE(result.model.measured[0][0]);  // one process measures no link
  EXPECT_TRUE(result.model.loaded_waits.empty());  // nor waits for peers it does not have
  EXPECT_LT(result.seconds, 5.0);
}

TEST(CostModel, TheComputeScaleMultipliesEveryComputeDuration) {
  CostModel model = model_with(0.01, 1e6, 2e6);
  model.compute.op_overhead_ms = 0.002;
  const double matmul = model.matmul_ms(1e6), attention = model.attention_ms(1e6);
  const double memory = model.memory_ms(1e6), ops = model.ops_ms(10);
  const double collective = model.collective_ms(CollectiveKind::kAllReduce, 1e6, 4, LinkClass::kSameHost);
  model.compute.scale = 1.5;
  EXPECT_DOUBLE_EQ(model.matmul_ms(1e6), 1.5 * matmul);
  EXPECT_DOUBLE_EQ(model.attention_ms(1e6), 1.5 * attention);
  EXPECT_DOUBLE_EQ(model.memory_ms(1e6), 1.5 * memory);
  EXPECT_DOUBLE_EQ(model.ops_ms(10), 1.5 * ops);
  EXPECT_DOUBLE_EQ(model.collective_ms(CollectiveKind::kAllReduce, 1e6, 4, LinkClass::kSameHost), collective)
      << "links are not compute";
}

// The anchor times one micro-batch of the run's model on the CPU and scales the model so that it
// predicts that time: after it, the simulator's forward and backward of that micro-batch is the
// measured time it printed.
TEST(ComputeAnchor, ScalesTheModelToTheMeasuredMicroBatch) {
  const RunConfig config = load_config({}, {"model.layers=2", "model.dim=32", "model.heads=2", "model.seq_len=32",
                                            "model.vocab=64", "train.batch_size=4", "train.micro_batches=2"});
  CostModel model = calibrate(Device::cpu(), kFloat32, calibration_shapes(config, 1), {0}).model;
  const std::string line = anchor_compute(config, Device::cpu(), kFloat32, {0}, model);
  SCOPED_TRACE(line);
  // "... (2 sequences), forward and backward on one rank: X ms measured, Y ms from the rates; ..."
  const size_t colon = line.find("one rank: ");
  ASSERT_NE(colon, std::string::npos);
  double measured = 0.0;
  ASSERT_TRUE(absl::SimpleAtod(line.substr(colon + 10, line.find(" ms measured") - colon - 10), &measured));
  EXPECT_NE(line.find("(2 sequences)"), std::string::npos);
  EXPECT_GT(model.compute.scale, 0.0);
  Workload workload = workload_of(config);
  workload.batch_size = 2;
  const StepPrediction predicted = predict_step(workload, ParallelLayout{}, model, 1);
  EXPECT_NEAR(predicted.compute_ms - predicted.optimizer_ms, measured, 0.01 * measured + 0.01);
  EXPECT_THROW(anchor_compute(config, Device::cpu(), kFloat32, {0}, model), Error) << "anchored twice";
}

}  // namespace
}  // namespace weft
