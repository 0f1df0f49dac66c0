#include "runtime/dtype.h"

#include <bit>
#include <cmath>

#include "runtime/error.h"

namespace weft {

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kInt16: return 2;
  }
  WEFT_FAIL("dtype_size: unknown dtype ", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "f32";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "f16";
    case DType::kFloat64: return "f64";
    case DType::kInt32: return "i32";
    case DType::kInt64: return "i64";
    case DType::kInt16: return "i16";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32") return kFloat32;
  if (name == "bf16" || name == "bfloat16") return kBFloat16;
  if (name == "f16" || name == "float16") return kFloat16;
  if (name == "f64" || name == "float64") return kFloat64;
  if (name == "i32" || name == "int32") return kInt32;
  if (name == "i64" || name == "int64") return kInt64;
  if (name == "i16" || name == "int16") return kInt16;
  WEFT_FAIL("unknown dtype '", name, "': expected one of f32, bf16, f16, f64, i32, i64, i16");
}

bool is_floating(DType dtype) {
  return dtype == kFloat32 || dtype == kBFloat16 || dtype == kFloat16 || dtype == kFloat64;
}
bool is_integer(DType dtype) { return dtype == kInt32 || dtype == kInt64 || dtype == kInt16; }

uint16_t Float16::from_float(float value) {
  const uint32_t word = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (word >> 16) & 0x8000u;
  const uint32_t magnitude = word & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: inf
  if (magnitude < 0x38800000u) {
    // Subnormal half (or zero): scale so that the half's smallest step 2^-24 becomes 1 and let the
    // float unit round to nearest even.
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;  // 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebased = magnitude - 0x38000000u;
  const uint32_t rounding = 0x0fffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

float Float16::to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -value : value;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace weft
