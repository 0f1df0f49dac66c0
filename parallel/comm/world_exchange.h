// World-wide host exchanges that are not tensor collectives: waiting for every rank without the
// collectives' deadline, gathering text (a trace) from every rank to rank 0, and handing rank 0's
// text (a folder it named) to every rank.
//
// All three go straight to MPI_COMM_WORLD under MpiCallLock and are collective over the world: every
// rank calls them in the same order. Without MPI (a single process) they return at once.
#pragma once

#include <string>
#include <vector>

namespace weft {

// MPI_Barrier on the world, with no deadline: for ranks that wait while rank 0 writes a file.
void wait_for_every_rank();
// Rank 0 gets every rank's `text`, in rank order; other ranks get an empty list.
std::vector<std::string> gather_text_to_rank_zero(const std::string& text);
// Every rank gets rank 0's `text` (the others' argument is ignored).
std::string broadcast_text_from_rank_zero(const std::string& text);

}  // namespace weft
