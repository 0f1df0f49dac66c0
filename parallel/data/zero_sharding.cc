// ZeroSharding (zero_sharding.h).
#include "parallel/data/zero_sharding.h"

#include "parallel/pipeline/pipeline_stage.h"

#include <algorithm>
#include <cmath>

#include "parallel/tensor/tensor_parallel_norm.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/reduction.h"

namespace weft {

ZeroSharding::ZeroSharding(int64_t stage, const GradientBuffer& buffer, std::shared_ptr<ProcessGroup> group)
    : stage_(stage), buffer_(buffer), group_(std::move(group)) {
  WEFT_CHECK(stage == 1 || stage == 2, "ZeRO sharding: stage ", stage, " is not 1 or 2");
  const std::vector<GradientBuffer::Bucket>& buckets = buffer_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b) {
    WEFT_CHECK(buckets[b].padded_elements % group_->size() == 0, "ZeRO sharding: bucket ", b, " has ",
               buckets[b].padded_elements, " elements, not a multiple of the ", group_->size(), " dp ranks");
    shard_offsets_.push_back(shard_elements_);
    shard_elements_ += chunk_elements(b);
  }
  int64_t offset = 0;
  for (const NamedParameter& parameter : buffer_.parameters()) {
    flat_offsets_.push_back(offset);
    offset += parameter.tensor.numel();
  }
  const Device device = buffer_.device();
  shard_parameters_ = Tensor::zeros({shard_elements_}, kFloat32, device);
  shard_gradients_ = Tensor::zeros({shard_elements_}, buffer_.dtype(), device);
  autograd::NoGradGuard no_grad;
  pieces_of_bucket_.resize(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    gathered_.push_back(Tensor::zeros({buckets[b].padded_elements}, kFloat32, device));
    const int64_t chunk_start = chunk_begin(b);
    const int64_t chunk_end = chunk_start + chunk_elements(b);
    for (const GradientBuffer::Slot& slot : buckets[b].slots) {
      const int64_t begin = std::max(slot.offset, chunk_start);
      const int64_t end = std::min(slot.offset + slot.elements, chunk_end);
      if (begin >= end) continue;
      Piece piece{slot.parameter, begin - slot.offset, shard_offsets_[b] + (begin - chunk_start), end - begin};
      Tensor view = shard_parameters_.narrow(0, piece.shard_start, piece.count);
      view.set_requires_grad(true);
      view.set_grad(shard_gradients_.narrow(0, piece.shard_start, piece.count));
      const NamedParameter& parameter = buffer_.parameters()[slot.parameter];
      shard_views_.push_back({str(parameter.name, "[", piece.parameter_start, ":", piece.parameter_start + piece.count,
                                  "]"),
                              view, parameter.layout});
      pieces_of_bucket_[b].push_back(pieces_.size());
      pieces_.push_back(piece);
    }
  }
  load_shard_from_parameters();  // the shard starts from the parameters, widened to f32
}

int64_t ZeroSharding::chunk_elements(size_t bucket) const {
  return buffer_.buckets()[bucket].padded_elements / group_->size();
}

int64_t ZeroSharding::flat_elements() const {
  const int64_t ranks = group_->size();
  const int64_t used = flat_offsets_.back() + buffer_.parameters().back().tensor.numel();
  return (used + ranks - 1) / ranks * ranks;
}

void ZeroSharding::load_shard_from_parameters() {
  autograd::NoGradGuard no_grad;
  for (const Piece& piece : pieces_) {
    shard_parameters_.narrow(0, piece.shard_start, piece.count)
        .copy_(buffer_.parameters()[piece.parameter].tensor.reshape({-1}).narrow(0, piece.parameter_start,
                                                                                 piece.count));
  }
}

