// GPU training against the CPU: the multi-tensor AdamW kernel against the CPU update (f32 and bf16
// with f32 master weights), and a few training steps of a small GPT on one GPU against the same
// steps on the CPU; train.recompute selective and full against none on the GPU, with their peak
// device memory. Skipped where no CUDA device is present.
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "launcher/checkpoint_staging.h"
#include "launcher/trainer.h"
#include "layers/language_model.h"
#include "optim/gradient_clipping.h"
#include "optim/optimizer.h"
#include "runtime/weft.h"
#include "runtime/split_master_weights.h"
#include "tests/support/cuda_expectations.h"
#include "tests/support/gradient_check.h"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/optimizer_kernels.h"
#endif

namespace weft {
namespace {

using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(const std::vector<NamedParameter>&)>;

// Three steps of an optimizer on the same parameters and gradients, on the CPU and on the GPU: the
// parameters after them, and every state tensor. With gradient_scale > 0 the steps read every
// gradient multiplied by it (Optimizer::step_with_gradient_scale, a device scalar on each side).
// `offset`: the GPU parameters start that many elements into their storage, which picks AdamW's
// access width (an aligned allocation moves 16 elements a thread in 8-element accesses, 4 elements
// in moves 4, 1 element in moves one at a time; the gradients and state stay aligned).
// `shapes`: the parameters' shapes.
void expect_optimizer_matches(const OptimizerFactory& make, DType dtype, double tolerance,
                              double gradient_scale = 0.0, int64_t offset = 0,
                              const std::vector<std::vector<int64_t>>& shapes = {{37, 19}, {19}, {300, 257}}) {
  std::vector<NamedParameter> cpu_parameters, gpu_parameters;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor cpu = Tensor::normal(shapes[i], 10 + i).to(dtype).set_requires_grad(true);
    const int64_t numel = cpu.numel();
    Tensor gpu = Tensor::zeros({numel + offset}, dtype, Device::cuda(0)).narrow(0, offset, numel).view(shapes[i]);
    gpu.copy_(cpu.detach().to(Device::cuda(0)));
    gpu.set_requires_grad(true);
    cpu_parameters.push_back({"p" + std::to_string(i), cpu, Layout::replicate()});
    gpu_parameters.push_back({"p" + std::to_string(i), gpu, Layout::replicate()});
  }
  auto cpu_optimizer = make(cpu_parameters);
  auto gpu_optimizer = make(gpu_parameters);
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor grad = Tensor::normal(shapes[i], 100 + 10 * step + i, 0, 0.0, 0.1).to(dtype);
      cpu_parameters[i].tensor.set_grad(grad);
      gpu_parameters[i].tensor.set_grad(grad.to(Device::cuda(0)));
    }
    if (gradient_scale > 0.0) {
      cpu_optimizer->step_with_gradient_scale(1e-2, Tensor(), Tensor::full({1}, gradient_scale, kFloat64));
      gpu_optimizer->step_with_gradient_scale(1e-2, Tensor(),
                                              Tensor::full({1}, gradient_scale, kFloat32, Device::cuda(0)));
    } else {
      cpu_optimizer->step(1e-2);
      gpu_optimizer->step(1e-2);
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const double error = testing::relative_error(gpu_parameters[i].tensor.to(Device::cpu()).to(kFloat32),
                                                 cpu_parameters[i].tensor.to(kFloat32));
    EXPECT_LE(error, tolerance) << "parameter " << i << " " << dtype_name(dtype);
  }
  const auto cpu_state = cpu_optimizer->state_dict();
  const auto gpu_state = gpu_optimizer->state_dict();
  EXPECT_EQ(gpu_state.size(), cpu_state.size());
  for (const auto& [name, tensor] : gpu_state) {
    if (tensor.dtype() == kInt64) continue;
    EXPECT_LE(testing::relative_error(tensor.to(Device::cpu()), cpu_state.at(name)), 1e-5) << name;
  }
  // bf16: the kernel keeps the split master's invariant, element by element: the parameter is its
  // master's high half (runtime/split_master_weights.h), and the master's f32 values are what the
  // state dict shows.
  if (dtype != kBFloat16) return;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::vector<double> master = gpu_state.at("p" + std::to_string(i) + ".master").to_vector();
    const std::vector<double> parameter = gpu_parameters[i].tensor.to(Device::cpu()).to_vector();
    ASSERT_EQ(master.size(), parameter.size());
    int64_t mismatches = 0;
    for (size_t j = 0; j < master.size(); ++j) {
      const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(master[j]));
      const float high = std::bit_cast<float>(static_cast<uint32_t>(master_high_half(bits)) << 16);
      mismatches += static_cast<float>(parameter[j]) != high;
    }
    EXPECT_EQ(mismatches, 0) << "parameter " << i << ": elements that are not their master's high half";
  }
}

