// cuda_library_writes_probe: does compute-sanitizer's initcheck see what cuBLASLt and cuDNN write?
//
//   compute-sanitizer --tool initcheck cuda_library_writes_probe matmul|attention
//
// Each library call writes an output allocated uninitialized, in full (cuda_matmul_attention_test
// proves every element is written: its outputs start as NaN), and weft's copy then reads it. An
// initcheck report on that read means the tool did not see the library's writes, so reports on
// tensors those calls produced are the tool's, not weft's. f32 then bf16, one line per case.
// Measured on the H200 (docs/reliability.md): the bf16 cuBLASLt matmul and the bf16 cuDNN attention
// outputs are reported in full, the f32 ones not at all.
#include <cstdio>
#include <cstring>

#include "runtime/backend.h"
#include "runtime/tensor.h"

int main(int argc, char** argv) {
  using namespace weft;
  const bool attention = argc > 1 && std::strcmp(argv[1], "attention") == 0;
  if (argc != 2 || (!attention && std::strcmp(argv[1], "matmul") != 0)) {
    std::fprintf(stderr, "usage: cuda_library_writes_probe matmul|attention (under compute-sanitizer --tool initcheck)\n");
    return 2;
  }
  const Device gpu = Device::cuda(0);
  Backend& backend = backend_for(gpu);
  for (DType dtype : {kFloat32, kBFloat16}) {
    Tensor out;
    if (!attention) {
      // The qkv projection of GPT-2 124M at 1024 tokens: x [1, 1024, 768] @ W^T, W [2304, 768].
      const Tensor x = Tensor::normal({1, 1024, 768}, 1, 0, 0.0, 1.0, dtype).to(gpu);
      const Tensor weight = Tensor::normal({1, 2304, 768}, 2, 0, 0.0, 0.02, dtype).to(gpu);
      out = Tensor::empty({1, 1024, 2304}, dtype, gpu);  // [1, 1024, 2304], never written before
      backend.matmul(x, weight.transpose(1, 2), out, 1.0, 0.0);
    } else {
      const Tensor q = Tensor::normal({4, 12, 256, 64}, 3, 0, 0.0, 1.0, dtype).to(gpu);  // [B, H, T, D]
      out = Tensor::empty({4, 12, 256, 64}, dtype, gpu);
      const Tensor log_sum_exp = Tensor::empty({4, 12, 256}, kFloat32, gpu);  // [B, H, T]
      backend.attention(q, q, q, 0.125, out, log_sum_exp);
    }
    Tensor copy = Tensor::empty(out.shape(), dtype, gpu);
    backend.copy(out, copy);
    backend.synchronize(gpu);
    std::printf("%s %s: written by the library, then read by weft's copy\n", attention ? "attention" : "matmul",
                dtype_name(dtype).data());
    std::fflush(stdout);
  }
  return 0;
}
