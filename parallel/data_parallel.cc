// DataParallel (data_parallel.h).
#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "optim/gradient_clipping.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace weft {

DataParallel::DataParallel(const Module& model, std::shared_ptr<ProcessGroup> group, CommStream stream,
                           const DataParallelOptions& options)
    : parameters_(model.named_parameters()), group_(std::move(group)), stream_(std::move(stream)),
      options_(options) {
  WEFT_CHECK(options.zero_stage >= 0 && options.zero_stage <= 2, "parallel.zero = ", options.zero_stage,
             " is not one of 0, 1, 2");
  WEFT_CHECK(!parameters_.empty(), "data parallel: the model has no parameters");
  WEFT_CHECK(!stream_.is_cuda(), "data parallel: collectives run on the caller's stream (CommStream()); a "
             "separate CUDA stream would need event ordering that this manual-mode implementation does not do");
  const DType dtype = parameters_[0].tensor.dtype();
  for (const NamedParameter& parameter : parameters_) {
    WEFT_CHECK(parameter.tensor.dtype() == dtype && parameter.tensor.device() == group_->device(),
               "data parallel: parameter ", parameter.name, " is ", parameter.tensor.describe(),
               "; every parameter must be ", dtype_name(dtype), " on ", group_->device().to_string());
  }
  int64_t offset = 0;
  for (const NamedParameter& parameter : parameters_) {
    flat_offsets_.push_back(offset);
    offset += parameter.tensor.numel();
  }
  const int64_t ranks = group_->size();
  flat_elements_ = (offset + ranks - 1) / ranks * ranks;

  // Buckets in backward order: the last registered parameters get their gradients first.
  const int64_t element_bytes = dtype_size(dtype);
  Bucket bucket;
  for (size_t i = parameters_.size(); i-- > 0;) {
    bucket.parameters.push_back(i);
    bucket.elements += parameters_[i].tensor.numel();
    if (bucket.elements * element_bytes >= options_.bucket_bytes) {
      buckets_.push_back(std::move(bucket));
      bucket = Bucket();
    }
  }
  if (!bucket.parameters.empty()) buckets_.push_back(std::move(bucket));

  if (options_.zero_stage == 0) return;
  shard_elements_ = flat_elements_ / ranks;
  const int64_t shard_begin = group_->rank() * shard_elements_;
  const int64_t shard_end = shard_begin + shard_elements_;
  shard_parameters_ = Tensor::zeros({shard_elements_}, kFloat32, group_->device());
  shard_gradients_ = Tensor::zeros({shard_elements_}, kFloat32, group_->device());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const int64_t begin = std::max(flat_offsets_[i], shard_begin);
    const int64_t end = std::min(flat_offsets_[i] + parameters_[i].tensor.numel(), shard_end);
    if (begin >= end) continue;
    Piece piece{i, begin - flat_offsets_[i], begin - shard_begin, end - begin};
    Tensor view = shard_parameters_.narrow(0, piece.shard_start, piece.count);
    view.set_requires_grad(true);
    shard_views_.push_back({str(parameters_[i].name, "[", piece.parameter_start, ":",
                                piece.parameter_start + piece.count, "]"),
                            view, parameters_[i].layout});
    pieces_.push_back(piece);
  }
  load_shard_from_parameters();  // the shard starts from the parameters, widened to f32
}

void DataParallel::load_shard_from_parameters() {
  autograd::NoGradGuard no_grad;
  for (const Piece& piece : pieces_) {
    shard_parameters_.narrow(0, piece.shard_start, piece.count)
        .copy_(parameters_[piece.parameter].tensor.reshape({-1}).narrow(0, piece.parameter_start, piece.count));
  }
}

std::unique_ptr<Optimizer> DataParallel::make_optimizer(
    const std::function<std::unique_ptr<Optimizer>(std::vector<ParameterGroup>)>& make) {
  if (options_.zero_stage == 0) return make(default_parameter_groups(parameters_, options_.weight_decay));
  // The decay group follows the model parameter a piece comes from (a matrix's piece is 1-D too).
  ParameterGroup decayed{{}, options_.weight_decay}, plain{{}, 0.0};
  for (size_t k = 0; k < pieces_.size(); ++k) {
    (parameters_[pieces_[k].parameter].tensor.dim() >= 2 ? decayed : plain).parameters.push_back(shard_views_[k]);
  }
  std::vector<ParameterGroup> groups;
  for (ParameterGroup* group : {&decayed, &plain}) {
    if (!group->parameters.empty()) groups.push_back(std::move(*group));
  }
  WEFT_CHECK(!groups.empty(), "data parallel: rank ", group_->rank(), " owns no parameters (the model has ",
             flat_elements_, " elements for ", group_->size(), " ranks)");
  return make(std::move(groups));
}

