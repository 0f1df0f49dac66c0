// The collective matmuls (parallel/tensor/collective_matmul.h) under mpirun -np 2 and -np 4.
//
// Every rank builds the same full x, weight, bias and upstream gradient (same seeds), takes its
// shards, runs the op forward and backward, and compares with linear() on the full tensors in f64
// (one rank's computation): the output (its shard or the whole), grad_x (its shard), grad_weight
// (its shard of the full gradient), grad_bias (linear_reduce_scatter's after the sum over tp). The
// tp group is the world or the tp groups of a dp x tp 2 mesh (dp 2 x tp 2 at 4 ranks); its stream
// is a CPU comm thread or the caller. Also: central finite differences of the distributed ops
// against their autograd; tp = 1 (a local group) is linear bit for bit and calls no collective;
// the rings' structure, seen through a ProcessGroup that records every call (P - 1 exchanges of
// one chunk each, to the next rank, one in flight at a time, carrying the ring's partial sums);
// T not divisible by tp is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/process_group.h"
#include "parallel/mesh.h"
#include "parallel/tensor/collective_matmul.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/autograd/node.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "runtime/ops/matmul.h"
#include "tests/support/error_expectations.h"
#include "tests/support/gradient_check.h"

namespace weft {
namespace {

using testing::relative_error;

// --- A process group that records what the ops ask of it ---------------------------------------

// Forwards every call to `inner` and records it. Exchanges keep their peers, element count, a copy
// of the values sent, and the order of their issue and of the op's wait() among all calls, so a
// test can check the ring's structure without timing anything.
class RecordingProcessGroup final : public ProcessGroup {
 public:
  struct Call {
    std::string kind;  // "exchange", "all_reduce", ...
    int send_peer = -1;
    int recv_peer = -1;
    int64_t elements = 0;     // of the tensor sent (or reduced)
    std::vector<double> sent;  // exchange: the values sent, read when it was issued
    int issued_at = -1;        // position in the event order
    int waited_at = -1;        // position of the op's wait(), -1 if never waited
    double issued_ms = -1, waited_ms = -1, start_ms = -1, end_ms = -1;
  };

  explicit RecordingProcessGroup(std::shared_ptr<ProcessGroup> inner) : inner_(std::move(inner)) {}

  int size() const override { return inner_->size(); }
  int rank() const override { return inner_->rank(); }
  const std::string& name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }

  CollectiveHandlePtr all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) override {
    return record("all_reduce", tensor, -1, -1, inner_->all_reduce(tensor, reduction, stream));
  }
  CollectiveHandlePtr reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                     const CommStream& stream) override {
    return record("reduce_scatter", input, -1, -1, inner_->reduce_scatter(input, output, reduction, stream));
  }
  CollectiveHandlePtr all_gather(const Tensor& input, const Tensor& output, const CommStream& stream) override {
    return record("all_gather", input, -1, -1, inner_->all_gather(input, output, stream));
  }
  CollectiveHandlePtr broadcast(const Tensor& tensor, int root, const CommStream& stream) override {
    return record("broadcast", tensor, -1, -1, inner_->broadcast(tensor, root, stream));
  }
  CollectiveHandlePtr send(const Tensor& tensor, int peer, const CommStream& stream) override {
    return record("send", tensor, peer, -1, inner_->send(tensor, peer, stream));
  }
  CollectiveHandlePtr recv(const Tensor& tensor, int peer, const CommStream& stream) override {
    return record("recv", tensor, -1, peer, inner_->recv(tensor, peer, stream));
  }
  CollectiveHandlePtr exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor, int recv_peer,
                               const CommStream& stream) override {
    // The values are read before the exchange is queued: what the op hands over at this step.
    std::vector<double> sent = send_tensor.to_vector();
    CollectiveHandlePtr handle = inner_->exchange(send_tensor, send_peer, recv_tensor, recv_peer, stream);
    CollectiveHandlePtr recorded = record("exchange", send_tensor, send_peer, recv_peer, handle);
    calls_.back().sent = std::move(sent);
    return recorded;
  }
  CollectiveHandlePtr barrier(const CommStream& stream) override {
    return record("barrier", Tensor(), -1, -1, inner_->barrier(stream));
  }

  std::vector<Call> calls_of(const std::string& kind) {
    finish_timings();
    std::vector<Call> selected;
    for (const Call& call : calls_) {
      if (call.kind == kind) selected.push_back(call);
    }
    return selected;
  }
  int call_count() const { return static_cast<int>(calls_.size()); }
  void clear() {
    calls_.clear();
    handles_.clear();
    next_event_ = 0;
  }

 private:
  // The handle an op gets: wait() is recorded, the rest forwards.
  class RecordingHandle final : public CollectiveHandle {
   public:
    RecordingHandle(CollectiveHandlePtr inner, RecordingProcessGroup* group, size_t call)
        : CollectiveHandle(inner->description(), inner->bytes()), inner_(std::move(inner)), group_(group),
          call_(call) {}
    void wait() override {
      group_->record_wait(call_);
      inner_->wait();
    }
    void wait(const CommStream& stream) override {
      group_->record_wait(call_);
      inner_->wait(stream);
    }
    void synchronize() override { inner_->synchronize(); }
    bool is_done() override { return inner_->is_done(); }
    double start_ms() override { return inner_->start_ms(); }
    double end_ms() override { return inner_->end_ms(); }

   private:
    CollectiveHandlePtr inner_;
    RecordingProcessGroup* group_;
    size_t call_;
  };

  CollectiveHandlePtr record(const std::string& kind, const Tensor& tensor, int send_peer, int recv_peer,
                             CollectiveHandlePtr handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    Call call;
    call.kind = kind;
    call.send_peer = send_peer;
    call.recv_peer = recv_peer;
    call.elements = tensor.defined() ? tensor.numel() : 0;
    call.issued_at = next_event_++;
    call.issued_ms = clock_ms();
    calls_.push_back(std::move(call));
    handles_.push_back(handle);
    return std::make_shared<RecordingHandle>(std::move(handle), this, calls_.size() - 1);
  }
  void record_wait(size_t call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (calls_[call].waited_at < 0) {
      calls_[call].waited_at = next_event_++;
      calls_[call].waited_ms = clock_ms();
    }
  }
  void finish_timings() {
    for (size_t i = 0; i < calls_.size(); ++i) {
      handles_[i]->synchronize();
      calls_[i].start_ms = handles_[i]->start_ms();
      calls_[i].end_ms = handles_[i]->end_ms();
    }
  }

  std::shared_ptr<ProcessGroup> inner_;
  std::mutex mutex_;
  std::vector<Call> calls_;
  std::vector<CollectiveHandlePtr> handles_;
  int next_event_ = 0;
};

