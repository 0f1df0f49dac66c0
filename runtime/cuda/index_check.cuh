// Out-of-range ids (embedding) and targets (cross-entropy) on the GPU: how they become weft::Error
// without a host synchronization per call.
//
// The CPU backend checks every id before it computes. The GPU would need the ids on the host for
// that: a device-to-host copy and a stream synchronization in every call, which breaks two rules of
// DESIGN.md (no host synchronization inside a training step; a step can be captured into a CUDA
// graph, where synchronizing is illegal). So the CUDA backend does this instead:
// - Kernels never touch memory through a bad index: embedding writes a zero row, embedding_backward
//   skips the row, cross_entropy writes a NaN loss (so an unchecked mean loss shows it) and
//   cross_entropy_backward writes a zero gradient row. Valid indices behave exactly as on the CPU.
// - The first bad index seen by any kernel is recorded (op, position, value, bound) in one small
//   record in mapped, pinned host memory: zero-copy, written only when something is wrong.
// - Every call of embedding, embedding_backward, cross_entropy and cross_entropy_backward first
//   reads that record (a host memory read, no synchronization) and raises weft::Error naming the op,
//   the position, the value and the bound if an earlier kernel recorded one, then clears it. A bad
//   id therefore raises at the latest at the next such call: in practice in the same step's backward
//   or the next step's forward.
// - WEFT_CHECK_IDS=1 in the environment (read at each call) makes each of these calls synchronize
//   its stream after the launch and raise at once: for debugging, like CUDA_LAUNCH_BLOCKING. It is
//   skipped while the stream is being captured into a graph.
// - check_index_errors(stream) synchronizes and raises: for a training loop at a point where it
//   synchronizes anyway (the end of a step), and for tests.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace weft::cuda {

// Instantiates body for the stored type of an index tensor (i32 or i64).
template <class Body>
void dispatch_cuda_index(DType dtype, std::string_view op, Body&& body) {
  switch (dtype) {
    case kInt32: body.template operator()<int32_t>(); return;
    case kInt64: body.template operator()<int64_t>(); return;
    default: WEFT_FAIL(op, ": index dtype ", dtype_name(dtype), " is not supported (expected i32 or i64)");
  }
}

enum class IndexedOp : int { kNone = 0, kEmbedding, kEmbeddingBackward, kCrossEntropy, kCrossEntropyBackward };

struct IndexErrorRecord {
  unsigned int claimed;  // set by the first kernel thread that reports; the others leave
  unsigned int ready;    // set after the fields below are written
  int op;                // IndexedOp
  int unused;
  long long position;      // row of the bad id or target
  long long value;         // the bad id or target
  long long bound;         // vocabulary size V: valid values are [0, V)
  long long ignore_index;  // cross-entropy only
};

// The process's record, as a pointer kernels can write (mapped pinned host memory; created on first
// use, never freed).
IndexErrorRecord* index_error_record();

// Raises weft::Error (and clears the record) if a finished kernel recorded a bad index. No
// synchronization.
void raise_recorded_index_error();

// Called after each launch of a kernel that checks indices: with WEFT_CHECK_IDS=1 (and the stream
// not capturing), synchronizes `stream` and raises on a recorded error.
void finish_index_checked_launch(cudaStream_t stream);

// Synchronizes `stream` and raises on a recorded error.
void check_index_errors(cudaStream_t stream);

// Called by the one kernel thread that sees a bad index; the first report wins.
__device__ __forceinline__ void record_bad_index(IndexErrorRecord* record, IndexedOp op, long long position,
                                                 long long value, long long bound, long long ignore_index = 0) {
  if (atomicCAS(&record->claimed, 0u, 1u) == 0u) {
    record->op = static_cast<int>(op);
    record->position = position;
    record->value = value;
    record->bound = bound;
    record->ignore_index = ignore_index;
    __threadfence_system();  // the fields are visible to the host before `ready`
    atomicExch(&record->ready, 1u);
  }
}

}  // namespace weft::cuda
