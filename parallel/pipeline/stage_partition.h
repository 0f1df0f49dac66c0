// Stage partition: which contiguous segments of a model each pipeline stage runs.
//
// A model is cut into segments (layers/model_segment.h; for GPT and Llama: "embedding", "block 0"
// .. "block L-1", "head"). A pipeline of parallel.pp ranks with parallel.pp_virtual model chunks
// each has pp * pp_virtual virtual stages, and virtual stage j takes the j-th contiguous range of
// segments. Stage j runs on rank j % pp as that rank's chunk j / pp (Megatron's interleaved
// placement; with one chunk per rank, stage j is rank j). The ranges come from parallel.pp_layers
// when the user gives them (partition_from_layers), otherwise from the segments' costs
// (balanced_partition over segment_balance_costs).
//
// Cost of a segment, for balancing: its forward FLOPs per token plus its parameter count. The
// FLOPs are what a stage's compute time follows; the parameters are there so that the embedding,
// a lookup with no matmul, is not free: its table is stored on the stage, its gradient reduced and
// its optimizer state updated every step (V * C values, as many as several blocks in a small
// model). For a matmul weight the term adds rows * cols to its 2 * rows * cols FLOPs, so it keeps
// the ratio between blocks and head; only attention's sequence term and the lookup tables move.
//
// Invariants of a StagePartition: first_segment[0] == 0, strictly increasing (every stage holds at
// least one segment), first_segment.back() == the segment count. FLOP estimates are per token of
// one sequence position, forward only (backward is about twice, for every segment alike), on the
// shapes the parameters have on this rank (tensor-parallel shards where the model is sharded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layers/model_segment.h"
#include "runtime/named_parameter.h"

namespace weft {

// Forward FLOPs per token of each segment, from the parameters it reads and the sequence length:
// a 2-D weight read by a matmul costs 2 * rows * cols; segment 0 (the embedding, a lookup that
// takes token ids) costs nothing when the model has more than one segment; a tied head (the last
// segment reading token_embedding.weight [V, C]) costs 2 * V * C like an untied one; attention adds
// 4 * seq_len * dim per block (scores and the weighted sum of values; a block is a segment reading
// a parameter whose name contains "attention", dim the input width of its first 2-D attention
// weight). Parameters of other ranks (1-D norms and biases, higher ranks) cost nothing. Throws
// weft::Error when a segment reads a parameter that `parameters` does not hold.
std::vector<double> segment_flops_per_token(const std::vector<ModelSegment>& segments,
                                            const std::vector<NamedParameter>& parameters, int64_t seq_len);

// Parameters each segment reads, by element count (a parameter read by several segments, as a tied
// embedding, counts for each). Throws weft::Error as segment_flops_per_token.
std::vector<int64_t> segment_parameter_counts(const std::vector<ModelSegment>& segments,
                                              const std::vector<NamedParameter>& parameters);

// The balancing cost of each segment: flops[i] + parameter_counts[i] (the file comment says why).
std::vector<double> segment_balance_costs(const std::vector<double>& flops, const std::vector<int64_t>& parameter_counts);

struct StagePartition {
  std::vector<int> first_segment;  // per virtual stage, its first segment; size stages + 1, last = segment count

  int stages() const { return static_cast<int>(first_segment.size()) - 1; }
  // Count of segments in virtual stage `stage`.
  int segments(int stage) const;
  // The virtual stage that holds `segment`.
  int stage_of(int segment) const;
};

// Where virtual stage `stage` runs in a pipeline of `pp` ranks: rank stage % pp, chunk stage / pp.
inline int stage_rank(int stage, int pp) { return stage % pp; }
inline int stage_chunk(int stage, int pp) { return stage / pp; }

// The contiguous split of `costs` into `stages` non-empty parts whose largest part cost is the
// smallest possible (exact, by dynamic programming; a part's cost is its costs summed left to
// right). Among splits with that largest part, the one whose boundaries come earliest
// (first_segment lexicographically smallest): the earlier stages, which hold more micro-batches'
// activations in flight under 1F1B, get the lighter share of any slack. Throws weft::Error when
// stages < 1, stages > costs.size(), or a cost is negative or not finite.
StagePartition balanced_partition(const std::vector<double>& costs, int stages);

// The split parallel.pp_layers asks for, over the segments [embedding, block 0 .. blocks-1, head]:
// virtual stage j takes layers[j] blocks, stage 0 also the embedding and the last stage the head.
// Throws weft::Error naming parallel.pp_layers when layers.size() != stages, an entry is negative,
// an entry other than the first or last is 0 (that stage would hold nothing), or the entries do
// not sum to `blocks`.
StagePartition partition_from_layers(const std::vector<int64_t>& layers, int blocks, int stages);

// What a pipeline strategy calls: partition_from_layers(pp_layers, segments - 2, stages) when
// pp_layers is given (a decoder's segment list), else balanced_partition of the segments'
// balancing costs.
StagePartition partition_model(const std::vector<ModelSegment>& segments, const std::vector<NamedParameter>& parameters,
                               int64_t seq_len, const std::vector<int64_t>& pp_layers, int stages);

// One line per virtual stage for the start-up log:
//   "stage 0: embedding, block 0-3 — 31.2% of forward FLOPs, 1.23M parameters"
// Consecutive "block N" segments are written as one range. With pp > 0 each line names the rank and
// chunk the stage runs on: "stage 1 (rank 1, chunk 0): ...". `flops` and `parameter_counts` are per
// segment (segment_flops_per_token, segment_parameter_counts).
std::vector<std::string> describe_partition(const StagePartition& partition, const std::vector<ModelSegment>& segments,
                                            const std::vector<double>& flops,
                                            const std::vector<int64_t>& parameter_counts, int pp = 0);

}  // namespace weft