// --- Data and comparisons ----------------------------------------------------------------------

// Deterministic normal values (the same on every rank), held exactly by `dtype`, as f64.
Tensor values(absl::Span<const int64_t> shape, uint64_t seed, DType dtype) {
  return Tensor::normal(shape, seed, 0, 0.0, 1.0, kFloat64).to(dtype).to(kFloat64).contiguous();
}

// A leaf of `dtype` holding `source` (a view of the full tensor, say).
Tensor leaf(const Tensor& source, DType dtype) {
  Tensor tensor = source.to(dtype).contiguous().clone();
  tensor.set_requires_grad(true);
  return tensor;
}
Tensor leaf_or_none(const Tensor& source, DType dtype, bool present) {
  return present ? leaf(source, dtype) : Tensor();
}

double tolerance(DType dtype) {
  // bf16: every output and partial sum is rounded to 8 bits of mantissa, up to tp times in a ring.
  return dtype == kFloat64 ? 1e-12 : dtype == kFloat32 ? 1e-5 : 3e-2;
}

void expect_close(const Tensor& actual, const Tensor& expected, DType dtype, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  EXPECT_LE(relative_error(actual.to(kFloat64), expected.contiguous()), tolerance(dtype))
      << what << " (" << dtype_name(dtype) << ")";
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.to_vector() == b.to_vector();
}

// One run's sizes: B, T / P (per-rank sequence rows), the input and output features of the
// rank's weight shard.
struct Sizes {
  int64_t batch = 2;
  int64_t chunk_length = 4;
  int64_t in = 6;
  int64_t out = 5;
};

const std::vector<DType> kDtypes = {kFloat64, kFloat32, kBFloat16};

// --- The fixture: the tp group and its stream ---------------------------------------------------

struct Setting {
  bool mesh;         // the tp groups of a (world / 2) x 2 mesh, else the world
  bool comm_thread;  // CommStream::cpu("tp_comm"), else the caller stream
};

std::string setting_name(const ::testing::TestParamInfo<Setting>& info) {
  return std::string(info.param.mesh ? "MeshTp" : "World") + (info.param.comm_thread ? "CommThread" : "Caller");
}

class CollectiveMatmul : public ::testing::TestWithParam<Setting> {
 protected:
  void SetUp() override {
    const int world_size = mpi_world_size();
    ASSERT_GE(world_size, 2);
    std::shared_ptr<ProcessGroup> group;
    if (GetParam().mesh) {
      ASSERT_EQ(world_size % 2, 0);
      group = make_process_group(Mesh(world_size / 2, 1, 2, world_size), Axis::kTensor, Device::cpu());
    } else {
      group = make_world_process_group(Device::cpu());
    }
    recording = std::make_shared<RecordingProcessGroup>(group);
    tp = {recording, GetParam().comm_thread ? CommStream::cpu("tp_comm") : CommStream()};
    size = tp.size();
    rank = tp.rank();
  }

