// wait_for_every_rank, gather_text_to_rank_zero and broadcast_text_from_rank_zero (world_exchange.h).
#include "parallel/comm/world_exchange.h"

#include <mpi.h>

#include <climits>

#include "parallel/comm/mpi_environment.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/error.h"

namespace weft {

void wait_for_every_rank() {
  if (!mpi_is_active() || mpi_world_size() == 1) return;
  MpiCallLock lock;
  WEFT_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

std::vector<std::string> gather_text_to_rank_zero(const std::string& text) {
  if (!mpi_is_active() || mpi_world_size() == 1) return {text};
  const int size = mpi_world_size();
  const int rank = mpi_world_rank();
  // Every rank's share within one MPI message (int counts), so the total fits too. A rank that
  // fails here raises, and the fault handler ends the job: no rank waits in the gather.
  WEFT_CHECK(text.size() < static_cast<size_t>(INT_MAX / size), "gather_text_to_rank_zero: rank ", rank, " has ",
             text.size(), " bytes, more than one MPI message takes from each of ", size, " ranks");
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(rank == 0 ? size : 0);
  MpiCallLock lock;
  WEFT_MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<int> offsets(lengths.size(), 0);
  long long total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = static_cast<int>(total);
    total += lengths[r];
  }
  std::string joined(static_cast<size_t>(total), '\0');
  WEFT_MPI_CHECK(MPI_Gatherv(text.data(), length, MPI_CHAR, joined.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
                             MPI_COMM_WORLD));
  std::vector<std::string> texts;
  for (size_t r = 0; r < lengths.size(); ++r) texts.push_back(joined.substr(offsets[r], lengths[r]));
  return texts;
}

std::string broadcast_text_from_rank_zero(const std::string& text) {
  if (!mpi_is_active() || mpi_world_size() == 1) return text;
  const bool root = mpi_world_rank() == 0;
  // Only rank 0's length matters (one MPI message, int counts). If it fails here it raises, and
  // the fault handler ends the job: no rank waits in the broadcast.
  WEFT_CHECK(!root || text.size() < static_cast<size_t>(INT_MAX), "broadcast_text_from_rank_zero: ", text.size(),
             " bytes do not fit one MPI message");
  int length = root ? static_cast<int>(text.size()) : 0;
  MpiCallLock lock;
  WEFT_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::string received = root ? text : std::string(static_cast<size_t>(length), '\0');
  WEFT_MPI_CHECK(MPI_Bcast(received.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD));
  return received;
}

int64_t sum_over_world(int64_t value, const std::string& what) {
  if (!mpi_is_active() || mpi_world_size() == 1) return value;
  long long sent = value, sum = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  {
    MpiCallLock lock;
    WEFT_MPI_CHECK(MPI_Iallreduce(&sent, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD, &request));
  }
  wait_for_mpi_request(request, what, mpi_world_ranks());
  return static_cast<int64_t>(sum);
}

}  // namespace weft
