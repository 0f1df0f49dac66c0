// weft's public API in one include: tensors, autograd, and every differentiable op.
//
//   #include "runtime/weft.h"
//   weft::Tensor w = weft::Tensor::normal({768, 768}, /*seed=*/1).set_requires_grad(true);
//   weft::Tensor y = weft::gelu(weft::linear(x, w));
//   weft::mean(y).backward();   // w.grad() now holds d mean(y) / dw
#pragma once

#include "runtime/autograd/deferred_weight_gradients.h"
#include "runtime/autograd/engine.h"
#include "runtime/autograd/function.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/backend.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/concat.h"
#include "runtime/ops/dropout.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/embedding.h"
#include "runtime/ops/loss.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/normalization.h"
#include "runtime/ops/reduction.h"
#include "runtime/ops/rotary.h"
#include "runtime/ops/softmax.h"
#include "runtime/ops/swiglu.h"
#include "runtime/ops/swiglu_linear.h"
#include "runtime/random.h"
#include "runtime/shape.h"
#include "runtime/tensor.h"
