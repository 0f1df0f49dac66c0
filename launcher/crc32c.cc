#include "launcher/crc32c.h"

#include <array>
#include <cstring>

namespace weft {

namespace {

constexpr uint32_t kCastagnoliPolynomial = 0x82F63B78u;  // 0x1EDC6F41, bits reversed

// tables[0] is the byte-at-a-time table; tables[k] advances a byte's contribution by k more bytes,
// so that eight bytes are folded in with eight lookups and no dependency between them.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
  Tables tables{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (kCastagnoliPolynomial & (0u - (crc & 1u)));
    tables[0][byte] = crc;
  }
  for (size_t slice = 1; slice < tables.size(); ++slice) {
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const uint32_t previous = tables[slice - 1][byte];
      tables[slice][byte] = (previous >> 8) ^ tables[0][previous & 0xffu];
    }
  }
  return tables;
}

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t size) {
  static const Tables tables = make_tables();
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  // Eight bytes at a time as one little-endian word (weft's checkpoint format is little-endian
  // throughout, and so is every host it runs on).
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, sizeof(word));
    word ^= crc;
    crc = tables[7][word & 0xffu] ^ tables[6][(word >> 8) & 0xffu] ^ tables[5][(word >> 16) & 0xffu] ^
          tables[4][(word >> 24) & 0xffu] ^ tables[3][(word >> 32) & 0xffu] ^ tables[2][(word >> 40) & 0xffu] ^
          tables[1][(word >> 48) & 0xffu] ^ tables[0][word >> 56];
    bytes += 8;
    size -= 8;
  }
  while (size-- > 0) crc = (crc >> 8) ^ tables[0][(crc ^ *bytes++) & 0xffu];
  return ~crc;
}

}  // namespace weft