  TensorParallelGroup tp;
  std::shared_ptr<RecordingProcessGroup> recording;
  int size = 1;
  int rank = 0;
};

// --- Against one rank's computation -------------------------------------------------------------

TEST_P(CollectiveMatmul, AllGatherLinearMatchesOneRank) {
  // Both forms: the ring of tp chunks (0) and one collective then one matmul (1).
  for (int chunks : {0, 1}) {
    tp.ring_chunks = chunks;
    SCOPED_TRACE(::testing::Message() << "ring_chunks " << chunks);
    for (DType dtype : kDtypes) {
      for (int64_t batch : {1, 2}) {
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " B=" << batch << (with_bias ? " bias" : " no bias"));
          const Sizes s{batch, 4, 6, 5};
          const int64_t length = s.chunk_length * size, out_full = s.out * size;
          const Tensor x_full = values({s.batch, length, s.in}, 1, dtype);
          const Tensor weight_full = values({out_full, s.in}, 2, dtype);
          const Tensor bias_full = values({out_full}, 3, dtype);
          const Tensor grad_full = values({s.batch, length, out_full}, 4, dtype);
  
          Tensor x_reference = leaf(x_full, kFloat64), weight_reference = leaf(weight_full, kFloat64);
          Tensor bias_reference = leaf_or_none(bias_full, kFloat64, with_bias);
          Tensor y_reference = linear(x_reference, weight_reference, bias_reference);
          y_reference.backward(grad_full);
  
          Tensor x = leaf(x_full.narrow(1, rank * s.chunk_length, s.chunk_length), dtype);
          Tensor weight = leaf(weight_full.narrow(0, rank * s.out, s.out), dtype);
          Tensor bias = leaf_or_none(bias_full.narrow(0, rank * s.out, s.out), dtype, with_bias);
          Tensor y = all_gather_linear(x, weight, bias, tp);
          expect_close(y, y_reference.narrow(2, rank * s.out, s.out), dtype, "y");
          y.backward(grad_full.narrow(2, rank * s.out, s.out).to(dtype).contiguous());
          expect_close(x.grad(), x_reference.grad().narrow(1, rank * s.chunk_length, s.chunk_length), dtype, "grad_x");
          expect_close(weight.grad(), weight_reference.grad().narrow(0, rank * s.out, s.out), dtype, "grad_weight");
          if (with_bias) {
            expect_close(bias.grad(), bias_reference.grad().narrow(0, rank * s.out, s.out), dtype, "grad_bias");
          }
        }
      }
    }
  }
}

TEST_P(CollectiveMatmul, LinearReduceScatterMatchesOneRank) {
  // Both forms: the ring of tp chunks (0) and one collective then one matmul (1).
  for (int chunks : {0, 1}) {
    tp.ring_chunks = chunks;
    SCOPED_TRACE(::testing::Message() << "ring_chunks " << chunks);
    for (DType dtype : kDtypes) {
      for (int64_t batch : {1, 2}) {
        for (bool with_bias : {true, false}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " B=" << batch << (with_bias ? " bias" : " no bias"));
          const Sizes s{batch, 4, 6, 5};
          const int64_t length = s.chunk_length * size, in_full = s.in * size;
          const Tensor x_full = values({s.batch, length, in_full}, 11, dtype);
          const Tensor weight_full = values({s.out, in_full}, 12, dtype);
          const Tensor bias_full = values({s.out}, 13, dtype);
          const Tensor grad_full = values({s.batch, length, s.out}, 14, dtype);
  
          Tensor x_reference = leaf(x_full, kFloat64), weight_reference = leaf(weight_full, kFloat64);
          Tensor bias_reference = leaf_or_none(bias_full, kFloat64, with_bias);
          Tensor y_reference = linear(x_reference, weight_reference, bias_reference);
          y_reference.backward(grad_full);
  
          Tensor x = leaf(x_full.narrow(2, rank * s.in, s.in), dtype);
          Tensor weight = leaf(weight_full.narrow(1, rank * s.in, s.in), dtype);
          Tensor bias = leaf_or_none(bias_full, dtype, with_bias);
          Tensor y = linear_reduce_scatter(x, weight, bias, tp);
          expect_close(y, y_reference.narrow(1, rank * s.chunk_length, s.chunk_length), dtype, "y");
          y.backward(grad_full.narrow(1, rank * s.chunk_length, s.chunk_length).to(dtype).contiguous());
          expect_close(x.grad(), x_reference.grad().narrow(2, rank * s.in, s.in), dtype, "grad_x");
          expect_close(weight.grad(), weight_reference.grad().narrow(1, rank * s.in, s.in), dtype, "grad_weight");
          if (with_bias) {
            // Partial over tp: this rank's rows only; the sum over tp is the full gradient.
            Tensor grad_bias = bias.grad().contiguous().clone();
            tp.group->all_reduce(grad_bias, Reduction::kSum, CommStream())->wait();
            expect_close(grad_bias, bias_reference.grad(), dtype, "grad_bias summed over tp");
          }
        }
      }
    }
  }
}

