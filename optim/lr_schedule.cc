// Learning-rate schedules (lr_schedule.h).
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "runtime/error.h"

namespace weft {

ScheduleKind parse_schedule_kind(std::string_view name) {
  if (name == "cosine") return ScheduleKind::kCosine;
  if (name == "linear") return ScheduleKind::kLinear;
  if (name == "constant") return ScheduleKind::kConstant;
  WEFT_FAIL("unknown learning-rate schedule '", std::string(name), "'; valid kinds: cosine, linear, constant");
}

LearningRateSchedule::LearningRateSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps,
                                           ScheduleKind kind, double min_lr_ratio)
    : peak_lr_(peak_lr),
      warmup_steps_(warmup_steps),
      total_steps_(total_steps),
      kind_(kind),
      min_lr_ratio_(min_lr_ratio) {
  WEFT_CHECK(std::isfinite(peak_lr) && peak_lr >= 0.0, "learning-rate schedule: lr must be finite and >= 0, got ",
             peak_lr);
  WEFT_CHECK(warmup_steps >= 0, "learning-rate schedule: warmup_steps must be >= 0, got ", warmup_steps);
  WEFT_CHECK(min_lr_ratio >= 0.0 && min_lr_ratio <= 1.0,
             "learning-rate schedule: min_lr_ratio must be in [0, 1], got ", min_lr_ratio);
  WEFT_CHECK(kind == ScheduleKind::kConstant || total_steps >= warmup_steps, "learning-rate schedule: total_steps (",
             total_steps, ") must be >= warmup_steps (", warmup_steps, ") for a decaying schedule");
}

LearningRateSchedule::LearningRateSchedule(double peak_lr, int64_t warmup_steps, int64_t total_steps,
                                           std::string_view kind, double min_lr_ratio)
    : LearningRateSchedule(peak_lr, warmup_steps, total_steps, parse_schedule_kind(kind), min_lr_ratio) {}

double LearningRateSchedule::at(int64_t step) const {
  WEFT_CHECK(step >= 0, "learning-rate schedule: step must be >= 0, got ", step);
  if (step < warmup_steps_) {
    return peak_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  if (kind_ == ScheduleKind::kConstant) return peak_lr_;
  const double min_lr = peak_lr_ * min_lr_ratio_;
  const int64_t decay_steps = total_steps_ - warmup_steps_;
  // decay_steps == 0 (no room to decay) lands at the end of the decay at once.
  const double progress =
      decay_steps == 0 ? 1.0
                       : std::min(1.0, static_cast<double>(step - warmup_steps_) / static_cast<double>(decay_steps));
  if (kind_ == ScheduleKind::kCosine) {
    return min_lr + (peak_lr_ - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  return peak_lr_ - (peak_lr_ - min_lr) * progress;
}

}  // namespace weft
