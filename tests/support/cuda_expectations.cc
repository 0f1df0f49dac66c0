#include "tests/support/cuda_expectations.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

#ifdef WEFT_HAVE_CUDA
#include "runtime/cuda/stream.h"
#endif

namespace weft::testing {
namespace {

// The relative error of `actual` against `expected`, over their common prefix. For finite values
// the arithmetic is that of testing::relative_error (kMax) and of the tests' former L2 copies.
double relative_error(const std::vector<double>& actual, const std::vector<double>& expected,
                      const Comparison& comparison) {
  double difference = 0.0;  // kMax: the largest |a - e|; kL2: the sum of (a - e)^2
  double reference = 0.0;   // kMax: the largest |e|;     kL2: the sum of e^2
  for (size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (!std::isfinite(a) || !std::isfinite(e)) {
      const bool matched = std::isnan(e) ? std::isnan(a) : a == e;
      if (comparison.non_finite == NonFinite::kMustMatch && matched) continue;
      return std::numeric_limits<double>::infinity();
    }
    if (comparison.norm == ErrorNorm::kMax) {
      difference = std::max(difference, std::fabs(a - e));
      reference = std::max(reference, std::fabs(e));
    } else {
      difference += (a - e) * (a - e);
      reference += e * e;
    }
  }
  if (comparison.norm == ErrorNorm::kMax) return difference / std::max(reference, 1e-30);
  return std::sqrt(difference) / std::max(std::sqrt(reference), 1e-30);
}

}  // namespace

int cuda_device_count() {
#ifdef WEFT_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

Tensor poisoned(absl::Span<const int64_t> shape, DType dtype, Device device) {
  Tensor tensor = Tensor::empty(shape, dtype, device);
  tensor.fill_(is_floating(dtype) ? std::numeric_limits<double>::quiet_NaN() : -7.0);
  return tensor;
}

RoundedInput random_input(absl::Span<const int64_t> shape, uint64_t seed, DType dtype, double mean, double std) {
  const Tensor stored = Tensor::normal(shape, seed, 0, mean, std, kFloat32).to(dtype);
  return {stored.to(kFloat32), stored.to(Device::cuda(0))};
}

std::string describe(absl::Span<const int64_t> shape, DType dtype) {
  std::string text = std::string(dtype_name(dtype)) + "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

double tolerance_for(DType dtype) { return dtype == kBFloat16 || dtype == kFloat16 ? 1e-2 : 1e-5; }

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return x.dtype() == y.dtype() && x.numel() == y.numel() &&
         std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.numel() * x.element_size())) == 0;
}

double relative_l2_error(const Tensor& actual, const Tensor& expected, NonFinite non_finite) {
  const std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  EXPECT_EQ(a.size(), e.size());
  return relative_error(a, e, {ErrorNorm::kL2, non_finite});
}

void expect_close(const Tensor& actual, const Tensor& expected, double tolerance, const std::string& what,
                  const Comparison& comparison) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined";
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> got = actual.to_vector(), want = expected.to_vector();
  if (comparison.non_finite == NonFinite::kFails) {
    const int64_t nans = std::count_if(got.begin(), got.end(), [](double value) { return std::isnan(value); });
    ASSERT_EQ(nans, 0) << what << ": " << nans << " NaN element(s) (unwritten, or a numerical failure)";
  }
  EXPECT_LE(relative_error(got, want, comparison), tolerance) << what;
}

void expect_close(const Tensor& actual, const Tensor& expected, DType dtype, const std::string& what,
                  const Comparison& comparison) {
  expect_close(actual, expected, tolerance_for(dtype), what + " (" + std::string(dtype_name(dtype)) + ")",
               comparison);
}

}  // namespace weft::testing