void expect_adamw_matches(DType dtype, double tolerance, double gradient_scale = 0.0, int64_t offset = 0,
                          const std::vector<std::vector<int64_t>>& shapes = {{37, 19}, {19}, {300, 257}}) {
  expect_optimizer_matches(
      [](const std::vector<NamedParameter>& parameters) {
        return make_adamw(default_parameter_groups(parameters, 0.1), {0.9, 0.95, 1e-8});
      },
      dtype, tolerance, gradient_scale, offset, shapes);
}

#ifdef WEFT_HAVE_CUDA
// Runs `check` with AdamW's copy-engine kernel (optimizer_kernels.cu's adamw_bulk_kernel) allowed
// or not, and expects it launched exactly when allowed on Hopper with every parameter aligned
// (`aligned`): the two kernels compute the same thing, so only the count tells which one ran.
void expect_with_adamw_kernel(bool bulk, bool aligned, const std::function<void()>& check) {
  SCOPED_TRACE(bulk ? "adamw_bulk_kernel allowed" : "adamw_chunks_kernel only");
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const bool before = cuda::set_adamw_bulk_for_testing(bulk);
  const int64_t launches = cuda::adamw_bulk_launches_for_testing();
  check();
  cuda::set_adamw_bulk_for_testing(before);
  const int64_t bulk_launches = cuda::adamw_bulk_launches_for_testing() - launches;
  if (bulk && aligned && major >= 9) {
    EXPECT_GT(bulk_launches, 0) << "adamw_bulk_kernel was allowed on compute capability " << major << " but not run";
  } else {
    EXPECT_EQ(bulk_launches, 0) << "adamw_bulk_kernel ran where it should not";
  }
}

// Both kernels against the CPU. Aligned parameters of any size take the copy-engine kernel where it
// is allowed: here more chunks than the GPU has multiprocessors (8.7M elements, 134 chunks of 64K),
// so each block goes through its stages many times and ends on a partial tile whose last 4 elements
// are outside the copies, beside a tensor of 5 elements (no copy at all), one of 703 (7 outside),
// and one of 2,048 (exactly a tile).
TEST(CudaAdamW, MatchesTheCpuUpdateOverManyChunks) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  const std::vector<std::vector<int64_t>> shapes = {{5}, {37, 19}, {4100, 2131}, {2048}};
  for (const bool bulk : {false, true}) {
    expect_with_adamw_kernel(bulk, /*aligned=*/true, [&] {
      expect_adamw_matches(kFloat32, 1e-6, 0.0, 0, shapes);
      expect_adamw_matches(kBFloat16, 1e-2, 0.37, 0, shapes);
    });
  }
}

// f16 parameters keep f32 masters (kMasterF32): a fourth operand of four bytes an element; 4
// elements into their storage they are not aligned to 8, and the table kernel runs whatever is
// allowed.
TEST(CudaAdamW, MatchesTheCpuUpdateInF16WithMasterWeights) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  for (const bool bulk : {false, true}) {
    expect_with_adamw_kernel(bulk, /*aligned=*/true, [] { expect_adamw_matches(kFloat16, 1e-2); });
    expect_with_adamw_kernel(bulk, /*aligned=*/false, [] { expect_adamw_matches(kFloat16, 1e-2, 0.37, 4); });
  }
}
#endif  // WEFT_HAVE_CUDA

// The same update whatever the access width: parameters 4 and 1 elements into their storage take
// the kernel's four-wide and one-at-a-time paths (the aligned cases above take the sixteen-wide one).
TEST(CudaAdamW, MatchesTheCpuUpdateAtEveryAccessWidth) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  for (const int64_t offset : {4, 1}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    expect_adamw_matches(kFloat32, 1e-6, 0.37, offset);
    expect_adamw_matches(kBFloat16, 1e-2, 0.37, offset);
  }
}

