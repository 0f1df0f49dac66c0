// CPU kernel benchmark: weft's f32 matmul, layer_norm and causal_attention against plain OpenBLAS.
//
// Each weft op runs through its public, differentiable entry point under NoGradGuard, so a row
// measures what a forward pass in evaluation pays: dispatch, output allocation and the kernel.
// Rates are wall-clock (UseRealTime), because OpenBLAS runs on several threads.
//
// Counters:
//   GFLOP              rate counter: 10^9 floating-point operations per second (printed "/s")
//   GB                 rate counter: 10^9 bytes read + written per second (layer_norm)
//   ratio_to_sgemm     matmul: weft's GFLOP/s over a bare cblas_sgemm of the same shape, the two
//                      alternating call by call in the same benchmark loop
//   sgemm_GFLOP/s      matmul: that sgemm's rate
//   ratio_to_sgemm512  layer_norm, attention: their GFLOP/s over the rate of a bare 512^3
//                      cblas_sgemm measured once in this run (how far the op is from matmul speed)
//
// FLOP counts: matmul 2 M K N; layer_norm 7 per element (mean, centre, square and sum, scale by
// 1/std, weight, bias); causal attention 2 B H T^2 D, the useful half of q k^T and p v below the
// diagonal (the usual convention for causal attention; softmax not counted).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "runtime/autograd/grad_mode.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/normalization.h"
#include "runtime/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A bare row-major cblas_sgemm of [m, k] x [k, n] on its own operands and output buffer.
class Sgemm {
 public:
  Sgemm(int64_t m, int64_t k, int64_t n)
      : m_(m), k_(k), n_(n), a_(weft::Tensor::normal({m, k}, /*seed=*/1)),
        b_(weft::Tensor::normal({k, n}, /*seed=*/2)), c_(m * n) {}

  void run() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m_, n_, k_, 1.0f, a_.data<float>(), k_,
                b_.data<float>(), n_, 0.0f, c_.data(), n_);
    benchmark::DoNotOptimize(c_.data());
    benchmark::ClobberMemory();
  }

  // Seconds per call over `iterations` calls.
  double seconds_per_call(int64_t iterations) {
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < iterations; ++i) run();
    return seconds_since(start) / iterations;
  }

 private:
  int64_t m_, k_, n_;
  weft::Tensor a_;        // [m, k]
  weft::Tensor b_;        // [k, n]
  std::vector<float> c_;  // [m, n]
};

// GFLOP/s of a 512^3 cblas_sgemm, measured once (about half a second) on first use.
double sgemm512_gflops() {
  static const double gflops = [] {
    Sgemm sgemm(512, 512, 512);
    const double warm_up_seconds = sgemm.seconds_per_call(4);
    const int64_t iterations = std::max<int64_t>(8, static_cast<int64_t>(0.5 / warm_up_seconds));
    return 2.0 * 512 * 512 * 512 / sgemm.seconds_per_call(iterations) * 1e-9;
  }();
  return gflops;
}

// Sets the "GFLOP" rate counter: Google Benchmark divides it by the timed seconds.
void set_flop_counter(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP"] =
      benchmark::Counter(flops_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

double gflops_per_second(double flops_per_iteration, int64_t iterations, double seconds) {
  return flops_per_iteration * static_cast<double>(iterations) / seconds * 1e-9;
}

// Args: M, K, N. Each iteration also runs the sgemm baseline, outside the timed region, so that
// both see the same machine state (the dev box is small and shared; back-to-back runs drift).
void BM_matmul(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  const weft::Tensor a = weft::Tensor::normal({m, k}, /*seed=*/1);  // [M, K]
  const weft::Tensor b = weft::Tensor::normal({k, n}, /*seed=*/2);  // [K, N]
  Sgemm sgemm(m, k, n);
  weft::autograd::NoGradGuard no_grad;

  double weft_seconds = 0, sgemm_seconds = 0;
  for (auto _ : state) {
    Clock::time_point start = Clock::now();
    {
      weft::Tensor c = weft::matmul(a, b);  // [M, N]; freed inside the block: freeing is part of the cost
      benchmark::DoNotOptimize(c.raw_data());
    }
    weft_seconds += seconds_since(start);

    state.PauseTiming();
    start = Clock::now();
    sgemm.run();
    sgemm_seconds += seconds_since(start);
    state.ResumeTiming();
  }

  const double flops = 2.0 * m * k * n;
  set_flop_counter(state, flops);
  state.counters["ratio_to_sgemm"] = sgemm_seconds / weft_seconds;
  state.counters["sgemm_GFLOP/s"] = gflops_per_second(flops, state.iterations(), sgemm_seconds);
}

// Args: rows, C (x is [rows, C], normalized over C).
void BM_layer_norm(benchmark::State& state) {
  const int64_t rows = state.range(0), channels = state.range(1);
  const weft::Tensor x = weft::Tensor::normal({rows, channels}, /*seed=*/1);   // [rows, C]
  const weft::Tensor weight = weft::Tensor::normal({channels}, /*seed=*/2);   // [C]
  const weft::Tensor bias = weft::Tensor::normal({channels}, /*seed=*/3);     // [C]
  weft::autograd::NoGradGuard no_grad;

  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    weft::Tensor y = weft::layer_norm(x, weight, bias);  // [rows, C]
    benchmark::DoNotOptimize(y.raw_data());
  }
  const double seconds = seconds_since(start);

  const double elements = static_cast<double>(rows) * channels;
  const double bytes = (2 * elements + 2 * channels) * sizeof(float);  // read x, weight, bias; write y
  state.counters["GB"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_flop_counter(state, 7 * elements);
  state.counters["ratio_to_sgemm512"] =
      gflops_per_second(7 * elements, state.iterations(), seconds) / sgemm512_gflops();
}

// Args: B, H, T, D (q, k, v are [B, H, T, D]).
void BM_causal_attention(benchmark::State& state) {
  const int64_t batch = state.range(0), heads = state.range(1), steps = state.range(2), head_dim = state.range(3);
  const weft::Tensor q = weft::Tensor::normal({batch, heads, steps, head_dim}, /*seed=*/1);  // [B, H, T, D]
  const weft::Tensor k = weft::Tensor::normal({batch, heads, steps, head_dim}, /*seed=*/2);  // [B, H, T, D]
  const weft::Tensor v = weft::Tensor::normal({batch, heads, steps, head_dim}, /*seed=*/3);  // [B, H, T, D]
  weft::autograd::NoGradGuard no_grad;

  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    weft::Tensor out = weft::causal_attention(q, k, v);  // [B, H, T, D]
    benchmark::DoNotOptimize(out.raw_data());
  }
  const double seconds = seconds_since(start);

  const double flops = 2.0 * batch * heads * steps * steps * head_dim;
  set_flop_counter(state, flops);
  state.counters["ratio_to_sgemm512"] = gflops_per_second(flops, state.iterations(), seconds) / sgemm512_gflops();
}

// GPT-2 small shapes with 256 tokens: attention projections, MLP up and down, and a square one.
BENCHMARK(BM_matmul)
    ->ArgNames({"M", "K", "N"})
    ->Args({256, 768, 768})
    ->Args({256, 768, 3072})
    ->Args({256, 3072, 768})
    ->Args({512, 512, 512})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layer_norm)
    ->ArgNames({"rows", "C"})
    ->Args({256, 768})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_causal_attention)
    ->ArgNames({"B", "H", "T", "D"})
    ->Args({1, 12, 256, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas", openblas_get_config());
  benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
