// CUDA kernels: fill, copy (within a device, across devices, host <-> device), random fill, unary
// (and its backward), binary and affine ops, and rescale_unless_expected.
//
// Every elementwise op has two kernels: a contiguous one that moves 16 bytes per load and store
// (float4, or 8 bf16/f16), taken when every operand is contiguous and 16-byte aligned, and a
// strided one for any view (StridedIndexer, strided_indexer.cuh). Math is f32 like the CPU
// reference (runtime/cpu/elementwise.cc), in the same expression order; affine uses explicitly
// rounded multiply and add so that no fused multiply-add changes its result. Random fills follow
// runtime/random.h exactly and compute in double, so f32 draws are bit-identical to the CPU's.
// Conversions between dtypes go through double with the rounding of weft::store_element (round to
// odd into f32, then to nearest for 16-bit formats), so copies agree with the CPU bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/device_math.cuh"
#include "runtime/cuda/pinned_buffer.h"
#include "runtime/cuda/row_kernels.cuh"
#include "runtime/cuda/silu.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/cuda/strided_indexer.cuh"
#include "runtime/random.h"

namespace weft {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// ============================================================================================
// Device-side element conversions through double (copy, fill_random)
// ============================================================================================

__device__ __forceinline__ double load_double(float value) { return static_cast<double>(value); }
__device__ __forceinline__ double load_double(__nv_bfloat16 value) { return static_cast<double>(__bfloat162float(value)); }
__device__ __forceinline__ double load_double(__half value) { return static_cast<double>(__half2float(value)); }
__device__ __forceinline__ double load_double(double value) { return value; }
__device__ __forceinline__ double load_double(int32_t value) { return static_cast<double>(value); }
__device__ __forceinline__ double load_double(int64_t value) { return static_cast<double>(value); }
__device__ __forceinline__ double load_double(int16_t value) { return static_cast<double>(value); }

// weft::round_to_odd_float on the device: truncate toward zero, set the lowest bit when inexact.
__device__ __forceinline__ float round_to_odd_float(double value) {
  if (isnan(value)) return __double2float_rn(value);
  const float truncated = __double2float_rz(value);
  if (static_cast<double>(truncated) == value) return truncated;
  return __uint_as_float(__float_as_uint(truncated) | 1u);
}

template <class T>
__device__ __forceinline__ T store_double(double value);
template <>
__device__ __forceinline__ float store_double<float>(double value) { return __double2float_rn(value); }
template <>
__device__ __forceinline__ __nv_bfloat16 store_double<__nv_bfloat16>(double value) {
  return __float2bfloat16_rn(round_to_odd_float(value));
}
template <>
__device__ __forceinline__ __half store_double<__half>(double value) { return __float2half_rn(round_to_odd_float(value)); }
template <>
__device__ __forceinline__ double store_double<double>(double value) { return value; }
template <>
__device__ __forceinline__ int32_t store_double<int32_t>(double value) { return static_cast<int32_t>(value); }
template <>
__device__ __forceinline__ int64_t store_double<int64_t>(double value) { return static_cast<int64_t>(value); }
template <>
__device__ __forceinline__ int16_t store_double<int16_t>(double value) { return static_cast<int16_t>(value); }

// Instantiates body for the device storage type of any dtype (copies move every dtype).
template <class Body>
void dispatch_cuda_all(DType dtype, std::string_view op, Body&& body) {
  switch (dtype) {
    case kFloat32: body.template operator()<float>(); return;
    case kBFloat16: body.template operator()<__nv_bfloat16>(); return;
    case kFloat16: body.template operator()<__half>(); return;
    case kFloat64: body.template operator()<double>(); return;
    case kInt32: body.template operator()<int32_t>(); return;
    case kInt64: body.template operator()<int64_t>(); return;
    case kInt16: body.template operator()<int16_t>(); return;
  }
  WEFT_FAIL(op, ": unknown dtype");
}

// Floating dtypes including f64 (fill_random supports f64 like the CPU backend).
template <class Body>
void dispatch_cuda_random(DType dtype, std::string_view op, Body&& body) {
  if (dtype == kFloat64) {
    body.template operator()<double>();
    return;
  }
  dispatch_cuda_floating(dtype, op, std::forward<Body>(body));
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

int device_of(const Tensor& tensor) { return tensor.device().index; }

// Makes the tensor's device current on this thread and returns its current stream.
cudaStream_t prepare(const Tensor& tensor) {
  const int device = device_of(tensor);
  check_device(device);
  set_device(device);
  return current_stream(device);
}

// ============================================================================================
// Fill
// ============================================================================================

template <class Word>
__global__ void fill_contiguous_kernel(Word* out, Word value, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

__global__ void fill_vector_kernel(uint4* out, uint4 pattern, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = pattern;
  }
}

template <class Word>
__global__ void fill_strided_kernel(Word* out, Word value, StridedIndexer<1> indexer, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[1];
    indexer.offsets(i, offsets);
    out[offsets[0]] = value;
  }
}

// The stored bytes of `value` in `dtype`, rounded exactly as the CPU backend's store_element.
uint64_t stored_bits(DType dtype, double value) {
  uint64_t bits = 0;
  switch (dtype) {
    case kFloat32: {
      const float stored = store_element<float>(value);
      std::memcpy(&bits, &stored, sizeof(stored));
      break;
    }
    case kBFloat16: bits = store_element<BFloat16>(value).bits; break;
    case kFloat16: bits = store_element<Float16>(value).bits; break;
    case kFloat64: std::memcpy(&bits, &value, sizeof(value)); break;
    case kInt32: {
      const int32_t stored = static_cast<int32_t>(value);
      std::memcpy(&bits, &stored, sizeof(stored));
      break;
    }
    case kInt64: {
      const int64_t stored = static_cast<int64_t>(value);
      std::memcpy(&bits, &stored, sizeof(stored));
      break;
    }
    case kInt16: {
      const int16_t stored = static_cast<int16_t>(value);
      std::memcpy(&bits, &stored, sizeof(stored));
      break;
    }
  }
  return bits;
}

template <class Word>
void fill_words(const Tensor& out, uint64_t bits, cudaStream_t stream) {
  const Word word = static_cast<Word>(bits);
  const int64_t count = out.numel();
  Word* data = static_cast<Word*>(out.raw_data());
  if (!out.is_contiguous()) {
    const auto indexer = make_strided_indexer<1>(out.shape(), {absl::MakeConstSpan(out.strides())}, "fill");
    fill_strided_kernel<Word><<<grid_for(count, kThreads), kThreads, 0, stream>>>(data, word, indexer, count);
    WEFT_CUDA_CHECK_LAUNCH();
    return;
  }
  // All bytes equal (zero above all): a memset is the fastest fill there is.
  unsigned char bytes[sizeof(Word)];
  std::memcpy(bytes, &word, sizeof(Word));
  bool uniform = true;
  for (size_t i = 1; i < sizeof(Word); ++i) uniform = uniform && bytes[i] == bytes[0];
  if (uniform) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(data, bytes[0], static_cast<size_t>(count) * sizeof(Word), stream));
    return;
  }
  int64_t head = 0;
  if (aligned16(data)) {
    constexpr int64_t kPerVector = 16 / sizeof(Word);
    Word pattern_words[kPerVector];
    for (int64_t i = 0; i < kPerVector; ++i) pattern_words[i] = word;
    uint4 pattern;
    std::memcpy(&pattern, pattern_words, sizeof(pattern));
    const int64_t vectors = count / kPerVector;
    if (vectors > 0) {
      fill_vector_kernel<<<grid_for(vectors, kThreads), kThreads, 0, stream>>>(reinterpret_cast<uint4*>(data),
                                                                                pattern, vectors);
      WEFT_CUDA_CHECK_LAUNCH();
    }
    head = vectors * kPerVector;
  }
  if (head < count) {
    fill_contiguous_kernel<Word><<<grid_for(count - head, kThreads), kThreads, 0, stream>>>(data + head, word,
                                                                                            count - head);
    WEFT_CUDA_CHECK_LAUNCH();
  }
}

