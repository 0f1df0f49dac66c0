// gemm_energy_probe: under the H200's power cap, do cuBLASLt's candidate algorithms for a training
// step's products differ more in energy per product than in burst time? weft's autotuner
// (runtime/cuda/matmul.cu) ranks the heuristic's candidates by three products at full clock, but a
// training step runs at the power cap, where the clock drops until the board draws its limit: there
// a product's time follows its energy, and a candidate that spends fewer joules can win even where
// its burst time ties or loses.
//
// Per shape (bf16 in and out, f32 compute and scale, alpha 1 beta 0, no epilogue, 32 MiB workspace)
// and per candidate of the heuristic's first 8: whether it writes the first's bits (a fingerprint of
// the output), its burst time, and, where that is within 1.15x of the first's, the product issued
// for SUSTAIN_S seconds (default 1.0) with the first 0.5 s left out: µs and mJ per product, mean W
// and the SM clock at the cap. NVML is loaded at run time (no nvml.h where weft builds).
//
//   SHAPES=gpt2.fc.fwd,llama.down.dW SUSTAIN_S=2 gemm_energy_probe    (default: all 24 shapes)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "tools/standalone_cuda_checks.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

constexpr int kCandidates = 8;                        // as many as weft's autotuner asks for
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // weft's workspace per stream
constexpr int kBurstProducts = 3;                     // weft's kAutotuneRuns
constexpr double kAutotuneMargin = 0.02;              // weft's: how much faster than #0 a pick must be
constexpr double kSustainedWithin = 1.15;             // burst ratio to #0 past which no sustained run
constexpr double kSettleSeconds = 0.5;                // the clock has come down to the cap's level by then
constexpr double kChunkSeconds = 0.05;                // products issued between the host's checks
constexpr int kTokens = 16384;                        // M of every shape

// --- NVML, loaded at run time --------------------------------------------------------------------

struct Nvml {
  void* library = nullptr;
  void* device = nullptr;
  int (*shutdown)() = nullptr;
  int (*total_energy)(void*, unsigned long long*) = nullptr;  // millijoules since the driver loaded
  int (*clock_info)(void*, int, unsigned*) = nullptr;         // MHz
  int (*power_usage)(void*, unsigned*) = nullptr;             // milliwatts, averaged over about 1 s
  int (*power_limit)(void*, unsigned*) = nullptr;             // milliwatts, the enforced cap
  bool energy = false;                                        // the energy counter answers
};

template <typename Function>
Function symbol(void* library, const char* name) {
  return reinterpret_cast<Function>(dlsym(library, name));
}

Nvml load_nvml() {
  Nvml nvml;
  nvml.library = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (nvml.library == nullptr) return nvml;
  auto init = symbol<int (*)()>(nvml.library, "nvmlInit_v2");
  auto handle = symbol<int (*)(unsigned, void**)>(nvml.library, "nvmlDeviceGetHandleByIndex_v2");
  // NVML's index 0 is taken for CUDA's device 0: the machine has one GPU.
  if (init == nullptr || handle == nullptr || init() != 0 || handle(0, &nvml.device) != 0) {
    dlclose(nvml.library);
    return Nvml{};
  }
  nvml.shutdown = symbol<int (*)()>(nvml.library, "nvmlShutdown");
  nvml.total_energy = symbol<decltype(nvml.total_energy)>(nvml.library, "nvmlDeviceGetTotalEnergyConsumption");
  nvml.clock_info = symbol<decltype(nvml.clock_info)>(nvml.library, "nvmlDeviceGetClockInfo");
  nvml.power_usage = symbol<decltype(nvml.power_usage)>(nvml.library, "nvmlDeviceGetPowerUsage");
  nvml.power_limit = symbol<decltype(nvml.power_limit)>(nvml.library, "nvmlDeviceGetEnforcedPowerLimit");
  unsigned long long millijoules = 0;
  nvml.energy = nvml.total_energy != nullptr && nvml.total_energy(nvml.device, &millijoules) == 0;
  return nvml;
}

// The energy counter moves in steps (every few to tens of ms), so a window's two end readings could
// each be a step's energy off. Power is taken between the first and the last step seen inside the
// window instead, each timed when the poll that saw it returned.
struct EnergyWindow {
  unsigned long long start_value = 0, last_seen = 0, first_step = 0, last_step = 0;
  Clock::time_point start_time, first_step_time, last_step_time;
  int steps = 0;

