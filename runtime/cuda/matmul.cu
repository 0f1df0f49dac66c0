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
// the fastest of the heuristic's first few that writes the same bits as its first, timed on the key's
// first product (autotuning, below; WEFT_MATMUL_AUTOTUNE=0: the heuristic's first).
// Workspaces are keyed by the stream's process-unique id, not its handle (CUDA reuses a destroyed
// stream's handle, and a new stream must not share the old one's workspace while the old one's
// matmuls may still run), and dropped when weft destroys their stream (runtime/stream_retirement.h).
// All of it is intentionally leaked at exit (CUDA may already be torn down when static destructors
// run).
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/clock.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/hopper_products.h"
#include "runtime/cuda/matmul.h"
#include "runtime/cuda/matmul_tuning_cache.h"
#include "runtime/cuda/stream.h"
#include "runtime/determinism.h"

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
  // Keys whose tuning was put off (the product changed nothing in its output), and how many times.
  std::map<std::array<int64_t, 24>, int> inconclusive;
  // Tuned choices kept across processes (matmul_tuning_cache.h), read on the first tuned product.
  std::unique_ptr<MatmulTuningCache> tuning_cache;
  std::map<int, std::string> device_signatures;
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

// "[batch, m, k] @ [k, n] epilogue e": how the autotuner's verbose lines name a product
// (tools/device/autotune-bits-probe reads them).
std::string product_text(const Problem& p) {
  return "[" + std::to_string(p.batch) + ", " + std::to_string(p.m) + ", " + std::to_string(p.k) + "] @ [" +
         std::to_string(p.k) + ", " + std::to_string(p.n) + "] epilogue " + std::to_string(static_cast<int>(p.epilogue));
}

// --- Autotuning ----------------------------------------------------------------------------------

// cuBLASLt's heuristic ranks algorithms by a model; the first is not always the fastest at a
// training run's shapes. With autotuning (by default, and WEFT_MATMUL_AUTOTUNE=1: every product;
// =epilogues: the products with an epilogue, bias, GELU, DGELU; =0: none), the first product of each
// problem key times candidate algorithms on the real operands and keeps the fastest for the rest of
// the process: the heuristic's first eight, then the best few configurations of every algorithm id
// (candidate_algorithms; at GPT-2's shapes 33 in all, whose best took 2-10% less time than the best
// of the eight on weight-gradient products). Products issued while a stream is captured into a CUDA
// graph take the heuristic's first: timing cannot run there.
//
// Autotuning keeps the heuristic's bits: the heuristic's first algorithm runs first and a 64-bit
// fingerprint of its output is taken on the device; every other candidate's output (and GELU's
// pre-activation output) is fingerprinted likewise, and only a candidate that wrote the same bits
// (the same fingerprint; another output gives another except with a chance of about 2^-64) may be
// chosen.
// Two algorithms that add a dot product's terms in another order (split-K, stream-K, another
// K tile) give other bits on real data and are passed over, so which candidate wins the timing,
// which varies between processes and ranks, never changes a result: a tuned run computes what an
// untuned one does, bit for bit, and a resumed run continues it exactly. That costs the first
// step up to a few hundred milliseconds per shape (a language model's head) and a synchronization;
// a candidate whose first run is far slower than the reference stops after it (kAutotuneCutoff).
// The choices are kept in a file (matmul_tuning_cache.h) keyed by the device's kind, cuBLASLt's
// version and the problem key, so a later process skips the timing of every shape it finds there.
//
// Bits compared on data that cannot tell algorithms apart prove nothing: where an operand is zero
// (a layer initialised to zero, as LoRA's second factor is; a gradient that is zero at the first
// step), every candidate writes the same output, and a choice made then would be kept in the file
// although it writes other bits on real data. So before timing, the heuristic's first runs once
// more with alpha 0: if the output is the same bits, the product contributed nothing to it, the
// tuning is put off (this product takes the heuristic's first, nothing is remembered) and the key's
// next product tries again, up to kInconclusiveLimit products, after which the heuristic's first
// stays for the process (not in the file). A product that changes only a few entries of its output
// (an operand zero but for a few rows) is not detected; the zero operand is the case training meets.
constexpr int kHeuristicCandidates = 8;   // the heuristic's own ranking
constexpr int kConfigurationsPerId = 4;   // then the best few configurations of every algorithm id
constexpr int kMaxCandidates = 64;
constexpr int kAutotuneRuns = 3;
constexpr float kAutotuneMargin = 0.02f;  // how much faster than the heuristic's first a candidate must be
// A candidate whose first timed run takes this much longer than the reference's first did cannot
// come out 2% faster over three runs: its other runs and its fingerprint are skipped.
constexpr float kAutotuneCutoff = 1.25f;
constexpr int kInconclusiveLimit = 8;  // products of a key put off before its heuristic's first stays

