// Argument checks shared by the differentiable ops. Each throws weft::Error naming the op and the
// offending operands (shape, dtype, device), so a user sees what to fix.
#pragma once

#include <string_view>

#include "runtime/tensor.h"

namespace weft::ops {

void check_defined(std::string_view op, const Tensor& tensor, std::string_view role);
void check_floating(std::string_view op, const Tensor& tensor, std::string_view role);
void check_index(std::string_view op, const Tensor& tensor, std::string_view role);
// Same dtype and device.
void check_compatible(std::string_view op, const Tensor& a, std::string_view role_a, const Tensor& b,
                      std::string_view role_b);
void check_rank(std::string_view op, const Tensor& tensor, std::string_view role, int64_t rank);
void check_shape(std::string_view op, const Tensor& tensor, std::string_view role, absl::Span<const int64_t> shape);

}  // namespace weft::ops