  void begin(const Nvml& nvml, Clock::time_point now) {
    *this = EnergyWindow{};
    start_time = now;
    if (nvml.energy) nvml.total_energy(nvml.device, &start_value);
    last_seen = start_value;
  }
  void poll(const Nvml& nvml, Clock::time_point now) {
    unsigned long long value = 0;
    if (!nvml.energy || nvml.total_energy(nvml.device, &value) != 0 || value == last_seen) return;
    last_seen = value;
    (steps == 0 ? first_step : last_step) = value;
    (steps == 0 ? first_step_time : last_step_time) = now;
    ++steps;
  }
  // Mean watts over the window; without the counter, NVML's power reading (itself a ~1 s mean); -1 without NVML.
  double watts(const Nvml& nvml, Clock::time_point end_time) const {
    if (nvml.energy && steps >= 2)
      return (last_step - first_step) / 1000.0 / seconds_between(first_step_time, last_step_time);
    if (nvml.energy) return (last_seen - start_value) / 1000.0 / seconds_between(start_time, end_time);
    unsigned milliwatts = 0;
    if (nvml.power_usage != nullptr && nvml.power_usage(nvml.device, &milliwatts) == 0) return milliwatts / 1000.0;
    return -1;
  }
};

// --- Device kernels ------------------------------------------------------------------------------

__host__ __device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-scale, scale): random mantissas toggle the multipliers as real data does, which a
// constant fill would not, and power depends on that.
__global__ void fill_uniform(__nv_bfloat16* values, size_t count, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    const float unit = static_cast<float>(splitmix64(seed ^ i) >> 40) * (1.0f / 16777216.0f);
    values[i] = __float2bfloat16((2.0f * unit - 1.0f) * scale);
  }
}

// Sum of splitmix64(index << 16 | word) over the output's 16-bit words: order-free, so atomics do.
__global__ void fingerprint_kernel(const uint16_t* words, size_t count, unsigned long long* sum) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x)
    local += splitmix64((static_cast<uint64_t>(i) << 16) | words[i]);
  for (int offset = 16; offset > 0; offset /= 2) local += __shfl_down_sync(0xffffffffu, local, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(sum, local);
}

// --- Shapes --------------------------------------------------------------------------------------

// One product in cuBLASLt's column-major terms: D[m, n] = op(A)[m, k] op(B)[k, n], D's ld m.
struct Product {
  std::string name;  // <model>.<layer>.<fwd|dX|dW>
  int m, n, k;
  cublasOperation_t transa, transb;
  float scale_a, scale_b;  // of the fills: weights 0.05, activations 1, output gradients 0.01
};

std::vector<Product> all_products() {
  struct Layer { const char* name; int in, out; };  // weft's weight W is [out, in] row-major
  const std::array<Layer, 8> layers = {{{"gpt2.qkv", 768, 2304}, {"gpt2.fc", 768, 3072}, {"gpt2.fc_proj", 3072, 768},
      {"gpt2.head", 768, 50304}, {"llama.qkv", 2048, 4096}, {"llama.gate_up", 2048, 11008},
      {"llama.down", 5504, 2048}, {"llama.head", 2048, 32000}}};
  const float weight = 0.05f, activation = 1.0f, gradient = 0.01f;
  std::vector<Product> products;
  for (const Layer& l : layers) {
    const std::string name = l.name;
    // out = x W^T: D'[N, M] = op_T(W, memory [K, N]) op_N(x, memory [K, M]).
    products.push_back({name + ".fwd", l.out, kTokens, l.in, CUBLAS_OP_T, CUBLAS_OP_N, weight, activation});
    // dX = dY W: D'[K, M] = op_N(W, memory [K, N]) op_N(dY, memory [N, M]).
    products.push_back({name + ".dX", l.in, kTokens, l.out, CUBLAS_OP_N, CUBLAS_OP_N, weight, gradient});
    // dW = dY^T x: D'[K, N] = op_N(x, memory [K, M]) op_T(dY, memory [N, M]).
    products.push_back({name + ".dW", l.in, l.out, kTokens, CUBLAS_OP_N, CUBLAS_OP_T, activation, gradient});
  }
  return products;
}

