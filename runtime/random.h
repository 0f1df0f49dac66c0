// Counter-based random numbers: Philox 4x32 with 10 rounds (Salmon et al., SC'11).
//
// A draw is a pure function of (seed, counter), so every backend and every thread produce the same
// numbers for the same (seed, offset) with no shared state: element i of a random tensor uses
// counter offset + i. This is what makes CPU and CUDA initial weights and dropout masks identical.
//
// Mapping (every backend must follow it exactly):
//   key     = (low 32 bits of seed, high 32 bits of seed)
//   counter = (low 32 bits of c, high 32 bits of c, 0, 0) with c = offset + i
//   words   = philox4x32_10(counter, key)
//   uniform = (words[0] >> 8) * 2^-24                      in [0, 1), 24 random bits
//   normal  = sqrt(-2 ln(u1)) * cos(2 pi u2), u1 = 1 - ((words[1] >> 8) * 2^-24) in (0, 1],
//             u2 = (words[2] >> 8) * 2^-24                 (Box-Muller, computed in double)
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "runtime/host_device.h"


namespace weft {

struct PhiloxWords {
  uint32_t word[4];
};

WEFT_HOST_DEVICE inline PhiloxWords philox4x32_10(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * c0;
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32), lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32), lo1 = static_cast<uint32_t>(product1);
    const uint32_t next0 = hi1 ^ c1 ^ k0, next2 = hi0 ^ c3 ^ k1;
    c0 = next0;
    c1 = lo1;
    c2 = next2;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxWords{{c0, c1, c2, c3}};
}

WEFT_HOST_DEVICE inline double philox_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(philox4x32_10(seed, counter).word[0] >> 8) * (1.0 / 16777216.0);
}

WEFT_HOST_DEVICE inline double philox_normal(uint64_t seed, uint64_t counter) {
  const PhiloxWords words = philox4x32_10(seed, counter);
  const double u1 = 1.0 - static_cast<double>(words.word[1] >> 8) * (1.0 / 16777216.0);
  const double u2 = static_cast<double>(words.word[2] >> 8) * (1.0 / 16777216.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925286766559 * u2);
}

}  // namespace weft