// 0 off, 1 every product (the default), 2 products with an epilogue, 3 every product with any
// repeatable bits (kAutotuneFastest). From WEFT_MATMUL_AUTOTUNE ("0", "1", "epilogues", "fastest"),
// or set_matmul_autotune_for_testing.
//
// "fastest" lifts the bits rule for those who want the speed more than the untuned bits: a
// candidate that sums in another order (on GPT-2's shapes, the split-K and stream-K kernels of the
// weight gradients: the MLP-down one took 105-107 us with such candidates against 120-122 us with
// the heuristic's bits, docs/performance.md, 2026-12-04) may be kept,
// provided it repeats its own bits (the same fingerprint before and after its timed runs), so a
// process still computes the same thing step after step. Results then depend on which candidate won
// the timing; the tuning cache keeps these choices apart (tuning_signature), so a resumed run on
// the same machine takes the same choices, and a process of the default setting never takes one.
constexpr int kAutotuneFastest = 3;
std::atomic<int>& autotune_setting() {
  static std::atomic<int> setting = [] {
    const char* value = std::getenv("WEFT_MATMUL_AUTOTUNE");
    if (value == nullptr) return 1;
    const std::string_view text(value);
    if (text == "0") return 0;
    if (text == "1") return 1;
    if (text == "epilogues") return 2;
    if (text == "fastest") return kAutotuneFastest;
    std::fprintf(stderr, "weft: WEFT_MATMUL_AUTOTUNE=%s is not one of 0, 1, epilogues, fastest; using 1\n", value);
    return 1;
  }();
  return setting;
}

// Deterministic kernels (runtime/determinism.h) keep the heuristic's first: a choice by timing can
// differ between two runs, and with it the products' bits.
bool autotune_enabled(cublasLtEpilogue_t epilogue) {
  if (deterministic_kernels()) return false;
  const int setting = autotune_setting().load();
  return setting == 1 || setting == kAutotuneFastest || (setting == 2 && epilogue != CUBLASLT_EPILOGUE_DEFAULT);
}

