// ProcessGroup: the collective vocabulary of weft, one interface for every backend.
//
// A ProcessGroup is a set of ranks (one axis of the Mesh: "dp", "pp" or "tp", or the whole world)
// and the collectives among them: all_reduce, reduce_scatter, all_gather, broadcast, send/recv and
// barrier. Backends: MPI on the CPU (parallel/comm/mpi_process_group.cc), NCCL on CUDA
// (parallel/comm/nccl_process_group.cc), and a single-process group of size 1
// (parallel/comm/local_process_group.cc) so that most tests need no mpirun. make_process_group picks one.
//
// Every call names the CommStream it runs on and returns at once with a CollectiveHandle:
//   auto handle = group.all_reduce(gradients, Reduction::kAverage, dp_stream);  // queued
//   ... compute overlaps ...
//   handle->wait();  // what the caller does next sees the reduced gradients
//
// A CollectiveHandle is a Completion (runtime/completion.h): synchronize() blocks the host,
// is_done() never blocks, start_ms()/end_ms() are on clock_ms() once done. So a step-graph node
// returns its collective's handle as its completion, and collective and compute timings share one
// clock. What only collectives have is here: wait() orders the caller's stream rather than blocking
// the host, wait(stream) orders a comm stream, and description() and bytes() name the collective.
//
// Contracts of every collective:
// - Tensors are contiguous, on the group's device, and of a dtype the backend takes (CPU: f32, f64,
//   bf16, i64; CUDA: f32, bf16, f16, f64, i32, i64). bf16/f16 sums on the CPU accumulate in f32.
// - Sizes are element counts, shapes are free: reduce_scatter input [size * n] -> output [n],
//   all_gather input [n] -> output [size * n]; group rank r owns elements [r * n, (r + 1) * n).
// - The tensors are kept alive by the handle until the collective is done; the caller must not
//   write them (nor read an output) before wait().
// - On CUDA the caller orders the comm stream after the kernels that produced the inputs (an event);
//   the collective itself never blocks the host.
// - Collectives of one group on one stream run in the order they were called; on different streams
//   they are independent (each (group, stream) pair has its own communicator, created at the
//   stream's first use in that group, which is collective: every rank of the group must use the
//   group's streams for the first time in the same order — true of any program whose ranks run the
//   same plan; threads that use streams concurrently should make each stream's first call, e.g. a
//   barrier, from one thread beforehand). A send and its recv must be on the same logical stream
//   of each rank. The first use blocks the caller on NCCL (unique id exchange, communicator
//   initialisation; both within WEFT_COMM_TIMEOUT_S, past which the job stops naming the ranks
//   that did not arrive), not on the CPU (MPI_Comm_idup).
// - A collective that does not finish within WEFT_COMM_TIMEOUT_S seconds (default 60) aborts the
//   whole job with a message naming the group and the collective (see parallel/comm/fault_handler.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/completion.h"
#include "runtime/device.h"
#include "runtime/tensor.h"

// cudaStream_t is `CUstream_st*`; naming the struct keeps this header free of CUDA headers.
struct CUstream_st;

namespace weft {

class CommThread;  // parallel/comm/comm_thread.h: the CPU backend's communication thread
class CommStream;

enum class Reduction : uint8_t { kSum, kAverage, kMax };
// "sum", "average", "max".
const char* reduction_name(Reduction reduction);

// The completion of one queued collective (or task); thread-safe. Completion's start_ms()/end_ms()
// are when the collective ran (not when it was queued), negative until it is done; on CUDA they
// come from timing events, read without blocking.
class CollectiveHandle : public Completion {
 public:
  // Orders the caller after the collective. CPU: blocks until it is done. CUDA: makes the calling
  // thread's current stream of the group's device wait for it (no host blocking). Rethrows the
  // collective's failure (weft::Error) if it failed.
  virtual void wait() = 0;
  // Orders work queued on `stream` after this call after the collective: a CPU comm thread runs a
  // wait first; a CUDA stream waits on an event (no host blocking); the caller stream is wait().
  virtual void wait(const CommStream& stream) = 0;

  // "all_reduce(sum) on dp", for traces and errors.
  const std::string& description() const { return description_; }
  // Bytes of the tensor this rank contributes (input of reduce_scatter/all_gather); 0 for barrier.
  int64_t bytes() const { return bytes_; }

 protected:
  CollectiveHandle(std::string description, int64_t bytes)
      : description_(std::move(description)), bytes_(bytes) {}

 private:
  std::string description_;
  int64_t bytes_;
};
using CollectiveHandlePtr = std::shared_ptr<CollectiveHandle>;

// Where a collective runs. A small copyable handle wrapping one of:
// - the caller (default-constructed, or CommStream::caller(name) for a separately ordered one):
//   CPU collectives run on the calling thread and are done when the call returns; CUDA collectives
//   run on the calling thread's current stream of the device. Threads that run collectives of one
//   group at the same time (an executor's comm threads) each need their own named caller stream;
// - a CPU communication stream (CommStream::cpu): a dedicated thread that runs what is queued on it
//   in order, so the thread that queued it computes meanwhile (copies share the thread);
// - a CUDA stream (CommStream::cuda), not owned.
class CommStream {
 public:
  enum class Kind : uint8_t { kCaller, kCpuThread, kCuda };

  CommStream() = default;
  // A caller stream with its own identity (and so its own communicator in each group): for a thread
  // the program already owns, such as an executor's communication thread, that runs collectives
  // itself. Copies share the identity.
  static CommStream caller(const std::string& name);
  // A new communication thread named `name` (for traces and errors); it stops when the last copy of
  // the CommStream is destroyed, after finishing what was queued.
  static CommStream cpu(const std::string& name);
  // `stream` (a cudaStream_t) of CUDA device `device`; nullptr means that device's current stream of
  // the calling thread at each call.
  static CommStream cuda(CUstream_st* stream, int device);

