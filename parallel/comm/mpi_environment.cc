#include "parallel/comm/mpi_environment.h"

#include <atomic>
#include <cstdlib>
#include <numeric>
#include <string>

#include "parallel/comm/fault_handler.h"

namespace weft {
namespace {

std::atomic<MpiEnvironment*> live_environment{nullptr};
std::atomic<bool> serialize_mpi_calls{false};

}  // namespace

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return str("MPI error ", code);
  return str(std::string(text, static_cast<size_t>(length)), " (code ", code, ")");
}

bool mpi_is_active() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

int mpi_world_rank() {
  if (!mpi_is_active()) return 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int mpi_world_size() {
  if (!mpi_is_active()) return 1;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

std::vector<int> mpi_world_ranks() {
  std::vector<int> ranks(static_cast<size_t>(mpi_world_size()));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

std::mutex& mpi_call_mutex() {
  static std::mutex mutex;
  return mutex;
}

bool mpi_callable_from_this_thread() {
  const MpiEnvironment* environment = MpiEnvironment::current();
  if (environment == nullptr || environment->thread_level() >= MPI_THREAD_SERIALIZED) return true;
  int main_thread = 1;
  MPI_Is_thread_main(&main_thread);  // callable from any thread at any level
  return main_thread != 0;
}

MpiCallLock::MpiCallLock() {
  if (serialize_mpi_calls.load(std::memory_order_relaxed)) {
    mpi_call_mutex().lock();
    locked_ = true;
  }
}

MpiCallLock::~MpiCallLock() {
  if (locked_) mpi_call_mutex().unlock();
}

// MPI_THREAD_MULTIPLE, unless WEFT_MPI_THREAD_LEVEL asks for less (single, funneled, serialized):
// how an MPI without full thread support behaves, for tests and for users who must use one.
int requested_thread_level() {
  const char* value = std::getenv("WEFT_MPI_THREAD_LEVEL");
  if (value == nullptr || *value == '\0') return MPI_THREAD_MULTIPLE;
  const std::string level = value;
  if (level == "single") return MPI_THREAD_SINGLE;
  if (level == "funneled") return MPI_THREAD_FUNNELED;
  if (level == "serialized") return MPI_THREAD_SERIALIZED;
  if (level == "multiple") return MPI_THREAD_MULTIPLE;
  WEFT_FAIL("WEFT_MPI_THREAD_LEVEL='", level, "' is not single, funneled, serialized or multiple");
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0;
  WEFT_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) {
    WEFT_MPI_CHECK(MPI_Query_thread(&thread_level_));
  } else {
    WEFT_MPI_CHECK(MPI_Init_thread(argc, argv, requested_thread_level(), &thread_level_));
    initialized_here_ = true;
  }
  // Errors come back as codes (turned into weft::Error by WEFT_MPI_CHECK) instead of aborting
  // without a word; a failing rank then shuts the job down through abort_all with its message.
  WEFT_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  serialize_mpi_calls.store(thread_level_ < MPI_THREAD_MULTIPLE);
  WEFT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  WEFT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  MPI_Comm node = MPI_COMM_NULL;
  WEFT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node));
  WEFT_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  WEFT_MPI_CHECK(MPI_Comm_size(node, &local_size_));
  WEFT_MPI_CHECK(MPI_Comm_free(&node));
  record_peer_processes();
  live_environment.store(this);
}

MpiEnvironment::~MpiEnvironment() {
  MpiEnvironment* expected = this;
  live_environment.compare_exchange_strong(expected, nullptr);
  if (initialized_here_ && mpi_is_active()) MPI_Finalize();
}

MpiEnvironment* MpiEnvironment::current() { return live_environment.load(); }

}  // namespace weft