bool autotune_verbose() {
  static const bool verbose = [] {
    const char* value = std::getenv("WEFT_MATMUL_AUTOTUNE_VERBOSE");
    return value != nullptr && std::string_view(value) == "1";
  }();
  return verbose;
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

// sum[0] += a fingerprint of `count` 16-bit words: the wrapping sum over every word w at index i of
// splitmix64's finalizer applied to (i << 16 | w) + salt. Any change of bits changes the sum except
// with a chance of about 2^-64, and the order in which threads add (atomics) does not change it.
__device__ __forceinline__ unsigned long long fingerprint_term(int64_t index, uint16_t word, uint64_t salt) {
  uint64_t z = ((static_cast<uint64_t>(index) << 16) | word) + salt;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fingerprint_kernel(const uint16_t* words, int64_t count, uint64_t salt, unsigned long long* sum) {
  unsigned long long mine = 0;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Eight words (16 bytes) per load where the buffer allows: a head's logits are gigabytes.
  const int64_t packs = reinterpret_cast<uintptr_t>(words) % 16 == 0 ? count / 8 : 0;
  for (int64_t pack = thread; pack < packs; pack += step) {
    const uint4 bits = reinterpret_cast<const uint4*>(words)[pack];
    const uint32_t halves[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      mine += fingerprint_term(8 * pack + 2 * j, static_cast<uint16_t>(halves[j] & 0xffffu), salt);
      mine += fingerprint_term(8 * pack + 2 * j + 1, static_cast<uint16_t>(halves[j] >> 16), salt);
    }
  }
  for (int64_t i = 8 * packs + thread; i < count; i += step) mine += fingerprint_term(i, words[i], salt);
  atomicAdd(sum, mine);
}

// The fingerprint of a product's outputs (the product, and GELU's pre-activation output where the
// epilogue writes one) as they are now: how candidates' outputs are compared with the heuristic's
// first without keeping a copy of them (the logits of a language model's head are gigabytes).
class OutputFingerprint {
 public:
  OutputFingerprint(const Problem& p, std::vector<void*> outputs) : stream_(p.stream), outputs_(std::move(outputs)) {
    const int64_t element = p.type == CUDA_R_32F ? 4 : 2;
    words_ = p.batch * p.m * p.n * element / 2;
    sum_ = Tensor::empty({1}, kInt64, Device::cuda(p.device));
  }
  // Synchronizes the stream.
  uint64_t take() {
    WEFT_CUDA_CHECK(cudaMemsetAsync(sum_.raw_data(), 0, sizeof(unsigned long long), stream_));
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(1024, (words_ + 255) / 256));
    for (size_t i = 0; i < outputs_.size(); ++i) {
      fingerprint_kernel<<<static_cast<unsigned int>(blocks), 256, 0, stream_>>>(
          static_cast<const uint16_t*>(outputs_[i]), words_, 0x9e3779b97f4a7c15ull * (i + 1),
          static_cast<unsigned long long*>(sum_.raw_data()));
      WEFT_CUDA_CHECK_LAUNCH();
    }
    unsigned long long sum = 0;
    WEFT_CUDA_CHECK(cudaMemcpyAsync(&sum, sum_.raw_data(), sizeof(sum), cudaMemcpyDeviceToHost, stream_));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return sum;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> outputs_;
  int64_t words_ = 0;
  Tensor sum_;
};

bool epilogue_writes_aux(cublasLtEpilogue_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_GELU_AUX || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

std::mutex& autotune_records_mutex() {
  static auto* mutex = new std::mutex;  // leaked on purpose (see the file comment)
  return *mutex;
}

std::vector<MatmulAutotuneRecord>& autotune_records() {
  static auto* records = new std::vector<MatmulAutotuneRecord>;
  return *records;
}

// Times runs of one candidate on p's stream, one event pair per run. Each timed run is issued
// while the GPU is still busy (after the warm-up, or an untimed run), so that its time holds no
// launch gap: the GPU is idle after each of the tuning's synchronizations. (Emptying the L2 cache
// before each run, so that operands come from memory as in a training step, was tried: the
// throughput of the runs it tuned was the same; docs/performance.md, 2026-12-04, fifth session.)
class RunTimer {
 public:
  RunTimer(const Problem& p, const LaunchDescriptors& d, void* out) : p_(p), d_(d), out_(out) {
    for (int r = 0; r < kAutotuneRuns; ++r) {
      WEFT_CUDA_CHECK(cudaEventCreate(&starts_[r]));
      WEFT_CUDA_CHECK(cudaEventCreate(&stops_[r]));
    }
  }
  ~RunTimer() {
    for (int r = 0; r < kAutotuneRuns; ++r) {
      cudaEventDestroy(starts_[r]);
      cudaEventDestroy(stops_[r]);
    }
  }
  RunTimer(const RunTimer&) = delete;
  RunTimer& operator=(const RunTimer&) = delete;

  // Milliseconds of `runs` products (at most kAutotuneRuns), or -1 if a launch failed. Synchronizes.
  // `busy`: the caller has just issued work that the GPU is still running (no untimed run needed).
  float time(const cublasLtMatmulAlgo_t& algorithm, int runs, bool busy) {
    if (!busy && launch(p_, d_, algorithm, out_) != CUBLAS_STATUS_SUCCESS) return -1.f;
    for (int r = 0; r < runs; ++r) {
      WEFT_CUDA_CHECK(cudaEventRecord(starts_[r], p_.stream));
      const bool launched = launch(p_, d_, algorithm, out_) == CUBLAS_STATUS_SUCCESS;
      WEFT_CUDA_CHECK(cudaEventRecord(stops_[r], p_.stream));
      if (!launched) {
        WEFT_CUDA_CHECK(cudaEventSynchronize(stops_[r]));
        return -1.f;
      }
    }
    WEFT_CUDA_CHECK(cudaEventSynchronize(stops_[runs - 1]));
    float total_ms = 0.f;
    for (int r = 0; r < runs; ++r) {
      float run_ms = 0.f;
      WEFT_CUDA_CHECK(cudaEventElapsedTime(&run_ms, starts_[r], stops_[r]));
      total_ms += run_ms;
    }
    return total_ms;
  }

 private:
  const Problem& p_;
  const LaunchDescriptors& d_;
  void* out_;
  std::array<cudaEvent_t, kAutotuneRuns> starts_ = {}, stops_ = {};
};

// The fastest candidate of `candidates` that writes exactly the bits the first (the heuristic's
// choice) writes, or under kAutotuneFastest that repeats its own bits, timed on p's stream. A
// product that accumulates (beta != 0) writes into a scratch
// output while timed, so that p.out is left as it was; otherwise the timing runs write p.out
// itself, which the real product then overwrites (and GELU_AUX's pre-activation output likewise).
// Candidates whose state or launch fails are skipped; the first wins ties. std::nullopt: the
// product changed nothing in its output (an operand is zero), so its bits cannot rank candidates.
std::optional<cublasLtMatmulAlgo_t> fastest_algorithm(const Problem& p, const LaunchDescriptors& d,
                                       const cublasLtMatmulHeuristicResult_t* candidates, int count) {
  void* out = p.out;
  Tensor scratch;  // [batch * m * n] of the output's type, while an accumulating product is timed
  if (p.beta != 0.f) {
    const DType dtype = p.type == CUDA_R_32F ? kFloat32 : p.type == CUDA_R_16BF ? kBFloat16 : kFloat16;
    scratch = Tensor::empty({p.batch * p.m * p.n}, dtype, Device::cuda(p.device));
    out = scratch.raw_data();
  }
  std::vector<void*> outputs = {out};
  if (p.aux != nullptr && epilogue_writes_aux(p.epilogue)) outputs.push_back(p.aux);
  OutputFingerprint fingerprint(p, outputs);
  uint64_t reference = 0;  // the heuristic's first's fingerprint
  const bool any_bits = autotune_setting().load() == kAutotuneFastest;

  MatmulAutotuneRecord record;
  record.batch = p.batch;
  record.m = p.m;
  record.n = p.n;
  record.k = p.k;
  record.epilogue = static_cast<int>(p.epilogue);
  RunTimer timer(p, d, out);
  cublasLtMatmulAlgo_t best = candidates[0].algo;
  float best_ms = 0.f, reference_ms = 0.f, reference_first_ms = 0.f;
  bool timed_any = false;
  for (int i = 0; i < count; ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t& candidate = candidates[i].algo;
    if (launch(p, d, candidate, out) != CUBLAS_STATUS_SUCCESS) {  // warm-up, and the launch check
      if (i == 0) break;  // nothing to compare with: the heuristic's choice stands
      continue;
    }
    uint64_t own_first_bits = 0;  // kAutotuneFastest: what this candidate's warm-up wrote
    if (i == 0) {
      reference = fingerprint.take();
      Problem without_product = p;
      without_product.alpha = 0.f;  // the output from C, the bias and the epilogue alone
      if (launch(without_product, d, candidate, out) == CUBLAS_STATUS_SUCCESS && fingerprint.take() == reference) {
        record.inconclusive = true;
        break;
      }
    } else if (any_bits) {
      own_first_bits = fingerprint.take();  // synchronizes: the timing below starts the GPU again
    }
    // The first run is timed alone: a candidate far slower than the reference stops there.
    float elapsed_ms = timer.time(candidate, 1, /*busy=*/i > 0 && !any_bits);  // the warm-up still runs
    const bool launched_first = elapsed_ms >= 0.f;
    if (i == 0) reference_first_ms = elapsed_ms;
    if (launched_first && i > 0 && elapsed_ms > kAutotuneCutoff * reference_first_ms) {
      record.candidates.push_back({i, elapsed_ms * 1000.f, false, true});
      continue;
    }
    const float rest_ms = launched_first ? timer.time(candidate, kAutotuneRuns - 1, /*busy=*/false) : -1.f;
    if (rest_ms < 0.f) {
      if (i == 0) break;
      continue;
    }
    elapsed_ms += rest_ms;
    // For the first candidate this checks that its repeated runs agree with its first (an
    // algorithm that is not deterministic leaves nothing to keep bits with: it stays, untuned).
    const uint64_t bits = fingerprint.take();
    const bool same_bits = bits == reference;
    const bool repeats = i == 0 ? same_bits : !any_bits || bits == own_first_bits;
    record.candidates.push_back({i, elapsed_ms * 1000.f / kAutotuneRuns, same_bits, false, repeats});
    if (i == 0 && !same_bits) break;
    const bool eligible = any_bits ? repeats : same_bits;
    if (eligible && (!timed_any || elapsed_ms < best_ms)) {
      best = candidate;
      best_ms = elapsed_ms;
      record.chosen = i;
      timed_any = true;
    }
    if (i == 0) reference_ms = elapsed_ms;
  }
  // A candidate within the timing's noise of the heuristic's first does not replace it: three runs
  // on a GPU whose clock moves with its power draw rank near-equal algorithms at random.
  if (timed_any && record.chosen != 0 && best_ms > reference_ms * (1.0f - kAutotuneMargin)) {
    best = candidates[0].algo;
    record.chosen = 0;
  }
  if (record.inconclusive) {
    if (autotune_verbose()) {
      std::fprintf(stderr,
                   "weft: matmul autotuning of %s put off: the product changed nothing in its output (a zero "
                   "operand)\n",
                   product_text(p).c_str());
    }
    std::lock_guard<std::mutex> lock(autotune_records_mutex());
    autotune_records().push_back(std::move(record));
    return std::nullopt;
  }
  if (autotune_verbose()) {
    std::string line;
    for (const MatmulAutotuneRecord::Candidate& c : record.candidates) {
      line += " " + std::to_string(c.index) + ":" + std::to_string(static_cast<int>(c.microseconds + 0.5f)) + "us" +
              (c.cut_short ? "(slow)" : !c.repeats ? "(not repeatable)" : c.same_bits ? "" : "(other bits)");
    }
    std::fprintf(stderr, "weft: matmul autotuned %s:%s kept %d\n", product_text(p).c_str(), line.c_str(),
                 record.chosen);
  }
  std::lock_guard<std::mutex> lock(autotune_records_mutex());
  autotune_records().push_back(std::move(record));
  return best;
}

struct Alignments {
  int64_t a = 0, b = 0, cd = 0;  // bytes, as alignment_of found them
};

// The search preferences every heuristic query of a problem shares.
void set_search_limits(Preference& preference, const Alignments& alignments) {
  preference.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(alignments.a));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(alignments.b));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(alignments.cd));
  preference.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(alignments.cd));
}

