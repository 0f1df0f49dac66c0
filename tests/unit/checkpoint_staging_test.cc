// CheckpointStaging (launcher/checkpoint_staging.h): the host copies of an asynchronous save are
// exact, independent of later changes to the live tensors, and kept from one save to the next
// (the same memory again), remade when a shape or dtype changes and dropped with their name.
// cuda_training_test checks device tensors, staged in page-locked memory.
#include "launcher/checkpoint_staging.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "runtime/weft.h"

namespace weft {
namespace {

std::map<std::string, Tensor> live_state(Device device = Device::cpu()) {
  return {{"model.weight", Tensor::normal({17, 5}, 1).to(device)},
          {"model.bias", Tensor::normal({5}, 2).to(kBFloat16).to(device)},
          {"optimizer.step", Tensor::from_vector(std::vector<int64_t>{7}, {1}, kInt64, device)}};
}

void expect_equal_values(const std::map<std::string, Tensor>& copies, const std::map<std::string, Tensor>& state) {
  ASSERT_EQ(copies.size(), state.size());
  for (const auto& [name, tensor] : state) {
    const Tensor& copy = copies.at(name);
    EXPECT_TRUE(copy.device().is_cpu()) << name;
    EXPECT_EQ(copy.shape(), tensor.shape()) << name;
    EXPECT_EQ(copy.dtype(), tensor.dtype()) << name;
    EXPECT_EQ(copy.to_vector(), tensor.to_vector()) << name;
  }
}

TEST(CheckpointStaging, CopiesAreExactIndependentAndKeptAcrossSaves) {
  std::map<std::string, Tensor> state = live_state();
  CheckpointStaging staging;
  const std::map<std::string, Tensor> first = staging.copies(state);
  expect_equal_values(first, state);
  const std::vector<double> saved = first.at("model.weight").to_vector();
  // Training changes the live tensors; the copies a write reads do not change with them.
  state.at("model.weight").fill_(3.0);
  EXPECT_EQ(first.at("model.weight").to_vector(), saved);
  EXPECT_NE(first.at("model.weight").raw_data(), state.at("model.weight").raw_data());

  // The next save reuses the same buffers.
  const void* weight_memory = first.at("model.weight").raw_data();
  const std::map<std::string, Tensor> second = staging.copies(state);
  expect_equal_values(second, state);
  EXPECT_EQ(second.at("model.weight").raw_data(), weight_memory);

  // A changed shape gets a buffer of its own; a name no longer saved gives its buffer back.
  state.at("model.weight") = Tensor::normal({4, 5}, 3);
  state.erase("optimizer.step");
  const std::map<std::string, Tensor> third = staging.copies(state);
  expect_equal_values(third, state);
  EXPECT_EQ(staging.bytes(), 4 * 5 * 4 + 5 * 2);
  EXPECT_EQ(staging.pinned_bytes(), 0) << "host tensors need no page-locked copies";
}

}  // namespace
}  // namespace weft
