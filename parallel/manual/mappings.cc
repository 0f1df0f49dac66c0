// Tensor- and sequence-parallel region functions (mappings.h).
#include "parallel/manual/mappings.h"

#include <string>
#include <utility>

#include "runtime/autograd/function.h"
#include "runtime/error.h"

namespace weft {
namespace {

enum class Collective { kIdentity, kAllReduce, kAllGatherSequence, kReduceScatterSequence, kSequenceChunk };

// [B, T, ...] -> [T, B, ...] contiguous: a rank's sequence chunk becomes one flat range.
Tensor sequence_first(const Tensor& x) { return x.transpose(0, 1).contiguous(); }

int64_t sequence_chunk(const Tensor& x, const TensorParallelGroup& tp) {
  WEFT_CHECK(x.dim() >= 2 && x.size(1) % tp.size() == 0, "sequence parallelism: ", x.describe(),
             " must be [B, T, ...] with T divisible by parallel.tp = ", tp.size());
  return x.size(1) / tp.size();
}

Tensor run(Collective collective, const Tensor& x, const TensorParallelGroup& tp) {
  switch (collective) {
    case Collective::kIdentity: return x;
    case Collective::kAllReduce: {
      Tensor out = x.clone();
      tp.group->all_reduce(out, Reduction::kSum, tp.stream)->wait();
      return out;
    }
    case Collective::kAllGatherSequence: {
      const Tensor local = sequence_first(x);  // [T/N, B, ...]
      Shape shape = local.shape();
      shape[0] *= tp.size();
      Tensor gathered = Tensor::empty(shape, x.dtype(), x.device());  // [T, B, ...]
      tp.group->all_gather(local.reshape({-1}), gathered.reshape({-1}), tp.stream)->wait();
      return gathered.transpose(0, 1).contiguous();
    }
    case Collective::kReduceScatterSequence: {
      const Tensor full = sequence_first(x);  // [T, B, ...]
      Shape shape = full.shape();
      shape[0] = sequence_chunk(x, tp);
      Tensor chunk = Tensor::empty(shape, x.dtype(), x.device());  // [T/N, B, ...]
      tp.group->reduce_scatter(full.reshape({-1}), chunk.reshape({-1}), Reduction::kSum, tp.stream)->wait();
      return chunk.transpose(0, 1).contiguous();
    }
    case Collective::kSequenceChunk: {
      const int64_t chunk = sequence_chunk(x, tp);
      return x.narrow(1, tp.rank() * chunk, chunk).contiguous();
    }
  }
  return x;
}

class RegionFunction final : public autograd::Function {
 public:
  RegionFunction(std::string name, Collective forward, Collective backward, TensorParallelGroup tp)
      : name_(std::move(name)), forward_(forward), backward_(backward), tp_(std::move(tp)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override { return {run(forward_, inputs[0], tp_)}; }
  // Every rank joins the collective, with zeros if no gradient reached this output.
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {run(backward_, grad_or_zeros(grads, 0), tp_)};
  }

 private:
  std::string name_;
  Collective forward_;
  Collective backward_;
  TensorParallelGroup tp_;
};

Tensor region(const char* name, Collective forward, Collective backward, const Tensor& x,
              const TensorParallelGroup& tp) {
  if (tp.size() == 1) return x;
  return autograd::apply<RegionFunction>({x}, name, forward, backward, tp)[0];
}

}  // namespace

Tensor copy_to_tensor_parallel_region(const Tensor& x, const TensorParallelGroup& tp) {
  return region("CopyToTensorParallelRegionBackward", Collective::kIdentity, Collective::kAllReduce, x, tp);
}

Tensor reduce_from_tensor_parallel_region(const Tensor& x, const TensorParallelGroup& tp) {
  return region("ReduceFromTensorParallelRegionBackward", Collective::kAllReduce, Collective::kIdentity, x, tp);
}

Tensor gather_from_sequence_parallel_region(const Tensor& x, const TensorParallelGroup& tp) {
  return region("GatherFromSequenceParallelRegionBackward", Collective::kAllGatherSequence,
                Collective::kReduceScatterSequence, x, tp);
}

Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, const TensorParallelGroup& tp) {
  return region("ReduceScatterToSequenceParallelRegionBackward", Collective::kReduceScatterSequence,
                Collective::kAllGatherSequence, x, tp);
}

Tensor scatter_to_sequence_parallel_region(const Tensor& x, const TensorParallelGroup& tp) {
  return region("ScatterToSequenceParallelRegionBackward", Collective::kSequenceChunk,
                Collective::kAllGatherSequence, x, tp);
}

}  // namespace weft
