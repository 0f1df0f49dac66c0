// Causal SDPA forward and backward through cuDNN 9's backend API (see cudnn_attention.h).
//
// The operation graphs follow what cudnn-frontend's composite sdpa / sdpa_backward nodes generate
// (no dropout, no bias, top-left causal mask), written directly with CUDNN_BACKEND_* descriptors:
//
//   forward:  S = Q @ K^T; S *= scale; S = select(S, lowest, row >= col); M = max_row(S);
//             E = exp(S - M); Z = sum_row(E); stats = M + log(Z); P = E / Z (io type); O = P @ V
//   backward: sum = sum_row(dO * O) * 1 (a workspace tensor); S = Q @ K^T * scale - stats, masked;
//             E = exp(S); dV = E^T (io type) @ dO; dP = dO @ V^T; dS = (dP * 1 - sum) * E * scale;
//             dK = dS^T (io type) @ Q; dQacc = dS @ K (f32, workspace); dQ = identity(dQacc)
//             (deterministic: dQ = dS @ K, no accumulator tensor; see build_backward)
//
// K (and V in the backward) enter as K^T = [B, KV, D, T] views of the [B, KV, T, D] tensors, as the
// backend's attention engines expect. Grouped-query attention (KV < H heads in k and v) is the
// matmuls' broadcast over heads; in the backward dK and dV are first computed per query head (a
// virtual [B, H, T, D] tensor) and then summed over each kv head's group by a reduction, as the
// frontend's sdpa_backward lowers GQA. Head dims: multiples of 8 up to 256 (what cuDNN 9 takes on
// Hopper for forward and backward); whether the linked library really runs a case is known when the
// graph is built, and a failure there falls back to the flash kernels. Heuristics mode A (then the
// fallback mode) give engine configs; the first one whose execution plan finalizes is kept, or,
// with WEFT_ATTENTION_AUTOTUNE=1, the fastest of them on the first call of each shape (execute()).
// With deterministic kernels (runtime/determinism.h) the backward graph leaves out
// the dQ accumulator and configs whose engine carries the NONDETERMINISTIC note are skipped.
// Everything is cached per device (one cuDNN handle each, used under a lock) and per (direction, B,
// H, KV, T, D, dtype, strides, deterministic).
#include "runtime/cuda/cudnn_attention.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#include "runtime/determinism.h"
#include "runtime/error.h"

#ifdef WEFT_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace weft::cuda {

// --- The implementation switch ------------------------------------------------------------------

namespace {

std::atomic<int> g_impl{-1};
thread_local CudnnEngineChoice g_last_engine;

AttentionImpl impl_from_environment() {
  const char* value = std::getenv("WEFT_ATTENTION");
  if (value == nullptr || *value == '\0') return AttentionImpl::kAuto;
  const std::string_view text(value);
  if (text == "flash") return AttentionImpl::kFlash;
  if (text == "cudnn") return AttentionImpl::kCudnn;
  if (text != "auto") {
    std::fprintf(stderr, "weft: WEFT_ATTENTION=%s is not one of flash, cudnn, auto; using auto\n", value);
  }
  return AttentionImpl::kAuto;
}

std::mutex g_error_mutex;
std::string g_last_error;

// Records why cuDNN did not run a call; the first reason of the process goes to stderr.
void note_fallback(const std::string& reason) {
  static std::once_flag logged;
  {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    g_last_error = reason;
  }
  std::call_once(logged, [&] {
    std::fprintf(stderr, "weft: cuDNN attention unavailable, using the flash kernels: %s\n", reason.c_str());
  });
}

}  // namespace

AttentionImpl attention_impl() {
  int value = g_impl.load(std::memory_order_relaxed);
  if (value < 0) {
    static const AttentionImpl from_environment = impl_from_environment();  // read once
    int expected = -1;
    g_impl.compare_exchange_strong(expected, static_cast<int>(from_environment));
    value = g_impl.load(std::memory_order_relaxed);
  }
  return static_cast<AttentionImpl>(value);
}

void set_attention_impl(AttentionImpl impl) { g_impl.store(static_cast<int>(impl), std::memory_order_relaxed); }

const char* attention_impl_name(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kFlash:
      return "flash";
    case AttentionImpl::kCudnn:
      return "cudnn";
    case AttentionImpl::kAuto:
      break;
  }
  return "auto";
}

CudnnEngineChoice cudnn_attention_last_engine() { return g_last_engine; }

std::string cudnn_attention_last_error() {
  std::lock_guard<std::mutex> lock(g_error_mutex);
  return g_last_error;
}

#ifndef WEFT_HAVE_CUDNN

bool cudnn_attention_built() { return false; }
int cudnn_version() { return 0; }

bool cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&) {
  note_fallback("weft was built without cuDNN");
  return false;
}

bool cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, double, const Tensor&, const Tensor&, const Tensor&) {
  note_fallback("weft was built without cuDNN");
  return false;
}

#else  // WEFT_HAVE_CUDNN

