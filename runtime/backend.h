// Backend: the kernels of one device type, behind one interface.
//
// Every differentiable op (runtime/ops/) computes through these kernels, so a new device adds a
// Backend and every op runs there. The CPU backend (runtime/cpu/) is the reference every other
// backend is tested against.
//
// Conventions for every kernel:
// - Outputs are allocated by the caller with the documented shape and dtype; kernels write them
//   with '=' unless the comment says "accumulates" ('+=').
// - Floating inputs may be f32, bf16, f16 or f64; math is f32 (double for f64). Outputs and inputs of
//   one call share a dtype unless stated; statistics (mean, rstd, lse) are always f32 (f64 for f64
//   inputs).
// - "strided" means any view (transposed, sliced, stride-0 broadcast) is accepted; otherwise the
//   caller passes contiguous tensors.
// - Kernels check nothing a caller already checked (ops validate shapes, dtypes and devices).
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "runtime/binary_op.h"
#include "runtime/device.h"
#include "runtime/optimizer_update.h"
#include "runtime/tensor.h"

namespace weft {

enum class UnaryOp : uint8_t {
  kNeg, kRelu, kGelu /* tanh form */, kSilu, kExp, kLog, kTanh, kSqrt, kSquare, kReciprocal
};
enum class ReduceOp : uint8_t { kSum, kMean, kMax };
enum class RandomDistribution : uint8_t { kUniform, kNormal };

// What a norm's backward folds into its own pass instead of leaving to separate kernels.
struct NormBackwardExtras {
  // [N, C] contiguous, x's dtype, or undefined: added to grad_x in the kernel's arithmetic, before
  // the one rounding (the gradient that x receives from its other uses: the residual stream's,
  // taken from the engine with autograd::take_pending_gradient).
  Tensor grad_x_addend;
  // When true, grad_weight and grad_bias accumulate (+=, each sum rounded once into the existing
  // value) instead of being written: the op hands the parameters' .grad itself
  // (AccumulateGrad::gradient_storage) and skips the add of a separate gradient.
  bool accumulate_parameter_gradients = false;
  // [C], x's dtype, or undefined: written (=) with the column sums of grad_x as stored (its rounded
  // values, summed in f32, f64 for f64, and rounded once), the bias gradient of the linear that
  // produced x (runtime/ops/bias_gradient_handoff.h). Ask only where norm_backward_sums_columns_in_pass
  // says the backend does it in the same pass; elsewhere it costs a pass of its own.
  Tensor grad_x_column_sums;
};

// Device memory as a backend's allocator sees it (all zero for the CPU, whose memory is the process's).
struct DeviceMemory {
  int64_t allocated_bytes = 0;       // handed out now
  int64_t peak_allocated_bytes = 0;  // most handed out since the last reset
  int64_t reserved_bytes = 0;        // held from the driver, allocated or cached
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType device_type() const = 0;

  // Waits until the work queued so far on `device` (its current stream) has finished. Kernels are
  // asynchronous on devices; the CPU backend has nothing to wait for.
  virtual void synchronize(Device device) {}
  // The allocator's view of `device`; with reset_peak, a new peak window starts after reading.
  virtual DeviceMemory memory(Device device, bool reset_peak) { return {}; }

  // --- Fill, copy, random -------------------------------------------------------------------
  // out (strided) = value.
  virtual void fill(const Tensor& out, double value) = 0;
  // out (strided) = source (strided, same shape; may be stride-0 broadcast), converting dtype.
  virtual void copy(const Tensor& source, const Tensor& out) = 0;
  // out (contiguous) element i = draw from Philox(seed, counter offset + i): uniform in [a, b) or
  // normal with mean a and standard deviation b. See runtime/random.h for the exact mapping.
  virtual void fill_random(const Tensor& out, RandomDistribution distribution, uint64_t seed, uint64_t offset,
                           double a, double b) = 0;

