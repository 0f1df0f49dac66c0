// LocalProcessGroup: a process group of one rank, so that code written against ProcessGroup runs
// (and is tested) in one process without mpirun.
//
// all_reduce and broadcast leave the tensor as it is (an average over one rank is the value);
// reduce_scatter and all_gather copy input to output; a send to oneself is kept (a copy) until the
// matching recv from oneself, in order; barrier does nothing. CPU work runs on the caller or queued
// on a CommStream::cpu thread like the MPI backend's; CUDA copies run on the given CUDA stream and
// are timed with events.
//
// Lifetime on CUDA: a copy on a stream other than the one its tensors are freed on would race with
// the allocator handing their memory out again (it orders reuse by the freeing stream only), so the
// group holds every CUDA handle, and through it the tensors, until its copy is done, whatever the
// caller does with the handle (as the NCCL group's watchdog does). Done handles are let go at the
// next collective of the group, outside its lock; the destructor waits for the rest.
#pragma once

#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace weft {

class LocalProcessGroup final : public ProcessGroup {
 public:
  LocalProcessGroup(Device device, std::string name);
  // Waits for the CUDA copies still in flight, then lets go of their tensors.
  ~LocalProcessGroup() override;

  int size() const override { return 1; }
  int rank() const override { return 0; }
  const std::string& name() const override { return name_; }
  Device device() const override { return device_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }

  CollectiveHandlePtr all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) override;
  CollectiveHandlePtr reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                     const CommStream& stream) override;
  CollectiveHandlePtr all_gather(const Tensor& input, const Tensor& output, const CommStream& stream) override;
  CollectiveHandlePtr broadcast(const Tensor& tensor, int root, const CommStream& stream) override;
  CollectiveHandlePtr send(const Tensor& tensor, int peer, const CommStream& stream) override;
  CollectiveHandlePtr recv(const Tensor& tensor, int peer, const CommStream& stream) override;
  CollectiveHandlePtr exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor, int recv_peer,
                               const CommStream& stream) override;
  CollectiveHandlePtr barrier(const CommStream& stream) override;

  // CUDA handles the group still holds, their copies not seen done yet (for tests).
  size_t in_flight_count();

 private:
  // Runs `copy` (nothing when empty) on `stream` as the collective `description`.
  CollectiveHandlePtr run(const CommStream& stream, const std::string& description, int64_t bytes,
                          const Tensor& source, const Tensor& destination);
  // Keeps `handle` (a CUDA copy's) until it is done, and lets go of those that are.
  void hold_until_done(CollectiveHandlePtr handle);

  Device device_;
  std::string name_;
  std::vector<int> world_ranks_;
  std::mutex sends_mutex_;
  std::deque<Tensor> sends_;  // sent to oneself, not yet received (copies)
  std::mutex in_flight_mutex_;
  std::vector<CollectiveHandlePtr> in_flight_;  // CUDA handles not seen done yet (they hold the tensors)
};

}  // namespace weft
