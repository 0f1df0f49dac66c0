// The elementwise binary ops of Backend::binary, and their arithmetic, which the CPU and CUDA backends
// share (compute type C: f32 for f32/bf16/f16 on CUDA, the CPU backend's ComputeType on the CPU).
#pragma once

#include <cstdint>

#include "runtime/host_device.h"

namespace weft {

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv };

template <class C>
WEFT_HOST_DEVICE inline C apply_binary_op(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
  }
  return a;
}

}  // namespace weft
