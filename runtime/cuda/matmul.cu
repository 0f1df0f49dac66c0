// CUDA matmul through cuBLASLt: CudaBackend::matmul and the fused bias / GELU / GELU-backward
// epilogues and the residual-adding product of matmul.h.
//
// Row-major to column-major: weft's out[M, N] = a[M, K] @ bm[K, N] (row-major) is, read as
// column-major memory, out^T[N, M] = bm^T[N, K] @ a^T[K, M]. So cuBLASLt's "A" is bm and its "B" is
// a, and each operand is described as it lies in memory: a row-major [r, c] view is a column-major
// [c, r] matrix (op N), a transposed view (row stride 1) is a column-major [r, c] matrix (op T), each
// with its own leading dimension. Other layouts (both strides non-unit) are copied to contiguous.
//
// Batches: strided batches with cuBLASLt's batch count and per-operand batch offsets (0 for a shared
// operand). When bm is shared and a's batches are packed one after another, the batch folds into
// the rows (one [B*M, K] @ [K, N] product), which is faster and is what linear layers look like.
//
// Precision: f32 uses CUBLAS_COMPUTE_32F (no TF32), so results match the CPU within 1e-5; bf16 and
// f16 accumulate in f32 (compute 32F, scale type 32F). f64 and integers raise weft::Error.
//
// State per device: one cublasLt handle, created lazily; one 32 MiB workspace per (device, stream),
// allocated through weft (a device Tensor) so that two streams never share a workspace; the chosen
// algorithm cached per problem key (shape, ops, leading dims, batch strides, alignments, epilogue):
// the heuristic's first, or with WEFT_MATMUL_AUTOTUNE=1 (every product) or =epilogues (products
// with an epilogue) the fastest of its first few, timed on the key's first product (autotuning, below).
// Workspaces are keyed by the stream's process-unique id, not its handle (CUDA reuses a destroyed
// stream's handle, and a new stream must not share the old one's workspace while the old one's
// matmuls may still run), and dropped when weft destroys their stream (runtime/stream_retirement.h).
// All of it is intentionally leaked at exit (CUDA may already be torn down when static destructors
// run).
#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/matmul.h"
#include "runtime/cuda/stream.h"

namespace weft {
namespace cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// --- Per-device state -------------------------------------------------------------------------

struct LtState {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  std::map<StreamKey, Tensor> workspaces;
  std::map<std::array<int64_t, 24>, cublasLtMatmulAlgo_t> algorithms;
};

LtState& lt_state() {
  static LtState* state = [] {
    auto* created = new LtState;  // leaked on purpose (see the file comment)
    add_stream_retired_listener([created](const StreamKey& stream) {
      Tensor workspace;  // freed after the lock is dropped: freeing takes the allocator's lock
      {
        std::lock_guard<std::mutex> lock(created->mutex);
        auto found = created->workspaces.find(stream);
        if (found == created->workspaces.end()) return;
        workspace = std::move(found->second);
        created->workspaces.erase(found);
      }
    });
    return created;
  }();
  return *state;
}

cublasLtHandle_t lt_handle(int device) {
  LtState& state = lt_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  auto found = state.handles.find(device);
  if (found != state.handles.end()) return found->second;
  cublasLtHandle_t handle = nullptr;
  WEFT_CUBLAS_CHECK(cublasLtCreate(&handle));
  state.handles.emplace(device, handle);
  return handle;
}

// The workspace of the calling thread's current stream of `device`.
void* lt_workspace(int device) {
  LtState& state = lt_state();
  const StreamKey key = current_stream_key(device);
  std::lock_guard<std::mutex> lock(state.mutex);
  auto found = state.workspaces.find(key);
  if (found == state.workspaces.end()) {
    Tensor workspace = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / sizeof(float))}, kFloat32,
                                     Device::cuda(device));
    found = state.workspaces.emplace(key, std::move(workspace)).first;
  }
  return found->second.raw_data();
}

// --- RAII owners of cuBLASLt descriptors ----------------------------------------------------------

struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  MatmulDesc(cublasComputeType_t compute, cudaDataType_t scale) {
    WEFT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, scale));
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc); }
  template <class V>
  void set(cublasLtMatmulDescAttributes_t attribute, const V& value) {
    WEFT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
  }
};

