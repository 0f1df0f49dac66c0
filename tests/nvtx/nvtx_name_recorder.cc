// An NVTX injection library for tests: loaded by NVTX itself when NVTX_INJECTION64_PATH names it (as
// Nsight Systems loads its own), it records the name of every range pushed with nvtxRangePushA, so
// that a test can assert what weft shows on the timeline (tests/unit/cuda_nvtx_test.cc).
//
// NVTX calls InitializeInjectionNvtx2 once per module that contains NVTX's header-only state (libweft
// and the test program each have one); each call points that module's RangePushA slot here. The
// names are read back through the two C functions at the end (dlsym on this library).
#include <nvtx3/nvToolsExt.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>

namespace {

std::mutex names_mutex;
std::deque<std::string> names;  // a deque: the pointers handed out stay valid as it grows

int NVTX_API record_range_push(const char* message) {
  std::lock_guard<std::mutex> lock(names_mutex);
  names.emplace_back(message != nullptr ? message : "");
  return 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || size <= NVTX_CBID_CORE_RangePushA) {
    return 0;
  }
  *table[NVTX_CBID_CORE_RangePushA] = reinterpret_cast<NvtxFunctionPointer>(&record_range_push);
  return 1;  // success: NVTX keeps the library and calls the slots set above
}

extern "C" __attribute__((visibility("default"))) size_t weft_nvtx_recorded_count() {
  std::lock_guard<std::mutex> lock(names_mutex);
  return names.size();
}

extern "C" __attribute__((visibility("default"))) const char* weft_nvtx_recorded_name(size_t index) {
  std::lock_guard<std::mutex> lock(names_mutex);
  return index < names.size() ? names[index].c_str() : nullptr;
}
