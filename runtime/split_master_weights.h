// The f32 master weight of a bf16 parameter, kept as two 16-bit halves: the parameter itself holds
// the high half and an i16 tensor beside it (the optimizer's "low half") holds the rest. An f32
// master next to the bf16 parameter costs 4 bytes a parameter; the low half costs 2 and loses
// nothing: the pair is the f32 value exactly (optim/master_weights.h, runtime/optimizer_update.h).
//
// The high half is the master rounded to the nearest bf16, ties away from zero (NaN stays a quiet
// NaN); the low half is the master's bits minus the high half's, a signed 16-bit difference. With
// ties away from zero that difference is always in [-32768, 32767], which is what lets 16 bits
// hold it: with ties to even, a tie could round either way and its difference would need a 17th
// bit. So `master_bits(master_high_half(b), master_low_half(b)) == b` for every f32 bit pattern b
// that is not a NaN, and every pair the encoder makes decodes to a value that rounds back to its
// high half. A pair whose high half was written by something else (a weight load) decodes to the
// written value plus the old low half: less than half a bf16 step away, and rounding back to it.
//
// Host and device code share these functions (WEFT_HOST_DEVICE), so the CPU reference and the
// CUDA kernels cannot disagree on a bit.
#pragma once

#include <cstdint>

#include "runtime/host_device.h"

namespace weft {

// The bf16 bits of an f32 master: nearest, ties away from zero; a NaN becomes a quiet NaN.
WEFT_HOST_DEVICE inline uint16_t master_high_half(uint32_t master_bits) {
  if ((master_bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((master_bits >> 16) | 0x0040u);
  // Adding half a bf16 step to the bits and truncating rounds the magnitude half up: bit patterns
  // of one sign grow with the magnitude, and a tie (low half exactly 0x8000) goes up, away from 0.
  return static_cast<uint16_t>((master_bits + 0x8000u) >> 16);
}

// The low half: the master's bits minus its high half's (shifted up), as a signed 16-bit number.
// Its 16 bits are the master's low 16 bits; the sign says whether the rounding went up.
WEFT_HOST_DEVICE inline int16_t master_low_half(uint32_t master_bits) {
  return static_cast<int16_t>(static_cast<uint16_t>(master_bits & 0xffffu));
}

// The f32 bits of the master a bf16 parameter and its low half make. A zero parameter with a
// negative low half (only an outside write makes one: the encoder gives zero a low half >= 0)
// decodes to that zero, as the difference would otherwise carry the bits across the sign.
WEFT_HOST_DEVICE inline uint32_t master_bits(uint16_t parameter_bits, int16_t low_half) {
  if ((parameter_bits & 0x7fffu) == 0 && low_half < 0) return static_cast<uint32_t>(parameter_bits) << 16;
  return (static_cast<uint32_t>(parameter_bits) << 16) + static_cast<uint32_t>(static_cast<int32_t>(low_half));
}

}  // namespace weft