struct LayoutDesc {
  cublasLtMatrixLayout_t desc = nullptr;
  LayoutDesc(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t batch_stride) {
    WEFT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&desc, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      WEFT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(desc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      WEFT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(desc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &batch_stride, sizeof(batch_stride)));
    }
  }
  ~LayoutDesc() { cublasLtMatrixLayoutDestroy(desc); }
};

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  Preference() { WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref); }
  template <class V>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, const V& value) {
    WEFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)));
  }
};

// --- Operand layouts -------------------------------------------------------------------------------

// A logical row-major [rows, cols] matrix with element strides (row_stride, col_stride), seen as
// column-major memory: either its transpose [cols, rows] (row-major view: op N) or itself
// [rows, cols] (transposed view: op T), with leading dimension ld.
struct ColumnMajor {
  bool usable = false;
  bool itself = false;  // true: memory is the matrix itself (column-major); false: its transpose
  int64_t ld = 0;
};

ColumnMajor column_major(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (cols == 1 || col_stride == 1) {
    const int64_t ld = rows == 1 ? cols : row_stride;
    if (ld >= std::max<int64_t>(cols, 1)) return {true, false, ld};
  }
  if (rows == 1 || row_stride == 1) {
    const int64_t ld = cols == 1 ? rows : col_stride;
    if (ld >= std::max<int64_t>(rows, 1)) return {true, true, ld};
  }
  return {};
}

// Largest power of two (<= 256) dividing every byte quantity given (0 entries are ignored).
int64_t alignment_of(std::initializer_list<int64_t> byte_values) {
  int64_t alignment = 256;
  for (int64_t value : byte_values) {
    if (value == 0) continue;
    while (alignment > 1 && value % alignment != 0) alignment /= 2;
  }
  return alignment;
}

int64_t address_of(const void* pointer) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(pointer)); }

cudaDataType_t cuda_type(DType dtype, std::string_view op) {
  switch (dtype) {
    case kFloat32: return CUDA_R_32F;
    case kBFloat16: return CUDA_R_16BF;
    case kFloat16: return CUDA_R_16F;
    default:
      WEFT_FAIL(op, ": dtype ", dtype_name(dtype), " is not supported on CUDA (expected f32, bf16 or f16)");
  }
}

// One product as cuBLASLt sees it, after layouts are settled.
struct Problem {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  int64_t batch = 1, m = 0, n = 0, k = 0;  // weft's out [batch, m, n] = a [batch, m, k] @ bm [batch, k, n]
  const void* a = nullptr;
  ColumnMajor a_layout;
  int64_t a_batch_stride = 0;  // elements
  const void* b = nullptr;
  ColumnMajor b_layout;
  int64_t b_batch_stride = 0;
  void* out = nullptr;
  const void* c = nullptr;  // cuBLASLt's C when it is not out (matmul_bias_add's addend), with beta 1
  float alpha = 1.f, beta = 0.f;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;  // the pre-GELU values (written by GELU_AUX, read by DGELU); ld = n
};

// --- Autotuning ----------------------------------------------------------------------------------

// cuBLASLt's heuristic ranks algorithms by a model; the first is not always the fastest at a
// training run's shapes. With autotuning (WEFT_MATMUL_AUTOTUNE=1; off by default: on the H200 it
// bought 1.9% on GPT-2 124M and 0.3% on Llama 1B, about the run-to-run spread, docs/performance.md),
// the first product of each problem key times up to kAutotuneCandidates of the heuristic's
// algorithms on the real operands and keeps the fastest for the rest of the process. That costs the
// first step a few milliseconds per shape and a synchronization; a run's later products, and every
// product of one key in one process, use one algorithm. Two processes may choose differently where
// two algorithms are within the timing noise, so with autotuning GPU results are not bitwise
// reproducible across runs (the CPU is unaffected). WEFT_MATMUL_AUTOTUNE=epilogues times only the
// products with an epilogue (bias, GELU, DGELU), where the heuristic's first is furthest from the
// fastest: at GPT 1.3B's MLP the GELU product took 396 µs autotuned against 470, yet the whole step
// gained only 0.2% at the H200's power cap (GPT-2 124M 0.5-1.0%; docs/performance.md, 2026-12-04).
constexpr int kAutotuneCandidates = 8;
constexpr int kAutotuneRuns = 3;

