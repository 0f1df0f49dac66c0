// Validation of collective arguments, shared by every ProcessGroup backend, so that the same
// mistake gets the same message whichever backend runs: tensors defined, contiguous, on the group's
// device, of one dtype, with the element counts the collective needs (see process_group.h).
// Each function throws weft::Error naming the collective, the group and the tensors.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/comm/process_group.h"

namespace weft {

// "all_reduce(sum) of f32[4, 8] cpu on dp (world ranks 0, 1)": the description of a collective.
std::string describe_collective(const ProcessGroup& group, const std::string& operation, const Tensor& tensor);

// A defined, contiguous tensor on the group's device.
void check_collective_tensor(const ProcessGroup& group, const std::string& operation, const char* role,
                             const Tensor& tensor);
void check_all_reduce(const ProcessGroup& group, const Tensor& tensor, Reduction reduction);
// Returns n, the output's element count.
int64_t check_reduce_scatter(const ProcessGroup& group, const Tensor& input, const Tensor& output,
                             Reduction reduction);
// Returns n, the input's element count.
int64_t check_all_gather(const ProcessGroup& group, const Tensor& input, const Tensor& output);
// Broadcast and point-to-point: each checks the tensors and the root or peers and returns the
// operation's name for messages: "broadcast(root 0)", "send(to group rank 1)", "recv(from group rank
// 1)", "exchange(send to group rank 1, recv from group rank 0)".
std::string check_broadcast(const ProcessGroup& group, const Tensor& tensor, int root);
std::string check_send(const ProcessGroup& group, const Tensor& tensor, int peer);
std::string check_recv(const ProcessGroup& group, const Tensor& tensor, int peer);
std::string check_exchange(const ProcessGroup& group, const Tensor& send_tensor, int send_peer,
                           const Tensor& recv_tensor, int recv_peer);

}  // namespace weft
