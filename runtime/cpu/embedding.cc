// CPU kernels: embedding lookup (row gather) and its backward (row scatter-add).
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/kernel_support.h"

namespace weft {
namespace {

template <class I>
int64_t checked_id(const I* ids, int64_t position, int64_t vocabulary, std::string_view op) {
  const int64_t id = static_cast<int64_t>(ids[position]);
  WEFT_CHECK(id >= 0 && id < vocabulary, op, ": id ", id, " at position ", position, " is outside the vocabulary [0, ",
             vocabulary, ")");
  return id;
}

}  // namespace

void CpuBackend::embedding(const Tensor& ids, const Tensor& weight, const Tensor& out) {
  const int64_t count = ids.numel(), vocabulary = weight.size(0), columns = weight.size(1);
  cpu::dispatch_index(ids.dtype(), "embedding", [&]<class I>() {
    const I* id_data = ids.data<I>();
    // Validate every id before writing anything.
    for (int64_t n = 0; n < count; ++n) checked_id(id_data, n, vocabulary, "embedding");
    cpu::dispatch_floating(weight.dtype(), "embedding", [&]<class T>() {
      const T* table = weight.data<T>();
      T* data = out.data<T>();
      for (int64_t n = 0; n < count; ++n) {
        const T* row = table + static_cast<int64_t>(id_data[n]) * columns;
        std::copy(row, row + columns, data + n * columns);
      }
    });
  });
}

void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& grad_out, const Tensor& grad_weight) {
  const int64_t count = ids.numel(), vocabulary = grad_weight.size(0), columns = grad_weight.size(1);
  cpu::dispatch_index(ids.dtype(), "embedding_backward", [&]<class I>() {
    const I* id_data = ids.data<I>();
    // Validate every id before adding anything: grad_weight may be a parameter's .grad itself.
    for (int64_t n = 0; n < count; ++n) checked_id(id_data, n, vocabulary, "embedding_backward");
    cpu::dispatch_floating(grad_weight.dtype(), "embedding_backward", [&]<class T>() {
      const T* gy = grad_out.data<T>();
      T* gw = grad_weight.data<T>();
      for (int64_t n = 0; n < count; ++n) {
        const int64_t id = static_cast<int64_t>(id_data[n]);
        for (int64_t c = 0; c < columns; ++c) {
          gw[id * columns + c] = store_element<T>(load_element(gw[id * columns + c]) + load_element(gy[n * columns + c]));
        }
      }
    });
  });
}

}  // namespace weft
