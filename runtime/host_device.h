// WEFT_HOST_DEVICE marks a function that CUDA kernels and host code both call (one definition of a
// formula for the CPU and CUDA backends, so that they cannot drift apart). Outside nvcc it is empty.
#pragma once

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__
#else
#define WEFT_HOST_DEVICE
#endif
