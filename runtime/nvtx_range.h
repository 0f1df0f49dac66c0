// NvtxRange: an RAII range on the NVTX timeline, so that Nsight Systems shows weft's own names (a
// step-graph node, a backend op) above the kernels and collectives they issue.
//
// The constructor pushes a range named `name` on the calling thread's NVTX stack and the destructor
// pops it; ranges nest. Without a tool attached (no NVTX_INJECTION64_PATH, no nsys) each push and pop
// is a test of a null function pointer, so the ranges stay in release builds. `name` is copied by the
// tool (if any) during the push: it need only live until the constructor returns. CPU-only builds
// (no WEFT_HAVE_CUDA) compile the type to nothing.
#pragma once

#if defined(WEFT_HAVE_CUDA)
#include <nvtx3/nvToolsExt.h>
#endif

namespace weft {

class NvtxRange {
 public:
#if defined(WEFT_HAVE_CUDA)
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
#else
  explicit NvtxRange(const char*) {}
#endif
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace weft
