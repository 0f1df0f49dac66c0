// racecheck_barrier_probe: what compute-sanitizer's racecheck reports for the shared-memory pattern
// of the pipelined norm backward's end (runtime/cuda/normalization.cu, write_block_partials), taken
// apart. A block of 4 row groups of 128 threads; each group may first pass its own named barrier
// (bar.sync 1 + group, 128: what group_sum does once a row) some number of times; then every thread
// writes its group's slice of shared memory, the block meets at __syncthreads(), and every thread
// reads a slice another group wrote. That is race-free whatever the named barriers did before.
//
//   racecheck_barrier_probe VARIANT     (run it under compute-sanitizer --tool racecheck)
//   unequal    group g passes its named barrier g + 1 times (rows that do not divide evenly)
//   equal      every group passes it twice
//   none       no named barrier
//   ring       no named barrier; the slices were first filled by cp.async and waited for (the ring)
//   race       unequal, without the __syncthreads(): a real race (the positive control)
//   preexit    unequal, with griddepcontrol.launch_dependents (what allow_next_kernel_to_start()
//              issues) between the __syncthreads() and the reads, as the norm backward has it
//   preexit_first  the same instruction before the writes instead
// A second argument `dependent` launches the kernel as launch_dependent does (cudaLaunchKernelEx with
// programmatic stream serialization) instead of <<<...>>>.
// The program checks the values read (every variant but race must read what the other group wrote)
// and exits non-zero when they are wrong; tools/device/racecheck-barrier-probe runs each variant under
// racecheck and counts the hazards (docs/reliability.md has what it showed).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

constexpr int kGroupThreads = 128;
constexpr int kGroups = 4;
constexpr int kThreads = kGroupThreads * kGroups;

__device__ __forceinline__ void named_barrier(int group) {
  // bar.sync needs an immediate id here as in the row kernels (one branch per id).
  switch (group) {
    case 0: asm volatile("bar.sync 1, 128;" ::: "memory"); break;
    case 1: asm volatile("bar.sync 2, 128;" ::: "memory"); break;
    case 2: asm volatile("bar.sync 3, 128;" ::: "memory"); break;
    default: asm volatile("bar.sync 4, 128;" ::: "memory"); break;
  }
}

__global__ void probe_kernel(const float* source, float* out, int variant) {
  __shared__ __align__(16) float slices[kThreads];
  const int group = static_cast<int>(threadIdx.x) / kGroupThreads;
  // 0 unequal, 1 equal, 2 none, 3 ring, 4 race, 5 preexit, 6 preexit_first
  const int barriers = variant == 1 ? 2 : variant == 2 || variant == 3 ? 0 : group + 1;
  for (int i = 0; i < barriers; ++i) named_barrier(group);
  if (variant == 3) {
    // The ring's last use: an asynchronous copy into the same bytes, waited for, then the block's barrier.
    if (threadIdx.x % 4 == 0) {
      const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(&slices[threadIdx.x]));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address), "l"(source + threadIdx.x));
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
  }
  if (variant == 6) asm volatile("griddepcontrol.launch_dependents;");
  slices[threadIdx.x] = static_cast<float>(threadIdx.x) + 0.5f;
  if (variant != 4) __syncthreads();
  if (variant == 5) asm volatile("griddepcontrol.launch_dependents;");
  out[threadIdx.x] = slices[(threadIdx.x + kGroupThreads) % kThreads];
}

}  // namespace

int main(int argc, char** argv) {
  const char* names[] = {"unequal", "equal", "none", "ring", "race", "preexit", "preexit_first"};
  int variant = -1;
  for (int v = 0; v < 7 && argc > 1; ++v) {
    if (std::strcmp(argv[1], names[v]) == 0) variant = v;
  }
  if (variant < 0) {
    std::fprintf(stderr,
                 "usage: racecheck_barrier_probe unequal|equal|none|ring|race|preexit|preexit_first [dependent]\n");
    return 2;
  }
  float *source = nullptr, *out = nullptr;
  if (cudaMalloc(&source, kThreads * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&out, kThreads * sizeof(float)) != cudaSuccess ||
      cudaMemset(source, 0, kThreads * sizeof(float)) != cudaSuccess) {
    std::fprintf(stderr, "racecheck_barrier_probe: no CUDA device or no memory\n");
    return 1;
  }
  if (argc > 2 && std::strcmp(argv[2], "dependent") == 0) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(1);
    config.blockDim = dim3(kThreads);
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const float* constant_source = source;
    if (cudaLaunchKernelEx(&config, probe_kernel, constant_source, out, variant) != cudaSuccess) {
      std::fprintf(stderr, "racecheck_barrier_probe: cudaLaunchKernelEx failed\n");
      return 1;
    }
  } else {
    probe_kernel<<<1, kThreads>>>(source, out, variant);
  }
  float host[kThreads];
  const cudaError_t status = cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  if (status != cudaSuccess) {
    std::fprintf(stderr, "racecheck_barrier_probe %s: %s\n", names[variant], cudaGetErrorString(status));
    return 1;
  }
  int wrong = 0;
  for (int i = 0; i < kThreads; ++i) {
    wrong += host[i] != static_cast<float>((i + kGroupThreads) % kThreads) + 0.5f;
  }
  std::printf("racecheck_barrier_probe %s: %d of %d values read as written%s\n", names[variant], kThreads - wrong,
              kThreads, variant == 4 ? " (a real race: any count is possible)" : "");
  return variant != 4 && wrong != 0 ? 1 : 0;
}