// ============================================================================================
// Copy
// ============================================================================================

template <class S, class T>
__global__ void convert_kernel(const S* in, T* out, StridedIndexer<2> indexer, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[2];
    indexer.offsets(i, offsets);
    if constexpr (std::is_same_v<S, T>) {
      out[offsets[1]] = in[offsets[0]];
    } else {
      out[offsets[1]] = store_double<T>(load_double(in[offsets[0]]));
    }
  }
}

// Same-dtype copies of views whose innermost dim is contiguous in both operands (a permute of
// [B, T, H, D] heads, a slice of the last dim): Word-sized chunks (up to 16 bytes) move at once,
// addressed by an indexer in Word units.
template <class Word>
__global__ void copy_words_kernel(const Word* in, Word* out, StridedIndexer<2> indexer, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[2];
    indexer.offsets(i, offsets);
    out[offsets[1]] = in[offsets[0]];
  }
}

}  // namespace

// An element indexer regrouped into vectors of `per_vector` elements along the innermost dim, when
// that dim has stride 1 in every operand and length divisible by per_vector, and every other stride
// is a multiple of per_vector (so each vector starts on a vector boundary of its operand).
template <int N>
bool vectorize_indexer(const StridedIndexer<N>& elements, int64_t per_vector, StridedIndexer<N>& vectors) {
  const int last = elements.rank - 1;
  if (per_vector <= 1 || elements.sizes[last] % per_vector != 0) return false;
  for (int k = 0; k < N; ++k) {
    if (elements.strides[k][last] != 1) return false;
    for (int d = 0; d < last; ++d) {
      if (elements.strides[k][d] % per_vector != 0) return false;
    }
  }
  vectors = elements;
  vectors.sizes[last] /= per_vector;
  for (int k = 0; k < N; ++k) {
    for (int d = 0; d < last; ++d) vectors.strides[k][d] /= per_vector;
  }
  return true;
}