TEST_P(CollectiveMatmul, ColumnParallelLinearMatchesOneRank) {
  for (DType dtype : kDtypes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (with_bias ? " bias" : " no bias"));
      const Sizes s;
      const int64_t length = 3, out_full = s.out * size;  // any sequence length: nothing is split along it
      const Tensor x_full = values({s.batch, length, s.in}, 21, dtype);
      const Tensor weight_full = values({out_full, s.in}, 22, dtype);
      const Tensor bias_full = values({out_full}, 23, dtype);
      const Tensor grad_full = values({s.batch, length, out_full}, 24, dtype);

      Tensor x_reference = leaf(x_full, kFloat64), weight_reference = leaf(weight_full, kFloat64);
      Tensor bias_reference = leaf_or_none(bias_full, kFloat64, with_bias);
      Tensor y_reference = linear(x_reference, weight_reference, bias_reference);
      y_reference.backward(grad_full);

      Tensor x = leaf(x_full, dtype);
      Tensor weight = leaf(weight_full.narrow(0, rank * s.out, s.out), dtype);
      Tensor bias = leaf_or_none(bias_full.narrow(0, rank * s.out, s.out), dtype, with_bias);
      Tensor y = column_parallel_linear(x, weight, bias, tp);
      expect_close(y, y_reference.narrow(2, rank * s.out, s.out), dtype, "y");
      y.backward(grad_full.narrow(2, rank * s.out, s.out).to(dtype).contiguous());
      expect_close(x.grad(), x_reference.grad(), dtype, "grad_x (all-reduced)");
      expect_close(weight.grad(), weight_reference.grad().narrow(0, rank * s.out, s.out), dtype, "grad_weight");
      if (with_bias) {
        expect_close(bias.grad(), bias_reference.grad().narrow(0, rank * s.out, s.out), dtype, "grad_bias");
      }
    }
  }
}

TEST_P(CollectiveMatmul, RowParallelLinearMatchesOneRank) {
  for (DType dtype : kDtypes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (with_bias ? " bias" : " no bias"));
      const Sizes s;
      const int64_t length = 3, in_full = s.in * size;
      const Tensor x_full = values({s.batch, length, in_full}, 31, dtype);
      const Tensor weight_full = values({s.out, in_full}, 32, dtype);
      const Tensor bias_full = values({s.out}, 33, dtype);
      const Tensor grad_full = values({s.batch, length, s.out}, 34, dtype);

      Tensor x_reference = leaf(x_full, kFloat64), weight_reference = leaf(weight_full, kFloat64);
      Tensor bias_reference = leaf_or_none(bias_full, kFloat64, with_bias);
      Tensor y_reference = linear(x_reference, weight_reference, bias_reference);
      y_reference.backward(grad_full);

      Tensor x = leaf(x_full.narrow(2, rank * s.in, s.in), dtype);
      Tensor weight = leaf(weight_full.narrow(1, rank * s.in, s.in), dtype);
      Tensor bias = leaf_or_none(bias_full, dtype, with_bias);
      Tensor y = row_parallel_linear(x, weight, bias, tp);
      expect_close(y, y_reference, dtype, "y (replicated)");
      y.backward(grad_full.to(dtype).contiguous());
      expect_close(x.grad(), x_reference.grad().narrow(2, rank * s.in, s.in), dtype, "grad_x");
      expect_close(weight.grad(), weight_reference.grad().narrow(1, rank * s.in, s.in), dtype, "grad_weight");
      if (with_bias) expect_close(bias.grad(), bias_reference.grad(), dtype, "grad_bias (replicated)");
    }
  }
}

// --- Finite differences -------------------------------------------------------------------------

// Central differences of the global loss L = sum over tp ranks of sum(y_r * G_r) against autograd,
// in f64. Each input element of each rank is perturbed alone (one owner rank at a time; the other
// ranks run the op unperturbed), since rank q's input reaches every rank's output.
using ShardedOp = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const TensorParallelGroup&)>;

