// Pipeline stage partitions: the balanced split against brute force (the smallest largest stage,
// the earliest boundaries among equals), the split parallel.pp_layers asks for, the FLOP and
// parameter estimates of a GPT and a Llama checked against their formulas, the start-up log lines,
// and the errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/language_model.h"
#include "parallel/pipeline/stage_partition.h"
#include "runtime/error.h"
#include "tests/support/error_expectations.h"
#include "tests/support/small_model_config.h"

namespace weft {
namespace {

using testing::error_message;
using testing::expect_contains;
using testing::small_model_config;

// Every split of `costs` into `stages` non-empty parts, boundaries in lexicographic order; keeps the
// first with the smallest largest part (parts summed left to right, as balanced_partition does).
std::vector<int> brute_force_first_segments(const std::vector<double>& costs, int stages) {
  const int count = static_cast<int>(costs.size());
  std::vector<int> best;
  double best_largest = std::numeric_limits<double>::infinity();
  std::vector<int> boundaries(stages + 1);
  boundaries[0] = 0;
  boundaries[stages] = count;
  // Boundaries 1 .. stages-1 as an increasing sequence in [1, count - 1], enumerated in order.
  std::function<void(int, int)> choose = [&](int position, int smallest) {
    if (position == stages) {
      double largest = 0;
      for (int stage = 0; stage < stages; ++stage) {
        double sum = 0;
        for (int i = boundaries[stage]; i < boundaries[stage + 1]; ++i) sum += costs[i];
        largest = std::max(largest, sum);
      }
      if (largest < best_largest) {
        best_largest = largest;
        best = boundaries;
      }
      return;
    }
    for (int boundary = smallest; boundary <= count - (stages - position); ++boundary) {
      boundaries[position] = boundary;
      choose(position + 1, boundary + 1);
    }
  };
  choose(1, 1);
  return best;
}

double largest_stage(const std::vector<double>& costs, const StagePartition& partition) {
  double largest = 0;
  for (int stage = 0; stage < partition.stages(); ++stage) {
    double sum = 0;
    for (int i = partition.first_segment[stage]; i < partition.first_segment[stage + 1]; ++i) sum += costs[i];
    largest = std::max(largest, sum);
  }
  return largest;
}

TEST(StagePartitionTest, BalancedPartitionMatchesBruteForce) {
  std::mt19937 random(20240611);
  for (int trial = 0; trial < 600; ++trial) {
    const int count = 1 + static_cast<int>(random() % 10);
    const int stages = 1 + static_cast<int>(random() % count);
    std::vector<double> costs(count);
    // Small integers make many ties (the tie rule is checked too); reals, one zero now and then,
    // check that nothing depends on the costs being whole.
    const bool whole = trial % 2 == 0;
    for (double& cost : costs) {
      cost = whole ? static_cast<double>(random() % 4) : std::uniform_real_distribution<double>(0, 5)(random);
    }
    const StagePartition partition = balanced_partition(costs, stages);
    const std::vector<int> expected = brute_force_first_segments(costs, stages);
    ASSERT_EQ(partition.first_segment, expected) << "trial " << trial << ", " << count << " segments, " << stages
                                                 << " stages";
    EXPECT_EQ(partition.stages(), stages);
    for (int stage = 0; stage < stages; ++stage) EXPECT_GE(partition.segments(stage), 1);
  }
}

TEST(StagePartitionTest, BalancedPartitionExamples) {
  // Even costs: the split is even, and with slack the earlier stage gets less.
  EXPECT_EQ(balanced_partition({1, 1, 1, 1, 1, 1}, 3).first_segment, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(balanced_partition({1, 1, 1, 1, 1}, 2).first_segment, (std::vector<int>{0, 2, 5}));
  // One heavy segment bounds every split: the earliest boundaries that keep it alone.
  EXPECT_EQ(balanced_partition({1, 1, 1, 1, 1, 1, 10}, 3).first_segment, (std::vector<int>{0, 1, 6, 7}));
  // A heavy head takes a stage of its own; the light embedding rides with two blocks.
  const std::vector<double> costs = {2, 5, 5, 5, 5, 5, 5, 9};
  const StagePartition partition = balanced_partition(costs, 4);
  EXPECT_EQ(partition.first_segment, (std::vector<int>{0, 3, 5, 7, 8}));
  EXPECT_EQ(largest_stage(costs, partition), 12);
  // As many stages as segments: one each.
  EXPECT_EQ(balanced_partition({3, 0, 2}, 3).first_segment, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(balanced_partition({3, 0, 2}, 1).first_segment, (std::vector<int>{0, 3}));
}

TEST(StagePartitionTest, BalancedPartitionErrors) {
  expect_contains(error_message([] { balanced_partition({1, 2, 3}, 4); }),
                  {"cannot split 3 model segments into 4 pipeline stages", "parallel.pp * parallel.pp_virtual"});
  expect_contains(error_message([] { balanced_partition({1, 2, 3}, 0); }), {"into 0 pipeline stages"});
  expect_contains(error_message([] { balanced_partition({}, 1); }), {"cannot split 0 model segments"});
  expect_contains(error_message([] { balanced_partition({1, -2, 3}, 2); }), {"segment 1 has cost -2"});
  expect_contains(error_message([] { balanced_partition({1, std::nan(""), 3}, 2); }), {"segment 1 has cost"});
}

TEST(StagePartitionTest, SegmentsAndStageOf) {
  StagePartition partition;
  partition.first_segment = {0, 5, 9, 12, 16};
  EXPECT_EQ(partition.stages(), 4);
  EXPECT_EQ(partition.segments(0), 5);
  EXPECT_EQ(partition.segments(3), 4);
  EXPECT_EQ(partition.stage_of(0), 0);
  EXPECT_EQ(partition.stage_of(4), 0);
  EXPECT_EQ(partition.stage_of(5), 1);
  EXPECT_EQ(partition.stage_of(15), 3);
  EXPECT_THROW(partition.stage_of(16), Error);
  EXPECT_THROW(partition.segments(4), Error);
  // Interleaved placement: virtual stage j on rank j % pp, chunk j / pp.
  EXPECT_EQ(stage_rank(5, 4), 1);
  EXPECT_EQ(stage_chunk(5, 4), 1);
  EXPECT_EQ(stage_rank(3, 4), 3);
  EXPECT_EQ(stage_chunk(3, 4), 0);
}

TEST(StagePartitionTest, PartitionFromLayers) {
  // 14 blocks: [embedding, blocks 0-3], [blocks 4-7], [blocks 8-10], [blocks 11-13, head].
  EXPECT_EQ(partition_from_layers({4, 4, 3, 3}, 14, 4).first_segment, (std::vector<int>{0, 5, 9, 12, 16}));
  // The first or last stage may hold only the embedding or only the head.
  EXPECT_EQ(partition_from_layers({0, 2, 2}, 4, 3).first_segment, (std::vector<int>{0, 1, 3, 6}));
  EXPECT_EQ(partition_from_layers({2, 2, 0}, 4, 3).first_segment, (std::vector<int>{0, 3, 5, 6}));
  EXPECT_EQ(partition_from_layers({3}, 3, 1).first_segment, (std::vector<int>{0, 5}));
}

TEST(StagePartitionTest, PartitionFromLayersErrorsNameTheKey) {
  expect_contains(error_message([] { partition_from_layers({4, 4, 4}, 12, 4); }),
                  {"parallel.pp_layers = [4, 4, 4] has 3 entries for 4 virtual stages", "one block count per virtual stage"});
  expect_contains(error_message([] { partition_from_layers({4, 4, 3}, 12, 3); }),
                  {"parallel.pp_layers = [4, 4, 3] places 11 blocks, but the model has 12", "model.layers"});
  expect_contains(error_message([] { partition_from_layers({2, 0, 2}, 4, 3); }),
                  {"parallel.pp_layers = [2, 0, 2]: entry 2 (virtual stage 1) is 0", "would hold nothing"});
  expect_contains(error_message([] { partition_from_layers({5, -1}, 4, 2); }),
                  {"parallel.pp_layers = [5, -1]: entry 2 is -1", "cannot be negative"});
}

// The segments and parameters of a model built by build_model.
struct BuiltModel {
  std::shared_ptr<LanguageModel> model;
  std::vector<ModelSegment> segments;
  std::vector<NamedParameter> parameters;
};

BuiltModel build(const ModelConfig& config) {
  BuiltModel built;
  built.model = build_model(config);
  built.segments = built.model->segments();
  built.parameters = built.model->named_parameters();
  return built;
}

TEST(StagePartitionTest, GptFlopsAndParametersFollowTheFormula) {
  for (const bool tied : {true, false}) {
    ModelConfig config = small_model_config();  // C = 8, H = 2, V = 7, seq_len 6, 2 blocks, biases
    config.tie_embeddings = tied;
    const BuiltModel gpt = build(config);
    ASSERT_EQ(gpt.segments.size(), 4u);
    const double C = 8, V = 7, hidden = 4 * C, T = 10;  // T: the sequence length the estimate is for
    const std::vector<double> flops = segment_flops_per_token(gpt.segments, gpt.parameters, 10);
    // A block: qkv [3C, C], proj [C, C], fc [4C, C], proj [C, 4C], two weights per matmul FLOP;
    // attention: 2 T C for the scores and 2 T C for the values.
    const double block = 2 * (3 * C * C + C * C + hidden * C + C * hidden) + 4 * T * C;
    EXPECT_EQ(flops, (std::vector<double>{0, block, block, 2 * V * C})) << "tied " << tied;
    EXPECT_EQ(block, 1856);

    const std::vector<int64_t> counts = segment_parameter_counts(gpt.segments, gpt.parameters);
    const int64_t embedding = 7 * 8 + 6 * 8;  // token [V, C], position [seq_len, C]
    const int64_t block_parameters = 2 * 8 + (24 * 8 + 24) + (8 * 8 + 8) + 2 * 8 + (32 * 8 + 32) + (8 * 32 + 8);
    const int64_t head = 2 * 8 + 7 * 8;  // final norm; the tied head counts token_embedding again
    EXPECT_EQ(counts, (std::vector<int64_t>{embedding, block_parameters, block_parameters, head})) << "tied " << tied;
    EXPECT_EQ(block_parameters, 12 * 64 + 13 * 8);

    EXPECT_EQ(segment_balance_costs(flops, counts),
              (std::vector<double>{104, block + 872, block + 872, 2 * V * C + 72}));
  }
}

TEST(StagePartitionTest, LlamaAttentionWidthIsTheInputWidthOfQkv) {
  ModelConfig config = small_model_config();
  config.type = "llama";
  config.norm = "rms_norm";
  config.mlp = "swiglu_mlp";
  config.positions = "rope";
  config.bias = false;
  config.tie_embeddings = false;
  config.kv_heads = 1;  // qkv is [(H + 2 KV) D, C] = [16, 8]: its input width is still C
  const BuiltModel llama = build(config);
  const double C = 8, V = 7, hidden = 64, T = 6;  // swiglu: 8C/3 rounded up to 64
  const double block = 2 * (16 * C + C * C + 3 * hidden * C) + 4 * T * C;
  EXPECT_EQ(segment_flops_per_token(llama.segments, llama.parameters, 6),
            (std::vector<double>{0, block, block, 2 * V * C}));
}

TEST(StagePartitionTest, SegmentCostsNeedTheModelsParameters) {
  const BuiltModel gpt = build(small_model_config());
  std::vector<NamedParameter> missing = gpt.parameters;
  missing.erase(std::remove_if(missing.begin(), missing.end(),
                               [](const NamedParameter& p) { return p.name == "blocks.1.mlp.fc.weight"; }),
                missing.end());
  expect_contains(error_message([&] { segment_flops_per_token(gpt.segments, missing, 6); }),
                  {"segment 'block 1' reads parameter 'blocks.1.mlp.fc.weight'", "not among the model's parameters"});
  EXPECT_THROW(segment_parameter_counts(gpt.segments, missing), Error);
}

TEST(StagePartitionTest, PartitionModelUsesTheLayersOrBalancesCosts) {
  ModelConfig config = small_model_config();
  config.layers = 4;
  const BuiltModel gpt = build(config);
  EXPECT_EQ(partition_model(gpt.segments, gpt.parameters, 6, {1, 3}, 2).first_segment, (std::vector<int>{0, 2, 6}));
  const std::vector<double> costs =
      segment_balance_costs(segment_flops_per_token(gpt.segments, gpt.parameters, 6),
                            segment_parameter_counts(gpt.segments, gpt.parameters));
  const StagePartition balanced = partition_model(gpt.segments, gpt.parameters, 6, {}, 3);
  EXPECT_EQ(balanced.first_segment, balanced_partition(costs, 3).first_segment);
  // Embedding 104, blocks 2600 each, head 184: one stage must take two blocks, and the earliest
  // boundaries that keep it at two put the embedding with block 0 and the head with block 3.
  EXPECT_EQ(balanced.first_segment, (std::vector<int>{0, 2, 4, 6}));
}

std::vector<ModelSegment> named_segments(const std::vector<std::string>& names) {
  std::vector<ModelSegment> segments;
  for (const std::string& name : names) segments.push_back({name, nullptr, {}});
  return segments;
}

TEST(StagePartitionTest, DescribePartitionWritesOneLinePerStage) {
  const std::vector<ModelSegment> segments =
      named_segments({"embedding", "block 0", "block 1", "block 2", "block 3", "head"});
  const std::vector<double> flops = {0, 10, 10, 10, 10, 60};
  const std::vector<int64_t> counts = {1230000, 999, 12345, 999999, 1, 1300000000};
  StagePartition partition;
  partition.first_segment = {0, 3, 4, 6};
  EXPECT_EQ(describe_partition(partition, segments, flops, counts),
            (std::vector<std::string>{"stage 0: embedding, block 0-1 — 20.0% of forward FLOPs, 1.24M parameters",
                                      "stage 1: block 2 — 10.0% of forward FLOPs, 1.00M parameters",
                                      "stage 2: block 3, head — 70.0% of forward FLOPs, 1.30B parameters"}));
  // Virtual stages of an interleaved pipeline: stage j on rank j % pp as chunk j / pp.
  partition.first_segment = {0, 2, 3, 5, 6};
  EXPECT_EQ(describe_partition(partition, segments, flops, counts, 2),
            (std::vector<std::string>{"stage 0 (rank 0, chunk 0): embedding, block 0 — 10.0% of forward FLOPs, 1.23M parameters",
                                      "stage 1 (rank 1, chunk 0): block 1 — 10.0% of forward FLOPs, 12.3K parameters",
                                      "stage 2 (rank 0, chunk 1): block 2-3 — 20.0% of forward FLOPs, 1.00M parameters",
                                      "stage 3 (rank 1, chunk 1): head — 60.0% of forward FLOPs, 1.30B parameters"}));
  // Names that are not blocks are listed as they are; small counts are written out.
  const std::vector<ModelSegment> custom = named_segments({"encoder", "decoder"});
  partition.first_segment = {0, 2};
  EXPECT_EQ(describe_partition(partition, custom, {0, 0}, {5, 7}),
            (std::vector<std::string>{"stage 0: encoder, decoder — 0.0% of forward FLOPs, 12 parameters"}));
  EXPECT_THROW(describe_partition(partition, segments, flops, counts), Error);
}

TEST(StagePartitionTest, DescribesABuiltGpt) {
  ModelConfig config = small_model_config();
  config.layers = 4;
  const BuiltModel gpt = build(config);
  const std::vector<double> flops = segment_flops_per_token(gpt.segments, gpt.parameters, 6);
  const std::vector<int64_t> counts = segment_parameter_counts(gpt.segments, gpt.parameters);
  const StagePartition partition = partition_from_layers({2, 2}, 4, 2);
  const std::vector<std::string> lines = describe_partition(partition, gpt.segments, flops, counts, 2);
  ASSERT_EQ(lines.size(), 2u);
  // Blocks 1728 FLOPs each, the head 112: 3456 / 7024 and 3568 / 7024.
  EXPECT_EQ(lines[0], "stage 0 (rank 0, chunk 0): embedding, block 0-1 — 49.2% of forward FLOPs, 1.85K parameters");
  EXPECT_EQ(lines[1], "stage 1 (rank 1, chunk 0): block 2-3, head — 50.8% of forward FLOPs, 1.82K parameters");
}

}  // namespace
}  // namespace weft