// The handle attributes of operation graphs and execution plans are marked deprecated in recent
// cuDNN 9 headers but are still what the library (older 9.x too) reads.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

bool cudnn_attention_built() { return true; }
int cudnn_version() { return static_cast<int>(cudnnGetVersion()); }

namespace {

// A failure while building a graph or plan: becomes the fallback reason.
struct CudnnFailure {
  std::string message;
};

std::string status_text(cudnnStatus_t status) {
  std::string text = cudnnGetErrorString(status);
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') text += std::string(" [") + detail + "]";
  return text;
}

#define WEFT_CUDNN_TRY(call, what)                                                                   \
  do {                                                                                               \
    const cudnnStatus_t weft_cudnn_status = (call);                                                  \
    if (weft_cudnn_status != CUDNN_STATUS_SUCCESS) {                                                 \
      throw CudnnFailure{std::string(what) + ": " + #call + " -> " + status_text(weft_cudnn_status)}; \
    }                                                                                                \
  } while (0)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type, std::string name) : name_(std::move(name)) {
    WEFT_CUDNN_TRY(cudnnBackendCreateDescriptor(type, &raw_), name_);
  }
  ~Desc() {
    if (raw_ != nullptr) cudnnBackendDestroyDescriptor(raw_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return raw_; }
  const std::string& name() const { return name_; }

  template <class T>
  Desc& set(cudnnBackendAttributeName_t attribute, cudnnBackendAttributeType_t type, const T* values,
            int64_t count = 1) {
    const cudnnStatus_t status = cudnnBackendSetAttribute(raw_, attribute, type, count, values);
    if (status != CUDNN_STATUS_SUCCESS) {
      throw CudnnFailure{name_ + ": setting attribute " + std::to_string(static_cast<int>(attribute)) + " -> " +
                         status_text(status)};
    }
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t attribute, cudnnBackendDescriptor_t value) {
    return set(attribute, CUDNN_TYPE_BACKEND_DESCRIPTOR, &value);
  }
  void finalize() { WEFT_CUDNN_TRY(cudnnBackendFinalize(raw_), name_ + ": finalize"); }

 private:
  cudnnBackendDescriptor_t raw_ = nullptr;
  std::string name_;
};

using Dims = std::vector<int64_t>;

// Tensor UIDs of the variant packs (virtual tensors get UIDs from kFirstVirtual up).
enum Uid : int64_t {
  kQ = 1,
  kK = 2,  // K^T view
  kV = 3,  // V (forward) or V^T view (backward)
  kO = 4,
  kStats = 5,
  kScale = 6,
  kMaskValue = 7,
  kGradOut = 8,
  kGradQ = 9,
  kGradK = 10,
  kGradV = 11,
  kOne = 12,
  kSoftmaxSum = 13,
  kGradQAccum = 14,
  kFirstVirtual = 100,
};

// A finalized execution plan and every descriptor it was built from (kept alive with it).
struct Plan {
  // One finalized execution plan of the operation graph.
  struct Candidate {
    Desc* plan = nullptr;
    int64_t workspace_bytes = 0;
    int64_t engine = -1;
    bool nondeterministic = false;  // the engine carries cuDNN's NONDETERMINISTIC numerical note
    std::string chosen;  // which heuristics config it is, "config 1 of 3, mode A"
  };
  std::vector<std::unique_ptr<Desc>> descriptors;
  Desc* plan = nullptr;  // the one that runs: candidates[0] until tuned
  int64_t workspace_bytes = 0;
  int64_t engine = -1;
  bool nondeterministic = false;
  std::string chosen;
  // With WEFT_ATTENTION_AUTOTUNE: every config of the heuristics' list whose plan finalized, timed
  // at the first execution; otherwise the first only.
  std::vector<Candidate> candidates;
  bool tuned = false;
  std::string failure;  // non-empty: no plan could be built (the reason)

