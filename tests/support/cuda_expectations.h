// Expectations for tests that check the CUDA backend against the CPU backend: outputs poisoned
// with NaN before the kernel runs, inputs rounded to the dtype under test, relative errors and the
// per-dtype tolerances, and the skip of a test that has no GPU to run on.
//
// Invariants: every error is computed on the CPU in f64 (Tensor::to_vector), whatever the device,
// dtype or strides of either tensor. A NaN in `actual` never passes unless the caller asks for
// NaN and infinity to be matched in place (NonFinite::kMustMatch, for reductions of NaN), so a
// poisoned element the kernel forgot to write always fails. In a build without CUDA
// cuda_device_count() is 0, so the same test source compiles there and every test skips.
#pragma once

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "runtime/tensor.h"

namespace weft::testing {

// CUDA devices visible to this process; 0 in a build without CUDA (WEFT_HAVE_CUDA undefined).
int cuda_device_count();

// Skips the running test with `message` when no CUDA device is visible (always, in a build without
// CUDA). The message is the caller's so that each test program keeps its own wording. A macro
// because GTEST_SKIP must return from the test body itself.
#define WEFT_SKIP_WITHOUT_CUDA_DEVICE(message)                                      \
  do {                                                                              \
    if (::weft::testing::cuda_device_count() == 0) GTEST_SKIP() << (message);      \
  } while (0)

// A tensor for a kernel to write: NaN everywhere (-7 for integer dtypes, which have no NaN), so
// an element the kernel leaves unwritten fails the comparison.
Tensor poisoned(absl::Span<const int64_t> shape, DType dtype, Device device = Device::cuda(0));

// A random input rounded to the dtype under test, held twice. The CPU reference runs in f32 on the
// rounded values, so a bf16 comparison measures only the GPU kernel's error.
struct RoundedInput {
  Tensor reference;  // f32, CPU: the rounded values
  Tensor gpu;        // the dtype under test, cuda(0): the same values
};
// normal(mean, std) drawn in f32 from Philox with `seed`, then rounded to `dtype`.
RoundedInput random_input(absl::Span<const int64_t> shape, uint64_t seed, DType dtype, double mean = 0.0,
                          double std = 1.0);

// "bf16[16, 768]": a case's name for SCOPED_TRACE and failure messages.
std::string describe(absl::Span<const int64_t> shape, DType dtype);

// 1e-2 for bf16 and f16, 1e-5 for every other dtype.
double tolerance_for(DType dtype);

// How an error is measured. Both denominators are at least 1e-30, so an all-zero `expected`
// asks for an exact match.
enum class ErrorNorm {
  kMax,  // max |actual - expected| / max |expected|, as testing::relative_error (gradient_check.h)
  kL2,   // ||actual - expected|| / ||expected||, Euclidean norms over all elements
};

// What a NaN or an infinity does to an error.
enum class NonFinite {
  kFails,      // one anywhere, in either tensor, makes the error infinite
  kMustMatch,  // one in `expected` must be matched in place by `actual` (a NaN by a NaN, an infinity
               // by the same infinity) and is left out of both norms; any other makes it infinite
};

struct Comparison {
  ErrorNorm norm = ErrorNorm::kMax;
  NonFinite non_finite = NonFinite::kFails;
};

// Whether a and b (either device, any strides) hold the same dtype, element count and bits.
bool bitwise_equal(const Tensor& a, const Tensor& b);

// ||actual - expected|| / ||expected|| over all elements. A different element count adds a test
// failure (and the common prefix is compared).
double relative_l2_error(const Tensor& actual, const Tensor& expected, NonFinite non_finite = NonFinite::kFails);

// Expects the relative error of `actual` against `expected`, measured as `comparison` says, to be at
// most `tolerance`. Adds a fatal failure naming `what`, and measures nothing, when `actual` is
// undefined, when the shapes differ, or (under NonFinite::kFails) when `actual` holds NaN:
// unwritten, or a numerical failure; the message gives the count.
void expect_close(const Tensor& actual, const Tensor& expected, double tolerance, const std::string& what,
                  const Comparison& comparison = {});
// The same with tolerance_for(dtype); the message names the dtype.
void expect_close(const Tensor& actual, const Tensor& expected, DType dtype, const std::string& what,
                  const Comparison& comparison = {});

}  // namespace weft::testing