  // --- Elementwise (strided, same shape for all operands; broadcast inputs are expanded views) ---
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out) = 0;
  // grad_x = grad_out * d op(x) / dx.
  virtual void unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, const Tensor& grad_x) = 0;
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out = x * scale + shift.
  virtual void affine(const Tensor& x, double scale, double shift, const Tensor& out) = 0;

  // --- Reductions ------------------------------------------------------------------------
  // x strided [..]; out has x's shape with each dim in `dims` (sorted, unique) set to 1.
  // For kMax, `indices` (i64, out's shape) receives the position of the maximum along the single
  // reduced dim (dims has one entry then) — pass an undefined tensor when not needed.
  virtual void reduce(ReduceOp op, const Tensor& x, absl::Span<const int64_t> dims, const Tensor& out,
                      const Tensor& indices) = 0;
  // out[i] = the sum of the squares of every element of tensors[i] (any shapes and strides, all on
  // this backend's device); out [tensors.size()] contiguous, f32 or f64. Accumulated in f64 on the
  // CPU and in f32 on devices, in a fixed order (the same bits from run to run); one pass over each
  // tensor, no widened copies (the gradient norm of a whole model in one launch on CUDA).
  virtual void squared_norms(absl::Span<const Tensor> tensors, const Tensor& out) = 0;
  // Every element of every tensor (any shapes and strides, none overlapping another, all on this
  // backend's device) multiplied by `factor` in place, rounded once to its dtype: what affine(x,
  // factor, 0, x) does to each, in one launch on CUDA (gradient clipping and accumulation).
  virtual void scale_in_place(absl::Span<const Tensor> tensors, double factor) = 0;
  // Global-norm clipping decided on the device, with no host read: `squares` [k] (contiguous, the
  // accumulation_dtype of this device) holds squared L2 norms of the parts of one vector, such as
  // squared_norms of its tensors, perhaps summed over ranks; norm = sqrt of their sum, added in
  // order in f64. When max_norm > 0 and the norm is finite and above max_norm, every tensor is
  // scaled in place by max_norm / (norm + 1e-6) (as scale_in_place does), else nothing changes:
  // what clip_grad_norm does, with the decision left on the device.
  virtual void clip_to_norm(absl::Span<const Tensor> tensors, const Tensor& squares, double max_norm) = 0;
  // clip_to_norm's decision alone: factor (one element, squares' dtype, on the device) = max_norm /
  // (norm + 1e-6) where clip_to_norm would scale, else 1; for an update that applies it as it reads
  // the gradients (AdamWHyperparameters::gradient_scale) instead of a pass that scales them.
  virtual void clip_factor(const Tensor& squares, double max_norm, const Tensor& factor) = 0;

  // --- Optimizer updates (runtime/optimizer_update.h states the math and the master-weight rule) ---
  // One AdamW step of every entry, in place (parameter, moments, master), all on this backend's
  // device: one launch for a whole model on CUDA.
  virtual void adamw_update(absl::Span<const AdamWTensorUpdate> updates,
                            const AdamWHyperparameters& hyperparameters) = 0;
  // One SGD step of every entry, in place (parameter, momentum buffer, master), likewise.
  virtual void sgd_update(absl::Span<const SgdTensorUpdate> updates, const SgdHyperparameters& hyperparameters) = 0;
  // Split bf16 master weights (runtime/split_master_weights.h), converted where they live, for
  // checkpoints: values [..] f32 = the masters whose high halves are `high` [..] bf16 (the
  // parameter) and low halves `low` [..] i16; and the inverse, low = the low halves of `values`
  // (whose high halves are their rounding, master_high_half). All contiguous, one shape.
  virtual void join_master_halves(const Tensor& high, const Tensor& low, const Tensor& values) = 0;
  virtual void master_low_halves(const Tensor& values, const Tensor& low) = 0;

  // --- Matmul ----------------------------------------------------------------------------
  // out[b] = alpha * a[b] @ bm[b] + beta * out[b]; a [B, M, K], bm [B, K, N], out [B, M, N] contiguous.
  // a and bm may be strided views: row-major or transposed (column-major) in their last two dims,
  // and stride 0 in the batch dim for a shared operand. When beta is 0 out is not read.
  virtual void matmul(const Tensor& a, const Tensor& bm, const Tensor& out, double alpha, double beta) = 0;
  // out[b] = a[b] @ bm[b] + bias, bias [N] contiguous (added to every row); operands as for matmul.
  // The default (the CPU reference) is matmul, then a broadcast add rounded again to out's dtype; a
  // backend may fuse the bias into the product (CUDA: a cuBLASLt epilogue, which adds the bias in f32
  // before rounding once).
  virtual void matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out) {
    matmul(a, bm, out, 1.0, 0.0);
    binary(BinaryOp::kAdd, out, bias.view({1, 1, bias.size(0)}).expand(out.shape()), out);
  }
  // out[b] = a[b] @ bm[b] + bias + addend[b]: a layer's output and the residual stream's add in one
  // pass. bias [N] contiguous or undefined; addend [B, M, N] contiguous, out's dtype, not out itself;
  // operands as for matmul. The default (the CPU reference) is matmul (matmul_bias with a bias),
  // then a binary add rounded again; a backend may fuse it (CUDA: cuBLASLt reads the addend as its
  // C matrix with beta 1 and adds the bias in the epilogue, in f32, rounding once).
  virtual void matmul_bias_add(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& addend,
                               const Tensor& out) {
    if (bias.defined()) {
      matmul_bias(a, bm, bias, out);
    } else {
      matmul(a, bm, out, 1.0, 0.0);
    }
    binary(BinaryOp::kAdd, out, addend, out);
  }
  // out[b] = gelu(a[b] @ bm[b] + bias) (tanh form, UnaryOp::kGelu), and pre_activation [B, M, N]
  // (contiguous, out's dtype) = a[b] @ bm[b] + bias, which the backward needs. Operands as for
  // matmul_bias. The default (the CPU reference) is matmul_bias into pre_activation, then unary gelu
  // of the rounded pre_activation; a backend may fuse it (CUDA: cuBLASLt's GELU_AUX_BIAS epilogue,
  // which applies GELU to the f32 sum before rounding, and writes the rounded sum as pre_activation).
  virtual void matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                                const Tensor& pre_activation) {
    matmul_bias(a, bm, bias, pre_activation);
    unary(UnaryOp::kGelu, pre_activation, out);
  }
  // The backward of a GELU linear through the product that follows it: out[b] = gelu'(pre[b]) *
  // (a[b] @ bm[b]), pre_activation [B, M, N] contiguous, out's dtype (what matmul_bias_gelu wrote);
  // operands as for matmul. The default (the CPU reference) is matmul into a buffer, then
  // unary_backward(kGelu) of the rounded product; a backend may fuse it (CUDA: cuBLASLt's DGELU
  // epilogue, which applies gelu' to the f32 product before rounding once).
  virtual void matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_activation,
                                    const Tensor& out) {
    const Tensor product = Tensor::empty(out.shape(), out.dtype(), out.device());  // no copy: one pass each
    matmul(a, bm, product, 1.0, 0.0);
    unary_backward(UnaryOp::kGelu, pre_activation, product, out);
  }
  // A linear's dX product and its bias gradient from one read of dY: out[0] = a[0] @ bm[0] (with
  // pre_activation defined, gelu'(pre) * (a[0] @ bm[0]) as matmul_gelu_backward), and column_sums
  // [K] (contiguous, a's dtype) = the sum of a[0]'s M rows, summed in f32 (f64 for f64) and rounded
  // once. a [1, M, K] contiguous; bm and out as for matmul. The default (the CPU reference) is
  // matmul (or matmul_gelu_backward), then reduce(kSum) over a's rows, exactly what the two apart
  // compute; a backend may sum the columns inside the product (CUDA on Hopper: weft's own product
  // under WEFT_HOPPER_GEMM=input_gradient, runtime/cuda/hopper_products.h).
  virtual void matmul_and_column_sums(const Tensor& a, const Tensor& bm, const Tensor& pre_activation,
                                      const Tensor& out, const Tensor& column_sums) {
    if (pre_activation.defined()) {
      matmul_gelu_backward(a, bm, pre_activation, out);
    } else {
      matmul(a, bm, out, 1.0, 0.0);
    }
    sum_over_rows(a.view({a.size(1), a.size(2)}), column_sums);
  }
  // sums [C] (contiguous) = rows [N, C] summed over N, as reduce(kSum) computes it (in the backend's
  // accumulation type, rounded once): a linear's bias gradient from its dY, wherever that is taken.
  void sum_over_rows(const Tensor& rows, const Tensor& sums) {
    const int64_t dims[] = {0};
    reduce(ReduceOp::kSum, rows, dims, sums.view({1, rows.size(1)}), Tensor());
  }

  // --- Softmax over the last dim (contiguous [N, C]) --------------------------------------
  virtual void softmax(const Tensor& x, const Tensor& out, bool log) = 0;
  // From the forward output y: softmax: gx = y * (gy - sum(gy * y)); log: gx = gy - exp(y) * sum(gy).
  virtual void softmax_backward(const Tensor& y, const Tensor& grad_y, const Tensor& grad_x, bool log) = 0;

  // --- Normalization over the last dim (contiguous) --------------------------------------
  // x [N, C], weight [C], bias [C] or undefined; out [N, C]; mean, rstd [N] (f32, f64 for f64 x).
  virtual void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                          const Tensor& out, const Tensor& mean, const Tensor& rstd) = 0;
  // grad_x [N, C] written; grad_weight [C] and grad_bias [C] (bias may be undefined) written, or
  // accumulated and grad_x given an addend as `extras` says.
  virtual void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& grad_out, const Tensor& grad_x, const Tensor& grad_weight,
                                   const Tensor& grad_bias, const NormBackwardExtras& extras) = 0;
  // sum_out = x + residual (rounded to x's dtype), then out = layer_norm(sum_out) as layer_norm above,
  // with the statistics of the rounded sum. x, residual, sum_out, out [N, C] contiguous, one dtype.
  // The default (the CPU reference) is binary add, then layer_norm; a backend may fuse the two (CUDA:
  // one pass that reads x and residual once: the layer-norm kernel of runtime/cuda/normalization.cu).
  virtual void add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                              double eps, const Tensor& sum_out, const Tensor& out, const Tensor& mean,
                              const Tensor& rstd) {
    binary(BinaryOp::kAdd, x, residual, sum_out);
    layer_norm(sum_out, weight, bias, eps, out, mean, rstd);
  }
  // Whether layer_norm_backward and rms_norm_backward of x [N, C] (contiguous) would write
  // NormBackwardExtras::grad_x_column_sums in the pass that writes grad_x, rather than with a pass of
  // their own after it. True by default: on the CPU the sums are a pass over the rows wherever they
  // are taken, in the norm's backward as in the linear's.
  virtual bool norm_backward_sums_columns_in_pass(const Tensor& x) const { return true; }
  // y = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps); rstd [N].
  virtual void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
                        const Tensor& rstd) = 0;
  // grad_x and grad_weight as for layer_norm_backward (extras likewise).
  virtual void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& grad_out,
                                 const Tensor& grad_x, const Tensor& grad_weight, const NormBackwardExtras& extras) = 0;
  // sum_out = x + residual (rounded to x's dtype), then out = rms_norm(sum_out), as add_layer_norm
  // does for layer norm. The default (the CPU reference) is binary add, then rms_norm; CUDA fuses
  // the two in one pass.
  virtual void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                            const Tensor& sum_out, const Tensor& out, const Tensor& rstd) {
    binary(BinaryOp::kAdd, x, residual, sum_out);
    rms_norm(sum_out, weight, eps, out, rstd);
  }

  // --- Llama's fused elementwise ops (runtime/ops/rotary.h, runtime/ops/swiglu.h) -----------
  // Rotary position embedding, rotate-half form (layers/rope.h). x, out [B, H, T, D] with any
  // strides whose last (D) is 1 (the heads of one projection; out may be in [B, T, H, D] order);
  // cos, sin [T, D] contiguous, x's dtype. With h = D / 2 and i < h, at position t:
  //   out[i]     = x[i] cos[t, i]         - x[i + h] sin[t, i]
  //   out[i + h] = x[i + h] cos[t, i + h] + x[i] sin[t, i + h]
  // each product rounded before the sum (no fused multiply-add), so in f32 and f64 the result is the
  // unfused x * cos + rotate_half(x) * sin bit for bit; 16-bit dtypes round once, at the store.
  virtual void rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) = 0;
  // The transpose (for the usual tables, whose halves repeat, the inverse rotation), same strides
  // rules: grad_x[i] = g[i] cos[t, i] + g[i + h] sin[t, i + h], grad_x[i + h] = g[i + h] cos[t, i + h]
  // - g[i] sin[t, i], products rounded as in the forward. grad_x may be grad_out itself (in place).
  virtual void rotary_embedding_backward(const Tensor& grad_out, const Tensor& cos, const Tensor& sin,
                                         const Tensor& grad_x) = 0;
  // SwiGLU's activation: out = silu(gate) * up = gate / (1 + exp(-gate)) * up, in the expression
  // order of unary kSilu then binary kMul (f32: the unfused result bit for bit; 16-bit dtypes round
  // once). gate, up, out contiguous, one shape.
  virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // SwiGLU's gate and up products with the activation: gate [R, H] = rows [R, C] · gate_weight [H,
  // C]ᵀ, up [R, H] = rows · up_weight [H, C]ᵀ, then swiglu(gate, up, out [R, H]) from the rounded
  // gate and up. rows and the weights with any strides matmul takes; gate, up, out contiguous
  // (gate and up may be the halves of one [2, R, H] buffer). The default runs the two products and
  // swiglu, exactly what the three apart compute; a backend may run them as one product (CUDA on
  // Hopper: weft's own product under WEFT_HOPPER_GEMM=swiglu, runtime/cuda/hopper_products.h), its
  // out still swiglu's bits of its gate and up.
  virtual void swiglu_products(const Tensor& rows, const Tensor& gate_weight, const Tensor& up_weight,
                               const Tensor& gate, const Tensor& up, const Tensor& out) {
    matmul(rows.unsqueeze(0), gate_weight.transpose(0, 1).unsqueeze(0), gate.unsqueeze(0), 1.0, 0.0);
    matmul(rows.unsqueeze(0), up_weight.transpose(0, 1).unsqueeze(0), up.unsqueeze(0), 1.0, 0.0);
    swiglu(gate, up, out);
  }
  // SwiGLU's backward in the product that hands it its gradient (a down-projection's dX): d = a [1,
  // R, K] · bm [1, K, H] as matmul computes it (rounded to the dtype), then swiglu_backward(gate, up,
  // d, grad_gate, grad_up) with gate, up, grad_gate, grad_up [R, H] contiguous (the gradients may be
  // the halves of one [2, R, H] buffer). The default runs exactly those two; a backend may apply
  // the backward in the product's epilogue (CUDA on Hopper: weft's own product under
  // WEFT_HOPPER_GEMM=swiglu_backward), its results still swiglu_backward's bits of its own d.
  virtual void matmul_swiglu_backward(const Tensor& a, const Tensor& bm, const Tensor& gate, const Tensor& up,
                                      const Tensor& grad_gate, const Tensor& grad_up) {
    const Tensor product = Tensor::empty({1, gate.size(0), gate.size(1)}, grad_gate.dtype(), grad_gate.device());
    matmul(a, bm, product, 1.0, 0.0);
    swiglu_backward(gate, up, product.view(gate.shape()), grad_gate, grad_up);
  }
  // From gate and up alone (silu recomputed): grad_up = grad_out * silu(gate),
  // grad_gate = (grad_out * up) * silu'(gate); all contiguous, one shape.
  virtual void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out, const Tensor& grad_gate,
                               const Tensor& grad_up) = 0;

  // --- Embedding -------------------------------------------------------------------------
  // ids [N] (i32 or i64), weight [V, C], out [N, C]. Ids outside [0, V) raise weft::Error.
  virtual void embedding(const Tensor& ids, const Tensor& weight, const Tensor& out) = 0;
  // grad_weight [V, C] accumulates grad_out [N, C] rows at ids (scatter-add).
  virtual void embedding_backward(const Tensor& ids, const Tensor& grad_out, const Tensor& grad_weight) = 0;

  // --- Causal self-attention -------------------------------------------------------------
  // q, out [B, H, T, D] and k, v [B, KV, T, D] with any strides whose last (D) is 1, so that the
  // heads of one [B, T, (H + 2 KV) D] projection (the layer's q, k, v) and an output in [B, T, H, D]
  // order need no copy. Grouped-query attention: KV divides H and query head h reads kv head
  // h / (H / KV) (KV = H: multi-head). lse [B, H, T] contiguous (f32; f64 for f64) = log-sum-exp of
  // each scaled, causally masked score row. out = softmax(mask(q k^T * scale)) v. Any head dim on
  // the CPU; 1..256 on CUDA.
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                         const Tensor& lse) = 0;
  // grad_q [B, H, T, D] and grad_k, grad_v [B, KV, T, D] written (strides as for q; grad_out
  // likewise); grad_k, grad_v of a kv head are the sums over its group of query heads.
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& grad_out, double scale, const Tensor& grad_q,
                                  const Tensor& grad_k, const Tensor& grad_v) = 0;

  // --- Cross-entropy ---------------------------------------------------------------------
  // logits [N, V], targets [N] (i32 or i64); losses [N] and lse [N] (f32; f64 for f64 logits).
  // Rows whose target equals ignore_index get loss 0. Targets outside [0, V) otherwise raise.
  virtual void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& losses, const Tensor& lse) = 0;
  // grad_logits [N, V] = (softmax(logits) - onehot(target)) * grad_losses[n]; zero rows for ignored
  // targets. grad_losses [N] (f32; f64 for f64 logits). grad_logits may be logits (in place).
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                      int64_t ignore_index, const Tensor& grad_losses,
                                      const Tensor& grad_logits) = 0;
  // Both in one call, for a loss whose backward will come: losses and lse as cross_entropy, then
  // grad_logits as cross_entropy_backward with `grad_losses` (given now, for the seed the backward is
  // expected to bring). grad_logits may be logits: the logits are then gone after the call. The
  // default (the CPU reference) is the two calls; CUDA runs one kernel that reads each row twice (the
  // second time from L2) and writes it once, instead of reading it in two kernels.
  virtual void cross_entropy_with_gradient(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                           const Tensor& grad_losses, const Tensor& losses, const Tensor& lse,
                                           const Tensor& grad_logits) {
    cross_entropy(logits, targets, ignore_index, losses, lse);
    cross_entropy_backward(logits, targets, lse, ignore_index, grad_losses, grad_logits);
  }
  // data *= seed / expected, unless the one element of `seed` equals `expected` rounded to seed's
  // dtype (then data is not touched): corrects, on the device and without a host read of the seed, a
  // gradient computed ahead under an expected seed (cross_entropy_with_gradient). data contiguous;
  // seed f32 or f64, one element, on data's device. The default reads the seed on the host (CUDA
  // overrides it with a kernel that returns at once when the seed is the expected one).
  virtual void rescale_unless_expected(const Tensor& data, const Tensor& seed, double expected) {
    const double value = seed.item();
    const double rounded = seed.dtype() == DType::kFloat32 ? static_cast<double>(static_cast<float>(expected)) : expected;
    if (value != rounded) affine(data, value / expected, 0.0, data);
  }

  // --- Dropout ---------------------------------------------------------------------------
  // x, out contiguous, same shape: element i is kept when Philox uniform(seed, offset + i) >= p and
  // then scaled by 1 / (1 - p); otherwise 0. The backward is the same call on the gradient.
  virtual void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out) = 0;
};

// The backend for a device type; weft::Error when the build lacks it.
Backend& backend_for(Device device);

// The dtype whole-tensor sums (a gradient norm, a loss over ranks) are taken in on `device`: f64 on
// the CPU, so that long sequential sums do not drift; f32 on devices, which sum in trees (and whose
// kernels have no f64).
inline DType accumulation_dtype(const Device& device) { return device.is_cpu() ? kFloat64 : kFloat32; }
// Called once by each backend at start-up.
void register_backend(DeviceType type, Backend* backend);

}  // namespace weft