  void use(const Candidate& candidate) {
    plan = candidate.plan;
    workspace_bytes = candidate.workspace_bytes;
    engine = candidate.engine;
    nondeterministic = candidate.nondeterministic;
    chosen = candidate.chosen;
  }
};

// WEFT_ATTENTION_AUTOTUNE=1: build a plan for every engine config the heuristics offer and keep the
// fastest at the first execution of each shape (see execute()); otherwise the heuristics' first.
bool autotune_requested() {
  static const bool value = [] {
    const char* text = std::getenv("WEFT_ATTENTION_AUTOTUNE");
    return text != nullptr && *text != '\0' && std::string_view(text) != "0";
  }();
  return value;
}

// Builds one operation graph from backend descriptors.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims& dims, const Dims& strides,
                                  bool is_virtual, bool by_value = false) {
    Desc& desc = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + std::to_string(uid));
    const int64_t alignment = 16;
    desc.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid)
        .set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), static_cast<int64_t>(dims.size()))
        .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), static_cast<int64_t>(strides.size()))
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment)
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) desc.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    desc.finalize();
    return desc.get();
  }
  cudnnBackendDescriptor_t virtual_tensor(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return tensor(next_virtual_++, type, dims, strides, true);
  }
  // A f32 scalar passed by value in the variant pack (a host pointer at execution).
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
              const char* name) {
    Desc& descriptor = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, std::string(name) + " (matmul descriptor)");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    descriptor.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute).finalize();
    Desc& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, descriptor.get())
        .finalize();
    ops_.push_back(op.get());
  }

  // y = mode(x[, b[, t]]); t is the condition of BINARY_SELECT (y = t ? x : b).
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t precision, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 const char* name, int64_t axis = -1) {
    Desc& descriptor = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, std::string(name) + " (pointwise descriptor)");
    descriptor.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode)
        .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &precision);
    if (axis >= 0) descriptor.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    descriptor.finalize();
    Desc& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, descriptor.get())
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y).finalize();
    ops_.push_back(op.get());
  }

  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                 const char* name) {
    Desc& descriptor = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, std::string(name) + " (reduction descriptor)");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    descriptor.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &mode)
        .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &compute)
        .finalize();
    Desc& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, descriptor.get())
        .finalize();
    ops_.push_back(op.get());
  }

  // y: the same elements as x under other dims / strides (a transpose view) and maybe another type.
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y, const char* name) {
    Desc& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y).finalize();
    ops_.push_back(op.get());
  }

  // scores -> select(scores, lowest, row >= col): the top-left causal mask.
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t scores, cudnnBackendDescriptor_t mask_value,
                                       const Dims& dims, const Dims& strides) {
    cudnnBackendDescriptor_t row = virtual_tensor(CUDNN_DATA_INT32, dims, strides);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scores, nullptr, nullptr, row, "gen_row_index", 2);
    cudnnBackendDescriptor_t col = virtual_tensor(CUDNN_DATA_INT32, dims, strides);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, scores, nullptr, nullptr, col, "gen_col_index", 3);
    cudnnBackendDescriptor_t keep = virtual_tensor(CUDNN_DATA_BOOLEAN, dims, strides);
    pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep, "row_ge_col");
    cudnnBackendDescriptor_t masked = virtual_tensor(CUDNN_DATA_FLOAT, dims, strides);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, scores, mask_value, keep, masked, "causal_select");
    return masked;
  }

  // Finalizes the operation graph, asks the heuristics for engine configs and keeps the first whose
  // execution plan finalizes; with `deterministic`, the first of those without the NONDETERMINISTIC
  // numerical note.
  std::unique_ptr<Plan> finish(const char* what, bool deterministic) {
    auto result = std::make_unique<Plan>();
    Desc& graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, std::string(what) + " operation graph");
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle_)
        .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
             static_cast<int64_t>(ops_.size()))
        .finalize();

    std::string tried;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "mode A" : "fallback mode";
      std::vector<std::unique_ptr<Desc>> configs;
      std::vector<cudnnBackendDescriptor_t> raw_configs;
      try {
        Desc heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, std::string(what) + " heuristics " + mode_name);
        heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph.get())
            .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode)
            .finalize();
        int64_t count = 0;
        WEFT_CUDNN_TRY(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                       heuristics.name());
        for (int64_t i = 0; i < count; ++i) {
          configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
          raw_configs.push_back(configs.back()->get());
        }
        int64_t returned = 0;
        if (count > 0) {
          WEFT_CUDNN_TRY(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                                  raw_configs.data()),
                         heuristics.name());
        }
        raw_configs.resize(static_cast<size_t>(std::min(returned, count)));
        tried += std::string(tried.empty() ? "" : "; ") + mode_name + ": " + std::to_string(raw_configs.size()) +
                 " engine configs";
        if (deterministic) {
          const size_t offered = raw_configs.size();
          std::vector<cudnnBackendDescriptor_t> kept;
          for (cudnnBackendDescriptor_t config : raw_configs) {
            if (!engine_facts(config).nondeterministic) kept.push_back(config);
          }
          raw_configs = std::move(kept);
          tried += " (" + std::to_string(offered - raw_configs.size()) + " left out as nondeterministic)";
        }
      } catch (const CudnnFailure& failure) {
        tried += std::string(tried.empty() ? "" : "; ") + failure.message;
        continue;
      }
      for (size_t i = 0; i < raw_configs.size(); ++i) {
        try {
          auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                             std::string(what) + " execution plan");
          plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle_)
              .set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw_configs[i])
              .finalize();
          Plan::Candidate candidate;
          int64_t returned = 0;
          WEFT_CUDNN_TRY(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                  CUDNN_TYPE_INT64, 1, &returned, &candidate.workspace_bytes),
                         plan->name());
          const EngineFacts facts = engine_facts(raw_configs[i]);
          candidate.engine = facts.index;
          candidate.nondeterministic = facts.nondeterministic;
          candidate.chosen = "config " + std::to_string(i + 1) + " of " + std::to_string(raw_configs.size()) + ", " +
                             mode_name;
          candidate.plan = plan.get();
          descriptors_.push_back(std::move(plan));
          result->candidates.push_back(candidate);
          if (!autotune_requested()) break;
        } catch (const CudnnFailure& failure) {
          if (i == 0) tried += " (first: " + failure.message + ")";
        }
      }
      if (!result->candidates.empty()) {
        result->use(result->candidates.front());
        for (auto& config : configs) descriptors_.push_back(std::move(config));
        result->descriptors = std::move(descriptors_);
        return result;
      }
    }
    result->failure = std::string(what) + ": no engine config gave an execution plan (" + tried + ")";
    return result;
  }

 private:
  Desc& make(cudnnBackendDescriptorType_t type, std::string name) {
    descriptors_.push_back(std::make_unique<Desc>(type, std::move(name)));
    return *descriptors_.back();
  }

  // What a config's engine says of itself: its global index (diagnostics; -1 when it cannot be
  // read) and whether it carries the NONDETERMINISTIC numerical note (an engine whose notes cannot
  // be read counts as nondeterministic: nothing vouches for it).
  struct EngineFacts {
    int64_t index = -1;
    bool nondeterministic = true;
  };
  static EngineFacts engine_facts(cudnnBackendDescriptor_t config) {
    EngineFacts facts;
    try {
      Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
      cudnnBackendDescriptor_t raw = engine.get();
      int64_t returned = 0;
      if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &returned,
                                   &raw) != CUDNN_STATUS_SUCCESS) {
        return facts;
      }
      if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &returned,
                                   &facts.index) != CUDNN_STATUS_SUCCESS) {
        facts.index = -1;
      }
      cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
      int64_t count = 0;
      if (cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                   CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes) == CUDNN_STATUS_SUCCESS) {
        count = std::min<int64_t>(count, CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
        facts.nondeterministic =
            std::find(notes, notes + count, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) != notes + count;
      }
      return facts;
    } catch (const CudnnFailure&) {
      return facts;
    }
  }

  cudnnHandle_t handle_;
  std::vector<std::unique_ptr<Desc>> descriptors_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// The call's sizes and the strides of its [B, H, T, D] tensors (unit stride in D, any others: the