std::unique_ptr<Optimizer> ZeroSharding::make_optimizer(
    const std::function<std::unique_ptr<Optimizer>(std::vector<ParameterGroup>)>& make, double weight_decay) {
  // The decay group follows the model parameter a piece comes from (a matrix's piece is 1-D too).
  ParameterGroup decayed{{}, weight_decay}, plain{{}, 0.0};
  for (size_t k = 0; k < pieces_.size(); ++k) {
    (buffer_.parameters()[pieces_[k].parameter].tensor.dim() >= 2 ? decayed : plain)
        .parameters.push_back(shard_views_[k]);
  }
  std::vector<ParameterGroup> groups;
  for (ParameterGroup* group : {&decayed, &plain}) {
    if (!group->parameters.empty()) groups.push_back(std::move(*group));
  }
  WEFT_CHECK(!groups.empty(), "ZeRO sharding: dp rank ", group_->rank(), " owns no parameters (the model has ",
             flat_elements(), " elements for ", group_->size(), " ranks); use fewer dp ranks or parallel.zero: 0");
  return make(std::move(groups));
}

CollectiveHandlePtr ZeroSharding::reduce_bucket(size_t bucket, const CommStream& stream) {
  autograd::NoGradGuard no_grad;
  const Tensor& data = buffer_.buckets()[bucket].data;
  Tensor shard = shard_gradients_.narrow(0, shard_offsets_[bucket], chunk_elements(bucket));
  if (stage_ == 2) return group_->reduce_scatter(data, shard, Reduction::kAverage, stream);
  CollectiveHandlePtr handle = group_->all_reduce(data, Reduction::kAverage, stream);
  handle->wait();  // orders the copy after the collective (CPU: done already; CUDA: same stream)
  shard.copy_(data.narrow(0, chunk_begin(bucket), chunk_elements(bucket)));
  return handle;
}

CollectiveHandlePtr ZeroSharding::gather_bucket(size_t bucket, const CommStream& stream) {
  autograd::NoGradGuard no_grad;
  CollectiveHandlePtr handle = group_->all_gather(
      shard_parameters_.narrow(0, shard_offsets_[bucket], chunk_elements(bucket)), gathered_[bucket], stream);
  handle->wait();
  for (const GradientBuffer::Slot& slot : buffer_.buckets()[bucket].slots) {
    Tensor parameter = buffer_.parameters()[slot.parameter].tensor;
    parameter.copy_(gathered_[bucket].narrow(0, slot.offset, slot.elements).view(parameter.shape()));
  }
  return handle;
}

void ZeroSharding::make_piece_views() {
  piece_gradients_.clear();
  for (const Piece& piece : pieces_) piece_gradients_.push_back(shard_gradients_.narrow(0, piece.shard_start, piece.count));
}

Tensor ZeroSharding::piece_mask(const std::function<double(size_t parameter)>& value) const {
  std::vector<double> mask;
  for (const Piece& piece : pieces_) mask.push_back(value(piece.parameter));
  return Tensor::from_vector(absl::Span<const double>(mask), {static_cast<int64_t>(mask.size())},
                             accumulation_dtype(buffer_.device()))
      .to(buffer_.device());
}

void ZeroSharding::set_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  tp_ = std::move(tp);
  // The piece views and their mask, made once: clip_gradients runs every step.
  make_piece_views();
  piece_split_ = piece_mask([this](size_t parameter) { return buffer_.parameters()[parameter].layout.is_split() ? 1.0 : 0.0; });
}

void ZeroSharding::set_pipeline(std::shared_ptr<PipelineStage> pipeline, const std::vector<double>& counted) {
  pipeline_ = std::move(pipeline);
  make_piece_views();
  piece_counted_ = piece_mask([&counted](size_t parameter) { return counted[parameter]; });
}

Tensor ZeroSharding::clip_gradients(double max_norm, const CommStream& stream) {
  autograd::NoGradGuard no_grad;
  const Device device = buffer_.device();
  // Each rank's shard holds distinct elements (padding is zero): the squares add up across ranks.
  Tensor squares = Tensor::empty({1}, accumulation_dtype(device), device);
  const bool tensor_parallel = tp_ != nullptr && tp_->size() > 1;
  if (!tensor_parallel && pipeline_ == nullptr) {
    backend_for(device).squared_norms({shard_gradients_}, squares);
  } else {
    Tensor per_piece = Tensor::empty({static_cast<int64_t>(piece_gradients_.size())}, accumulation_dtype(device), device);
    backend_for(device).squared_norms(piece_gradients_, per_piece);
    if (tensor_parallel) {
      // Per piece: a split parameter's squares are its tp shard's (summed over tp), a replicated
      // one's are the same on every tp rank (counted once).
      Tensor summed = per_piece.clone();
      tp_->group->all_reduce(summed, Reduction::kSum, tp_->stream)->wait();
      per_piece = squares_over_tensor_parallel_group(per_piece, summed, piece_split_);
    }
    if (pipeline_ != nullptr) per_piece = mul(per_piece, piece_counted_);
    squares.copy_(sum(per_piece).reshape({1}));
  }
  group_->all_reduce(squares, Reduction::kSum, stream)->wait();
  if (pipeline_ != nullptr) pipeline_->sum_over_stages(squares);
  // In place on the shard buffer, which every shard view's .grad aliases.
  backend_for(device).clip_to_norm({shard_gradients_}, squares, max_norm);
  return squares;
}

