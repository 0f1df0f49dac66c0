// CUDA causal attention: CudaBackend::attention and attention_backward.
//
// bf16 / f16 with head dim 64 or 128 run cuDNN's fused attention (cudnn_attention.h) when weft was
// built with cuDNN and WEFT_ATTENTION is not "flash", else (and whenever cuDNN cannot run the call)
// the tensor-core flash-attention kernels of flash_attention.cuh; f32 (any head dim <= 128) runs the
// simple kernels there (no tensor cores, the reference path of the tests). None writes the T x T
// scores to device memory. Scratch (the backward's delta = rowsum(dO * O) and the f32 dQ
// accumulator, or cuDNN's workspace) comes from weft's allocator on the current stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string_view>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cudnn_attention.h"
#include "runtime/cuda/flash_attention.cuh"
#include "runtime/cuda/stream.h"

namespace weft {
namespace {

namespace flash = cuda::flash;

struct AttentionShape {
  int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  int64_t bh() const { return batch * heads; }
};

bool aligned16(const Tensor& tensor) { return reinterpret_cast<uintptr_t>(tensor.raw_data()) % 16 == 0; }

// Checks the contract of runtime/backend.h for one call; returns the shape.
AttentionShape check_attention(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v,
                               std::initializer_list<const Tensor*> same_as_q, const Tensor& lse) {
  WEFT_CHECK(q.dim() == 4, op, ": q must be [B, H, T, D], got ", q.describe());
  const AttentionShape shape{q.size(0), q.size(1), q.size(2), q.size(3)};
  for (const Tensor* tensor : {&q, &k, &v}) {
    WEFT_CHECK(tensor->shape() == q.shape() && tensor->dtype() == q.dtype() && tensor->device() == q.device() &&
                   tensor->is_contiguous(),
               op, ": q, k, v must be contiguous with one shape, dtype and device; got ", q.describe(), ", ",
               k.describe(), ", ", v.describe());
  }
  for (const Tensor* tensor : same_as_q) {
    WEFT_CHECK(tensor->shape() == q.shape() && tensor->dtype() == q.dtype() && tensor->device() == q.device() &&
                   tensor->is_contiguous(),
               op, ": expected a contiguous tensor like q ", q.describe(), ", got ", tensor->describe());
  }
  WEFT_CHECK(q.device().is_cuda(), op, ": tensors must be on a CUDA device, got ", q.describe());
  WEFT_CHECK(lse.dim() == 3 && lse.size(0) == shape.batch && lse.size(1) == shape.heads && lse.size(2) == shape.seq &&
                 lse.dtype() == kFloat32 && lse.device() == q.device() && lse.is_contiguous(),
             op, ": lse must be [", shape.batch, ", ", shape.heads, ", ", shape.seq, "] f32 contiguous on ",
             q.device().to_string(), ", got ", lse.describe());
  WEFT_CHECK(shape.seq <= INT32_MAX && shape.bh() <= 65535, op, ": B * H (", shape.bh(), ") must be <= 65535 and T (",
             shape.seq, ") < 2^31 on CUDA");
  WEFT_CHECK(shape.head_dim > 0, op, ": head dim 0 is not supported on CUDA");
  if (q.dtype() == kFloat32) {
    WEFT_CHECK(shape.head_dim <= flash::kSimpleMaxDim, op, ": head dim ", shape.head_dim,
               " is not supported for f32 on CUDA (at most ", flash::kSimpleMaxDim, ")");
  } else if (q.dtype() == kBFloat16 || q.dtype() == kFloat16) {
    WEFT_CHECK(shape.head_dim == 64 || shape.head_dim == 128, op, ": head dim ", shape.head_dim, " is not supported for ",
               dtype_name(q.dtype()), " on CUDA (supported head dims: 64, 128)");
  } else {
    WEFT_FAIL(op, ": dtype ", dtype_name(q.dtype()), " is not supported on CUDA (expected f32, bf16 or f16)");
  }
  return shape;
}

template <class T>
const T* ptr(const Tensor& tensor) {
  return static_cast<const T*>(tensor.raw_data());
}
template <class T>
T* mutable_ptr(const Tensor& tensor) {
  return static_cast<T*>(tensor.raw_data());
}

}  // namespace

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                            const Tensor& lse) {
  const AttentionShape shape = check_attention("attention", q, k, v, {&out}, lse);
  if (shape.bh() == 0 || shape.seq == 0) return;
  const int device = q.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  const int seq = static_cast<int>(shape.seq);
  if (q.dtype() == kFloat32) {
    flash::launch_simple_forward(ptr<float>(q), ptr<float>(k), ptr<float>(v), mutable_ptr<float>(out),
                                 mutable_ptr<float>(lse), shape.bh(), seq, static_cast<int>(shape.head_dim),
                                 static_cast<float>(scale), stream);
    return;
  }
  for (const Tensor* tensor : {&q, &k, &v, &out}) {
    WEFT_CHECK(aligned16(*tensor), "attention: ", tensor->describe(), " must be 16-byte aligned on CUDA");
  }
  if (cuda::attention_impl() != cuda::AttentionImpl::kFlash &&
      cuda::cudnn_attention_forward(q, k, v, scale, out, lse)) {
    return;
  }
  auto run = [&]<class T, int D>() {
    flash::launch_forward<T, D>(ptr<T>(q), ptr<T>(k), ptr<T>(v), mutable_ptr<T>(out), mutable_ptr<float>(lse),
                                shape.bh(), seq, static_cast<float>(scale), stream, device);
  };
  if (q.dtype() == kBFloat16) {
    shape.head_dim == 64 ? run.operator()<__nv_bfloat16, 64>() : run.operator()<__nv_bfloat16, 128>();
  } else {
    shape.head_dim == 64 ? run.operator()<__half, 64>() : run.operator()<__half, 128>();
  }
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                                     const Tensor& grad_k, const Tensor& grad_v) {
  const AttentionShape shape =
      check_attention("attention_backward", q, k, v, {&out, &grad_out, &grad_q, &grad_k, &grad_v}, lse);
  if (shape.bh() == 0 || shape.seq == 0) return;
  const int device = q.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  const int seq = static_cast<int>(shape.seq);
  const Device where = q.device();
  if (q.dtype() == kFloat32) {
    Tensor delta = Tensor::empty({shape.bh() * shape.seq}, kFloat32, where);
    flash::launch_simple_backward(ptr<float>(q), ptr<float>(k), ptr<float>(v), ptr<float>(out), ptr<float>(grad_out),
                                  ptr<float>(lse), mutable_ptr<float>(delta), mutable_ptr<float>(grad_q),
                                  mutable_ptr<float>(grad_k), mutable_ptr<float>(grad_v), shape.bh(), seq,
                                  static_cast<int>(shape.head_dim), static_cast<float>(scale), stream);
    return;
  }
  for (const Tensor* tensor : {&q, &k, &v, &out, &grad_out, &grad_q, &grad_k, &grad_v}) {
    WEFT_CHECK(aligned16(*tensor), "attention_backward: ", tensor->describe(), " must be 16-byte aligned on CUDA");
  }
  if (cuda::attention_impl() != cuda::AttentionImpl::kFlash &&
      cuda::cudnn_attention_backward(q, k, v, out, lse, grad_out, scale, grad_q, grad_k, grad_v)) {
    return;
  }
  Tensor delta = Tensor::empty({shape.bh() * shape.seq}, kFloat32, where);
  Tensor dq_accum = Tensor::empty({shape.bh() * shape.seq * shape.head_dim}, kFloat32, where);
  auto run = [&]<class T, int D>() {
    flash::launch_backward<T, D>(ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(out), ptr<T>(grad_out), ptr<float>(lse),
                                 mutable_ptr<float>(delta), mutable_ptr<float>(dq_accum), mutable_ptr<T>(grad_q),
                                 mutable_ptr<T>(grad_k), mutable_ptr<T>(grad_v), shape.bh(), seq,
                                 static_cast<float>(scale), stream, device);
  };
  if (q.dtype() == kBFloat16) {
    shape.head_dim == 64 ? run.operator()<__nv_bfloat16, 64>() : run.operator()<__nv_bfloat16, 128>();
  } else {
    shape.head_dim == 64 ? run.operator()<__half, 64>() : run.operator()<__half, 128>();
  }
}

}  // namespace weft