// WEFT_MATMUL_AUTOTUNE: "1" every product; "epilogues" only products with an epilogue.
int autotune_setting() {
  static const int setting = [] {
    const char* value = std::getenv("WEFT_MATMUL_AUTOTUNE");
    if (value == nullptr) return 0;
    if (std::string_view(value) == "1") return 1;
    return std::string_view(value) == "epilogues" ? 2 : 0;
  }();
  return setting;
}

bool autotune_enabled(cublasLtEpilogue_t epilogue) {
  const int setting = autotune_setting();
  return setting == 1 || (setting == 2 && epilogue != CUBLASLT_EPILOGUE_DEFAULT);
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  WEFT_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// What one cublasLtMatmul call of a Problem needs besides the algorithm.
struct LaunchDescriptors {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, cd;
  void* workspace;
};

cublasStatus_t launch(const Problem& p, const LaunchDescriptors& d, const cublasLtMatmulAlgo_t& algorithm, void* out) {
  return cublasLtMatmul(d.handle, d.desc, &p.alpha, p.b, d.a, p.a, d.b, &p.beta, p.c != nullptr ? p.c : p.out, d.cd,
                        out, d.cd, &algorithm, d.workspace, kWorkspaceBytes, p.stream);
}

// The candidate of `candidates` that runs `p` fastest, timed on p's stream. A product that
// accumulates (beta != 0) writes into a scratch output while timed, so that p.out is left as it
// was; otherwise the timing runs write p.out itself, which the real product then overwrites.
// Candidates whose state or launch fails are skipped; the first wins ties.
cublasLtMatmulAlgo_t fastest_algorithm(const Problem& p, const LaunchDescriptors& d,
                                       const cublasLtMatmulHeuristicResult_t* candidates, int count) {
  void* out = p.out;
  Tensor scratch;  // [batch * m * n] of the output's type, while an accumulating product is timed
  if (p.beta != 0.f) {
    const DType dtype = p.type == CUDA_R_32F ? kFloat32 : p.type == CUDA_R_16BF ? kBFloat16 : kFloat16;
    scratch = Tensor::empty({p.batch * p.m * p.n}, dtype, Device::cuda(p.device));
    out = scratch.raw_data();
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  WEFT_CUDA_CHECK(cudaEventCreate(&start));
  WEFT_CUDA_CHECK(cudaEventCreate(&stop));
  cublasLtMatmulAlgo_t best = candidates[0].algo;
  float best_ms = 0.f;
  bool timed_any = false;
  for (int i = 0; i < count; ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t& candidate = candidates[i].algo;
    if (launch(p, d, candidate, out) != CUBLAS_STATUS_SUCCESS) continue;  // warm-up, and the launch check
    WEFT_CUDA_CHECK(cudaEventRecord(start, p.stream));
    bool launched = true;
    for (int run = 0; run < kAutotuneRuns && launched; ++run) {
      launched = launch(p, d, candidate, out) == CUBLAS_STATUS_SUCCESS;
    }
    WEFT_CUDA_CHECK(cudaEventRecord(stop, p.stream));
    WEFT_CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed_ms = 0.f;
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&elapsed_ms, start, stop));
    if (launched && (!timed_any || elapsed_ms < best_ms)) {
      best = candidate;
      best_ms = elapsed_ms;
      timed_any = true;
    }
  }
  WEFT_CUDA_CHECK(cudaEventDestroy(start));
  WEFT_CUDA_CHECK(cudaEventDestroy(stop));
  return best;
}

