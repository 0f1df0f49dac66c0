// Element types: bf16/f16 rounding (nearest, ties to even) against known bit patterns and an
// independent double-precision reference, exact round trips of every 16-bit pattern, dtype names,
// and Tensor::to converting values between dtypes.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "runtime/weft.h"

namespace weft {
namespace {

float float_from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }
uint16_t bf16_bits(float value) { return BFloat16::from_float(value); }
uint16_t f16_bits(float value) { return Float16::from_float(value); }

bool bf16_is_nan(uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0; }
bool f16_is_nan(uint16_t bits) { return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0; }

// The f16 value nearest to `value` (ties to even), computed in double without bit tricks; +-inf
// beyond the largest finite half after rounding.
double reference_f16(double value) {
  if (std::isinf(value)) return value;
  const double magnitude = std::fabs(value);
  double rounded;
  if (magnitude < std::ldexp(1.0, -14)) {
    rounded = std::nearbyint(magnitude * std::ldexp(1.0, 24)) * std::ldexp(1.0, -24);  // subnormal step 2^-24
  } else {
    int exponent;
    std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent)
    const double step = std::ldexp(1.0, exponent - 1 - 10);
    rounded = std::nearbyint(magnitude / step) * step;
  }
  if (rounded > 65504.0) rounded = std::numeric_limits<double>::infinity();
  return std::copysign(rounded, value);
}

TEST(DTypeBFloat16, KnownBitPatterns) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits(-2.0f), 0xc000);
  EXPECT_EQ(bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);  // the sign of zero survives
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80);
  // Exactly halfway: ties go to the even neighbour.
  EXPECT_EQ(bf16_bits(float_from_bits(0x3f808000u)), 0x3f80);  // 1 + 2^-8: 0x3f80 (even) vs 0x3f81
  EXPECT_EQ(bf16_bits(float_from_bits(0x3f818000u)), 0x3f82);  // between 0x3f81 (odd) and 0x3f82
  EXPECT_EQ(bf16_bits(float_from_bits(0xbf818000u)), 0xbf82);  // same for negatives
  // Just off halfway rounds to the nearer one.
  EXPECT_EQ(bf16_bits(float_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bf16_bits(float_from_bits(0x3f817fffu)), 0x3f81);
  // Carry from the mantissa into the exponent, and overflow of the largest float to infinity.
  EXPECT_EQ(bf16_bits(float_from_bits(0x3fffc000u)), 0x4000);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(bf16_bits(float_from_bits(0x7f7f7fffu)), 0x7f7f);  // below halfway to inf: largest finite
  // Float subnormals keep their top bits (bf16 has the same exponent range).
  EXPECT_EQ(bf16_bits(float_from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(bf16_bits(float_from_bits(0x00008000u)), 0x0000);
}

TEST(DTypeBFloat16, NaNStaysNaN) {
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xffc00000u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t converted = bf16_bits(float_from_bits(bits));
    EXPECT_TRUE(bf16_is_nan(converted)) << std::hex << bits << " -> " << converted;
    EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(float_from_bits(bits)))));
    EXPECT_EQ(converted & 0x8000u, (bits >> 16) & 0x8000u) << "NaN sign of " << std::hex << bits;
  }
}