// Keeps the timing only: a handle holds its tensors alive, and a step's buckets must be freed.
void DataParallel::record(const CollectiveHandlePtr& handle) {
  const bool timed = handle->start_ms() >= 0.0;
  records_.push_back({handle->description(), timed ? handle->start_ms() : 0.0, timed ? handle->end_ms() : 0.0,
                      handle->bytes()});
}

void DataParallel::wait(const CollectiveHandlePtr& handle) {
  // Manual mode: compute waits for each collective at once.
  handle->synchronize();
  record(handle);
}

void DataParallel::pack_gradients(const Tensor& flat) {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor slot = flat.narrow(0, flat_offsets_[i], parameters_[i].tensor.numel());
    const Tensor grad = parameters_[i].tensor.grad();
    if (grad.defined()) {
      slot.copy_(grad.reshape({-1}));
    } else {
      slot.zero_();
    }
  }
  const int64_t used = flat_offsets_.back() + parameters_.back().tensor.numel();
  if (used < flat_elements_) flat.narrow(0, used, flat_elements_ - used).zero_();
}

void DataParallel::reduce_gradients() {
  autograd::NoGradGuard no_grad;
  const DType dtype = parameters_[0].tensor.dtype();
  const Device device = group_->device();
  if (options_.zero_stage == 2) {
    Tensor flat = Tensor::empty({flat_elements_}, dtype, device);
    pack_gradients(flat);
    for (NamedParameter& parameter : parameters_) parameter.tensor.zero_grad();  // only the shard is kept
    Tensor shard = Tensor::empty({shard_elements_}, dtype, device);
    wait(group_->reduce_scatter(flat, shard, Reduction::kAverage, stream_));
    shard_gradients_.copy_(shard);
  } else {
    for (const Bucket& bucket : buckets_) {
      Tensor flat = Tensor::empty({bucket.elements}, dtype, device);
      int64_t offset = 0;
      for (size_t i : bucket.parameters) {
        const Tensor grad = parameters_[i].tensor.grad();
        Tensor slot = flat.narrow(0, offset, parameters_[i].tensor.numel());
        if (grad.defined()) {
          slot.copy_(grad.reshape({-1}));
        } else {
          slot.zero_();
        }
        offset += parameters_[i].tensor.numel();
      }
      wait(group_->all_reduce(flat, Reduction::kAverage, stream_));
      offset = 0;
      for (size_t i : bucket.parameters) {
        Tensor& parameter = parameters_[i].tensor;
        parameter.set_grad(flat.narrow(0, offset, parameter.numel()).view(parameter.shape()));
        offset += parameter.numel();
      }
    }
    if (options_.zero_stage == 1) {
      for (const Piece& piece : pieces_) {
        shard_gradients_.narrow(0, piece.shard_start, piece.count)
            .copy_(parameters_[piece.parameter].tensor.grad().reshape({-1}).narrow(0, piece.parameter_start,
                                                                                 piece.count));
      }
    }
  }
  if (options_.zero_stage > 0) {
    for (size_t k = 0; k < pieces_.size(); ++k) {
      shard_views_[k].tensor.set_grad(shard_gradients_.narrow(0, pieces_[k].shard_start, pieces_[k].count));
    }
  }
}

double DataParallel::clip_gradients(double max_norm) {
  if (options_.zero_stage == 0) {
    std::vector<Tensor> tensors;
    for (const NamedParameter& parameter : parameters_) tensors.push_back(parameter.tensor);
    return clip_grad_norm(tensors, max_norm);
  }
  autograd::NoGradGuard no_grad;
  const Device device = group_->device();
  // Each rank's shard holds distinct elements (padding is zero): the squares add up across ranks.
  Tensor squares = Tensor::empty({1}, accumulation_dtype(device), device);
  backend_for(device).squared_norms({shard_gradients_}, squares);
  wait(group_->all_reduce(squares, Reduction::kSum, stream_));
  const double norm = std::sqrt(squares.item());
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    // In place on the shard buffer, which every shard view's .grad aliases.
    backend_for(device).affine(shard_gradients_, max_norm / (norm + 1e-6), 0.0, shard_gradients_);
  }
  return norm;
}