// Fills `results` (kMaxCandidates entries) with the algorithms to try and returns how many: the
// heuristic's first alone, or when tuning its first kHeuristicCandidates and then, for every
// algorithm id the library has for these types, the heuristic's best kConfigurationsPerId
// configurations of that id (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID), leaving out repeats. The
// heuristic's first stays first: it is the reference whose bits every other must write.
int candidate_algorithms(cublasLtHandle_t handle, cudaDataType_t type, cublasLtMatmulDesc_t desc,
                         cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t cd,
                         const Alignments& alignments, bool tune, cublasLtMatmulHeuristicResult_t* results) {
  Preference preference;
  set_search_limits(preference, alignments);
  int found = 0;
  WEFT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, cd, cd, preference.pref,
                                                   tune ? kHeuristicCandidates : 1, results, &found));
  if (!tune || found == 0 || results[0].state != CUBLAS_STATUS_SUCCESS) return found;
  auto known = [&](const cublasLtMatmulAlgo_t& algorithm) {
    for (int i = 0; i < found; ++i) {
      if (std::memcmp(&results[i].algo, &algorithm, sizeof(algorithm)) == 0) return true;
    }
    return false;
  };
  std::array<int, 256> ids = {};
  int id_count = 0;
  // Without the ids the heuristic's own candidates are still there to tune among.
  if (cublasLtMatmulAlgoGetIds(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, type, type, type, type,
                               static_cast<int>(ids.size()), ids.data(), &id_count) != CUBLAS_STATUS_SUCCESS) {
    return found;
  }
  Preference by_id;
  set_search_limits(by_id, alignments);
  by_id.set(CUBLASLT_MATMUL_PREF_SEARCH_MODE, static_cast<uint32_t>(CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID));
  for (int i = 0; i < id_count && found < kMaxCandidates; ++i) {
    std::array<cublasLtMatmulHeuristicResult_t, kConfigurationsPerId> configurations = {};
    bool initialized = true;
    for (cublasLtMatmulHeuristicResult_t& configuration : configurations) {
      initialized = initialized && cublasLtMatmulAlgoInit(handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, type, type, type,
                                                          type, ids[i], &configuration.algo) == CUBLAS_STATUS_SUCCESS;
    }
    int count = 0;
    // An id the heuristic cannot configure for this problem is not an error: it is left out.
    if (!initialized || cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, cd, cd, by_id.pref, kConfigurationsPerId,
                                                       configurations.data(), &count) != CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    for (int c = 0; c < count && found < kMaxCandidates; ++c) {
      if (configurations[c].state == CUBLAS_STATUS_SUCCESS && !known(configurations[c].algo)) {
        results[found++] = configurations[c];
      }
    }
  }
  return found;
}

