// weft's own Hopper products (runtime/cuda/hopper_gemm.cuh) in the runtime: which ones the CUDA
// backend runs instead of cuBLASLt's, and their launchers.
// - hopper_bias_gelu: linear_gelu's forward, gelu(X · Wᵀ + b) with the pre-activation kept, in place
//   of cuBLASLt's GELU_AUX_BIAS epilogue (CudaBackend::matmul_bias_gelu). Measured 6-12% faster than
//   cuBLASLt's on the 1.3B shape's up-projection and 5-10% on GPT-2's (docs/performance.md,
//   2026-12-05, fifteenth session); since the twenty-fourth session (2026-12-06) GPT-2's takes 130
//   against cuBLASLt's 153 µs on an H100, 17 µs above a plain product of its shape.
// - hopper_gelu_backward: GELU's backward in the next linear's dX product, (dY · W) ⊙ gelu'(pre), with
//   W read N-major, in place of cuBLASLt's DGELU epilogue (CudaBackend::matmul_gelu_backward).
//   Written on 2026-12-05 (sixteenth session) without a GPU. The kernel was right on an H100 in
//   tools/cuda_hopper_gemm_benchmark, 7% faster than cuBLASLt's DGELU at the 1.3B shape and 4%
//   slower on GPT-2's; training steps with it matched the CPU (docs/performance.md).
// - hopper_input_gradient: a linear's dX product dY · W (W read N-major; with a pre-activation, times
//   gelu' as hopper_gelu_backward) with its bias gradient, the column sums of dY, taken while the
//   products run (CudaBackend::matmul_and_column_sums), in place of cuBLASLt's product and weft's
//   column-sum pass over dY. Written in the same session. The kernel was right on an H100 in the
//   benchmark, 10-12% faster than cuBLASLt's product and a separate pass on GPT-2's dX shapes (slower
//   at K = 8192); training steps with it matched the CPU.
// - hopper_swiglu: Llama's gate and up products and SwiGLU in one product, writing gate, up and
//   silu(gate) · up (CudaBackend::swiglu_products), in place of cuBLASLt's two products and weft's
//   SwiGLU pass, which read gate and up back. Written on 2026-12-06 (seventeenth session); on the
//   192-column tiling (eighteenth session) 18% faster than cuBLASLt's products and the pass at Llama
//   1B's shape on an H100 (1061 against 1292 µs; docs/performance.md).
// - hopper_swiglu_backward: SwiGLU's backward in the down-projection's dX product, writing the gate
//   and up gradients (CudaBackend::matmul_swiglu_backward), in place of cuBLASLt's product and the
//   SwiGLU backward pass, which reads the product back. Written in the same session; since the
//   eighteenth, 23% faster than cuBLASLt's product and the pass at Llama 1B's shape on an H100 (674
//   against 873 µs). With both, Llama 1B's training step is 2.0-2.2% faster.
//
// WEFT_HOPPER_GEMM picks them, read once: unset: kDefaultHopperProducts; "" or "0": none; "1" or
// "all": every one; or a comma-separated list of the names bias_gelu, gelu_backward, input_gradient,
// swiglu and swiglu_backward. Any other value is reported on stderr and runs none (cuBLASLt's
// products, which lose nothing). Tests set them directly.
// The default is every product: the SwiGLU pair (Llama 1B +2.0-2.2%), and bias_gelu with
// input_gradient (GPT-2 124M +1.2-2.0%, the 1.3B shape level; docs/performance.md, 2026-12-06,
// twentieth and twenty-first sessions). gelu_backward, off until 2026-12-07 (it lost 0.4% at the
// 1.3B shape and 4% on GPT-2's shapes before the twenty-fifth session's staging ring), runs GELU's
// backward where no bias sums ride it: since the MLP output projection's bias gradient comes from
// the next norm (runtime/ops/bias_gradient_handoff.h), cuBLASLt's DGELU in its place cost GPT-2
// 0.3% (docs/performance.md, 2026-12-07, thirty-first session). Where the sums are wanted,
// input_gradient takes the product with them whether gelu_backward is on or not. input_gradient
// declines a product whose dY is wider than kHopperInputGradientMaxColumns (the 1.3B shape's fc dX,
// K = 8192, is 10% slower than cuBLASLt's product and a pass), and cuBLASLt's product and weft's
// column-sum pass run instead.
// The results are not cuBLASLt's bits: GELU's tanh is the hardware's approximation (2^-11 relative,
// under bf16's rounding), and the sums run in another order. Each gives the same bits on every run
// of the same inputs (no atomics, sums in a fixed order): CudaFused.OwnHopperProductsGiveTheSameBitsEveryRun
// checks it, and racecheck found no hazard in them (2026-12-06, twenty-first session). A GPT-2
// run resumed from its checkpoint differs from the straight run with or without them, because
// cuDNN's default attention backward sums dQ with atomics; with deterministic kernels
// (runtime/determinism.h) two fresh runs and a resumed one give the same bits with them on.
//
// The launchers are built for sm_90a only (runtime/cuda/sm90a/hopper_products.cu, an object library
// of its own: a build for sm_90 compiles the kernels to nothing), and exist where WEFT_HAVE_SM90A is
// defined; on a device other than compute capability 9.0 they decline and cuBLASLt runs. The setting
// (runtime/cuda/hopper_products_setting.cc) exists in every CUDA build.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weft::cuda {

