// cuda_host_route_benchmark: where the time of the pipeline's host route goes on GPUs
// (parallel.pp_transport host: a CUDA tensor copied to host memory, sent by MPI, copied to the
// receiver's device; parallel/pipeline/pipeline_transport.h), piece by piece, so that the route's
// end-to-end figure (the cost model's host_send_recv) can be set against its parts.
//
//   mpirun -np 2 cuda_host_route_benchmark [--max-mb M]   (ranks may share a GPU)
//
// At each size (1 MB up to M, default 64, times 8) and for each piece, the best of five runs after
// one warm-up, the slower rank's time; GB/s = bytes / time:
// - d2h fresh / pinned: the copy to host memory into a buffer allocated for it (what Tensor::to
//   does: pageable memory) or into one page-locked buffer used again;
// - mpi fresh / reused / pinned: the two ranks exchange the bytes (MPI_Sendrecv) between buffers
//   allocated for each exchange, between the same pageable buffers each time, or between the same
//   page-locked buffers;
// - h2d fresh / pinned: the copy to the device from a buffer just written / from a page-locked one.
// With one rank it says that it needs two and exits 0 (tools/device/run-gpu-tests runs every
// cuda_*_benchmark alone).
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "cuda_host_route_benchmark: %s: %s\n", what, cudaGetErrorString(status));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The best of five runs after a warm-up, the slower rank's.
double best_ms(const std::function<void()>& run) {
  run();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 5; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = now_ms();
    run();
    best = std::min(best, now_ms() - start);
  }
  double slowest = 0.0;
  MPI_Allreduce(&best, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

void exchange(const void* send, void* receive, size_t bytes, int partner) {
  MPI_Sendrecv(send, static_cast<int>(bytes), MPI_BYTE, partner, 0, receive, static_cast<int>(bytes), MPI_BYTE,
               partner, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  size_t max_mb = 64;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--max-mb") == 0) max_mb = std::strtoul(argv[i + 1], nullptr, 10);
  }
  if (ranks != 2) {
    if (rank == 0) std::printf("cuda_host_route_benchmark: needs two ranks (mpirun -np 2); %d given, nothing timed\n", ranks);
    MPI_Finalize();
    return 0;
  }
  int devices = 0;
  check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  check(cudaSetDevice(rank % std::max(devices, 1)), "cudaSetDevice");
  const int partner = 1 - rank;
  if (rank == 0) {
    std::printf("%8s %12s %12s %12s %12s %12s %12s %12s   (GB/s, the slower rank's best of 5)\n", "MB", "d2h fresh",
                "d2h pinned", "mpi fresh", "mpi reused", "mpi pinned", "h2d fresh", "h2d pinned");
  }
  for (size_t mb = 1; mb <= max_mb; mb *= 8) {
    const size_t bytes = mb << 20;
    void* device = nullptr;
    check(cudaMalloc(&device, bytes), "cudaMalloc");
    check(cudaMemset(device, rank + 1, bytes), "cudaMemset");
    void* pinned_send = nullptr;
    void* pinned_receive = nullptr;
    check(cudaMallocHost(&pinned_send, bytes), "cudaMallocHost");
    check(cudaMallocHost(&pinned_receive, bytes), "cudaMallocHost");
    std::vector<char> reused_send(bytes, 1), reused_receive(bytes, 0);
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<double> ms;
    ms.push_back(best_ms([&] {
      char* host = static_cast<char*>(std::malloc(bytes));
      check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "d2h");
      std::free(host);
    }));
    ms.push_back(best_ms([&] { check(cudaMemcpy(pinned_send, device, bytes, cudaMemcpyDeviceToHost), "d2h"); }));
    ms.push_back(best_ms([&] {
      char* send = static_cast<char*>(std::malloc(bytes));
      char* receive = static_cast<char*>(std::malloc(bytes));
      std::memset(send, rank, bytes);  // written, as a copy from the device writes it
      exchange(send, receive, bytes, partner);
      std::free(send);
      std::free(receive);
    }));
    ms.push_back(best_ms([&] { exchange(reused_send.data(), reused_receive.data(), bytes, partner); }));
    ms.push_back(best_ms([&] { exchange(pinned_send, pinned_receive, bytes, partner); }));
    ms.push_back(best_ms([&] {
      char* host = static_cast<char*>(std::malloc(bytes));
      std::memset(host, rank, bytes);
      check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "h2d");
      std::free(host);
    }));
    ms.push_back(best_ms([&] { check(cudaMemcpy(device, pinned_receive, bytes, cudaMemcpyHostToDevice), "h2d"); }));
    if (rank == 0) {
      std::printf("%8zu", mb);
      for (double t : ms) std::printf(" %12.2f", static_cast<double>(bytes) / 1e6 / t);
      std::printf("\n");
    }
    check(cudaFreeHost(pinned_send), "cudaFreeHost");
    check(cudaFreeHost(pinned_receive), "cudaFreeHost");
    check(cudaFree(device), "cudaFree");
  }
  MPI_Finalize();
  return 0;
}
