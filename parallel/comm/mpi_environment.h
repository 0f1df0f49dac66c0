// MpiEnvironment: MPI's lifetime in a weft process, and the ranks it gives.
//
// One MpiEnvironment lives in main() (weft-train, the distributed tests): it calls MPI_Init_thread
// asking for MPI_THREAD_MULTIPLE, because the CPU backend drives MPI from communication threads
// while the main thread computes, and MPI_Finalize when it goes. A program not started by mpirun
// runs as a singleton world of one process. Where MPI grants less than MPI_THREAD_MULTIPLE but at
// least MPI_THREAD_SERIALIZED, weft serializes its MPI calls itself (mpi_call_mutex); below that,
// collectives from any thread but the main one are refused with a message. WEFT_MPI_THREAD_LEVEL
// (single | funneled | serialized | multiple) asks for less than MPI_THREAD_MULTIPLE, to test
// those paths or to run with an MPI whose threads misbehave.
//
// Local rank: the rank among the processes of the same host (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED), from which parallel/comm/gpu_assignment.h picks the rank's GPU.
//
// WEFT_MPI_CHECK(call) throws weft::Error naming the file, the line, the call and MPI's own error
// string (MPI_COMM_WORLD returns errors instead of aborting once an MpiEnvironment exists).
#pragma once

#include <mpi.h>

#include <mutex>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace weft {

class MpiEnvironment {
 public:
  // Initializes MPI unless it already is (then only reads the ranks, and never finalizes).
  MpiEnvironment(int* argc, char*** argv);
  MpiEnvironment() : MpiEnvironment(nullptr, nullptr) {}
  // Finalizes MPI if this object initialized it. Process groups and comm streams should be gone.
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // Rank and count of the processes on this host.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // The thread level MPI granted (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const { return thread_level_; }
  bool thread_multiple() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }

  // The live environment, or nullptr when none was created.
  static MpiEnvironment* current();

 private:
  bool initialized_here_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
};

// Whether MPI has been initialized and not yet finalized.
bool mpi_is_active();
// The world rank and size (0 and 1 while MPI is not active).
int mpi_world_rank();
int mpi_world_size();
// 0, 1, ..., mpi_world_size() - 1: the world ranks of a group over the whole world.
std::vector<int> mpi_world_ranks();
// Held around every MPI call weft makes when MPI granted less than MPI_THREAD_MULTIPLE; callers
// lock it through MpiCallLock, which does nothing under MPI_THREAD_MULTIPLE.
std::mutex& mpi_call_mutex();
class MpiCallLock {
 public:
  MpiCallLock();
  ~MpiCallLock();
  MpiCallLock(const MpiCallLock&) = delete;
  MpiCallLock& operator=(const MpiCallLock&) = delete;

 private:
  bool locked_ = false;
};

// Whether the calling thread may call MPI: any thread at MPI_THREAD_SERIALIZED or above (and
// without an MpiEnvironment), only the main thread below it. Every path that makes MPI calls from
// a thread it does not choose (a collective's first use, which may come from an executor's comm
// thread) checks it and refuses with a message saying what to change.
bool mpi_callable_from_this_thread();

// MPI's text for an error code.
std::string mpi_error_string(int code);

}  // namespace weft

#define WEFT_MPI_CHECK(call)                                                                          \
  do {                                                                                                \
    const int weft_mpi_status = (call);                                                               \
    if (weft_mpi_status != MPI_SUCCESS) [[unlikely]] {                                                \
      WEFT_FAIL(__FILE__, ":", __LINE__, ": ", #call, " failed: ", ::weft::mpi_error_string(weft_mpi_status)); \
    }                                                                                                 \
  } while (0)
