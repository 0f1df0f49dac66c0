#include "launcher/step_agreement.h"

#include <cmath>
#include <cstdint>

#include "parallel/strategy.h"

namespace weft {

double step_agreement_vote(bool stop, bool save_due, bool leader, int ranks) {
  const double save_weight = static_cast<double>(ranks) + 1.0;
  return (stop ? 1.0 : 0.0) + (leader && save_due ? save_weight : 0.0);
}

StepAgreement step_agreement_from_mean(double mean, int ranks) {
  // The sum is a small integer (at most 2 * ranks + 1), exact after rounding even when the mean was
  // taken in f32.
  const int64_t sum = std::llround(mean * static_cast<double>(ranks));
  const int64_t save_weight = static_cast<int64_t>(ranks) + 1;
  StepAgreement agreement;
  agreement.save = sum >= save_weight;
  agreement.stop = sum % save_weight != 0;
  return agreement;
}

StepAgreement agree_at_step_boundary(Strategy& strategy, bool stop, bool save_due, bool leader, int ranks) {
  const double vote = step_agreement_vote(stop, save_due, leader, ranks);
  // On one rank average returns the value itself: no communication.
  return step_agreement_from_mean(strategy.average(vote), ranks);
}

}  // namespace weft
