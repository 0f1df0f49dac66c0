// Step agreement: what every rank decides together at each step boundary, in one collective.
//
// Two things must happen at the same step on every rank or not at all, since each needs every rank:
//   stop  some rank wants to stop (a stop signal reached it; launcher/stop_signal.h), so all stop;
//   save  a timed checkpoint is due (checkpoint.every_minutes), judged by rank 0's clock alone,
//         because the ranks' clocks would disagree near the deadline.
// Both travel in one integer summed over the whole world (parallel/comm/world_exchange.h): each
// rank sends stop (0/1), rank 0 adds save * (ranks + 1); since the stops add up to at most `ranks`
// the two never mix. A single process sends nothing.
//
// Why the world and the host: every rank — of every dp, tp and pp group — must take the same
// decision, since a save or a stop on some ranks only leaves the others in a collective that never
// matches (a tp rank that voted alone once saved while its peer stepped on). And the vote must not
// queue behind device work: on GPUs the step after the one reported is still running when its host
// votes, and an all-reduce on the device would wait for it, which is what steps in flight avoid.
#pragma once

#include <cstdint>

namespace weft {

struct StepAgreement {
  bool stop = false;  // every rank stops after this step
  bool save = false;  // every rank takes part in a checkpoint at this step
};

// This rank's vote, to be summed over the `ranks` ranks of the world. `save_due` counts on the
// leader only.
int64_t step_agreement_vote(bool stop, bool save_due, bool leader, int ranks);
// The decision from the sum of every rank's vote.
StepAgreement step_agreement_from_sum(int64_t sum, int ranks);

// The vote, its sum over the world's `ranks` ranks (on the host, within the collectives' deadline)
// and the decision. Collective over the world: every rank calls it at every step boundary.
StepAgreement agree_at_step_boundary(bool stop, bool save_due, bool leader, int ranks);

}  // namespace weft
