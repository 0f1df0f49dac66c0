// CUDA causal attention: CudaBackend::attention and attention_backward.
//
// bf16 / f16 run cuDNN's fused attention (cudnn_attention.h: head dims that are multiples of 8 up to
// 256, whatever the linked cuDNN accepts when it builds the graph) when weft was built with cuDNN and
// WEFT_ATTENTION is not "flash", else (and whenever cuDNN cannot run the call) the tensor-core
// flash-attention kernels of flash_attention.cuh, which take any head dim 1..256: a head dim that
// is not one of their tile widths (flash::kFlashWidths) goes in zero-padded to the next width. f32
// (any head dim 1..256) runs the simple kernels there (no tensor cores, the reference path of the
// tests). Grouped-query attention everywhere: k, v (and dk, dv) have KV heads, query head h reads
// kv head h / (H / KV), and nothing expands k or v to H heads. None writes the T x T scores to
// device memory. cuDNN reads and writes strided views (the heads of one [B, T, (H + 2 KV) D]
// projection, an output in [B, T, H, D] order) in place; the flash and f32 kernels address
// contiguous tensors, so views (and padded head dims) go to them through contiguous copies.
// Scratch (the backward's delta = rowsum(dO * O) and the f32 dQ accumulator, or cuDNN's workspace)
// comes from weft's allocator on the current stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string_view>

#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cudnn_attention.h"
#include "runtime/cuda/flash_attention.cuh"
#include "runtime/cuda/stream.h"
#include "runtime/determinism.h"

namespace weft {
namespace {

namespace flash = cuda::flash;

struct AttentionShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, seq = 0, head_dim = 0;
  int64_t bh() const { return batch * heads; }
  int group() const { return static_cast<int>(heads / kv_heads); }  // query heads per kv head
};

bool aligned16(const Tensor& tensor) { return reinterpret_cast<uintptr_t>(tensor.raw_data()) % 16 == 0; }

// Checks the contract of runtime/backend.h for one call; returns the shape. `like_q` are [B, H, T,
// D] (out, grad_out, grad_q), `like_k` are [B, KV, T, D] (grad_k, grad_v).
AttentionShape check_attention(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v,
                               std::initializer_list<const Tensor*> like_q, std::initializer_list<const Tensor*> like_k,
                               const Tensor& lse) {
  WEFT_CHECK(q.dim() == 4 && k.dim() == 4, op, ": q and k must be [B, H, T, D] and [B, KV, T, D], got ",
             q.describe(), ", ", k.describe());
  const AttentionShape shape{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3)};
  const auto unit_row_stride = [](const Tensor& tensor) { return tensor.size(3) <= 1 || tensor.stride(3) == 1; };
  const auto like = [&](const Tensor& tensor, int64_t heads) {
    return tensor.dim() == 4 && tensor.size(0) == shape.batch && tensor.size(1) == heads &&
           tensor.size(2) == shape.seq && tensor.size(3) == shape.head_dim && tensor.dtype() == q.dtype() &&
           tensor.device() == q.device() && unit_row_stride(tensor);
  };
  WEFT_CHECK(like(q, shape.heads) && like(k, shape.kv_heads) && like(v, shape.kv_heads) && shape.kv_heads >= 1 &&
                 shape.heads % shape.kv_heads == 0,
             op, ": expected q [B, H, T, D] and k, v [B, KV, T, D] with KV dividing H, one dtype and device and unit ",
             "stride in D; got ", q.describe(), ", ", k.describe(), ", ", v.describe());
  for (const Tensor* tensor : like_q) {
    WEFT_CHECK(like(*tensor, shape.heads), op, ": expected a tensor like q ", q.describe(),
               " with unit stride in D, got ", tensor->describe());
  }
  for (const Tensor* tensor : like_k) {
    WEFT_CHECK(like(*tensor, shape.kv_heads), op, ": expected a tensor like k ", k.describe(),
               " with unit stride in D, got ", tensor->describe());
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
               " is not supported for f32 on CUDA (at most ", flash::kSimpleMaxDim,
               "); use fewer, wider heads (model.heads) or run on the CPU");
  } else if (q.dtype() == kBFloat16 || q.dtype() == kFloat16) {
    WEFT_CHECK(shape.head_dim <= flash::kFlashMaxDim, op, ": head dim ", shape.head_dim, " is not supported for ",
               dtype_name(q.dtype()), " on CUDA (at most ", flash::kFlashMaxDim,
               "); use more heads (model.heads) so that model.dim / model.heads <= ", flash::kFlashMaxDim);
  } else {
    WEFT_FAIL(op, ": dtype ", dtype_name(q.dtype()), " is not supported on CUDA (expected f32, bf16 or f16)");
  }
  return shape;
}