namespace {

bool aligned_to(const void* pointer, size_t bytes) { return reinterpret_cast<uintptr_t>(pointer) % bytes == 0; }

// Tries the Word-chunk copy; false when the layout or alignment does not allow Word.
template <class Word>
bool try_copy_words(const Tensor& source, const Tensor& out, const StridedIndexer<2>& indexer, cudaStream_t stream) {
  const int64_t element = out.element_size();
  if (static_cast<int64_t>(sizeof(Word)) <= element || sizeof(Word) % element != 0) return false;
  if (!aligned_to(source.raw_data(), sizeof(Word)) || !aligned_to(out.raw_data(), sizeof(Word))) return false;
  StridedIndexer<2> words;
  if (!vectorize_indexer<2>(indexer, static_cast<int64_t>(sizeof(Word)) / element, words)) return false;
  int64_t count = 1;
  for (int d = 0; d < words.rank; ++d) count *= words.sizes[d];
  copy_words_kernel<Word><<<grid_for(count, kThreads), kThreads, 0, stream>>>(
      static_cast<const Word*>(source.raw_data()), static_cast<Word*>(out.raw_data()), words, count);
  WEFT_CUDA_CHECK_LAUNCH();
  return true;
}

size_t byte_size(const Tensor& tensor) { return static_cast<size_t>(tensor.numel() * tensor.element_size()); }

// source and out on the same CUDA device, same shape: any views, any dtypes.
void copy_on_device(const Tensor& source, const Tensor& out) {
  const int64_t count = out.numel();
  if (count == 0) return;
  const cudaStream_t stream = prepare(out);
  if (source.dtype() == out.dtype() && source.is_contiguous() && out.is_contiguous()) {
    if (source.raw_data() != out.raw_data()) {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), source.raw_data(), byte_size(out), cudaMemcpyDeviceToDevice,
                                      stream));
    }
    return;
  }
  const auto indexer = make_strided_indexer<2>(
      out.shape(), {absl::MakeConstSpan(source.strides()), absl::MakeConstSpan(out.strides())}, "copy");
  if (source.dtype() == out.dtype() &&
      (try_copy_words<uint4>(source, out, indexer, stream) || try_copy_words<uint2>(source, out, indexer, stream) ||
       try_copy_words<uint32_t>(source, out, indexer, stream))) {
    return;
  }
  dispatch_cuda_all(source.dtype(), "copy", [&]<class S>() {
    dispatch_cuda_all(out.dtype(), "copy", [&]<class T>() {
      convert_kernel<S, T><<<grid_for(count, kThreads), kThreads, 0, stream>>>(source.data<S>(), out.data<T>(),
                                                                              indexer, count);
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

// Pinned staging buffers for host -> device copies. A copy from pageable memory may return before
// the host data was read, so the host bytes are first copied into a pinned buffer, which is reused
// only after an event recorded behind its transfer has completed. The copy stays asynchronous.
class HostStaging {
 public:
  // Copies `bytes` from `host` to `device_pointer` on `stream` of `device` (which is current).
  void upload(int device, void* device_pointer, const void* host, size_t bytes, cudaStream_t stream) {
    if (bytes > kLargestStaged) {
      // Rare (checkpoint loads): a plain copy, waited for, needs no buffer of this size.
      WEFT_CUDA_CHECK(cudaMemcpyAsync(device_pointer, host, bytes, cudaMemcpyHostToDevice, stream));
      WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
      return;
    }
    Slot* slot = acquire(bytes, device);
    std::memcpy(slot->buffer.data(), host, bytes);
    try {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(device_pointer, slot->buffer.data(), bytes, cudaMemcpyHostToDevice, stream));
      WEFT_CUDA_CHECK(cudaEventRecord(slot->event, stream));
    } catch (...) {
      release_now(slot);
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    slot->state = State::kInFlight;
  }

 private:
  static constexpr size_t kLargestStaged = size_t{64} << 20;
  enum class State { kFree, kReserved, kInFlight };
  struct Slot {
    PinnedBuffer buffer;
    int device = 0;  // the device of its event (current at creation), hence of the streams it serves
    cudaEvent_t event = nullptr;
    State state = State::kFree;
  };

  Slot* acquire(size_t bytes, int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    Slot* best = nullptr;
    for (auto& slot : slots_) {
      if (slot->state == State::kInFlight && cudaEventQuery(slot->event) == cudaSuccess) slot->state = State::kFree;
      if (slot->state == State::kFree && slot->device == device && slot->buffer.size() >= bytes &&
          (best == nullptr || slot->buffer.size() < best->buffer.size())) {
        best = slot.get();
      }
    }
    cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error
    if (best == nullptr) {
      size_t size = size_t{1} << 16;
      while (size < bytes) size <<= 1;
      auto slot = std::make_unique<Slot>();
      slot->buffer = PinnedBuffer(size);
      slot->device = device;
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&slot->event, cudaEventDisableTiming));
      best = slot.get();
      slots_.push_back(std::move(slot));
    }
    best->state = State::kReserved;
    return best;
  }

  void release_now(Slot* slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    slot->state = State::kFree;
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

HostStaging& host_staging() {
  static HostStaging* staging = new HostStaging;  // leaked: pinned memory outlives static destructors
  return *staging;
}

// A contiguous tensor with source's shape and `dtype` on source's device holding source's values:
// source itself when it already is one.
Tensor contiguous_staging(const Tensor& source, DType dtype) {
  if (source.dtype() == dtype && source.is_contiguous()) return source;
  Tensor staged = Tensor::empty(source.shape(), dtype, source.device());
  if (source.device().is_cpu()) {
    cpu_backend().copy(source, staged);
  } else {
    copy_on_device(source, staged);
  }
  return staged;
}

void copy_host_to_device(const Tensor& source, const Tensor& out) {
  const Tensor staged = contiguous_staging(source, out.dtype());
  const cudaStream_t stream = prepare(out);
  if (out.is_contiguous()) {
    host_staging().upload(device_of(out), out.raw_data(), staged.raw_data(), byte_size(out), stream);
    return;
  }
  const Tensor landing = Tensor::empty(out.shape(), out.dtype(), out.device());
  host_staging().upload(device_of(out), landing.raw_data(), staged.raw_data(), byte_size(out), stream);
  copy_on_device(landing, out);
}

void copy_device_to_host(const Tensor& source, const Tensor& out) {
  // Convert and make contiguous on the device (cheap there), move bytes, then place them on the host.
  const Tensor staged = contiguous_staging(source, out.dtype());
  const cudaStream_t stream = prepare(source);
  const Tensor landing = out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), Device::cpu());
  WEFT_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), staged.raw_data(), byte_size(out), cudaMemcpyDeviceToHost,
                                  stream));
  // The host reads the result as soon as copy returns.
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!landing.is_same(out)) cpu_backend().copy(landing, out);
}

