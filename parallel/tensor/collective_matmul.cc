// The collective matmuls (see collective_matmul.h): two rings (all-gather, reduce-scatter) that
// hand each chunk to a matmul while the next one moves, and the four autograd functions built on
// them. Local math goes straight to Backend kernels (as runtime/ops/matmul.cc's linear does), so
// that chunk products are written into preallocated outputs instead of being allocated and copied.
#include "parallel/tensor/collective_matmul.h"

#include <array>
#include <functional>
#include <memory>
#include <utility>

#include "parallel/tensor/layout_transition.h"
#include "runtime/autograd/function.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/op_checks.h"
#include "runtime/ops/reduction.h"

#if WEFT_HAVE_CUDA
#include "runtime/cuda/stream.h"
#endif

namespace weft {
namespace {

// Orders tp.stream after the compute queued so far, before each collective is queued on it: on a
// CUDA comm stream other than the compute stream, an event recorded on the calling thread's current
// stream, which the comm stream waits for (what the executor does between its streams). Nothing to
// do on the CPU, where compute has finished when the calling thread queues the next collective, nor
// on the caller stream, which is the compute stream.
class CommOrder {
 public:
  CommOrder(const CommStream& stream, Device device) : stream_(stream), device_(device) {}

  void after_compute() {
#if WEFT_HAVE_CUDA
    if (!stream_.is_cuda() || !device_.is_cuda()) return;
    cuda::set_device(device_.index);
    const cudaStream_t compute = cuda::current_stream(device_.index);
    const cudaStream_t comm =
        stream_.cuda_stream() ? stream_.cuda_stream() : cuda::current_stream(stream_.cuda_device());
    if (comm == compute) return;
    // One event per op, re-recorded per collective: a wait takes the event's state when it is queued.
    if (!event_) event_ = std::make_unique<cuda::Event>(false);
    event_->record(compute);
    event_->wait(comm);
#endif
  }

