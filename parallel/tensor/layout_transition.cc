// Layout transitions (layout_transition.h).
#include "parallel/tensor/layout_transition.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm/stream_order.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/error.h"

namespace weft {
namespace {

enum class Transition : uint8_t { kIdentity, kAllReduce, kReduceScatter, kAllGather, kSlice };

// One transition: its layouts with split dims in [0, rank), and what it runs.
struct Plan {
  Layout from;
  Layout to;
  Transition transition;
};

// `layout` with its split dim in [0, rank). Blocks are refused here, once for every entry point.
Layout normalized(const Layout& layout, int64_t rank, const char* op) {
  WEFT_CHECK(!layout.is_split() || layout.blocks.empty(), op, ": ", layout.to_string(),
             " is a blocked split (a fused weight's layout); activations are split evenly, without blocks");
  if (!layout.is_split()) return layout.is_replicate() ? Layout::replicate() : Layout::partial();
  return Layout::split(normalize_dim(layout.dim, rank, op));
}

// The transition from `from` to `to` for a tensor of `rank` dims, or a weft::Error naming both.
Plan plan_of(const Layout& from, const Layout& to, int64_t rank, const char* op) {
  Plan plan{normalized(from, rank, op), normalized(to, rank, op), Transition::kIdentity};
  const Layout& source = plan.from;
  const Layout& target = plan.to;
  if (source == target) return plan;
  plan.transition = source.is_partial() && target.is_replicate() ? Transition::kAllReduce
                    : source.is_partial() && target.is_split()   ? Transition::kReduceScatter
                    : source.is_split() && target.is_replicate() ? Transition::kAllGather
                    : source.is_replicate() && target.is_split() ? Transition::kSlice
                                                                 : Transition::kIdentity;
  WEFT_CHECK(plan.transition != Transition::kIdentity, op, ": no transition from ", from.to_string(), " to ",
             to.to_string(), "; supported: partial -> replicate (all-reduce), partial -> split(d) (reduce-scatter), "
             "split(d) -> replicate (all-gather), replicate -> split(d) (local slice), and any layout to itself");
  return plan;
}

// Sizes before, of and after dim `dim` of `shape`, as a split along it sees them.
struct AroundDim {
  int64_t outer = 1;  // product of the sizes before `dim`
  int64_t size = 1;   // shape[dim]
  int64_t inner = 1;  // product of the sizes after `dim`
};

AroundDim around(const Shape& shape, int64_t dim) {
  AroundDim result;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    const int64_t extent = shape[static_cast<size_t>(i)];
    if (i < dim) result.outer *= extent;
    if (i == dim) result.size = extent;
    if (i > dim) result.inner *= extent;
  }
  return result;
}

void check_divisible(const Tensor& x, int64_t dim, int size, const char* op) {
  WEFT_CHECK(x.size(dim) % size == 0, op, ": cannot split dim ", dim, " of ", shape_string(x.shape()),
             " over ", size, " tensor-parallel ranks: ", x.size(dim), " is not divisible by ", size);
}

// x [outer, n, inner] (dim `dim` in the middle) -> contiguous [t, outer, n / t, inner], so that group
// rank r's slice along `dim` is the flat range [r k, (r + 1) k). No copy when x is contiguous and
// nothing precedes `dim`.
Tensor split_dim_to_front(const Tensor& x, int64_t dim, int size) {
  const AroundDim parts = around(x.shape(), dim);
  if (parts.outer == 1) return x.contiguous();
  return x.reshape({parts.outer, size, parts.size / size, parts.inner}).permute({1, 0, 2, 3}).contiguous();
}

// What a collective is given: a flat view of a contiguous tensor, with a handle of its own. A CPU
// comm thread drops its references to a collective's tensors only after wait() has returned, so it
// may hold the last one: it must never be a tensor that has (or will get) autograd history, whose
// graph can hold the last copy of the very CommStream that thread runs (a redistribute node holds tp).
Tensor flat_for_collective(const Tensor& contiguous) { return contiguous.reshape({-1}); }

Tensor all_reduce(const Tensor& x, const TensorParallelGroup& tp) {
  Tensor result = x.clone();  // all_reduce works in place, and x is the caller's
  order_after_current_stream(tp.stream);
  tp.group->all_reduce(flat_for_collective(result), Reduction::kSum, tp.stream)->wait();
  return result;
}

Tensor reduce_scatter(const Tensor& x, int64_t dim, const TensorParallelGroup& tp) {
  check_divisible(x, dim, tp.size(), "change_layout(partial -> split)");
  const Tensor front = split_dim_to_front(x, dim, tp.size());  // [t, outer, n / t, inner]
  Shape shard_shape = x.shape();
  shard_shape[static_cast<size_t>(dim)] /= tp.size();
  // This rank's chunk of `front` is [outer, n / t, inner]: the shard in its own row-major order.
  Tensor shard = Tensor::empty(shard_shape, x.dtype(), x.device());  // [..., n / t, ...]
  order_after_current_stream(tp.stream);
  tp.group->reduce_scatter(flat_for_collective(front), flat_for_collective(shard), Reduction::kSum, tp.stream)->wait();
  return shard;
}

Tensor all_gather(const Tensor& x, int64_t dim, const TensorParallelGroup& tp) {
  const int size = tp.size();
  const Tensor local = x.contiguous();  // [outer, m, inner]
  const AroundDim parts = around(local.shape(), dim);
  Shape full_shape = local.shape();
  full_shape[static_cast<size_t>(dim)] *= size;
  Tensor gathered = Tensor::empty({size * local.numel()}, local.dtype(), local.device());  // [t, outer, m, inner]
  order_after_current_stream(tp.stream);
  tp.group->all_gather(flat_for_collective(local), flat_for_collective(gathered), tp.stream)->wait();
  // Rank order along the front is rank order along `dim` once `dim` leads; otherwise move it back.
  if (parts.outer == 1) return gathered.view(full_shape);
  return gathered.view({size, parts.outer, parts.size, parts.inner}).permute({1, 0, 2, 3}).contiguous().view(full_shape);
}

Tensor slice(const Tensor& x, int64_t dim, const TensorParallelGroup& tp) {
  check_divisible(x, dim, tp.size(), "change_layout(replicate -> split)");
  const int64_t part = x.size(dim) / tp.size();
  return x.narrow(dim, tp.rank() * part, part).contiguous();
}


// The forward and backward of one redistribute, layouts already normalized and checked.
class RedistributeFunction final : public autograd::Function {
 public:
  RedistributeFunction(Layout from, Layout to, Layout gradient_arrives_as, TensorParallelGroup tp)
      : from_(std::move(from)), to_(std::move(to)), gradient_arrives_as_(std::move(gradient_arrives_as)),
        tp_(std::move(tp)) {}
  std::string name() const override {
    return "RedistributeBackward(" + from_.to_string() + " -> " + to_.to_string() + ")";
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    return {change_layout(inputs[0], from_, to_, tp_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override {
    // Zeros where no gradient arrived: the other ranks' backward runs the same collective.
    return {change_layout(grad_or_zeros(grad_outputs, 0), gradient_arrives_as_, gradient_layout_of(from_), tp_)};
  }

 private:
  Layout from_;
  Layout to_;
  Layout gradient_arrives_as_;
  TensorParallelGroup tp_;
};

}  // namespace

Tensor change_layout(const Tensor& x, const Layout& from, const Layout& to, const TensorParallelGroup& tp) {
  const Plan plan = plan_of(from, to, x.dim(), "change_layout");
  if (tp.size() == 1) return x;
  autograd::NoGradGuard no_grad;  // no history: redistribute's node is the only record
  switch (plan.transition) {
    case Transition::kIdentity: return x;
    case Transition::kAllReduce: return all_reduce(x, tp);
    case Transition::kReduceScatter: return reduce_scatter(x, plan.to.dim, tp);
    case Transition::kAllGather: return all_gather(x, plan.from.dim, tp);
    case Transition::kSlice: return slice(x, plan.to.dim, tp);
  }
  return x;
}

Layout gradient_layout_of(const Layout& layout) {
  return layout.is_split() ? layout : Layout::replicate();
}

Tensor redistribute(const Tensor& x, const Layout& from, const Layout& to, const Layout& gradient_arrives_as,
                    const TensorParallelGroup& tp) {
  const Plan forward = plan_of(from, to, x.dim(), "redistribute");
  // The gradient has the output's local shape: split exactly where the output is.
  const Layout arriving = normalized(gradient_arrives_as, x.dim(), "redistribute");
  WEFT_CHECK(arriving.is_split() == forward.to.is_split() && (!arriving.is_split() || arriving.dim == forward.to.dim),
             "redistribute: the gradient of a ", to.to_string(), " output cannot arrive as ",
             gradient_arrives_as.to_string(), " (it has the output's shape on each rank)");
  // The backward's transition, checked now rather than in the middle of a backward pass.
  const Plan backward = plan_of(arriving, gradient_layout_of(forward.from), x.dim(), "redistribute (backward)");
  if (tp.size() == 1) return x;
  if (forward.transition == Transition::kIdentity && backward.transition == Transition::kIdentity) return x;
  return autograd::apply<RedistributeFunction>({x}, forward.from, forward.to, arriving, tp)[0];
}

Tensor redistribute(const Tensor& x, const Layout& from, const Layout& to, const TensorParallelGroup& tp) {
  return redistribute(x, from, to, gradient_layout_of(to), tp);
}

}  // namespace weft
