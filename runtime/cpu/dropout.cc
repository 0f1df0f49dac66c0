// CPU kernel: dropout with a counter-based mask (see runtime/random.h for the draw).
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"
#include "runtime/random.h"

namespace weft {

void CpuBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  cpu::dispatch_floating(x.dtype(), "dropout", [&]<class T>() {
    using C = ComputeType<T>;
    const T* in = x.data<T>();
    T* data = out.data<T>();
    const C keep_scale = C(1.0 / (1.0 - p));
    const int64_t count = x.numel();
    for (int64_t i = 0; i < count; ++i) {
      const bool keep = philox_uniform(seed, offset + static_cast<uint64_t>(i)) >= p;
      data[i] = store_element<T>(keep ? load_element(in[i]) * keep_scale : C(0));
    }
  });
}

}  // namespace weft