std::map<std::string, Tensor> ZeroSharding::gather_optimizer_state(const Optimizer& optimizer,
                                                                   const CommStream& stream) {
  std::map<std::string, Tensor> state = optimizer.state_dict();
  autograd::NoGradGuard no_grad;
  const Device device = buffer_.device();
  // Every floating per-piece state ("<piece>.<kind>") becomes one shard tensor per kind.
  std::map<std::string, Tensor> shards;  // kind -> [shard_elements_] f32
  int64_t step_count = 0;
  for (size_t k = 0; k < shard_views_.size(); ++k) {
    const std::string prefix = shard_views_[k].name + ".";
    for (const auto& [key, tensor] : state) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string kind = key.substr(prefix.size());
      if (!is_floating(tensor.dtype())) {
        step_count = std::max<int64_t>(step_count, static_cast<int64_t>(tensor.item()));
        continue;
      }
      if (shards.count(kind) == 0) shards[kind] = Tensor::zeros({shard_elements_}, kFloat32, device);
      shards[kind].narrow(0, pieces_[k].shard_start, pieces_[k].count).copy_(tensor.reshape({-1}));
    }
  }
  shards["master"] = shard_parameters_;  // the f32 weights (for a bf16 model, finer than its parameters)
  // Each kind, bucket by bucket, gathered and laid out in registration order.
  std::map<std::string, Tensor> flat_state;
  for (auto& [kind, shard] : shards) {
    Tensor flat = Tensor::zeros({flat_elements()}, kFloat32, device);
    for (size_t b = 0; b < buffer_.buckets().size(); ++b) {
      Tensor gathered = Tensor::empty({buffer_.buckets()[b].padded_elements}, kFloat32, device);
      group_->all_gather(shard.narrow(0, shard_offsets_[b], chunk_elements(b)), gathered, stream)->synchronize();
      for (const GradientBuffer::Slot& slot : buffer_.buckets()[b].slots) {
        flat.narrow(0, flat_offsets_[slot.parameter], slot.elements).copy_(gathered.narrow(0, slot.offset, slot.elements));
      }
    }
    flat_state[kind + ".flat"] = flat;
  }
  flat_state["parameter.step"] = Tensor::full({}, static_cast<double>(step_count), kInt64);
  flat_state["step"] = state.at("step");
  return flat_state;
}

