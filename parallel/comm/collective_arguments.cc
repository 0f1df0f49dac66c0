#include "parallel/comm/collective_arguments.h"

#include "runtime/error.h"

namespace weft {

std::string describe_collective(const ProcessGroup& group, const std::string& operation, const Tensor& tensor) {
  return str(operation, tensor.defined() ? " of " + tensor.describe() : std::string(), " on ", group.describe());
}

void check_collective_tensor(const ProcessGroup& group, const std::string& operation, const char* role,
                             const Tensor& tensor) {
  WEFT_CHECK(tensor.defined(), operation, " on ", group.describe(), ": the ", role, " tensor is undefined");
  WEFT_CHECK(tensor.is_contiguous(), operation, " on ", group.describe(), ": the ", role, " tensor ",
             tensor.describe(), " must be contiguous (call contiguous() first)");
  WEFT_CHECK(tensor.device() == group.device(), operation, " on ", group.describe(), ": the ", role, " tensor ",
             tensor.describe(), " is not on the group's device ", group.device().to_string());
}

void check_all_reduce(const ProcessGroup& group, const Tensor& tensor, Reduction reduction) {
  const std::string operation = str("all_reduce(", reduction_name(reduction), ")");
  check_collective_tensor(group, operation, "in-place", tensor);
  WEFT_CHECK(!(reduction == Reduction::kAverage && is_integer(tensor.dtype())), operation, " on ", group.describe(),
             ": an average of integer tensor ", tensor.describe(), " is not defined; use sum");
}

int64_t check_reduce_scatter(const ProcessGroup& group, const Tensor& input, const Tensor& output,
                             Reduction reduction) {
  const std::string operation = str("reduce_scatter(", reduction_name(reduction), ")");
  check_collective_tensor(group, operation, "input", input);
  check_collective_tensor(group, operation, "output", output);
  WEFT_CHECK(input.dtype() == output.dtype(), operation, " on ", group.describe(), ": input ", input.describe(),
             " and output ", output.describe(), " differ in dtype");
  WEFT_CHECK(input.numel() == output.numel() * group.size(), operation, " on ", group.describe(), ": input ",
             input.describe(), " must hold group size (", group.size(), ") x output ", output.describe(),
             " elements");
  WEFT_CHECK(!(reduction == Reduction::kAverage && is_integer(input.dtype())), operation, " on ", group.describe(),
             ": an average of integer tensor ", input.describe(), " is not defined; use sum");
  return output.numel();
}

int64_t check_all_gather(const ProcessGroup& group, const Tensor& input, const Tensor& output) {
  check_collective_tensor(group, "all_gather", "input", input);
  check_collective_tensor(group, "all_gather", "output", output);
  WEFT_CHECK(input.dtype() == output.dtype(), "all_gather on ", group.describe(), ": input ", input.describe(),
             " and output ", output.describe(), " differ in dtype");
  WEFT_CHECK(output.numel() == input.numel() * group.size(), "all_gather on ", group.describe(), ": output ",
             output.describe(), " must hold group size (", group.size(), ") x input ", input.describe(), " elements");
  return input.numel();
}

namespace {

// `role` ("root", "peer") must be a rank of the group.
void check_group_rank(const ProcessGroup& group, const std::string& operation, const char* role, int rank) {
  WEFT_CHECK(rank >= 0 && rank < group.size(), operation, " on ", group.describe(), ": ", role, " ", rank,
             " is not a rank of the group (0..", group.size() - 1, ")");
}

void check_peer(const ProcessGroup& group, const std::string& operation, int peer) {
  check_group_rank(group, operation, "peer", peer);
}

}  // namespace

std::string check_broadcast(const ProcessGroup& group, const Tensor& tensor, int root) {
  std::string operation = str("broadcast(root ", root, ")");
  check_collective_tensor(group, operation, "in-place", tensor);
  check_group_rank(group, operation, "root", root);
  return operation;
}

std::string check_send(const ProcessGroup& group, const Tensor& tensor, int peer) {
  std::string operation = str("send(to group rank ", peer, ")");
  check_collective_tensor(group, operation, "sent", tensor);
  check_peer(group, operation, peer);
  return operation;
}

std::string check_recv(const ProcessGroup& group, const Tensor& tensor, int peer) {
  std::string operation = str("recv(from group rank ", peer, ")");
  check_collective_tensor(group, operation, "received", tensor);
  check_peer(group, operation, peer);
  return operation;
}

std::string check_exchange(const ProcessGroup& group, const Tensor& send_tensor, int send_peer,
                           const Tensor& recv_tensor, int recv_peer) {
  std::string operation = str("exchange(send to group rank ", send_peer, ", recv from group rank ", recv_peer, ")");
  check_collective_tensor(group, operation, "sent", send_tensor);
  check_collective_tensor(group, operation, "received", recv_tensor);
  check_peer(group, operation, send_peer);
  check_peer(group, operation, recv_peer);
  return operation;
}

}  // namespace weft
