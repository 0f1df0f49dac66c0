// Ordering a collective's CUDA stream after the caller's compute (stream_order.h).
#include "parallel/comm/stream_order.h"

#if WEFT_HAVE_CUDA
#include "runtime/cuda/stream.h"
#endif

namespace weft {

void order_after_current_stream(const CommStream& stream) {
#if WEFT_HAVE_CUDA
  if (!stream.is_cuda() || stream.cuda_stream() == nullptr) return;
  const cudaStream_t current = cuda::current_stream(stream.cuda_device());
  if (current == stream.cuda_stream()) return;
  cuda::set_device(stream.cuda_device());
  // cudaStreamWaitEvent captures the event's state when called, so the event can go at once.
  cuda::Event produced;
  produced.record(current);
  produced.wait(stream.cuda_stream());
#else
  (void)stream;
#endif
}

bool runs_on_current_stream(const CommStream& stream, Device device) {
  if (!device.is_cuda() || stream.is_cpu_thread()) return false;
  if (!stream.is_cuda() || stream.cuda_stream() == nullptr) return true;
#if WEFT_HAVE_CUDA
  return stream.cuda_stream() == cuda::current_stream(stream.cuda_device());
#else
  return true;
#endif
}

}  // namespace weft