void copy_device_to_device(const Tensor& source, const Tensor& out) {
  const Tensor staged = contiguous_staging(source, out.dtype());
  const Tensor landing = out.is_contiguous() ? out : Tensor::empty(out.shape(), out.dtype(), out.device());
  // The copy runs on out's stream after source's work so far; source's stream then waits for the copy,
  // so source (and the staging block, cached on that stream) is not reused while being read. Each
  // event is created and recorded with its stream's device current, as CUDA requires.
  const cudaStream_t source_stream = prepare(source);
  Event source_ready;
  source_ready.record(source_stream);
  const cudaStream_t out_stream = prepare(out);
  source_ready.wait(out_stream);
  WEFT_CUDA_CHECK(cudaMemcpyPeerAsync(landing.raw_data(), device_of(out), staged.raw_data(), device_of(source),
                                      byte_size(out), out_stream));
  Event copied;
  copied.record(out_stream);
  copied.wait(source_stream);
  if (!landing.is_same(out)) copy_on_device(landing, out);
}

// ============================================================================================
// Random fill
// ============================================================================================

template <class T>
__global__ void random_kernel(T* out, int64_t count, uint64_t seed, uint64_t offset, double a, double b, bool normal,
                              T below_high) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t counter = offset + static_cast<uint64_t>(i);
    if (!normal) {
      // a + (b - a) * u with each operation rounded, as on the host (no fused multiply-add).
      const T stored = store_double<T>(__dadd_rn(a, __dmul_rn(__dsub_rn(b, a), philox_uniform(seed, counter))));
      out[i] = load_double(stored) >= b ? below_high : stored;
    } else {
      out[i] = store_double<T>(__dadd_rn(a, __dmul_rn(b, philox_normal(seed, counter))));
    }
  }
}

