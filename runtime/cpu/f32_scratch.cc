// f32 scratch tensors (f32_scratch.h).
#include "runtime/cpu/f32_scratch.h"

#include "runtime/cpu/cpu_backend.h"

namespace weft::cpu {
namespace {

bool computes_as_is(const Tensor& x) { return x.dtype() == kFloat32 || x.dtype() == kFloat64; }

}  // namespace

Tensor widened_to_f32(const Tensor& x) {
  if (computes_as_is(x)) return x;
  Tensor wide = Tensor::empty(x.shape(), kFloat32, Device::cpu());
  cpu_backend().copy(x, wide);
  return wide;
}

Tensor f32_output_for(const Tensor& out) {
  return computes_as_is(out) ? out : Tensor::empty(out.shape(), kFloat32, Device::cpu());
}

void store_from_f32(const Tensor& computed, const Tensor& out) {
  if (!computed.is_same(out)) cpu_backend().copy(computed, out);
}

}  // namespace weft::cpu