void run_problem(const Problem& p, std::string_view op) {
  const int64_t element = p.type == CUDA_R_32F ? 4 : 2;
  // cuBLASLt: D'[n, m] (col-major, ld n) = op(A')[n, k] @ op(B')[k, m]; A' from bm, B' from a.
  // bm logical [k, n]: a row-major bm is memory [n, k] (op N); a transposed bm is memory [k, n] (op T).
  const cublasOperation_t op_a = p.b_layout.itself ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t a_rows = p.b_layout.itself ? p.k : p.n, a_cols = p.b_layout.itself ? p.n : p.k;
  // a logical [m, k]: a row-major a is memory [k, m] (op N); a transposed a is memory [m, k] (op T).
  const cublasOperation_t op_b = p.a_layout.itself ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t b_rows = p.a_layout.itself ? p.m : p.k, b_cols = p.a_layout.itself ? p.k : p.m;
  const int64_t out_batch_stride = p.m * p.n;
  const int64_t a_batch_stride = p.batch > 1 ? p.b_batch_stride : 0;  // cuBLASLt's A' is weft's bm
  const int64_t b_batch_stride = p.batch > 1 ? p.a_batch_stride : 0;

  const int64_t align_a = alignment_of({address_of(p.b), p.b_layout.ld * element, a_batch_stride * element});
  const int64_t align_b = alignment_of({address_of(p.a), p.a_layout.ld * element, b_batch_stride * element});
  const int64_t align_cd = alignment_of(
      {address_of(p.out), address_of(p.c), p.n * element, p.batch > 1 ? out_batch_stride * element : 0});
  const int64_t align_extra =
      alignment_of({address_of(p.bias), address_of(p.aux), p.aux != nullptr ? p.n * element : 0});

  MatmulDesc desc(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue);
    if (p.bias != nullptr) desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (p.aux != nullptr) {
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.n);
    }
  }
  LayoutDesc layout_a(p.type, a_rows, a_cols, p.b_layout.ld, p.batch, a_batch_stride);
  LayoutDesc layout_b(p.type, b_rows, b_cols, p.a_layout.ld, p.batch, b_batch_stride);
  LayoutDesc layout_cd(p.type, p.n, p.m, p.n, p.batch, out_batch_stride);

  const cublasLtHandle_t handle = lt_handle(p.device);
  void* workspace = lt_workspace(p.device);  // p.stream is the current stream

  const std::array<int64_t, 24> key = {p.device, static_cast<int64_t>(p.type), static_cast<int64_t>(p.epilogue),
                                       op_a, op_b, p.batch, p.m, p.n, p.k, p.b_layout.ld, p.a_layout.ld,
                                       a_batch_stride, b_batch_stride, align_a, align_b, align_cd, align_extra,
                                       p.beta != 0.f ? 1 : 0, p.bias != nullptr, p.aux != nullptr, 0, 0, 0, 0};
  cublasLtMatmulAlgo_t algorithm;
  bool cached = false;
  {
    LtState& state = lt_state();
    std::lock_guard<std::mutex> lock(state.mutex);
    auto found = state.algorithms.find(key);
    if (found != state.algorithms.end()) {
      algorithm = found->second;
      cached = true;
    }
  }
  if (!cached) {
    const int wanted = autotune_enabled(p.epilogue) && !stream_is_capturing(p.stream) ? kAutotuneCandidates : 1;
    Preference preference;
    preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align_a));
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align_b));
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align_cd));
    preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align_cd));
    std::array<cublasLtMatmulHeuristicResult_t, kAutotuneCandidates> results = {};
    int found = 0;
    WEFT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc.desc, layout_a.desc, layout_b.desc, layout_cd.desc,
                                                     layout_cd.desc, preference.pref, wanted, results.data(), &found));
    WEFT_CHECK(found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS, op, ": cuBLASLt found no algorithm for [",
               p.batch, ", ", p.m, ", ", p.k, "] @ [", p.batch, ", ", p.k, ", ", p.n, "] (epilogue ",
               static_cast<int>(p.epilogue), ", alignments ", align_a, "/", align_b, "/", align_cd, " bytes)");
    algorithm = results[0].algo;
    if (found > 1) {
      const LaunchDescriptors descriptors{handle, desc.desc, layout_a.desc, layout_b.desc, layout_cd.desc, workspace};
      algorithm = fastest_algorithm(p, descriptors, results.data(), found);
    }
    LtState& state = lt_state();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.algorithms.emplace(key, algorithm);
  }
  WEFT_CUBLAS_CHECK(cublasLtMatmul(handle, desc.desc, &p.alpha, p.b, layout_a.desc, p.a, layout_b.desc, &p.beta,
                                   p.c != nullptr ? p.c : p.out, layout_cd.desc, p.out, layout_cd.desc, &algorithm,
                                   workspace, kWorkspaceBytes, p.stream));
}