// The host type with the same bits as device type T.
template <class T> struct HostTypeOf { using type = T; };
template <> struct HostTypeOf<__nv_bfloat16> { using type = BFloat16; };
template <> struct HostTypeOf<__half> { using type = Float16; };

// The largest value of stored type T below `limit` (the CPU backend's rule, computed on the host).
template <class T>
T largest_below(double limit) {
  using H = typename HostTypeOf<T>::type;
  H value;
  if constexpr (std::is_same_v<H, double>) {
    value = std::nextafter(limit, -INFINITY);
  } else if constexpr (std::is_same_v<H, float>) {
    const float rounded = static_cast<float>(limit);
    value = static_cast<double>(rounded) < limit ? rounded : std::nextafter(rounded, -INFINITY);
  } else {
    value = store_element<H>(limit);
    while (static_cast<double>(static_cast<float>(value)) >= limit) {
      const bool negative = (value.bits & 0x8000u) != 0;
      if ((value.bits & 0x7fffu) == 0) {
        value.bits = 0x8001u;
      } else {
        value.bits = static_cast<uint16_t>(negative ? value.bits + 1 : value.bits - 1);
      }
    }
  }
  static_assert(sizeof(H) == sizeof(T));
  T device_value;
  std::memcpy(static_cast<void*>(&device_value), &value, sizeof(T));
  return device_value;
}

// ============================================================================================
// Unary, binary, affine
// ============================================================================================

constexpr float kSqrtTwoOverPi = 0.79788456080286535587989211986876f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float apply_unary(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kRelu: return x > 0.0f ? x : 0.0f;
    case UnaryOp::kGelu: {
      const float inner = kSqrtTwoOverPi * (x + kGeluCubic * x * x * x);
      return 0.5f * x * (1.0f + tanhf(inner));
    }
    case UnaryOp::kSilu: return silu(x);
    case UnaryOp::kExp: return expf(x);
    case UnaryOp::kLog: return logf(x);
    case UnaryOp::kTanh: return tanhf(x);
    case UnaryOp::kSqrt: return sqrtf(x);
    case UnaryOp::kSquare: return x * x;
    case UnaryOp::kReciprocal: return 1.0f / x;
  }
  return x;
}