// Gradient clipping's factor applied inside the update (AdamWHyperparameters::gradient_scale).
TEST(CudaAdamW, AppliesAGradientScaleAsTheCpuDoes) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  expect_adamw_matches(kFloat32, 1e-6, 0.37);
  expect_adamw_matches(kBFloat16, 1e-2, 0.37);
}

TEST(CudaAdamW, MatchesTheCpuUpdateInF32) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  expect_adamw_matches(kFloat32, 1e-6);
}

TEST(CudaAdamW, MatchesTheCpuUpdateInBF16WithMasterWeights) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  expect_adamw_matches(kBFloat16, 1e-2);
}

// SGD without momentum, with momentum and weight decay, and Nesterov momentum.
TEST(CudaSgd, MatchesTheCpuUpdateInF32AndBF16WithMasterWeights) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  for (const SgdOptions options : {SgdOptions{.momentum = 0.0}, SgdOptions{.momentum = 0.9},
                                   SgdOptions{.momentum = 0.9, .nesterov = true}}) {
    SCOPED_TRACE("momentum " + std::to_string(options.momentum) + (options.nesterov ? " nesterov" : ""));
    const OptimizerFactory make = [&](const std::vector<NamedParameter>& parameters) {
      return make_sgd(default_parameter_groups(parameters, 0.1), options);
    };
    expect_optimizer_matches(make, kFloat32, 1e-6);
    expect_optimizer_matches(make, kBFloat16, 1e-2);
  }
}

RunConfig small_run(const std::string& text_path, const std::string& device, const std::string& dtype) {
  RunConfig config;
  config.model.layers = 2;
  config.model.dim = 64;
  config.model.heads = 1;  // head dim 64: the fused bf16 attention's size
  config.model.seq_len = 64;
  config.train.device = device;
  config.train.dtype = dtype;
  config.train.batch_size = 4;
  config.train.steps = 5;
  config.train.warmup_steps = 1;
  config.data.train = text_path;
  config.data.val_every = 0;
  config.log.every = 1;
  config.log.progress = "plain";
  return config;
}

// clip_grad_norm on GPU gradients (one squared_norms call for all of them) against the same
// gradients on the CPU: the norm, and the gradients it scales down.
TEST(CudaGradientClipping, MatchesTheCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  const std::vector<std::vector<int64_t>> shapes = {{37, 19}, {19}, {300, 257}, {70000}};
  for (DType dtype : {kFloat32, kBFloat16}) {
    std::vector<Tensor> cpu_parameters, gpu_parameters;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor cpu = Tensor::normal(shapes[i], 10 + i).to(dtype).set_requires_grad(true);
      Tensor gpu = cpu.detach().to(Device::cuda(0)).set_requires_grad(true);
      const Tensor grad = Tensor::normal(shapes[i], 200 + i, 0, 0.0, 0.1).to(dtype);
      cpu.set_grad(grad);
      gpu.set_grad(grad.to(Device::cuda(0)));
      cpu_parameters.push_back(cpu);
      gpu_parameters.push_back(gpu);
    }
    const double cpu_norm = clip_grad_norm(cpu_parameters, 1.0);
    const double gpu_norm = clip_grad_norm(gpu_parameters, 1.0);
    ASSERT_GT(cpu_norm, 1.0) << "the gradients must be clipped for this test";
    EXPECT_NEAR(gpu_norm, cpu_norm, 1e-5 * cpu_norm) << dtype_name(dtype);
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_LE(testing::relative_error(gpu_parameters[i].grad().to(Device::cpu()).to(kFloat32),
                                        cpu_parameters[i].grad().to(kFloat32)),
                dtype == kFloat32 ? 1e-6 : 1e-2)
          << "gradient " << i << " " << dtype_name(dtype);
    }
  }
}