 private:
  CommStream stream_;
  Device device_;
#if WEFT_HAVE_CUDA
  std::unique_ptr<cuda::Event> event_;
#endif
};

int next_rank(const TensorParallelGroup& tp) { return (tp.rank() + 1) % tp.size(); }
int previous_rank(const TensorParallelGroup& tp) { return (tp.rank() + tp.size() - 1) % tp.size(); }

// out (contiguous, new) [M, N] = a [M, K] @ b [K, N]; a and b may be transposed views.
Tensor matrix_product(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty({1, a.size(0), b.size(1)}, a.dtype(), a.device());
  backend_for(a.device()).matmul(a.unsqueeze(0), b.unsqueeze(0), out, 1.0, 0.0);
  return out.view({a.size(0), b.size(1)});
}

// out [B, M, N] (contiguous) = a [B, M, K] @ shared [K, N] (+ bias [N] when defined). a may be a
// narrowed view of a longer sequence (batch stride > M K): the backends take strided batches.
void batched_product(const Tensor& a, const Tensor& shared, const Tensor& bias, const Tensor& out) {
  Backend& backend = backend_for(a.device());
  Tensor left = a, right = shared.unsqueeze(0), result = out;
  if (a.is_contiguous()) {
    // Packed batches fold into the rows of one product: the case the CUDA bias epilogue fuses.
    left = a.view({1, a.size(0) * a.size(1), a.size(2)});
    result = out.view({1, out.size(0) * out.size(1), out.size(2)});
  } else {
    right = right.expand({a.size(0), shared.size(0), shared.size(1)});
  }
  if (bias.defined()) {
    backend.matmul_bias(left, right, bias, result);
  } else {
    backend.matmul(left, right, result, 1.0, 0.0);
  }
}

// The rows of sequence chunk `index` ([B, chunk_length, F]) of `tensor` [B, P chunk_length, F].
Tensor sequence_chunk(const Tensor& tensor, int index, int64_t chunk_length) {
  return tensor.narrow(1, index * chunk_length, chunk_length);
}

// Ring all-gather along dim 1: shard [B, Tc, F] (this rank's) into gathered [B, P Tc, F]
// (contiguous, every row written). At step k the chunk in hand is group rank (r - k) mod P's;
// while it is sent to r + 1 and r - 1's chunk arrives, use_chunk(source, chunk [B, Tc, F]
// contiguous) runs. P - 1 exchanges, each waited for before the next is queued.
void ring_all_gather(const Tensor& shard, const Tensor& gathered, const TensorParallelGroup& tp, CommOrder& order,
                     const std::function<void(int source, const Tensor& chunk)>& use_chunk) {
  const int size = tp.size(), rank = tp.rank();
  const int64_t chunk_length = shard.size(1);
  // With B == 1 a chunk's rows of `gathered` are contiguous and chunks are received in place;
  // otherwise they arrive in two alternating buffers (one being sent, one being received) and are
  // copied to their rows.
  const bool in_place = sequence_chunk(gathered, 0, chunk_length).is_contiguous();
  std::array<Tensor, 2> buffers;
  if (!in_place) {
    for (Tensor& buffer : buffers) buffer = Tensor::empty(shard.shape(), shard.dtype(), shard.device());
  }
  Tensor in_hand = shard.contiguous();  // [B, Tc, F]
  bool in_hand_in_place = false;
  for (int step = 0; step < size; ++step) {
    const int source = (rank - step + size) % size;
    CollectiveHandlePtr moving;
    Tensor arriving;
    if (step + 1 < size) {
      const int arriving_source = (source + size - 1) % size;
      arriving = in_place ? sequence_chunk(gathered, arriving_source, chunk_length) : buffers[step % 2];
      // The receive overwrites the buffer that the previous step's compute read.
      order.after_compute();
      moving = tp.group->exchange(in_hand, next_rank(tp), arriving, previous_rank(tp), tp.stream);
    }
    use_chunk(source, in_hand);
    if (!in_hand_in_place) sequence_chunk(gathered, source, chunk_length).copy_(in_hand);
    if (moving) moving->wait();
    in_hand = arriving;
    in_hand_in_place = in_place;
  }
}

// Ring reduce-scatter along dim 1 of a sum over the group whose terms this rank computes chunk by
// chunk: produce(destination, out [chunk_shape] contiguous) writes this rank's term of group rank
// `destination`'s chunk. Returns this rank's chunk of the sum (contiguous, new). At step k the
// partial sum for (r - k - 1) mod P is sent to r + 1 while the term for (r - k - 2) mod P is
// produced; the partial received from r - 1 is then added to that term, which is the next one sent.
// during_last_exchange (may be empty) runs after the last term is produced, before the last
// exchange is waited for: more compute to hide it under. P - 1 exchanges.
Tensor ring_reduce_scatter(const Shape& chunk_shape, DType dtype, Device device, const TensorParallelGroup& tp,
                           CommOrder& order, const std::function<void(int destination, const Tensor& out)>& produce,
                           const std::function<void()>& during_last_exchange) {
  const int size = tp.size(), rank = tp.rank();
  auto destination = [&](int step) { return ((rank - step - 1) % size + size) % size; };
  Backend& backend = backend_for(device);
  // Three chunk buffers: the partial being sent, the partial being received, the term being
  // produced. After each step the produced one (now a partial) is sent and the sent one is free.
  Tensor sending = Tensor::empty(chunk_shape, dtype, device);
  Tensor receiving = Tensor::empty(chunk_shape, dtype, device);
  Tensor producing = Tensor::empty(chunk_shape, dtype, device);
  produce(destination(0), sending);
  for (int step = 0; step + 1 < size; ++step) {
    // The receive overwrites the buffer that the previous step's add read.
    order.after_compute();
    CollectiveHandlePtr moving = tp.group->exchange(sending, next_rank(tp), receiving, previous_rank(tp), tp.stream);
    produce(destination(step + 1), producing);
    if (step + 2 == size && during_last_exchange) during_last_exchange();
    moving->wait();
    backend.binary(BinaryOp::kAdd, producing, receiving, producing);
    std::swap(sending, producing);
  }
  return sending;  // destination(size - 1) == rank: this rank's chunk
}

// grad_bias [N] of rows grad [R, N], or undefined without a bias.
Tensor bias_gradient(const Tensor& grad, bool has_bias) {
  return has_bias ? sum_to_shape(grad, {grad.size(-1)}) : Tensor();
}

class AllGatherLinearFunction final : public autograd::Function {
 public:
  explicit AllGatherLinearFunction(TensorParallelGroup tp) : tp_(std::move(tp)) {}
  std::string name() const override { return "AllGatherLinearBackward"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& x_shard = inputs[0];  // [B, Tc, In]
    const Tensor& weight = inputs[1];   // [N, In]
    const Tensor bias = inputs[2].defined() ? inputs[2].contiguous() : Tensor();  // [N]
    has_bias_ = bias.defined();
    const int64_t batch = x_shard.size(0), chunk_length = x_shard.size(1), in = x_shard.size(2);
    const int64_t out_features = weight.size(0), length = chunk_length * tp_.size();
    Tensor gathered = Tensor::empty({batch, length, in}, x_shard.dtype(), x_shard.device());  // [B, T, In]
    Tensor y = Tensor::empty({batch, length, out_features}, x_shard.dtype(), x_shard.device());  // [B, T, N]
    const Tensor weight_transposed = weight.transpose(0, 1);  // [In, N], read by BLAS in place
    Tensor product_buffer;  // [B, Tc, N], for B > 1 where y's chunk rows are not contiguous
    CommOrder order(tp_.stream, x_shard.device());
    ring_all_gather(x_shard, gathered, tp_, order, [&](int source, const Tensor& chunk) {
      Tensor rows = sequence_chunk(y, source, chunk_length);
      if (!rows.is_contiguous() && !product_buffer.defined()) {
        product_buffer = Tensor::empty(rows.shape(), rows.dtype(), rows.device());
      }
      const Tensor& target = rows.is_contiguous() ? rows : product_buffer;
      batched_product(chunk, weight_transposed, bias, target);
      if (!target.is_same(rows)) rows.copy_(target);
    });
    save_for_backward({gathered, weight});
    return {y};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& gathered = saved()[0];  // [B, T, In]
    const Tensor& weight = saved()[1];    // [N, In]
    const Tensor grad_y = grad_or_zeros(grads, 0).contiguous();  // [B, T, N]
    const int64_t batch = gathered.size(0), length = gathered.size(1), in = gathered.size(2);
    const int64_t out_features = weight.size(0), chunk_length = length / tp_.size();
    Tensor grad_weight, grad_bias;
    CommOrder order(tp_.stream, grad_y.device());
    Tensor grad_x = ring_reduce_scatter(
        {batch, chunk_length, in}, gathered.dtype(), gathered.device(), tp_, order,
        [&](int destination, const Tensor& out) {
          batched_product(sequence_chunk(grad_y, destination, chunk_length), weight, Tensor(), out);
        },
        [&] {
          const Tensor grad_rows = grad_y.view({-1, out_features});  // [B T, N]
          grad_weight = matrix_product(grad_rows.transpose(0, 1), gathered.view({-1, in}));
          grad_bias = bias_gradient(grad_rows, has_bias_);
        });
    return {grad_x, grad_weight, grad_bias};
  }