__device__ __forceinline__ float unary_derivative(UnaryOp op, float x) {
  switch (op) {
    case UnaryOp::kNeg: return -1.0f;
    case UnaryOp::kRelu: return x > 0.0f ? 1.0f : 0.0f;
    case UnaryOp::kGelu: {
      const float inner = kSqrtTwoOverPi * (x + kGeluCubic * x * x * x);
      const float tanh_inner = tanhf(inner);
      const float inner_derivative = kSqrtTwoOverPi * (1.0f + (3.0f * kGeluCubic) * x * x);
      return 0.5f * (1.0f + tanh_inner) + 0.5f * x * (1.0f - tanh_inner * tanh_inner) * inner_derivative;
    }
    case UnaryOp::kSilu: return silu_derivative(x);
    case UnaryOp::kExp: return expf(x);
    case UnaryOp::kLog: return 1.0f / x;
    case UnaryOp::kTanh: {
      const float t = tanhf(x);
      return 1.0f - t * t;
    }
    case UnaryOp::kSqrt: return 0.5f / sqrtf(x);
    case UnaryOp::kSquare: return 2.0f * x;
    case UnaryOp::kReciprocal: return -1.0f / (x * x);
  }
  return 0.0f;
}

struct UnaryFunctor {
  UnaryOp op;
  __device__ __forceinline__ float operator()(float x) const { return apply_unary(op, x); }
};

// Inputs (x, grad_out): grad_x = grad_out * d op(x) / dx.
struct UnaryBackwardFunctor {
  UnaryOp op;
  __device__ __forceinline__ float operator()(float x, float grad_out) const { return grad_out * unary_derivative(op, x); }
};

struct BinaryFunctor {
  BinaryOp op;
  __device__ __forceinline__ float operator()(float a, float b) const { return apply_binary_op(op, a, b); }
};

struct AffineFunctor {
  float scale;
  float shift;
  __device__ __forceinline__ float operator()(float x) const { return __fadd_rn(__fmul_rn(x, scale), shift); }
};

template <class T, int Inputs>
struct ElementPointers {
  const T* in[Inputs];
  T* out;
};

template <int Inputs, class Fn>
__device__ __forceinline__ float invoke(const Fn& fn, const float (&values)[Inputs]) {
  if constexpr (Inputs == 1) {
    return fn(values[0]);
  } else {
    return fn(values[0], values[1]);
  }
}

template <class T, int N>
struct alignas(16) Vector {
  T value[N];
};

// fn applied to each element of Inputs loaded vectors (widened to float, rounded back to T).
template <class T, int Inputs, int kPerVector, class Fn>
__device__ __forceinline__ Vector<T, kPerVector> apply_vector(Fn& fn, const Vector<T, kPerVector> (&loaded)[Inputs]) {
  Vector<T, kPerVector> result;
#pragma unroll
  for (int j = 0; j < kPerVector; ++j) {
    float values[Inputs];
#pragma unroll
    for (int k = 0; k < Inputs; ++k) values[k] = to_float(loaded[k].value[j]);
    result.value[j] = from_float<T>(invoke<Inputs>(fn, values));
  }
  return result;
}

// All operands contiguous and 16-byte aligned: one 16-byte load per input and one store per vector;
// the last count % kPerVector elements are done one by one.
template <class T, int Inputs, class Fn>
__global__ void elementwise_contiguous_kernel(Fn fn, ElementPointers<T, Inputs> pointers, int64_t count) {
  constexpr int kPerVector = 16 / sizeof(T);
  using V = Vector<T, kPerVector>;
  const int64_t vectors = count / kPerVector;
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  for (int64_t v = start; v < vectors; v += step) {
    V loaded[Inputs];
#pragma unroll
    for (int k = 0; k < Inputs; ++k) loaded[k] = reinterpret_cast<const V*>(pointers.in[k])[v];
    reinterpret_cast<V*>(pointers.out)[v] = apply_vector<T, Inputs>(fn, loaded);
  }
  for (int64_t i = vectors * kPerVector + start; i < count; i += step) {
    float values[Inputs];
#pragma unroll
    for (int k = 0; k < Inputs; ++k) values[k] = to_float(pointers.in[k][i]);
    pointers.out[i] = from_float<T>(invoke<Inputs>(fn, values));
  }
}