enum HopperProduct : unsigned {
  kHopperBiasGelu = 1u << 0,       // "bias_gelu"
  kHopperGeluBackward = 1u << 1,   // "gelu_backward"
  kHopperInputGradient = 1u << 2,  // "input_gradient"
  kHopperSwiglu = 1u << 3,         // "swiglu"
  kHopperSwigluBackward = 1u << 4, // "swiglu_backward"
};
constexpr unsigned kAllHopperProducts =
    kHopperBiasGelu | kHopperGeluBackward | kHopperInputGradient | kHopperSwiglu | kHopperSwigluBackward;
// What runs where WEFT_HOPPER_GEMM is unset.
constexpr unsigned kDefaultHopperProducts = kAllHopperProducts;
// The widest dY (the inner dimension K of dY · W) whose product input_gradient takes in training:
// GPT-2's K = 3072 gains 11% over cuBLASLt's product and a pass, the 1.3B shape's K = 8192 loses 10%.
constexpr int64_t kHopperInputGradientMaxColumns = 4096;

// The products (a mask of HopperProduct) that a WEFT_HOPPER_GEMM value names; nullopt where it names
// anything else, with *problem saying what and which values are valid.
std::optional<unsigned> parse_hopper_products(std::string_view text, std::string* problem);

// Whether the backend tries `product` on the own kernel first (WEFT_HOPPER_GEMM at the first call,
// kDefaultHopperProducts where it is unset).
bool hopper_product_enabled(HopperProduct product);
// The products switched on (a mask of HopperProduct); setting them replaces WEFT_HOPPER_GEMM's.
unsigned hopper_products();
void set_hopper_products(unsigned products);
// Forgets the products, so that the next call reads WEFT_HOPPER_GEMM again.
void forget_hopper_products_for_testing();

// How many products the own kernels have queued in this process (for tests: that one ran there).
int64_t hopper_gemm_launches();
void count_hopper_gemm_launch();

#if defined(WEFT_HAVE_SM90A)
// out [m, n] = gelu(a [m, k] · b [n, k]ᵀ + bias [n]) and pre_gelu [m, n] = a · bᵀ + bias (or null:
// not kept), bf16, every matrix contiguous and row-major, on the current device, queued on stream.
// False (nothing queued) where it does not apply: the device is not compute capability 9.0, a
// dimension is 0, k or n is not a multiple of 8, a pointer is not 16-byte aligned, or a dimension
// does not fit a 32-bit index.
bool hopper_bias_gelu(const void* a, const void* b, const void* bias, void* out, void* pre_gelu, int64_t m, int64_t n,
                      int64_t k, cudaStream_t stream);

// out [m, n] = (dy [m, k] · w [k, n]) ⊙ gelu'(pre_gelu [m, n]), bf16, every matrix contiguous and
// row-major (w N-major: the next linear's [out = k, in = n] weight as stored), on the current device,
// queued on stream. False (nothing queued) where it does not apply, as hopper_bias_gelu.
bool hopper_gelu_backward(const void* dy, const void* w, const void* pre_gelu, void* out, int64_t m, int64_t n,
                          int64_t k, cudaStream_t stream);

// out [m, n] = dy [m, k] · w [k, n] (with pre_gelu [m, n] not null: times gelu'(pre_gelu), as
// hopper_gelu_backward), and column_sums [k] = the sum of dy's m rows, bf16 (summed in f32, rounded
// once), every matrix contiguous and row-major. partials: [hopper_column_sum_slices(m), k] f32 of
// workspace the sums pass through (32-row slices, then one pass over them). On the current device,
// queued on stream; false (nothing queued) where it does not apply, as hopper_bias_gelu.
bool hopper_input_gradient(const void* dy, const void* w, const void* pre_gelu, void* out, void* column_sums,
                           float* partials, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

// gate [m, hidden] = x [m, k] · gate_weight [hidden, k]ᵀ, up [m, hidden] = x · up_weight [hidden, k]ᵀ
// and out [m, hidden] = silu(gate) · up from the rounded gate and up, as Backend::swiglu computes it
// (the CUDA swiglu kernel's bits), bf16, every matrix contiguous and row-major, on the current
// device, queued on stream. False (nothing queued) where it does not apply, as hopper_bias_gelu
// (hidden in n's place).
bool hopper_swiglu(const void* x, const void* gate_weight, const void* up_weight, void* gate, void* up, void* out,
                   int64_t m, int64_t hidden, int64_t k, cudaStream_t stream);

// SwiGLU's backward in the down-projection's dX product: with d = dy [m, k] · w [k, n] rounded to
// bf16 (w N-major: the down-projection's [out = k, in = n] weight as stored), grad_gate [m, n] =
// (d · up) · silu'(gate) and grad_up [m, n] = d · silu(gate), from gate and up [m, n], written as
// Backend::swiglu_backward writes them (the CUDA swiglu_backward kernel's bits of d), bf16, every
// matrix contiguous and row-major, on the current device, queued on stream. False (nothing queued)
// where it does not apply, as hopper_bias_gelu.
bool hopper_swiglu_backward(const void* dy, const void* w, const void* gate, const void* up, void* grad_gate,
                            void* grad_up, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
#endif
// The rows of hopper_input_gradient's partials for m rows of dY.
constexpr int64_t hopper_column_sum_slices(int64_t m) { return (m + 31) / 32; }

}  // namespace weft::cuda