// heads of one [B, T, 3, H, D] projection, an output in [B, T, H, D] order); the gradients' strides
// are used by the backward only.
struct Shape {
  int64_t b, h, kv, s, d;  // kv: the kv heads of k and v (h for multi-head attention)
  Dims q = {}, k = {}, v = {}, o = {}, grad_out = {}, grad_q = {}, grad_k = {}, grad_v = {};
};

Dims strides_of(const Tensor& tensor) {
  return {tensor.stride(0), tensor.stride(1), tensor.stride(2), tensor.stride(3)};
}
Dims bhsd_strides(const Shape& x) { return {x.h * x.s * x.d, x.s * x.d, x.d, 1}; }
// The [B, H, D, T] (transposed) view of a [B, H, T, D] tensor with these strides.
Dims transposed(const Dims& strides) { return {strides[0], strides[1], strides[3], strides[2]}; }

std::unique_ptr<Plan> build_forward(cudnnHandle_t handle, const Shape& x, cudnnDataType_t io, bool deterministic) {
  GraphBuilder g(handle);
  const Dims bhsd = {x.b, x.h, x.s, x.d}, kv_bhsd = {x.b, x.kv, x.s, x.d}, kv_bhds = {x.b, x.kv, x.d, x.s};
  const Dims scores = {x.b, x.h, x.s, x.s}, score_strides = {x.h * x.s * x.s, x.s * x.s, x.s, 1};
  const Dims rows = {x.b, x.h, x.s, 1}, row_strides = {x.h * x.s, x.s, 1, 1};
  cudnnBackendDescriptor_t q = g.tensor(kQ, io, bhsd, x.q, false);
  cudnnBackendDescriptor_t kt = g.tensor(kK, io, kv_bhds, transposed(x.k), false);
  cudnnBackendDescriptor_t v = g.tensor(kV, io, kv_bhsd, x.v, false);
  cudnnBackendDescriptor_t o = g.tensor(kO, io, bhsd, x.o, false);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, CUDNN_DATA_FLOAT, rows, row_strides, false);
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  cudnnBackendDescriptor_t mask_value = g.scalar(kMaskValue);

  cudnnBackendDescriptor_t s = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.matmul(q, kt, s, "bmm1 Q K^T");
  cudnnBackendDescriptor_t scaled = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled, "attn_scale");
  cudnnBackendDescriptor_t masked = g.causal_mask(scaled, mask_value, scores, score_strides);

  // Softmax with stats (the frontend's softmax node with has_stats, no M / Zinv outputs).
  cudnnBackendDescriptor_t max = g.virtual_tensor(CUDNN_DATA_FLOAT, rows, row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max, "softmax max");
  cudnnBackendDescriptor_t shifted = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, max, nullptr, shifted, "softmax sub");
  cudnnBackendDescriptor_t exps = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, shifted, nullptr, nullptr, exps, "softmax exp");
  cudnnBackendDescriptor_t sum = g.virtual_tensor(CUDNN_DATA_FLOAT, rows, row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, exps, sum, "softmax sum");
  cudnnBackendDescriptor_t log_sum = g.virtual_tensor(CUDNN_DATA_FLOAT, rows, row_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, nullptr, nullptr, log_sum, "softmax log");
  g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_sum, nullptr, stats, "softmax stats");
  cudnnBackendDescriptor_t probs = g.virtual_tensor(io, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, exps, sum, nullptr, probs, "softmax div");

  g.matmul(probs, v, o, "bmm2 P V");
  return g.finish("sdpa forward", deterministic);
}