TEST(CudaGradientClipping, ClipToNormOnTheDeviceMatchesTheCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  const std::vector<std::vector<int64_t>> shapes = {{37, 19}, {19}, {300, 257}, {70000}};
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (const double max_norm : {1.0, 1e6}) {  // clipped, and left alone
      std::vector<Tensor> cpu_grads, gpu_grads;
      for (size_t i = 0; i < shapes.size(); ++i) {
        cpu_grads.push_back(Tensor::normal(shapes[i], 300 + i, 0, 0.0, 0.1).to(dtype));
        gpu_grads.push_back(cpu_grads.back().to(Device::cuda(0)));
      }
      const std::vector<Tensor> original = cpu_grads;
      Tensor cpu_squares = Tensor::empty({4}, kFloat64);
      Tensor gpu_squares = Tensor::empty({4}, kFloat32, Device::cuda(0));
      std::vector<Tensor> cpu_copies;
      for (const Tensor& grad : cpu_grads) cpu_copies.push_back(grad.clone());
      backend_for(Device::cpu()).squared_norms(cpu_copies, cpu_squares);
      backend_for(Device::cpu()).clip_to_norm(cpu_copies, cpu_squares, max_norm);
      backend_for(Device::cuda(0)).squared_norms(gpu_grads, gpu_squares);
      backend_for(Device::cuda(0)).clip_to_norm(gpu_grads, gpu_squares, max_norm);
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_LE(testing::relative_error(gpu_grads[i].to(Device::cpu()).to(kFloat32), cpu_copies[i].to(kFloat32)),
                  dtype == kFloat32 ? 1e-6 : 1e-2)
            << "gradient " << i << " " << dtype_name(dtype) << " max_norm " << max_norm;
        if (max_norm > 1e5) {
          EXPECT_EQ(testing::relative_error(gpu_grads[i].to(Device::cpu()), original[i]), 0.0) << "not clipped";
        }
      }
    }
  }
}

TEST(CudaOptimizerGuard, ANanGuardSkipsTheUpdateOnTheDevice) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  for (DType dtype : {kFloat32, kBFloat16}) {
    for (const bool adamw : {true, false}) {
      Tensor parameter = Tensor::normal({300, 257}, 5).to(dtype).to(Device::cuda(0)).set_requires_grad(true);
      const Tensor before = parameter.to(Device::cpu());
      std::vector<NamedParameter> parameters = {{"p", parameter, Layout::replicate()}};
      auto optimizer = adamw ? make_adamw({{parameters, 0.1}}, {0.9, 0.95, 1e-8})
                             : make_sgd({{parameters, 0.1}}, {0.9, false});
      parameter.set_grad(Tensor::normal({300, 257}, 6).to(dtype).to(Device::cuda(0)));
      optimizer->step(1e-2, Tensor::full({1}, std::nan(""), kFloat32, Device::cuda(0)));
      EXPECT_EQ(testing::relative_error(parameter.to(Device::cpu()), before), 0.0) << dtype_name(dtype);
      optimizer->undo_step();
      optimizer->step(1e-2, Tensor::full({1}, 3.0, kFloat32, Device::cuda(0)));
      EXPECT_GT(testing::relative_error(parameter.to(Device::cpu()), before), 0.0) << "a finite guard must update";
    }
  }
}

// Steps in flight under on_nan: skip (runtime/optimizer_update.h's previous guard): the update
// issued after a skipped step, before the host has undone that step's counts, reads the skipped
// step's guard on the device and updates as the CPU does after undo_step; without the previous
// guard it would use counts one too high and differ by far more than the tolerance.
TEST(CudaOptimizerGuard, APreviousGuardThatIsNotFiniteUpdatesAsTheCpuAfterAnUndo) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  const Device gpu = Device::cuda(0);
  Tensor cpu_parameter = Tensor::normal({300, 257}, 5).set_requires_grad(true);
  Tensor gpu_parameter = cpu_parameter.detach().to(gpu).set_requires_grad(true);
  Tensor unguarded_parameter = cpu_parameter.detach().to(gpu).set_requires_grad(true);
  auto make = [](Tensor parameter) {
    return make_adamw({{{{"p", parameter, Layout::replicate()}}, 0.1}}, {0.9, 0.95, 1e-8});
  };
  auto cpu = make(cpu_parameter), on_gpu = make(gpu_parameter), unguarded = make(unguarded_parameter);
  const Tensor nan_on_gpu = Tensor::full({1}, std::nan(""), kFloat32, gpu);
  for (int step = 1; step <= 3; ++step) {
    const Tensor grad = Tensor::normal({300, 257}, 6 + step, 0, 0.0, 0.1);
    for (Tensor* parameter : {&cpu_parameter, &gpu_parameter, &unguarded_parameter}) {
      parameter->set_grad(grad.to(parameter->device()));
    }
    const bool skipped = step == 2;
    cpu->step(1e-2, Tensor::full({1}, skipped ? std::nan("") : 1.0, kFloat64));
    if (skipped) cpu->undo_step();  // one step at a time: read before the next step
    const Tensor guard = skipped ? nan_on_gpu : Tensor::full({1}, 1.0, kFloat32, gpu);
    on_gpu->step(1e-2, guard, step == 3 ? nan_on_gpu : Tensor());
    unguarded->step(1e-2, guard);
    if (step == 3) {
      on_gpu->undo_step(1);  // step 2, read after step 3 was issued
      unguarded->undo_step(1);
    }
  }
  EXPECT_LE(testing::relative_error(gpu_parameter.to(Device::cpu()), cpu_parameter), 1e-6);
  EXPECT_GT(testing::relative_error(unguarded_parameter.to(Device::cpu()), cpu_parameter), 1e-4)
      << "the counts one too high should show";
  EXPECT_EQ(on_gpu->state_dict().at("p.step").item(), 2.0);
}

