#include "launcher/step_agreement.h"

#include "parallel/comm/world_exchange.h"

namespace weft {

int64_t step_agreement_vote(bool stop, bool save_due, bool leader, int ranks) {
  const int64_t save_weight = static_cast<int64_t>(ranks) + 1;
  return (stop ? 1 : 0) + (leader && save_due ? save_weight : 0);
}

StepAgreement step_agreement_from_sum(int64_t sum, int ranks) {
  const int64_t save_weight = static_cast<int64_t>(ranks) + 1;
  StepAgreement agreement;
  agreement.save = sum >= save_weight;
  agreement.stop = sum % save_weight != 0;
  return agreement;
}

StepAgreement agree_at_step_boundary(bool stop, bool save_due, bool leader, int ranks) {
  const int64_t vote = step_agreement_vote(stop, save_due, leader, ranks);
  // In a single process sum_over_world returns the vote itself: no communication.
  return step_agreement_from_sum(sum_over_world(vote, "the step boundary's vote (stop or save)"), ranks);
}

}  // namespace weft