void expect_finite_differences_match(const ShardedOp& op, const std::vector<Tensor>& inputs, const Tensor& grad_y,
                                     const TensorParallelGroup& tp) {
  auto global_loss = [&] {
    autograd::NoGradGuard no_grad;
    const std::vector<double> y_values = op(inputs[0], inputs[1], inputs[2], tp).to_vector();
    const std::vector<double> weights = grad_y.to_vector();
    double local = 0;
    for (size_t i = 0; i < y_values.size(); ++i) local += y_values[i] * weights[i];
    Tensor loss = Tensor::full({1}, local, kFloat64);
    tp.group->all_reduce(loss, Reduction::kSum, CommStream())->wait();
    return loss.item();
  };
  std::vector<Tensor> leaves = inputs;  // aliases: a perturbation of a leaf is seen by global_loss
  for (Tensor& tensor : leaves) tensor.set_requires_grad(true);
  op(leaves[0], leaves[1], leaves[2], tp).backward(grad_y);

  const double step = 1e-6;
  for (size_t k = 0; k < leaves.size(); ++k) {
    const Tensor analytic = leaves[k].grad().contiguous();
    ASSERT_TRUE(analytic.defined()) << "input " << k << " received no gradient";
    double* data = leaves[k].data<double>();
    for (int owner = 0; owner < tp.size(); ++owner) {
      for (int64_t i = 0; i < leaves[k].numel(); ++i) {
        const bool mine = owner == tp.rank();
        const double original = data[i];
        if (mine) data[i] = original + step;
        const double plus = global_loss();
        if (mine) data[i] = original - step;
        const double minus = global_loss();
        data[i] = original;
        if (!mine) continue;
        const double numeric = (plus - minus) / (2 * step);
        const double got = analytic.data<double>()[i];
        EXPECT_NEAR(got, numeric, 1e-6 + 1e-5 * std::fabs(numeric))
            << "input " << k << " " << leaves[k].describe() << " element " << i;
      }
    }
  }
}

TEST_P(CollectiveMatmul, AllGatherLinearGradientsMatchFiniteDifferences) {
  // Both forms: the ring of tp chunks (0) and one collective then one matmul (1).
  for (int chunks : {0, 1}) {
    tp.ring_chunks = chunks;
    SCOPED_TRACE(::testing::Message() << "ring_chunks " << chunks);
    const int64_t batch = 2, chunk_length = 2, in = 3, out = 2;
    std::vector<Tensor> inputs = {Tensor::normal({batch, chunk_length, in}, 40 + rank, 0, 0, 1, kFloat64),
                                  Tensor::normal({out, in}, 50 + rank, 0, 0, 1, kFloat64),
                                  Tensor::normal({out}, 60 + rank, 0, 0, 1, kFloat64)};
    const Tensor grad_y = Tensor::normal({batch, chunk_length * size, out}, 70 + rank, 0, 0, 1, kFloat64);
    expect_finite_differences_match(all_gather_linear, inputs, grad_y, tp);
  }
}

TEST_P(CollectiveMatmul, LinearReduceScatterGradientsMatchFiniteDifferences) {
  // Both forms: the ring of tp chunks (0) and one collective then one matmul (1).
  for (int chunks : {0, 1}) {
    tp.ring_chunks = chunks;
    SCOPED_TRACE(::testing::Message() << "ring_chunks " << chunks);
    const int64_t batch = 2, chunk_length = 2, in = 3, out = 2;
    std::vector<Tensor> inputs = {Tensor::normal({batch, chunk_length * size, in}, 40 + rank, 0, 0, 1, kFloat64),
                                  Tensor::normal({out, in}, 50 + rank, 0, 0, 1, kFloat64),
                                  Tensor::normal({out}, 60, 0, 0, 1, kFloat64)};
    const Tensor grad_y = Tensor::normal({batch, chunk_length, out}, 70 + rank, 0, 0, 1, kFloat64);
    // The bias is replicated, so a perturbation of one rank's copy is what the Partial gradient of
    // that rank measures.
    expect_finite_differences_match(linear_reduce_scatter, inputs, grad_y, tp);
  }
}

// --- The rings' structure -----------------------------------------------------------------------

// The exchanges of one ring: P - 1 of them, each of `elements`, to the next rank and from the
// previous one, issued only after the previous one was waited for and waited for before the next
// (one chunk in flight while the op computes the next), with nothing else on the group.
void expect_ring(RecordingProcessGroup& group, int64_t elements, const std::string& what) {
  const std::vector<RecordingProcessGroup::Call> exchanges = group.calls_of("exchange");
  const int size = group.size(), rank = group.rank();
  EXPECT_EQ(group.call_count(), size - 1) << what << ": every call is a ring exchange";
  ASSERT_EQ(static_cast<int>(exchanges.size()), size - 1) << what;
  for (int step = 0; step < size - 1; ++step) {
    const auto& call = exchanges[static_cast<size_t>(step)];
    EXPECT_EQ(call.send_peer, (rank + 1) % size) << what << " step " << step;
    EXPECT_EQ(call.recv_peer, (rank + size - 1) % size) << what << " step " << step;
    EXPECT_EQ(call.elements, elements) << what << " step " << step << ": one chunk";
    EXPECT_GT(call.waited_at, call.issued_at) << what << " step " << step;
    if (step > 0) {
      EXPECT_GT(call.issued_at, exchanges[static_cast<size_t>(step - 1)].waited_at) << what << " step " << step;
    }
  }
}