// checkpoint.async's host copies of device tensors (launcher/checkpoint_staging.h): page-locked,
// exact, and the same buffers at the next save.
TEST(CudaMasterWeights, TheDeviceJoinsAndSplitsMasterHalvesAsTheCpuDoes) {
  // What a checkpoint does with a bf16 parameter's master: the low halves split off f32 values on
  // the device equal the CPU's, and the device joins them with the values' high halves (the
  // parameter) back into the values exactly.
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  const Tensor values = Tensor::normal({1000, 37}, 5);  // [1000, 37] f32
  Tensor low = Tensor::empty(values.shape(), kInt16);
  Tensor high_rounded = Tensor::empty(values.shape(), kBFloat16);
  for (int64_t i = 0; i < values.numel(); ++i) {
    high_rounded.data<BFloat16>()[i].bits = master_high_half(std::bit_cast<uint32_t>(values.data<float>()[i]));
  }
  backend_for(Device::cpu()).master_low_halves(values, low);
  Tensor gpu_low = Tensor::empty(values.shape(), kInt16, Device::cuda(0));
  backend_for(Device::cuda(0)).master_low_halves(values.to(Device::cuda(0)), gpu_low);
  EXPECT_EQ(gpu_low.to(Device::cpu()).to_vector(), low.to_vector());
  Tensor gpu_values = Tensor::empty(values.shape(), kFloat32, Device::cuda(0));
  backend_for(Device::cuda(0)).join_master_halves(high_rounded.to(Device::cuda(0)), gpu_low, gpu_values);
  EXPECT_EQ(gpu_values.to(Device::cpu()).to_vector(), values.to_vector()) << "the halves did not make the values";
}

TEST(CudaCheckpointStaging, DeviceTensorsAreStagedExactlyInPageLockedMemoryKeptAcrossSaves) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  std::map<std::string, Tensor> state = {{"model.weight", Tensor::normal({301, 17}, 1).to(Device::cuda(0))},
                                         {"model.bias", Tensor::normal({17}, 2).to(kBFloat16).to(Device::cuda(0))}};
  CheckpointStaging staging;
  const std::map<std::string, Tensor> first = staging.copies(state);
  EXPECT_EQ(staging.bytes(), 301 * 17 * 4 + 17 * 2);
  EXPECT_EQ(staging.pinned_bytes(), staging.bytes());
  for (const auto& [name, tensor] : state) {
    const Tensor& copy = first.at(name);
    ASSERT_TRUE(copy.device().is_cpu()) << name;
    EXPECT_EQ(copy.to_vector(), tensor.to_vector()) << name;
#ifdef WEFT_HAVE_CUDA
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, copy.raw_data()), cudaSuccess) << name;
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << name << " is not in page-locked memory";
#endif
  }
  const std::vector<double> saved = first.at("model.weight").to_vector();
  state.at("model.weight").fill_(3.0);  // training goes on: the staged copy does not change
  EXPECT_EQ(first.at("model.weight").to_vector(), saved);
  const std::map<std::string, Tensor> second = staging.copies(state);
  EXPECT_EQ(second.at("model.weight").raw_data(), first.at("model.weight").raw_data());
  EXPECT_EQ(second.at("model.weight").to_vector(), state.at("model.weight").to_vector());
}