// Settles layouts (copying unusable operands to contiguous, folding a shared-bm batch into rows)
// and fills a Problem. `keep` holds any copies alive until the product is enqueued.
Problem make_problem(const Tensor& a_in, const Tensor& b_in, const Tensor& out, std::string_view op,
                     std::vector<Tensor>& keep) {
  WEFT_CHECK(a_in.dim() == 3 && b_in.dim() == 3 && out.dim() == 3, op, ": expected a [B, M, K], bm [B, K, N], out [B, M, N]; got ",
             a_in.describe(), ", ", b_in.describe(), ", ", out.describe());
  const int64_t batch = out.size(0), m = out.size(1), n = out.size(2), k = a_in.size(2);
  WEFT_CHECK(a_in.size(0) == batch && a_in.size(1) == m && b_in.size(0) == batch && b_in.size(1) == k &&
                 b_in.size(2) == n,
             op, ": shapes do not agree: a ", a_in.describe(), ", bm ", b_in.describe(), ", out ", out.describe());
  WEFT_CHECK(out.is_contiguous(), op, ": out must be contiguous, got ", out.describe());
  WEFT_CHECK(a_in.dtype() == out.dtype() && b_in.dtype() == out.dtype(), op, ": dtypes differ: ", a_in.describe(),
             ", ", b_in.describe(), ", ", out.describe());
  WEFT_CHECK(a_in.device().is_cuda() && a_in.device() == out.device() && b_in.device() == out.device(), op,
             ": operands must be on one CUDA device: ", a_in.describe(), ", ", b_in.describe(), ", ", out.describe());
  WEFT_CHECK(batch <= INT32_MAX, op, ": batch ", batch, " is too large for cuBLASLt");

  Problem p;
  p.device = out.device().index;
  p.type = cuda_type(out.dtype(), op);
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.out = out.raw_data();
  set_device(p.device);
  p.stream = current_stream(p.device);
  if (out.numel() == 0 || k == 0) return p;  // nothing for cuBLASLt to do (see the callers)

  Tensor a = a_in, b = b_in;
  // Fold a shared bm's batch into a's rows when a's batches are packed row-major.
  if (batch > 1 && b.stride(0) == 0 && (a.stride(2) == 1 || k == 1) && a.stride(0) == m * a.stride(1) &&
      a.stride(1) >= k) {
    p.batch = 1;
    p.m = batch * m;
    p.a_layout = column_major(p.m, k, a.stride(1), a.stride(2));
  } else {
    p.a_layout = column_major(m, k, a.stride(1), a.stride(2));
  }
  if (!p.a_layout.usable) {
    a = a_in.contiguous();
    keep.push_back(a);
    p.a_layout = column_major(m, k, a.stride(1), a.stride(2));
  }
  p.b_layout = column_major(k, n, b.stride(1), b.stride(2));
  if (!p.b_layout.usable) {
    b = b_in.contiguous();
    keep.push_back(b);
    p.b_layout = column_major(k, n, b.stride(1), b.stride(2));
  }
  WEFT_CHECK(p.a_layout.usable && p.b_layout.usable, op, ": internal error: no cuBLASLt layout for ", a.describe(),
             " @ ", b.describe());
  p.a = a.raw_data();
  p.b = b.raw_data();
  p.a_batch_stride = a.stride(0);
  p.b_batch_stride = b.stride(0);
  return p;
}