// Whether `sent` holds `expected`'s values (f64 rounding aside).
void expect_sent(const std::vector<double>& sent, const Tensor& expected, const std::string& what) {
  const std::vector<double> values = expected.contiguous().to_vector();
  ASSERT_EQ(sent.size(), values.size()) << what;
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < sent.size(); ++i) {
    worst = std::max(worst, std::fabs(sent[i] - values[i]));
    scale = std::max(scale, std::fabs(values[i]));
  }
  EXPECT_LE(worst / scale, 1e-12) << what;
}

TEST_P(CollectiveMatmul, AllGatherLinearIsARingOfChunkSteps) {
  const Sizes s;
  const int64_t length = s.chunk_length * size, out_full = s.out * size, c = s.chunk_length;
  const Tensor x_full = values({s.batch, length, s.in}, 1, kFloat64);
  const Tensor weight_full = values({out_full, s.in}, 2, kFloat64);
  const Tensor grad_full = values({s.batch, length, out_full}, 4, kFloat64);
  Tensor x = leaf(x_full.narrow(1, rank * c, c), kFloat64);
  Tensor weight = leaf(weight_full.narrow(0, rank * s.out, s.out), kFloat64);
  const Tensor bias = leaf(values({s.out}, 3, kFloat64), kFloat64);

  recording->clear();
  Tensor y = all_gather_linear(x, weight, bias, tp);
  expect_ring(*recording, s.batch * c * s.in, "forward (all-gather of x)");
  // At step k the chunk in hand is rank (r - k)'s: the one received at the step before, forwarded.
  const auto forward = recording->calls_of("exchange");
  for (int step = 0; step < static_cast<int>(forward.size()); ++step) {
    const int source = (rank - step + size) % size;
    expect_sent(forward[static_cast<size_t>(step)].sent, x_full.narrow(1, source * c, c),
                "forward step " + std::to_string(step));
  }

  recording->clear();
  y.backward(grad_full.narrow(2, rank * s.out, s.out).contiguous());
  expect_ring(*recording, s.batch * c * s.in, "backward (reduce-scatter of grad_x)");
  // At step k rank r sends the partial grad_x for rank d = (r - k - 1): the terms of ranks r, r - 1,
  // ..., r - k, one more rank's term per step (rank q's term: its grad_y columns' rows d, times its W).
  const auto backward = recording->calls_of("exchange");
  for (int step = 0; step < static_cast<int>(backward.size()); ++step) {
    const int destination = ((rank - step - 1) % size + size) % size;
    Tensor partial = Tensor::zeros({s.batch, c, s.in}, kFloat64);
    for (int j = 0; j <= step; ++j) {
      const int q = ((rank - j) % size + size) % size;
      const Tensor grad_rows = grad_full.narrow(1, destination * c, c).narrow(2, q * s.out, s.out);
      partial = partial + matmul(grad_rows, weight_full.narrow(0, q * s.out, s.out));
    }
    expect_sent(backward[static_cast<size_t>(step)].sent, partial, "backward step " + std::to_string(step));
  }
}

TEST_P(CollectiveMatmul, LinearReduceScatterIsARingOfChunkSteps) {
  const Sizes s;
  const int64_t length = s.chunk_length * size, in_full = s.in * size, c = s.chunk_length;
  const Tensor x_full = values({s.batch, length, in_full}, 11, kFloat64);
  const Tensor weight_full = values({s.out, in_full}, 12, kFloat64);
  const Tensor grad_full = values({s.batch, length, s.out}, 14, kFloat64);
  Tensor x = leaf(x_full.narrow(2, rank * s.in, s.in), kFloat64);
  Tensor weight = leaf(weight_full.narrow(1, rank * s.in, s.in), kFloat64);
  const Tensor bias = leaf(values({s.out}, 13, kFloat64), kFloat64);

  recording->clear();
  Tensor y = linear_reduce_scatter(x, weight, bias, tp);
  expect_ring(*recording, s.batch * c * s.out, "forward (reduce-scatter of x W^T)");
  // The partial for rank d = (r - k - 1) holds the terms of ranks r, ..., r - k (no bias: it is
  // added to the owner's own term, which is never sent).
  const auto forward = recording->calls_of("exchange");
  for (int step = 0; step < static_cast<int>(forward.size()); ++step) {
    const int destination = ((rank - step - 1) % size + size) % size;
    Tensor partial = Tensor::zeros({s.batch, c, s.out}, kFloat64);
    for (int j = 0; j <= step; ++j) {
      const int q = ((rank - j) % size + size) % size;
      partial = partial + linear(x_full.narrow(1, destination * c, c).narrow(2, q * s.in, s.in),
                                 weight_full.narrow(1, q * s.in, s.in));
    }
    expect_sent(forward[static_cast<size_t>(step)].sent, partial, "forward step " + std::to_string(step));
  }

  recording->clear();
  y.backward(grad_full.narrow(1, rank * c, c).contiguous());
  expect_ring(*recording, s.batch * c * s.out, "backward (all-gather of grad_y)");
  const auto backward = recording->calls_of("exchange");
  for (int step = 0; step < static_cast<int>(backward.size()); ++step) {
    const int source = (rank - step + size) % size;
    expect_sent(backward[static_cast<size_t>(step)].sent, grad_full.narrow(1, source * c, c),
                "backward step " + std::to_string(step));
  }
}