void DataParallel::finish_step() {
  if (options_.zero_stage == 0) return;
  autograd::NoGradGuard no_grad;
  Tensor flat = Tensor::empty({flat_elements_}, kFloat32, group_->device());
  wait(group_->all_gather(shard_parameters_, flat, stream_));
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Tensor& parameter = parameters_[i].tensor;
    parameter.copy_(flat.narrow(0, flat_offsets_[i], parameter.numel()).view(parameter.shape()));
  }
}

void DataParallel::zero_grad() {
  for (NamedParameter& parameter : parameters_) parameter.tensor.zero_grad();
  for (NamedParameter& view : shard_views_) view.tensor.zero_grad();
}

double DataParallel::average(double value) {
  if (group_->size() == 1) return value;
  Tensor scalar = Tensor::full({1}, value, accumulation_dtype(group_->device()), group_->device());
  group_->all_reduce(scalar, Reduction::kAverage, stream_)->synchronize();
  return scalar.item();
}

std::vector<CommunicationRecord> DataParallel::take_records() {
  std::vector<CommunicationRecord> records;
  records.swap(records_);
  return records;
}

std::map<std::string, Tensor> DataParallel::gather_optimizer_state(const Optimizer& optimizer) {
  std::map<std::string, Tensor> state = optimizer.state_dict();
  if (options_.zero_stage == 0) return state;
  autograd::NoGradGuard no_grad;
  // Every floating per-piece state ("<piece>.<kind>") becomes one flat tensor per kind, gathered in
  // the unsharded flat layout, so a checkpoint does not depend on how the ranks split it.
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
      if (shards.count(kind) == 0) shards[kind] = Tensor::zeros({shard_elements_}, kFloat32, group_->device());
      shards[kind].narrow(0, pieces_[k].shard_start, pieces_[k].count).copy_(tensor.reshape({-1}));
    }
  }
  std::map<std::string, Tensor> flat_state;
  for (auto& [kind, shard] : shards) {
    Tensor flat = Tensor::empty({flat_elements_}, kFloat32, group_->device());
    wait(group_->all_gather(shard, flat, stream_));
    flat_state[kind + ".flat"] = flat;
  }
  // The f32 weights the shards hold (for a bf16 model, more precise than its parameters).
  Tensor master = Tensor::empty({flat_elements_}, kFloat32, group_->device());
  wait(group_->all_gather(shard_parameters_, master, stream_));
  flat_state["master.flat"] = master;
  flat_state["parameter.step"] = Tensor::full({}, static_cast<double>(step_count), kInt64);
  flat_state["step"] = state.at("step");
  return flat_state;
}

void DataParallel::scatter_optimizer_state(Optimizer& optimizer, const std::map<std::string, Tensor>& state) {
  if (options_.zero_stage == 0) {
    optimizer.load_state_dict(state);
    return;
  }
  std::map<std::string, Tensor> local = optimizer.state_dict();  // the keys and shapes to fill
  const int64_t shard_begin = group_->rank() * shard_elements_;
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
      WEFT_CHECK(state.count(kind + ".flat") == 1, "checkpoint: optimizer state lacks '", kind,
                 ".flat'; it was saved with another optimizer or another parallel.zero");
      const Tensor& flat = state.at(kind + ".flat");
      WEFT_CHECK(flat.numel() == flat_elements_, "checkpoint: optimizer state '", kind, ".flat' has ", flat.numel(),
                 " elements, this model and dp size need ", flat_elements_);
      tensor = flat.to(group_->device())
                   .narrow(0, shard_begin + pieces_[k].shard_start, pieces_[k].count)
                   .to(tensor.dtype())
                   .reshape(tensor.shape());
    }
  }
  local["step"] = state.at("step");
  optimizer.load_state_dict(local);
  if (state.count("master.flat") == 1) {
    shard_parameters_.copy_(state.at("master.flat").to(group_->device()).narrow(0, shard_begin, shard_elements_));
  }
}

}  // namespace weft
