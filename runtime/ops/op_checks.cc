#include "runtime/ops/op_checks.h"

#include "runtime/error.h"

namespace weft::ops {

void check_defined(std::string_view op, const Tensor& tensor, std::string_view role) {
  WEFT_CHECK(tensor.defined(), op, ": ", role, " is undefined");
}

void check_floating(std::string_view op, const Tensor& tensor, std::string_view role) {
  check_defined(op, tensor, role);
  WEFT_CHECK(is_floating(tensor.dtype()), op, ": ", role, " ", tensor.describe(),
             " must be floating (f32, bf16, f16 or f64)");
}

void check_index(std::string_view op, const Tensor& tensor, std::string_view role) {
  check_defined(op, tensor, role);
  WEFT_CHECK(tensor.dtype() == kInt32 || tensor.dtype() == kInt64, op, ": ", role, " ", tensor.describe(),
             " must be i32 or i64");
}

void check_compatible(std::string_view op, const Tensor& a, std::string_view role_a, const Tensor& b,
                      std::string_view role_b) {
  check_defined(op, a, role_a);
  check_defined(op, b, role_b);
  WEFT_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch: ", role_a, " is ", a.describe(), " but ", role_b,
             " is ", b.describe(), "; convert one with .to(dtype)");
  WEFT_CHECK(a.device() == b.device(), op, ": device mismatch: ", role_a, " is ", a.describe(), " but ", role_b,
             " is ", b.describe(), "; move one with .to(device)");
}

void check_rank(std::string_view op, const Tensor& tensor, std::string_view role, int64_t rank) {
  check_defined(op, tensor, role);
  WEFT_CHECK(tensor.dim() == rank, op, ": ", role, " must have ", rank, " dims, got ", tensor.describe());
}

void check_shape(std::string_view op, const Tensor& tensor, std::string_view role, absl::Span<const int64_t> shape) {
  check_defined(op, tensor, role);
  WEFT_CHECK(absl::Span<const int64_t>(tensor.shape()) == shape, op, ": ", role, " must have shape ",
             shape_string(shape), ", got ", tensor.describe());
}

}  // namespace weft::ops