std::unique_ptr<Plan> build_backward(cudnnHandle_t handle, const Shape& x, cudnnDataType_t io, bool deterministic) {
  GraphBuilder g(handle);
  const Dims bhsd = {x.b, x.h, x.s, x.d}, kv_bhsd = {x.b, x.kv, x.s, x.d}, kv_bhds = {x.b, x.kv, x.d, x.s};
  const Dims scores = {x.b, x.h, x.s, x.s}, score_strides = {x.h * x.s * x.s, x.s * x.s, x.s, 1};
  const Dims transposed_score_strides = {x.h * x.s * x.s, x.s * x.s, 1, x.s};
  const Dims rows = {x.b, x.h, x.s, 1}, row_strides = {x.h * x.s, x.s, 1, 1};
  cudnnBackendDescriptor_t q = g.tensor(kQ, io, bhsd, x.q, false);
  cudnnBackendDescriptor_t kt = g.tensor(kK, io, kv_bhds, transposed(x.k), false);
  cudnnBackendDescriptor_t vt = g.tensor(kV, io, kv_bhds, transposed(x.v), false);
  cudnnBackendDescriptor_t o = g.tensor(kO, io, bhsd, x.o, false);
  cudnnBackendDescriptor_t stats = g.tensor(kStats, CUDNN_DATA_FLOAT, rows, row_strides, false);
  cudnnBackendDescriptor_t grad_out = g.tensor(kGradOut, io, bhsd, x.grad_out, false);
  cudnnBackendDescriptor_t grad_q = g.tensor(kGradQ, io, bhsd, x.grad_q, false);
  cudnnBackendDescriptor_t grad_k = g.tensor(kGradK, io, kv_bhsd, x.grad_k, false);
  cudnnBackendDescriptor_t grad_v = g.tensor(kGradV, io, kv_bhsd, x.grad_v, false);
  // Grouped-query attention: dK and dV per query head, then summed over each kv head's group.
  const bool grouped = x.kv != x.h;
  const auto per_query_head = [&](cudnnBackendDescriptor_t gradient) {
    return grouped ? g.virtual_tensor(io, bhsd, bhsd_strides(x)) : gradient;
  };
  const auto sum_over_group = [&](cudnnBackendDescriptor_t full, cudnnBackendDescriptor_t gradient,
                                  const char* name) {
    if (grouped) g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, gradient, name);
  };
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  cudnnBackendDescriptor_t mask_value = g.scalar(kMaskValue);
  cudnnBackendDescriptor_t one = g.scalar(kOne);
  // Workspace tensors: the row sums of dO * O and, unless deterministic, the f32 dQ accumulator.
  cudnnBackendDescriptor_t softmax_sum = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, rows, row_strides, false);

  // softmax_sum = rowsum(dO * O) * 1
  cudnnBackendDescriptor_t product = g.virtual_tensor(CUDNN_DATA_FLOAT, bhsd, bhsd_strides(x));
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, grad_out, o, nullptr, product, "mul dO O");
  cudnnBackendDescriptor_t row_sum = g.virtual_tensor(CUDNN_DATA_FLOAT, rows, row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, product, row_sum, "reduce dO O");
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, row_sum, one, nullptr, softmax_sum, "scale dropout inv");

  // P = exp(mask(Q K^T * scale - stats))
  cudnnBackendDescriptor_t s = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.matmul(q, kt, s, "matmul Q K^T");
  cudnnBackendDescriptor_t scaled = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled, "mul s attn_scale");
  cudnnBackendDescriptor_t shifted = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, scaled, stats, nullptr, shifted, "sub s stats");
  cudnnBackendDescriptor_t masked = g.causal_mask(shifted, mask_value, scores, score_strides);
  cudnnBackendDescriptor_t probs = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, masked, nullptr, nullptr, probs, "exp s");

  // dV = P^T @ dO
  cudnnBackendDescriptor_t probs_t = g.virtual_tensor(io, scores, transposed_score_strides);
  g.reshape(probs, probs_t, "reshape P^T");
  cudnnBackendDescriptor_t grad_v_full = per_query_head(grad_v);
  g.matmul(probs_t, grad_out, grad_v_full, "matmul P^T dO");
  sum_over_group(grad_v_full, grad_v, "reduce dV over the group");

  // dS = (dO @ V^T * 1 - softmax_sum) * P * scale
  cudnnBackendDescriptor_t dp = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.matmul(grad_out, vt, dp, "matmul dO V^T");
  cudnnBackendDescriptor_t dp_masked = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp, one, nullptr, dp_masked, "dP dropout mask");
  cudnnBackendDescriptor_t dp_centered = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp_masked, softmax_sum, nullptr, dp_centered,
              "sub dP softmax_sum");
  cudnnBackendDescriptor_t ds_unscaled = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_centered, probs, nullptr, ds_unscaled, "mul dP P");
  cudnnBackendDescriptor_t ds = g.virtual_tensor(CUDNN_DATA_FLOAT, scores, score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds_unscaled, scale, nullptr, ds, "mul dS attn_scale");

  // dK = dS^T @ Q
  cudnnBackendDescriptor_t ds_t = g.virtual_tensor(io, scores, transposed_score_strides);
  g.reshape(ds, ds_t, "reshape dS^T");
  cudnnBackendDescriptor_t grad_k_full = per_query_head(grad_k);
  g.matmul(ds_t, q, grad_k_full, "matmul dS^T Q");
  sum_over_group(grad_k_full, grad_k, "reduce dK over the group");

  // dQ = dS @ K. By default accumulated in an f32 workspace tensor: the engines add each kv
  // block's share with atomics, in whatever order the blocks finish, so dQ's bits vary from run to
  // run. Written straight into dQ (no accumulator tensor), the engines take the dP-workspace route,
  // which sums the shares in a fixed order: what cudnn-frontend's deterministic sdpa_backward builds
  // on Hopper.
  cudnnBackendDescriptor_t k = g.virtual_tensor(io, kv_bhsd, x.k);  // K itself: the view kt transposes
  g.reshape(kt, k, "reshape K");
  if (deterministic) {
    g.matmul(ds, k, grad_q, "matmul dS K");
  } else {
    cudnnBackendDescriptor_t grad_q_accum = g.tensor(kGradQAccum, CUDNN_DATA_FLOAT, bhsd, bhsd_strides(x), false);
    g.matmul(ds, k, grad_q_accum, "matmul dS K");
    g.pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, grad_q_accum, nullptr, nullptr, grad_q, "identity dQ");
  }
  return g.finish("sdpa backward", deterministic);
}

