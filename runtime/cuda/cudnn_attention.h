// Causal scaled-dot-product attention through cuDNN 9's backend (graph) API, and the switch that
// chooses between it and weft's own flash-attention kernels (flash_attention.cuh).
//
// CudaBackend::attention / attention_backward (attention.cu) try cuDNN first for bf16 / f16 with a
// head dim that is a multiple of 8 up to 256 when weft was built with cuDNN (WEFT_HAVE_CUDNN) and the
// implementation is not "flash"; grouped-query attention (k, v with KV < H heads) goes to cuDNN as it
// is. On any failure to build a graph, find an engine or finalize a plan they fall back to the
// flash kernels, and the first failure's reason is written once to stderr. f32 always runs flash.
//
// The graphs are the ones cudnn-frontend's composite sdpa / sdpa_backward nodes lower to (matmul,
// pointwise, reduction and reshape operations, causal mask from gen-index + compare + select);
// plans are built once per (device, B, H, KV, T, D, dtype, strides of the tensors) and kept for the process (the scale is a
// by-value scalar of the variant pack, so one plan serves every scale). The forward's "stats"
// output is max + log(sum(exp(s - max))) of the scaled masked scores in natural log: exactly
// weft's lse contract (runtime/backend.h).
//
// This header needs no cuDNN headers; in a build without cuDNN every entry point reports
// "unavailable" and the flash kernels run.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/tensor.h"

namespace weft::cuda {

enum class AttentionImpl {
  kAuto,   // cuDNN where it can run the call, else flash (the default)
  kFlash,  // always weft's flash kernels
  kCudnn,  // cuDNN where it can run the call (same as auto; falls back to flash, logging why)
};

// The implementation in use: WEFT_ATTENTION=flash|cudnn|auto read once from the environment at the
// first call (unset or anything else: auto), unless set_attention_impl overrode it.
AttentionImpl attention_impl();
void set_attention_impl(AttentionImpl impl);
const char* attention_impl_name(AttentionImpl impl);

// Whether weft was built with cuDNN (the runtime library may still fail to load or to find engines).
bool cudnn_attention_built();

// Run the cuDNN forward / backward for the (already checked) contract of runtime/backend.h with
// bf16 / f16 views (q, out, grad_out, grad_q [B, H, T, D]; k, v, grad_k, grad_v [B, KV, T, D]; unit
// stride in D, 16-byte aligned rows; read and written in place), D a multiple of 8 up to 256, on the
// current stream. Return false
// without touching the outputs when cuDNN cannot run the call (not built, unsupported dtype or head
// dim, no engine, ...); the reason is then in cudnn_attention_last_error() and was logged once.
// Errors while executing a finalized plan throw weft::Error.
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                             const Tensor& lse);
bool cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                              const Tensor& grad_k, const Tensor& grad_v);

// Deterministic kernels (runtime/determinism.h). cuDNN's default backward adds each kv block's
// share of dQ to an f32 accumulator with atomics, in whatever order the blocks finish, so its bits
// vary from run to run (1 to 3 runs in 4 differed at GPT-2's shape on an H100 with cuDNN 9.19:
// CudnnAttention.DeterministicBackwardGivesTheSameBitsEveryRun), and so do a GPU training
// run's gradients. With deterministic_kernels() on, the backward graph writes dQ without the
// accumulator, which makes the engines sum the shares in a fixed order (cudnn-frontend's
// deterministic sdpa_backward on Hopper), and configs whose engine carries cuDNN's NONDETERMINISTIC
// numerical note are skipped; plans are kept per setting. Where cuDNN cannot run a call this way it
// declines (the reason noted) and the flash kernels run, which then sum dQ in a fixed order too.

// What cuDNN said of the engine that ran this thread's most recent cuDNN attention call.
struct CudnnEngineChoice {
  int64_t engine = -1;             // cuDNN's global engine index (-1: unknown or no call yet)
  bool nondeterministic = false;   // it carries the NONDETERMINISTIC numerical note
  std::string chosen;              // which heuristics config, "config 1 of 3, mode A"
};
CudnnEngineChoice cudnn_attention_last_engine();

// The reason of the most recent fallback ("" when none happened yet).
std::string cudnn_attention_last_error();

// The linked cuDNN library's version (cudnnGetVersion, e.g. 91300), 0 without cuDNN.
int cudnn_version();

}  // namespace weft::cuda