 private:
  TensorParallelGroup tp_;
  bool has_bias_ = false;
};

class LinearReduceScatterFunction final : public autograd::Function {
 public:
  explicit LinearReduceScatterFunction(TensorParallelGroup tp) : tp_(std::move(tp)) {}
  std::string name() const override { return "LinearReduceScatterBackward"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor x = inputs[0].contiguous();  // [B, T, Inl]
    const Tensor& weight = inputs[1];         // [N, Inl]
    const Tensor bias = inputs[2].defined() ? inputs[2].contiguous() : Tensor();  // [N]
    has_bias_ = bias.defined();
    const int64_t batch = x.size(0), chunk_length = x.size(1) / tp_.size(), out_features = weight.size(0);
    const Tensor weight_transposed = weight.transpose(0, 1);  // [Inl, N]
    CommOrder order(tp_.stream, x.device());
    Tensor y = ring_reduce_scatter(
        {batch, chunk_length, out_features}, x.dtype(), x.device(), tp_, order,
        [&](int destination, const Tensor& out) {
          // The bias is added once: to this rank's own rows, whose term is the last one produced.
          batched_product(sequence_chunk(x, destination, chunk_length), weight_transposed,
                          destination == tp_.rank() ? bias : Tensor(), out);
        },
        nullptr);
    save_for_backward({x, weight});
    return {y};  // [B, Tc, N]
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& x = saved()[0];       // [B, T, Inl]
    const Tensor& weight = saved()[1];  // [N, Inl]
    const Tensor grad_y = grad_or_zeros(grads, 0).contiguous();  // [B, Tc, N], this rank's rows
    const int64_t batch = x.size(0), length = x.size(1), in = x.size(2), out_features = weight.size(0);
    const int64_t chunk_length = length / tp_.size();
    Tensor gathered = Tensor::empty({batch, length, out_features}, grad_y.dtype(), grad_y.device());  // [B, T, N]
    Tensor grad_x = Tensor::empty({batch, length, in}, x.dtype(), x.device());                        // [B, T, Inl]
    Tensor product_buffer;  // [B, Tc, Inl], for B > 1
    CommOrder order(tp_.stream, grad_y.device());
    ring_all_gather(grad_y, gathered, tp_, order, [&](int source, const Tensor& chunk) {
      Tensor rows = sequence_chunk(grad_x, source, chunk_length);
      if (!rows.is_contiguous() && !product_buffer.defined()) {
        product_buffer = Tensor::empty(rows.shape(), rows.dtype(), rows.device());
      }
      const Tensor& target = rows.is_contiguous() ? rows : product_buffer;
      batched_product(chunk, weight, Tensor(), target);
      if (!target.is_same(rows)) rows.copy_(target);
    });
    const Tensor grad_rows = gathered.view({-1, out_features});  // [B T, N]
    Tensor grad_weight = matrix_product(grad_rows.transpose(0, 1), x.view({-1, in}));
    // A Partial gradient: only this rank's rows of y received the bias.
    Tensor grad_bias = bias_gradient(grad_y.view({-1, out_features}), has_bias_);
    return {grad_x, grad_weight, grad_bias};
  }

