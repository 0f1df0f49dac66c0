// CUDA causal attention: CudaBackend::attention and attention_backward.
//
// bf16 / f16 with head dim 64 or 128 run cuDNN's fused attention (cudnn_attention.h) when weft was
// built with cuDNN and WEFT_ATTENTION is not "flash", else (and whenever cuDNN cannot run the call)
// the tensor-core flash-attention kernels of flash_attention.cuh; f32 (any head dim <= 128) runs the
// simple kernels there (no tensor cores, the reference path of the tests). None writes the T x T
// scores to device memory. cuDNN reads and writes strided views (the heads of one [B, T, 3, H, D]
// projection, an output in [B, T, H, D] order) in place; the flash and f32 kernels address
// contiguous tensors, so views go to them through contiguous copies. Scratch (the backward's
// delta = rowsum(dO * O) and the f32 dQ accumulator, or cuDNN's workspace) comes from weft's
// allocator on the current stream.
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
  const auto unit_row_stride = [](const Tensor& tensor) { return tensor.size(3) <= 1 || tensor.stride(3) == 1; };
  for (const Tensor* tensor : {&q, &k, &v}) {
    WEFT_CHECK(tensor->shape() == q.shape() && tensor->dtype() == q.dtype() && tensor->device() == q.device() &&
                   unit_row_stride(*tensor),
               op, ": q, k, v must have one shape, dtype and device and unit stride in D; got ", q.describe(), ", ",
               k.describe(), ", ", v.describe());
  }
  for (const Tensor* tensor : same_as_q) {
    WEFT_CHECK(tensor->shape() == q.shape() && tensor->dtype() == q.dtype() && tensor->device() == q.device() &&
                   unit_row_stride(*tensor),
               op, ": expected a tensor like q ", q.describe(), " with unit stride in D, got ", tensor->describe());
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

// An output for the kernels that address contiguous tensors: `target` itself when contiguous, else
// a contiguous buffer that finish() copies into target.
class ContiguousOutput {
 public:
  explicit ContiguousOutput(const Tensor& target)
      : target_(target),
        buffer_(target.is_contiguous() ? target : Tensor::empty(target.shape(), target.dtype(), target.device())) {}
  const Tensor& tensor() const { return buffer_; }
  void finish(Backend& backend) const {
    if (!target_.is_contiguous()) backend.copy(buffer_, target_);
  }

 private:
  const Tensor& target_;
  Tensor buffer_;
};

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
  if (q.dtype() != kFloat32 && cuda::attention_impl() != cuda::AttentionImpl::kFlash &&
      cuda::cudnn_attention_forward(q, k, v, scale, out, lse)) {
    return;
  }
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const ContiguousOutput oc(out);
  const Tensor& o = oc.tensor();
  if (q.dtype() == kFloat32) {
    flash::launch_simple_forward(ptr<float>(qc), ptr<float>(kc), ptr<float>(vc), mutable_ptr<float>(o),
                                 mutable_ptr<float>(lse), shape.bh(), seq, static_cast<int>(shape.head_dim),
                                 static_cast<float>(scale), stream);
  } else {
    for (const Tensor* tensor : {&qc, &kc, &vc, &o}) {
      WEFT_CHECK(aligned16(*tensor), "attention: ", tensor->describe(), " must be 16-byte aligned on CUDA");
    }
    auto run = [&]<class T, int D>() {
      flash::launch_forward<T, D>(ptr<T>(qc), ptr<T>(kc), ptr<T>(vc), mutable_ptr<T>(o), mutable_ptr<float>(lse),
                                  shape.bh(), seq, static_cast<float>(scale), stream, device);
    };
    if (q.dtype() == kBFloat16) {
      shape.head_dim == 64 ? run.operator()<__nv_bfloat16, 64>() : run.operator()<__nv_bfloat16, 128>();
    } else {
      shape.head_dim == 64 ? run.operator()<__half, 64>() : run.operator()<__half, 128>();
    }
  }
  oc.finish(*this);
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
  if (q.dtype() != kFloat32 && cuda::attention_impl() != cuda::AttentionImpl::kFlash &&
      cuda::cudnn_attention_backward(q, k, v, out, lse, grad_out, scale, grad_q, grad_k, grad_v)) {
    return;
  }
  const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous(), oc = out.contiguous(),
               goc = grad_out.contiguous();
  const ContiguousOutput gq(grad_q), gk(grad_k), gv(grad_v);
  Tensor delta = Tensor::empty({shape.bh() * shape.seq}, kFloat32, where);
  if (q.dtype() == kFloat32) {
    flash::launch_simple_backward(ptr<float>(qc), ptr<float>(kc), ptr<float>(vc), ptr<float>(oc), ptr<float>(goc),
                                  ptr<float>(lse), mutable_ptr<float>(delta), mutable_ptr<float>(gq.tensor()),
                                  mutable_ptr<float>(gk.tensor()), mutable_ptr<float>(gv.tensor()), shape.bh(), seq,
                                  static_cast<int>(shape.head_dim), static_cast<float>(scale), stream);
  } else {
    for (const Tensor* tensor : {&qc, &kc, &vc, &oc, &goc, &gq.tensor(), &gk.tensor(), &gv.tensor()}) {
      WEFT_CHECK(aligned16(*tensor), "attention_backward: ", tensor->describe(), " must be 16-byte aligned on CUDA");
    }
    Tensor dq_accum = Tensor::empty({shape.bh() * shape.seq * shape.head_dim}, kFloat32, where);
    auto run = [&]<class T, int D>() {
      flash::launch_backward<T, D>(ptr<T>(qc), ptr<T>(kc), ptr<T>(vc), ptr<T>(oc), ptr<T>(goc), ptr<float>(lse),
                                   mutable_ptr<float>(delta), mutable_ptr<float>(dq_accum), mutable_ptr<T>(gq.tensor()),
                                   mutable_ptr<T>(gk.tensor()), mutable_ptr<T>(gv.tensor()), shape.bh(), seq,
                                   static_cast<float>(scale), stream, device);
    };
    if (q.dtype() == kBFloat16) {
      shape.head_dim == 64 ? run.operator()<__nv_bfloat16, 64>() : run.operator()<__nv_bfloat16, 128>();
    } else {
      shape.head_dim == 64 ? run.operator()<__half, 64>() : run.operator()<__half, 128>();
    }
  }
  for (const ContiguousOutput* output : {&gq, &gk, &gv}) output->finish(*this);
}

}  // namespace weft