// The device's kind and its cuBLASLt, as the tuning cache names them: a choice from the file is
// reused only where both are the ones it was tuned on. Called under state.mutex.
const std::string& device_signature(LtState& state, int device) {
  auto found = state.device_signatures.find(device);
  if (found != state.device_signatures.end()) return found->second;
  cudaDeviceProp properties{};
  WEFT_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  std::string name = properties.name;
  for (char& c : name) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') c = '_';
  }
  const std::string signature = name + "/sm" + std::to_string(properties.major) + std::to_string(properties.minor) +
                                "/" + std::to_string(properties.multiProcessorCount) + "sms/cublasLt" +
                                std::to_string(cublasLtGetVersion());
  return state.device_signatures.emplace(device, signature).first->second;
}

// The signature a choice is kept under in the tuning cache: the device's, and for choices that
// need not keep the heuristic's bits (kAutotuneFastest) a mark that keeps them from processes that
// must. Called under state.mutex.
std::string tuning_signature(LtState& state, int device) {
  const std::string& signature = device_signature(state, device);
  return autotune_setting().load() == kAutotuneFastest ? signature + "/any-bits" : signature;
}

// Called under state.mutex.
MatmulTuningCache& tuning_cache(LtState& state) {
  if (!state.tuning_cache) {
    state.tuning_cache = std::make_unique<MatmulTuningCache>(MatmulTuningCache::path_from_environment());
  }
  return *state.tuning_cache;
}

// A choice the tuning cache holds for this problem, if cuBLASLt still accepts it here.
bool remembered_algorithm(const Problem& p, const LaunchDescriptors& d, const MatmulTuningCache::Key& key,
                          cublasLtMatmulAlgo_t& algorithm) {
  static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(MatmulTuningCache::Algorithm));
  std::optional<MatmulTuningCache::Algorithm> remembered;
  {
    LtState& state = lt_state();
    std::lock_guard<std::mutex> lock(state.mutex);
    remembered = tuning_cache(state).find(tuning_signature(state, p.device), key);
  }
  if (!remembered) return false;
  std::memcpy(&algorithm, remembered->data(), sizeof(algorithm));
  cublasLtMatmulHeuristicResult_t check = {};
  return cublasLtMatmulAlgoCheck(d.handle, d.desc, d.a, d.b, d.cd, d.cd, &algorithm, &check) == CUBLAS_STATUS_SUCCESS &&
         check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes;
}

void remember_algorithm(const Problem& p, const MatmulTuningCache::Key& key, const cublasLtMatmulAlgo_t& algorithm) {
  MatmulTuningCache::Algorithm bytes;
  std::memcpy(bytes.data(), &algorithm, sizeof(algorithm));
  LtState& state = lt_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  tuning_cache(state).add(tuning_signature(state, p.device), key, bytes);
}