// --- Per-device state -----------------------------------------------------------------------------

// backward, B, H, KV, T, D, dtype, the strides of the graph's tensors in role order (Shape), and
// whether only deterministic engines may run it
using PlanKey = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int, Dims, bool>;

struct DeviceState {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  std::string handle_failure;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

// Never destroyed: handles and plans live for the process (no teardown after the CUDA context).
DeviceState& device_state(int device) {
  static std::mutex mutex;
  static auto* states = new std::map<int, std::unique_ptr<DeviceState>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& state = (*states)[device];
  if (!state) state = std::make_unique<DeviceState>();
  return *state;
}

bool verbose() {
  static const bool value = [] {
    const char* text = std::getenv("WEFT_ATTENTION_VERBOSE");
    return text != nullptr && *text != '\0' && std::string_view(text) != "0";
  }();
  return value;
}

// Checks what the cuDNN graphs assume; returns the reason it cannot run, or "".
std::string unsupported_reason(std::initializer_list<const Tensor*> tensors, const Tensor& q) {
  if (q.dtype() != kBFloat16 && q.dtype() != kFloat16) {
    return std::string("dtype ") + std::string(dtype_name(q.dtype())) + " (cuDNN path runs bf16 and f16)";
  }
  if (q.dim() != 4 || q.size(3) % 8 != 0 || q.size(3) > 256) {
    return "head dim " + std::to_string(q.size(3)) + " (cuDNN takes multiples of 8 up to 256)";
  }
  for (const Tensor* tensor : tensors) {
    // Rows of D elements, each 16-byte aligned: unit stride in D, the other strides whole 16 bytes.
    const int64_t pack = 16 / static_cast<int64_t>(dtype_size(tensor->dtype()));
    bool rows_aligned = tensor->stride(3) == 1 && reinterpret_cast<uintptr_t>(tensor->raw_data()) % 16 == 0;
    for (int dim = 0; dim < 3; ++dim) rows_aligned = rows_aligned && tensor->stride(dim) % pack == 0;
    if (!rows_aligned) return "tensors must have unit stride in D and 16-byte aligned rows";
  }
  return "";
}

// The plan for `key` on `state` (built at the first use); nullptr with the reason noted when none.
Plan* get_plan(DeviceState& state, const PlanKey& key, const Shape& shape, cudnnDataType_t io) {
  if (state.handle == nullptr && state.handle_failure.empty()) {
    const cudnnStatus_t status = cudnnCreate(&state.handle);
    if (status != CUDNN_STATUS_SUCCESS) {
      state.handle = nullptr;
      state.handle_failure = "cudnnCreate -> " + status_text(status);
    }
  }
  if (state.handle == nullptr) {
    note_fallback(state.handle_failure);
    return nullptr;
  }
  auto found = state.plans.find(key);
  if (found == state.plans.end()) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_ptr<Plan> plan;
    try {
      const bool deterministic = std::get<8>(key);
      plan = std::get<0>(key) ? build_backward(state.handle, shape, io, deterministic)
                              : build_forward(state.handle, shape, io, deterministic);
    } catch (const CudnnFailure& failure) {
      plan = std::make_unique<Plan>();
      plan->failure = failure.message;
    }
    if (verbose()) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      std::fprintf(stderr, "weft: cuDNN %s B%lld H%lld KV%lld T%lld D%lld: %s (%.0f ms)\n",
                   std::get<0>(key) ? "sdpa backward" : "sdpa forward", static_cast<long long>(shape.b),
                   static_cast<long long>(shape.h), static_cast<long long>(shape.kv), static_cast<long long>(shape.s),
                   static_cast<long long>(shape.d),
                   plan->failure.empty() ? ("engine " + std::to_string(plan->engine) + " (" + plan->chosen +
                                            (plan->nondeterministic ? ", nondeterministic" : "") + "), workspace " +
                                            std::to_string(plan->workspace_bytes) + " bytes")
                                               .c_str()
                                         : plan->failure.c_str(),
                   ms);
    }
    found = state.plans.emplace(key, std::move(plan)).first;
  }
  if (!found->second->failure.empty()) {
    note_fallback(found->second->failure + " (cuDNN " + std::to_string(cudnnGetVersion()) + ")");
    return nullptr;
  }
  return found->second.get();
}