 private:
  TensorParallelGroup tp_;
  bool has_bias_ = false;
};

// x [..., In] as rows [R, In] (a view where x allows it) and the output shape [..., N].
std::pair<Tensor, Shape> rows_of(const Tensor& x, int64_t out_features) {
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  return {x.reshape({-1, x.size(-1)}), out_shape};
}

class ColumnParallelLinearFunction final : public autograd::Function {
 public:
  explicit ColumnParallelLinearFunction(TensorParallelGroup tp) : tp_(std::move(tp)) {}
  std::string name() const override { return "ColumnParallelLinearBackward"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& weight = inputs[1];  // [Nl, In]
    const Tensor bias = inputs[2].defined() ? inputs[2].contiguous() : Tensor();  // [Nl]
    has_bias_ = bias.defined();
    x_shape_ = inputs[0].shape();
    const auto [rows, out_shape] = rows_of(inputs[0], weight.size(0));  // [R, In], [..., Nl]
    Tensor y = Tensor::empty({rows.size(0), weight.size(0)}, rows.dtype(), rows.device());  // [R, Nl]
    batched_product(rows.unsqueeze(0), weight.transpose(0, 1), bias, y.unsqueeze(0));
    save_for_backward({rows, weight});
    return {y.view(out_shape)};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& rows = saved()[0];    // [R, In]
    const Tensor& weight = saved()[1];  // [Nl, In]
    const Tensor grad_rows = grad_or_zeros(grads, 0).reshape({-1, weight.size(0)});  // [R, Nl]
    // A partial sum over tp (each rank holds Nl of the output features): all-reduced while the
    // weight gradient is computed.
    Tensor grad_x = matrix_product(grad_rows, weight);  // [R, In]
    CommOrder order(tp_.stream, rows.device());
    order.after_compute();
    CollectiveHandlePtr reducing = tp_.group->all_reduce(grad_x, Reduction::kSum, tp_.stream);
    Tensor grad_weight = matrix_product(grad_rows.transpose(0, 1), rows);
    Tensor grad_bias = bias_gradient(grad_rows, has_bias_);
    reducing->wait();
    return {grad_x.view(x_shape_), grad_weight, grad_bias};
  }

 private:
  TensorParallelGroup tp_;
  bool has_bias_ = false;
  Shape x_shape_;
};

class RowParallelLinearFunction final : public autograd::Function {
 public:
  explicit RowParallelLinearFunction(TensorParallelGroup tp) : tp_(std::move(tp)) {}
  std::string name() const override { return "RowParallelLinearBackward"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    const Tensor& weight = inputs[1];  // [N, Inl]
    const Tensor& bias = inputs[2];    // [N]
    has_bias_ = bias.defined();
    x_shape_ = inputs[0].shape();
    const auto [rows, out_shape] = rows_of(inputs[0], weight.size(0));  // [R, Inl], [..., N]
    Tensor y = Tensor::empty({rows.size(0), weight.size(0)}, rows.dtype(), rows.device());  // [R, N]
    batched_product(rows.unsqueeze(0), weight.transpose(0, 1), Tensor(), y.unsqueeze(0));
    CommOrder order(tp_.stream, rows.device());
    order.after_compute();
    tp_.group->all_reduce(y, Reduction::kSum, tp_.stream)->wait();
    if (has_bias_) {
      // After the sum, so that the bias is counted once.
      backend_for(y.device()).binary(BinaryOp::kAdd, y, bias.view({1, bias.size(0)}).expand(y.shape()), y);
    }
    save_for_backward({rows, weight});
    return {y.view(out_shape)};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor& rows = saved()[0];    // [R, Inl]
    const Tensor& weight = saved()[1];  // [N, Inl]
    const Tensor grad_rows = grad_or_zeros(grads, 0).reshape({-1, weight.size(0)});  // [R, N]
    Tensor grad_x = matrix_product(grad_rows, weight).view(x_shape_);
    Tensor grad_weight = matrix_product(grad_rows.transpose(0, 1), rows);
    return {grad_x, grad_weight, bias_gradient(grad_rows, has_bias_)};
  }