void run_epilogue(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out, const Tensor& pre_gelu,
                  cublasLtEpilogue_t epilogue, std::string_view op) {
  std::vector<Tensor> keep;
  Problem p = make_problem(a, bm, out, op, keep);
  if (out.numel() == 0) return;
  WEFT_CHECK(p.k > 0, op, ": K = 0 is not supported with an epilogue");
  WEFT_CHECK(p.batch == 1, op, ": the batch must fold into rows (B == 1, or bm shared with batch stride 0 and a's ",
             "batches packed); got a ", a.describe(), ", bm ", bm.describe());
  WEFT_CHECK(bias.defined() && bias.dim() == 1 && bias.size(0) == p.n && bias.is_contiguous() &&
                 bias.dtype() == out.dtype() && bias.device() == out.device(),
             op, ": bias must be [", p.n, "] contiguous, ", dtype_name(out.dtype()), " on ", out.device().to_string(),
             "; got ", bias.describe());
  if (pre_gelu.defined()) {
    WEFT_CHECK(pre_gelu.shape() == out.shape() && pre_gelu.is_contiguous() && pre_gelu.dtype() == out.dtype() &&
                   pre_gelu.device() == out.device(),
               op, ": pre_gelu must match out ", out.describe(), "; got ", pre_gelu.describe());
    WEFT_CHECK(p.n % 8 == 0, op, ": pre_gelu needs N divisible by 8 (cuBLASLt's aux leading dimension); N = ", p.n);
    p.aux = pre_gelu.raw_data();
  }
  p.bias = bias.raw_data();
  p.epilogue = epilogue;
  run_problem(p, op);
}

}  // namespace

void matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_gelu, const Tensor& out) {
  std::vector<Tensor> keep;
  Problem p = make_problem(a, bm, out, "matmul_gelu_backward", keep);
  if (out.numel() == 0) return;
  WEFT_CHECK(p.k > 0 && p.batch == 1, "matmul_gelu_backward: needs K > 0 and a batch that folds into rows; got a ",
             a.describe(), ", bm ", bm.describe());
  WEFT_CHECK(pre_gelu.shape() == out.shape() && pre_gelu.is_contiguous() && pre_gelu.dtype() == out.dtype() &&
                 pre_gelu.device() == out.device() && p.n % 8 == 0,
             "matmul_gelu_backward: pre_gelu must match out ", out.describe(), " (contiguous, N a multiple of 8); got ",
             pre_gelu.describe());
  p.aux = const_cast<void*>(pre_gelu.raw_data());  // read only: DGELU reads the aux matrix
  p.epilogue = CUBLASLT_EPILOGUE_DGELU;
  run_problem(p, "matmul_gelu_backward");
}

void matmul_bias_add(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& addend, const Tensor& out) {
  std::vector<Tensor> keep;
  Problem p = make_problem(a, bm, out, "matmul_bias_add", keep);
  if (out.numel() == 0) return;
  WEFT_CHECK(p.k > 0 && p.batch == 1, "matmul_bias_add: needs K > 0 and a batch that folds into rows; got a ",
             a.describe(), ", bm ", bm.describe());
  WEFT_CHECK(addend.shape() == out.shape() && addend.is_contiguous() && addend.dtype() == out.dtype() &&
                 addend.device() == out.device() && addend.raw_data() != out.raw_data(),
             "matmul_bias_add: addend must match out ", out.describe(), " (contiguous, not out itself); got ",
             addend.describe());
  if (bias.defined()) {
    WEFT_CHECK(bias.dim() == 1 && bias.size(0) == p.n && bias.is_contiguous() && bias.dtype() == out.dtype() &&
                   bias.device() == out.device(),
               "matmul_bias_add: bias must be [", p.n, "] contiguous, ", dtype_name(out.dtype()), "; got ",
               bias.describe());
    p.bias = bias.raw_data();
    p.epilogue = CUBLASLT_EPILOGUE_BIAS;
  }
  p.c = addend.raw_data();
  p.beta = 1.f;
  run_problem(p, "matmul_bias_add");
}

void matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out) {
  run_epilogue(a, bm, bias, out, Tensor(), CUBLASLT_EPILOGUE_BIAS, "matmul_bias");
}

void matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                      const Tensor& pre_gelu) {
  run_epilogue(a, bm, bias, out, pre_gelu,
               pre_gelu.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS,
               "matmul_bias_gelu");
}

}  // namespace cuda

void CudaBackend::matmul(const Tensor& a, const Tensor& bm, const Tensor& out, double alpha, double beta) {
  std::vector<Tensor> keep;
  cuda::Problem p = cuda::make_problem(a, bm, out, "matmul", keep);
  if (out.numel() == 0) return;
  if (p.k == 0) {
    // An empty inner dimension: the product is zero (cuBLASLt does not take k = 0 everywhere).
    if (beta == 0.0) {
      WEFT_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, static_cast<size_t>(out.numel() * out.element_size()), p.stream));
    } else {
      affine(out, beta, 0.0, out);
    }
    return;
  }
  p.alpha = static_cast<float>(alpha);
  p.beta = static_cast<float>(beta);
  cuda::run_problem(p, "matmul");
}

