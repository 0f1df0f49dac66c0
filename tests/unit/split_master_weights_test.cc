// The two 16-bit halves of a bf16 parameter's f32 master (runtime/split_master_weights.h): every
// f32 that is not a NaN comes back bit for bit, the high half is the nearest bf16 with ties away
// from zero, and the halves an outside write leaves behind still decode next to the written value;
// the CPU backend's conversions of whole tensors (join_master_halves, master_low_halves) agree.
#include "runtime/split_master_weights.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/backend.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace weft {
namespace {

bool is_nan_bits(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

float decode(uint16_t high, int16_t low) { return std::bit_cast<float>(master_bits(high, low)); }

TEST(SplitMasterWeights, EveryF32ComesBackBitForBit) {
  // Every high half with low halves at the edges of the range (0, the ties, +-1, the extremes),
  // then random bit patterns.
  int64_t checked = 0;
  for (uint32_t high = 0; high <= 0xffffu; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu}) {
      const uint32_t bits = (high << 16) | low;
      if (is_nan_bits(bits)) continue;
      ASSERT_EQ(master_bits(master_high_half(bits), master_low_half(bits)), bits) << std::hex << bits;
      ++checked;
    }
  }
  std::mt19937 random(7);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = random();
    if (is_nan_bits(bits)) continue;
    ASSERT_EQ(master_bits(master_high_half(bits), master_low_half(bits)), bits) << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

TEST(SplitMasterWeights, TheBackendJoinsAndSplitsWholeTensorsAsTheScalarFunctionsDo) {
  // Random f32 bit patterns (no NaNs) as values; their high halves as a bf16 tensor.
  std::mt19937 random(13);
  std::vector<float> values;
  while (values.size() < 100003) {
    const uint32_t bits = random();
    if (!is_nan_bits(bits)) values.push_back(std::bit_cast<float>(bits));
  }
  const int64_t count = static_cast<int64_t>(values.size());
  Tensor value_tensor = Tensor::from_vector(absl::Span<const float>(values), {count});
  Tensor high = Tensor::empty({count}, kBFloat16);
  for (int64_t i = 0; i < count; ++i) {
    high.data<BFloat16>()[i].bits = master_high_half(std::bit_cast<uint32_t>(values[i]));
  }
  Tensor low = Tensor::empty({count}, kInt16);
  backend_for(Device::cpu()).master_low_halves(value_tensor, low);
  Tensor joined = Tensor::empty({count}, kFloat32);
  backend_for(Device::cpu()).join_master_halves(high, low, joined);
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
    ASSERT_EQ(low.data<int16_t>()[i], master_low_half(bits)) << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(joined.data<float>()[i]), bits) << i;
  }
  // Operands that do not fit are refused by name.
  EXPECT_THROW(backend_for(Device::cpu()).join_master_halves(high, low, Tensor::empty({count}, kFloat64)), Error);
  EXPECT_THROW(backend_for(Device::cpu()).master_low_halves(value_tensor, Tensor::empty({count - 1}, kInt16)), Error);
}

TEST(SplitMasterWeights, TheHighHalfIsTheNearestBf16WithTiesAwayFromZero) {
  std::mt19937 random(11);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = random();
    if (is_nan_bits(bits) || (bits & 0xffffu) == 0x8000u) continue;
    // Off the ties, the nearest is the nearest: the same as weft's round-to-nearest-even conversion.
    ASSERT_EQ(master_high_half(bits), BFloat16::from_float(std::bit_cast<float>(bits))) << std::hex << bits;
  }
  // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7; to even gives 1, away from zero 1 + 2^-7.
  const float tie = 1.0f + std::ldexp(1.0f, -8);
  EXPECT_EQ(static_cast<float>(BFloat16(tie)), 1.0f);
  EXPECT_EQ(decode(master_high_half(std::bit_cast<uint32_t>(tie)), 0), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(decode(master_high_half(std::bit_cast<uint32_t>(-tie)), 0), -1.0f - std::ldexp(1.0f, -7));
  // A tie whose lower neighbour is odd goes up as well (to even would too): the rule is one way.
  const float odd_tie = 1.0f + std::ldexp(1.0f, -7) + std::ldexp(1.0f, -8);
  EXPECT_EQ(decode(master_high_half(std::bit_cast<uint32_t>(odd_tie)), 0), 1.0f + std::ldexp(1.0f, -6));
}

TEST(SplitMasterWeights, InfinitiesZerosAndNansKeepWhatTheyAre) {
  const float infinity = std::numeric_limits<float>::infinity();
  for (const float value : {infinity, -infinity, 0.0f, -0.0f, std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min()}) {
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    EXPECT_EQ(master_bits(master_high_half(bits), master_low_half(bits)), bits) << value;
  }
  // The largest finite f32 rounds to an infinite parameter, as to-nearest-even rounding does, and its
  // master stays finite.
  const uint32_t largest = std::bit_cast<uint32_t>(std::numeric_limits<float>::max());
  EXPECT_EQ(master_high_half(largest), 0x7f80u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const uint32_t bits : {std::bit_cast<uint32_t>(nan), 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t high = master_high_half(bits);
    EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::bit_cast<float>(static_cast<uint32_t>(high) << 16)))))
        << std::hex << bits;
    EXPECT_TRUE(std::isnan(decode(high, master_low_half(bits)))) << std::hex << bits;
  }
}

TEST(SplitMasterWeights, AWrittenParameterDecodesWithinHalfAStepOfItself) {
  // An outside write replaces the high half and leaves the low half: the value it decodes to rounds
  // back to the written parameter, and a written zero never turns into a NaN or changes sign.
  std::mt19937 random(3);
  for (int i = 0; i < 200000; ++i) {
    const uint16_t written = static_cast<uint16_t>(random());
    const int16_t stale_low = static_cast<int16_t>(random());
    const uint32_t written_bits = static_cast<uint32_t>(written) << 16;
    if (is_nan_bits(written_bits) || (written & 0x7fffu) == 0x7f80u) continue;  // NaN and infinities
    const uint32_t decoded = master_bits(written, stale_low);
    ASSERT_FALSE(is_nan_bits(decoded)) << std::hex << written << " " << stale_low;
    ASSERT_EQ(master_high_half(decoded), written) << std::hex << written << " " << stale_low;
    ASSERT_EQ(decoded >> 31, static_cast<uint32_t>(written >> 15)) << "the sign changed";
  }
  EXPECT_EQ(decode(0x0000u, -5), 0.0f);
  EXPECT_TRUE(std::signbit(decode(0x8000u, -5)));
}

}  // namespace
}  // namespace weft
