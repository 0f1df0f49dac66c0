// HostMessageBuffers on CUDA (parallel/pipeline/host_message_buffers.h): a received message goes
// to the device straight from its page-locked buffer, and that buffer is not handed out again while
// its copy may still read it. Skipped without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/pipeline/host_message_buffers.h"
#include "runtime/error.h"
#include "runtime/ops/matmul.h"
#include "runtime/tensor.h"
#include "tests/support/cuda_expectations.h"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/stream.h"
#endif

namespace weft {
namespace {

#ifdef WEFT_HAVE_CUDA

const Device kGpu = Device::cuda(0);

TEST(CudaHostMessageBuffers, ABufferWaitsForItsUploadBeforeItServesAgain) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  HostMessageBuffers buffers;  // page-locked
  constexpr int64_t kCount = int64_t(4) << 20;
  Tensor buffer = buffers.acquire({kCount}, kFloat32);
  for (int64_t i = 0; i < kCount; ++i) buffer.data<float>()[i] = static_cast<float>(i % 1000);
  // The stream is kept busy first (tens of ms of matmuls), so the upload behind them has not run
  // when the next message asks for a buffer of the same shape.
  const Tensor a = Tensor::normal({4096, 4096}, 1, 0, 0.0, 0.01, kBFloat16).to(kGpu);
  Tensor product = a;
  for (int i = 0; i < 100; ++i) product = matmul(a, a);
  const Tensor destination = Tensor::empty({kCount}, kFloat32, kGpu);
  buffers.upload_and_release(buffer, destination);
  ASSERT_EQ(cudaStreamQuery(cuda::current_stream(0)), cudaErrorNotReady) << "the matmuls ended too soon to test this";
  cudaGetLastError();
  Tensor next = buffers.acquire({kCount}, kFloat32);
  EXPECT_NE(next.raw_data(), buffer.raw_data()) << "handed out while its upload may still read it";
  EXPECT_EQ(buffers.buffers(), 2);
  for (int64_t i = 0; i < kCount; ++i) next.data<float>()[i] = -1.0f;  // a later message's bytes
  const std::vector<double> values = destination.to_vector();  // waits for the stream
  bool equal = true;
  for (int64_t i = 0; i < kCount && equal; ++i) equal = values[static_cast<size_t>(i)] == static_cast<double>(i % 1000);
  EXPECT_TRUE(equal) << "the device did not receive the buffer's values";
  // Its copy done, the first buffer serves again.
  buffers.release(next);
  const Tensor again = buffers.acquire({kCount}, kFloat32);
  const Tensor and_again = buffers.acquire({kCount}, kFloat32);
  EXPECT_EQ(buffers.buffers(), 2);
  EXPECT_TRUE(again.raw_data() == buffer.raw_data() || and_again.raw_data() == buffer.raw_data());
}

// A message to send goes to its buffer on the buffers' copy stream: download returns before the
// work that writes the tensor has run (the caller's thread does not wait), the copy reads the tensor
// as that work left it, and the copy's own event says when the buffer holds it.
TEST(CudaHostMessageBuffers, ADownloadWaitsForTheTensorsWorkOnItsOwnStream) {
  WEFT_SKIP_WITHOUT_CUDA_DEVICE("no CUDA device is present");
  HostMessageBuffers buffers;  // page-locked
  constexpr int64_t kCount = int64_t(4) << 20;
  const Tensor a = Tensor::normal({4096, 4096}, 1, 0, 0.0, 0.01, kBFloat16).to(kGpu);
  Tensor source = Tensor::zeros({kCount}, kFloat32, kGpu);
  Tensor product = a;
  for (int i = 0; i < 100; ++i) product = matmul(a, a);  // tens of ms queued before the write
  source.fill_(3.25);                                     // the tensor's last write, behind them
  Tensor buffer = buffers.acquire({kCount}, kFloat32);
  for (int64_t i = 0; i < kCount; ++i) buffer.data<float>()[i] = -1.0f;
  const std::shared_ptr<cuda::Event> copied = buffers.download(source, buffer);
  ASSERT_NE(copied, nullptr);
  EXPECT_EQ(cudaEventQuery(copied->get()), cudaErrorNotReady) << "the copy did not wait for the tensor's writer";
  cudaGetLastError();
  // Its event alone is enough to read the buffer by.
  HostMessageBuffers::wait_until_copied(copied, kGpu);
  bool equal = true;
  for (int64_t i = 0; i < kCount && equal; ++i) equal = buffer.data<float>()[i] == 3.25f;
  EXPECT_TRUE(equal) << "the buffer does not hold the tensor as its last write left it";
  buffers.release(buffer);
  // Another shape: refused, nothing copied.
  EXPECT_THROW(buffers.download(source, buffers.acquire({kCount / 2}, kFloat32)), Error);
}

#endif  // WEFT_HAVE_CUDA

}  // namespace
}  // namespace weft
