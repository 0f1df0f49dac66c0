// World-wide host exchanges that are not tensor collectives: waiting for every rank without the
// collectives' deadline, gathering text (a trace) from every rank to rank 0, handing rank 0's text
// (a folder it named) to every rank, and summing one integer over the world (the step boundary's
// vote, launcher/step_agreement.h).
//
// All go straight to MPI_COMM_WORLD under MpiCallLock and are collective over the world: every rank
// calls them in the same order. Without MPI (a single process) they return at once. They never touch
// a device: a GPU run's host reaches them while its device still works on the steps in flight.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weft {

// MPI_Barrier on the world, with no deadline: for ranks that wait while rank 0 writes a file.
void wait_for_every_rank();
// Rank 0 gets every rank's `text`, in rank order; other ranks get an empty list.
std::vector<std::string> gather_text_to_rank_zero(const std::string& text);
// Every rank gets rank 0's `text` (the others' argument is ignored).
std::string broadcast_text_from_rank_zero(const std::string& text);
// The sum of every rank's `value`, on every rank. Nonblocking MPI polled against the
// WEFT_COMM_TIMEOUT_S deadline: a rank that never arrives ends the job, naming `what` and any peer
// found gone (no rank waits forever).
int64_t sum_over_world(int64_t value, const std::string& what);

}  // namespace weft
