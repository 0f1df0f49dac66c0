// Matrix products on CUDA through cuBLASLt, beyond the Backend interface: fused bias and GELU
// epilogues for linear layers, and a residual read as the C matrix (CudaBackend::matmul in matmul.cu
// is the plain product).
//
// Shapes as for Backend::matmul: a [B, M, K], bm [B, K, N], out [B, M, N] contiguous, a and bm
// row-major or transposed views; for these calls the batch must fold into rows (B == 1, or bm shared
// with batch stride 0 and a's batches packed), which is the linear-layer case. bias [N] contiguous,
// of out's dtype (f32, bf16 or f16). GELU is the tanh form (UnaryOp::kGelu), as cuBLASLt computes it.
#pragma once

#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace weft::cuda {

// out = a @ bm + bias.
void matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out);

// out = a @ bm + bias + addend (bias undefined: none); addend [B, M, N] contiguous, out's dtype, read as
// cuBLASLt's C with beta 1 (C is not D: out is written, addend only read).
void matmul_bias_add(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& addend, const Tensor& out);

// out = gelu(a @ bm + bias). pre_gelu, when defined ([B, M, N] contiguous, out's dtype, N a multiple
// of 8), receives a @ bm + bias for the backward pass.
void matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                      const Tensor& pre_gelu = Tensor());

// out = gelu'(pre_gelu) * (a @ bm): the backward of a GELU linear through the product after it
// (pre_gelu [B, M, N] contiguous, out's dtype, N a multiple of 8, as matmul_bias_gelu wrote it).
void matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_gelu, const Tensor& out);

// What autotuning (WEFT_MATMUL_AUTOTUNE, matmul.cu) found for one problem key: each candidate timed,
// in the heuristic's order (index 0 is its first choice, the reference), its time per product and
// whether it wrote exactly the reference's bits; `chosen` is the index kept (only a candidate with
// the same bits may be). For WEFT_MATMUL_AUTOTUNE_VERBOSE=1's lines and for tests.
struct MatmulAutotuneRecord {
  struct Candidate {
    int index = 0;
    float microseconds = 0.f;
    bool same_bits = false;
    bool cut_short = false;  // its first run was too slow to win: not run again nor fingerprinted
    // Its timed runs wrote the bits its warm-up did (checked under WEFT_MATMUL_AUTOTUNE=fastest only;
    // the heuristic's first always: repeats == same_bits there).
    bool repeats = true;
  };
  int64_t batch = 0, m = 0, n = 0, k = 0;  // the product as cuBLASLt runs it (a batch folded into m)
  int epilogue = 0;                       // cublasLtEpilogue_t
  std::vector<Candidate> candidates;
  int chosen = 0;
  // The product changed nothing in its output (an operand was zero): nothing timed, the tuning put
  // off to the key's next product (candidates empty, chosen 0).
  bool inconclusive = false;
};

// Every key autotuned so far in this process, in the order they were tuned (a key whose tuning was
// put off appears once for each product that put it off, then once more when tuned).
std::vector<MatmulAutotuneRecord> matmul_autotune_records();

// Tests only: the autotuning setting (0 off, 1 every product, 2 products with an epilogue, 3 every
// product with any repeatable bits: WEFT_MATMUL_AUTOTUNE=fastest), and
// forgetting every algorithm chosen so far (and every tuning put off), so that the next product of
// each key chooses again.
// The setter returns the setting it replaced.
int set_matmul_autotune_for_testing(int setting);
void forget_matmul_algorithms_for_testing();
// Tests only: the tuning cache's file from now on (matmul_tuning_cache.h; empty: none), read anew.
void set_matmul_tuning_cache_for_testing(const std::string& path);

}  // namespace weft::cuda