int64_t align_up(int64_t bytes, int64_t alignment = 256) { return (bytes + alignment - 1) / alignment * alignment; }

// Runs `plan` with the given (uid, pointer) pairs and a workspace of plan + extra bytes from weft's
// allocator; `extra` lists workspace tensors (uid, bytes) placed after the plan's own workspace,
// those in `zeroed_uids` zeroed first. An untuned plan with several candidates (autotuning) first
// runs each of them on these very tensors, three times, and keeps the fastest: every run writes the
// same outputs from the same inputs (the zeroed workspace tensors are zeroed again before each), so
// the call's result is that of the plan kept. Not while the stream is being captured. Returns false
// (noting why) when execution is refused.
bool execute(DeviceState& state, Plan& plan, const Device& device, std::vector<int64_t> uids,
             std::vector<void*> pointers, const std::vector<std::pair<int64_t, int64_t>>& extra,
             const std::vector<int64_t>& zeroed_uids, const char* what) {
  const cudaStream_t stream = current_stream(device.index);
  bool tune = !plan.tuned && plan.candidates.size() > 1;
  if (tune) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    WEFT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    tune = capture == cudaStreamCaptureStatusNone;
  }
  int64_t plan_bytes = plan.workspace_bytes;
  if (tune) {
    for (const Plan::Candidate& candidate : plan.candidates) {
      plan_bytes = std::max(plan_bytes, candidate.workspace_bytes);
    }
  }
  int64_t total = align_up(plan_bytes);
  std::vector<int64_t> offsets;
  for (const auto& [uid, bytes] : extra) {
    offsets.push_back(total);
    total += align_up(bytes);
  }
  Tensor workspace = Tensor::empty({std::max<int64_t>(1, (total + 3) / 4)}, kFloat32, device);
  char* base = static_cast<char*>(workspace.raw_data());
  for (size_t i = 0; i < extra.size(); ++i) {
    uids.push_back(extra[i].first);
    pointers.push_back(base + offsets[i]);
  }
  auto zero_workspace_tensors = [&] {
    for (size_t i = 0; i < extra.size(); ++i) {
      if (std::find(zeroed_uids.begin(), zeroed_uids.end(), extra[i].first) != zeroed_uids.end()) {
        WEFT_CUDA_CHECK(cudaMemsetAsync(base + offsets[i], 0, static_cast<size_t>(extra[i].second), stream));
      }
    }
  };
  auto run = [&](Desc& which) {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, std::string(what) + " variant pack");
    void* workspace_pointer = base;
    pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<int64_t>(uids.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.data(),
             static_cast<int64_t>(pointers.size()))
        .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace_pointer)
        .finalize();
    WEFT_CUDNN_TRY(cudnnSetStream(state.handle, stream), what);
    WEFT_CUDNN_TRY(cudnnBackendExecute(state.handle, which.get(), pack.get()), what);
  };
  if (tune) {
    Event start(true), end(true);
    double best_ms = std::numeric_limits<double>::infinity();
    const Plan::Candidate* best = nullptr;
    std::string timings;
    for (const Plan::Candidate& candidate : plan.candidates) {
      double fastest = std::numeric_limits<double>::infinity();
      try {
        for (int repeat = 0; repeat < 3; ++repeat) {
          zero_workspace_tensors();
          start.record(stream);
          run(*candidate.plan);
          end.record(stream);
          end.synchronize();
          fastest = std::min(fastest, static_cast<double>(end.elapsed_since(start)));
        }
      } catch (const CudnnFailure&) {
        timings += " engine " + std::to_string(candidate.engine) + ": refused;";
        continue;
      }
      timings += " engine " + std::to_string(candidate.engine) + ": " + std::to_string(fastest * 1000.0) + " us;";
      if (fastest < best_ms) {
        best_ms = fastest;
        best = &candidate;
      }
    }
    if (best != nullptr) plan.use(*best);
    plan.tuned = true;
    if (verbose()) std::fprintf(stderr, "weft: cuDNN %s autotuned:%s kept engine %lld\n", what, timings.c_str(),
                                static_cast<long long>(plan.engine));
  }
  zero_workspace_tensors();
  try {
    run(*plan.plan);
  } catch (const CudnnFailure& failure) {
    plan.failure = failure.message;  // do not try this plan again
    note_fallback(failure.message);
    return false;
  }
  g_last_engine = {plan.engine, plan.nondeterministic, plan.chosen};
  return true;
}