TEST(DTypeFloat16, KnownBitPatterns) {
  EXPECT_EQ(f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(f16_bits(-2.0f), 0xc000);
  EXPECT_EQ(f16_bits(0.5f), 0x3800);
  EXPECT_EQ(f16_bits(0.0f), 0x0000);
  EXPECT_EQ(f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(f16_bits(65504.0f), 0x7bff);        // largest finite half
  EXPECT_EQ(f16_bits(65519.996f), 0x7bff);      // just below the rounding boundary
  EXPECT_EQ(f16_bits(65520.0f), 0x7c00);        // halfway to 65536: ties to even = inf
  EXPECT_EQ(f16_bits(-65520.0f), 0xfc00);
  EXPECT_EQ(f16_bits(1.0e9f), 0x7c00);
  EXPECT_EQ(f16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f16_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(f16_bits(std::ldexp(1.0f, -14)), 0x0400);   // smallest normal
  EXPECT_EQ(f16_bits(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(f16_bits(std::ldexp(1.0f, -25)), 0x0000);   // halfway to 2^-24: ties to even = 0
  EXPECT_EQ(f16_bits(-std::ldexp(1.0f, -25)), 0x8000);  // ... keeping the sign
  EXPECT_EQ(f16_bits(std::ldexp(1.0f, -25) * 1.0001f), 0x0001);  // past halfway
  EXPECT_EQ(f16_bits(3.0f * std::ldexp(1.0f, -25)), 0x0002);  // 1.5 steps: ties to even = 2 steps
  EXPECT_EQ(f16_bits(5.0f * std::ldexp(1.0f, -25)), 0x0002);  // 2.5 steps: ties to even = 2 steps
  EXPECT_EQ(f16_bits(std::ldexp(1.0f, -30)), 0x0000);
  // The largest subnormal rounding up into the smallest normal.
  EXPECT_EQ(f16_bits(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);
  // Normal ties: 1 + 2^-11 is halfway between 0x3c00 (even) and 0x3c01.
  EXPECT_EQ(f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f16_bits(1.0f + 3.0f * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f16_bits(2047.0f), 0x67ff);
  EXPECT_EQ(f16_bits(2049.0f), 0x6800);  // tie between 2048 (even) and 2050
  EXPECT_EQ(f16_bits(2051.0f), 0x6802);  // tie between 2050 (odd) and 2052
}

TEST(DTypeFloat16, NaNStaysNaN) {
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0x7f802000u, 0xffc00000u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t converted = f16_bits(float_from_bits(bits));
    EXPECT_TRUE(f16_is_nan(converted)) << std::hex << bits << " -> " << converted;
    EXPECT_EQ(converted & 0x8000u, (bits >> 16) & 0x8000u);
  }
  EXPECT_TRUE(std::isnan(Float16::to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(Float16::to_float(0xfc01)));
}

TEST(DTypeBFloat16, EveryBitPatternRoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    BFloat16 value;
    value.bits = static_cast<uint16_t>(bits);
    const float widened = static_cast<float>(value);
    // Widening is exact: the bf16 bits are the top half of the float.
    ASSERT_EQ(bits_of(widened), bits << 16) << std::hex << bits;
    if (bf16_is_nan(static_cast<uint16_t>(bits))) {
      ASSERT_TRUE(bf16_is_nan(BFloat16::from_float(widened))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(BFloat16::from_float(widened), bits) << std::hex << bits;
  }
}

TEST(DTypeFloat16, EveryBitPatternRoundTripsExactly) {
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const float widened = Float16::to_float(static_cast<uint16_t>(bits));
    if (f16_is_nan(static_cast<uint16_t>(bits))) {
      ASSERT_TRUE(std::isnan(widened)) << std::hex << bits;
      ASSERT_TRUE(f16_is_nan(Float16::from_float(widened))) << std::hex << bits;
      continue;
    }
    // Widening gives the value the IEEE half encoding denotes.
    const uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    double expected = exponent == 0    ? std::ldexp(static_cast<double>(mantissa), -24)
                      : exponent == 31 ? std::numeric_limits<double>::infinity()
                                       : std::ldexp(1024.0 + mantissa, static_cast<int>(exponent) - 25);
    if (bits & 0x8000u) expected = -expected;
    ASSERT_EQ(static_cast<double>(widened), expected) << std::hex << bits;
    ASSERT_EQ(std::signbit(widened), (bits & 0x8000u) != 0) << std::hex << bits;
    ASSERT_EQ(Float16::from_float(widened), bits) << std::hex << bits;
  }
}

// Narrowing of a spread of floats across every exponent (normal, subnormal, overflow, both signs)
// matches a double-precision nearest-even reference.
TEST(DTypeFloat16, NarrowingMatchesReferenceAcrossTheFloatRange) {
  int checked = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 4093) {
    const float value = float_from_bits(static_cast<uint32_t>(bits));
    if (std::isnan(value)) continue;
    const double expected = reference_f16(value);
    const float actual = Float16::to_float(Float16::from_float(value));
    ASSERT_EQ(static_cast<double>(actual), expected) << "float bits " << std::hex << bits;
    ASSERT_EQ(std::signbit(actual), std::signbit(value)) << "float bits " << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

TEST(DTypeNames, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(kFloat32), 4);
  EXPECT_EQ(dtype_size(kBFloat16), 2);
  EXPECT_EQ(dtype_size(kFloat16), 2);
  EXPECT_EQ(dtype_size(kFloat64), 8);
  EXPECT_EQ(dtype_size(kInt32), 4);
  EXPECT_EQ(dtype_size(kInt64), 8);
  EXPECT_EQ(sizeof(BFloat16), 2u);
  EXPECT_EQ(sizeof(Float16), 2u);

  const struct {
    DType dtype;
    const char* name;
    const char* long_name;
    bool floating;
  } cases[] = {{kFloat32, "f32", "float32", true},   {kBFloat16, "bf16", "bfloat16", true},
               {kFloat16, "f16", "float16", true},   {kFloat64, "f64", "float64", true},
               {kInt32, "i32", "int32", false},      {kInt64, "i64", "int64", false},
               {kInt16, "i16", "int16", false}};
  for (const auto& c : cases) {
    EXPECT_EQ(dtype_name(c.dtype), c.name);
    EXPECT_EQ(parse_dtype(c.name), c.dtype) << c.name;
    EXPECT_EQ(parse_dtype(c.long_name), c.dtype) << c.long_name;
    EXPECT_EQ(parse_dtype(dtype_name(c.dtype)), c.dtype);
    EXPECT_EQ(is_floating(c.dtype), c.floating) << c.name;
    EXPECT_EQ(is_integer(c.dtype), !c.floating) << c.name;
  }
}

TEST(DTypeNames, UnknownNameThrowsNamingTheNameAndTheValidOnes) {
  for (const char* bad : {"float8", "F32", "", "fp32", "bf16 "}) {
    try {
      parse_dtype(bad);
      ADD_FAILURE() << "parse_dtype(\"" << bad << "\") did not throw";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(std::string("'") + bad + "'"), std::string::npos) << message;
      for (const char* valid : {"f32", "bf16", "f16", "f64", "i32", "i64"}) {
        EXPECT_NE(message.find(valid), std::string::npos) << message;
      }
    }
  }
}

TEST(DTypeTensorTo, F32ToBFloat16RoundsToNearestEven) {
  const float values[] = {1.0f,
                          float_from_bits(0x3f808000u),  // tie -> 1.0
                          float_from_bits(0x3f818000u),  // tie -> 0x3f82
                          float_from_bits(0x3f808001u),  // above tie -> 0x3f81
                          -0.0f,
                          3.14159265f,
                          1.0e30f};
  Tensor source = Tensor::from_vector(absl::Span<const float>(values), {7}, kFloat32);
  Tensor converted = source.to(kBFloat16);
  EXPECT_EQ(converted.dtype(), kBFloat16);
  EXPECT_EQ(converted.shape(), source.shape());
  EXPECT_FALSE(converted.storage() == source.storage());
  const BFloat16* data = converted.data<BFloat16>();
  const uint16_t expected[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x8000, 0x4049, bf16_bits(1.0e30f)};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(data[i].bits, expected[i]) << "element " << i;
  // Back to f32 is exact.
  Tensor back = converted.to(kFloat32);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(bits_of(static_cast<float>(back.at({i}))), static_cast<uint32_t>(expected[i]) << 16) << i;
  }
}

TEST(DTypeTensorTo, F32ToFloat16AndIntegers) {
  Tensor source = Tensor::from_vector(std::vector<double>{65504.0, 65520.0, -65520.0, std::ldexp(1.0, -25),
                                                          3.0 * std::ldexp(1.0, -25), 2049.0, -2.75},
                                      {7}, kFloat32);
  Tensor half = source.to(kFloat16);
  const uint16_t expected[] = {0x7bff, 0x7c00, 0xfc00, 0x0000, 0x0002, 0x6800, 0xc180};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(half.data<Float16>()[i].bits, expected[i]) << "element " << i;
  EXPECT_EQ(half.at({1}), std::numeric_limits<double>::infinity());
  EXPECT_EQ(half.at({6}), -2.75);

  // Float to integer truncates toward zero; integer to float is exact for small values.
  Tensor mixed = Tensor::from_vector(std::vector<double>{2.75, -2.75, 7.0, -0.5}, {4}, kFloat32);
  Tensor as_int = mixed.to(kInt32);
  EXPECT_EQ(as_int.dtype(), kInt32);
  EXPECT_EQ(as_int.data<int32_t>()[0], 2);
  EXPECT_EQ(as_int.data<int32_t>()[1], -2);
  EXPECT_EQ(as_int.data<int32_t>()[2], 7);
  EXPECT_EQ(as_int.data<int32_t>()[3], 0);
  Tensor as_i64 = Tensor::from_vector(std::vector<int64_t>{(int64_t{1} << 40) + 3, -5}, {2});
  EXPECT_EQ(as_i64.to(kFloat64).at({0}), static_cast<double>((int64_t{1} << 40) + 3));
  EXPECT_EQ(as_i64.to(kInt32).at({1}), -5.0);
  // Same dtype: no copy.
  EXPECT_TRUE(mixed.to(kFloat32).is_same(mixed));
}

TEST(DTypeTensorTo, NonContiguousSourceConvertsInLogicalOrder) {
  Tensor source = Tensor::from_vector(std::vector<double>{1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3}, kFloat64);
  Tensor converted = source.transpose(0, 1).to(kBFloat16);  // [3, 2]
  EXPECT_TRUE(converted.is_contiguous());
  EXPECT_EQ(converted.to_vector(), (std::vector<double>{1.0, 4.0, 2.0, 5.0, 3.0, 6.0}));
}

// The copy kernel promises a single rounding for 16-bit targets. From f64 that means rounding the
// double directly; going through f32 first rounds twice and can land on the wrong neighbour.
TEST(DTypeTensorTo, F64ToSixteenBitRoundsOnce) {
  // 1 + 2^-8 + 2^-30: just above the bf16 halfway point between 1.0 and 1 + 2^-7, so the nearest
  // bf16 is 1 + 2^-7 (0x3f81). Rounded to f32 first it becomes exactly 1 + 2^-8, a tie that then
  // goes to the even 1.0 (0x3f80).
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  // Likewise 1 + 2^-11 + 2^-30 is nearest to the f16 1 + 2^-10 (0x3c01).
  const double above_f16_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  Tensor source = Tensor::from_vector(std::vector<double>{above_bf16_tie, above_f16_tie}, {2}, kFloat64);
  EXPECT_EQ(source.to(kBFloat16).data<BFloat16>()[0].bits, 0x3f81);
  EXPECT_EQ(source.to(kFloat16).data<Float16>()[1].bits, 0x3c01);
}

}  // namespace
}  // namespace weft