void ZeroSharding::scatter_optimizer_state(Optimizer& optimizer, const std::map<std::string, Tensor>& state) {
  std::map<std::string, Tensor> local = optimizer.state_dict();  // the keys and shapes to fill
  const Device device = buffer_.device();
  std::map<std::string, Tensor> on_device;  // kind -> its flat tensor on this device, moved once
  auto flat_of = [&](const std::string& kind) -> const Tensor& {
    const auto found = on_device.find(kind);
    if (found != on_device.end()) return found->second;
    WEFT_CHECK(state.count(kind + ".flat") == 1, "checkpoint: optimizer state lacks '", kind,
               ".flat'; it was saved with another optimizer or another parallel.zero");
    const Tensor& flat = state.at(kind + ".flat");
    WEFT_CHECK(flat.numel() == flat_elements(), "checkpoint: optimizer state '", kind, ".flat' has ", flat.numel(),
               " elements, this model and dp size need ", flat_elements());
    return on_device[kind] = flat.to(device);
  };
  auto piece_of = [&](const Tensor& flat, const Piece& piece) {
    return flat.narrow(0, flat_offsets_[piece.parameter] + piece.parameter_start, piece.count);
  };
  for (size_t k = 0; k < shard_views_.size(); ++k) {
    const std::string prefix = shard_views_[k].name + ".";
    for (auto& [key, tensor] : local) {
      if (key.rfind(prefix, 0) != 0) continue;
      const std::string kind = key.substr(prefix.size());
      if (!is_floating(tensor.dtype())) {
        WEFT_CHECK(state.count("parameter.step") == 1, "checkpoint: optimizer state lacks parameter.step");
        tensor = state.at("parameter.step").to(tensor.dtype()).reshape(tensor.shape());
        continue;
      }
      tensor = piece_of(flat_of(kind), pieces_[k]).to(tensor.dtype()).reshape(tensor.shape());
    }
  }
  local["step"] = state.at("step");
  optimizer.load_state_dict(local);
  if (state.count("master.flat") == 1) {
    autograd::NoGradGuard no_grad;
    const Tensor master = flat_of("master");
    for (const Piece& piece : pieces_) {
      shard_parameters_.narrow(0, piece.shard_start, piece.count).copy_(piece_of(master, piece));
    }
  }
}

std::map<std::string, Tensor> ZeroSharding::gather_parameter_state(const Optimizer& optimizer,
                                                                   const CommStream& stream) {
  const std::map<std::string, Tensor> flat_state = gather_optimizer_state(optimizer, stream);
  autograd::NoGradGuard no_grad;
  std::map<std::string, Tensor> out;
  const std::vector<NamedParameter>& parameters = buffer_.parameters();
  for (const auto& [key, flat] : flat_state) {
    const std::string suffix = ".flat";
    if (key.size() <= suffix.size() || key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string kind = key.substr(0, key.size() - suffix.size());
    for (size_t p = 0; p < parameters.size(); ++p) {
      const Tensor& parameter = parameters[p].tensor;
      out[parameters[p].name + "." + kind] =
          flat.narrow(0, flat_offsets_[p], parameter.numel()).reshape(parameter.shape()).clone();
    }
  }
  for (const NamedParameter& parameter : parameters) out[parameter.name + ".step"] = flat_state.at("parameter.step");
  out["step"] = flat_state.at("step");
  return out;
}

void ZeroSharding::scatter_parameter_state(Optimizer& optimizer, const std::map<std::string, Tensor>& state) {
  autograd::NoGradGuard no_grad;
  const std::vector<NamedParameter>& parameters = buffer_.parameters();
  // The kinds the first parameter has (every parameter has the same ones).
  const std::string first = parameters.front().name + ".";
  std::vector<std::string> kinds;
  for (const auto& [key, tensor] : state) {
    if (key.rfind(first, 0) != 0) continue;
    const std::string kind = key.substr(first.size());
    if (kind.find('.') == std::string::npos && is_floating(tensor.dtype())) kinds.push_back(kind);
  }
  std::map<std::string, Tensor> flat_state;
  for (const std::string& kind : kinds) {
    Tensor flat = Tensor::zeros({flat_elements()}, kFloat32);
    for (size_t p = 0; p < parameters.size(); ++p) {
      const std::string key = parameters[p].name + "." + kind;
      WEFT_CHECK(state.count(key) == 1, "checkpoint: optimizer state lacks '", key, "'");
      const Tensor& value = state.at(key);
      WEFT_CHECK(value.numel() == parameters[p].tensor.numel(), "checkpoint: optimizer state '", key, "' has ",
                 value.numel(), " elements, the parameter ", parameters[p].tensor.numel());
      flat.narrow(0, flat_offsets_[p], value.numel()).copy_(value.reshape({-1}));
    }
    flat_state[kind + ".flat"] = flat;
  }
  const std::string step_key = parameters.front().name + ".step";
  WEFT_CHECK(state.count(step_key) == 1 && state.count("step") == 1, "checkpoint: optimizer state lacks '",
             step_key, "' or 'step'");
  flat_state["parameter.step"] = state.at(step_key);
  flat_state["step"] = state.at("step");
  scatter_optimizer_state(optimizer, flat_state);
}

}  // namespace weft