// The bias rides cuBLASLt's epilogue when the batch is one product (a linear layer's rows); other
// cases take the default (matmul, then a broadcast add).
void CudaBackend::matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out) {
  const bool fused = out.numel() > 0 && out.dim() == 3 && out.size(0) == 1 && a.dim() == 3 && a.size(2) > 0 &&
                     out.is_contiguous() && bias.defined() && bias.dim() == 1 && bias.size(0) == out.size(2) &&
                     bias.is_contiguous() && bias.dtype() == out.dtype() && bias.device() == out.device() &&
                     out.dtype() != kFloat64;
  if (!fused) {
    Backend::matmul_bias(a, bm, bias, out);
    return;
  }
  cuda::matmul_bias(a, bm, bias, out);
}

// The addend rides cuBLASLt's C (beta 1) and the bias its epilogue when the batch is one product (a
// linear layer's rows); other cases take the default (matmul_bias or matmul, then an add).
void CudaBackend::matmul_bias_add(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& addend,
                                  const Tensor& out) {
  const bool fused = out.numel() > 0 && out.dim() == 3 && out.size(0) == 1 && a.dim() == 3 && a.size(2) > 0 &&
                     out.is_contiguous() && out.dtype() != kFloat64 && addend.shape() == out.shape() &&
                     addend.is_contiguous() && addend.dtype() == out.dtype() && addend.device() == out.device() &&
                     addend.raw_data() != out.raw_data() &&
                     (!bias.defined() || (bias.dim() == 1 && bias.size(0) == out.size(2) && bias.is_contiguous() &&
                                          bias.dtype() == out.dtype() && bias.device() == out.device()));
  if (!fused) {
    Backend::matmul_bias_add(a, bm, bias, addend, out);
    return;
  }
  cuda::matmul_bias_add(a, bm, bias, addend, out);
}

// gelu' rides cuBLASLt's DGELU epilogue (aux = the pre-activation, N a multiple of 8) in the
// linear-layer case; other cases take the default (matmul, then unary_backward).
void CudaBackend::matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_activation,
                                       const Tensor& out) {
  const bool fused = out.numel() > 0 && out.dim() == 3 && out.size(0) == 1 && a.dim() == 3 && a.size(2) > 0 &&
                     out.is_contiguous() && out.size(2) % 8 == 0 && out.dtype() != kFloat64 &&
                     pre_activation.defined() && pre_activation.shape() == out.shape() &&
                     pre_activation.is_contiguous() && pre_activation.dtype() == out.dtype() &&
                     pre_activation.device() == out.device();
  if (!fused) {
    Backend::matmul_gelu_backward(a, bm, pre_activation, out);
    return;
  }
  cuda::matmul_gelu_backward(a, bm, pre_activation, out);
}

// GELU and the bias ride cuBLASLt's GELU_AUX_BIAS epilogue (aux = the pre-activation, needing N a
// multiple of 8) in the linear-layer case; other cases take the default (matmul_bias, then gelu).
void CudaBackend::matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                                   const Tensor& pre_activation) {
  const bool fused = out.numel() > 0 && out.dim() == 3 && out.size(0) == 1 && a.dim() == 3 && a.size(2) > 0 &&
                     out.is_contiguous() && out.size(2) % 8 == 0 && bias.defined() && bias.dim() == 1 &&
                     bias.size(0) == out.size(2) && bias.is_contiguous() && bias.dtype() == out.dtype() &&
                     bias.device() == out.device() && out.dtype() != kFloat64 && pre_activation.defined() &&
                     pre_activation.shape() == out.shape() && pre_activation.is_contiguous() &&
                     pre_activation.dtype() == out.dtype() && pre_activation.device() == out.device();
  if (!fused) {
    Backend::matmul_bias_gelu(a, bm, bias, out, pre_activation);
    return;
  }
  cuda::matmul_bias_gelu(a, bm, bias, out, pre_activation);
}

}  // namespace weft