// Any views: offsets through the indexer (operand Inputs is the output).
template <class T, int Inputs, class Fn>
__global__ void elementwise_strided_kernel(Fn fn, ElementPointers<T, Inputs> pointers,
                                           StridedIndexer<Inputs + 1> indexer, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[Inputs + 1];
    indexer.offsets(i, offsets);
    float values[Inputs];
#pragma unroll
    for (int k = 0; k < Inputs; ++k) values[k] = to_float(pointers.in[k][offsets[k]]);
    pointers.out[offsets[Inputs]] = from_float<T>(invoke<Inputs>(fn, values));
  }
}

// Views whose innermost dim is contiguous in every operand (a bias row broadcast over tokens, a
// slice of the last dim): 16-byte vectors addressed by an indexer in vector units.
template <class T, int Inputs, class Fn>
__global__ void elementwise_vector_strided_kernel(Fn fn, ElementPointers<T, Inputs> pointers,
                                                  StridedIndexer<Inputs + 1> indexer, int64_t vectors) {
  constexpr int kPerVector = 16 / sizeof(T);
  using V = Vector<T, kPerVector>;
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < vectors; v += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[Inputs + 1];
    indexer.offsets(v, offsets);
    V loaded[Inputs];
#pragma unroll
    for (int k = 0; k < Inputs; ++k) loaded[k] = reinterpret_cast<const V*>(pointers.in[k])[offsets[k]];
    reinterpret_cast<V*>(pointers.out)[offsets[Inputs]] = apply_vector<T, Inputs>(fn, loaded);
  }
}

