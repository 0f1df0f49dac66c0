// Step agreement: what every rank decides together at each step boundary, in one collective.
//
// Two things must happen at the same step on every rank or not at all, since each needs every rank:
//   stop  some rank wants to stop (a stop signal reached it; launcher/stop_signal.h), so all stop;
//   save  a timed checkpoint is due (checkpoint.every_minutes), judged by rank 0's clock alone,
//         because the ranks' clocks would disagree near the deadline.
// Both travel in one scalar through Strategy::average (its only collective of one value): each rank
// sends stop (0/1), rank 0 adds save * (ranks + 1); the sum is read back from the mean, and since
// the stops add up to at most `ranks` the two never mix. A single process sends nothing.
#pragma once

namespace weft {

class Strategy;

struct StepAgreement {
  bool stop = false;  // every rank stops after this step
  bool save = false;  // every rank takes part in a checkpoint at this step
};

// This rank's vote, as the scalar to average over `ranks` ranks. `save_due` counts on the leader only.
double step_agreement_vote(bool stop, bool save_due, bool leader, int ranks);
// The decision from the mean of every rank's vote.
StepAgreement step_agreement_from_mean(double mean, int ranks);

// The vote, the average over the data-parallel group (the world, while tp and pp are 1) and the
// decision. Collective: every rank calls it at every step boundary.
StepAgreement agree_at_step_boundary(Strategy& strategy, bool stop, bool save_due, bool leader, int ranks);

}  // namespace weft
