#include "runtime/cuda/nvtx_annotated_backend.h"

#include "runtime/nvtx_range.h"

namespace weft {

DeviceType NvtxAnnotatedBackend::device_type() const { return inner_.device_type(); }

void NvtxAnnotatedBackend::synchronize(Device device) {
  NvtxRange range("synchronize");
  inner_.synchronize(device);
}

DeviceMemory NvtxAnnotatedBackend::memory(Device device, bool reset_peak) { return inner_.memory(device, reset_peak); }

void NvtxAnnotatedBackend::fill(const Tensor& out, double value) {
  NvtxRange range("fill");
  inner_.fill(out, value);
}

void NvtxAnnotatedBackend::copy(const Tensor& source, const Tensor& out) {
  NvtxRange range("copy");
  inner_.copy(source, out);
}

void NvtxAnnotatedBackend::fill_random(const Tensor& out, RandomDistribution distribution, uint64_t seed,
                                       uint64_t offset, double a, double b) {
  NvtxRange range("fill_random");
  inner_.fill_random(out, distribution, seed, offset, a, b);
}

void NvtxAnnotatedBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  NvtxRange range("unary");
  inner_.unary(op, x, out);
}

void NvtxAnnotatedBackend::unary_backward(UnaryOp op, const Tensor& x, const Tensor& grad_out, const Tensor& grad_x) {
  NvtxRange range("unary_backward");
  inner_.unary_backward(op, x, grad_out, grad_x);
}

void NvtxAnnotatedBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  NvtxRange range("binary");
  inner_.binary(op, a, b, out);
}

void NvtxAnnotatedBackend::affine(const Tensor& x, double scale, double shift, const Tensor& out) {
  NvtxRange range("affine");
  inner_.affine(x, scale, shift, out);
}

void NvtxAnnotatedBackend::reduce(ReduceOp op, const Tensor& x, absl::Span<const int64_t> dims, const Tensor& out,
                                  const Tensor& indices) {
  NvtxRange range("reduce");
  inner_.reduce(op, x, dims, out, indices);
}

void NvtxAnnotatedBackend::squared_norms(absl::Span<const Tensor> tensors, const Tensor& out) {
  NvtxRange range("squared_norms");
  inner_.squared_norms(tensors, out);
}

void NvtxAnnotatedBackend::scale_in_place(absl::Span<const Tensor> tensors, double factor) {
  NvtxRange range("scale_in_place");
  inner_.scale_in_place(tensors, factor);
}

void NvtxAnnotatedBackend::clip_factor(const Tensor& squares, double max_norm, const Tensor& factor) {
  NvtxRange range("clip_factor");
  inner_.clip_factor(squares, max_norm, factor);
}

void NvtxAnnotatedBackend::clip_to_norm(absl::Span<const Tensor> tensors, const Tensor& squares, double max_norm) {
  NvtxRange range("clip_to_norm");
  inner_.clip_to_norm(tensors, squares, max_norm);
}

void NvtxAnnotatedBackend::adamw_update(absl::Span<const AdamWTensorUpdate> updates,
                                        const AdamWHyperparameters& hyperparameters) {
  NvtxRange range("adamw_update");
  inner_.adamw_update(updates, hyperparameters);
}

void NvtxAnnotatedBackend::sgd_update(absl::Span<const SgdTensorUpdate> updates,
                                      const SgdHyperparameters& hyperparameters) {
  NvtxRange range("sgd_update");
  inner_.sgd_update(updates, hyperparameters);
}

void NvtxAnnotatedBackend::join_master_halves(const Tensor& high, const Tensor& low, const Tensor& values) {
  NvtxRange range("join_master_halves");
  inner_.join_master_halves(high, low, values);
}

void NvtxAnnotatedBackend::master_low_halves(const Tensor& values, const Tensor& low) {
  NvtxRange range("master_low_halves");
  inner_.master_low_halves(values, low);
}

