#include "runtime/cpu/cpu_backend.h"

#include "runtime/error.h"

namespace weft {
namespace {
Backend* registered_cuda_backend = nullptr;
}  // namespace

CpuBackend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

void register_backend(DeviceType type, Backend* backend) {
  WEFT_CHECK(type == DeviceType::kCuda, "register_backend: the CPU backend is built in");
  registered_cuda_backend = backend;
}

Backend& backend_for(Device device) {
  if (device.is_cpu()) return cpu_backend();
  WEFT_CHECK(registered_cuda_backend != nullptr, "device ", device.to_string(),
             " requested, but this build of weft has no CUDA backend (rebuild with -DWEFT_CUDA=ON on a machine "
             "with the CUDA toolkit)");
  return *registered_cuda_backend;
}

}  // namespace weft