TEST(CudaTraining, SmallGptStepsMatchTheCpu) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  const auto text_path = std::filesystem::temp_directory_path() / "weft-cuda-training-text.txt";
  {
    std::ofstream text(text_path);
    for (int i = 0; i < 300; ++i) text << "weft weaves compute and communication, step " << i << ".\n";
  }
  const TrainResult cpu = Trainer(small_run(text_path, "cpu", "f32")).run();
  const TrainResult gpu = Trainer(small_run(text_path, "cuda", "f32")).run();
  const TrainResult gpu_bf16 = Trainer(small_run(text_path, "cuda", "bf16")).run();
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-3 * std::fabs(cpu.losses[i])) << "f32 step " << i + 1;
    EXPECT_NEAR(gpu_bf16.losses[i], cpu.losses[i], 3e-2 * std::fabs(cpu.losses[i])) << "bf16 step " << i + 1;
  }
  EXPECT_LT(gpu_bf16.losses.back(), gpu_bf16.losses.front());
  std::filesystem::remove(text_path);
}

// train.recompute on one GPU: selective and full against none for one forward and backward of a
// GPT and a Llama (loss and every gradient, f32 and bf16), and the peak of device memory above
// what was allocated before, which must fall from none to selective to full.
struct RecomputedStep {
  double loss = 0;
  std::map<std::string, Tensor> gradients;  // on the CPU, f32
  int64_t peak_bytes = 0;
};

RecomputedStep recomputed_step(const std::string& type, DType dtype, const std::string& recompute) {
  ModelConfig config;
  config.type = type;
  config.layers = 4;
  config.dim = 256;
  config.heads = 4;
  config.vocab = 512;
  config.seq_len = 256;
  config.dropout = 0.1;
  config.recompute = recompute;
  if (type == "llama") config.kv_heads = 2;
  const Device device = Device::cuda(0);
  const auto model = build_model(config);
  model->train();
  if (dtype != kFloat32) model->to(dtype);
  model->to(device);
  std::vector<int64_t> ids, targets;
  for (int64_t i = 0; i < 8 * config.seq_len; ++i) {
    ids.push_back((7 * i + 1) % config.vocab);
    targets.push_back((5 * i + 2) % config.vocab);
  }
  const Tensor ids_tensor = Tensor::from_vector(absl::Span<const int64_t>(ids), {8, config.seq_len}).to(device);
  const Tensor targets_tensor =
      Tensor::from_vector(absl::Span<const int64_t>(targets), {8, config.seq_len}).to(device);
  Backend& backend = backend_for(device);
  backend.synchronize(device);
  const int64_t before = backend.memory(device, /*reset_peak=*/true).allocated_bytes;
  RecomputedStep result;
  {
    const Tensor value = loss(*model, ids_tensor, targets_tensor);
    value.backward();
    result.loss = value.to(Device::cpu()).to(kFloat32).item();
  }
  backend.synchronize(device);
  result.peak_bytes = backend.memory(device, false).peak_allocated_bytes - before;
  for (const NamedParameter& parameter : model->named_parameters()) {
    result.gradients[parameter.name] = parameter.tensor.grad().to(Device::cpu()).to(kFloat32);
  }
  return result;
}

TEST(CudaTraining, RecomputeMatchesNoneWithLessPeakMemory) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device");
  for (const std::string type : {"gpt", "llama"}) {
    for (const DType dtype : {kFloat32, kBFloat16}) {
      const double tolerance = dtype == kFloat32 ? 1e-4 : 3e-2;
      const RecomputedStep none = recomputed_step(type, dtype, "none");
      const RecomputedStep selective = recomputed_step(type, dtype, "selective");
      const RecomputedStep full = recomputed_step(type, dtype, "full");
      std::printf("%s %s peak activation bytes: none %lld, selective %lld, full %lld\n", type.c_str(),
                  std::string(dtype_name(dtype)).c_str(), static_cast<long long>(none.peak_bytes),
                  static_cast<long long>(selective.peak_bytes), static_cast<long long>(full.peak_bytes));
      for (const RecomputedStep* step : {&selective, &full}) {
        const std::string what = type + " " + std::string(dtype_name(dtype)) + (step == &full ? " full" : " selective");
        EXPECT_NEAR(step->loss, none.loss, tolerance * std::fabs(none.loss)) << what;
        for (const auto& [name, gradient] : none.gradients) {
          EXPECT_LE(testing::relative_error(step->gradients.at(name), gradient), 10 * tolerance) << what << " " << name;
        }
      }
      EXPECT_LT(selective.peak_bytes, none.peak_bytes) << type << " " << dtype_name(dtype);
      EXPECT_LT(full.peak_bytes, selective.peak_bytes) << type << " " << dtype_name(dtype);
    }
  }
}

}  // namespace
}  // namespace weft