void NvtxAnnotatedBackend::matmul(const Tensor& a, const Tensor& bm, const Tensor& out, double alpha, double beta) {
  NvtxRange range("matmul");
  inner_.matmul(a, bm, out, alpha, beta);
}

void NvtxAnnotatedBackend::matmul_bias(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out) {
  NvtxRange range("matmul_bias");
  inner_.matmul_bias(a, bm, bias, out);
}

void NvtxAnnotatedBackend::matmul_bias_add(const Tensor& a, const Tensor& bm, const Tensor& bias,
                                           const Tensor& addend, const Tensor& out) {
  NvtxRange range("matmul_bias_add");
  inner_.matmul_bias_add(a, bm, bias, addend, out);
}

void NvtxAnnotatedBackend::matmul_gelu_backward(const Tensor& a, const Tensor& bm, const Tensor& pre_activation,
                                                const Tensor& out) {
  NvtxRange range("matmul_gelu_backward");
  inner_.matmul_gelu_backward(a, bm, pre_activation, out);
}

void NvtxAnnotatedBackend::matmul_and_column_sums(const Tensor& a, const Tensor& bm, const Tensor& pre_activation,
                                                  const Tensor& out, const Tensor& column_sums) {
  NvtxRange range("matmul_and_column_sums");
  inner_.matmul_and_column_sums(a, bm, pre_activation, out, column_sums);
}

void NvtxAnnotatedBackend::matmul_bias_gelu(const Tensor& a, const Tensor& bm, const Tensor& bias, const Tensor& out,
                                            const Tensor& pre_activation) {
  NvtxRange range("matmul_bias_gelu");
  inner_.matmul_bias_gelu(a, bm, bias, out, pre_activation);
}

void NvtxAnnotatedBackend::softmax(const Tensor& x, const Tensor& out, bool log) {
  NvtxRange range("softmax");
  inner_.softmax(x, out, log);
}

void NvtxAnnotatedBackend::softmax_backward(const Tensor& y, const Tensor& grad_y, const Tensor& grad_x, bool log) {
  NvtxRange range("softmax_backward");
  inner_.softmax_backward(y, grad_y, grad_x, log);
}

void NvtxAnnotatedBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                      const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  NvtxRange range("layer_norm");
  inner_.layer_norm(x, weight, bias, eps, out, mean, rstd);
}

void NvtxAnnotatedBackend::layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                               const Tensor& rstd, const Tensor& grad_out, const Tensor& grad_x,
                                               const Tensor& grad_weight, const Tensor& grad_bias,
                                               const NormBackwardExtras& extras) {
  NvtxRange range("layer_norm_backward");
  inner_.layer_norm_backward(x, weight, mean, rstd, grad_out, grad_x, grad_weight, grad_bias, extras);
}

void NvtxAnnotatedBackend::add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                          const Tensor& bias, double eps, const Tensor& sum_out, const Tensor& out,
                                          const Tensor& mean, const Tensor& rstd) {
  NvtxRange range("add_layer_norm");
  inner_.add_layer_norm(x, residual, weight, bias, eps, sum_out, out, mean, rstd);
}

bool NvtxAnnotatedBackend::norm_backward_sums_columns_in_pass(const Tensor& x) const {
  return inner_.norm_backward_sums_columns_in_pass(x);
}

void NvtxAnnotatedBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out,
                                    const Tensor& rstd) {
  NvtxRange range("rms_norm");
  inner_.rms_norm(x, weight, eps, out, rstd);
}

void NvtxAnnotatedBackend::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd,
                                             const Tensor& grad_out, const Tensor& grad_x, const Tensor& grad_weight,
                                             const NormBackwardExtras& extras) {
  NvtxRange range("rms_norm_backward");
  inner_.rms_norm_backward(x, weight, rstd, grad_out, grad_x, grad_weight, extras);
}

void NvtxAnnotatedBackend::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                                        const Tensor& sum_out, const Tensor& out, const Tensor& rstd) {
  NvtxRange range("add_rms_norm");
  inner_.add_rms_norm(x, residual, weight, eps, sum_out, out, rstd);
}