 private:
  TensorParallelGroup tp_;
  bool has_bias_ = false;
  Shape x_shape_;
};

// What every op checks, at every tp (so a shape mistake is reported at tp = 1 too).
void check_arguments(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                     const TensorParallelGroup& tp) {
  WEFT_CHECK(tp.group != nullptr, op, ": the TensorParallelGroup has no process group");
  ops::check_floating(op, x, "input");
  ops::check_floating(op, weight, "weight");
  ops::check_compatible(op, x, "input", weight, "weight");
  ops::check_rank(op, weight, "weight", 2);
  WEFT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), op, ": input ", x.describe(), " does not match weight ",
             weight.describe(), " (expected last dim ", weight.size(1), ")");
  if (bias.defined()) {
    ops::check_compatible(op, x, "input", bias, "bias");
    ops::check_shape(op, bias, "bias", {weight.size(0)});
  }
  if (tp.size() > 1) {
    WEFT_CHECK(x.device() == tp.group->device(), op, ": input ", x.describe(), " is not on the device of tp group ",
               tp.group->describe(), " (", tp.group->device().to_string(), ")");
  }
}

// The sequence-parallel ops take [B, T, features] with the sequence in dim 1.
void check_sequence_input(const char* op, const char* role, const char* expected, const Tensor& x) {
  WEFT_CHECK(x.dim() == 3, op, ": ", role, " ", x.describe(), " must be ", expected,
             " (the sequence, split over tp, is dim 1)");
}

}  // namespace

Tensor all_gather_linear(const Tensor& x_shard, const Tensor& weight, const Tensor& bias,
                         const TensorParallelGroup& tp) {
  check_arguments("all_gather_linear", x_shard, weight, bias, tp);
  check_sequence_input("all_gather_linear", "x_shard", "[B, T / tp, in]", x_shard);
  if (tp.size() == 1) return linear(x_shard, weight, bias);
  if (tp.ring_chunks == 1) {
    // One all-gather, then one matmul; backward: one reduce-scatter of the partial input gradient.
    return linear(redistribute(x_shard, Layout::split(1), Layout::replicate(), Layout::partial(), tp), weight, bias);
  }
  return autograd::apply<AllGatherLinearFunction>({x_shard, weight, bias}, tp)[0];
}

Tensor linear_reduce_scatter(const Tensor& x, const Tensor& weight, const Tensor& bias, const TensorParallelGroup& tp) {
  check_arguments("linear_reduce_scatter", x, weight, bias, tp);
  check_sequence_input("linear_reduce_scatter", "x", "[B, T, in / tp]", x);
  WEFT_CHECK(x.size(1) % tp.size() == 0, "linear_reduce_scatter: the sequence length T = ", x.size(1), " of x ",
             x.describe(), " is not divisible by tp = ", tp.size(), " (", tp.group->describe(),
             "); each rank keeps T / tp rows of the output");
  if (tp.size() == 1) return linear(x, weight, bias);
  if (tp.ring_chunks == 1) {
    // One matmul, then one reduce-scatter; the bias added once, to this rank's rows (its gradient
    // is this rank's rows of grad_y summed: Partial, as on the ring).
    const Tensor y = redistribute(linear(x, weight), Layout::partial(), Layout::split(1), tp);
    return bias.defined() ? add(y, bias) : y;
  }
  return autograd::apply<LinearReduceScatterFunction>({x, weight, bias}, tp)[0];
}

Tensor column_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              const TensorParallelGroup& tp) {
  check_arguments("column_parallel_linear", x, weight, bias, tp);
  if (tp.size() == 1) return linear(x, weight, bias);
  return autograd::apply<ColumnParallelLinearFunction>({x, weight, bias}, tp)[0];
}

Tensor row_parallel_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const TensorParallelGroup& tp) {
  check_arguments("row_parallel_linear", x, weight, bias, tp);
  if (tp.size() == 1) return linear(x, weight, bias);
  return autograd::apply<RowParallelLinearFunction>({x, weight, bias}, tp)[0];
}

}  // namespace weft