TEST_P(CollectiveMatmul, OneChunkRunsOneCollectiveEachWay) {
  const int64_t batch = 2, chunk_length = 2, in = 3, out = 2;
  tp.ring_chunks = 1;
  Tensor x = leaf(values({batch, chunk_length, in}, 31, kFloat64), kFloat64);
  Tensor weight = leaf(values({out, in}, 32, kFloat64), kFloat64);
  recording->clear();
  Tensor y = all_gather_linear(x, weight, Tensor(), tp);
  ASSERT_EQ(recording->call_count(), 1);
  EXPECT_EQ(recording->calls_of("all_gather").size(), 1u) << "forward: one all-gather of x";
  recording->clear();
  y.backward(values({batch, chunk_length * size, out}, 33, kFloat64));
  ASSERT_EQ(recording->call_count(), 1);
  EXPECT_EQ(recording->calls_of("reduce_scatter").size(), 1u) << "backward: one reduce-scatter of grad_x";

  Tensor wide = leaf(values({batch, chunk_length * size, in}, 34, kFloat64), kFloat64);
  recording->clear();
  Tensor z = linear_reduce_scatter(wide, weight, Tensor(), tp);
  ASSERT_EQ(recording->call_count(), 1);
  EXPECT_EQ(recording->calls_of("reduce_scatter").size(), 1u) << "forward: one reduce-scatter of x W^T";
  recording->clear();
  z.backward(values({batch, chunk_length, out}, 35, kFloat64));
  ASSERT_EQ(recording->call_count(), 1);
  EXPECT_EQ(recording->calls_of("all_gather").size(), 1u) << "backward: one all-gather of grad_y";
}

TEST_P(CollectiveMatmul, UnsplitLinearsRunOneAllReduceEach) {
  const Sizes s;
  Tensor x = leaf(values({s.batch, 3, s.in}, 21, kFloat64), kFloat64);
  Tensor weight = leaf(values({s.out, s.in}, 22, kFloat64), kFloat64);
  Tensor bias = leaf(values({s.out}, 23, kFloat64), kFloat64);

  recording->clear();
  Tensor y = column_parallel_linear(x, weight, bias, tp);
  EXPECT_EQ(recording->call_count(), 0) << "column_parallel_linear's forward is local";
  y.backward(values({s.batch, 3, s.out}, 24, kFloat64));
  ASSERT_EQ(recording->call_count(), 1);
  EXPECT_EQ(recording->calls_of("all_reduce").at(0).elements, s.batch * 3 * s.in) << "grad_x's all-reduce";

  recording->clear();
  Tensor z = row_parallel_linear(x.detach().narrow(2, 0, 4).contiguous().set_requires_grad(true),
                                 leaf(values({s.out, 4}, 25, kFloat64), kFloat64), bias, tp);
  ASSERT_EQ(recording->call_count(), 1);
  EXPECT_EQ(recording->calls_of("all_reduce").at(0).elements, s.batch * 3 * s.out) << "y's all-reduce";
  recording->clear();
  z.backward(values({s.batch, 3, s.out}, 26, kFloat64));
  EXPECT_EQ(recording->call_count(), 0) << "row_parallel_linear's backward is local";
}