std::vector<Product> chosen_products() {
  const std::vector<Product> all = all_products();
  const char* wanted = std::getenv("SHAPES");
  if (wanted == nullptr || *wanted == '\0') return all;
  std::vector<Product> chosen;
  std::stringstream list(wanted);
  for (std::string name; std::getline(list, name, ',');) {
    auto found = std::find_if(all.begin(), all.end(), [&](const Product& p) { return p.name == name; });
    if (found == all.end()) {
      std::fprintf(stderr, "SHAPES: no shape named '%s'; the names are:", name.c_str());
      for (const Product& p : all) std::fprintf(stderr, " %s", p.name.c_str());
      std::fprintf(stderr, "\n");
      std::exit(1);
    }
    chosen.push_back(*found);
  }
  return chosen;
}

// --- Measurements --------------------------------------------------------------------------------

struct Matmul {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  cublasLtMatmulDesc_t description = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  __nv_bfloat16 *a = nullptr, *b = nullptr, *d = nullptr;
  void* workspace = nullptr;

  void run(const cublasLtMatmulAlgo_t& algorithm) const {
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(handle, description, &alpha, a, a_layout, b, b_layout, &beta, d, d_layout, d, d_layout,
                                &algorithm, workspace, kWorkspaceBytes, stream));
  }
};

struct Sustained {
  double microseconds = 0, millijoules = -1, watts = -1;  // per product; -1: no NVML
  unsigned sm_mhz = 0;
  int energy_steps = 0;  // counter steps seen in the window
};

// The product issued in chunks for `seconds`. Two chunks stay queued so that the GPU never waits on
// the host, which polls the energy counter while it waits for the older one.
Sustained sustain(const Matmul& matmul, const cublasLtMatmulAlgo_t& algorithm, int chunk, double seconds,
                  const Nvml& nvml) {
  std::array<cudaEvent_t, 2> done{};
  for (cudaEvent_t& event : done) CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  auto issue = [&](int slot) {
    for (int i = 0; i < chunk; ++i) matmul.run(algorithm);
    CUDA_CHECK(cudaEventRecord(done[slot], matmul.stream));
  };
  Sustained result;
  EnergyWindow energy;
  bool in_window = false;
  Clock::time_point window_start;
  long long completed = 0, window_start_products = 0;
  const Clock::time_point start = Clock::now();
  issue(0);
  issue(1);
  for (int waiting = 0;; waiting ^= 1) {
    cudaError_t state;
    while ((state = cudaEventQuery(done[waiting])) == cudaErrorNotReady)
      if (in_window) energy.poll(nvml, Clock::now());
    CUDA_CHECK(state);
    const Clock::time_point now = Clock::now();
    completed += chunk;
    if (!in_window && seconds_between(start, now) >= kSettleSeconds) {
      in_window = true;
      window_start = now;
      window_start_products = completed;
      energy.begin(nvml, now);
    } else if (in_window && seconds_between(start, now) >= seconds) {
      energy.poll(nvml, now);
      // The other chunk still runs, so this is the clock under load. 1: NVML_CLOCK_SM.
      if (nvml.clock_info != nullptr && nvml.clock_info(nvml.device, 1, &result.sm_mhz) != 0) result.sm_mhz = 0;
      result.microseconds = 1e6 * seconds_between(window_start, now) / (completed - window_start_products);
      result.watts = energy.watts(nvml, now);
      if (result.watts >= 0) result.millijoules = result.watts * result.microseconds * 1e-3;
      result.energy_steps = energy.steps;
      break;
    }
    issue(waiting);
  }
  CUDA_CHECK(cudaStreamSynchronize(matmul.stream));
  for (cudaEvent_t event : done) CUDA_CHECK(cudaEventDestroy(event));
  return result;
}

unsigned long long fingerprint(const Matmul& matmul, size_t count, unsigned long long* sum) {
  CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(*sum), matmul.stream));
  fingerprint_kernel<<<1024, 256, 0, matmul.stream>>>(reinterpret_cast<const uint16_t*>(matmul.d), count, sum);
  CUDA_CHECK(cudaGetLastError());
  unsigned long long value = 0;
  CUDA_CHECK(cudaMemcpyAsync(&value, sum, sizeof(value), cudaMemcpyDeviceToHost, matmul.stream));
  CUDA_CHECK(cudaStreamSynchronize(matmul.stream));
  return value;
}

// The candidate's configuration as "algo tile stages cluster"; a field that cannot be read shows "-".
std::string configuration(const cublasLtMatmulAlgo_t& algorithm) {
  auto field = [&](cublasLtMatmulAlgoConfigAttributes_t attribute, auto value, int width) {
    size_t written = 0;
    const bool read = cublasLtMatmulAlgoConfigGetAttribute(&algorithm, attribute, &value, sizeof(value), &written) ==
                      CUBLAS_STATUS_SUCCESS;
    std::string text = read ? std::to_string(value) : "-";
    return std::string(std::max(0, width - static_cast<int>(text.size())), ' ') + text;
  };
  return field(CUBLASLT_ALGO_CONFIG_ID, int32_t{0}, 5) + field(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t{0}, 5) +
         field(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t{0}, 7) +
         field(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, uint16_t{0}, 8);
}

