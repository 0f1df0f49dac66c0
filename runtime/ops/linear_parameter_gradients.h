// The parameter gradients of a linear layer, shared by the ops whose backward computes them
// (linear and its fused forms in matmul.cc, swiglu_linear.cc) and by their deferred
// weight-gradient work (zero-bubble pipelines), so that all give bitwise the same gradients.
//
// From dY ([R, N]) and the layer's input rows X ([R, K]): dW = dY^T X ([N, K], contiguous: the
// weight's layout) and db = dY summed over rows ([N]). Where the weight's accumulator offers its
// .grad (AccumulateGrad::gradient_storage: the gradient buffer's slot, or an earlier micro-batch's
// gradient), dW is added into it by the GEMM itself (beta = 1) and returned undefined: one kernel
// instead of a product into a new tensor and an add. Where that .grad counts as zero (the gradient
// buffer's lazy zeroing: the step's first contribution), the GEMM writes it (beta = 0) and never
// reads the stale contents. (db stays weft's column-sum reduction: cuBLASLt's BGRADB epilogue was
// measured on the H200 and runs as a separate kernel of its own, slower than the reduction:
// docs/performance.md.)
#pragma once

#include "runtime/autograd/node.h"
#include "runtime/tensor.h"

namespace weft {

struct LinearParameterGradients {
  Tensor weight;  // [N, K]; undefined when added into the accumulator's .grad in place
  Tensor bias;    // [N]; undefined without a bias
};

LinearParameterGradients linear_parameter_gradients(const Tensor& g, const Tensor& rows, bool with_bias,
                                                    autograd::AccumulateGrad* weight_accumulator);

}  // namespace weft
