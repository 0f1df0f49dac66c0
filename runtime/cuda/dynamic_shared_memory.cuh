// Raising a kernel's dynamic shared-memory limit past the default 48 KiB, once per kernel, device and
// size: cudaFuncSetAttribute is a driver call, too slow for every launch of a 20 us kernel.
//
// Invariant: after allow_dynamic_shared_memory<Kernel>(bytes, device) returns, Kernel may be
// launched on `device` with up to `bytes` of dynamic shared memory (the largest size asked for so far
// stays granted; a smaller request changes nothing).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>

#include "runtime/cuda/cuda_check.h"

namespace weft::cuda {

inline constexpr int kMaxDevicesForAttributes = 64;

template <auto Kernel>
void allow_dynamic_shared_memory(size_t bytes, int device) {
  if (bytes <= 48 * 1024) return;
  WEFT_CHECK(device >= 0 && device < kMaxDevicesForAttributes, "CUDA device index ", device, " is out of range");
  static std::array<std::atomic<size_t>, kMaxDevicesForAttributes> granted{};
  static std::mutex mutex;
  if (granted[device].load(std::memory_order_acquire) >= bytes) return;
  // The slow path, once per new largest size: two threads must not leave a smaller limit set last.
  const std::lock_guard<std::mutex> lock(mutex);
  if (granted[device].load(std::memory_order_relaxed) >= bytes) return;
  WEFT_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  granted[device].store(bytes, std::memory_order_release);
}

}  // namespace weft::cuda