template <int Inputs, class Fn>
void launch_elementwise(std::string_view op, const Fn& fn, const std::array<const Tensor*, Inputs>& inputs,
                        const Tensor& out) {
  const int64_t count = out.numel();
  if (count == 0) return;
  const cudaStream_t stream = prepare(out);
  dispatch_cuda_floating(out.dtype(), op, [&]<class T>() {
    ElementPointers<T, Inputs> pointers;
    bool vectorizable = out.is_contiguous() && aligned16(out.raw_data());
    for (int k = 0; k < Inputs; ++k) {
      pointers.in[k] = inputs[k]->template data<T>();
      vectorizable = vectorizable && inputs[k]->is_contiguous() && aligned16(inputs[k]->raw_data());
    }
    pointers.out = out.data<T>();
    if (vectorizable) {
      constexpr int kPerVector = 16 / sizeof(T);
      const int64_t work = std::max<int64_t>(count / kPerVector, 1);
      elementwise_contiguous_kernel<T, Inputs, Fn><<<grid_for(work, kThreads), kThreads, 0, stream>>>(fn, pointers,
                                                                                                       count);
    } else {
      std::array<absl::Span<const int64_t>, Inputs + 1> strides;
      for (int k = 0; k < Inputs; ++k) strides[k] = absl::MakeConstSpan(inputs[k]->strides());
      strides[Inputs] = absl::MakeConstSpan(out.strides());
      const auto indexer = make_strided_indexer<Inputs + 1>(out.shape(), strides, op);
      constexpr int kPerVector = 16 / sizeof(T);
      bool aligned = aligned16(out.raw_data());
      for (int k = 0; k < Inputs; ++k) aligned = aligned && aligned16(inputs[k]->raw_data());
      StridedIndexer<Inputs + 1> vectors;
      if (aligned && vectorize_indexer<Inputs + 1>(indexer, kPerVector, vectors)) {
        const int64_t vector_count = count / kPerVector;
        elementwise_vector_strided_kernel<T, Inputs, Fn><<<grid_for(vector_count, kThreads), kThreads, 0, stream>>>(
            fn, pointers, vectors, vector_count);
        WEFT_CUDA_CHECK_LAUNCH();
        return;
      }
      elementwise_strided_kernel<T, Inputs, Fn><<<grid_for(count, kThreads), kThreads, 0, stream>>>(fn, pointers,
                                                                                                     indexer, count);
    }
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace
}  // namespace cuda

// ============================================================================================
// CudaBackend entry points
// ============================================================================================

namespace cuda {
namespace {

// Backend::rescale_unless_expected: every thread reads the seed first and returns when it is the
// expected value, so the usual call writes nothing and costs one launch of a small grid.
template <class T>
__global__ void rescale_unless_expected_kernel(T* data, int64_t count, const float* seed, float expected) {
  const float value = *seed;
  if (value == expected) return;
  const float factor = __fdiv_rn(value, expected);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = from_float<T>(__fmul_rn(to_float(data[i]), factor));
  }
}

}  // namespace
}  // namespace cuda

void CudaBackend::rescale_unless_expected(const Tensor& data, const Tensor& seed, double expected) {
  WEFT_CHECK(data.is_contiguous() && seed.numel() == 1 && seed.device() == data.device(),
             "rescale_unless_expected: data ", data.describe(), " must be contiguous and seed ", seed.describe(),
             " one element on its device");
  if (seed.dtype() != kFloat32) {  // not a CUDA statistics dtype: the host read of the default
    Backend::rescale_unless_expected(data, seed, expected);
    return;
  }
  const int64_t count = data.numel();
  if (count == 0) return;
  const cudaStream_t stream = cuda::prepare(data);
  const unsigned int grid = static_cast<unsigned int>(std::min<int64_t>(
      cuda::grid_for(count, cuda::kThreads), static_cast<int64_t>(cuda::multiprocessor_count(data.device().index)) * 4));
  cuda::dispatch_cuda_floating(data.dtype(), "rescale_unless_expected", [&]<class T>() {
    cuda::rescale_unless_expected_kernel<T><<<grid, cuda::kThreads, 0, stream>>>(
        data.data<T>(), count, seed.data<float>(), static_cast<float>(expected));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::fill(const Tensor& out, double value) {
  if (out.numel() == 0) return;
  const cudaStream_t stream = cuda::prepare(out);
  const uint64_t bits = cuda::stored_bits(out.dtype(), value);
  switch (out.element_size()) {
    case 2: cuda::fill_words<uint16_t>(out, bits, stream); return;
    case 4: cuda::fill_words<uint32_t>(out, bits, stream); return;
    case 8: cuda::fill_words<uint64_t>(out, bits, stream); return;
    default: WEFT_FAIL("fill: unsupported element size ", out.element_size());
  }
}

void CudaBackend::copy(const Tensor& source, const Tensor& out) {
  if (out.numel() == 0) return;
  const Device from = source.device(), to = out.device();
  if (from.is_cuda() && to.is_cuda()) {
    if (from == to) {
      cuda::copy_on_device(source, out);
    } else {
      cuda::copy_device_to_device(source, out);
    }
  } else if (to.is_cuda()) {
    cuda::copy_host_to_device(source, out);
  } else if (from.is_cuda()) {
    cuda::copy_device_to_host(source, out);
  } else {
    cpu_backend().copy(source, out);
  }
}

void CudaBackend::fill_random(const Tensor& out, RandomDistribution distribution, uint64_t seed, uint64_t offset,
                              double a, double b) {
  const int64_t count = out.numel();
  if (count == 0) return;
  const cudaStream_t stream = cuda::prepare(out);
  cuda::dispatch_cuda_random(out.dtype(), "fill_random", [&]<class T>() {
    const bool normal = distribution == RandomDistribution::kNormal;
    const T below_high = normal ? T{} : cuda::largest_below<T>(b);
    cuda::random_kernel<T><<<cuda::grid_for(count, cuda::kThreads), cuda::kThreads, 0, stream>>>(
        out.data<T>(), count, seed, offset, a, b, normal, below_high);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  cuda::launch_elementwise<1>("unary", cuda::UnaryFunctor{op}, {&x}, out);
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, const Tensor& grad_x) {
  cuda::launch_elementwise<2>("unary_backward", cuda::UnaryBackwardFunctor{op}, {&x, &grad_out}, grad_x);
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  cuda::launch_elementwise<2>("binary", cuda::BinaryFunctor{op}, {&a, &b}, out);
}

void CudaBackend::affine(const Tensor& x, double scale, double shift, const Tensor& out) {
  cuda::launch_elementwise<1>("affine",
                              cuda::AffineFunctor{static_cast<float>(scale), static_cast<float>(shift)}, {&x}, out);
}

}  // namespace weft