struct Totals {
  int shapes = 0, energy_shapes = 0, min_steps = 1 << 30, max_steps = 0;
  double first_us = 0, pick_us = 0, best_us = 0, first_mj = 0, pick_mj = 0, lowest_mj = 0;
};

void probe(const Product& p, Matmul matmul, unsigned long long* sum, const Nvml& nvml, double seconds, Totals& totals) {
  const int a_rows = p.transa == CUBLAS_OP_N ? p.m : p.k, a_cols = p.transa == CUBLAS_OP_N ? p.k : p.m;
  const int b_rows = p.transb == CUBLAS_OP_N ? p.k : p.n, b_cols = p.transb == CUBLAS_OP_N ? p.n : p.k;
  const size_t a_count = size_t(a_rows) * a_cols, b_count = size_t(b_rows) * b_cols, d_count = size_t(p.m) * p.n;
  CUDA_CHECK(cudaMalloc(&matmul.a, a_count * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&matmul.b, b_count * sizeof(__nv_bfloat16)));
  CUDA_CHECK(cudaMalloc(&matmul.d, d_count * sizeof(__nv_bfloat16)));
  fill_uniform<<<1024, 256, 0, matmul.stream>>>(matmul.a, a_count, 0xA11CEull, p.scale_a);
  CUDA_CHECK(cudaGetLastError());
  fill_uniform<<<1024, 256, 0, matmul.stream>>>(matmul.b, b_count, 0xB0Bull, p.scale_b);
  CUDA_CHECK(cudaGetLastError());
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&matmul.description, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasLtMatmulDescAttributes_t transa = CUBLASLT_MATMUL_DESC_TRANSA, transb = CUBLASLT_MATMUL_DESC_TRANSB;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul.description, transa, &p.transa, sizeof(p.transa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul.description, transb, &p.transb, sizeof(p.transb)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&matmul.a_layout, CUDA_R_16BF, a_rows, a_cols, a_rows));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&matmul.b_layout, CUDA_R_16BF, b_rows, b_cols, b_rows));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&matmul.d_layout, CUDA_R_16BF, p.m, p.n, p.m));
  cublasLtMatmulPreference_t preference = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)));
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> candidates{};
  int count = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(matmul.handle, matmul.description, matmul.a_layout, matmul.b_layout,
                                              matmul.d_layout, matmul.d_layout, preference, kCandidates,
                                              candidates.data(), &count));
  std::printf("\n%s  m %d n %d k %d (column-major, op A %c, op B %c)  %.1f GFLOP  %d candidates\n", p.name.c_str(),
              p.m, p.n, p.k, "NT"[p.transa == CUBLAS_OP_T], "NT"[p.transb == CUBLAS_OP_T], 2e-9 * p.m * p.n * p.k,
              count);

  // Bits and burst time, in the heuristic's order.
  std::array<bool, kCandidates> same_bits{};
  std::array<double, kCandidates> burst_us{};
  cudaEvent_t burst_start, burst_stop;
  CUDA_CHECK(cudaEventCreate(&burst_start));
  CUDA_CHECK(cudaEventCreate(&burst_stop));
  unsigned long long reference = 0;
  for (int i = 0; i < count; ++i) {
    // All ones first, so that a candidate that wrote nothing cannot pass for having the first's bits.
    CUDA_CHECK(cudaMemsetAsync(matmul.d, 0xFF, d_count * sizeof(__nv_bfloat16), matmul.stream));
    matmul.run(candidates[i].algo);
    const unsigned long long bits = fingerprint(matmul, d_count, sum);
    if (i == 0) reference = bits;
    same_bits[i] = bits == reference;
    CUDA_CHECK(cudaEventRecord(burst_start, matmul.stream));
    for (int r = 0; r < kBurstProducts; ++r) matmul.run(candidates[i].algo);
    CUDA_CHECK(cudaEventRecord(burst_stop, matmul.stream));
    CUDA_CHECK(cudaEventSynchronize(burst_stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, burst_start, burst_stop));
    burst_us[i] = 1e3 * ms / kBurstProducts;
  }
  CUDA_CHECK(cudaEventDestroy(burst_start));
  CUDA_CHECK(cudaEventDestroy(burst_stop));

  // Sustained, in two rounds of opposite order so that the board's warming weighs on every candidate alike.
  std::array<std::array<Sustained, 2>, kCandidates> rounds{};
  auto measured = [&](int i) { return burst_us[i] <= kSustainedWithin * burst_us[0]; };
  for (int round = 0; round < 2; ++round)
    for (int step = 0; step < count; ++step) {
      const int i = round == 0 ? step : count - 1 - step;
      if (!measured(i)) continue;
      const int chunk = std::max(1, static_cast<int>(kChunkSeconds * 1e6 / burst_us[i]));
      rounds[i][round] = sustain(matmul, candidates[i].algo, chunk, seconds, nvml);
    }

  std::array<Sustained, kCandidates> mean{};
  int pick = 0, lowest = 0, best = 0;
  for (int i = 0; i < count; ++i) {
    const Sustained &r0 = rounds[i][0], &r1 = rounds[i][1];
    if (!measured(i)) continue;
    const bool energy = r0.millijoules >= 0 && r1.millijoules >= 0;
    mean[i] = {(r0.microseconds + r1.microseconds) / 2, energy ? (r0.millijoules + r1.millijoules) / 2 : -1,
               energy ? (r0.watts + r1.watts) / 2 : -1, (r0.sm_mhz + r1.sm_mhz) / 2, 0};
    totals.min_steps = std::min({totals.min_steps, r0.energy_steps, r1.energy_steps});
    totals.max_steps = std::max({totals.max_steps, r0.energy_steps, r1.energy_steps});
    if (!same_bits[i]) continue;
    if (burst_us[i] < burst_us[pick]) pick = i;
    if (mean[i].microseconds < mean[best].microseconds) best = i;
    if (mean[i].millijoules < mean[lowest].millijoules) lowest = i;
  }
  // weft keeps the heuristic's first unless the burst-fastest beats it by the margin.
  if (burst_us[pick] > (1 - kAutotuneMargin) * burst_us[0]) pick = 0;

  for (int i = 0; i < count; ++i) {
    std::printf("  %d%s %4s %9.1f", i, configuration(candidates[i].algo).c_str(), same_bits[i] ? "yes" : "no",
                burst_us[i]);
    const Sustained &s = mean[i], &r0 = rounds[i][0], &r1 = rounds[i][1];
    if (!measured(i))
      std::printf("  slow\n");
    else if (s.millijoules >= 0)
      std::printf(" %9.1f x%.3f %9.2f x%.3f %5.0f %5u %5.1f%%\n", s.microseconds, s.microseconds / mean[0].microseconds,
                  s.millijoules, s.millijoules / mean[0].millijoules, s.watts, s.sm_mhz,
                  100 * std::fabs(r0.millijoules - r1.millijoules) / s.millijoules);
    else
      std::printf(" %9.1f x%.3f %9s %6s %5s %5u %5.1f%%\n", s.microseconds, s.microseconds / mean[0].microseconds,
                  "no NVML", "", "", s.sm_mhz, 100 * std::fabs(r0.microseconds - r1.microseconds) / s.microseconds);
  }
  const bool energy = mean[0].millijoules >= 0;
  auto ratios = [&](int i) {
    char text[96];
    const int used =
        std::snprintf(text, sizeof(text), "#%d sustained x%.3f", i, mean[i].microseconds / mean[0].microseconds);
    if (energy)
      std::snprintf(text + used, sizeof(text) - used, " energy x%.3f", mean[i].millijoules / mean[0].millijoules);
    return std::string(text);
  };
  std::printf("  summary: autotuner pick %s | best sustained %s", ratios(pick).c_str(), ratios(best).c_str());
  if (energy) std::printf(" | lowest energy %s", ratios(lowest).c_str());
  std::printf("\n");
  std::fflush(stdout);

  ++totals.shapes;
  totals.first_us += mean[0].microseconds;
  totals.pick_us += mean[pick].microseconds;
  totals.best_us += mean[best].microseconds;
  if (energy) {
    ++totals.energy_shapes;
    totals.first_mj += mean[0].millijoules;
    totals.pick_mj += mean[pick].millijoules;
    totals.lowest_mj += mean[lowest].millijoules;
  }
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(matmul.a_layout));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(matmul.b_layout));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(matmul.d_layout));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(matmul.description));
  CUDA_CHECK(cudaFree(matmul.a));
  CUDA_CHECK(cudaFree(matmul.b));
  CUDA_CHECK(cudaFree(matmul.d));
}

}  // namespace

