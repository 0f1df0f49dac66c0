// Deterministic kernels: whether a run must give the same bits every time it is repeated on the
// same inputs and hardware, at some cost in speed (train.deterministic, or WEFT_DETERMINISTIC=1).
//
// The CPU backend always does for a given thread count (fixed partitions, no atomics in its
// sums), whatever this says. On CUDA it selects cuDNN's deterministic attention backward
// (runtime/cuda/cudnn_attention.h: the default one sums dQ with atomics) and turns matmul
// autotuning off (runtime/cuda/matmul.cu: a choice by timing can differ between runs), and has
// weft's bf16/f16 flash backward sum dQ in a fixed order (runtime/cuda/flash_attention.cuh: slices
// per key block instead of atomics). What it does not cover: collectives, whose sums are NCCL's or
// MPI's (fixed for a given topology and algorithm).
//
// Read from WEFT_DETERMINISTIC at the first call (unset, "" or "0": off; anything else: on) unless
// set_deterministic_kernels was called first; the launcher sets it from train.deterministic before
// the model runs. Safe to read from any thread.
#pragma once

namespace weft {

bool deterministic_kernels();
void set_deterministic_kernels(bool deterministic);

}  // namespace weft