// An input for the kernels: contiguous [B, heads, T, width]; `tensor` itself when it already is,
// else a copy whose columns past D are zero (a padded head dim changes no dot product).
Tensor kernel_input(Backend& backend, const Tensor& tensor, int64_t width) {
  if (width == tensor.size(3)) return tensor.contiguous();
  Tensor padded = Tensor::empty({tensor.size(0), tensor.size(1), tensor.size(2), width}, tensor.dtype(),
                                tensor.device());
  backend.fill(padded, 0.0);
  backend.copy(tensor, padded.narrow(3, 0, tensor.size(3)));
  return padded;
}

// An output for the kernels, which write contiguous [B, heads, T, width] tensors: `target` itself
// when it is contiguous and width is its head dim, else a buffer whose first D columns finish()
// copies into target.
class KernelOutput {
 public:
  KernelOutput(const Tensor& target, int64_t width)
      : target_(target),
        buffer_(target.is_contiguous() && width == target.size(3)
                    ? target
                    : Tensor::empty({target.size(0), target.size(1), target.size(2), width}, target.dtype(),
                                    target.device())) {}
  const Tensor& tensor() const { return buffer_; }
  void finish(Backend& backend) const {
    if (buffer_.raw_data() != target_.raw_data() || buffer_.size(3) != target_.size(3)) {
      backend.copy(buffer_.narrow(3, 0, target_.size(3)), target_);
    }
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

// Calls run.operator()<T, W>() for q's 16-bit dtype and the tile width W (a flash::kFlashWidths entry).
template <class Run>
void dispatch_flash(DType dtype, int width, const Run& run) {
  const auto for_type = [&]<class T>() {
    switch (width) {
      case 32: return run.template operator()<T, 32>();
      case 64: return run.template operator()<T, 64>();
      case 96: return run.template operator()<T, 96>();
      case 128: return run.template operator()<T, 128>();
      case 192: return run.template operator()<T, 192>();
      case 256: return run.template operator()<T, 256>();
      default: WEFT_FAIL("attention: no flash kernel for tile width ", width);
    }
  };
  if (dtype == kBFloat16) {
    for_type.template operator()<__nv_bfloat16>();
  } else {
    for_type.template operator()<__half>();
  }
}

}  // namespace

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                            const Tensor& lse) {
  const AttentionShape shape = check_attention("attention", q, k, v, {&out}, {}, lse);
  if (shape.bh() == 0 || shape.seq == 0) return;
  const int device = q.device().index;
  cuda::set_device(device);
  const cudaStream_t stream = cuda::current_stream(device);
  const int seq = static_cast<int>(shape.seq);
  if (q.dtype() != kFloat32 && cuda::attention_impl() != cuda::AttentionImpl::kFlash &&
      cuda::cudnn_attention_forward(q, k, v, scale, out, lse)) {
    return;
  }
  // The simple f32 kernels take the head dim as it is; the tensor-core ones one of their widths.
  const int width = q.dtype() == kFloat32 ? static_cast<int>(shape.head_dim)
                                          : flash::flash_width_for(static_cast<int>(shape.head_dim));
  const Tensor qc = kernel_input(*this, q, width), kc = kernel_input(*this, k, width),
               vc = kernel_input(*this, v, width);
  const KernelOutput oc(out, width);
  const Tensor& o = oc.tensor();
  if (q.dtype() == kFloat32) {
    flash::launch_simple_forward(ptr<float>(qc), ptr<float>(kc), ptr<float>(vc), mutable_ptr<float>(o),
                                 mutable_ptr<float>(lse), shape.bh(), shape.group(), seq, width,
                                 static_cast<float>(scale), stream);
  } else {
    for (const Tensor* tensor : {&qc, &kc, &vc, &o}) {
      WEFT_CHECK(aligned16(*tensor), "attention: ", tensor->describe(), " must be 16-byte aligned on CUDA");
    }
    dispatch_flash(q.dtype(), width, [&]<class T, int D>() {
      flash::launch_forward<T, D>(ptr<T>(qc), ptr<T>(kc), ptr<T>(vc), mutable_ptr<T>(o), mutable_ptr<float>(lse),
                                  shape.bh(), shape.group(), seq, static_cast<float>(scale), stream, device);
    });
  }
  oc.finish(*this);
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                                     const Tensor& grad_k, const Tensor& grad_v) {
  const AttentionShape shape =
      check_attention("attention_backward", q, k, v, {&out, &grad_out, &grad_q}, {&grad_k, &grad_v}, lse);
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
  const int width = q.dtype() == kFloat32 ? static_cast<int>(shape.head_dim)
                                          : flash::flash_width_for(static_cast<int>(shape.head_dim));
  const Tensor qc = kernel_input(*this, q, width), kc = kernel_input(*this, k, width),
               vc = kernel_input(*this, v, width), oc = kernel_input(*this, out, width),
               goc = kernel_input(*this, grad_out, width);
  const KernelOutput gq(grad_q, width), gk(grad_k, width), gv(grad_v, width);
  Tensor delta = Tensor::empty({shape.bh() * shape.seq}, kFloat32, where);
  if (q.dtype() == kFloat32) {
    flash::launch_simple_backward(ptr<float>(qc), ptr<float>(kc), ptr<float>(vc), ptr<float>(oc), ptr<float>(goc),
                                  ptr<float>(lse), mutable_ptr<float>(delta), mutable_ptr<float>(gq.tensor()),
                                  mutable_ptr<float>(gk.tensor()), mutable_ptr<float>(gv.tensor()), shape.bh(),
                                  shape.group(), seq, width, static_cast<float>(scale), stream);
  } else {
    for (const Tensor* tensor : {&qc, &kc, &vc, &oc, &goc, &gq.tensor(), &gk.tensor(), &gv.tensor()}) {
      WEFT_CHECK(aligned16(*tensor), "attention_backward: ", tensor->describe(), " must be 16-byte aligned on CUDA");
    }
    // Under deterministic kernels dQ is summed in a fixed order, at the cost of T / 64 copies of it.
    const bool ordered = deterministic_kernels();
    Tensor dq_accum =
        Tensor::empty({flash::dq_scratch_elements(shape.bh(), seq, width, ordered)}, kFloat32, where);
    dispatch_flash(q.dtype(), width, [&]<class T, int D>() {
      flash::launch_backward<T, D>(ptr<T>(qc), ptr<T>(kc), ptr<T>(vc), ptr<T>(oc), ptr<T>(goc), ptr<float>(lse),
                                   mutable_ptr<float>(delta), mutable_ptr<float>(dq_accum), mutable_ptr<T>(gq.tensor()),
                                   mutable_ptr<T>(gk.tensor()), mutable_ptr<T>(gv.tensor()), shape.bh(),
                                   shape.group(), seq, static_cast<float>(scale), ordered, stream, device);
    });
  }
  for (const KernelOutput* output : {&gq, &gk, &gv}) output->finish(*this);
}

}  // namespace weft