int main() {
  const Clock::time_point start = Clock::now();
  const std::vector<Product> products = chosen_products();
  const char* sustain_text = std::getenv("SUSTAIN_S");
  const double seconds = sustain_text != nullptr ? std::atof(sustain_text) : 1.0;
  if (!(seconds > kSettleSeconds)) {
    std::fprintf(stderr, "SUSTAIN_S=%s: must be more than the %.1f s left out while the clock settles\n",
                 sustain_text, kSettleSeconds);
    return 1;
  }
  const Nvml nvml = load_nvml();

  Matmul matmul;  // the handle, stream and workspace that every shape shares
  CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp properties{};
  CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  CUDA_CHECK(cudaStreamCreateWithFlags(&matmul.stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasLtCreate(&matmul.handle));
  CUDA_CHECK(cudaMalloc(&matmul.workspace, kWorkspaceBytes));
  unsigned long long* sum = nullptr;
  CUDA_CHECK(cudaMalloc(&sum, sizeof(*sum)));

  unsigned limit_milliwatts = 0;
  const std::string limit = nvml.power_limit != nullptr && nvml.power_limit(nvml.device, &limit_milliwatts) == 0
                                ? std::to_string(limit_milliwatts / 1000) + " W"
                                : "unknown";
  std::printf("gemm_energy_probe: %s, cuBLASLt %zu, power limit %s, NVML %s; %zu shapes, SUSTAIN_S %.2f\n",
              properties.name, cublasLtGetVersion(), limit.c_str(),
              nvml.energy ? "energy counter" : nvml.library != nullptr ? "power reading only" : "absent (no NVML)",
              products.size(), seconds);
  std::printf("bf16 in/out, f32 compute, alpha 1 beta 0, 32 MiB workspace, M = %d tokens. Per candidate: index,\n"
              "cuBLASLt algo id, tile id, stages id, cluster shape id, same bits as #0, burst us (%d products at\n"
              "full clock); for those within %.2fx of #0's burst (else 'slow'): sustained us per product and x #0,\n"
              "mJ per product and x #0, mean W, SM MHz at the window's end, and how far the two rounds' mJ (us\n"
              "without NVML) differ. Sustained figures are the MEAN of two rounds, order 0..n-1 then n-1..0, each\n"
              "%.2f s with the first %.1f s left out. 'autotuner pick': the burst-fastest same-bits candidate if\n"
              "%.0f%% faster than #0 (weft's margin), else #0; 'best sustained', 'lowest energy': among same-bits.\n",
              kTokens, kBurstProducts, kSustainedWithin, seconds, kSettleSeconds, 100 * kAutotuneMargin);
  std::printf("  # algo tile stages cluster bits  burst_us   sust_us    x#0   mJ/prod    x#0     W   MHz rounds\n");
  std::fflush(stdout);

  Totals totals;
  for (const Product& p : products) probe(p, matmul, sum, nvml, seconds, totals);

  std::printf("\ntotal over %d shapes: sustained us #0 %.1f, autotuner picks %.1f (x%.3f), best same-bits %.1f (x%.3f)",
              totals.shapes, totals.first_us, totals.pick_us, totals.pick_us / totals.first_us, totals.best_us,
              totals.best_us / totals.first_us);
  if (totals.energy_shapes == totals.shapes && totals.shapes > 0)
    std::printf("; mJ #0 %.1f, autotuner picks %.1f (x%.3f), lowest same-bits %.1f (x%.3f); energy counter steps "
                "per window %d..%d\n",
                totals.first_mj, totals.pick_mj, totals.pick_mj / totals.first_mj, totals.lowest_mj,
                totals.lowest_mj / totals.first_mj, totals.min_steps, totals.max_steps);
  else
    std::printf("; energy: no NVML\n");
  const std::time_t now = std::time(nullptr);
  char stamp[64];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  std::printf("finished %s, %.1f s elapsed\n", stamp, seconds_between(start, Clock::now()));

  CUDA_CHECK(cudaFree(sum));
  CUDA_CHECK(cudaFree(matmul.workspace));
  CUBLAS_CHECK(cublasLtDestroy(matmul.handle));
  CUDA_CHECK(cudaStreamDestroy(matmul.stream));
  if (nvml.shutdown != nullptr) nvml.shutdown();
  if (nvml.library != nullptr) dlclose(nvml.library);
  return 0;
}