// The pipelining in time, printed (not asserted: it depends on the machine's load): how much of
// each exchange ran between its issue and the op's wait for it, i.e. under the chunk's matmul.
TEST_P(CollectiveMatmul, ReportsHowMuchOfEachExchangeRanUnderCompute) {
  if (!GetParam().comm_thread) GTEST_SKIP() << "the caller stream runs each exchange in line";
  const int64_t batch = 1, chunk_length = 256, in = 512, out = 512;
  const Tensor x = Tensor::normal({batch, chunk_length, in}, 80, 0, 0, 1, kFloat32);
  const Tensor weight = Tensor::normal({out, in}, 81, 0, 0, 0.05, kFloat32);
  all_gather_linear(x, weight, Tensor(), tp);  // warm-up: communicators, BLAS threads
  recording->clear();
  all_gather_linear(x, weight, Tensor(), tp);
  double exchange_ms = 0, hidden_ms = 0;
  for (const auto& call : recording->calls_of("exchange")) {
    ASSERT_GE(call.start_ms, 0.0);
    exchange_ms += call.end_ms - call.start_ms;
    hidden_ms += std::max(0.0, std::min(call.end_ms, call.waited_ms) - std::max(call.start_ms, call.issued_ms));
  }
  if (mpi_world_rank() == 0) {
    std::printf("all_gather_linear [1, %lld, %d] x [%d, %d] at tp %d: %d exchanges, %.3f ms, %.3f ms of it "
                "before the op waited (under the chunk matmuls)\n",
                static_cast<long long>(chunk_length * size), static_cast<int>(in), static_cast<int>(out),
                static_cast<int>(in), size, size - 1, exchange_ms, hidden_ms);
  }
}

// --- Errors -------------------------------------------------------------------------------------

TEST_P(CollectiveMatmul, SequenceNotDivisibleByTpIsAClearError) {
  const int64_t length = 4 * size + 1;
  const Tensor x = Tensor::zeros({2, length, 6});
  const Tensor weight = Tensor::zeros({5, 6});
  const std::string message = testing::error_message([&] { linear_reduce_scatter(x, weight, Tensor(), tp); });
  testing::expect_contains(message, {"linear_reduce_scatter", "T = " + std::to_string(length),
                                     "f32[2, " + std::to_string(length) + ", 6] cpu",
                                     "tp = " + std::to_string(size)});
  const std::string rank_message = testing::error_message([&] { all_gather_linear(weight, weight, Tensor(), tp); });
  testing::expect_contains(rank_message, {"all_gather_linear", "f32[5, 6] cpu", "[B, T / tp, in]"});
  EXPECT_EQ(recording->call_count(), 0) << "nothing was sent before the checks";
}

INSTANTIATE_TEST_SUITE_P(Groups, CollectiveMatmul,
                         ::testing::Values(Setting{false, true}, Setting{false, false}, Setting{true, true},
                                         Setting{true, false}),
                         setting_name);

// --- tp = 1 -------------------------------------------------------------------------------------

TEST(CollectiveMatmulTpOne, EveryOpIsLinearBitForBit) {
  auto recording = std::make_shared<RecordingProcessGroup>(make_local_process_group(Device::cpu()));
  const TensorParallelGroup tp{recording, CommStream::cpu("tp_comm")};
  using Op = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const TensorParallelGroup&);
  const std::vector<std::pair<const char*, Op>> ops = {{"all_gather_linear", all_gather_linear},
                                                       {"linear_reduce_scatter", linear_reduce_scatter},
                                                       {"column_parallel_linear", column_parallel_linear},
                                                       {"row_parallel_linear", row_parallel_linear}};
  for (const auto& [name, op] : ops) {
    for (DType dtype : {kFloat32, kBFloat16, kFloat64}) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(::testing::Message() << name << " " << dtype_name(dtype) << (with_bias ? " bias" : ""));
        const Tensor x_values = values({2, 8, 6}, 90, dtype), weight_values = values({5, 6}, 91, dtype);
        const Tensor bias_values = values({5}, 92, dtype), grad = values({2, 8, 5}, 93, dtype).to(dtype);
        Tensor x = leaf(x_values, dtype), weight = leaf(weight_values, dtype);
        Tensor bias = leaf_or_none(bias_values, dtype, with_bias);
        Tensor x_linear = leaf(x_values, dtype), weight_linear = leaf(weight_values, dtype);
        Tensor bias_linear = leaf_or_none(bias_values, dtype, with_bias);

        Tensor y = op(x, weight, bias, tp);
        Tensor y_linear = linear(x_linear, weight_linear, bias_linear);
        EXPECT_EQ(y.grad_fn()->name(), y_linear.grad_fn()->name()) << "the same autograd op as linear";
        EXPECT_TRUE(bitwise_equal(y, y_linear));
        y.backward(grad);
        y_linear.backward(grad);
        EXPECT_TRUE(bitwise_equal(x.grad(), x_linear.grad()));
        EXPECT_TRUE(bitwise_equal(weight.grad(), weight_linear.grad()));
        if (with_bias) EXPECT_TRUE(bitwise_equal(bias.grad(), bias_linear.grad()));
      }
    }
  }
  EXPECT_EQ(recording->call_count(), 0) << "tp = 1 calls no collective";
}

}  // namespace
}  // namespace weft
