// Counter-based random numbers: Philox4x32-10 against the Random123 known-answer vectors, and the
// contract of Tensor::uniform / Tensor::normal (a pure function of (seed, offset + element index),
// in range, with the right moments, and 16-bit outputs equal to the rounded f32 ones).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/weft.h"

namespace weft {
namespace {

// An independent Philox4x32-10 with the full 128-bit counter (Salmon et al., Random123), so the
// published vectors that need counter words 2 and 3 can check the round function weft uses.
std::array<uint32_t, 4> reference_philox(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = uint64_t{0xD2511F53u} * counter[0];
    const uint64_t product1 = uint64_t{0xCD9E8D57u} * counter[2];
    counter = {static_cast<uint32_t>(product1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(product1),
               static_cast<uint32_t>(product0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(product0)};
    key[0] += 0x9E3779B9u;
    key[1] += 0xBB67AE85u;
  }
  return counter;
}

std::array<uint32_t, 4> words_of(const PhiloxWords& words) {
  return {words.word[0], words.word[1], words.word[2], words.word[3]};
}

using Words = std::array<uint32_t, 4>;

TEST(Philox, KnownAnswerZeroCounterZeroKey) {
  // The one Random123 vector reachable through weft's (seed, 64-bit counter) interface.
  EXPECT_EQ(words_of(philox4x32_10(0, 0)), (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
}

TEST(Philox, ReferenceMatchesAllKnownAnswersAndWeftWhereReachable) {
  // The reference reproduces the three published vectors...
  EXPECT_EQ(reference_philox({0, 0, 0, 0}, {0, 0}), (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(reference_philox({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(reference_philox({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
  // ...and weft agrees with it on every (seed, counter) it can express: key = (seed low, seed high),
  // counter = (c low, c high, 0, 0).
  const uint64_t seeds[] = {0, 1, 0xffffffffull, 0x100000000ull, 0xa4093822299f31d0ull, ~0ull};
  const uint64_t counters[] = {0, 1, 2, 0xffffffffull, 0x100000000ull, 0x85a308d3243f6a88ull, ~0ull};
  for (uint64_t seed : seeds) {
    for (uint64_t counter : counters) {
      const Words expected = reference_philox(
          {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0},
          {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
      EXPECT_EQ(words_of(philox4x32_10(seed, counter)), expected) << "seed " << seed << " counter " << counter;
    }
  }
}

TEST(Philox, UniformAndNormalFollowTheDocumentedMapping) {
  for (uint64_t counter : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 40}) {
    const PhiloxWords words = philox4x32_10(42, counter);
    EXPECT_EQ(philox_uniform(42, counter), std::ldexp(static_cast<double>(words.word[0] >> 8), -24));
    const double u1 = 1.0 - std::ldexp(static_cast<double>(words.word[1] >> 8), -24);
    const double u2 = std::ldexp(static_cast<double>(words.word[2] >> 8), -24);
    EXPECT_NEAR(philox_normal(42, counter), std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2), 1e-12);
  }
}

TEST(RandomTensor, DeterministicForSeedAndOffset) {
  for (DType dtype : {kFloat32, kFloat64, kBFloat16}) {
    EXPECT_EQ(Tensor::uniform({5, 7}, 3, 11, 0.0, 1.0, dtype).to_vector(),
              Tensor::uniform({5, 7}, 3, 11, 0.0, 1.0, dtype).to_vector());
    EXPECT_EQ(Tensor::normal({5, 7}, 3, 11, 0.0, 1.0, dtype).to_vector(),
              Tensor::normal({5, 7}, 3, 11, 0.0, 1.0, dtype).to_vector());
  }
  // The shape does not matter, only the element count: a [5, 7] draw is a [35] draw reshaped.
  EXPECT_EQ(Tensor::normal({5, 7}, 3, 11).to_vector(), Tensor::normal({35}, 3, 11).to_vector());
}

TEST(RandomTensor, ElementIUsesCounterOffsetPlusI) {
  const uint64_t seed = 0x1234567890abcdefull;
  const uint64_t offset = 1000;
  Tensor uniform = Tensor::uniform({4, 9}, seed, offset, -2.0, 3.0, kFloat64);
  Tensor normal = Tensor::normal({4, 9}, seed, offset, 0.5, 2.0, kFloat64);
  const std::vector<double> uniform_values = uniform.to_vector();
  const std::vector<double> normal_values = normal.to_vector();
  for (int64_t i = 0; i < 36; ++i) {
    ASSERT_EQ(uniform_values[i], Tensor::uniform({1}, seed, offset + i, -2.0, 3.0, kFloat64).item()) << i;
    ASSERT_EQ(normal_values[i], Tensor::normal({1}, seed, offset + i, 0.5, 2.0, kFloat64).item()) << i;
    // In f64 the values are exactly the documented transforms of the Philox draw.
    ASSERT_EQ(uniform_values[i], -2.0 + 5.0 * philox_uniform(seed, offset + i)) << i;
    ASSERT_EQ(normal_values[i], 0.5 + 2.0 * philox_normal(seed, offset + i)) << i;
  }
  // Overlapping windows agree where they overlap.
  const std::vector<double> shifted = Tensor::uniform({30}, seed, offset + 6, -2.0, 3.0, kFloat64).to_vector();
  EXPECT_EQ(std::vector<double>(uniform_values.begin() + 6, uniform_values.end()), shifted);
}

TEST(RandomTensor, DifferentSeedsAndOffsetsDiffer) {
  const std::vector<double> base = Tensor::uniform({64}, 1).to_vector();
  for (uint64_t seed : {uint64_t{2}, uint64_t{1} | (uint64_t{1} << 32), uint64_t{1} << 63}) {
    // Seeds that differ only in the high 32 bits still give other numbers (both key words are used).
    const std::vector<double> other = Tensor::uniform({64}, seed).to_vector();
    int equal = 0;
    for (size_t i = 0; i < base.size(); ++i) equal += base[i] == other[i];
    EXPECT_LE(equal, 1) << "seed " << seed;
  }
  const std::vector<double> offset_one = Tensor::uniform({64}, 1, 64).to_vector();
  int equal = 0;
  for (size_t i = 0; i < base.size(); ++i) equal += base[i] == offset_one[i];
  EXPECT_LE(equal, 1);
  // Offsets past 2^32 reach the high counter word.
  EXPECT_NE(Tensor::uniform({8}, 1, uint64_t{1} << 32).to_vector(), Tensor::uniform({8}, 1, 0).to_vector());
}

TEST(RandomTensor, UniformStaysInRangeAndCoversIt) {
  const int64_t count = 20000;
  std::vector<double> values = Tensor::uniform({count}, 9, 0, -3.0, 5.0, kFloat32).to_vector();
  double minimum = 1e9, maximum = -1e9, sum = 0.0;
  for (double value : values) {
    ASSERT_GE(value, -3.0);
    ASSERT_LT(value, 5.0);
    minimum = std::min(minimum, value);
    maximum = std::max(maximum, value);
    sum += value;
  }
  EXPECT_LT(minimum, -3.0 + 8.0 * 1e-3);
  EXPECT_GT(maximum, 5.0 - 8.0 * 1e-3);
  // Mean 1, standard deviation 8/sqrt(12) per draw: the sample mean is within 5 standard errors.
  EXPECT_NEAR(sum / count, 1.0, 5.0 * (8.0 / std::sqrt(12.0)) / std::sqrt(static_cast<double>(count)));
}

TEST(RandomTensor, NormalMomentsMatch) {
  const int64_t count = 100000;
  std::vector<double> values = Tensor::normal({count}, 2024, 0, 0.0, 1.0, kFloat32).to_vector();
  double sum = 0.0, sum_squares = 0.0;
  int64_t beyond_two = 0;
  for (double value : values) {
    ASSERT_TRUE(std::isfinite(value));
    sum += value;
    sum_squares += value * value;
    beyond_two += std::fabs(value) > 2.0;
  }
  const double mean = sum / count;
  const double std = std::sqrt(sum_squares / count - mean * mean);
  const double standard_error = 1.0 / std::sqrt(static_cast<double>(count));
  EXPECT_NEAR(mean, 0.0, 5.0 * standard_error);
  EXPECT_NEAR(std, 1.0, 5.0 * standard_error / std::sqrt(2.0));
  // P(|z| > 2) = 0.0455; binomial standard deviation ~ 0.00066.
  EXPECT_NEAR(static_cast<double>(beyond_two) / count, 0.0455, 0.0035);
  // mean/std parameters are an affine map of the same draws.
  std::vector<double> shifted = Tensor::normal({16}, 2024, 0, 3.0, 0.5, kFloat64).to_vector();
  std::vector<double> unit = Tensor::normal({16}, 2024, 0, 0.0, 1.0, kFloat64).to_vector();
  for (int i = 0; i < 16; ++i) EXPECT_DOUBLE_EQ(shifted[i], 3.0 + 0.5 * unit[i]);
}

// A 16-bit output is the f32 output rounded to nearest even. Where the f32 value is itself exactly
// halfway between two 16-bit values the draw (a double) may round either way, so only those cases
// may pick the other neighbour. A uniform draw that would round up to the upper bound 1 is the
// largest 16-bit value below 1 instead (uniform stays in [low, high)).
void expect_sixteen_bit_is_rounded_f32(const std::vector<double>& f32_values, const Tensor& narrow, DType dtype) {
  const std::vector<double> narrow_values = narrow.to_vector();
  ASSERT_EQ(narrow_values.size(), f32_values.size());
  int mismatches = 0;
  for (size_t i = 0; i < f32_values.size(); ++i) {
    const float value = static_cast<float>(f32_values[i]);
    const double rounded = dtype == kBFloat16 ? static_cast<float>(BFloat16(value)) : static_cast<float>(Float16(value));
    if (narrow_values[i] == rounded) continue;
    const double largest_below_one = dtype == kBFloat16 ? 1.0 - 1.0 / 256 : 1.0 - 1.0 / 2048;
    if (rounded == 1.0 && narrow_values[i] == largest_below_one) continue;
    const bool f32_is_tie = std::fabs(value - rounded) == std::fabs(value - narrow_values[i]);
    EXPECT_TRUE(f32_is_tie) << "element " << i << ": f32 " << value << " rounds to " << rounded << ", got "
                            << narrow_values[i];
    ++mismatches;
  }
  EXPECT_LE(mismatches, 2);
}

TEST(RandomTensor, SixteenBitOutputsAreRoundedF32Outputs) {
  const std::vector<int64_t> shape = {64, 33};
  for (DType dtype : {kBFloat16, kFloat16}) {
    const std::vector<double> uniform = Tensor::uniform(shape, 77, 5, -1.0, 1.0, kFloat32).to_vector();
    expect_sixteen_bit_is_rounded_f32(uniform, Tensor::uniform(shape, 77, 5, -1.0, 1.0, dtype), dtype);
    const std::vector<double> normal = Tensor::normal(shape, 77, 5, 0.0, 1.0, kFloat32).to_vector();
    expect_sixteen_bit_is_rounded_f32(normal, Tensor::normal(shape, 77, 5, 0.0, 1.0, dtype), dtype);
    EXPECT_EQ(Tensor::uniform(shape, 77, 5, -1.0, 1.0, dtype).dtype(), dtype);
  }
}

// uniform(low, high) promises values in [low, high). The largest draw is 1 - 2^-24; once scaled and
// stored in the output dtype it must still be below `high`, but rounding to nearest can carry it
// onto `high` itself: in bf16 every draw above 1 - 2^-9 rounds to 1.0 (about 1 in 512 draws), and
// in f32 the draw 1 - 2^-24 scaled into [1, 2) is a tie that rounds to 2.0.
TEST(RandomTensor, UniformNeverReturnsHighAfterRounding) {
  for (DType dtype : {kBFloat16, kFloat16, kFloat32}) {
    const std::vector<double> values = Tensor::uniform({8192}, 5, 0, 0.0, 1.0, dtype).to_vector();
    int at_high = 0;
    for (double value : values) {
      EXPECT_GE(value, 0.0);
      at_high += value >= 1.0;
    }
    EXPECT_EQ(at_high, 0) << dtype_name(dtype) << ": " << at_high << " of 8192 draws equal high";
  }
  // Seed 7, counter 20922799 draws words[0] >> 8 == 0xffffff, the largest uniform 1 - 2^-24.
  ASSERT_EQ(philox4x32_10(7, 20922799).word[0] >> 8, 0xffffffu);
  EXPECT_LT(Tensor::uniform({1}, 7, 20922799, 1.0, 2.0, kFloat32).item(), 2.0);
  EXPECT_LT(Tensor::uniform({1}, 7, 20922799, 0.0, 1.0, kFloat32).item(), 1.0);
}

TEST(RandomTensor, NonFloatingDtypeThrows) {
  EXPECT_THROW(Tensor::normal({3}, 1, 0, 0.0, 1.0, kInt64), Error);
  EXPECT_THROW(Tensor::uniform({3}, 1, 0, 0.0, 1.0, kInt32), Error);
}

}  // namespace
}  // namespace weft
