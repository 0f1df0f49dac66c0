// Element types of tensors and their conversions.
//
// Floating tensors are stored as f32, bf16, f16 or f64 and computed in f32 (f64 in double, which
// the gradient checks use). bf16 and f16 are 16-bit storage formats: conversion from float rounds
// to nearest, ties to even, and keeps NaN a NaN; conversion to float is exact. Integer tensors
// (i32, i64) hold token ids, targets and indices; i16 holds the low halves of the optimizer's f32
// master weights for bf16 parameters (optim/master_weights.h) and is only stored, copied and moved.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace weft {

enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kFloat64, kInt32, kInt64, kInt16 };

inline constexpr DType kFloat32 = DType::kFloat32;
inline constexpr DType kBFloat16 = DType::kBFloat16;
inline constexpr DType kFloat16 = DType::kFloat16;
inline constexpr DType kFloat64 = DType::kFloat64;
inline constexpr DType kInt32 = DType::kInt32;
inline constexpr DType kInt64 = DType::kInt64;
inline constexpr DType kInt16 = DType::kInt16;

// Bytes per element.
int64_t dtype_size(DType dtype);
// "f32", "bf16", "f16", "f64", "i32", "i64", "i16".
std::string_view dtype_name(DType dtype);
// Parses a name as dtype_name prints it (also "float32", "bfloat16", "float16", "float64", "int32",
// "int64", "int16"); throws weft::Error naming the valid names otherwise.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);
bool is_integer(DType dtype);

// 16-bit brain float: the top half of an IEEE f32.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value) : bits(from_float(value)) {}
  explicit operator float() const {
    uint32_t word = static_cast<uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &word, sizeof(value));
    return value;
  }
  static uint16_t from_float(float value) {
    uint32_t word;
    std::memcpy(&word, &value, sizeof(word));
    if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x0040u);  // quiet NaN
    // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
    uint32_t rounding = 0x7fffu + ((word >> 16) & 1u);
    return static_cast<uint16_t>((word + rounding) >> 16);
  }
};

// IEEE 754 half precision (1 sign, 5 exponent, 10 mantissa bits).
struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }
  static uint16_t from_float(float value);
  static float to_float(uint16_t bits);
};

// The C++ type that holds one element of each dtype, and the type kernels compute in.
template <DType D> struct StorageTypeOf;
template <> struct StorageTypeOf<DType::kFloat32> { using type = float; };
template <> struct StorageTypeOf<DType::kBFloat16> { using type = BFloat16; };
template <> struct StorageTypeOf<DType::kFloat16> { using type = Float16; };
template <> struct StorageTypeOf<DType::kFloat64> { using type = double; };
template <> struct StorageTypeOf<DType::kInt32> { using type = int32_t; };
template <> struct StorageTypeOf<DType::kInt64> { using type = int64_t; };
template <> struct StorageTypeOf<DType::kInt16> { using type = int16_t; };

template <class T>
using ComputeType = std::conditional_t<std::is_same_v<T, double>, double,
                                       std::conditional_t<std::is_integral_v<T>, T, float>>;

template <class T> DType dtype_of();
template <> inline DType dtype_of<float>() { return kFloat32; }
template <> inline DType dtype_of<BFloat16>() { return kBFloat16; }
template <> inline DType dtype_of<Float16>() { return kFloat16; }
template <> inline DType dtype_of<double>() { return kFloat64; }
template <> inline DType dtype_of<int32_t>() { return kInt32; }
template <> inline DType dtype_of<int64_t>() { return kInt64; }
template <> inline DType dtype_of<int16_t>() { return kInt16; }

// Narrows a double to float rounding to odd (truncate, then set the lowest bit when inexact).
// A 16-bit format rounded to nearest from that float equals the double rounded once, because float
// keeps more than two extra bits; a plain double -> float -> 16-bit cast would round twice.
inline float round_to_odd_float(double value) {
  float narrowed = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(narrowed) == value) return narrowed;
  if (std::fabs(static_cast<double>(narrowed)) > std::fabs(value)) narrowed = std::nextafter(narrowed, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &narrowed, sizeof(bits));
  bits |= 1u;
  std::memcpy(&narrowed, &bits, sizeof(bits));
  return narrowed;
}

// The dtype of per-row statistics (mean, rstd, log-sum-exp, per-row losses) and of optimizer state:
// f64 for f64 tensors, f32 for every other floating dtype. StatisticType<T> is its C++ type.
inline DType statistic_dtype(DType dtype) { return dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }
template <class T>
using StatisticType = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Load one stored element as its compute type, and store a computed value back (rounding once).
template <class T>
inline ComputeType<T> load_element(const T& value) {
  return static_cast<ComputeType<T>>(value);
}
template <class T, class V>
inline T store_element(V value) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>) {
    if constexpr (std::is_same_v<V, double>) return T(round_to_odd_float(value));
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

}  // namespace weft