cudnnDataType_t io_type(const Tensor& q) { return q.dtype() == kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

// What both directions do before executing: the plan for q's shape, dtype and the tensors' strides,
// or null (the fallback noted) when cuDNN does not take `tensors` (in Shape's role order: q, k, v,
// o, then for the backward grad_out, grad_q, grad_k, grad_v). On a plan, `state` is q's device
// state and `lock` holds its mutex.
Plan* plan_for(std::initializer_list<const Tensor*> tensors, const Tensor& q, bool backward, bool deterministic,
               DeviceState*& state, std::unique_lock<std::mutex>& lock) {
  if (const std::string reason = unsupported_reason(tensors, q); !reason.empty()) {
    note_fallback(reason);
    return nullptr;
  }
  const Tensor& k = **std::next(tensors.begin());  // tensors are in role order: q, k, ...
  Shape shape{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3)};
  Dims* const roles[] = {&shape.q, &shape.k, &shape.v, &shape.o, &shape.grad_out, &shape.grad_q, &shape.grad_k,
                         &shape.grad_v};
  Dims all_strides;
  size_t role = 0;
  for (const Tensor* tensor : tensors) {
    *roles[role++] = strides_of(*tensor);
    all_strides.insert(all_strides.end(), roles[role - 1]->begin(), roles[role - 1]->end());
  }
  set_device(q.device().index);
  state = &device_state(q.device().index);
  lock = std::unique_lock<std::mutex>(state->mutex);
  return get_plan(*state,
                  {backward, shape.b, shape.h, shape.kv, shape.s, shape.d, static_cast<int>(q.dtype()),
                   std::move(all_strides), deterministic},
                  shape, io_type(q));
}

}  // namespace

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                             const Tensor& lse) {
  DeviceState* state = nullptr;
  std::unique_lock<std::mutex> lock;
  Plan* plan = plan_for({&q, &k, &v, &out}, q, false, deterministic_kernels(), state, lock);
  if (plan == nullptr) return false;
  const Device device = q.device();
  float scale_value = static_cast<float>(scale);
  float mask_value = std::numeric_limits<float>::lowest();
  return execute(*state, *plan, device, {kQ, kK, kV, kO, kStats, kScale, kMaskValue},
                 {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(), &scale_value, &mask_value},
                 {}, {}, "sdpa forward");
}

bool cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                              const Tensor& grad_k, const Tensor& grad_v) {
  DeviceState* state = nullptr;
  std::unique_lock<std::mutex> lock;
  const bool deterministic = deterministic_kernels();
  Plan* plan = plan_for({&q, &k, &v, &out, &grad_out, &grad_q, &grad_k, &grad_v}, q, true, deterministic, state, lock);
  if (plan == nullptr) return false;
  const Shape shape{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3)};
  const Device device = q.device();
  float scale_value = static_cast<float>(scale);
  float mask_value = std::numeric_limits<float>::lowest();
  float one = 1.0f;
  const int64_t rows = shape.b * shape.h * shape.s;
  // Before cuDNN 9.6 the frontend zeroes the dQ accumulator itself; later the engine does. The
  // deterministic graph has no accumulator.
  std::vector<std::pair<int64_t, int64_t>> workspace_tensors = {{kSoftmaxSum, rows * 4}};
  std::vector<int64_t> zeroed;
  if (!deterministic) {
    workspace_tensors.push_back({kGradQAccum, rows * shape.d * 4});
    if (cudnnGetVersion() < 90600) zeroed.push_back(kGradQAccum);
  }
  return execute(*state, *plan, device,
                 {kQ, kK, kV, kO, kStats, kGradOut, kGradQ, kGradK, kGradV, kScale, kMaskValue, kOne},
                 {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(), grad_out.raw_data(),
                  grad_q.raw_data(), grad_k.raw_data(), grad_v.raw_data(), &scale_value, &mask_value, &one},
                 workspace_tensors, zeroed, "sdpa backward");
}

#endif  // WEFT_HAVE_CUDNN

}  // namespace weft::cuda
