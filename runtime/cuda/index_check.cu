// The host side of the GPU index checks (see index_check.cuh for the policy).
#include "runtime/cuda/index_check.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

namespace weft::cuda {
namespace {

struct MappedRecord {
  IndexErrorRecord* host = nullptr;    // the host's view
  IndexErrorRecord* device = nullptr;  // the kernels' view (the same address under unified addressing)
};

MappedRecord& mapped_record() {
  // Leaked on purpose: static destructors may run after the CUDA runtime has shut down.
  static MappedRecord* record = [] {
    auto* mapped = new MappedRecord;
    void* host = nullptr;
    // Portable: kernels of every device may write it. Mapped: kernels write it directly.
    WEFT_CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(host, 0, sizeof(IndexErrorRecord));
    void* device = nullptr;
    WEFT_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
    mapped->host = static_cast<IndexErrorRecord*>(host);
    mapped->device = static_cast<IndexErrorRecord*>(device);
    return mapped;
  }();
  return *record;
}

bool check_ids_requested() {
  const char* value = std::getenv("WEFT_CHECK_IDS");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

}  // namespace

IndexErrorRecord* index_error_record() { return mapped_record().device; }

void raise_recorded_index_error() {
  IndexErrorRecord* record = mapped_record().host;
  volatile IndexErrorRecord* shared = record;
  if (shared->ready == 0u) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  const IndexedOp op = static_cast<IndexedOp>(shared->op);
  const long long position = shared->position, value = shared->value, bound = shared->bound;
  const long long ignore_index = shared->ignore_index;
  // Clear it, so that the process can go on after catching the error.
  shared->ready = 0u;
  std::atomic_thread_fence(std::memory_order_release);
  shared->claimed = 0u;
  constexpr const char* kWhere = " (found on the GPU; WEFT_CHECK_IDS=1 makes the failing call itself raise)";
  switch (op) {
    case IndexedOp::kEmbedding:
    case IndexedOp::kEmbeddingBackward:
      WEFT_FAIL(op == IndexedOp::kEmbedding ? "embedding" : "embedding_backward", ": id ", value, " at position ",
                position, " is outside the vocabulary [0, ", bound, ")", kWhere);
    case IndexedOp::kCrossEntropy:
    case IndexedOp::kCrossEntropyBackward:
      WEFT_FAIL(op == IndexedOp::kCrossEntropy ? "cross_entropy" : "cross_entropy_backward", ": target ", value,
                " of row ", position, " is outside [0, ", bound, ") and is not ignore_index (", ignore_index, ")",
                kWhere);
    case IndexedOp::kNone:
      break;
  }
  WEFT_FAIL("an index outside its bound was found on the GPU (value ", value, ", position ", position, ")");
}

void check_index_errors(cudaStream_t stream) {
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  raise_recorded_index_error();
}

void finish_index_checked_launch(cudaStream_t stream) {
  if (!check_ids_requested()) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return;
  check_index_errors(stream);
}

}  // namespace weft::cuda
