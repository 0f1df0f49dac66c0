// The CUDA backend: every kernel of runtime/backend.h on NVIDIA GPUs (built for sm_90 first).
//
// Kernels run on the calling thread's current stream of the tensor's device (runtime/cuda/stream.h);
// nothing here synchronizes the host except copies to host memory. Floating tensors are f32 or
// bf16 (f16 where noted) with f32 accumulation; results must agree with the CPU backend within the
// tolerances of tests/unit/cuda_*_test.cc. Files: elementwise.cu (fill, copy, random, unary,
// binary, affine), reduction.cu, softmax.cu, normalization.cu (with the fused residual add + layer norm), embedding.cu,
// cross_entropy.cu, dropout.cu, matmul.cu (cuBLASLt), attention.cu (fused causal attention that
// never writes T x T scores to device memory), multi_tensor_ops.cu (whole-model gradient passes),
// optimizer_kernels.cu (multi-tensor AdamW and SGD).
#pragma once

#include "runtime/backend.h"

namespace weft {

class CudaBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::kCuda; }
  void synchronize(Device device) override;
  DeviceMemory memory(Device device, bool reset_peak) override;

  void fill(const Tensor& out, double value) override;
  void copy(const Tensor& source, const Tensor& out) override;
  void fill_random(const Tensor& out, RandomDistribution distribution, uint64_t seed, uint64_t offset, double a,
                   double b) override;

  void unary(UnaryOp op, const Tensor& x, const Tensor& out) override;
  void unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, const Tensor& grad_x) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) override;
  void affine(const Tensor& x, double scale, double shift, const Tensor& out) override;

  void reduce(ReduceOp op, const Tensor& x, absl::Span<const int64_t> dims, const Tensor& out,
              const Tensor& indices) override;
  void squared_norms(absl::Span<const Tensor> tensors, const Tensor& out) override;
  void scale_in_place(absl::Span<const Tensor> tensors, double factor) override;
  void clip_to_norm(absl::Span<const Tensor> tensors, const Tensor& squares, double max_norm) override;
  void clip_factor(const Tensor& squares, double max_norm, const Tensor& factor) override;

  void adamw_update(absl::Span<const AdamWTensorUpdate> updates, const AdamWHyperparameters& hyperparameters) override;
  void sgd_update(absl::Span<const SgdTensorUpdate> updates, const SgdHyperparameters& hyperparameters) override;
  void join_master_halves(const Tensor& high, const Tensor& low, const Tensor& values) override;
  void master_low_halves(const Tensor& values, const Tensor& low) override;

  void matmul(const Tensor& a, const Tensor& bm, const Tensor& out, double alpha, double beta) override;
  void matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out) override;
  void matmul_bias_add(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& addend,
                       const Tensor& out) override;
  void matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_activation,
                            const Tensor& out) override;
  void matmul_and_column_sums(const Tensor& a, const Tensor& bm, const Tensor& pre_activation, const Tensor& out,
                              const Tensor& column_sums) override;
  void matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                        const Tensor& pre_activation) override;

  void softmax(const Tensor& x, const Tensor& out, bool log) override;
  void softmax_backward(const Tensor& y, const Tensor& grad_y, const Tensor& grad_x, bool log) override;

  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& out,
                  const Tensor& mean, const Tensor& rstd) override;
  void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& grad_out, const Tensor& grad_x, const Tensor& grad_weight,
                           const Tensor& grad_bias, const NormBackwardExtras& extras) override;
  void add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias, double eps,
                      const Tensor& sum_out, const Tensor& out, const Tensor& mean, const Tensor& rstd) override;
  bool norm_backward_sums_columns_in_pass(const Tensor& x) const override;
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out, const Tensor& rstd) override;
  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps, const Tensor& sum_out,
                    const Tensor& out, const Tensor& rstd) override;
  void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& grad_out,
                         const Tensor& grad_x, const Tensor& grad_weight, const NormBackwardExtras& extras) override;

  void rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& out) override;
  void rotary_embedding_backward(const Tensor& grad_out, const Tensor& cos, const Tensor& sin,
                                 const Tensor& grad_x) override;
  void swiglu_products(const Tensor& rows, const Tensor& gate_weight, const Tensor& up_weight, const Tensor& gate,
                       const Tensor& up, const Tensor& out) override;
  void matmul_swiglu_backward(const Tensor& a, const Tensor& bm, const Tensor& gate, const Tensor& up,
                              const Tensor& grad_gate, const Tensor& grad_up) override;
  void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out, const Tensor& grad_gate,
                       const Tensor& grad_up) override;

  void embedding(const Tensor& ids, const Tensor& weight, const Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& grad_out, const Tensor& grad_weight) override;

  void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                 const Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& grad_out, double scale, const Tensor& grad_q, const Tensor& grad_k,
                          const Tensor& grad_v) override;

  void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                     const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, int64_t ignore_index,
                              const Tensor& grad_losses, const Tensor& grad_logits) override;
  void cross_entropy_with_gradient(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                   const Tensor& grad_losses, const Tensor& losses, const Tensor& lse,
                                   const Tensor& grad_logits) override;
  void rescale_unless_expected(const Tensor& data, const Tensor& seed, double expected) override;

  void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out) override;
};

}  // namespace weft