void NvtxAnnotatedBackend::rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                            const Tensor& out) {
  NvtxRange range("rotary_embedding");
  inner_.rotary_embedding(x, cos, sin, out);
}

void NvtxAnnotatedBackend::rotary_embedding_backward(const Tensor& grad_out, const Tensor& cos, const Tensor& sin,
                                                     const Tensor& grad_x) {
  NvtxRange range("rotary_embedding_backward");
  inner_.rotary_embedding_backward(grad_out, cos, sin, grad_x);
}

void NvtxAnnotatedBackend::swiglu_products(const Tensor& rows, const Tensor& gate_weight, const Tensor& up_weight,
                                           const Tensor& gate, const Tensor& up, const Tensor& out) {
  NvtxRange range("swiglu_products");
  inner_.swiglu_products(rows, gate_weight, up_weight, gate, up, out);
}

void NvtxAnnotatedBackend::matmul_swiglu_backward(const Tensor& a, const Tensor& bm, const Tensor& gate,
                                                  const Tensor& up, const Tensor& grad_gate, const Tensor& grad_up) {
  NvtxRange range("matmul_swiglu_backward");
  inner_.matmul_swiglu_backward(a, bm, gate, up, grad_gate, grad_up);
}

void NvtxAnnotatedBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  NvtxRange range("swiglu");
  inner_.swiglu(gate, up, out);
}

void NvtxAnnotatedBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& grad_out,
                                           const Tensor& grad_gate, const Tensor& grad_up) {
  NvtxRange range("swiglu_backward");
  inner_.swiglu_backward(gate, up, grad_out, grad_gate, grad_up);
}

void NvtxAnnotatedBackend::embedding(const Tensor& ids, const Tensor& weight, const Tensor& out) {
  NvtxRange range("embedding");
  inner_.embedding(ids, weight, out);
}

void NvtxAnnotatedBackend::embedding_backward(const Tensor& ids, const Tensor& grad_out, const Tensor& grad_weight) {
  NvtxRange range("embedding_backward");
  inner_.embedding_backward(ids, grad_out, grad_weight);
}

void NvtxAnnotatedBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                                     const Tensor& lse) {
  NvtxRange range("attention");
  inner_.attention(q, k, v, scale, out, lse);
}

void NvtxAnnotatedBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                              const Tensor& lse, const Tensor& grad_out, double scale,
                                              const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v) {
  NvtxRange range("attention_backward");
  inner_.attention_backward(q, k, v, out, lse, grad_out, scale, grad_q, grad_k, grad_v);
}

void NvtxAnnotatedBackend::cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                         const Tensor& losses, const Tensor& lse) {
  NvtxRange range("cross_entropy");
  inner_.cross_entropy(logits, targets, ignore_index, losses, lse);
}

void NvtxAnnotatedBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                                  int64_t ignore_index, const Tensor& grad_losses,
                                                  const Tensor& grad_logits) {
  NvtxRange range("cross_entropy_backward");
  inner_.cross_entropy_backward(logits, targets, lse, ignore_index, grad_losses, grad_logits);
}

void NvtxAnnotatedBackend::cross_entropy_with_gradient(const Tensor& logits, const Tensor& targets,
                                                       int64_t ignore_index, const Tensor& grad_losses,
                                                       const Tensor& losses, const Tensor& lse,
                                                       const Tensor& grad_logits) {
  NvtxRange range("cross_entropy_with_gradient");
  inner_.cross_entropy_with_gradient(logits, targets, ignore_index, grad_losses, losses, lse, grad_logits);
}

void NvtxAnnotatedBackend::rescale_unless_expected(const Tensor& data, const Tensor& seed, double expected) {
  NvtxRange range("rescale_unless_expected");
  inner_.rescale_unless_expected(data, seed, expected);
}

void NvtxAnnotatedBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, const Tensor& out) {
  NvtxRange range("dropout");
  inner_.dropout(x, p, seed, offset, out);
}

}  // namespace weft