  Kind kind() const { return kind_; }
  bool is_caller() const { return kind_ == Kind::kCaller; }
  bool is_cpu_thread() const { return kind_ == Kind::kCpuThread; }
  bool is_cuda() const { return kind_ == Kind::kCuda; }
  // The comm thread (kCpuThread only); backends queue work on it.
  CommThread* thread() const { return thread_.get(); }
  CUstream_st* cuda_stream() const { return cuda_stream_; }
  int cuda_device() const { return cuda_device_; }
  // Unique per CommStream::cpu and CommStream::caller(name) in the process (0 for the default
  // caller and CUDA streams); backends key their per-stream communicators by it.
  uint64_t id() const { return id_; }
  // "caller", the given name, or "cuda:N stream 0x...".
  std::string name() const;

  // Runs host function `task` on this stream after everything queued before it and returns its
  // completion (`description` names it in timings and errors). The caller stream runs it now; a
  // CUDA stream refuses (weft::Error: order CUDA work with events instead). An exception the task
  // throws is rethrown by the handle's wait().
  CollectiveHandlePtr enqueue(const std::string& description, std::function<void()> task) const;
  // Blocks until everything queued so far has finished (caller: nothing to wait for; CUDA:
  // cudaStreamSynchronize).
  void synchronize() const;

  bool operator==(const CommStream& other) const {
    return kind_ == other.kind_ && id_ == other.id_ && cuda_stream_ == other.cuda_stream_ &&
           cuda_device_ == other.cuda_device_;
  }

 private:
  Kind kind_ = Kind::kCaller;
  uint64_t id_ = 0;
  std::string name_;  // of a named caller stream
  std::shared_ptr<CommThread> thread_;
  CUstream_st* cuda_stream_ = nullptr;
  int cuda_device_ = -1;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  // Number of ranks in the group and this process's rank in it (0 <= rank() < size()).
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // The axis name ("dp", "pp", "tp", "world", or "local" for the single-process group).
  virtual const std::string& name() const = 0;
  // Where the group's tensors live (cpu or cuda:N).
  virtual Device device() const = 0;
  // World rank of each group rank (for messages naming ranks).
  virtual const std::vector<int>& world_ranks() const = 0;

  // In place: every rank's `tensor` becomes the element-wise reduction over the group.
  virtual CollectiveHandlePtr all_reduce(const Tensor& tensor, Reduction reduction, const CommStream& stream) = 0;
  // input [size() * n] -> output [n]: this rank's chunk of the element-wise reduction.
  virtual CollectiveHandlePtr reduce_scatter(const Tensor& input, const Tensor& output, Reduction reduction,
                                             const CommStream& stream) = 0;
  // input [n] -> output [size() * n]: group rank r's input at elements [r * n, (r + 1) * n).
  virtual CollectiveHandlePtr all_gather(const Tensor& input, const Tensor& output, const CommStream& stream) = 0;
  // In place: every rank's `tensor` becomes group rank `root`'s.
  virtual CollectiveHandlePtr broadcast(const Tensor& tensor, int root, const CommStream& stream) = 0;
  // Point to point with group rank `peer`: sends and receives between a pair match in call order
  // (per stream), and recv's tensor has the sent tensor's dtype and element count.
  virtual CollectiveHandlePtr send(const Tensor& tensor, int peer, const CommStream& stream) = 0;
  virtual CollectiveHandlePtr recv(const Tensor& tensor, int peer, const CommStream& stream) = 0;
  // Sends `send_tensor` to `send_peer` and receives `recv_tensor` from `recv_peer` as one operation
  // (both posted before either is waited for), so that rings and pipeline exchanges on one stream
  // cannot deadlock as a send followed by a recv would (ncclGroupStart/End on NCCL).
  virtual CollectiveHandlePtr exchange(const Tensor& send_tensor, int send_peer, const Tensor& recv_tensor,
                                       int recv_peer, const CommStream& stream) = 0;
  // Done when every rank of the group has reached it (on that stream).
  virtual CollectiveHandlePtr barrier(const CommStream& stream) = 0;

  // "dp (world ranks 0, 2)", for messages.
  std::string describe() const;
};

class Mesh;
enum class Axis : uint8_t;

// The group along `axis` of `mesh` that contains this process (MPI_COMM_WORLD's rank), for
// `device`: the NCCL backend for CUDA (when built with NCCL), MPI for the CPU, and the
// single-process group wherever the axis has size 1 (so a one-process run needs no MPI at all).
// Collective over the world when the axis size is above 1: every rank calls it, in the same order.
std::shared_ptr<ProcessGroup> make_process_group(const Mesh& mesh, Axis axis, Device device);
// The whole world (MPI_COMM_WORLD), named "world".
std::shared_ptr<ProcessGroup> make_world_process_group(Device device);
// The group of the world ranks that pass the same `color` (every world rank calls it, in the same
// order; ranks ordered by world rank), named `name`: groups that are no axis of the mesh, such as
// the ranks of one host (the hierarchical all-reduce, the cost model's calibration). A group of one
// rank is the single-process group.
std::shared_ptr<ProcessGroup> make_split_process_group(int color, const std::string& name, Device device);
// A group of size 1 named `name` on `device`: collectives are copies or nothing.
std::shared_ptr<ProcessGroup> make_local_process_group(Device device, const std::string& name = "local");

}  // namespace weft