// A key's first product: the tuning cache's choice where it holds one for the key, else the
// heuristic's first or, when tuning, the fastest candidate with its bits (then added to the cache).
// Kept in lt_state().algorithms for the rest of the process.
void choose_algorithm(const Problem& p, std::string_view op, const LaunchDescriptors& d,
                      const Alignments& alignments, const std::array<int64_t, 24>& key,
                      cublasLtMatmulAlgo_t& algorithm) {
  const bool tune = autotune_enabled(p.epilogue) && !stream_is_capturing(p.stream);
  MatmulTuningCache::Key file_key = key;
  file_key[0] = 0;  // the device's kind, not its index, is in the file's signature
  if (tune && remembered_algorithm(p, d, file_key, algorithm)) {
    if (autotune_verbose()) {
      std::fprintf(stderr, "weft: matmul %s: the tuning cache's choice\n", product_text(p).c_str());
    }
  } else {
    std::array<cublasLtMatmulHeuristicResult_t, kMaxCandidates> results = {};
    const double search_start_ms = clock_ms();
    const int found = candidate_algorithms(d.handle, p.type, d.desc, d.a, d.b, d.cd, alignments, tune, results.data());
    const double search_ms = clock_ms() - search_start_ms;
    WEFT_CHECK(found > 0 && results[0].state == CUBLAS_STATUS_SUCCESS, op, ": cuBLASLt found no algorithm for [",
               p.batch, ", ", p.m, ", ", p.k, "] @ [", p.batch, ", ", p.k, ", ", p.n, "] (epilogue ",
               static_cast<int>(p.epilogue), ", alignments ", alignments.a, "/", alignments.b, "/", alignments.cd,
               " bytes)");
    algorithm = results[0].algo;
    if (found > 1) {
      const double timing_start_ms = clock_ms();
      const std::optional<cublasLtMatmulAlgo_t> fastest = fastest_algorithm(p, d, results.data(), found);
      if (autotune_verbose()) {
        std::fprintf(stderr, "weft: matmul autotuning took %.0f ms (the candidates' search %.0f ms)\n",
                     clock_ms() - timing_start_ms + search_ms, search_ms);
      }
      if (fastest) {
        algorithm = *fastest;
        remember_algorithm(p, file_key, algorithm);
      } else {
        LtState& state = lt_state();
        std::lock_guard<std::mutex> lock(state.mutex);
        if (++state.inconclusive[key] < kInconclusiveLimit) return;  // this product only: the next tries again
      }
    }
  }
  LtState& state = lt_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.algorithms.emplace(key, algorithm);
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
    const LaunchDescriptors descriptors{handle, desc.desc, layout_a.desc, layout_b.desc, layout_cd.desc, workspace};
    choose_algorithm(p, op, descriptors, {align_a, align_b, align_cd}, key, algorithm);
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

namespace {

#if defined(WEFT_HAVE_SM90A)
// Whether a, bm and out are a linear layer's product as the own Hopper kernels take it: a [1, M, K]
// row-major, out [1, M, N] contiguous, bm [1, K, N] either the transpose of a contiguous [N, K] weight
// (bm_k_contiguous: the forward X · Wᵀ) or a contiguous [K, N] weight (the backward dY · W), all bf16
// on one CUDA device.
bool hopper_operands(const Tensor& a, const Tensor& bm, const Tensor& out, bool bm_k_contiguous) {
  if (a.dim() != 3 || bm.dim() != 3 || out.dim() != 3 || out.size(0) != 1 || a.size(0) != 1 || bm.size(0) != 1) {
    return false;
  }
  const int64_t m = out.size(1), n = out.size(2), k = a.size(2);
  const bool bf16 = a.dtype() == kBFloat16 && bm.dtype() == kBFloat16 && out.dtype() == kBFloat16;
  const bool one_device = a.device().is_cuda() && a.device() == out.device() && bm.device() == out.device();
  const bool bm_laid_out =
      bm_k_contiguous ? bm.stride(1) == 1 && bm.stride(2) == k : bm.stride(2) == 1 && bm.stride(1) == n;
  return bf16 && one_device && a.size(1) == m && bm.size(1) == k && bm.size(2) == n && a.stride(2) == 1 &&
         a.stride(1) == k && bm_laid_out && out.is_contiguous();
}
#endif

// GELU's backward on weft's own Hopper product (hopper_products.h) where it is switched on and the
// operands are a linear layer's dX product: a = dY [1, M, K], bm = the next linear's weight [1, K, N]
// as stored, pre_gelu and out [1, M, N] contiguous. False where it does not take the product.
bool try_hopper_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_gelu, const Tensor& out) {
#if defined(WEFT_HAVE_SM90A)
  if (!hopper_product_enabled(kHopperGeluBackward) || !hopper_operands(a, bm, out, false)) return false;
  if (pre_gelu.dtype() != kBFloat16 || pre_gelu.device() != out.device() || pre_gelu.shape() != out.shape() ||
      !pre_gelu.is_contiguous()) {
    return false;
  }
  const int device = out.device().index;
  set_device(device);
  return hopper_gelu_backward(a.raw_data(), bm.raw_data(), pre_gelu.raw_data(), out.raw_data(), out.size(1),
                              out.size(2), a.size(2), current_stream(device));
#else
  return false;
#endif
}

// A linear's dX product with its bias gradient on weft's own Hopper product (hopper_products.h)
// where it is switched on and the operands are as try_hopper_gelu_backward's, with column_sums [K]
// contiguous bf16 and K at most kHopperInputGradientMaxColumns. False where it does not take the
// product.
bool try_hopper_input_gradient(const Tensor& a, const Tensor& bm, const Tensor& pre_gelu, const Tensor& out,
                               const Tensor& column_sums) {
#if defined(WEFT_HAVE_SM90A)
  // With gelu_backward switched on too, GELU's backward with the sums still runs here: the sums taken
  // while the product reads dY cost less than gelu_backward's product and a column-sum pass over dY.
  if (!hopper_product_enabled(kHopperInputGradient) || !hopper_operands(a, bm, out, false)) return false;
  if (pre_gelu.defined() && (pre_gelu.dtype() != kBFloat16 || pre_gelu.device() != out.device() ||
                             pre_gelu.shape() != out.shape() || !pre_gelu.is_contiguous())) {
    return false;
  }
  const int64_t m = out.size(1), k = a.size(2);
  if (k > kHopperInputGradientMaxColumns) return false;  // slower there than cuBLASLt's product and a pass
  if (column_sums.dtype() != kBFloat16 || column_sums.device() != out.device() || column_sums.numel() != k ||
      !column_sums.is_contiguous()) {
    return false;
  }
  const int device = out.device().index;
  set_device(device);
  // The slices' f32 sums: workspace from the caching allocator, in use on this stream only.
  const Tensor partials = Tensor::empty({hopper_column_sum_slices(m), k}, kFloat32, out.device());
  return hopper_input_gradient(a.raw_data(), bm.raw_data(), pre_gelu.defined() ? pre_gelu.raw_data() : nullptr,
                               out.raw_data(), column_sums.raw_data(), partials.data<float>(), m, out.size(2), k,
                               current_stream(device));
#else
  return false;
#endif
}

// SwiGLU's gate and up products with the activation on weft's own Hopper product (hopper_products.h)
// where it is switched on: rows [R, C] and both weights [H, C] contiguous bf16, gate, up and out
// [R, H] contiguous bf16, on one device. False where it does not take them.
bool try_hopper_swiglu(const Tensor& rows, const Tensor& gate_weight, const Tensor& up_weight, const Tensor& gate,
                       const Tensor& up, const Tensor& out) {
#if defined(WEFT_HAVE_SM90A)
  if (!hopper_product_enabled(kHopperSwiglu) || rows.dim() != 2 || gate_weight.dim() != 2) return false;
  const int64_t r = rows.size(0), c = rows.size(1), hidden = gate_weight.size(0);
  const Shape out_shape{r, hidden};
  for (const Tensor* t : {&rows, &gate_weight, &up_weight, &gate, &up, &out}) {
    if (t->dtype() != kBFloat16 || !t->device().is_cuda() || t->device() != out.device() || !t->is_contiguous()) {
      return false;
    }
  }
  if (gate_weight.size(1) != c || up_weight.shape() != gate_weight.shape() || gate.shape() != out_shape ||
      up.shape() != out_shape || out.shape() != out_shape) {
    return false;
  }
  const int device = out.device().index;
  set_device(device);
  return hopper_swiglu(rows.raw_data(), gate_weight.raw_data(), up_weight.raw_data(), gate.raw_data(), up.raw_data(),
                       out.raw_data(), r, hidden, c, current_stream(device));
#else
  return false;
#endif
}

// SwiGLU's backward in a down-projection's dX product on weft's own Hopper product
// (hopper_products.h) where it is switched on: a = dY [1, M, K] and bm = the weight [1, K, N] as
// stored (hopper_operands' dX case, checked against a [1, M, N] product), gate, up, grad_gate and
// grad_up [M, N] contiguous bf16 on the product's device. False where it does not take them.
bool try_hopper_swiglu_backward(const Tensor& a, const Tensor& bm, const Tensor& gate, const Tensor& up,
                                const Tensor& grad_gate, const Tensor& grad_up) {
#if defined(WEFT_HAVE_SM90A)
  if (!hopper_product_enabled(kHopperSwigluBackward) || gate.dim() != 2) return false;
  const int64_t m = gate.size(0), n = gate.size(1);
  // hopper_operands reads the product's shape from its output: a [1, M, N] view of grad_gate's shape.
  if (!grad_gate.is_contiguous() || !hopper_operands(a, bm, grad_gate.view({1, m, n}), false)) return false;
  for (const Tensor* t : {&gate, &up, &grad_up}) {
    if (t->dtype() != kBFloat16 || t->device() != grad_gate.device() || t->shape() != gate.shape() ||
        !t->is_contiguous()) {
      return false;
    }
  }
  if (grad_gate.shape() != gate.shape()) return false;
  const int device = grad_gate.device().index;
  set_device(device);
  return hopper_swiglu_backward(a.raw_data(), bm.raw_data(), gate.raw_data(), up.raw_data(), grad_gate.raw_data(),
                                grad_up.raw_data(), m, n, a.size(2), current_stream(device));
#else
  return false;
#endif
}

}  // namespace

void matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_gelu, const Tensor& out) {
  if (try_hopper_gelu_backward(a, bm, pre_gelu, out)) return;
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

std::vector<MatmulAutotuneRecord> matmul_autotune_records() {
  std::lock_guard<std::mutex> lock(autotune_records_mutex());
  return autotune_records();
}

int set_matmul_autotune_for_testing(int setting) { return autotune_setting().exchange(setting); }

void forget_matmul_algorithms_for_testing() {
  LtState& state = lt_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.algorithms.clear();
  state.inconclusive.clear();
}

void set_matmul_tuning_cache_for_testing(const std::string& path) {
  LtState& state = lt_state();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.tuning_cache = std::make_unique<MatmulTuningCache>(path);
}

void matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out) {
  run_epilogue(a, bm, bias, out, Tensor(), CUBLASLT_EPILOGUE_BIAS, "matmul_bias");
}

namespace {

// weft's own Hopper product (hopper_products.h) where it is switched on and the operands are a
// linear layer's: a [1, M, K] row-major, bm [1, K, N] the transpose of a contiguous [N, K] weight,
// out and pre_gelu contiguous, all bf16. False where it does not take the product (cuBLASLt does).
bool try_hopper_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                          const Tensor& pre_gelu) {
#if defined(WEFT_HAVE_SM90A)
  if (!hopper_product_enabled(kHopperBiasGelu) || !hopper_operands(a, bm, out, true)) return false;
  const int64_t m = out.size(1), n = out.size(2), k = a.size(2);
  const bool bias_fits = bias.defined() && bias.dtype() == kBFloat16 && bias.device() == out.device() &&
                         bias.dim() == 1 && bias.size(0) == n && bias.is_contiguous();
  const bool pre_fits = !pre_gelu.defined() || (pre_gelu.dtype() == kBFloat16 && pre_gelu.device() == out.device() &&
                                                pre_gelu.shape() == out.shape() && pre_gelu.is_contiguous());
  if (!bias_fits || !pre_fits) return false;
  const int device = out.device().index;
  set_device(device);
  return hopper_bias_gelu(a.raw_data(), bm.raw_data(), bias.raw_data(), out.raw_data(),
                          pre_gelu.defined() ? pre_gelu.raw_data() : nullptr, m, n, k, current_stream(device));
#else
  return false;
#endif
}

}  // namespace

void matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                      const Tensor& pre_gelu) {
  if (try_hopper_bias_gelu(a, bm, bias, out, pre_gelu)) return;
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

// The bias gradient's column sums ride weft's own Hopper product where it is switched on
// (WEFT_HOPPER_GEMM=input_gradient) and takes the operands; otherwise the default: the product (or
// matmul_gelu_backward), then the reduction.
void CudaBackend::matmul_and_column_sums(const Tensor& a, const Tensor& bm, const Tensor& pre_activation,
                                         const Tensor& out, const Tensor& column_sums) {
  if (out.numel() > 0 && cuda::try_hopper_input_gradient(a, bm, pre_activation, out, column_sums)) return;
  Backend::matmul_and_column_sums(a, bm, pre_activation, out, column_sums);
}

// SwiGLU's backward rides weft's own Hopper product where it is switched on
// (WEFT_HOPPER_GEMM=swiglu_backward) and takes the operands; otherwise the default: cuBLASLt's
// product, then the swiglu_backward kernel.
void CudaBackend::matmul_swiglu_backward(const Tensor& a, const Tensor& bm, const Tensor& gate, const Tensor& up,
                                         const Tensor& grad_gate, const Tensor& grad_up) {
  if (gate.numel() > 0 && a.size(2) > 0 && cuda::try_hopper_swiglu_backward(a, bm, gate, up, grad_gate, grad_up)) {
    return;
  }
  Backend::matmul_swiglu_backward(a, bm, gate, up, grad_gate, grad_up);
}

// SwiGLU's products ride weft's own Hopper product where it is switched on (WEFT_HOPPER_GEMM=swiglu)
// and takes the operands; otherwise the default: cuBLASLt's two products, then the swiglu kernel.
void CudaBackend::swiglu_products(const Tensor& rows, const Tensor& gate_weight, const Tensor& up_weight,
                                  const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (out.numel() > 0 && rows.numel() > 0 && cuda::try_hopper_swiglu(rows, gate_weight, up_weight, gate, up, out)) {
    return;
  }
  Backend::swiglu_products(rows, gate_weight, up_weight, gate, up, out);
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
