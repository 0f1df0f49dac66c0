// Where a tensor's storage lives: the host ("cpu") or one CUDA device ("cuda:N").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace weft {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device cpu() { return {DeviceType::kCpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const Device&) const = default;
  // "cpu" or "cuda:N".
  std::string to_string() const;
  // Parses "cpu", "cuda" (device 0) or "cuda:N"; throws weft::Error otherwise.
  static Device parse(std::string_view text);
};

}  // namespace weft
