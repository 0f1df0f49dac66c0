// HostMessageBuffers (parallel/pipeline/host_message_buffers.h): the host route's staging buffers
// are used again for messages of their dtype and shape, never while handed out. Pageable buffers
// here (page-locked ones need a CUDA device); the pooling is the same.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "parallel/pipeline/host_message_buffers.h"
#include "runtime/error.h"

namespace weft {
namespace {

TEST(HostMessageBuffers, AReleasedBufferServesTheNextMessageOfItsShape) {
  HostMessageBuffers buffers(/*page_locked=*/false);
  const Tensor first = buffers.acquire({4, 8}, kBFloat16);
  EXPECT_EQ(first.shape(), (Shape{4, 8}));
  EXPECT_EQ(first.dtype(), kBFloat16);
  EXPECT_TRUE(first.device().is_cpu());
  EXPECT_TRUE(first.is_contiguous());
  // Handed out: another message of the same shape gets a buffer of its own.
  const Tensor second = buffers.acquire({4, 8}, kBFloat16);
  EXPECT_NE(first.raw_data(), second.raw_data());
  EXPECT_EQ(buffers.buffers(), 2);
  buffers.release(first);
  const Tensor again = buffers.acquire({4, 8}, kBFloat16);
  EXPECT_EQ(again.raw_data(), first.raw_data());
  EXPECT_EQ(buffers.buffers(), 2);
  // Another shape or dtype is another buffer, whatever is free.
  buffers.release(second);
  const Tensor other_shape = buffers.acquire({8, 4}, kBFloat16);
  const Tensor other_dtype = buffers.acquire({4, 8}, kFloat32);
  EXPECT_NE(other_shape.raw_data(), second.raw_data());
  EXPECT_NE(other_dtype.raw_data(), second.raw_data());
  EXPECT_EQ(other_dtype.dtype(), kFloat32);
  EXPECT_EQ(buffers.buffers(), 4);
  EXPECT_THROW(buffers.release(Tensor()), Error);
}

// A received message's buffer goes back to the pool with its copy: a CPU destination gets the
// values at once and the buffer serves the next message; a destination of another shape is refused.
TEST(HostMessageBuffers, UploadAndReleaseCopiesAndGivesTheBufferBack) {
  HostMessageBuffers buffers(/*page_locked=*/false);
  Tensor buffer = buffers.acquire({2, 3}, kFloat32);
  for (int i = 0; i < 6; ++i) buffer.data<float>()[i] = static_cast<float>(i) + 0.5f;
  const Tensor destination = Tensor::empty({2, 3}, kFloat32, Device::cpu());
  buffers.upload_and_release(buffer, destination);
  EXPECT_EQ(destination.to_vector(), (std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5}));
  EXPECT_EQ(buffers.acquire({2, 3}, kFloat32).raw_data(), buffer.raw_data());
  EXPECT_EQ(buffers.buffers(), 1);
  const Tensor other = buffers.acquire({2, 3}, kFloat32);
  EXPECT_THROW(buffers.upload_and_release(other, Tensor::empty({3, 2}, kFloat32, Device::cpu())), Error);
  EXPECT_THROW(buffers.upload_and_release(other, Tensor::empty({2, 3}, kBFloat16, Device::cpu())), Error);
}

// Threads that send and receive at once never share a buffer: each one handed out is written with
// its owner's mark and still holds it when given back.
TEST(HostMessageBuffers, ThreadsNeverHoldTheSameBuffer) {
  HostMessageBuffers buffers(/*page_locked=*/false);
  std::vector<std::thread> threads;
  std::vector<int> damaged(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        Tensor buffer = buffers.acquire({64}, kFloat32);
        float* data = buffer.data<float>();
        for (int j = 0; j < 64; ++j) data[j] = static_cast<float>(t);
        std::this_thread::yield();
        for (int j = 0; j < 64; ++j) damaged[t] += data[j] != static_cast<float>(t);
        buffers.release(buffer);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(damaged[t], 0) << "thread " << t;
  EXPECT_LE(buffers.buffers(), 4);
}

}  // namespace
}  // namespace weft
